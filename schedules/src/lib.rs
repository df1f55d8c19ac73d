//! Schedules: agent runs that `berth serve` starts on a cron expression.
//!
//! A schedule is a row: its cron expression (5 fields, or 6 with seconds;
//! parsed by `croner`), its time zone (`chrono-tz`), the task and the `berth
//! run` flags to start it with, what to do about slots missed while no server
//! ran (`skip`, or `once`: one run for all of them), and the next slot. Each
//! slot's fate is one row of `schedule_fires`: `started`, `overlap` (a run
//! of the schedule was still going, so none was started), `missed`. A run
//! started by a schedule carries its name (`runs.schedule`).

pub mod runner;

use std::str::FromStr;

use anyhow::{Context, Result, bail};
use berth_agent::journal::{self, RunState};
use berth_core::store::{Schema, Store, now_ms};
use chrono::{TimeZone, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

/// What to do about the slots that passed while no server ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Missed {
    /// Start nothing for them; wait for the next slot.
    Skip,
    /// Start one run for all of them, at once.
    Once,
}

impl Missed {
    /// Its name in the store and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::Once => "once",
        }
    }
}

/// A schedule.
#[derive(Clone, Debug, Serialize)]
pub struct Schedule {
    /// Its name.
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// The time zone it is read in.
    pub tz: String,
    /// The task.
    pub task: String,
    /// `berth run` flags (`--backend docker --sandbox web`...).
    pub args: Vec<String>,
    /// Missed slots.
    pub missed: Missed,
    /// Paused: no slot starts a run.
    pub paused: bool,
    /// The next slot, ms since the epoch.
    pub next_ms: Option<i64>,
    /// Created, ms since the epoch.
    pub created_ms: i64,
}

/// A cron expression as berth reads it: 5 fields, or 6 with seconds first.
pub fn parse_cron(expr: &str) -> Result<Cron> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .with_context(|| {
            format!("{expr:?} is not a cron expression: use 5 fields (minute hour day month weekday, e.g. '0 2 * * *') or 6 with seconds first")
        })
}

/// A time zone by its IANA name (`UTC`, `Europe/Berlin`).
pub fn parse_tz(name: &str) -> Result<chrono_tz::Tz> {
    chrono_tz::Tz::from_str(name).map_err(|_| {
        anyhow::anyhow!(
            "{name:?} is not a time zone: use an IANA name such as UTC or Europe/Berlin"
        )
    })
}

