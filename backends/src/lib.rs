//! berth-backends: the sandbox transports behind berth-core's [`Backend`] trait.
//!
//! Each backend lives in its own module behind a cargo feature and does only what
//! the trait asks: provision, list, remove, spawn, move files.

use std::path::PathBuf;
use std::sync::Arc;

use berth_core::backend::Backend;
use berth_core::error::{Error, Result};

#[cfg(feature = "docker")]
pub mod docker;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "local")]
pub mod local_cgroup;
mod local_files;
#[cfg(feature = "ssh")]
pub mod ssh;

/// Where a backend reports long preparations (the docker image build), one
/// human-readable line at a time, for a CLI to print.
pub type ProgressSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What a backend needs to know to start.
#[derive(Clone, Default)]
pub struct BackendContext {
    /// berth's state directory.
    pub state_dir: PathBuf,
    /// The argv prefix that applies the local kernel restrictions, if any.
    pub local_wrapper: Option<Vec<String>>,
    /// Progress of long preparations; logged through `tracing` when unset.
    pub progress: Option<ProgressSink>,
    /// Settings for the ssh backend.
    pub ssh: SshOptions,
}

impl std::fmt::Debug for BackendContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendContext")
            .field("state_dir", &self.state_dir)
            .field("local_wrapper", &self.local_wrapper)
            .field("progress", &self.progress.is_some())
            .field("ssh", &self.ssh)
            .finish()
    }
}

/// Settings for the ssh backend. Everything that comes from berth's environment
/// (`HOME`, `SSH_AUTH_SOCK`, `BERTH_SSH_PASSPHRASE`) is read once, by
/// [`SshOptions::from_env`], so the backend itself never consults the environment.
#[derive(Clone, Default)]
pub struct SshOptions {
    /// The host (an `~/.ssh/config` alias or `[user@]host[:port]`) used when a
    /// sandbox spec names none, and by `list`/`remove`.
    pub host: Option<String>,
    /// The local home directory: `~` in paths and the default key and config files.
    pub home: Option<PathBuf>,
    /// The local user name, the default remote user.
    pub local_user: Option<String>,
    /// The ssh client config; `~/.ssh/config` when `None`.
    pub config_path: Option<PathBuf>,
    /// The known_hosts file; the config's `UserKnownHostsFile` or
    /// `~/.ssh/known_hosts` when `None`.
    pub known_hosts: Option<PathBuf>,
    /// Trust an unknown host on first use and record its key (`--accept-new`).
    /// A changed key is refused regardless.
    pub accept_new: bool,
    /// Identity files to try before the config's and the default ones (`-i`).
    pub identity_files: Vec<PathBuf>,
    /// The ssh-agent socket (`SSH_AUTH_SOCK`).
    pub agent_socket: Option<PathBuf>,
    /// The passphrase for encrypted key files (`BERTH_SSH_PASSPHRASE`). Never argv.
    pub passphrase: Option<String>,
    /// How long TCP connect plus the SSH handshake and authentication may take.
    pub connect_timeout: Option<std::time::Duration>,
    /// Send a keepalive after this much silence from the server.
    pub keepalive_interval: Option<std::time::Duration>,
    /// Drop the connection after this many unanswered keepalives.
    pub keepalive_max: Option<usize>,
    /// Where sandboxes live on the remote host; `~/.berth/sandboxes` when `None`.
    pub sandbox_root: Option<String>,
}

impl SshOptions {
    /// Options with the environment-derived fields filled from this process's
    /// environment: `HOME`, `USER`/`LOGNAME`, `SSH_AUTH_SOCK`, `BERTH_SSH_PASSPHRASE`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            home: var("HOME").map(PathBuf::from),
            local_user: var("USER")
                .or_else(|| var("LOGNAME"))
                .or_else(current_user_from_passwd),
            agent_socket: var("SSH_AUTH_SOCK").map(PathBuf::from),
            passphrase: var("BERTH_SSH_PASSPHRASE"),
            ..Self::default()
        }
    }
}

/// This process's user name from /etc/passwd, for when `USER` is unset (cron,
/// containers).
fn current_user_from_passwd() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)? == uid).then(|| name.to_string())
    })
}

impl std::fmt::Debug for SshOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshOptions")
            .field("host", &self.host)
            .field("home", &self.home)
            .field("local_user", &self.local_user)
            .field("config_path", &self.config_path)
            .field("known_hosts", &self.known_hosts)
            .field("accept_new", &self.accept_new)
            .field("identity_files", &self.identity_files)
            .field("agent_socket", &self.agent_socket)
            .field(
                "passphrase",
                &self.passphrase.as_ref().map(|_| "<redacted>"),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_max", &self.keepalive_max)
            .field("sandbox_root", &self.sandbox_root)
            .finish()
    }
}

/// The backends compiled into this build.
pub fn available() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "local") {
        v.push("local");
    }
    if cfg!(feature = "ssh") {
        v.push("ssh");
    }
    if cfg!(feature = "docker") {
        v.push("docker");
    }
    v
}

/// Open the backend called `kind`.
pub async fn open(kind: &str, ctx: &BackendContext) -> Result<Arc<dyn Backend>> {
    match kind {
        #[cfg(feature = "local")]
        "local" => {
            let mut b = local::LocalBackend::new(&ctx.state_dir);
            if let Some(w) = &ctx.local_wrapper {
                b = b.with_wrapper(w.clone());
            }
            Ok(Arc::new(b))
        }
        #[cfg(feature = "ssh")]
        "ssh" => Ok(Arc::new(ssh::SshBackend::new(ctx.ssh.clone()))),
        #[cfg(feature = "docker")]
        "docker" => {
            let mut b = docker::DockerBackend::connect().await?;
            if let Some(sink) = ctx.progress.clone() {
                b = b.with_progress(Arc::new(move |p: docker::BuildProgress| {
                    // Only an actual build is news when a sandbox is provisioned.
                    if !matches!(p, docker::BuildProgress::Done { reused: true, .. }) {
                        sink(&p.to_string())
                    }
                }));
            }
            Ok(Arc::new(b))
        }
        other => Err(Error::InvalidInput(format!(
            "unknown backend `{other}`; this build has: {}",
            available().join(", ")
        ))),
    }
}
