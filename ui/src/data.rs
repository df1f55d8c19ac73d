//! What the pages show, read from the store (on the blocking pool: a
//! SQLite lock wait holds a blocking thread, never a worker).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use berth_agent::context::Compaction;
use berth_agent::journal::{self, CallRow, RunRow, StepRow};
use berth_agent::provider::{Message, Role};
use berth_core::approvals::Approval;
use berth_core::checkpoint::record::{self, CheckpointRow};
use berth_core::events::EventKind;
use berth_core::jobs::Job;
use berth_core::runtime::Runtime;
use berth_core::store::{Event, SandboxRow};

/// Run `f` with the runtime on the blocking pool.
pub async fn blocking<T: Send + 'static>(
    rt: &Arc<Runtime>,
    f: impl FnOnce(&Runtime) -> Result<T> + Send + 'static,
) -> Result<T> {
    let rt = rt.clone();
    tokio::task::spawn_blocking(move || f(&rt)).await?
}

/// A sandbox as the overview lists it.
pub struct SandboxLine {
    pub row: SandboxRow,
    pub sessions: i64,
    pub busy: bool,
}

/// A run as the overview lists it, with its totals.
pub struct RunLine {
    pub row: RunRow,
    pub steps: usize,
    pub tokens: u64,
    pub cost: Option<f64>,
}

/// Everything on the overview.
pub struct Overview {
    pub sandboxes: Vec<SandboxLine>,
    pub jobs: Vec<Job>,
    pub runs: Vec<RunLine>,
    pub approvals: Vec<Approval>,
}

/// How many recent jobs and runs the overview lists.
const RECENT: usize = 30;

pub async fn overview(rt: &Arc<Runtime>) -> Result<Overview> {
    let (rows, jobs, runs, approvals, sessions) = blocking(rt, |rt| {
        let store = rt.store();
        let rows = store.sandboxes(None)?;
        let mut jobs = store.jobs()?;
        // Unfinished first, then the newest.
        jobs.sort_by_key(|j| (j.state.is_final(), std::cmp::Reverse(j.created_at)));
        jobs.truncate(RECENT);
        // A job's command is kept as given; what a person sees is masked.
        for j in &mut jobs {
            j.command = rt.redact(&j.command);
        }
        let runs = journal::runs(store, RECENT)?
            .into_iter()
            .map(|mut row| {
                row.task = rt.redact(&row.task);
                let steps = journal::steps(store, &row.id)?;
                Ok(run_line(row, &steps))
            })
            .collect::<Result<Vec<_>>>()?;
        let approvals: Vec<Approval> = store
            .approvals(false)?
            .iter()
            .map(|a| match rt.gate() {
                Some(g) => g.redact_approval(a),
                None => a.clone(),
            })
            .collect();
        let sessions = store.session_counts()?;
        Ok((rows, jobs, runs, approvals, sessions))
    })
    .await?;
    let mut sandboxes = Vec::with_capacity(rows.len());
    for row in rows {
        let n = sessions
            .get(&(row.backend, row.name.clone()))
            .copied()
            .unwrap_or(0);
        let busy = rt
            .is_busy(row.backend, &row.name, berth_core::runtime::MAIN_SESSION)
            .await;
        sandboxes.push(SandboxLine {
            row,
            sessions: n,
            busy,
        });
    }
    Ok(Overview {
        sandboxes,
        jobs,
        runs,
        approvals,
    })
}

fn run_line(row: RunRow, steps: &[StepRow]) -> RunLine {
    let cost = steps
        .iter()
        .filter_map(|s| s.cost)
        .fold(None, |a: Option<f64>, c| Some(a.unwrap_or(0.0) + c));
    RunLine {
        row,
        steps: steps.len(),
        tokens: steps.iter().map(|s| s.usage.total()).sum(),
        cost,
    }
}

/// A job's page.
pub struct JobView {
    pub job: Job,
    /// `job.watch` events: (when, pattern, line).
    pub matches: Vec<(i64, String, String)>,
}

