//! The durable run: every step written to the store before the next begins.
//!
//! Flow at a glance:
//! - [`create`] writes the run with its frozen setup (system prompt, tool
//!   schemas, providers, budgets), so a resume sends byte-identical prompts;
//! - each model answer is one [`append_message`] plus one [`put_step`];
//! - each tool call is written `started` ([`call_started`]) before it runs and
//!   `finished` together with its result message ([`call_finished`], one
//!   transaction) after, so a `kill -9` leaves at worst a started call, which a
//!   resume reports to the model as cut off instead of running it again;
//! - the run's state ends as one of the exit reasons ([`set_state`]);
//! - a compaction is one row ([`put_compaction`]), written with the step of
//!   its summary call in one transaction once it is complete: a `kill -9`
//!   before that leaves no trace, and the resume compacts again. It changes
//!   what is sent, never the stored messages.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::context::{Compaction, Stage};
use super::provider::{Attempt, Message, Usage};
use crate::error::{Error, Result};
use berth_core::backend::BackendKind;
use berth_core::store::{Store, now_ms};

/// Why a run stopped (or that it has not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Going, or killed while going (a resume continues it).
    Running,
    /// The model gave its final answer.
    Done,
    /// A budget ran out; the model summarised.
    BudgetSpent,
    /// A person pressed Ctrl-C.
    Interrupted,
    /// A tool call waits for `berth approve`.
    AwaitingApproval,
    /// It waits for an event (`wait_for`, `--on`); the server resumes it.
    Waiting,
    /// No provider answered.
    ProviderFailed,
    /// Anything else.
    Error,
}

impl RunState {
    /// It ended: `done`, `budget_spent`, `provider_failed` or `error`. A
    /// person may carry such a run on; its parent's resume never reruns a
    /// sub-agent that ended so.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunState::Done | RunState::BudgetSpent | RunState::ProviderFailed | RunState::Error
        )
    }

    /// Its name in the store and in `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Done => "done",
            RunState::BudgetSpent => "budget_spent",
            RunState::Interrupted => "interrupted",
            RunState::AwaitingApproval => "awaiting_approval",
            RunState::Waiting => "waiting",
            RunState::ProviderFailed => "provider_failed",
            RunState::Error => "error",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "running" => RunState::Running,
            "done" => RunState::Done,
            "budget_spent" => RunState::BudgetSpent,
            "interrupted" => RunState::Interrupted,
            "awaiting_approval" => RunState::AwaitingApproval,
            "waiting" => RunState::Waiting,
            "provider_failed" => RunState::ProviderFailed,
            "error" => RunState::Error,
            other => {
                return Err(Error::UnknownState {
                    what: "run",
                    state: other.into(),
                });
            }
        })
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run's header row.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    /// Its id.
    pub id: String,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Last write, ms since the epoch.
    pub updated_ms: i64,
    /// The first task.
    pub task: String,
    /// Backend.
    pub backend: BackendKind,
    /// Sandbox.
    pub sandbox: String,
    /// Where it stands.
    pub state: RunState,
    /// Words on why.
    pub reason: Option<String>,
    /// The frozen setup (JSON).
    pub setup: Value,
    /// The run this was forked from, or the run that delegated it.
    pub parent: Option<String>,
    /// And at which step.
    pub parent_step: Option<i64>,
    /// How it is tied to `parent`: `fork` or `child`.
    pub kind: Option<String>,
    /// A child's parent call (`delegate`).
    pub parent_call: Option<String>,
    /// A child's place in that call's fan-out, from 0.
    pub child_idx: Option<i64>,
    /// Levels of delegation above it: 0 for a run a person started.
    pub depth: i64,
}

/// How a new run is tied to another.
#[derive(Clone, Copy, Debug)]
pub enum Link<'a> {
    /// Not at all.
    None,
    /// A fork of run `from`'s transcript through step `at`.
    Fork {
        /// The run forked.
        from: &'a str,
        /// The last step kept.
        at: i64,
    },
    /// A sub-agent started by a parent's `delegate` call.
    Child {
        /// The parent run.
        parent: &'a str,
        /// The parent's step that made the call.
        step: i64,
        /// The call's id.
        call: &'a str,
        /// Its place in the call's fan-out.
        idx: i64,
        /// Its depth (the parent's plus one).
        depth: i64,
    },
}

