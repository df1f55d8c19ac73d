//! Jobs in the state store: one row per job, written before each transition
//! is acted on.

use rusqlite::{OptionalExtension, params};

use super::{Job, JobState};
use crate::backend::TermSize;
use crate::error::{Error, Result};
use crate::store::CORE;
use crate::store::{Event, Store};

const COLUMNS: &str = "id, name, backend, sandbox, command, state, exit_code, pid, created_at, ended_at, reason, watch, scan_offset, out_bytes, kill_signal, pty";

fn row_to_job(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    let watch: String = r.get(11)?;
    Ok(Job {
        id: r.get(0)?,
        name: r.get(1)?,
        backend: r.get(2)?,
        sandbox: r.get(3)?,
        command: r.get(4)?,
        state: JobState::parse(&r.get::<_, String>(5)?),
        exit_code: r.get(6)?,
        pid: r.get(7)?,
        created_at: r.get(8)?,
        ended_at: r.get(9)?,
        reason: r.get(10)?,
        watch: serde_json::from_str(&watch).unwrap_or_default(),
        scan_offset: r.get(12)?,
        out_bytes: r.get(13)?,
        kill_signal: r.get(14)?,
        pty: r.get::<_, Option<String>>(15)?.and_then(|s| s.parse().ok()),
    })
}

impl Store {
    pub(super) fn insert_job(&self, j: &Job) -> Result<()> {
        let watch = serde_json::to_string(&j.watch).map_err(|e| Error::Store(e.to_string()))?;
        self.with_conn(&CORE, |c| {
            c.execute(
                &format!("INSERT INTO jobs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"),
                params![
                    j.id, j.name, j.backend, j.sandbox, j.command, j.state.as_str(), j.exit_code, j.pid,
                    j.created_at, j.ended_at, j.reason, watch, j.scan_offset, j.out_bytes, j.kill_signal,
                    j.pty.map(|p| p.to_string())
                ],
            )
        })?;
        Ok(())
    }

    /// Write a job's row, unless it has ended already: the first to record an
    /// ending wins (several waiters may see the same end: `berth serve`'s, a
    /// `job wait`, an `events --follow`). Returns whether the row changed.
    pub(super) fn save_job(&self, j: &Job) -> Result<bool> {
        let changed = self.with_conn(&CORE, |c| {
            c.execute(
                "UPDATE jobs SET state = ?2, exit_code = ?3, pid = ?4, ended_at = ?5,
                        reason = COALESCE(?6, reason), scan_offset = MAX(scan_offset, ?7), out_bytes = ?8,
                        kill_signal = COALESCE(?9, kill_signal)
                 WHERE id = ?1 AND state IN ('starting', 'running', 'unknown')",
                params![
                    j.id,
                    j.state.as_str(),
                    j.exit_code,
                    j.pid,
                    j.ended_at,
                    j.reason,
                    j.scan_offset,
                    j.out_bytes,
                    j.kill_signal
                ],
            )
        })?;
        Ok(changed > 0)
    }

    /// Mark a job's output from `from` to `to` as scanned for its watch
    /// patterns and record `events` (its matches there), in one transaction,
    /// only if the job's scan offset is still `from`. False: another refresh
    /// scanned it first (a restarted server catching up while a `job wait`
    /// or an `events --follow` refreshes too), and nothing was recorded, so
    /// each match is on record once.
    pub(super) fn record_scan(
        &self,
        id: &str,
        from: i64,
        to: i64,
        events: &[Event],
    ) -> Result<bool> {
        self.append_claimed(
            |c| {
                c.execute(
                    "UPDATE jobs SET scan_offset = ?3 WHERE id = ?1 AND scan_offset = ?2",
                    params![id, from, to],
                )
                .map(|n| n > 0)
            },
            events,
        )
    }

    /// Forget a job that has ended (`job prune`); a running one stays.
    pub(super) fn delete_job(&self, id: &str) -> Result<()> {
        self.with_conn(&CORE, |c| {
            c.execute(
                "DELETE FROM jobs WHERE id = ?1 AND state NOT IN ('starting', 'running')",
                params![id],
            )
        })?;
        Ok(())
    }

    /// How far a job's output has been scanned, as the store has it.
    pub(super) fn scan_offset(&self, id: &str) -> Result<i64> {
        self.with_conn(&CORE, |c| {
            c.query_row(
                "SELECT scan_offset FROM jobs WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
        })
    }

    /// Record whether berth could check on an unfinished job: `unknown`
    /// with why not, or back to `running` (the reason cleared) once it could.
    pub(super) fn note_reach(&self, j: &Job) -> Result<bool> {
        let changed = self.with_conn(&CORE, |c| {
            c.execute(
                "UPDATE jobs SET state = ?2, reason = ?3, out_bytes = ?4
                 WHERE id = ?1 AND state IN ('starting', 'running', 'unknown')",
                params![j.id, j.state.as_str(), j.reason, j.out_bytes],
            )
        })?;
        Ok(changed > 0)
    }

    /// Jobs an earlier berth recorded as `lost` only because their sandbox
    /// could not be reached (it never checked the process): `unknown`
    /// again, so the next look checks them.
    pub(super) fn reopen_unchecked(&self) -> Result<usize> {
        self.with_conn(&CORE, |c| {
            c.execute(
                "UPDATE jobs SET state = 'unknown', ended_at = NULL
                 WHERE state = 'lost' AND reason LIKE ?1",
                params![format!("{}%", super::UNAVAILABLE)],
            )
        })
    }

    /// Record how a kill ended a job (the signal that took it, and why), whether
    /// or not its ending is on record yet: a waiter may have recorded the
    /// ending first, without the kill's account.
    pub(super) fn note_kill(&self, j: &Job) -> Result<()> {
        self.with_conn(&CORE, |c| {
            c.execute(
                "UPDATE jobs SET kill_signal = ?2, reason = COALESCE(?3, reason) WHERE id = ?1",
                params![j.id, j.kill_signal, j.reason],
            )
        })?;
        Ok(())
    }

    /// Record a terminal job's new size.
    pub(super) fn note_pty(&self, id: &str, size: TermSize) -> Result<()> {
        self.with_conn(&CORE, |c| {
            c.execute(
                "UPDATE jobs SET pty = ?2 WHERE id = ?1",
                params![id, size.to_string()],
            )
        })?;
        Ok(())
    }

    /// A job by id, or by name (the newest job with that name).
    pub fn job(&self, id_or_name: &str) -> Result<Job> {
        let found = self.with_conn(&CORE, |c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1 OR name = ?1 ORDER BY (id = ?1) DESC, created_at DESC LIMIT 1"),
                params![id_or_name],
                row_to_job,
            )
            .optional()
        })?;
        found.ok_or_else(|| Error::NotFound {
            what: "job",
            name: id_or_name.into(),
            hint: "list jobs with `berth job ls`".into(),
        })
    }

    /// All jobs, newest last.
    pub fn jobs(&self) -> Result<Vec<Job>> {
        self.with_conn(&CORE, |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM jobs ORDER BY created_at, id"
            ))?;
            let rows = stmt.query_map([], row_to_job)?;
            rows.collect()
        })
    }
}
