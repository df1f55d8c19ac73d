//! `berth sandbox create|ls|rm|gc`, and the checkpoint subcommands
//! (`crate::cmd_checkpoint`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use berth_core::backend::{Limits, SandboxSpec};
use berth_core::runtime::Runtime;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::context::{self, DEFAULT_BACKEND};
use crate::io::outln;

#[derive(Subcommand, Debug)]
pub enum SandboxCmd {
    /// Create a sandbox, or re-attach to the one with this name (idempotent).
    Create(CreateArgs),
    /// List berth's sandboxes, with their live state.
    Ls(LsArgs),
    /// Remove a sandbox.
    Rm(RmArgs),
    /// Remove sandboxes idle longer than the policy's idle lifetime.
    Reap(crate::cmd_reap::ReapArgs),
    /// Prune checkpoints past the policy's retention (`[checkpoints] keep`,
    /// `budget_mb`) and the packs no kept one needs. On docker, also remove
    /// this installation's exited or never-started containers (their volumes
    /// stay, so `sandbox create` brings the sandbox back) and orphaned state
    /// volumes.
    Gc(GcArgs),
    /// Save the sandbox's workspace files and session state (cwd,
    /// environment, functions, aliases). Only what changed since the last
    /// checkpoint is stored.
    Checkpoint(crate::cmd_checkpoint::CheckpointArgs),
    /// List a sandbox's checkpoints.
    Checkpoints(crate::cmd_checkpoint::CheckpointsArgs),
    /// Bring a sandbox's files and session back to a checkpoint. Refused
    /// while a command or job runs in it, unless --force.
    Restore(crate::cmd_checkpoint::RestoreArgs),
    /// Make a new sandbox with another's files and session, as they are now
    /// or at a checkpoint.
    Clone(crate::cmd_checkpoint::CloneArgs),
}

#[derive(Args, Debug)]
pub struct GcArgs {
    /// Only those stopped longer ago than this: `90s`, `30m`, `2h`, `7d`, `0`.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub older_than: std::time::Duration,
    /// Backend to collect on.
    #[arg(long, short = 'b', default_value = "docker")]
    pub backend: String,
    /// Also remove orphaned workspace volumes (including ones kept with
    /// `sandbox rm --keep-workspace`); orphaned state volumes always go.
    #[arg(long)]
    pub workspaces: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `90s`, `30m`, `2h`, `7d`, or a bare number of seconds. (Four units, one
/// number: no crate in berth's tree reads this, and `humantime` is not worth
/// adding for it.)
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; use e.g. 90s, 30m, 2h, 7d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit in {s:?}; use s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(secs)))
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The sandbox's name: letters, digits, '-', '_', '.'.
    pub name: String,
    /// Backend to create it on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// Image or template (docker).
    #[arg(long)]
    pub image: Option<String>,
    /// Allow network access (off by default where the backend can enforce it).
    #[arg(long)]
    pub network: bool,
    /// Memory limit in MiB.
    #[arg(long, value_name = "MIB")]
    pub memory_mb: Option<u64>,
    /// CPU quota in cores, e.g. 0.5.
    #[arg(long, value_name = "CORES")]
    pub cpus: Option<f64>,
    /// Maximum number of processes.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Environment variable for every process in the sandbox (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Backend-specific option (repeatable), e.g. `host=myserver` for ssh.
    #[arg(long = "opt", short = 'o', value_name = "KEY=VALUE")]
    pub options: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Backend to list.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The sandbox's name.
    pub name: String,
    /// Backend it lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// docker: keep the workspace volume (the container and berth's session
    /// state volume go regardless). A later sandbox of the same name mounts it.
    #[arg(long, conflicts_with = "volumes")]
    pub keep_workspace: bool,
    /// The default (delete the workspace too); kept for old scripts.
    #[arg(long, hide = true)]
    pub volumes: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

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
                    outln!("note: recreated: {r}");
                }
            }
        }
        SandboxCmd::Ls(a) => {
            let list = rt.list_sandboxes(&a.backend).await?;
            if a.json {
                context::print_json(&serde_json::to_value(&list)?);
            } else if list.is_empty() {
                outln!(
                    "no sandboxes on {}; create one with `berth sandbox create NAME --backend {}`",
                    a.backend,
                    a.backend
                );
            } else {
                outln!("{:<24} {:<8} {:<10} ID", "NAME", "BACKEND", "STATE");
                for s in list {
                    let state = if s.orphan {
                        format!("{} (orphan)", s.state)
                    } else {
                        s.state
                    };
                    outln!(
                        "{:<24} {:<8} {:<10} {}",
                        s.name,
                        s.backend,
                        state,
                        s.id.unwrap_or_default()
                    );
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("2w").is_err());
        assert!(parse_duration("h").is_err());
    }
}
