//! The modal backend: one Modal Sandbox per berth sandbox, driven over Modal's
//! gRPC API with tonic.
//!
//! Flow at a glance:
//! - [`ModalBackend::new`] resolves the credentials ([`auth`]) and opens a
//!   lazily connected channel to the control plane ([`client`]).
//! - `provision` ([`lifecycle`]) re-attaches to the running sandbox that
//!   carries the name (`SandboxGetFromName`), or creates one: the app
//!   (`AppGetOrCreate`), the image (`ImageGetOrCreate`, joining the build
//!   stream), then `SandboxCreate` with berth's tags, then `SandboxGetTaskId`.
//! - [`ModalSandbox::spawn`] is one exec through the task command router
//!   ([`router`], [`process`]). The session engine runs one bash over one such
//!   exec for the sandbox's whole life.
//! - Files move through short execs (`head -c`, `cat >`), `crate::exec_files`.
//! - `list` finds berth's sandboxes by their `berth.managed` tag, `remove`
//!   terminates one.

pub mod auth;
pub mod client;
mod lifecycle;
mod process;
pub mod proto;
pub mod router;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::backend::{BackendKind, Layout, Process, Sandbox, SpawnOpts};
use berth_core::error::{Error, Result};
use tonic::{Code, Status};

use self::client::{ControlPlane, status_error};
use self::proto::client::generic_result::GenericStatus;
use self::proto::client::{GenericResult, SandboxWaitRequest};
use self::router::Router;

/// The backend's short name.
pub const KIND: &str = BackendKind::Modal.as_str();
/// The tag every berth sandbox carries.
pub const TAG_MANAGED: &str = "berth.managed";
/// The tag naming the berth sandbox a Modal sandbox is.
pub const TAG_SANDBOX: &str = "berth.sandbox";
/// The image a sandbox runs when the spec names none. It needs bash, and
/// util-linux's `setsid`, which every Debian image has.
pub const DEFAULT_IMAGE: &str = "debian:bookworm-slim";
/// A sandbox's lifetime when the spec says nothing: Modal's maximum, 24 h.
pub const DEFAULT_TIMEOUT_SECS: u32 = 24 * 60 * 60;

pub use lifecycle::ModalBackend;

/// What every exec of a sandbox needs: the router and who to ask when it fails.
pub(crate) struct SandboxInner {
    pub(crate) name: String,
    pub(crate) sandbox_id: String,
    pub(crate) router: Router,
}

/// A shared handle on [`SandboxInner`].
pub(crate) type SandboxHandle = Arc<SandboxInner>;

impl SandboxInner {
    fn control(&self) -> &Arc<ControlPlane> {
        self.router.control()
    }

    /// The sandbox's result, if it has ended.
    pub(crate) async fn result(&self) -> Result<Option<GenericResult>> {
        let r = self
            .control()
            .unary(
                "SandboxWait",
                SandboxWaitRequest {
                    sandbox_id: self.sandbox_id.clone(),
                    timeout: 0.0,
                },
                |mut c, r| async move { c.sandbox_wait(r).await },
            )
            .await;
        match r {
            Ok(w) => Ok(w.result.filter(|r| r.status != 0)),
            Err(s) if s.code() == Code::NotFound => Ok(Some(GenericResult {
                status: GenericStatus::Terminated as i32,
                exception: format!("Modal no longer knows sandbox {}", self.sandbox_id),
                ..GenericResult::default()
            })),
            Err(s) => Err(status_error(&self.control().cfg, "SandboxWait", s)),
        }
    }

    /// berth's error for the sandbox having ended, if it has.
    pub(crate) async fn ended_error(&self) -> Option<Error> {
        match self.result().await {
            Ok(Some(r)) => Some(ended(&self.name, &r)),
            _ => None,
        }
    }

    /// berth's error for a failed exec call: the sandbox's end when it has
    /// ended, else the call's own failure.
    pub(crate) async fn exec_error(&self, doing: &str, s: Status) -> Error {
        if let Some(e) = self.ended_error().await {
            return e;
        }
        match s.code() {
            Code::Unauthenticated | Code::PermissionDenied | Code::Unavailable => {
                status_error(&self.control().cfg, doing, s)
            }
            Code::NotFound => gone(
                &self.name,
                &format!(
                    "its task no longer knows the process ({doing}: {})",
                    s.message()
                ),
            ),
            _ => process::unknown_status(&self.name, doing, &s),
        }
    }
}

