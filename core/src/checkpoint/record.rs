//! Checkpoints in the store: their metadata, manifests and session state,
//! and each sandbox's base.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::backend::BackendKind;

use super::manifest::Manifest;
use crate::error::Result;
use crate::store::CORE;
use crate::store::Store;

/// A checkpoint as `berth sandbox checkpoints` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointRow {
    /// Its id, e.g. `k1a2b3c4d5e`.
    pub id: String,
    /// Backend short name.
    pub backend: BackendKind,
    /// Sandbox name.
    pub sandbox: String,
    /// When, ms since the epoch.
    pub created_ms: i64,
    /// A person's label; labelled checkpoints outlive retention.
    pub label: Option<String>,
    /// The run that took it, and after which step.
    pub run_id: Option<String>,
    /// The step (0: before the first).
    pub step: Option<i64>,
    /// Files in the workspace.
    pub files: i64,
    /// Their bytes.
    pub bytes: i64,
    /// Files and links stored anew.
    pub changed: i64,
    /// Their bytes: what the checkpoint cost.
    pub new_bytes: i64,
    /// How long it took.
    pub took_ms: i64,
    /// Special files left out.
    pub skipped: Vec<String>,
    /// Where it came from when it was copied (a clone's source checkpoint).
    pub origin: Option<String>,
}

const COLUMNS: &str = "id, backend, sandbox, created_ms, label, run_id, step, files, bytes, changed, new_bytes, took_ms, skipped, origin";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CheckpointRow> {
    let skipped: Option<String> = r.get(12)?;
    Ok(CheckpointRow {
        id: r.get(0)?,
        backend: r.get(1)?,
        sandbox: r.get(2)?,
        created_ms: r.get(3)?,
        label: r.get(4)?,
        run_id: r.get(5)?,
        step: r.get(6)?,
        files: r.get(7)?,
        bytes: r.get(8)?,
        changed: r.get(9)?,
        new_bytes: r.get(10)?,
        took_ms: r.get(11)?,
        skipped: skipped
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default(),
        origin: r.get(13)?,
    })
}

/// Record a checkpoint and make its manifest the sandbox's base, in one
/// transaction: a checkpoint is in the store whole or not at all.
pub fn insert(
    store: &Store,
    c: &CheckpointRow,
    manifest: &Manifest,
    session: &[u8],
    set_base: bool,
) -> Result<()> {
    let encoded = manifest.encode();
    store.with_conn(&CORE, |conn| {
        let tx = conn.transaction()?;
        tx.execute(
            &format!("INSERT INTO checkpoints ({COLUMNS}, manifest, session) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"),
            params![
                c.id,
                c.backend,
                c.sandbox,
                c.created_ms,
                c.label,
                c.run_id,
                c.step,
                c.files,
                c.bytes,
                c.changed,
                c.new_bytes,
                c.took_ms,
                (!c.skipped.is_empty()).then(|| serde_json::to_string(&c.skipped).unwrap_or_default()),
                c.origin,
                encoded,
                session,
            ],
        )?;
        if set_base {
            tx.execute(
                "INSERT OR REPLACE INTO checkpoint_bases (backend, sandbox, manifest) VALUES (?1, ?2, ?3)",
                params![c.backend, c.sandbox, encoded],
            )?;
        }
        tx.commit()
    })
}

/// A sandbox's checkpoints, oldest first.
pub fn list(store: &Store, backend: BackendKind, sandbox: &str) -> Result<Vec<CheckpointRow>> {
    store.with_conn(&CORE, |c| {
        let mut st = c.prepare(&format!(
            "SELECT {COLUMNS} FROM checkpoints WHERE backend = ?1 AND sandbox = ?2 ORDER BY created_ms, rowid"
        ))?;
        let rows = st.query_map(params![backend, sandbox], row)?;
        rows.collect()
    })
}

/// A run's checkpoints, by step.
pub fn of_run(store: &Store, run: &str) -> Result<Vec<CheckpointRow>> {
    store.with_conn(&CORE, |c| {
        let mut st = c.prepare(&format!(
            "SELECT {COLUMNS} FROM checkpoints WHERE run_id = ?1 ORDER BY step, created_ms"
        ))?;
        let rows = st.query_map(params![run], row)?;
        rows.collect()
    })
}

/// The checkpoint that holds sandbox `sandbox` as step `step` of run `run`
/// left it: the run's newest at or before that step (a step whose tools
/// could not write has none of its own).
pub fn at_step<'a>(
    checkpoints: &'a [CheckpointRow],
    sandbox: &str,
    step: i64,
) -> Option<&'a CheckpointRow> {
    checkpoints
        .iter()
        .filter(|c| c.step.is_some_and(|s| s <= step) && c.sandbox == sandbox)
        .max_by_key(|c| (c.step, c.created_ms))
}

/// One checkpoint, with its manifest and session state.
pub fn get(store: &Store, id: &str) -> Result<Option<(CheckpointRow, Manifest, Vec<u8>)>> {
    let found = store.with_conn(&CORE, |c| {
        c.query_row(
            &format!("SELECT {COLUMNS}, manifest, session FROM checkpoints WHERE id = ?1"),
            params![id],
            |r| Ok((row(r)?, r.get::<_, Vec<u8>>(14)?, r.get::<_, Vec<u8>>(15)?)),
        )
        .optional()
    })?;
    match found {
        Some((r, m, s)) => Ok(Some((r, Manifest::decode(&m)?, s))),
        None => Ok(None),
    }
}

