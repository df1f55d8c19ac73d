//! The docker backend: one long-lived, hardened container per sandbox, driven
//! through the Docker Engine API with bollard (never the `docker` CLI).
//!
//! Flow at a glance:
//! - [`DockerBackend::connect`] reaches the daemon the way the Docker client
//!   does (`DOCKER_HOST`, else the local socket) and negotiates the API version.
//! - `provision` ([`lifecycle`]) builds the sandbox image if it is missing
//!   ([`image`]), then re-attaches to, starts, or (re)creates the container
//!   `berth-<installation>-<name>` with the hardened config from [`config`] and
//!   two named volumes: the workspace and berth's private state (session
//!   snapshots), so both survive a container's recreation.
//! - Everything carries the installation id ([`Names`]): one berth state dir
//!   never attaches to another's containers or volumes on a shared daemon.
//! - [`DockerSandbox::spawn`] is one attached exec ([`process`]): stdin in,
//!   stdout and stderr demultiplexed out. The session engine runs one bash over
//!   one such exec for the sandbox's whole life.
//! - Files move through the archive API as tar ([`files`]).
//! - [`gc`] removes berth's exited containers; [`bench`] measures the
//!   persistent session against a fresh exec per command.

pub mod bench;
pub mod config;
pub mod files;
pub mod image;
pub mod inspect;
pub mod lifecycle;
pub mod process;
pub mod seccomp;

use std::collections::BTreeMap;

use async_trait::async_trait;
use berth_core::backend::{Layout, Process, Sandbox, SpawnOpts};
use berth_core::error::{BackendFailure, Error, Result};
use bollard::Docker;

pub use image::{BuildProgress, ImageRecipe, ProgressFn};
pub use lifecycle::GcReport;

/// The backend's short name.
pub const KIND: &str = "docker";
/// The label every berth container and volume carries.
pub const LABEL_MANAGED: &str = "berth.managed";
/// The label naming the sandbox a container or volume belongs to.
pub const LABEL_SANDBOX: &str = "berth.sandbox";
/// The label naming the berth installation (state dir) that owns a container or volume.
pub const LABEL_INSTALLATION: &str = "berth.installation";
/// Where the workspace volume is mounted: the session's first cwd.
pub const WORKDIR: &str = "/workspace";
/// Where berth's private state volume (snapshots, stdin files) is mounted.
pub const BERTH_DIR: &str = "/var/lib/berth";
/// The PATH every process in the sandbox starts with.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The docker backend.
pub struct DockerBackend {
    pub(crate) docker: Docker,
    /// The daemon address as the user gave it, for error messages.
    pub(crate) host: String,
    pub(crate) recipe: ImageRecipe,
    pub(crate) progress: Option<ProgressFn>,
    /// Serialises image builds within this process; [`image`] also takes a
    /// file lock so parallel processes do not build twice.
    pub(crate) build_lock: tokio::sync::Mutex<()>,
    /// Names and labels of this installation's containers and volumes.
    pub(crate) names: Names,
}

/// The daemon address the Docker client would use: `DOCKER_HOST`, else the
/// local socket.
pub fn default_host() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string())
}

impl DockerBackend {
    /// Connect the way the Docker client does: `DOCKER_HOST`, else
    /// `unix:///var/run/docker.sock`.
    pub async fn connect() -> Result<Self> {
        Self::connect_to(&default_host()).await
    }

