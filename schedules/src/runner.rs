//! Schedules in the server: at each slot's time, each due slot of each schedule
//! (see [`crate`]) either starts a run, or is recorded as
//! `overlap` (a run of the schedule is still going: it is reported, not
//! doubled) or `missed` (it passed while no server ran, and the schedule
//! skips such slots). The slot's fate and the next slot are written in one
//! transaction, so a restart neither loses a slot nor fires one twice.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use berth_core::runtime::Runtime;
use berth_core::store::now_ms;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{Missed, Schedule};

/// A run started this recently counts as going while it writes its journal.
pub const GRACE_MS: i64 = 30_000;
/// A slot this late passed while no server ran.
const LATE_MS: i64 = 60_000;
/// How soon the schedules are looked at again after an error, and how often
/// where the kernel cannot watch the store.
const TICK: Duration = Duration::from_millis(500);
/// The longest the loop sleeps with no write: a clock set forward is seen
/// within it.
const BACKSTOP: Duration = Duration::from_secs(30);

/// Start the loop; `active` counts the schedules not paused (a server with
/// one is not idle).
pub fn spawn(
    rt: Arc<Runtime>,
    state_dir: PathBuf,
    active: Arc<AtomicUsize>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        // A schedule added, changed or paused by any process is a write of
        // the store, which rings; else the loop sleeps to the next slot.
        let mut bell = rt.store().bell(TICK);
        let mut sleep = Duration::ZERO;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = bell.wait(sleep) => {}
            }
            let store = rt.store().clone();
            let dir = state_dir.clone();
            let n = tokio::task::spawn_blocking(move || tick(&store, &dir)).await;
            sleep = match n {
                Ok(Ok((n, next))) => {
                    active.store(n, Ordering::SeqCst);
                    next.map_or(BACKSTOP, |at| {
                        Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64)
                    })
                }
                Ok(Err(e)) => {
                    warn!(error = %format!("{e:#}"), "schedules");
                    TICK
                }
                Err(_) => TICK,
            }
            .min(BACKSTOP);
        }
    })
}

/// Deal with every due slot; returns how many schedules are live, and the
/// time of the nearest slot to come.
fn tick(store: &berth_core::store::Store, dir: &Path) -> Result<(usize, Option<i64>)> {
    let list = crate::list(store)?;
    let now = now_ms();
    let mut nearest: Option<i64> = None;
    for s in list.iter().filter(|s| !s.paused) {
        let Some(slot) = s.next_ms.filter(|n| *n <= now) else {
            nearest = sooner(nearest, s.next_ms);
            continue;
        };
        let next = crate::next_slot(&s.cron, &s.tz, now)?;
        nearest = sooner(nearest, Some(next));
        let late = now - slot > LATE_MS;
        if late && s.missed == Missed::Skip {
            crate::fired(
                store,
                &s.name,
                slot,
                "missed",
                Some("no berth server ran at the time; skipped (--missed skip)"),
                next,
            )?;
            info!(schedule = %s.name, slot, "missed slot skipped");
            continue;
        }
        if let Some(run) = crate::going(store, &s.name, GRACE_MS)? {
            let note = format!("run {run} was still going, so none was started");
            crate::fired(store, &s.name, slot, "overlap", Some(&note), next)?;
            warn!(schedule = %s.name, %run, "a slot came while the last run still went");
            continue;
        }
        // Recorded first: a crash after it loses at most this one start,
        // never fires the slot twice.
        let note = if late {
            "started late, once for the slots missed while no server ran (--missed once)"
        } else {
            "started"
        };
        crate::fired(store, &s.name, slot, "started", Some(note), next)?;
        match start(dir, s) {
            Ok(pid) => info!(schedule = %s.name, pid, "started a scheduled run"),
            Err(e) => {
                let why = format!("could not start: {e:#}");
                crate::fired(store, &s.name, slot, "failed", Some(&why), next)?;
            }
        }
    }
    Ok((list.iter().filter(|s| !s.paused).count(), nearest))
}

fn sooner(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Start schedule `s`'s run as a process of its own; returns its pid.
pub fn start(dir: &Path, s: &Schedule) -> Result<u32> {
    let mut args: Vec<std::ffi::OsString> =
        vec!["--json".into(), "--schedule".into(), s.name.clone().into()];
    args.extend(s.args.iter().map(Into::into));
    args.push("--".into());
    args.push(s.task.clone().into());
    berth_service::detached::start_run(dir, args, &format!("schedule-{}", s.name))
}
