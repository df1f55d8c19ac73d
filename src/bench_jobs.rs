//! `berth bench`'s job figure: how long after a job's last instruction
//! `job wait` returns (the wrapper's exit, the waiter's wake, the refresh).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use berth_core::jobs::JobState;
use berth_core::runtime::Runtime;

/// Jobs measured; the median is reported.
const ROUNDS: usize = 5;

/// The median delay between a job's last command (it prints the clock) and
/// the return of a `wait_job` that was already waiting. The sandbox's clock
/// is compared with berth's: exact on local and docker, as good as the two
/// hosts' clock sync over ssh.
pub async fn job_wake_latency(
    rt: &Runtime,
    backend: berth_core::backend::BackendKind,
    sandbox: &str,
) -> Result<Duration> {
    let mut lags = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let job = rt
            .start_job(backend, sandbox, "sleep 0.3; date +%s%N", None, vec![])
            .await?;
        let done = rt.wait_job(&job.id, Some(Duration::from_secs(60))).await?;
        let woke = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("the clock is before 1970")?;
        if done.state != JobState::Exited || done.exit_code != Some(0) {
            bail!(
                "the bench job ended {:?} ({:?})",
                done.state,
                done.exit_code
            );
        }
        let mut out = Vec::new();
        let mut sink = |b: &[u8]| out.extend_from_slice(b);
        rt.job_logs(&job.id, 0, false, &mut sink).await?;
        let ended: u128 = String::from_utf8_lossy(&out)
            .trim()
            .parse()
            .with_context(|| format!("the bench job printed {out:?}, not a time"))?;
        let lag = woke.as_nanos().saturating_sub(ended);
        lags.push(Duration::from_nanos(lag.min(u64::MAX as u128) as u64));
    }
    lags.sort();
    Ok(lags[ROUNDS / 2])
}