    /// Connect to the daemon at `host` (`unix://…`, `tcp://…`, `http://…`) and
    /// check that it answers.
    pub async fn connect_to(host: &str) -> Result<Self> {
        let docker = Docker::connect_with_host(host).map_err(|e| unreachable(host, e))?;
        // Our engines may be older than bollard's default API version; speak
        // theirs. This is also the first round trip, so it proves the daemon is up.
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| unreachable(host, e))?;
        Ok(Self {
            docker,
            host: host.to_string(),
            recipe: ImageRecipe::builtin(),
            progress: None,
            build_lock: tokio::sync::Mutex::new(()),
            names: Names::new(&crate::new_installation_id()),
        })
    }

    /// Act as the installation `id` (see [`crate::installation_id`]): find and
    /// create only its containers and volumes. Without this, a backend has a
    /// fresh id of its own and finds nothing made by another.
    pub fn with_installation(mut self, id: &str) -> Self {
        self.names = Names::new(id);
        self
    }

    /// How this installation names its containers and volumes.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Report image-build progress (stages, downloads, import) to `f`.
    pub fn with_progress(mut self, f: ProgressFn) -> Self {
        self.progress = Some(f);
        self
    }

    /// Use another image recipe (a different repository name or cache dir).
    pub fn with_recipe(mut self, recipe: ImageRecipe) -> Self {
        self.recipe = recipe;
        self
    }

    /// The bollard client, for callers that need the raw API (bench, tests).
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// The image recipe in use.
    pub fn recipe(&self) -> &ImageRecipe {
        &self.recipe
    }

    /// Build the default sandbox image unless an image for the current recipe
    /// already exists. Returns the image reference.
    pub async fn ensure_image(&self) -> Result<String> {
        let _guard = self.build_lock.lock().await;
        image::ensure(&self.docker, &self.recipe, self.progress.as_ref()).await
    }
}

/// How one installation names its containers and volumes: every name carries
/// the installation id, so two state dirs (or two users) on one daemon can both
/// have a sandbox `web` without meeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    installation: String,
}

impl Names {
    /// The names of installation `id`.
    pub fn new(id: &str) -> Self {
        Self {
            installation: id.to_string(),
        }
    }

    /// The installation id.
    pub fn installation(&self) -> &str {
        &self.installation
    }

    /// The container's name for a sandbox.
    pub fn container(&self, sandbox: &str) -> String {
        format!("berth-{}-{sandbox}", self.installation)
    }

    /// The workspace volume's name for a sandbox.
    pub fn workspace_volume(&self, sandbox: &str) -> String {
        format!("berth-{}-{sandbox}-workspace", self.installation)
    }

    /// berth's private state volume's name for a sandbox.
    pub fn state_volume(&self, sandbox: &str) -> String {
        format!("berth-{}-{sandbox}-state", self.installation)
    }

    /// The labels every container and volume of sandbox `sandbox` carries.
    pub fn labels(&self, sandbox: &str) -> std::collections::HashMap<String, String> {
        std::collections::HashMap::from([
            (LABEL_MANAGED.to_string(), "1".to_string()),
            (LABEL_INSTALLATION.to_string(), self.installation.clone()),
            (LABEL_SANDBOX.to_string(), sandbox.to_string()),
        ])
    }

    /// The label filter that selects this installation's objects.
    pub fn filter(&self) -> String {
        format!("{LABEL_INSTALLATION}={}", self.installation)
    }
}

/// The HTTP status of a daemon error, if it was one.
pub(crate) fn status_of(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// True when the error means the daemon could not be reached at all: no
/// answer came, as opposed to an answer with an error status.
pub(crate) fn is_connection_error(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as B;
    matches!(
        e,
        B::SocketNotFoundError(_)
            | B::HyperResponseError { .. }
            | B::HyperLegacyError { .. }
            | B::IOError { .. }
            | B::HttpClientError { .. }
            | B::RequestTimeoutError
    )
}

/// How a daemon call failed, from bollard's error variant and the HTTP
/// status the daemon answered with.
pub(crate) fn failure_of(e: &bollard::errors::Error) -> BackendFailure {
    use bollard::errors::Error as B;
    match e {
        B::DockerResponseServerError { status_code, .. } => {
            BackendFailure::from_http_status(*status_code)
        }
        B::RequestTimeoutError => BackendFailure::Timeout,
        // The socket's own I/O error says whether it was refused, timed out
        // or forbidden (a user outside the `docker` group).
        B::IOError { err } => connect_failure(err),
        B::SocketNotFoundError(_) | B::HyperResponseError { .. } | B::HttpClientError { .. } => {
            BackendFailure::Transport
        }
        B::HyperLegacyError { err } => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
            while let Some(c) = cause {
                if let Some(io) = c.downcast_ref::<std::io::Error>() {
                    return connect_failure(io);
                }
                cause = c.source();
            }
            BackendFailure::Transport
        }
        B::JsonDataError { .. }
        | B::JsonSerdeError { .. }
        | B::StrParseError { .. }
        | B::DockerStreamError { .. }
        | B::HttpHeaderNotFoundError(_)
        | B::HttpHeaderToStrError { .. }
        | B::Base64DecodeError { .. }
        | B::APIVersionParseError {} => BackendFailure::Protocol,
        B::DockerContainerWaitError { .. } => BackendFailure::Rejected,
        // Building the request failed on berth's side (a URI, an encoding).
        _ => BackendFailure::Local,
    }
}