/// The exit code berth reports for a sandbox that ended this way: the shell's
/// convention for a timeout (124) and a kill (137), else its own exit code.
pub fn result_code(r: &GenericResult) -> i32 {
    match GenericStatus::try_from(r.status) {
        Ok(GenericStatus::Timeout | GenericStatus::IdleTimeout) => 124,
        Ok(GenericStatus::Terminated) => 137,
        _ => r.exitcode,
    }
}

/// A short name for a result's status.
pub fn status_name(status: i32) -> &'static str {
    match GenericStatus::try_from(status) {
        Ok(GenericStatus::Success) => "SUCCESS",
        Ok(GenericStatus::Failure) => "FAILURE",
        Ok(GenericStatus::Terminated) => "TERMINATED",
        Ok(GenericStatus::Timeout) => "TIMEOUT",
        Ok(GenericStatus::InitFailure) => "INIT_FAILURE",
        Ok(GenericStatus::InternalFailure) => "INTERNAL_FAILURE",
        Ok(GenericStatus::IdleTimeout) => "IDLE_TIMEOUT",
        _ => "UNSPECIFIED",
    }
}

/// The sandbox ended: say how, with the exit code the shell would give.
pub(crate) fn ended(name: &str, r: &GenericResult) -> Error {
    let how = match GenericStatus::try_from(r.status) {
        Ok(GenericStatus::Timeout) => "reached its timeout",
        Ok(GenericStatus::IdleTimeout) => "was stopped after its idle timeout",
        Ok(GenericStatus::Terminated) => "was terminated",
        Ok(GenericStatus::Success) => "ended (its entrypoint exited)",
        Ok(GenericStatus::InitFailure) => "failed to start",
        _ => "ended",
    };
    let exception = if r.exception.is_empty() {
        String::new()
    } else {
        format!(": {}", r.exception)
    };
    gone(
        name,
        &format!(
            "the Modal sandbox {how} ({}, exit code {}){exception}",
            status_name(r.status),
            result_code(r)
        ),
    )
}

/// The sandbox is gone: the next provision creates a new one under the name.
pub(crate) fn gone(name: &str, reason: &str) -> Error {
    Error::sandbox_gone(
        KIND,
        name,
        reason,
        format!(
            "run the command again to create a fresh Modal sandbox named `{name}` (files of the old one are gone), or `berth sandbox rm {name}`"
        ),
    )
}

/// A live Modal sandbox.
pub struct ModalSandbox {
    pub(crate) inner: SandboxHandle,
    pub(crate) name: String,
    pub(crate) layout: Layout,
    /// The sandbox's environment (already filtered by policy), given to every exec.
    pub(crate) env: BTreeMap<String, String>,
}

impl ModalSandbox {
    pub(crate) fn new(inner: SandboxHandle, layout: Layout, env: BTreeMap<String, String>) -> Self {
        Self {
            name: inner.name.clone(),
            inner,
            layout,
            env,
        }
    }

    /// Modal's id of the sandbox (`sb-…`).
    pub fn sandbox_id(&self) -> &str {
        &self.inner.sandbox_id
    }

    /// The id of the task running it (`ta-…`).
    pub fn task_id(&self) -> &str {
        &self.inner.router.task_id
    }

    pub(crate) fn handle(&self) -> SandboxHandle {
        self.inner.clone()
    }

    pub(crate) async fn exec_error(&self, doing: &str, s: Status) -> Error {
        self.inner.exec_error(doing, s).await
    }
}

#[async_trait]
impl Sandbox for ModalSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Modal
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        process::spawn(self, argv, opts).await
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        crate::exec_files::read_file(self, KIND, path, limit).await
    }

    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        crate::exec_files::write_file(self, KIND, path, data, mode).await
    }

    async fn alive(&self) -> Result<bool> {
        Ok(self.inner.result().await?.is_none())
    }

    async fn destroy(&self) -> Result<()> {
        lifecycle::terminate(self.inner.control(), &self.inner.sandbox_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_kills_get_the_shell_codes() {
        let r = |status: GenericStatus, exitcode| GenericResult {
            status: status as i32,
            exitcode,
            ..GenericResult::default()
        };
        assert_eq!(result_code(&r(GenericStatus::Timeout, 0)), 124);
        assert_eq!(result_code(&r(GenericStatus::Terminated, 0)), 137);
        assert_eq!(result_code(&r(GenericStatus::Failure, 3)), 3);
        let e = ended("x", &r(GenericStatus::Timeout, 0)).to_string();
        assert!(e.contains("TIMEOUT") && e.contains("124"), "{e}");
    }
}
