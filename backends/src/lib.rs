//! berth-backends: the sandbox transports behind berth-core's [`Backend`] trait.
//!
//! Each backend lives in its own module behind a cargo feature and does only what
//! the trait asks: provision, list, remove, spawn, move files.

use std::path::PathBuf;
use std::sync::Arc;

use berth_core::backend::{Backend, BackendKind};
use berth_core::error::{BackendFailure, Error, Result};

#[cfg(any(
    feature = "docker",
    feature = "ssh",
    feature = "modal",
    feature = "k8s"
))]
mod chan_reader;
#[cfg(feature = "docker")]
pub mod docker;
#[cfg(feature = "e2b")]
pub mod e2b;
#[cfg(any(feature = "modal", feature = "k8s"))]
mod exec_files;
#[cfg(feature = "k8s")]
pub mod k8s;
#[cfg(any(feature = "ssh", feature = "k8s"))]
mod launcher;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "local")]
mod local_files;
#[cfg(feature = "local")]
mod local_pty;
#[cfg(feature = "modal")]
pub mod modal;
#[cfg(feature = "ssh")]
pub mod ssh;
#[cfg(any(
    feature = "docker",
    feature = "ssh",
    feature = "e2b",
    feature = "modal",
    feature = "k8s"
))]
mod subreaper;

/// The file in the state dir that holds the installation id.
pub const INSTALLATION_FILE: &str = "installation-id";

/// This state dir's installation id, created on first use: the docker backend
/// names and labels its containers and volumes with it, so one berth never
/// attaches to another's on a shared daemon.
pub fn installation_id(state_dir: &std::path::Path) -> Result<String> {
    let path = state_dir.join(INSTALLATION_FILE);
    let io = |doing: &str, e: std::io::Error| {
        Error::backend(
            "berth",
            BackendFailure::Local,
            format!(
                "{doing} the installation id {}: {e}; check the state dir's permissions",
                path.display()
            ),
        )
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if valid_installation_id(s.trim()) => return Ok(s.trim().to_string()),
        Ok(s) => {
            return Err(Error::InvalidInput(format!(
                "{} holds {:?}, not an installation id (10 lowercase hex digits); restore it, or remove it to start a new installation that will not see the old docker sandboxes",
                path.display(),
                s.trim()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("reading", e)),
    }
    std::fs::create_dir_all(state_dir).map_err(|e| io("creating the directory for", e))?;
    // Written aside and linked into place: of two processes starting at once,
    // one id wins and both read it.
    let id = new_installation_id();
    let tmp = state_dir.join(format!("{INSTALLATION_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, format!("{id}\n")).map_err(|e| io("writing", e))?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => installation_id(state_dir),
        Err(e) => Err(io("writing", e)),
    }
}

fn valid_installation_id(s: &str) -> bool {
    s.len() == 10 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A fresh random installation id: 10 lowercase hex digits.
pub fn new_installation_id() -> String {
    let b: [u8; 5] = rand::random();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Where a backend reports long preparations (the docker image build), one
/// human-readable line at a time, for a CLI to print.
pub type ProgressSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What a backend needs to know to start.
#[derive(Clone, Default)]
pub struct BackendContext {
    /// berth's state directory.
    pub state_dir: PathBuf,
    /// The wrapper that applies the local kernel restrictions, if any.
    #[cfg(feature = "local")]
    pub local_wrapper: Option<berth_sandbox::WrapperCommand>,
    /// Progress of long preparations; logged through `tracing` when unset.
    pub progress: Option<ProgressSink>,
    /// Settings for the ssh backend.
    pub ssh: SshOptions,
    /// Settings for the modal backend.
    pub modal: ModalSettings,
    /// Settings for the k8s backend.
    pub k8s: K8sSettings,
}

impl std::fmt::Debug for BackendContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("BackendContext");
        d.field("state_dir", &self.state_dir);
        #[cfg(feature = "local")]
        d.field("local_wrapper", &self.local_wrapper);
        d.field("progress", &self.progress.is_some())
            .field("ssh", &self.ssh)
            .field("modal", &self.modal)
            .field("k8s", &self.k8s)
            .finish()
    }
}

/// Settings for the k8s backend, read once from the environment by
/// [`K8sSettings::from_env`] so the backend never consults it. A sandbox
/// keeps the context and namespace it was made in (its `context` and
/// `namespace` options); these are only the defaults for a new one.
#[derive(Clone, Debug, Default)]
pub struct K8sSettings {
    /// The kubeconfig (`KUBECONFIG`'s first file, else `~/.kube/config`);
    /// `None` with no such file: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The context a new sandbox is made in (`BERTH_K8S_CONTEXT`); the
    /// kubeconfig's current context when unset.
    pub context: Option<String>,
    /// The namespace (`BERTH_K8S_NAMESPACE`); the context's own, else
    /// `default`, when unset.
    pub namespace: Option<String>,
    /// The image a sandbox runs when it names none (`BERTH_K8S_IMAGE`);
    /// `berth-sandbox:latest` when unset, which a cluster must be able to
    /// pull (build it from `images/Dockerfile` and push it to a registry).
    pub image: Option<String>,
}

impl K8sSettings {
    /// Settings from this process's environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let kubeconfig = var("KUBECONFIG")
            .and_then(|v| std::env::split_paths(&v).next())
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".kube/config")))
            .filter(|p| p.exists());
        Self {
            kubeconfig,
            context: var("BERTH_K8S_CONTEXT"),
            namespace: var("BERTH_K8S_NAMESPACE"),
            image: var("BERTH_K8S_IMAGE"),
        }
    }
}