/// The class of an I/O error on the way to the daemon.
fn connect_failure(e: &std::io::Error) -> BackendFailure {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => BackendFailure::Auth,
        std::io::ErrorKind::TimedOut => BackendFailure::Timeout,
        _ => BackendFailure::Transport,
    }
}

/// The daemon cannot be reached: say where berth looked and how to fix it.
/// The daemon's error is kept as the source.
pub(crate) fn unreachable(host: &str, e: bollard::errors::Error) -> Error {
    let source = match std::env::var("DOCKER_HOST") {
        Ok(h) if h == host => "from DOCKER_HOST".to_string(),
        Ok(h) if !h.is_empty() => format!("given explicitly; DOCKER_HOST is {h}"),
        _ => "DOCKER_HOST is unset, so the default socket".to_string(),
    };
    let kind = failure_of(&e);
    let hint = if kind == BackendFailure::Auth {
        "add your user to the `docker` group (then log in again), or set DOCKER_HOST to a daemon you may use"
    } else {
        "start the daemon (e.g. `systemctl start docker`), or set DOCKER_HOST to where it listens (unix:///path/docker.sock or tcp://host:2375)"
    };
    Error::unreachable(
        KIND,
        kind,
        format!("cannot reach the Docker daemon at {host} ({source})"),
        hint,
    )
    .caused_by(e)
}

/// True when a 409 from the daemon says the container is not running (as
/// opposed to another conflict: paused, being removed). Read from the
/// message: the daemon's error body carries no code besides the HTTP status,
/// and 409 covers every conflict.
fn says_not_running(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { message, .. } if message.contains("is not running"))
}

/// True when a 404 from the daemon is about the container, not a path in
/// it. Read from the message: for the archive endpoints a missing container
/// and a missing path are both 404 and the body has only its text; telling
/// them apart by type would take a second call (inspect) that races the first.
pub(crate) fn says_no_container(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { message, .. } if message.contains("No such container"))
}

/// Map a daemon error about sandbox `name` to berth's error.
pub(crate) fn api_error(host: &str, name: &str, doing: &str, e: bollard::errors::Error) -> Error {
    if is_connection_error(&e) {
        return unreachable(host, e);
    }
    match status_of(&e) {
        Some(404) => gone(name, &format!("its container is gone ({doing})")),
        Some(409) if says_not_running(&e) => {
            gone(name, &format!("its container is not running ({doing})"))
        }
        _ => Error::backend_call(
            KIND,
            failure_of(&e),
            format!("sandbox `{name}`: {doing} failed"),
            e,
        ),
    }
}

/// The sandbox's container is gone or stopped.
pub(crate) fn gone(name: &str, reason: &str) -> Error {
    Error::sandbox_gone(
        KIND,
        name,
        reason,
        format!(
            "run the command again to restart or recreate it (the workspace and session snapshot live on volumes), or `berth sandbox rm {name}`"
        ),
    )
}

/// A live docker sandbox: a handle on the container `berth-<name>`. It names the
/// container rather than holding its id, so it keeps working after the
/// container is restarted or recreated by a later `provision`.
pub struct DockerSandbox {
    pub(crate) docker: Docker,
    pub(crate) host: String,
    pub(crate) name: String,
    pub(crate) container: String,
    pub(crate) layout: Layout,
    /// The sandbox's environment (already filtered by policy), given to every
    /// exec through the API.
    pub(crate) env: BTreeMap<String, String>,
    /// The user processes run as, and the owner of written files.
    pub(crate) user: config::SandboxUser,
    pub(crate) names: Names,
}

impl DockerSandbox {
    pub(crate) fn new(
        backend: &DockerBackend,
        name: &str,
        env: BTreeMap<String, String>,
        user: config::SandboxUser,
    ) -> Self {
        Self {
            docker: backend.docker.clone(),
            host: backend.host.clone(),
            name: name.to_string(),
            container: backend.names.container(name),
            layout: Layout {
                workdir: WORKDIR.to_string(),
                berth_dir: BERTH_DIR.to_string(),
            },
            env,
            user,
            names: backend.names.clone(),
        }
    }