/// One step: one model call.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepRow {
    /// 1-based.
    pub step: i64,
    /// Who answered.
    pub provider: Option<String>,
    /// Every provider tried, and why those that did not answer were skipped.
    pub attempts: Vec<Attempt>,
    /// Tokens.
    pub usage: Usage,
    /// Cost at the provider's prices, if known.
    pub cost: Option<f64>,
    /// When the call started, ms since the epoch.
    pub started_ms: i64,
    /// When it ended.
    pub ended_ms: i64,
    /// The budget's last, tool-less call.
    pub summary: bool,
}

/// Where a journaled tool call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Written before it runs; still so after a `kill -9` mid-call.
    Started,
    /// It ran; its result is journaled.
    Finished,
    /// It was not run: invalid, or denied.
    Rejected,
    /// berth stopped while it ran: its outcome is unknown, and it was not
    /// run again.
    CutOff,
    /// It waits for a person's approval.
    AwaitingApproval,
}

impl CallState {
    /// Its name in the store and in `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::Started => "started",
            CallState::Finished => "finished",
            CallState::Rejected => "rejected",
            CallState::CutOff => "cut_off",
            CallState::AwaitingApproval => "awaiting_approval",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "started" => CallState::Started,
            "finished" => CallState::Finished,
            "rejected" => CallState::Rejected,
            "cut_off" => CallState::CutOff,
            "awaiting_approval" => CallState::AwaitingApproval,
            other => {
                return Err(Error::UnknownState {
                    what: "tool call",
                    state: other.into(),
                });
            }
        })
    }
}

impl std::fmt::Display for CallState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which call a journal write is about.
#[derive(Clone, Copy, Debug)]
pub struct CallKey<'a> {
    /// The provider's call id.
    pub call_id: &'a str,
    /// Its place in its step.
    pub idx: i64,
    /// The tool's name.
    pub name: &'a str,
    /// Its arguments as journaled (redacted).
    pub args: &'a str,
}

/// One tool call as journaled.
#[derive(Clone, Debug, Serialize)]
pub struct CallRow {
    /// The provider's call id.
    pub call_id: String,
    /// The step that made it.
    pub step: i64,
    /// Its place in that step.
    pub idx: i64,
    /// Tool name.
    pub name: String,
    /// Arguments as the model wrote them (redacted).
    pub args: String,
    /// Where it stands.
    pub state: CallState,
    /// The policy's word, if any.
    pub verdict: Option<String>,
    /// The approval it waits on or waited on.
    pub approval: Option<i64>,
    /// The outcome (JSON).
    pub result: Option<Value>,
    /// ms since the epoch.
    pub started_ms: i64,
    /// ms since the epoch.
    pub ended_ms: Option<i64>,
}

fn json_err(e: serde_json::Error) -> Error {
    Error::journal("a message or a step's record", e)
}

/// [`Store::with_db`] for this crate's functions (the journal's, the
/// waits'): the store's error is kept whole as this crate's [`Error::Core`].
pub(crate) fn db<T>(
    store: &Store,
    f: impl FnOnce(&rusqlite::Connection) -> berth_core::Result<T>,
) -> Result<T> {
    Ok(store.with_db(&crate::tables::TABLES, f)?)
}

/// A new run id.
pub fn new_run_id() -> String {
    let n: u32 = rand::random();
    format!("r{:x}{n:08x}", now_ms())
}

/// Write a new run.
pub fn create(
    store: &Store,
    id: &str,
    task: &str,
    backend: BackendKind,
    sandbox: &str,
    setup: &Value,
    link: Link<'_>,
) -> Result<()> {
    let now = now_ms();
    let (kind, parent, step, call, idx, depth) = match link {
        Link::None => (None, None, None, None, None, 0),
        Link::Fork { from, at } => (Some("fork"), Some(from), Some(at), None, None, 0),
        Link::Child {
            parent,
            step,
            call,
            idx,
            depth,
        } => (
            Some("child"),
            Some(parent),
            Some(step),
            Some(call),
            Some(idx),
            depth,
        ),
    };
    db(store, |c| {
        c.execute(
            "INSERT INTO runs (id, created_ms, updated_ms, task, backend, sandbox, state, setup,
                               parent, parent_step, kind, parent_call, child_idx, depth)
             VALUES (?1, ?2, ?2, ?3, ?4, ?5, 'running', ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                id,
                now,
                task,
                backend,
                sandbox,
                setup.to_string(),
                parent,
                step,
                kind,
                call,
                idx,
                depth
            ],
        )?;
        Ok(())
    })
}