/// A sandbox's base manifest.
pub fn base(store: &Store, backend: BackendKind, sandbox: &str) -> Result<Option<Manifest>> {
    let found: Option<Vec<u8>> = store.with_conn(&CORE, |c| {
        c.query_row(
            "SELECT manifest FROM checkpoint_bases WHERE backend = ?1 AND sandbox = ?2",
            params![backend, sandbox],
            |r| r.get(0),
        )
        .optional()
    })?;
    found.map(|m| Manifest::decode(&m)).transpose()
}

/// Set a sandbox's base manifest (after a restore).
pub fn set_base(store: &Store, backend: BackendKind, sandbox: &str, m: &Manifest) -> Result<()> {
    store.with_conn(&CORE, |c| {
        c.execute(
            "INSERT OR REPLACE INTO checkpoint_bases (backend, sandbox, manifest) VALUES (?1, ?2, ?3)",
            params![backend, sandbox, m.encode()],
        )
        .map(|_| ())
    })
}

/// The packs every kept checkpoint of a sandbox and its base still name.
pub fn packs_in_use(
    store: &Store,
    backend: BackendKind,
    sandbox: &str,
) -> Result<std::collections::BTreeSet<String>> {
    let blobs: Vec<Vec<u8>> = store.with_conn(&CORE, |c| {
        let mut st = c.prepare(
            "SELECT manifest FROM checkpoints WHERE backend = ?1 AND sandbox = ?2
             UNION ALL SELECT manifest FROM checkpoint_bases WHERE backend = ?1 AND sandbox = ?2",
        )?;
        let rows = st.query_map(params![backend, sandbox], |r| r.get(0))?;
        rows.collect()
    })?;
    let mut packs = std::collections::BTreeSet::new();
    for b in blobs {
        packs.extend(Manifest::decode(&b)?.packs());
    }
    Ok(packs)
}

/// Forget checkpoints by id.
pub fn delete(store: &Store, ids: &[String]) -> Result<()> {
    store.with_conn(&CORE, |c| {
        let tx = c.transaction()?;
        for id in ids {
            tx.execute("DELETE FROM checkpoints WHERE id = ?1", params![id])?;
        }
        tx.commit()
    })
}

/// Forget every checkpoint of a sandbox and its base (it was removed).
pub fn forget_sandbox(store: &Store, backend: BackendKind, sandbox: &str) -> Result<()> {
    store.with_conn(&CORE, |c| {
        let tx = c.transaction()?;
        tx.execute(
            "DELETE FROM checkpoints WHERE backend = ?1 AND sandbox = ?2",
            params![backend, sandbox],
        )?;
        tx.execute(
            "DELETE FROM checkpoint_bases WHERE backend = ?1 AND sandbox = ?2",
            params![backend, sandbox],
        )?;
        tx.commit()
    })
}

/// Which of `rows` (a sandbox's, oldest first) retention lets go: past the
/// newest `keep` of each run (and of those taken by hand), unless labelled;
/// then the oldest unlabelled ones while the rest hold more than `budget`.
pub fn expired(rows: &[CheckpointRow], keep: usize, budget: u64) -> Vec<String> {
    use std::collections::HashMap;
    let mut seen: HashMap<Option<&str>, usize> = HashMap::new();
    let mut gone = std::collections::BTreeSet::new();
    for r in rows.iter().rev() {
        if r.label.is_some() {
            continue;
        }
        let n = seen.entry(r.run_id.as_deref()).or_default();
        *n += 1;
        if *n > keep {
            gone.insert(r.id.clone());
        }
    }
    let mut held: u64 = rows
        .iter()
        .filter(|r| !gone.contains(&r.id))
        .map(|r| r.new_bytes.max(0) as u64)
        .sum();
    for r in rows {
        if held <= budget {
            break;
        }
        if r.label.is_none() && gone.insert(r.id.clone()) {
            held = held.saturating_sub(r.new_bytes.max(0) as u64);
        }
    }
    rows.iter()
        .filter(|r| gone.contains(&r.id))
        .map(|r| r.id.clone())
        .collect()
}

/// A fresh checkpoint id.
pub fn new_id() -> String {
    let n: u64 = rand::random();
    format!("k{:010x}", n >> 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: &str, run: Option<&str>, label: Option<&str>, bytes: i64) -> CheckpointRow {
        CheckpointRow {
            id: id.into(),
            backend: BackendKind::Local,
            sandbox: "s".into(),
            created_ms: 0,
            label: label.map(String::from),
            run_id: run.map(String::from),
            step: None,
            files: 0,
            bytes: 0,
            changed: 0,
            new_bytes: bytes,
            took_ms: 0,
            skipped: vec![],
            origin: None,
        }
    }

    #[test]
    fn retention_keeps_the_newest_per_run_and_every_label_within_the_budget() {
        let rows = vec![
            r("a", None, None, 10),
            r("b", None, Some("keep me"), 10),
            r("c", None, None, 10),
            r("d", Some("run1"), None, 10),
            r("e", None, None, 10),
            r("f", Some("run1"), None, 10),
        ];
        assert_eq!(expired(&rows, 2, u64::MAX), vec!["a".to_string()]);
        assert_eq!(expired(&rows, 1, u64::MAX), vec!["a", "c", "d"]);
        // A budget of 30 bytes: the oldest unlabelled go until 30 are held.
        assert_eq!(expired(&rows, 10, 30), vec!["a", "c", "d"]);
    }
}
