//! The round-trip benchmark behind `berth bench --backend docker`: one command
//! (`echo hi`) through the persistent session against a fresh exec per command,
//! created, started and awaited through the Engine API, measured in the same
//! run on the same container. [`fresh_exec_per_command`] is the floor the CLI's
//! bench measures the session against; [`run`] does both for callers without it.

use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use berth_core::backend::{Backend, SandboxSpec};
use berth_core::error::{BackendFailure, Error, Result};
#[cfg(feature = "testing")]
use berth_core::session::{ExecOpts, Session, SessionConfig};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;

use super::DockerBackend;

#[cfg(feature = "testing")]
/// What [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// Commands per method.
    pub commands: usize,
    /// Mean wall time of one command through the persistent session.
    pub session_per_command: Duration,
    /// Mean wall time of one fresh exec (create, start, read to end, inspect).
    pub fresh_exec_per_command: Duration,
}

#[cfg(feature = "testing")]
impl BenchReport {
    /// How many times faster the session is per command.
    pub fn speedup(&self) -> f64 {
        self.fresh_exec_per_command.as_secs_f64() / self.session_per_command.as_secs_f64().max(1e-9)
    }
}

#[cfg(feature = "testing")]
impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "docker, {} commands each: persistent session {:.3} ms/command, fresh exec {:.3} ms/command, session {:.1}x faster",
            self.commands,
            self.session_per_command.as_secs_f64() * 1e3,
            self.fresh_exec_per_command.as_secs_f64() * 1e3,
            self.speedup()
        )
    }
}

#[cfg(feature = "testing")]
/// Run `true` `n` times through a persistent session in sandbox `sandbox`
/// (provisioned if needed), then `n` times as a fresh exec in the same container.
pub async fn run(backend: &DockerBackend, sandbox: &str, n: usize) -> Result<BenchReport> {
    let n = n.max(1);
    let sb = backend
        .provision(&SandboxSpec::named(sandbox))
        .await?
        .sandbox;
    let mut session = Session::open(sb, SessionConfig::named(format!("bench-{sandbox}"))).await?;
    for _ in 0..3 {
        session.exec(PROBE, ExecOpts::default()).await?;
    }
    let t = Instant::now();
    for _ in 0..n {
        let r = session.exec(PROBE, ExecOpts::default()).await?;
        if r.exit_code != 0 || r.output.text() != "hi\n" {
            return Err(bench_error(format!(
                "the probe printed {:?} (exit {}) in the session",
                r.output.text(),
                r.exit_code
            )));
        }
    }
    let session_total = t.elapsed();
    session.close().await;
    let fresh = fresh_execs(
        backend.client(),
        &backend.names().container(sandbox),
        n,
        PROBE,
    )
    .await?;
    Ok(BenchReport {
        commands: n,
        session_per_command: session_total / n as u32,
        fresh_exec_per_command: fresh,
    })
}

#[cfg(feature = "testing")]
/// The probe both series run.
const PROBE: &str = "echo hi";

/// The floor for `berth bench --backend docker`: the mean time of `n` fresh
/// execs of `bash -c probe` in sandbox `sandbox`'s container, each created,
/// started, read to its end and inspected through bollard, on the daemon at
/// `DOCKER_HOST`, as installation `installation` names it (see
/// [`crate::installation_id`]). The probe must print `hi`.
pub async fn fresh_exec_per_command(
    installation: &str,
    sandbox: &str,
    n: usize,
    probe: &str,
) -> Result<Duration> {
    let backend = DockerBackend::connect()
        .await?
        .with_installation(installation);
    fresh_execs(
        backend.client(),
        &backend.names().container(sandbox),
        n.max(1),
        probe,
    )
    .await
}

async fn fresh_execs(
    docker: &bollard::Docker,
    container: &str,
    n: usize,
    probe: &str,
) -> Result<Duration> {
    fresh_exec(docker, container, probe).await?;
    let t = Instant::now();
    for _ in 0..n {
        fresh_exec(docker, container, probe).await?;
    }
    Ok(t.elapsed() / n as u32)
}

/// One probe as its own exec: create, start attached, read, inspect.
async fn fresh_exec(docker: &bollard::Docker, container: &str, probe: &str) -> Result<()> {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(vec![
                    "bash".to_string(),
                    "-c".to_string(),
                    probe.to_string(),
                ]),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| bench_error(format!("creating an exec: {e}")))?;
    let mut out = Vec::new();
    match docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| bench_error(format!("starting an exec: {e}")))?
    {
        StartExecResults::Attached { mut output, .. } => {
            while let Some(item) = output.next().await {
                if let Ok(LogOutput::StdOut { message }) = item {
                    out.extend_from_slice(&message);
                }
            }
        }
        StartExecResults::Detached => {}
    }
    let info = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| bench_error(format!("inspecting an exec: {e}")))?;
    match info.exit_code {
        Some(0) if out == b"hi\n" => Ok(()),
        other => Err(bench_error(format!(
            "a fresh exec of the probe printed {:?} and ended with {other:?}",
            String::from_utf8_lossy(&out)
        ))),
    }
}

fn bench_error(detail: String) -> Error {
    Error::backend(
        super::KIND,
        BackendFailure::Rejected,
        format!("bench: {detail}"),
    )
}
