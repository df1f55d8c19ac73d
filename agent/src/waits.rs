//! Triggers: a run that waits for an event, durably. A wait is one row per
//! run (`run_waits`): what it waits for (a job's end, a line of its output
//! matching a pattern, an approval's answer, a deadline: the first of them
//! wakes it), and, once it fired, what happened. The run itself holds no
//! process while it waits: `berth serve` checks the waits, writes the
//! outcome, and resumes the run (see the server's `waits` module).

use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use crate::error::Result;
use crate::journal::db;
use berth_core::store::{Store, now_ms};

/// What a run waits for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wait {
    /// The run.
    pub run_id: String,
    /// The `wait_for` call that waits; `None` for a person's `--on`.
    pub call_id: Option<String>,
    /// A job (its id).
    pub job: Option<String>,
    /// A regular expression over that job's output lines.
    pub pattern: Option<String>,
    /// An approval.
    pub approval: Option<i64>,
    /// When to stop waiting, ms since the epoch.
    pub deadline_ms: Option<i64>,
    /// How far the job's output has been searched.
    pub log_offset: i64,
    /// When it began.
    pub created_ms: i64,
    /// When it fired.
    pub woke_ms: Option<i64>,
    /// What happened (JSON), once it fired.
    pub outcome: Option<Value>,
    /// When the run was started again.
    pub resumed_ms: Option<i64>,
}

const COLUMNS: &str = "run_id, call_id, job, pattern, approval, deadline_ms, log_offset, created_ms, woke_ms, outcome, resumed_ms";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Wait> {
    let outcome: Option<String> = r.get(9)?;
    Ok(Wait {
        run_id: r.get(0)?,
        call_id: r.get(1)?,
        job: r.get(2)?,
        pattern: r.get(3)?,
        approval: r.get(4)?,
        deadline_ms: r.get(5)?,
        log_offset: r.get(6)?,
        created_ms: r.get(7)?,
        woke_ms: r.get(8)?,
        outcome: outcome.and_then(|o| serde_json::from_str(&o).ok()),
        resumed_ms: r.get(10)?,
    })
}

/// Start waiting (replacing a wait the run had before).
pub fn put(store: &Store, w: &Wait) -> Result<()> {
    db(store, |c| {
        c.execute(
            "INSERT OR REPLACE INTO run_waits (run_id, call_id, job, pattern, approval, deadline_ms, log_offset, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![w.run_id, w.call_id, w.job, w.pattern, w.approval, w.deadline_ms, w.log_offset, now_ms()],
        )?;
        Ok(())
    })
}

/// A run's wait.
pub fn of_run(store: &Store, run: &str) -> Result<Option<Wait>> {
    db(store, |c| {
        Ok(c.query_row(
            &format!("SELECT {COLUMNS} FROM run_waits WHERE run_id = ?1"),
            params![run],
            row,
        )
        .optional()?)
    })
}

/// Waits that have not fired, and fired ones whose run was not started
/// again (the server died in between).
pub fn open(store: &Store) -> Result<Vec<Wait>> {
    db(store, |c| {
        let mut stmt = c.prepare(&format!(
            "SELECT {COLUMNS} FROM run_waits WHERE resumed_ms IS NULL ORDER BY created_ms"
        ))?;
        let rows = stmt
            .query_map([], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })
}

/// How far a job's output has been searched.
pub fn set_offset(store: &Store, run: &str, offset: i64) -> Result<()> {
    db(store, |c| {
        c.execute(
            "UPDATE run_waits SET log_offset = ?2 WHERE run_id = ?1",
            params![run, offset],
        )?;
        Ok(())
    })
}

/// The wait fired with `outcome`; false if it had already.
pub fn wake(store: &Store, run: &str, outcome: &Value) -> Result<bool> {
    db(store, |c| {
        Ok(c.execute(
            "UPDATE run_waits SET woke_ms = ?2, outcome = ?3 WHERE run_id = ?1 AND woke_ms IS NULL",
            params![run, now_ms(), outcome.to_string()],
        )? == 1)
    })
}

/// The run was started again after its wait fired.
pub fn resumed(store: &Store, run: &str) -> Result<()> {
    db(store, |c| {
        c.execute(
            "UPDATE run_waits SET resumed_ms = ?2 WHERE run_id = ?1",
            params![run, now_ms()],
        )?;
        Ok(())
    })
}

/// The run took its wait's outcome: the wait is gone.
pub fn done(store: &Store, run: &str) -> Result<()> {
    db(store, |c| {
        c.execute("DELETE FROM run_waits WHERE run_id = ?1", params![run])?;
        Ok(())
    })
}

/// The words for what happened, for the model and for people.
pub fn describe(outcome: &Value) -> String {
    let job = outcome["job"].as_str().unwrap_or("?");
    match outcome["woke"].as_str() {
        Some("job_end") => format!(
            "job {job} ended: {}{}",
            outcome["state"].as_str().unwrap_or("ended"),
            outcome["exit_code"]
                .as_i64()
                .map(|c| format!(" with exit code {c}"))
                .unwrap_or_default()
        ),
        Some("pattern") => format!(
            "job {job}'s output matched `{}`: {}",
            outcome["pattern"].as_str().unwrap_or(""),
            outcome["line"].as_str().unwrap_or("")
        ),
        Some("approval") => format!(
            "approval #{} was answered: {}",
            outcome["approval"],
            outcome["state"].as_str().unwrap_or("?")
        ),
        Some("timeout") => format!(
            "the wait timed out after {} s{}",
            outcome["waited_s"],
            if outcome["job"].is_string() {
                format!("; job {job} is still running")
            } else {
                String::new()
            }
        ),
        _ => format!("the wait ended: {outcome}"),
    }
}
