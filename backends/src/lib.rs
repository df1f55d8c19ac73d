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
}

impl std::fmt::Debug for BackendContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendContext")
            .field("state_dir", &self.state_dir)
            .field("local_wrapper", &self.local_wrapper)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// The backends compiled into this build.
pub fn available() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "local") {
        v.push("local");
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