/// The children a parent's call started, in fan-out order.
pub fn children(store: &Store, parent: &str, call: &str) -> Result<Vec<RunRow>> {
    select_runs(
        store,
        "WHERE kind = 'child' AND parent = ?1 AND parent_call = ?2 ORDER BY child_idx",
        params![parent, call],
    )
}

/// Every run below `id` (children, their children...), each once.
pub fn descendants(store: &Store, id: &str) -> Result<Vec<RunRow>> {
    select_runs(
        store,
        "WHERE id IN (
            WITH RECURSIVE below(id) AS (
                SELECT id FROM runs WHERE kind = 'child' AND parent = ?1
                UNION SELECT r.id FROM runs r JOIN below b ON r.kind = 'child' AND r.parent = b.id
            ) SELECT id FROM below)
         ORDER BY created_ms, id",
        params![id],
    )
}

fn select_runs(store: &Store, tail: &str, args: impl rusqlite::Params) -> Result<Vec<RunRow>> {
    let rows = db(store, |c| {
        let mut stmt = c.prepare(&format!("SELECT {RUN_COLUMNS} FROM runs {tail}"))?;
        let rows = stmt
            .query_map(args, row_to_run)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })?;
    rows.into_iter()
        .map(|(mut row, state)| {
            row.state = RunState::parse(&state)?;
            Ok(row)
        })
        .collect()
}

/// Set where a run stands; a stopped run has no owner.
pub fn set_state(store: &Store, id: &str, state: RunState, reason: Option<&str>) -> Result<()> {
    db(store, |c| {
        c.execute(
            "UPDATE runs SET state = ?2, reason = ?3, updated_ms = ?4,
                owner_pid = CASE WHEN ?2 = 'running' THEN owner_pid ELSE NULL END
             WHERE id = ?1",
            params![id, state.as_str(), reason, now_ms()],
        )?;
        Ok(())
    })
}

/// Take run `id` for this process, so two berths never carry on one run (and
/// run its calls twice). A run whose owner died (`kill -9`) is free again.
pub fn claim(store: &Store, id: &str) -> Result<()> {
    let me = std::process::id() as i64;
    store.with_conn(&crate::tables::TABLES, |c| {
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let owner: Option<(String, Option<i64>)> = tx
            .query_row(
                "SELECT state, owner_pid FROM runs WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((state, Some(pid))) = &owner
            && state == "running"
            && *pid != me
            && alive(*pid)
        {
            return Ok(Some(*pid));
        }
        tx.execute(
            "UPDATE runs SET state = 'running', reason = NULL, owner_pid = ?2, updated_ms = ?3 WHERE id = ?1",
            params![id, me, now_ms()],
        )?;
        tx.commit()?;
        Ok(None)
    })
    .map_err(Error::from)
    .and_then(|busy| match busy {
        Some(pid) => Err(Error::Busy {
            run: id.into(),
            pid,
        }),
        None => Ok(()),
    })
}

fn alive(pid: i64) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn row_to_run(r: &rusqlite::Row<'_>) -> rusqlite::Result<(RunRow, String)> {
    let state: String = r.get(6)?;
    let setup: String = r.get(8)?;
    Ok((
        RunRow {
            id: r.get(0)?,
            created_ms: r.get(1)?,
            updated_ms: r.get(2)?,
            task: r.get(3)?,
            backend: r.get(4)?,
            sandbox: r.get(5)?,
            state: RunState::Running,
            reason: r.get(7)?,
            setup: serde_json::from_str(&setup).unwrap_or(Value::Null),
            parent: r.get(9)?,
            parent_step: r.get(10)?,
            kind: r.get(11)?,
            parent_call: r.get(12)?,
            child_idx: r.get(13)?,
            depth: r.get(14)?,
        },
        state,
    ))
}

const RUN_COLUMNS: &str = "id, created_ms, updated_ms, task, backend, sandbox, state, reason, setup, \
     parent, parent_step, kind, parent_call, child_idx, depth";

/// One run.
pub fn run(store: &Store, id: &str) -> Result<Option<RunRow>> {
    let found = db(store, |c| {
        Ok(c.query_row(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
            params![id],
            row_to_run,
        )
        .optional()?)
    })?;
    found
        .map(|(mut row, state)| {
            row.state = RunState::parse(&state)?;
            Ok(row)
        })
        .transpose()
}

/// The latest runs, newest first.
pub fn runs(store: &Store, limit: usize) -> Result<Vec<RunRow>> {
    select_runs(
        store,
        "ORDER BY created_ms DESC, id DESC LIMIT ?1",
        params![limit as i64],
    )
}

/// Append a message to the transcript.
pub fn append_message(store: &Store, run: &str, step: i64, m: &Message) -> Result<()> {
    let body = serde_json::to_string(m).map_err(json_err)?;
    db(store, |c| {
        c.execute(
            "INSERT INTO run_messages (run_id, seq, step, ts_ms, body)
             VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_messages WHERE run_id = ?1), ?2, ?3, ?4)",
            params![run, step, now_ms(), body],
        )?;
        Ok(())
    })
}