/// The first slot of `cron` in `tz` strictly after `after_ms`.
pub fn next_slot(cron: &str, tz: &str, after_ms: i64) -> Result<i64> {
    let c = parse_cron(cron)?;
    let z = parse_tz(tz)?;
    let t = z
        .timestamp_millis_opt(after_ms)
        .single()
        .context("a time out of range")?;
    let next = c
        .find_next_occurrence(&t, false)
        .with_context(|| format!("{cron:?} has no slot after now"))?;
    Ok(next.with_timezone(&Utc).timestamp_millis())
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Schedule> {
    let args: String = r.get(4)?;
    let missed: String = r.get(5)?;
    Ok(Schedule {
        name: r.get(0)?,
        cron: r.get(1)?,
        tz: r.get(2)?,
        task: r.get(3)?,
        args: serde_json::from_str(&args).unwrap_or_default(),
        missed: if missed == "once" {
            Missed::Once
        } else {
            Missed::Skip
        },
        paused: r.get::<_, i64>(6)? != 0,
        next_ms: r.get(7)?,
        created_ms: r.get(8)?,
    })
}

const COLUMNS: &str = "name, cron, tz, task, args, missed, paused, next_ms, created_ms";

/// Add a schedule; its name must be new.
pub fn add(store: &Store, s: &Schedule) -> Result<()> {
    let next = next_slot(&s.cron, &s.tz, now_ms())?;
    let args = serde_json::to_string(&s.args)?;
    let added = store.with_db(&TABLES, |c| {
        Ok(c.execute(
            "INSERT OR IGNORE INTO schedules (name, cron, tz, task, args, missed, paused, next_ms, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8)",
            params![s.name, s.cron, s.tz, s.task, args, s.missed.as_str(), next, now_ms()],
        )?)
    })?;
    if added == 0 {
        bail!(
            "a schedule `{}` exists; remove it first (`berth schedule rm {}`) or pick another name",
            s.name,
            s.name
        );
    }
    Ok(())
}

/// Every schedule, by name.
pub fn list(store: &Store) -> Result<Vec<Schedule>> {
    Ok(store.with_db(&TABLES, |c| {
        let mut stmt = c.prepare(&format!("SELECT {COLUMNS} FROM schedules ORDER BY name"))?;
        let rows = stmt
            .query_map([], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })?)
}

/// One schedule.
pub fn get(store: &Store, name: &str) -> Result<Schedule> {
    store
        .with_db(&TABLES, |c| {
            Ok(c.query_row(
                &format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"),
                params![name],
                row,
            )
            .optional()?)
        })?
        .with_context(|| format!("no schedule `{name}`; list them with `berth schedule ls`"))
}

/// Remove a schedule and its history.
pub fn remove(store: &Store, name: &str) -> Result<()> {
    get(store, name)?;
    store.with_db(&TABLES, |c| {
        c.execute("DELETE FROM schedule_fires WHERE name = ?1", params![name])?;
        c.execute("DELETE FROM schedules WHERE name = ?1", params![name])?;
        Ok(())
    })?;
    Ok(())
}

/// Pause or resume; a resumed schedule's next slot is after now.
pub fn set_paused(store: &Store, name: &str, paused: bool) -> Result<()> {
    let s = get(store, name)?;
    let next = next_slot(&s.cron, &s.tz, now_ms())?;
    store.with_db(&TABLES, |c| {
        c.execute(
            "UPDATE schedules SET paused = ?2, next_ms = ?3 WHERE name = ?1",
            params![name, paused as i64, next],
        )?;
        Ok(())
    })?;
    Ok(())
}

/// Record slot `slot_ms`'s fate and move the schedule to `next_ms`, at once.
pub fn fired(
    store: &Store,
    name: &str,
    slot_ms: i64,
    outcome: &str,
    note: Option<&str>,
    next_ms: i64,
) -> Result<()> {
    store.with_conn(&TABLES, |c| {
        let tx = c.transaction()?;
        tx.execute(
            "INSERT OR REPLACE INTO schedule_fires (name, slot_ms, fired_ms, outcome, note) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![name, slot_ms, now_ms(), outcome, note],
        )?;
        tx.execute(
            "UPDATE schedules SET next_ms = ?2 WHERE name = ?1",
            params![name, next_ms],
        )?;
        tx.commit()
    })?;
    Ok(())
}

/// One slot's fate.
#[derive(Clone, Debug, Serialize)]
pub struct Fire {
    /// The slot, ms since the epoch.
    pub slot_ms: i64,
    /// When it was dealt with.
    pub fired_ms: i64,
    /// `started`, `overlap` or `missed`.
    pub outcome: String,
    /// Words: the run started, or the run still going.
    pub note: Option<String>,
}

/// A schedule's latest slots, newest first.
pub fn fires(store: &Store, name: &str, limit: usize) -> Result<Vec<Fire>> {
    Ok(store.with_db(&TABLES, |c| {
        let mut stmt = c.prepare(
            "SELECT slot_ms, fired_ms, outcome, note FROM schedule_fires WHERE name = ?1 ORDER BY slot_ms DESC LIMIT ?2",
        )?;
        let rows = stmt
            .query_map(params![name, limit as i64], |r| {
                Ok(Fire {
                    slot_ms: r.get(0)?,
                    fired_ms: r.get(1)?,
                    outcome: r.get(2)?,
                    note: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })?)
}

/// A run of the schedule that is still going (running with a live owner,
/// waiting, or waiting for an approval), or one started in the last
/// `grace_ms` that has not written its journal yet.
pub fn going(store: &Store, name: &str, grace_ms: i64) -> Result<Option<String>> {
    if let Some((id, state, pid)) = journal::last_of_schedule(store, name)? {
        let live = pid.is_some_and(|p| {
            // SAFETY: signal 0 only checks that the process exists.
            p > 0 && unsafe { libc::kill(p as i32, 0) } == 0
        });
        if (state == RunState::Running && live)
            || matches!(state, RunState::Waiting | RunState::AwaitingApproval)
        {
            return Ok(Some(id));
        }
    }
    let just: Option<i64> = store.with_db(&TABLES, |c| {
        Ok(c.query_row(
            "SELECT fired_ms FROM schedule_fires WHERE name = ?1 AND outcome = 'started' ORDER BY fired_ms DESC LIMIT 1",
            params![name],
            |r| r.get(0),
        )
        .optional()?)
    })?;
    let Some(t) = just else {
        return Ok(None);
    };
    let started_since = journal::started_by_schedule_since(store, name, t).unwrap_or(0);
    Ok((started_since == 0 && now_ms() - t < grace_ms).then(|| "(starting)".to_string()))
}

/// Tag run `id` as started by schedule `name`.
pub fn tag_run(store: &Store, id: &str, name: &str) -> Result<()> {
    Ok(journal::tag_schedule(store, id, name)?)
}

/// The schedules' tables: each schedule, and each slot's fate. This crate
/// makes them on first use (see `berth_core::store::Schema`); the run a
/// slot started carries the schedule's name in the agent's journal
/// (`berth_agent::journal::tag_schedule`).
pub static TABLES: Schema = Schema {
    owner: "schedules",
    versions: &[r#"
    CREATE TABLE IF NOT EXISTS schedules (
        name        TEXT PRIMARY KEY,
        cron        TEXT NOT NULL,
        tz          TEXT NOT NULL,
        task        TEXT NOT NULL,
        args        TEXT NOT NULL,
        missed      TEXT NOT NULL,
        paused      INTEGER NOT NULL DEFAULT 0,
        next_ms     INTEGER,
        created_ms  INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS schedule_fires (
        name     TEXT NOT NULL,
        slot_ms  INTEGER NOT NULL,
        fired_ms INTEGER NOT NULL,
        outcome  TEXT NOT NULL,
        note     TEXT,
        PRIMARY KEY (name, slot_ms)
    );
    "#],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_and_six_fields_and_time_zones() -> Result<()> {
        // 2026-01-01T00:00:00Z.
        let t0 = 1_767_225_600_000;
        assert_eq!(next_slot("0 2 * * *", "UTC", t0)?, t0 + 2 * 3_600_000);
        assert_eq!(next_slot("*/10 * * * * *", "UTC", t0)?, t0 + 10_000);
        // 02:00 in Berlin (UTC+1 in winter) is 01:00 UTC.
        assert_eq!(next_slot("0 2 * * *", "Europe/Berlin", t0)?, t0 + 3_600_000);
        assert!(parse_cron("every night").is_err());
        assert!(parse_tz("Mars/Olympus").is_err());
        Ok(())
    }
}