pub async fn job(rt: &Arc<Runtime>, id: &str) -> Result<Option<JobView>> {
    let id = id.to_string();
    blocking(rt, move |rt| {
        let store = rt.store();
        let mut job = match store.job(&id) {
            Ok(j) => j,
            Err(berth_core::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        job.command = rt.redact(&job.command);
        job.reason = job.reason.map(|r| rt.redact(&r));
        let matches = store
            .events_of_call(EventKind::JobWatch, &job.id, 50)?
            .into_iter()
            .map(|e| {
                let v: serde_json::Value = e
                    .detail
                    .and_then(|d| serde_json::from_str(&d).ok())
                    .unwrap_or_default();
                let w = &v["detail"];
                (
                    e.ts_ms,
                    w["pattern"].as_str().unwrap_or("").to_string(),
                    w["line"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        Ok(Some(JobView { job, matches }))
    })
    .await
}

/// One step of a run, with what it said and did.
pub struct StepView {
    pub row: StepRow,
    /// The model's text in this step.
    pub text: Vec<String>,
    pub calls: Vec<CallRow>,
    /// The checkpoint taken after it.
    pub checkpoint: Option<CheckpointRow>,
    /// Rolled back: no longer in the transcript.
    pub rolled_back: bool,
}

/// A run's page.
pub struct RunView {
    pub row: RunRow,
    pub steps: Vec<StepView>,
    pub compactions: Vec<Compaction>,
    pub children: Vec<RunRow>,
    pub waits: Option<berth_agent::waits::Wait>,
    pub rollbacks: Vec<journal::Rollback>,
    /// The checkpoint before step 1.
    pub first_checkpoint: Option<CheckpointRow>,
    pub line: RunLine,
}

pub async fn run(rt: &Arc<Runtime>, id: &str) -> Result<Option<RunView>> {
    let id = id.to_string();
    blocking(rt, move |rt| {
        let store = rt.store();
        let Some(mut row) = journal::run(store, &id)? else {
            return Ok(None);
        };
        row.task = rt.redact(&row.task);
        let steps = journal::steps(store, &id)?;
        let calls = journal::calls(store, &id)?;
        let messages = journal::all_messages(store, &id)?;
        let kept: std::collections::HashSet<i64> = journal::messages(store, &id)?
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        let checkpoints = record::of_run(store, &id).unwrap_or_default();
        let compactions = journal::compactions(store, &id)?;
        let children = journal::descendants(store, &id)?;
        let waits = berth_agent::waits::of_run(store, &id)?;
        let rollbacks = journal::rollbacks(store, &id)?;
        let mut text: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for (step, m) in &messages {
            if let Message {
                role: Role::Assistant,
                text: t,
                ..
            } = m
                && !t.trim().is_empty()
            {
                text.entry(*step).or_default().push(rt.redact(t));
            }
        }
        let first_checkpoint = checkpoints.iter().find(|c| c.step == Some(0)).cloned();
        let views = steps
            .iter()
            .map(|s| StepView {
                row: s.clone(),
                text: text.remove(&s.step).unwrap_or_default(),
                calls: calls
                    .iter()
                    .filter(|c| c.step == s.step)
                    .map(|c| CallRow {
                        args: rt.redact(&c.args),
                        result: c
                            .result
                            .as_ref()
                            .map(|r| berth_core::gate::redact_json(r, &|t| rt.redact(t))),
                        ..c.clone()
                    })
                    .collect(),
                checkpoint: checkpoints.iter().find(|c| c.step == Some(s.step)).cloned(),
                rolled_back: !kept.contains(&s.step)
                    && messages.iter().any(|(st, _)| *st == s.step),
            })
            .collect();
        let line = run_line(row.clone(), &steps);
        Ok(Some(RunView {
            row,
            steps: views,
            compactions,
            children,
            waits,
            rollbacks,
            first_checkpoint,
            line,
        }))
    })
    .await
}

/// The event page's filters.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct EventFilter {
    #[serde(default)]
    pub sandbox: String,
    #[serde(default)]
    pub kind: String,
    /// Only the last this many minutes.
    #[serde(default)]
    pub minutes: String,
    /// Only events after this id (the live stream's cursor).
    #[serde(default)]
    pub after: Option<i64>,
}

impl EventFilter {
    pub fn query(&self) -> String {
        let enc = |s: &str| -> String {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect()
        };
        format!(
            "sandbox={}&kind={}&minutes={}",
            enc(&self.sandbox),
            enc(&self.kind),
            enc(&self.minutes)
        )
    }
}

/// How many events a page or a live batch shows at most.
pub const EVENTS_SHOWN: usize = 300;

/// The newest events that pass `f`, newest first.
pub async fn events(rt: &Arc<Runtime>, f: EventFilter) -> Result<Vec<Event>> {
    blocking(rt, move |rt| {
        let since = f
            .minutes
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|m| *m > 0)
            .map(|m| berth_core::clock::now_ms() - m * 60_000);
        let sandbox = Some(f.sandbox.trim()).filter(|s| !s.is_empty());
        let kind = Some(f.kind.trim()).filter(|s| !s.is_empty());
        let after = f.after.unwrap_or(0);
        Ok(rt
            .store()
            .events_newest(after, sandbox, kind, since, EVENTS_SHOWN)?)
    })
    .await
}
