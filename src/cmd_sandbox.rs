//! `berth sandbox create|ls|inspect|rm|reap|gc` (inspect in
//! `crate::cmd_inspect`), and the checkpoint subcommands
//! (`crate::cmd_checkpoint`).
//!
//! A client of the typed API's `Sandboxes` service (`berth.v1`): through
//! the server, or with `BERTH_SERVER=off` on the same handlers in this
//! process. It prints the API's values; nothing is captured to form a reply.

use berth_core::backend::BackendKind;
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use berth_service::convert;
use berth_service::proto;
use berth_service::proto::sandboxes_client::SandboxesClient;
use berth_service::proto::sandboxes_server::Sandboxes;
use serde_json::json;

use crate::api_client::{Api, call, sandbox_ref};
use crate::{context, server};

use crate::api_args::sandbox::{CreateArgs, GcArgs, LsArgs, ReapArgs, SandboxCmd, SettingsArgs};

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

/// A create request with the settings given on the command line (the
/// sandbox's name left empty): `sandbox create`'s and `pool create`'s.
pub(crate) fn settings_request(
    backend: BackendKind,
    a: &SettingsArgs,
) -> Result<proto::CreateSandbox> {
    if a.cpus.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
        bail!("--cpus must be a positive number of cores, e.g. --cpus 0.5");
    }
    let mut options = pairs(&a.options, "--opt")?;
    for (key, value) in [("context", &a.context), ("namespace", &a.namespace)] {
        let Some(value) = value else { continue };
        if backend != BackendKind::K8s {
            bail!("--{key} is for k8s sandboxes (--backend k8s)");
        }
        if options.get(key).is_some_and(|o| o != value) {
            bail!(
                "--{key} {value} and --opt {key}={} disagree; give one",
                options[key]
            );
        }
        options.insert(key.to_string(), value.clone());
    }
    Ok(proto::CreateSandbox {
        sandbox: Some(sandbox_ref(backend, "")?),
        image: a.image.clone(),
        env: pairs(&a.env, "--env")?.into_iter().collect(),
        network: a.network.as_ref().is_some_and(|n| n.is_open()),
        network_rules: a
            .network
            .as_ref()
            .and_then(|n| n.rules())
            .map(|r| proto::NetworkRules {
                allow: r.allow.clone(),
                deny: r.deny.clone(),
            }),
        memory_mb: a.memory_mb,
        milli_cpu: a.cpus.map(|c| (c * 1000.0).round() as u64),
        pids: a.pids,
        options: options.into_iter().collect(),
        from_pool: None,
    })
}

async fn create(api: &Api, a: CreateArgs) -> Result<u8> {
    if let Some(pool) = &a.from_pool {
        return from_pool(api, &a, pool).await;
    }
    let backend = a.backend.unwrap_or(BackendKind::Local);
    let mut req = settings_request(backend, &a.settings)?;
    req.sandbox = Some(sandbox_ref(backend, &a.name)?);
    if backend == BackendKind::Docker && a.settings.image.is_none() && matches!(api, Api::Served(_))
    {
        image_first().await?;
    }
    let sb = call!(api, SandboxesClient, Sandboxes, create, req)?;
    if a.json {
        context::print_json(&json!({
            "name": a.name, "backend": backend, "created": sb.created,
            "recreated": sb.recreated, "workdir": sb.workdir,
        }));
    } else {
        let verb = if sb.created {
            "created"
        } else {
            "attached to existing"
        };
        println!(
            "{verb} sandbox {} ({backend}), workspace {}",
            a.name, sb.workdir
        );
        if let Some(r) = sb.recreated {
            println!("note: the sandbox was brought back: {r}");
        }
    }
    Ok(0)
}

