//! `berth sandbox create|ls|inspect|rm|gc` (inspect in `crate::cmd_inspect`), and the checkpoint subcommands
//! (`crate::cmd_checkpoint`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use berth_core::backend::{Limits, SandboxSpec};
use berth_core::runtime::Runtime;
use serde_json::json;

use crate::context;
use crate::io::outln;

use berth_client::served::sandbox::{GcArgs, LsArgs, SandboxCmd};

fn pairs(items: &[String], flag: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for it in items {
        let Some((k, v)) = it.split_once('=') else {
            bail!("{flag} takes KEY=VALUE, got {it:?}");
        };
        if k.is_empty() {
            bail!("{flag} takes KEY=VALUE with a non-empty KEY, got {it:?}");
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Run a sandbox subcommand on `rt` (in-process, or in the server for a
/// client); `dir` is the state dir.
pub async fn run_on(rt: &Runtime, dir: &Path, cmd: SandboxCmd) -> Result<u8> {
    match cmd {
        SandboxCmd::Create(a) => {
            if a.cpus.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
                bail!("--cpus must be a positive number of cores, e.g. --cpus 0.5");
            }
            let spec = SandboxSpec {
                name: a.name.clone(),
                image: a.image.clone(),
                env: pairs(&a.env, "--env")?,
                network: a.network,
                limits: Limits {
                    memory_mb: a.memory_mb,
                    milli_cpu: a.cpus.map(|c| (c * 1000.0).round() as u64),
                    pids: a.pids,
                },
                options: pairs(&a.options, "--opt")?,
            };
            let (sb, created, recreated) = rt.create_sandbox(&a.backend, spec).await?;
            let layout = sb.layout().clone();
            if a.json {
                context::print_json(&json!({
                    "name": a.name, "backend": a.backend, "created": created,
                    "recreated": recreated, "workdir": layout.workdir,
                }));
            } else {
                let verb = if created {
                    "created"
                } else {
                    "attached to existing"
                };
                outln!(
                    "{verb} sandbox {} ({}), workspace {}",
                    a.name,
                    a.backend,
                    layout.workdir
                );
                if let Some(r) = recreated {
                    outln!("note: the sandbox was brought back: {r}");
                }
            }
        }
        SandboxCmd::Ls(a) => return ls(rt, a).await,
        SandboxCmd::Inspect(a) => return crate::cmd_inspect::run(rt, dir, a).await,
        SandboxCmd::Reap(a) => return crate::cmd_reap::run(rt, a).await,
        SandboxCmd::Gc(a) => return gc(rt, dir, a).await,
        SandboxCmd::Checkpoint(a) => return crate::cmd_checkpoint::checkpoint(rt, a).await,
        SandboxCmd::Checkpoints(a) => return crate::cmd_checkpoint::list(rt, a),
        SandboxCmd::Restore(a) => return crate::cmd_checkpoint::restore(rt, dir, a).await,
        SandboxCmd::Clone(a) => return crate::cmd_checkpoint::clone(rt, a).await,
        SandboxCmd::Rm(a) => {
            // In-process, a server may hold the sandbox's shell: tell it. In
            // the server, its own runtime lets go in `remove_sandbox`.
            if !crate::io::remote() {
                crate::server::client::forget(dir, &a.backend, &a.name).await;
            }
            rt.remove_sandbox(&a.backend, &a.name, !a.keep_workspace)
                .await?;
            if a.json {
                context::print_json(&json!({ "removed": a.name, "backend": a.backend }));
            } else {
                outln!("removed sandbox {} ({})", a.name, a.backend);
            }
        }
    }
    Ok(0)
}

/// `sandbox ls`: one backend's sandboxes, or with `--all` every backend's
/// that has recorded sandboxes (and local). A backend that cannot be asked
/// is named with why, and the others are listed all the same.
async fn ls(rt: &Runtime, a: LsArgs) -> Result<u8> {
    let backends: Vec<String> = if a.all {
        let mut v = vec![context::DEFAULT_BACKEND.to_string()];
        for r in rt.store().sandboxes(None)? {
            if !v.contains(&r.backend) {
                v.push(r.backend);
            }
        }
        v
    } else {
        vec![a.backend.clone()]
    };
    let mut list = Vec::new();
    let mut failed = Vec::new();
    for b in &backends {
        match rt.list_sandboxes(b).await {
            Ok(l) => list.extend(l),
            Err(e) if a.all => failed.push((b.clone(), e.full_text())),
            Err(e) => return Err(e.into()),
        }
    }
    if a.json {
        let mut v = serde_json::to_value(&list)?;
        if let Some(arr) = v.as_array_mut() {
            arr.extend(
                failed
                    .iter()
                    .map(|(b, e)| json!({ "backend": b, "error": e })),
            );
        }
        context::print_json(&v);
        return Ok(0);
    }
    if list.is_empty() && failed.is_empty() {
        outln!(
            "no sandboxes on {}; create one with `berth sandbox create NAME --backend {}`",
            a.backend,
            a.backend
        );
        return Ok(0);
    }
    if !list.is_empty() {
        outln!("{:<24} {:<8} {:<12} ID", "NAME", "BACKEND", "STATE");
    }
    for s in list {
        let state = if s.orphan {
            format!("{} (orphan)", s.state)
        } else {
            s.state
        };
        outln!(
            "{:<24} {:<8} {:<12} {}",
            s.name,
            s.backend,
            state,
            s.id.unwrap_or_default()
        );
    }
    for (b, e) in failed {
        crate::io::errln!("berth: backend {b}: could not list its sandboxes: {e}");
    }
    Ok(0)
}

/// `sandbox gc`: checkpoints on every backend, then docker's containers.
async fn gc(rt: &Runtime, state_dir: &Path, a: GcArgs) -> Result<u8> {
    let mut pruned = Vec::new();
    for row in rt.store().sandboxes(Some(&a.backend))? {
        if rt.checkpoints(&a.backend, &row.name)?.is_empty() {
            continue;
        }
        match rt.gc_checkpoints(&a.backend, &row.name).await {
            Ok((checkpoints, packs)) => pruned.push(json!({
                "sandbox": row.name, "checkpoints": checkpoints, "packs": packs,
            })),
            Err(e) => pruned.push(json!({ "sandbox": row.name, "error": e.full_text() })),
        }
    }
    if a.backend == "docker" {
        return gc_docker(rt, state_dir, a, pruned).await;
    }
    if a.json {
        context::print_json(&json!({ "backend": a.backend, "checkpoints": pruned }));
    } else {
        print_pruned(&pruned);
    }
    Ok(0)
}

fn print_pruned(pruned: &[serde_json::Value]) {
    for p in pruned {
        match p["error"].as_str() {
            Some(e) => outln!("sandbox {}: checkpoints not pruned: {e}", p["sandbox"]),
            None => outln!(
                "sandbox {}: {} checkpoints and {} packs past retention removed",
                p["sandbox"].as_str().unwrap_or("?"),
                p["checkpoints"],
                p["packs"]
            ),
        }
    }
}

#[cfg(feature = "docker")]
async fn gc_docker(
    rt: &Runtime,
    state_dir: &Path,
    a: GcArgs,
    pruned: Vec<serde_json::Value>,
) -> Result<u8> {
    let backend = berth_backends::docker::DockerBackend::connect()
        .await?
        .with_installation(&berth_backends::installation_id(state_dir)?);
    let report = backend.gc(a.older_than).await?;
    // Volumes of sandboxes still on record are how `sandbox create` brings them back.
    let known: std::collections::HashSet<String> = rt
        .store()
        .sandboxes(Some("docker"))?
        .into_iter()
        .map(|r| r.name)
        .collect();
    let volumes = backend
        .gc_volumes(|name| known.contains(name), a.workspaces)
        .await?;
    if a.json {
        context::print_json(&json!({
            "removed": report.removed, "kept": report.kept, "backend": a.backend,
            "removed_volumes": volumes, "checkpoints": pruned,
        }));
    } else {
        print_pruned(&pruned);
        for name in &report.removed {
            outln!("removed the container of sandbox {name} (its volumes are kept)");
        }
        for v in &volumes {
            outln!("removed orphaned volume {v}");
        }
        outln!(
            "{} removed, {} kept (running or too recent)",
            report.removed.len(),
            report.kept
        );
    }
    Ok(0)
}

#[cfg(not(feature = "docker"))]
async fn gc_docker(
    _rt: &Runtime,
    _dir: &Path,
    _a: GcArgs,
    _pruned: Vec<serde_json::Value>,
) -> Result<u8> {
    bail!("this berth was built without the docker backend (cargo feature `docker`)")
}
