//! berth-backends: the sandbox transports behind berth-core's [`Backend`] trait.
//!
//! Each backend lives in its own module behind a cargo feature and does only what
//! the trait asks: provision, list, remove, spawn, move files.

use std::path::PathBuf;
use std::sync::Arc;

use berth_core::backend::Backend;
use berth_core::error::{Error, Result};

#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "local")]
pub mod local_cgroup;

/// What a backend needs to know to start.
#[derive(Clone, Debug, Default)]
pub struct BackendContext {
    /// berth's state directory.
    pub state_dir: PathBuf,
    /// The argv prefix that applies the local kernel restrictions, if any.
    pub local_wrapper: Option<Vec<String>>,
}

/// The backends compiled into this build.
pub fn available() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "local") {
        v.push("local");
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
        other => Err(Error::InvalidInput(format!(
            "unknown backend `{other}`; this build has: {}",
            available().join(", ")
        ))),
    }
}