/// `sandbox create NAME --from-pool POOL`.
async fn from_pool(api: &Api, a: &CreateArgs, pool: &str) -> Result<u8> {
    let mut at = sandbox_ref(a.backend.unwrap_or(BackendKind::Local), &a.name)?;
    if a.backend.is_none() {
        // The pool's backend.
        at.backend = proto::Backend::Unspecified as i32;
    }
    let req = proto::CreateSandbox {
        sandbox: Some(at),
        from_pool: Some(pool.to_string()),
        ..Default::default()
    };
    let sb = call!(api, SandboxesClient, Sandboxes, create, req)?;
    let (backend, _) = convert::place(sb.sandbox.clone());
    if a.json {
        context::print_json(&json!({
            "name": a.name, "backend": backend, "created": true, "pool": pool,
            "member": sb.pool_member, "workdir": sb.workdir,
        }));
    } else {
        match &sb.pool_member {
            Some(m) => println!(
                "created sandbox {} ({backend}) from pool {pool} (member {m}), workspace {}",
                a.name, sb.workdir
            ),
            None => println!(
                "created sandbox {} ({backend}) with pool {pool}'s settings; the pool had none ready, so it was made now; workspace {}",
                a.name, sb.workdir
            ),
        }
    }
    // Without a server nothing refills the pool after this process: do it
    // before leaving.
    if matches!(api, Api::Here(_)) {
        let req = proto::PoolRef {
            name: pool.to_string(),
        };
        if let Err(e) = call!(api, SandboxesClient, Sandboxes, fill_pool, req) {
            eprintln!("warning: refilling pool {pool} failed: {e:#}");
        }
    }
    Ok(0)
}

/// Run a sandbox subcommand against the state dir `dir`.
pub async fn run(dir: &Path, mode: server::Mode, cmd: SandboxCmd) -> Result<u8> {
    let api = Api::open(dir, mode).await?;
    let r = run_with(&api, dir, cmd).await;
    api.close().await;
    r
}

async fn run_with(api: &Api, dir: &Path, cmd: SandboxCmd) -> Result<u8> {
    match cmd {
        SandboxCmd::Create(a) => create(api, a).await,
        SandboxCmd::Ls(a) => ls(api, a).await,
        SandboxCmd::Inspect(a) => crate::cmd_inspect::run(api, a).await,
        SandboxCmd::Reap(a) => reap(api, a).await,
        SandboxCmd::Gc(a) => gc(api, a).await,
        SandboxCmd::Checkpoint(a) => crate::cmd_checkpoint::checkpoint(api, a).await,
        SandboxCmd::Checkpoints(a) => crate::cmd_checkpoint::list(api, a).await,
        SandboxCmd::Restore(a) => crate::cmd_checkpoint::restore(api, dir, a).await,
        SandboxCmd::Clone(a) => crate::cmd_checkpoint::clone(api, a).await,
        SandboxCmd::Network(a) => {
            let req = proto::NetworkChange {
                sandbox: Some(sandbox_ref(a.backend, &a.name)?),
                allow: a.verdict == "allow",
                host: a.host.clone(),
            };
            let rules = call!(api, SandboxesClient, Sandboxes, set_network, req)?;
            if a.json {
                context::print_json(&json!({
                    "name": a.name, "backend": a.backend,
                    "allow": rules.allow, "deny": rules.deny,
                }));
            } else {
                println!(
                    "sandbox {} ({}): allow {}; deny {}",
                    a.name,
                    a.backend,
                    list_or_none(&rules.allow),
                    list_or_none(&rules.deny)
                );
            }
            Ok(0)
        }
        SandboxCmd::Rm(a) => {
            // In-process, a server may hold the sandbox's shell: tell it.
            // Through the server, its runtime lets go in `remove_sandbox`.
            if matches!(api, Api::Here(_)) {
                crate::server::client::forget(dir, a.backend.as_str(), &a.name).await;
            }
            let req = proto::RemoveSandbox {
                sandbox: Some(sandbox_ref(a.backend, &a.name)?),
                keep_workspace: a.keep_workspace,
            };
            call!(api, SandboxesClient, Sandboxes, remove, req)?;
            if a.json {
                context::print_json(&json!({ "removed": a.name, "backend": a.backend }));
            } else {
                println!("removed sandbox {} ({})", a.name, a.backend);
            }
            Ok(0)
        }
    }
}

/// Build the docker sandbox image here, with its progress on this terminal,
/// before the server makes a first sandbox from it (it would build it
/// silently, on its own log). Already built: one look at the engine. An
/// engine this process cannot reach is the server's to report.
#[cfg(feature = "docker")]
async fn image_first() -> Result<()> {
    use anyhow::Context;
    use berth_backends::docker::{BuildProgress, DockerBackend};
    let Ok(backend) = DockerBackend::connect().await else {
        return Ok(());
    };
    backend
        .with_progress(std::sync::Arc::new(|p: BuildProgress| {
            eprintln!("berth: image: {p}")
        }))
        .ensure_image()
        .await
        .context("building the docker sandbox image")?;
    Ok(())
}

#[cfg(not(feature = "docker"))]
async fn image_first() -> Result<()> {
    Ok(())
}

