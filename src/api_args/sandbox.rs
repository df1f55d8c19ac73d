//! `berth sandbox …`: the arguments of the sandbox and checkpoint subcommands.

use berth_core::backend::BackendKind;
use clap::{Args, Subcommand};

use berth_client::DEFAULT_BACKEND;

#[derive(Subcommand, Debug)]
pub enum SandboxCmd {
    /// Create a sandbox, or re-attach to the one with this name (idempotent).
    Create(CreateArgs),
    /// List berth's sandboxes, with their live state.
    Ls(LsArgs),
    /// Show a sandbox's settings and size as the sandbox itself has them (on
    /// docker, the container's config read from the engine), beside the
    /// settings on record, and any difference between the two.
    Inspect(InspectArgs),
    /// Remove a sandbox.
    Rm(RmArgs),
    /// Remove sandboxes idle longer than the policy's idle lifetime.
    Reap(ReapArgs),
    /// Prune checkpoints past the policy's retention (`[checkpoints] keep`,
    /// `budget_mb`) and the packs no kept one needs. On docker, also remove
    /// this installation's exited or never-started containers (their volumes
    /// stay, so `sandbox create` brings the sandbox back) and orphaned state
    /// volumes.
    Gc(GcArgs),
    /// Save the sandbox's workspace files and session state (cwd,
    /// environment, functions, aliases). Only what changed since the last
    /// checkpoint is stored.
    Checkpoint(CheckpointArgs),
    /// List a sandbox's checkpoints.
    Checkpoints(CheckpointsArgs),
    /// Bring a sandbox's files and session back to a checkpoint. Refused
    /// while a command or job runs in it, unless --force.
    Restore(RestoreArgs),
    /// Make a new sandbox with another's files and session, as they are now
    /// or at a checkpoint.
    Clone(CloneArgs),
    /// Allow or deny a host for a sandbox made with `--network allow:…`,
    /// while it runs: its next connection is judged by the new rules.
    Network(NetworkArgs),
}

#[derive(Args, Debug)]
pub struct NetworkArgs {
    /// The sandbox.
    pub name: String,
    /// `allow` or `deny`.
    #[arg(value_parser = ["allow", "deny"])]
    pub verdict: String,
    /// A host (`pypi.org`), its subdomains (`*.github.com`), an address or
    /// a network (`10.1.2.3`, `10.0.0.0/8`), with an optional port.
    pub host: String,
    /// Its backend.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct GcArgs {
    /// Only those stopped longer ago than this: `90s`, `30m`, `2h`, `7d`, `0`.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub older_than: std::time::Duration,
    /// Backend to collect on.
    #[arg(long, short = 'b', default_value = "docker", value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
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
    /// Backend to create it on [default: local; with --from-pool, the
    /// pool's].
    #[arg(long, short = 'b', value_parser = crate::api_client::parse_backend)]
    pub backend: Option<BackendKind>,
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Take the sandbox from this warm pool (`berth pool create`): one made
    /// ahead, its shell already started, when one is ready; else one made
    /// now with the pool's settings. The pool's settings are the sandbox's.
    #[arg(long, value_name = "POOL", conflicts_with_all = ["image", "network", "memory_mb", "cpus", "pids", "env", "options", "context", "namespace"])]
    pub from_pool: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// A sandbox's settings on the command line: `sandbox create`'s and
/// `pool create`'s.
#[derive(Args, Debug)]
pub struct SettingsArgs {
    /// Image or template (docker).
    #[arg(long)]
    pub image: Option<String>,
    /// The sandbox's network: `off` (the default where the backend can
    /// enforce it), `on` (the host's network, unfiltered; also the bare
    /// flag), or `allow:HOST,HOST…` (no route of its own, only berth's
    /// egress proxy, letting through the hosts named: `pypi.org`,
    /// `*.github.com`, `10.1.2.3:5432`; docker). Fixed when the sandbox is
    /// made; `berth sandbox network` changes an `allow:` list later.
    #[arg(long, num_args = 0..=1, default_missing_value = "on", value_name = "off|on|allow:HOST,…", value_parser = crate::api_client::parse_network)]
    pub network: Option<berth_core::backend::Network>,
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
    /// Backend-specific option (repeatable), e.g. `host=myserver` for ssh,
    /// `runtime_class=gvisor` for k8s.
    #[arg(long = "opt", short = 'o', value_name = "KEY=VALUE")]
    pub options: Vec<String>,
    /// k8s: the kubeconfig context to make it in [default:
    /// BERTH_K8S_CONTEXT, else the current context]. The sandbox keeps it.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// k8s: the namespace [default: BERTH_K8S_NAMESPACE, else the
    /// context's, else `default`]. The sandbox keeps it.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Backend to list.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// List every backend's sandboxes (local, and each backend berth has
    /// recorded sandboxes on; ssh on every host they are on).
    #[arg(long, short = 'a')]
    pub all: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The sandbox's name.
    pub name: String,
    /// Backend it lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The sandbox's name.
    pub name: String,
    /// Backend it lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// docker and k8s: keep the workspace (docker's volume, k8s's claim;
    /// the container or pod and berth's session state go regardless). A
    /// later sandbox of the same name mounts it.
    #[arg(long, conflicts_with = "volumes")]
    pub keep_workspace: bool,
    /// The default (delete the workspace too); kept for old scripts.
    #[arg(long, hide = true)]
    pub volumes: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The idle lifetime is `idle_lifetime_secs` under [limits] in the policy file \
(per sandbox under [limits.sandbox.NAME]); 0 keeps a sandbox forever.\n\n\
Examples:\n  berth sandbox reap --dry-run\n  berth sandbox reap --json"
)]
pub struct ReapArgs {
    /// Only list what would be removed.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON object per sandbox.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CheckpointArgs {
    /// The sandbox.
    pub name: String,
    /// A label; labelled checkpoints are kept whatever the retention.
    #[arg(long, short = 'l')]
    pub label: Option<String>,
    /// Backend it lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    /// The sandbox.
    pub name: String,
    /// Backend it lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The sandbox.
    pub name: String,
    /// The checkpoint's id (`berth sandbox checkpoints NAME` lists them).
    pub checkpoint: String,
    /// Stop what runs in the sandbox (commands, jobs) first, instead of
    /// refusing.
    #[arg(long)]
    pub force: bool,
    /// Backend it lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CloneArgs {
    /// The sandbox to copy.
    pub src: String,
    /// The new sandbox's name.
    pub dst: String,
    /// The checkpoint to copy; without it, a checkpoint of SRC as it is now.
    #[arg(long, value_name = "CHECKPOINT")]
    pub at: Option<String>,
    /// Backend SRC lives on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Backend for the new sandbox; SRC's when not given. Files and session
    /// move; backend settings (an image, a host) do not.
    #[arg(long, value_name = "BACKEND", value_parser = crate::api_client::parse_backend)]
    pub to: Option<BackendKind>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
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