    /// The container's name.
    pub fn container(&self) -> &str {
        &self.container
    }

    pub(crate) fn err(&self, doing: &str, e: bollard::errors::Error) -> Error {
        api_error(&self.host, &self.name, doing, e)
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Docker
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        process::spawn(self, argv, opts).await
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        files::read_file(self, path, limit).await
    }

    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        files::write_file(self, path, data, mode).await
    }

    async fn alive(&self) -> Result<bool> {
        match self.docker.inspect_container(&self.container, None).await {
            // A paused container cannot run anything: not alive.
            Ok(c) => Ok(c
                .state
                .is_some_and(|s| s.running == Some(true) && s.paused != Some(true))),
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(self.err("inspecting the container", e)),
        }
    }

    /// Remove the container and its volumes, like the local backend removes its
    /// directory. `Backend::remove` without volumes keeps the workspace instead.
    async fn destroy(&self) -> Result<()> {
        lifecycle::remove_sandbox(&self.docker, &self.host, &self.names, &self.name, true).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bollard::errors::Error as B;

    use super::*;

    fn answer(status_code: u16, message: &str) -> B {
        B::DockerResponseServerError {
            status_code,
            message: message.into(),
        }
    }

    fn io(kind: std::io::ErrorKind) -> B {
        B::IOError {
            err: std::io::Error::from(kind),
        }
    }

    #[test]
    fn daemon_answers_map_by_status() {
        let e = api_error(
            "unix:///d",
            "s",
            "exec",
            answer(404, "No such container: x"),
        );
        assert!(e.is_sandbox_gone(), "{e}");
        let e = api_error(
            "unix:///d",
            "s",
            "exec",
            answer(409, "Container x is not running"),
        );
        assert!(e.is_sandbox_gone(), "{e}");
        // Another conflict is the daemon refusing, not a vanished sandbox.
        let e = api_error(
            "unix:///d",
            "s",
            "exec",
            answer(409, "Container x is paused"),
        );
        assert!(!e.is_sandbox_gone(), "{e}");
        assert_eq!(e.backend_kind(), Some(BackendFailure::Rejected));
        let e = api_error("unix:///d", "s", "exec", answer(500, "oci runtime error"));
        assert_eq!(e.backend_kind(), Some(BackendFailure::Rejected));
        assert!(
            std::error::Error::source(&e).is_some(),
            "the daemon's error is kept"
        );
        let e = api_error("unix:///d", "s", "exec", answer(401, "unauthorized"));
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
    }

    #[test]
    fn no_answer_is_unreachable_and_classified() {
        let e = api_error(
            "unix:///d",
            "s",
            "exec",
            io(std::io::ErrorKind::ConnectionRefused),
        );
        assert!(matches!(e, Error::Unreachable { .. }), "{e}");
        assert_eq!(e.backend_kind(), Some(BackendFailure::Transport));
        assert!(
            std::error::Error::source(&e).is_some(),
            "the socket's error is kept"
        );
        // A socket the user may not open is a permission, not a dead daemon.
        let e = api_error(
            "unix:///d",
            "s",
            "exec",
            io(std::io::ErrorKind::PermissionDenied),
        );
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
        assert!(e.to_string().contains("docker` group"), "{e}");
        let e = api_error("unix:///d", "s", "exec", B::RequestTimeoutError);
        assert!(matches!(e, Error::Unreachable { .. }), "{e}");
        assert_eq!(e.backend_kind(), Some(BackendFailure::Timeout));
        let e = api_error(
            "unix:///d",
            "s",
            "exec",
            B::SocketNotFoundError("/d".into()),
        );
        assert_eq!(e.backend_kind(), Some(BackendFailure::Transport));
    }

    #[test]
    fn unreadable_answers_are_protocol_errors() {
        let bad = serde_json::from_str::<u32>("x").map(|_| ());
        let Err(err) = bad else {
            panic!("`x` parsed as a number");
        };
        assert_eq!(
            failure_of(&B::JsonSerdeError { err }),
            BackendFailure::Protocol
        );
    }
}