/// Settings for the modal backend, read once from the environment by
/// [`ModalSettings::from_env`] so the backend never consults it. What is unset
/// here comes from `~/.modal.toml`, as the Modal CLI does it.
#[derive(Clone, Default)]
pub struct ModalSettings {
    /// The control plane's URL (`MODAL_SERVER_URL`); `https://api.modal.com:443` when unset.
    pub server_url: Option<String>,
    /// `MODAL_TOKEN_ID`.
    pub token_id: Option<String>,
    /// `MODAL_TOKEN_SECRET`.
    pub token_secret: Option<String>,
    /// The profile of the config file to use (`MODAL_PROFILE`).
    pub profile: Option<String>,
    /// The config file (`MODAL_CONFIG_PATH`); `~/.modal.toml` when unset.
    pub config_path: Option<PathBuf>,
    /// The home directory holding `.modal.toml`.
    pub home: Option<PathBuf>,
    /// The Modal environment (`MODAL_ENVIRONMENT`).
    pub environment: Option<String>,
    /// The Modal app berth's sandboxes belong to (`BERTH_MODAL_APP`, default `berth`).
    pub app: Option<String>,
    /// The image builder version (`MODAL_IMAGE_BUILDER_VERSION`); the
    /// environment's own when unset.
    pub image_builder_version: Option<String>,
}

impl ModalSettings {
    /// Settings from this process's environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            server_url: var("MODAL_SERVER_URL"),
            token_id: var("MODAL_TOKEN_ID"),
            token_secret: var("MODAL_TOKEN_SECRET"),
            profile: var("MODAL_PROFILE"),
            config_path: var("MODAL_CONFIG_PATH").map(PathBuf::from),
            home: var("HOME").map(PathBuf::from),
            environment: var("MODAL_ENVIRONMENT"),
            app: var("BERTH_MODAL_APP"),
            image_builder_version: var("MODAL_IMAGE_BUILDER_VERSION"),
        }
    }
}

impl std::fmt::Debug for ModalSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModalSettings")
            .field("server_url", &self.server_url)
            .field("token_id", &self.token_id)
            .field(
                "token_secret",
                &self.token_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("profile", &self.profile)
            .field("config_path", &self.config_path)
            .field("home", &self.home)
            .field("environment", &self.environment)
            .field("app", &self.app)
            .field("image_builder_version", &self.image_builder_version)
            .finish()
    }
}

/// Settings for the ssh backend. Everything that comes from berth's environment
/// (`HOME`, `SSH_AUTH_SOCK`, `BERTH_SSH_PASSPHRASE`) is read once, by
/// [`SshOptions::from_env`], so the backend itself never consults the environment.
#[derive(Clone, Default)]
pub struct SshOptions {
    /// The host (an `~/.ssh/config` alias or `[user@]host[:port]`) a new
    /// sandbox is made on (and keeps), and where `list` looks.
    pub host: Option<String>,
    /// `host` is only a default (`BERTH_SSH_HOST`), not this call's own
    /// `--host`: a sandbox made elsewhere stays there without an error.
    pub host_is_default: bool,
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
    /// Jump hosts (`-J a,b`): each `[user@]host[:port]` or a config alias,
    /// outermost first. Overrides the config's `ProxyJump`; `none` disables it.
    pub proxy_jump: Option<String>,
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
            .field("host_is_default", &self.host_is_default)
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
            .field("proxy_jump", &self.proxy_jump)
            .finish()
    }
}

/// The backends compiled into this build.
pub fn available() -> Vec<BackendKind> {
    BackendKind::ALL
        .into_iter()
        .filter(|k| match k {
            BackendKind::Local => cfg!(feature = "local"),
            BackendKind::Ssh => cfg!(feature = "ssh"),
            BackendKind::Docker => cfg!(feature = "docker"),
            BackendKind::E2b => cfg!(feature = "e2b"),
            BackendKind::Modal => cfg!(feature = "modal"),
            BackendKind::K8s => cfg!(feature = "k8s"),
        })
        .collect()
}

fn names(kinds: &[BackendKind]) -> String {
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Open the backend called `kind`.
pub async fn open(kind: BackendKind, ctx: &BackendContext) -> Result<Arc<dyn Backend>> {
    if !available().contains(&kind) {
        return Err(Error::InvalidInput(format!(
            "backend `{kind}` is not in this build; it has: {}",
            names(&available())
        )));
    }
    match kind {
        #[cfg(feature = "local")]
        BackendKind::Local => {
            let mut b = local::LocalBackend::new(&ctx.state_dir);
            if let Some(w) = &ctx.local_wrapper {
                b = b.with_wrapper(w.clone());
            }
            Ok(Arc::new(b))
        }
        #[cfg(feature = "ssh")]
        BackendKind::Ssh => Ok(Arc::new(ssh::SshBackend::new(ctx.ssh.clone()))),
        #[cfg(feature = "docker")]
        BackendKind::Docker => {
            let mut b = docker::DockerBackend::connect()
                .await?
                .with_installation(&installation_id(&ctx.state_dir)?);
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
        #[cfg(feature = "e2b")]
        BackendKind::E2b => Ok(Arc::new(e2b::E2bBackend::from_env()?)),
        #[cfg(feature = "modal")]
        BackendKind::Modal => Ok(Arc::new(modal::ModalBackend::new(ctx.modal.clone()))),
        #[cfg(feature = "k8s")]
        BackendKind::K8s => Ok(Arc::new(k8s::K8sBackend::new(
            ctx.k8s.clone(),
            &installation_id(&ctx.state_dir)?,
        ))),
        #[allow(unreachable_patterns)]
        other => Err(Error::InvalidInput(format!(
            "backend `{other}` is not in this build; it has: {}",
            names(&available())
        ))),
    }
}
