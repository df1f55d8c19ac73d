//! `berth job logs`: a job's output, from an offset or its last lines, and
//! with `--follow` until the job ends.
//!
//! Each piece printed is announced with the offset it brings the reader to
//! ([`io::position`]): a client of the server that loses it carries on from
//! there with the next server, printing nothing twice
//! (`berth_client::client::run`). In-process, Ctrl-C stops a follow and
//! prints the offset to resume at, as the end of a follow does.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use berth_client::served::job::LogsArgs;
use berth_core::runtime::Runtime;

use crate::io::{self, errln};

/// Print a job's logs as `a` says; returns the exit status.
pub async fn logs(rt: &Runtime, a: LogsArgs) -> Result<u8> {
    if let Some(b) = &a.backend {
        let job = rt.store().job(&a.id)?;
        if job.backend != *b {
            bail!(
                "job {} runs on the {} backend, not {b}; leave out -b, or pass -b {}",
                job.id,
                job.backend,
                job.backend
            );
        }
    }
    let mut offset = a.offset;
    if let Some(n) = a.tail {
        let (text, end) = rt.job_tail_at(&a.id, n).await?;
        if !a.follow {
            io::out(&text);
            return Ok(0);
        }
        io::position(end);
        io::out(&text);
        offset = end;
    }
    let last = AtomicU64::new(offset);
    let mut sink = |b: &[u8], at: u64| {
        io::position(at);
        io::out(b);
        last.store(at, Ordering::SeqCst);
    };
    let pace: &berth_core::jobs::Pace = &|| Box::pin(io::drained());
    let read = rt.job_logs_at(&a.id, offset, a.follow, &mut sink, Some(pace));
    let end = if a.follow && !io::remote() {
        tokio::select! {
            r = read => r?,
            _ = tokio::signal::ctrl_c() => {
                let at = last.load(Ordering::SeqCst);
                errln!("berth: next offset {at} (resume with --offset {at})");
                return Ok(130);
            }
        }
    } else {
        read.await?
    };
    errln!("berth: next offset {end} (resume with --offset {end})");
    Ok(0)
}
