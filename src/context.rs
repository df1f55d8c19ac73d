//! What every subcommand needs: the state dir, the store and the runtime.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use async_trait::async_trait;
use berth_backends::BackendContext;
use berth_core::backend::{Backend, BackendKind};
use berth_core::gate::Gate;
use berth_core::runtime::{BackendSource, Runtime, RuntimeConfig};
use berth_core::store::Store;

pub use berth_client::{DEFAULT_BACKEND, state_dir};

/// The runtime's settings; `BERTH_SPOOL_CAP_MB` and `BERTH_SPOOL_DIR_CAP_MB` bound
/// the output spool (one command's file, and all of them).
fn runtime_config(dir: PathBuf) -> Result<RuntimeConfig> {
    let mut cfg = RuntimeConfig::new(dir);
    let mb = |name: &str| -> Result<Option<u64>> {
        match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<u64>()
                .map(|n| Some(n.saturating_mul(1024 * 1024)))
                .with_context(|| format!("{name}={v:?} is not a whole number of MiB")),
            _ => Ok(None),
        }
    };
    if let Some(b) = mb("BERTH_SPOOL_CAP_MB")? {
        let most = berth_core::session::capture::MAX_SPOOL_CAP;
        anyhow::ensure!(
            b <= most,
            "BERTH_SPOOL_CAP_MB is more than {} MiB, the largest spool berth keeps (it holds the last half in memory while the command runs); to keep all of a larger output, redirect it to a file in the sandbox",
            most >> 20
        );
        cfg.spool_file_cap = b;
    }
    if let Some(b) = mb("BERTH_SPOOL_DIR_CAP_MB")? {
        cfg.spool_dir_cap = b;
    }
    Ok(cfg)
}

pub use berth_client::policy_path;

/// The gate: the policy file over the built-in defaults, and berth's environment.
pub fn gate() -> Result<Gate> {
    Ok(Gate::load(&policy_path()?, std::env::vars())?)
}

/// The ssh backend's settings, set once from the command line in `main`.
static SSH_OPTIONS: std::sync::OnceLock<berth_backends::SshOptions> = std::sync::OnceLock::new();

/// Record the ssh settings for every backend opened later.
pub fn set_ssh_options(o: berth_backends::SshOptions) {
    let _ = SSH_OPTIONS.set(o);
}

/// The ssh settings: from the command line, else from the environment.
pub fn ssh_options() -> berth_backends::SshOptions {
    SSH_OPTIONS
        .get()
        .cloned()
        .unwrap_or_else(berth_backends::SshOptions::from_env)
}

/// Opens backends through berth-backends.
pub struct Backends {
    ctx: BackendContext,
}

#[async_trait]
impl BackendSource for Backends {
    async fn open(&self, kind: BackendKind) -> berth_core::Result<Arc<dyn Backend>> {
        berth_backends::open(kind, &self.ctx).await
    }
}

/// Open the store and build a runtime over it.
pub fn runtime(flag: Option<PathBuf>) -> Result<Runtime> {
    let dir = state_dir(flag)?;
    let store = Store::open(&dir)?;
    let gate = Arc::new(gate()?);
    store.keep_events(gate.policy().limits.default.events_keep);
    // Every local sandbox process runs through the kernel restrictions;
    // BERTH_UNRESTRICTED=1 runs them unconfined (and the wrapper says so).
    let unrestricted = std::env::var_os("BERTH_UNRESTRICTED").is_some_and(|v| v == "1");
    let exe = std::env::current_exe()
        .context("cannot find berth's own executable for the local sandbox wrapper")?;
    let ctx = BackendContext {
        state_dir: dir.clone(),
        #[cfg(feature = "local")]
        local_wrapper: Some(
            berth_sandbox::WrapperCommand::new(exe, &gate.policy().local)?
                .with_limits(&gate.policy().limits)
                .unrestricted(unrestricted),
        ),
        ssh: ssh_options(),
        modal: berth_backends::ModalSettings::from_env(),
        k8s: berth_backends::K8sSettings::from_env(),
        // A first docker sandbox builds its image: say what is happening.
        progress: Some(Arc::new(|line: &str| {
            crate::io::errln!("berth: image: {line}")
        })),
    };
    Ok(Runtime::new(
        Arc::new(store),
        Arc::new(Backends { ctx }),
        runtime_config(dir)?,
    )
    .with_gate(gate)
    // To the client whose call waits, when the server runs it.
    .with_approval_notice(Arc::new(|ap: &berth_core::approvals::Approval| {
        crate::io::errln!("{}", approval_notice_text(ap));
    })))
}

pub use crate::exec_report::approval_notice_text;

/// Print a value as one line of JSON (to the client, when the server runs the call).
pub fn print_json(v: &serde_json::Value) {
    crate::io::outln!("{v}");
}
