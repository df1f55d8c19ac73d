//! Triggers: the server holds the waits of runs that sleep on an event
//! (`wait_for`, `berth run --on`), and resumes each run when its event comes.
//!
//! Flow at a glance, whenever the store is written (its bell rings), at the
//! nearest deadline, and every [`TICK`] while a job's output is searched:
//! read the open waits from the store; for each, check its events (an
//! approval's answer, a job's output from where the last look stopped, the
//! job's end, the deadline); the first that happened is written as the
//! wait's outcome (once: a second server finds it written), and the run is
//! started again as its own process (`berth-engine run --resume ID`, logging
//! to `runs/ID.log` in the state dir), then marked resumed. A server that
//! dies between the two finds the wait fired and not resumed, and resumes
//! it. A waiting run holds no process: only this loop and a row.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use berth_agent::waits::{self, Wait};
use berth_core::approvals::ApprovalState;
use berth_core::runtime::Runtime;
use berth_core::store::now_ms;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often a job's output is searched for a wait's pattern.
const TICK: Duration = Duration::from_millis(250);
/// The most of a job's output read per look.
const READ: usize = 1 << 20;

/// Start the loop; `open` counts the waits held (a server holding one is
/// not idle).
pub fn spawn(
    rt: Arc<Runtime>,
    state_dir: PathBuf,
    open: Arc<AtomicUsize>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut bell = rt.store().bell(TICK);
        let mut next = Look::Now;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = next.wait(&mut bell) => {}
            }
            let s = rt.store().clone();
            let list = match tokio::task::spawn_blocking(move || waits::open(&s)).await {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => {
                    warn!(error = %e, "waits: cannot read them");
                    next = Look::Poll;
                    continue;
                }
                Err(_) => {
                    next = Look::Poll;
                    continue;
                }
            };
            open.store(list.len(), Ordering::SeqCst);
            next = Look::after(&list);
            for w in list {
                if stop.is_cancelled() {
                    break;
                }
                if w.outcome.is_none() {
                    match check(&rt, &w).await {
                        Some(outcome) => match waits::wake(rt.store(), &w.run_id, &outcome) {
                            Ok(true) => {
                                info!(run = %w.run_id, outcome = %outcome, "waits: woke a run")
                            }
                            Ok(false) => {}
                            Err(e) => {
                                warn!(run = %w.run_id, error = %e, "waits: cannot record");
                                continue;
                            }
                        },
                        None => continue,
                    }
                }
                resume(&rt, &state_dir, &w.run_id);
            }
        }
    })
}

/// When the waits are next looked at.
enum Look {
    Now,
    /// A job's output is searched, or a run is to be started again: its
    /// output and its process are not in the store, so no write rings for
    /// them.
    Poll,
    /// At the next write of the store (an answer, a job's end), or at the
    /// nearest deadline.
    Bell(Duration),
}

/// The longest the loop sleeps with no write and no deadline.
const BACKSTOP: Duration = Duration::from_secs(60);

impl Look {
    fn after(list: &[Wait]) -> Look {
        if list
            .iter()
            .any(|w| w.outcome.is_some() || (w.pattern.is_some() && w.job.is_some()))
        {
            return Look::Poll;
        }
        let now = now_ms();
        let nearest = list
            .iter()
            .filter_map(|w| w.deadline_ms)
            .map(|d| Duration::from_millis(d.saturating_sub(now).max(0) as u64))
            .min()
            .unwrap_or(BACKSTOP);
        Look::Bell(nearest.min(BACKSTOP))
    }

    async fn wait(&self, bell: &mut berth_core::bell::Bell) {
        match self {
            Look::Now => {}
            Look::Poll => tokio::time::sleep(TICK).await,
            Look::Bell(d) => {
                bell.wait(*d).await;
            }
        }
    }
}

/// What happened, if anything yet.
async fn check(rt: &Runtime, w: &Wait) -> Option<Value> {
    let store = rt.store();
    if let Some(a) = w.approval {
        match store.approval(a) {
            Ok(ap) if ap.state != ApprovalState::Pending => {
                return Some(json!({
                    "woke": "approval", "approval": a,
                    "state": format!("{:?}", ap.state).to_lowercase(),
                }));
            }
            Ok(_) => {}
            Err(e) => return Some(json!({ "woke": "error", "error": e.full_text() })),
        }
    }
    if let Some(id) = &w.job {
        // The store's state: the server's job watcher records each job's
        // end as it happens, so asking the sandbox again here would be
        // the same work twice, four times a second.
        let job = match rt.store().job(id) {
            Ok(j) => j,
            Err(e) => {
                return Some(json!({ "woke": "error", "job": id, "error": e.full_text() }));
            }
        };
        if let Some(p) = &w.pattern
            && let Some(hit) = search(rt, w, id, p).await
        {
            return Some(hit);
        }
        if job.state.is_final() {
            // Its last lines may hold the match: one more look first.
            if let Some(p) = &w.pattern
                && let Some(hit) = search(rt, w, id, p).await
            {
                return Some(hit);
            }
            return Some(json!({
                "woke": "job_end", "job": id, "state": job.state.as_str(), "exit_code": job.exit_code,
            }));
        }
    }
    if let Some(d) = w.deadline_ms
        && now_ms() >= d
    {
        return Some(json!({
            "woke": "timeout", "job": w.job, "waited_s": (now_ms() - w.created_ms) / 1000,
        }));
    }
    None
}

/// The first whole line of the job's new output that matches `pattern`;
/// the wait's offset moves past the lines searched.
async fn search(rt: &Runtime, w: &Wait, job: &str, pattern: &str) -> Option<Value> {
    let re = regex::Regex::new(pattern).ok()?;
    let mut got: Vec<u8> = Vec::new();
    let mut sink = |b: &[u8]| {
        if got.len() < READ {
            got.extend_from_slice(b);
        }
    };
    // The offset of the latest stored look; re-read from the store so two
    // looks in one tick do not search the same lines twice.
    let from = waits::of_run(rt.store(), &w.run_id)
        .ok()
        .flatten()
        .map_or(w.log_offset, |x| x.log_offset);
    rt.job_logs(job, from as u64, false, &mut sink).await.ok()?;
    let whole = got.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut hit = None;
    let mut used = 0;
    for line in got[..whole].split_inclusive(|b| *b == b'\n') {
        used += line.len();
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\n', '\r']);
        if re.is_match(text) {
            hit = Some(json!({
                "woke": "pattern", "job": job, "pattern": pattern,
                "line": text.chars().take(500).collect::<String>(),
            }));
            break;
        }
    }
    // Written only when it moves: a write rings the store's bell.
    if used > 0 {
        let _ = waits::set_offset(rt.store(), &w.run_id, from + used as i64);
    }
    hit
}

/// Start the run again, in a process of its own.
fn resume(rt: &Runtime, state_dir: &std::path::Path, run: &str) {
    match berth_service::detached::start_run(state_dir, ["--json", "--resume", run], run) {
        Ok(pid) => {
            if let Err(e) = waits::resumed(rt.store(), run) {
                warn!(run, error = %e, "waits: cannot mark the run resumed");
            }
            info!(run, pid, "waits: resumed a run");
        }
        Err(e) => warn!(run, error = %e, "waits: cannot start the run again"),
    }
}