/// `sandbox ls`: one backend's sandboxes, or with `--all` every backend's
/// that has recorded sandboxes (and local). A backend that cannot be asked
/// is named with why, and the others are listed all the same.
async fn ls(api: &Api, a: LsArgs) -> Result<u8> {
    let req = proto::ListSandboxes {
        backend: sandbox_ref(a.backend, "")?.backend,
        all: a.all,
    };
    let got = call!(api, SandboxesClient, Sandboxes, list, req)?;
    let failed: Vec<(BackendKind, String)> = got
        .failed
        .into_iter()
        .map(|f| {
            let (b, _) = convert::place(Some(proto::SandboxRef {
                backend: f.backend,
                name: String::new(),
            }));
            (b, f.error)
        })
        .collect();
    let list: Vec<_> = got
        .sandboxes
        .into_iter()
        .map(convert::sandbox_status_row)
        .collect();
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
        println!(
            "no sandboxes on {}; create one with `berth sandbox create NAME --backend {}`",
            a.backend, a.backend
        );
        return Ok(0);
    }
    if !list.is_empty() {
        println!("{:<24} {:<8} {:<12} ID", "NAME", "BACKEND", "STATE");
    }
    for s in list {
        let state = if s.orphan {
            format!("{} (orphan)", s.state)
        } else {
            s.state
        };
        println!(
            "{:<24} {:<8} {:<12} {}",
            s.name,
            s.backend,
            state,
            s.id.unwrap_or_default()
        );
    }
    for (b, e) in failed {
        eprintln!("berth: backend {b}: could not list its sandboxes: {e}");
    }
    Ok(0)
}

/// `sandbox reap`: remove sandboxes idle longer than the policy allows.
async fn reap(api: &Api, a: ReapArgs) -> Result<u8> {
    let req = proto::ReapSandboxes { dry_run: a.dry_run };
    let idle: Vec<_> = call!(api, SandboxesClient, Sandboxes, reap, req)?
        .idle
        .into_iter()
        .map(convert::idle_row)
        .collect();
    let mut failed = false;
    for i in &idle {
        failed |= i.error.is_some();
        if a.json {
            context::print_json(&serde_json::to_value(i)?);
            continue;
        }
        let what = match (&i.error, a.dry_run) {
            (Some(e), _) => format!("could not remove: {e}"),
            (None, true) => "would remove".into(),
            (None, false) => "removed".into(),
        };
        println!(
            "{what}: {} ({}), idle {}s > {}s",
            i.name, i.backend, i.idle_secs, i.lifetime_secs
        );
    }
    if idle.is_empty() && !a.json {
        println!("no idle sandboxes");
    }
    Ok(if failed { 1 } else { 0 })
}

/// `sandbox gc`: checkpoints on the backend, then docker's containers.
async fn gc(api: &Api, a: GcArgs) -> Result<u8> {
    let req = proto::CollectGarbage {
        backend: sandbox_ref(a.backend, "")?.backend,
        older_than_secs: a.older_than.as_secs_f64(),
        workspaces: a.workspaces,
    };
    let c = call!(api, SandboxesClient, Sandboxes, collect, req)?;
    let pruned: Vec<serde_json::Value> = c
        .checkpoints
        .iter()
        .map(|p| match &p.error {
            Some(e) => json!({ "sandbox": p.sandbox, "error": e }),
            None => json!({
                "sandbox": p.sandbox, "checkpoints": p.checkpoints, "packs": p.packs,
            }),
        })
        .collect();
    let docker = a.backend == BackendKind::Docker;
    if a.json {
        if docker {
            context::print_json(&json!({
                "removed": c.removed, "kept": c.kept, "backend": a.backend,
                "removed_volumes": c.removed_volumes, "checkpoints": pruned,
            }));
        } else {
            context::print_json(&json!({ "backend": a.backend, "checkpoints": pruned }));
        }
        return Ok(0);
    }
    for p in &c.checkpoints {
        match &p.error {
            Some(e) => println!("sandbox {:?}: checkpoints not pruned: {e}", p.sandbox),
            None => println!(
                "sandbox {}: {} checkpoints and {} packs past retention removed",
                p.sandbox, p.checkpoints, p.packs
            ),
        }
    }
    if docker {
        for name in &c.removed {
            println!("removed the container of sandbox {name} (its volumes are kept)");
        }
        for v in &c.removed_volumes {
            println!("removed orphaned volume {v}");
        }
        println!(
            "{} removed, {} kept (running or too recent)",
            c.removed.len(),
            c.kept
        );
    }
    Ok(0)
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}
