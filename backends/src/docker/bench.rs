//! The round-trip benchmark behind `berth bench --backend docker`: one command
//! through the persistent session against a fresh exec per command, created,
//! started and awaited through the Engine API, measured in the same run on the
//! same container.

use std::time::{Duration, Instant};

use berth_core::backend::{Backend, SandboxSpec};
use berth_core::error::{Error, Result};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;

use super::{DockerBackend, container_name};

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

impl BenchReport {
    /// How many times faster the session is per command.
    pub fn speedup(&self) -> f64 {
        self.fresh_exec_per_command.as_secs_f64() / self.session_per_command.as_secs_f64().max(1e-9)
    }
}

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
        session.exec("true", ExecOpts::default()).await?;
    }
    let t = Instant::now();
    for _ in 0..n {
        let r = session.exec("true", ExecOpts::default()).await?;
        if r.exit_code != 0 {
            return Err(bench_error(format!(
                "`true` exited {} in the session",
                r.exit_code
            )));
        }
    }
    let session_total = t.elapsed();
    session.close().await;

    let docker = backend.client();
    let container = container_name(sandbox);
    let t = Instant::now();
    for _ in 0..n {
        fresh_exec(docker, &container).await?;
    }
    let fresh_total = t.elapsed();
    Ok(BenchReport {
        commands: n,
        session_per_command: session_total / n as u32,
        fresh_exec_per_command: fresh_total / n as u32,
    })
}

/// One `true` as its own exec: create, start attached, drain, inspect.
async fn fresh_exec(docker: &bollard::Docker, container: &str) -> Result<()> {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(vec!["true".to_string()]),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| bench_error(format!("creating an exec: {e}")))?;
    match docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| bench_error(format!("starting an exec: {e}")))?
    {
        StartExecResults::Attached { mut output, .. } => while output.next().await.is_some() {},
        StartExecResults::Detached => {}
    }
    let info = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| bench_error(format!("inspecting an exec: {e}")))?;
    match info.exit_code {
        Some(0) => Ok(()),
        other => Err(bench_error(format!("a fresh `true` ended with {other:?}"))),
    }
}

fn bench_error(detail: String) -> Error {
    Error::Backend {
        backend: super::KIND,
        detail: format!("bench: {detail}"),
    }
}
