//! Test fixtures: a harness per backend that hands out fresh sandboxes.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use berth_core::backend::{Backend, RemoveOpts, Sandbox, SandboxSpec};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(feature = "ssh")]
pub mod box1;

/// A finished `berth` call, for an assertion's message.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A backend plus whatever keeps it alive (a temp dir, a server).
pub struct Harness {
    pub backend: Arc<dyn Backend>,
    /// Dropped last: temp dirs, servers.
    pub _keep: Vec<Box<dyn Any + Send + Sync>>,
    /// The spec every sandbox starts from (a name is filled in per test).
    pub base: SandboxSpec,
    /// How the `berth` binary reaches the same sandboxes, where it can.
    pub cli: Option<Cli>,
}

/// The `berth` binary set up to see a harness's sandboxes: its state dir (the
/// backend's root and installation) and its backend flag.
pub struct Cli {
    pub state_dir: std::path::PathBuf,
    pub backend: &'static str,
}

impl Cli {
    /// Run `berth ARGS` against the harness's state dir, unrestricted like the
    /// harness's own backend, with no user policy.
    pub fn run(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .env("BERTH_STATE_DIR", &self.state_dir)
            .env("BERTH_POLICY", self.state_dir.join("no-policy.toml"))
            .env("BERTH_UNRESTRICTED", "1")
            .stdin(std::process::Stdio::null())
            .output()
    }
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
            removed: false,
        })
    }
}

/// A sandbox made for one test. Call `remove` at the end to see its errors;
/// if the test fails first, dropping it removes the sandbox (container and
/// volumes) anyway.
pub struct Fixture {
    pub sandbox: Arc<dyn Sandbox>,
    pub spec: SandboxSpec,
    pub backend: Arc<dyn Backend>,
    removed: bool,
}

impl Fixture {
    pub async fn remove(mut self) -> TestResult {
        self.removed = true;
        self.backend
            .remove(&self.spec.name, RemoveOpts { volumes: true })
            .await?;
        Ok(())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let backend = self.backend.clone();
        let name = self.spec.name.clone();
        // A runtime of its own on its own thread: the test's runtime may be
        // shutting down, or this may be a panic unwinding through it.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                let _ = rt.block_on(async {
                    tokio::time::timeout(
                        std::time::Duration::from_secs(60),
                        backend.remove(&name, RemoveOpts { volumes: true }),
                    )
                    .await
                });
            }
        })
        .join();
    }
}

/// A harness of `backend` reached through `standin`, which it keeps (and
/// stops, with its sandboxes, on drop); the CLI cannot reach it.
fn standin_harness(backend: impl Backend + 'static, standin: impl Any + Send + Sync) -> Harness {
    Harness {
        backend: Arc::new(backend),
        cli: None,
        _keep: vec![Box::new(standin)],
        base: SandboxSpec::default(),
    }
}

/// The local backend in a temp state dir.
pub async fn local_harness() -> Result<Harness, BoxError> {
    let dir = tempfile::tempdir()?;
    let backend = berth_backends::local::LocalBackend::new(dir.path());
    Ok(Harness {
        backend: Arc::new(backend),
        cli: Some(Cli {
            state_dir: dir.path().to_path_buf(),
            backend: "local",
        }),
        _keep: vec![Box::new(dir)],
        base: SandboxSpec::default(),
    })
}

#[cfg(feature = "ssh")]
/// The ssh backend against a real OpenSSH server on a loopback port, started
/// for the test and stopped when the harness is dropped. Fails with the CI
/// install step when /usr/sbin/sshd is missing.
pub async fn ssh_harness() -> Result<Harness, BoxError> {
    let sshd = berth_backends::ssh::testing::Sshd::start()?;
    let backend = berth_backends::ssh::SshBackend::new(sshd.options());
    Ok(Harness {
        backend: Arc::new(backend),
        // The CLI has no flag for the test server's private sandbox root.
        cli: None,
        _keep: vec![Box::new(sshd)],
        base: SandboxSpec::default(),
    })
}