/// The transcript, with each message's step, in order.
/// Every message of a run, rolled-back steps too (`berth runs show`).
pub fn all_messages(store: &Store, run: &str) -> Result<Vec<(i64, Message)>> {
    let rows: Vec<(i64, String)> = db(store, |c| {
        let mut stmt =
            c.prepare("SELECT step, body FROM run_messages WHERE run_id = ?1 ORDER BY seq")?;
        let rows = stmt
            .query_map(params![run], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })?;
    decode_messages(rows)
}

fn decode_messages(rows: Vec<(i64, String)>) -> Result<Vec<(i64, Message)>> {
    rows.into_iter()
        .map(|(s, b)| Ok((s, serde_json::from_str(&b).map_err(json_err)?)))
        .collect()
}

/// A run's transcript: its messages, less the steps a rollback took out.
pub fn messages(store: &Store, run: &str) -> Result<Vec<(i64, Message)>> {
    let rows: Vec<(i64, String)> = db(store, |c| {
        let mut stmt = c.prepare(
            "SELECT step, body FROM run_messages m WHERE run_id = ?1 AND NOT EXISTS (
                 SELECT 1 FROM run_rollbacks r WHERE r.run_id = m.run_id
                 AND m.step > r.to_step AND m.step <= r.from_step)
             ORDER BY seq",
        )?;
        let rows = stmt
            .query_map(params![run], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })?;
    decode_messages(rows)
}

/// Record a model call.
pub fn put_step(store: &Store, run: &str, s: &StepRow) -> Result<()> {
    let attempts = serde_json::to_string(&s.attempts).map_err(json_err)?;
    let usage = serde_json::to_string(&s.usage).map_err(json_err)?;
    db(store, |c| {
        c.execute(
            "INSERT OR REPLACE INTO run_steps (run_id, step, provider, attempts, usage, cost, started_ms, ended_ms, summary)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![run, s.step, s.provider, attempts, usage, s.cost, s.started_ms, s.ended_ms, s.summary],
        )?;
        c.execute(
            "UPDATE runs SET updated_ms = ?2 WHERE id = ?1",
            params![run, now_ms()],
        )?;
        Ok(())
    })
}

/// Every step of a run.
pub fn steps(store: &Store, run: &str) -> Result<Vec<StepRow>> {
    db(store, |c| {
        let mut stmt = c.prepare(
            "SELECT step, provider, attempts, usage, cost, started_ms, ended_ms, summary
             FROM run_steps WHERE run_id = ?1 ORDER BY step",
        )?;
        let rows = stmt
            .query_map(params![run], |r| {
                let attempts: String = r.get(2)?;
                let usage: String = r.get(3)?;
                Ok(StepRow {
                    step: r.get(0)?,
                    provider: r.get(1)?,
                    attempts: serde_json::from_str(&attempts).unwrap_or_default(),
                    usage: serde_json::from_str(&usage).unwrap_or_default(),
                    cost: r.get(4)?,
                    started_ms: r.get(5)?,
                    ended_ms: r.get(6)?,
                    summary: r.get(7)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })
}

/// A tool call is about to run (or to wait on an approval).
#[allow(clippy::too_many_arguments)]
pub fn call_started(
    store: &Store,
    run: &str,
    call_id: &str,
    step: i64,
    idx: i64,
    name: &str,
    args: &str,
) -> Result<()> {
    db(store, |c| {
        c.execute(
            "INSERT INTO run_calls (run_id, call_id, step, idx, name, args, state, started_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'started', ?7)
             ON CONFLICT(run_id, call_id) DO UPDATE SET state = 'started', started_ms = excluded.started_ms",
            params![run, call_id, step, idx, name, args, now_ms()],
        )?;
        Ok(())
    })
}

/// A call waits for approval `approval`.
pub fn call_awaiting(store: &Store, run: &str, call_id: &str, approval: i64) -> Result<()> {
    db(store, |c| {
        c.execute(
            "UPDATE run_calls SET state = 'awaiting_approval', approval = ?3, verdict = 'ask'
             WHERE run_id = ?1 AND call_id = ?2",
            params![run, call_id, approval],
        )?;
        Ok(())
    })
}

/// A call ended (`state` is `finished` or `rejected`): its row and its result
/// message are written in one transaction, so either both exist or neither.
#[allow(clippy::too_many_arguments)]
pub fn call_finished(
    store: &Store,
    run: &str,
    step: i64,
    call: CallKey<'_>,
    state: CallState,
    verdict: Option<&str>,
    result: &Value,
    message: &Message,
) -> Result<()> {
    let CallKey {
        call_id,
        idx,
        name,
        args,
    } = call;
    let state = state.as_str();
    let body = serde_json::to_string(message).map_err(json_err)?;
    let now = now_ms();
    Ok(store.with_conn(&crate::tables::TABLES, |c| {
        let tx = c.transaction()?;
        tx.execute(
            "INSERT INTO run_calls (run_id, call_id, step, idx, name, args, state, verdict, result, started_ms, ended_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)
             ON CONFLICT(run_id, call_id) DO UPDATE SET state = excluded.state,
                verdict = COALESCE(excluded.verdict, verdict), result = excluded.result, ended_ms = excluded.ended_ms",
            params![run, call_id, step, idx, name, args, state, verdict, result.to_string(), now],
        )?;
        tx.execute(
            "INSERT INTO run_messages (run_id, seq, step, ts_ms, body)
             VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_messages WHERE run_id = ?1), ?2, ?3, ?4)",
            params![run, step, now, body],
        )?;
        tx.execute("UPDATE runs SET updated_ms = ?2 WHERE id = ?1", params![run, now])?;
        tx.commit()?;
        Ok(())
    })?)
}

/// Every tool call of a run, in order.
pub fn calls(store: &Store, run: &str) -> Result<Vec<CallRow>> {
    calls_where(store, run, None)
}

/// The tool calls of one step.
pub fn calls_of_step(store: &Store, run: &str, step: i64) -> Result<Vec<CallRow>> {
    calls_where(store, run, Some(step))
}

fn calls_where(store: &Store, run: &str, step: Option<i64>) -> Result<Vec<CallRow>> {
    db(store, |c| {
        let mut stmt = c.prepare_cached(
            "SELECT call_id, step, idx, name, args, state, verdict, approval, result, started_ms, ended_ms
             FROM run_calls WHERE run_id = ?1 AND (?2 IS NULL OR step = ?2) ORDER BY step, idx",
        )?;
        let rows = stmt
            .query_map(params![run, step], |r| {
                let result: Option<String> = r.get(8)?;
                let state: String = r.get(5)?;
                let state = CallState::parse(&state).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        5,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })?;
                Ok(CallRow {
                    call_id: r.get(0)?,
                    step: r.get(1)?,
                    idx: r.get(2)?,
                    name: r.get(3)?,
                    args: r.get(4)?,
                    state,
                    verdict: r.get(6)?,
                    approval: r.get(7)?,
                    result: result.and_then(|s| serde_json::from_str(&s).ok()),
                    started_ms: r.get(9)?,
                    ended_ms: r.get(10)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })
}

/// Record a compaction, with the step of its summary call if it made one,
/// in one transaction.
pub fn put_compaction(
    store: &Store,
    run: &str,
    c: &Compaction,
    summary_step: Option<&StepRow>,
) -> Result<()> {
    let (attempts, usage) = match summary_step {
        Some(s) => (
            serde_json::to_string(&s.attempts).map_err(json_err)?,
            serde_json::to_string(&s.usage).map_err(json_err)?,
        ),
        None => (String::new(), String::new()),
    };
    Ok(store.with_conn(&crate::tables::TABLES, |c0| {
        let tx = c0.transaction()?;
        if let Some(s) = summary_step {
            tx.execute(
                "INSERT OR REPLACE INTO run_steps (run_id, step, provider, attempts, usage, cost, started_ms, ended_ms, summary)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1)",
                params![run, s.step, s.provider, attempts, usage, s.cost, s.started_ms, s.ended_ms],
            )?;
        }
        tx.execute(
            "INSERT INTO run_compactions (run_id, n, step, stage, segment, masked, summarised, summary,
                summary_step, tokens_before, tokens_after, window, note, ts_ms)
             VALUES (?1, (SELECT COALESCE(MAX(n), 0) + 1 FROM run_compactions WHERE run_id = ?1),
                ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![
                run,
                c.step,
                c.stage.as_str(),
                c.segment,
                c.masked as i64,
                c.summarised as i64,
                c.summary,
                c.summary_step,
                c.tokens_before as i64,
                c.tokens_after as i64,
                c.window as i64,
                c.note,
                now_ms()
            ],
        )?;
        tx.execute("UPDATE runs SET updated_ms = ?2 WHERE id = ?1", params![run, now_ms()])?;
        tx.commit()?;
        Ok(())
    })?)
}

/// Every compaction of a run, oldest first.
pub fn compactions(store: &Store, run: &str) -> Result<Vec<Compaction>> {
    db(store, |c| {
        let mut stmt = c.prepare_cached(
            "SELECT step, stage, segment, masked, summarised, summary, summary_step,
                tokens_before, tokens_after, window, note
             FROM run_compactions WHERE run_id = ?1 ORDER BY n",
        )?;
        let rows = stmt
            .query_map(params![run], |r| {
                let stage: String = r.get(1)?;
                Ok(Compaction {
                    step: r.get(0)?,
                    stage: Stage::parse(&stage).unwrap_or(Stage::Rotate),
                    segment: r.get(2)?,
                    masked: r.get::<_, i64>(3)?.max(0) as usize,
                    summarised: r.get::<_, i64>(4)?.max(0) as usize,
                    summary: r.get(5)?,
                    summary_step: r.get(6)?,
                    tokens_before: r.get::<_, i64>(7)?.max(0) as u64,
                    tokens_after: r.get::<_, i64>(8)?.max(0) as u64,
                    window: r.get::<_, i64>(9)?.max(0) as u64,
                    note: r.get(10)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_compaction_and_its_summary_step_are_written_together() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        create(
            &store,
            "r1",
            "t",
            BackendKind::Local,
            "default",
            &Value::Null,
            Link::None,
        )
        .unwrap();
        assert!(compactions(&store, "r1").unwrap().is_empty());
        let c = Compaction {
            step: 5,
            stage: Stage::Summary,
            segment: 0,
            masked: 7,
            summarised: 5,
            summary: Some("## Task".into()),
            summary_step: Some(5),
            tokens_before: 6100,
            tokens_after: 2000,
            window: 8000,
            note: None,
        };
        let step = StepRow {
            step: 5,
            provider: Some("p".into()),
            attempts: vec![],
            usage: Usage::default(),
            cost: None,
            started_ms: 1,
            ended_ms: 2,
            summary: true,
        };
        put_compaction(&store, "r1", &c, Some(&step)).unwrap();
        assert_eq!(compactions(&store, "r1").unwrap(), vec![c]);
        let s = steps(&store, "r1").unwrap();
        assert_eq!(s.len(), 1);
        assert!(s[0].summary);
    }

    #[test]
    fn one_live_berth_owns_a_run_and_a_dead_one_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        create(
            &store,
            "r1",
            "t",
            BackendKind::Local,
            "default",
            &Value::Null,
            Link::None,
        )
        .unwrap();
        claim(&store, "r1").unwrap();
        // Owned by a live process (init): refused.
        let set_owner = |pid: i64| {
            store
                .with_conn(&crate::tables::TABLES, |c| {
                    c.execute(
                        "UPDATE runs SET owner_pid = ?1 WHERE id = 'r1'",
                        params![pid],
                    )
                })
                .unwrap();
        };
        set_owner(1);
        let e = claim(&store, "r1").unwrap_err().to_string();
        assert!(e.contains("another berth (pid 1)"), "{e}");
        // Owned by a process that has exited (a kill -9'd berth): free.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i64;
        child.wait().unwrap();
        set_owner(pid);
        claim(&store, "r1").unwrap();
        // A stopped run has no owner.
        set_state(&store, "r1", RunState::Done, None).unwrap();
        assert_eq!(run(&store, "r1").unwrap().unwrap().state, RunState::Done);
        set_owner(1);
        set_state(&store, "r1", RunState::Interrupted, None).unwrap();
        claim(&store, "r1").unwrap();
    }
}

/// A rollback of a run (`berth runs rollback`).
#[derive(Clone, Debug, Serialize)]
pub struct Rollback {
    /// When.
    pub at_ms: i64,
    /// The step the run went back to.
    pub to_step: i64,
    /// The last step before it: steps after `to_step` through this one left
    /// the transcript.
    pub from_step: i64,
    /// The checkpoint the sandbox was restored to.
    pub checkpoint: String,
}

/// Record a rollback: the run's transcript goes back to step `to`, and the
/// steps after it stay in the journal, marked.
pub fn roll_back(store: &Store, run: &str, to: i64, from: i64, checkpoint: &str) -> Result<()> {
    db(store, |c| {
        c.execute(
            "INSERT INTO run_rollbacks (run_id, at_ms, to_step, from_step, checkpoint) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![run, now_ms(), to, from, checkpoint],
        )?;
        Ok(())
    })
}

/// A run's rollbacks, oldest first.
pub fn rollbacks(store: &Store, run: &str) -> Result<Vec<Rollback>> {
    db(store, |c| {
        let mut stmt = c.prepare(
            "SELECT at_ms, to_step, from_step, checkpoint FROM run_rollbacks WHERE run_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt
            .query_map(params![run], |r| {
                Ok(Rollback {
                    at_ms: r.get(0)?,
                    to_step: r.get(1)?,
                    from_step: r.get(2)?,
                    checkpoint: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })
}

/// Move a run to another sandbox (a fork runs in a clone of its parent's).
pub fn set_sandbox(store: &Store, run: &str, sandbox: &str) -> Result<()> {
    db(store, |c| {
        c.execute(
            "UPDATE runs SET sandbox = ?2 WHERE id = ?1",
            params![run, sandbox],
        )?;
        Ok(())
    })
}

/// Tag run `id` as started by schedule `name` (`berth schedule`).
pub fn tag_schedule(store: &Store, id: &str, name: &str) -> Result<()> {
    db(store, |c| {
        c.execute(
            "UPDATE runs SET schedule = ?2 WHERE id = ?1",
            params![id, name],
        )?;
        Ok(())
    })
}

/// The newest run schedule `name` started: its id, where it stands, and
/// the pid of the process that owns it (none once it stopped).
pub fn last_of_schedule(
    store: &Store,
    name: &str,
) -> Result<Option<(String, RunState, Option<i64>)>> {
    let row: Option<(String, String, Option<i64>)> = db(store, |c| {
        Ok(c.query_row(
            "SELECT id, state, owner_pid FROM runs WHERE schedule = ?1 ORDER BY created_ms DESC LIMIT 1",
            params![name],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?)
    })?;
    row.map(|(id, state, pid)| Ok((id, RunState::parse(&state)?, pid)))
        .transpose()
}

/// How many runs schedule `name` started at or after `since_ms`.
pub fn started_by_schedule_since(store: &Store, name: &str, since_ms: i64) -> Result<i64> {
    db(store, |c| {
        Ok(c.query_row(
            "SELECT COUNT(*) FROM runs WHERE schedule = ?1 AND created_ms >= ?2",
            params![name, since_ms],
            |r| r.get(0),
        )?)
    })
}
