//! Test fixtures: a harness per backend that hands out fresh sandboxes.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use berth_core::backend::{Backend, RemoveOpts, Sandbox, SandboxSpec};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A backend plus whatever keeps it alive (a temp dir, a server).
pub struct Harness {
    pub backend: Arc<dyn Backend>,
    /// Dropped last: temp dirs, servers.
    pub _keep: Vec<Box<dyn Any + Send + Sync>>,
    /// The spec every sandbox starts from (a name is filled in per test).
    pub base: SandboxSpec,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Harness {
    /// A new sandbox with a unique name.
    pub async fn sandbox(&self, test: &str) -> Result<Fixture, BoxError> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("t-{}-{}-{n}", std::process::id(), test.replace('_', "-"));
        let mut spec = self.base.clone();
        spec.name = name.clone();
        let sandbox = self.backend.provision(&spec).await?.sandbox;
        Ok(Fixture {
            sandbox,
            spec,
            backend: self.backend.clone(),
        })
    }
}

/// A sandbox made for one test. Call `remove` at the end.
pub struct Fixture {
    pub sandbox: Arc<dyn Sandbox>,
    pub spec: SandboxSpec,
    pub backend: Arc<dyn Backend>,
}

impl Fixture {
    pub async fn remove(self) -> TestResult {
        self.backend
            .remove(&self.spec.name, RemoveOpts { volumes: true })
            .await?;
        Ok(())
    }
}

/// The local backend in a temp state dir.
pub async fn local_harness() -> Result<Harness, BoxError> {
    let dir = tempfile::tempdir()?;
    let backend = berth_backends::local::LocalBackend::new(dir.path());
    Ok(Harness {
        backend: Arc::new(backend),
        _keep: vec![Box::new(dir)],
        base: SandboxSpec::default(),
    })
}

/// The ssh backend against a real OpenSSH server on a loopback port, started
/// for the test and stopped when the harness is dropped. Fails with the CI
/// install step when /usr/sbin/sshd is missing.
pub async fn ssh_harness() -> Result<Harness, BoxError> {
    let sshd = berth_backends::ssh::testing::Sshd::start()?;
    let backend = berth_backends::ssh::SshBackend::new(sshd.options());
    Ok(Harness {
        backend: Arc::new(backend),
        _keep: vec![Box::new(sshd)],
        base: SandboxSpec::default(),
    })
}

/// The docker backend on the real engine (`DOCKER_HOST` or the local socket),
/// with the sandbox image built on first use.
pub async fn docker_harness() -> Result<Harness, BoxError> {
    let backend = berth_backends::docker::DockerBackend::connect().await?;
    backend.ensure_image().await?;
    Ok(Harness {
        backend: Arc::new(backend),
        _keep: vec![],
        base: SandboxSpec::default(),
    })
}
