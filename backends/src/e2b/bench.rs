//! `berth bench --backend e2b`: the floor is what the official SDK's
//! `commands.run` does, a fresh envd `Start` of `/bin/bash -l -c CMD` per
//! command, over the same kept-alive HTTP client berth's session uses.

use std::time::{Duration, Instant};

use berth_core::backend::Process;
use berth_core::error::{BackendFailure, Error, Result};

use super::{E2bBackend, E2bSandbox, KIND};

/// Mean wall time of `n` fresh `Start`s of `probe` in the sandbox `name`,
/// which must exist (the bench's session created it).
pub async fn fresh_start_per_command(name: &str, n: usize, probe: &str) -> Result<Duration> {
    let backend = E2bBackend::from_env()?;
    // A concrete handle on the bench session's sandbox: the trait object
    // cannot start a process without stdin.
    let sandbox = backend.attach_by_name(name).await?;
    let argv = [
        "/bin/bash".to_string(),
        "-l".to_string(),
        "-c".to_string(),
        probe.to_string(),
    ];
    // One warm-up, as the session gets.
    run_once(&sandbox, &argv).await?;
    let n = n.max(1);
    let t = Instant::now();
    for _ in 0..n {
        run_once(&sandbox, &argv).await?;
    }
    Ok(t.elapsed() / n as u32)
}

async fn run_once(sandbox: &E2bSandbox, argv: &[String]) -> Result<()> {
    use tokio::io::AsyncReadExt;
    let mut p = sandbox
        .start_with_deadline(argv, false, Some(Duration::from_secs(60)))
        .await?;
    let mut out = Vec::new();
    if let Some(mut o) = p.take_stdout() {
        o.read_to_end(&mut out)
            .await
            .map_err(|e| Error::stream("reading the bench probe's output", e))?;
    }
    let status = p.wait().await?;
    if status.code != Some(0) || out != b"hi\n" {
        return Err(bench_error(format!(
            "the probe exited {} and printed {:?}",
            status.shell_code(),
            String::from_utf8_lossy(&out)
        )));
    }
    Ok(())
}

fn bench_error(detail: String) -> Error {
    Error::backend(KIND, BackendFailure::Rejected, format!("bench: {detail}"))
}
