//! Shared helpers for the docker tests: a backend on the real engine, with the
//! sandbox image built on first use, and sandboxes that clean up after themselves.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_backends::docker::{BuildProgress, DockerBackend};
use berth_core::backend::{Backend, RemoveOpts, Sandbox, SandboxSpec};

pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Progress of an image build, shown on the test's stderr.
pub fn print_progress(p: BuildProgress) {
    eprintln!("[image] {p}");
}

/// The backend, from DOCKER_HOST or the local socket, with the image in place.
pub async fn backend() -> TestResult<DockerBackend> {
    let b = DockerBackend::connect()
        .await?
        .with_progress(Arc::new(print_progress));
    b.ensure_image().await?;
    Ok(b)
}

/// A sandbox name unique to this test run.
pub fn unique(prefix: &str) -> String {
    let n: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("t-{prefix}-{}-{:x}", std::process::id(), n & 0xffffff)
}

/// Removes the sandbox (container and volumes) when dropped, even if the test failed.
pub struct Cleanup {
    pub name: String,
    /// The installation the sandbox belongs to (see `DockerBackend::names`).
    pub installation: String,
}

impl Cleanup {
    /// A guard for sandbox `name` of `b`'s installation.
    pub fn of(b: &DockerBackend, name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            installation: b.names().installation().to_string(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let name = self.name.clone();
        let installation = self.installation.clone();
        // A fresh runtime on its own thread: the test's runtime may be gone.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    if let Ok(b) = DockerBackend::connect().await {
                        let b = b.with_installation(&installation);
                        let _ = b.remove(&name, RemoveOpts { volumes: true }).await;
                    }
                });
            }
        })
        .join();
    }
}

/// Provision a fresh sandbox with a unique name; it is removed when the guard drops.
pub async fn sandbox(b: &DockerBackend, prefix: &str) -> TestResult<(Arc<dyn Sandbox>, Cleanup)> {
    let name = unique(prefix);
    let guard = Cleanup::of(b, name.clone());
    let p = b.provision(&SandboxSpec::named(&name)).await?;
    assert!(p.created, "a fresh name must be created");
    Ok((p.sandbox, guard))
}

/// Wait for `cond` to hold, polling, up to `deadline`.
pub async fn wait_for<F, Fut>(deadline: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