#[cfg(feature = "docker")]
/// The docker backend on the real engine (`DOCKER_HOST` or the local socket),
/// with the sandbox image built on first use, as the installation of a fresh
/// state dir.
pub async fn docker_harness() -> Result<Harness, BoxError> {
    let dir = tempfile::tempdir()?;
    let installation = berth_backends::installation_id(dir.path())?;
    let backend = berth_backends::docker::DockerBackend::connect()
        .await?
        .with_installation(&installation);
    backend.ensure_image().await?;
    Ok(Harness {
        backend: Arc::new(backend),
        cli: Some(Cli {
            state_dir: dir.path().to_path_buf(),
            backend: "docker",
        }),
        _keep: vec![Box::new(dir)],
        base: SandboxSpec::default(),
    })
}

/// The e2b backend against the E2B stand-in, served in-process on a free
/// loopback port for this test and stopped (its sandboxes killed) on drop.
pub async fn e2b_harness() -> Result<Harness, BoxError> {
    let (standin, backend) = e2b_standin().await?;
    Ok(standin_harness(backend, standin))
}

/// The modal backend against the Modal stand-in (`berth-standins`), started on
/// a free loopback port for the test and stopped, with its sandboxes, when the
/// harness is dropped.
pub async fn modal_harness() -> Result<Harness, BoxError> {
    let standin = berth_standins::modal::ModalStandin::start(0).await?;
    let backend = berth_backends::modal::ModalBackend::new(modal_settings(&standin));
    Ok(standin_harness(backend, standin))
}

#[cfg(feature = "docker")]
/// The k8s backend against the k8s stand-in (pods run as containers of
/// berth's image on the real Docker engine), with agent-sandbox's CRDs
/// installed: each sandbox is a `Sandbox`. Stopped, with its pods, on drop.
pub async fn k8s_harness() -> Result<Harness, BoxError> {
    k8s_harness_with(true).await
}

#[cfg(feature = "docker")]
/// [`k8s_harness`] on a cluster without agent-sandbox: each sandbox is a
/// plain pod with claims berth makes itself.
pub async fn k8s_pods_harness() -> Result<Harness, BoxError> {
    k8s_harness_with(false).await
}

#[cfg(feature = "docker")]
async fn k8s_harness_with(agent_sandbox: bool) -> Result<Harness, BoxError> {
    let (standin, backend, _image) = k8s_standin(agent_sandbox).await?;
    Ok(standin_harness(backend, standin))
}

#[cfg(feature = "docker")]
/// A fresh k8s stand-in (three nodes) and a backend reaching it through its
/// kubeconfig, as a user's KUBECONFIG would, with berth's image as the
/// sandboxes' image (built from `images/` when missing). Also the image.
pub async fn k8s_standin(
    agent_sandbox: bool,
) -> Result<
    (
        berth_standins::k8s::K8sStandin,
        berth_backends::k8s::K8sBackend,
        String,
    ),
    BoxError,
> {
    let image = berth_backends::docker::DockerBackend::connect()
        .await?
        .ensure_image()
        .await?;
    let standin = berth_standins::k8s::K8sStandin::start_with(berth_standins::k8s::K8sOptions {
        agent_sandbox,
        ..Default::default()
    })
    .await?;
    let settings = berth_backends::K8sSettings {
        kubeconfig: Some(standin.kubeconfig()),
        image: Some(image.clone()),
        ..berth_backends::K8sSettings::default()
    };
    let backend =
        berth_backends::k8s::K8sBackend::new(settings, &berth_backends::new_installation_id());
    Ok((standin, backend, image))
}

/// A fresh E2B stand-in and a backend configured with its settings, exactly
/// as a user would set them (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`).
pub async fn e2b_standin() -> Result<
    (
        berth_standins::e2b::E2bStandin,
        berth_backends::e2b::E2bBackend,
    ),
    BoxError,
> {
    let standin = berth_standins::e2b::E2bStandin::start(0).await?;
    let vars = standin.env();
    let cfg = berth_backends::e2b::E2bConfig::from_lookup(|k| {
        vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    });
    let backend = berth_backends::e2b::E2bBackend::new(cfg)?;
    Ok((standin, backend))
}

/// Settings that point the modal backend at `standin` and nowhere else (no
/// `~/.modal.toml`).
pub fn modal_settings(
    standin: &berth_standins::modal::ModalStandin,
) -> berth_backends::ModalSettings {
    berth_backends::ModalSettings {
        server_url: Some(standin.url()),
        token_id: Some(standin.token_id().to_string()),
        token_secret: Some(standin.token_secret().to_string()),
        ..berth_backends::ModalSettings::default()
    }
}
