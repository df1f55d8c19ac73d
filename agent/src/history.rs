//! The history: a full-text index (SQLite FTS5) of every run's messages,
//! and the search over it (`history_search`, `berth runs search`). It is
//! brought up to date before each search ([`index`]): what a run journaled
//! since the last search is redacted and indexed in one transaction, so a
//! `kill -9` leaves it either indexed or not, never half. Its tables sit
//! beside the journal's, in this crate, which alone reads both.
//!
//! Who sees what is the memory's rule (`berth_tools::memory::View`): a
//! sandbox's model searches only its sandbox's runs unless the policy says
//! `[tools] memory = "user"`.

use berth_core::store::{Schema, Store};
use berth_tools::Result;
use berth_tools::memory::{Hit, Redact, View, fts_queries};
use rusqlite::{OptionalExtension, params};

/// The index's tables.
pub static TABLES: Schema = Schema {
    owner: "history",
    versions: &[r#"
    CREATE VIRTUAL TABLE IF NOT EXISTS run_search USING fts5(
        text, run_id UNINDEXED, seq UNINDEXED, step UNINDEXED, role UNINDEXED
    );
    CREATE TABLE IF NOT EXISTS run_search_state (
        run_id   TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL
    );
    "#],
};

/// The journal's and the index's tables, read together.
fn db<T>(
    store: &Store,
    f: impl FnOnce(&rusqlite::Connection) -> berth_core::Result<T>,
) -> Result<T> {
    store.with_db(&crate::tables::TABLES, |_| Ok(()))?;
    Ok(store.with_db(&TABLES, f)?)
}

/// The search the tools' registry offers as `history_search`
/// (`Registry::with_history`).
pub struct Journal;

impl berth_tools::memory::History for Journal {
    fn search(
        &self,
        store: &Store,
        view: &View,
        query: &str,
        limit: usize,
        redact: Redact,
    ) -> Result<Vec<Hit>> {
        search_runs(store, view, query, limit, redact)
    }
}

/// Index what runs journaled since the last call, masked by `redact`. The
/// number of messages indexed.
pub fn index(store: &Store, redact: Redact) -> Result<usize> {
    let pending: Vec<(String, i64, i64, String)> = db(store, |c| {
        let mut stmt = c.prepare_cached(
            "SELECT m.run_id, m.seq, m.step, m.body FROM run_messages m
             LEFT JOIN run_search_state s ON s.run_id = m.run_id
             WHERE m.seq > COALESCE(s.last_seq, 0) ORDER BY m.run_id, m.seq",
        )?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })?;
    if pending.is_empty() {
        return Ok(0);
    }
    let rows: Vec<(String, i64, i64, String, String)> = pending
        .into_iter()
        .map(|(run, seq, step, body)| {
            let (role, text) = searchable(&body);
            (run, seq, step, role, redact(&text))
        })
        .collect();
    let n = rows.len();
    store.with_conn(&TABLES, |c| {
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for (run, seq, step, role, text) in &rows {
            // Another berth may have indexed it meanwhile.
            let done: Option<i64> = tx
                .query_row(
                    "SELECT last_seq FROM run_search_state WHERE run_id = ?1",
                    params![run],
                    |r| r.get(0),
                )
                .optional()?;
            if done.is_some_and(|d| d >= *seq) {
                continue;
            }
            if !text.trim().is_empty() {
                tx.execute(
                    "INSERT INTO run_search (text, run_id, seq, step, role) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![text, run, seq, step, role],
                )?;
            }
            tx.execute(
                "INSERT INTO run_search_state (run_id, last_seq) VALUES (?1, ?2)
                 ON CONFLICT(run_id) DO UPDATE SET last_seq = excluded.last_seq",
                params![run, seq],
            )?;
        }
        tx.commit()?;
        Ok(())
    })?;
    Ok(n)
}

/// A journaled message's role and the text worth finding: what was said, and
/// the tool calls made (name and arguments). The journal (berth-agent) writes
/// messages as JSON objects with `role`, `text` and `tool_calls` (`name`,
/// `arguments`); only those fields are read here, so the index does not
/// depend on the agent's types.
fn searchable(body: &str) -> (String, String) {
    #[derive(serde::Deserialize)]
    struct Call {
        #[serde(default)]
        name: String,
        #[serde(default)]
        arguments: String,
    }
    #[derive(serde::Deserialize)]
    struct Journaled {
        role: String,
        #[serde(default)]
        text: String,
        #[serde(default)]
        tool_calls: Vec<Call>,
    }
    let Ok(m) = serde_json::from_str::<Journaled>(body) else {
        return ("unknown".into(), String::new());
    };
    let mut text = m.text;
    for call in &m.tool_calls {
        text.push('\n');
        text.push_str(&call.name);
        text.push(' ');
        text.push_str(&call.arguments);
    }
    (m.role, text)
}

/// Past runs' messages that match `query`, best first, in the runs `view`
/// sees. Indexes first.
pub fn search_runs(
    store: &Store,
    view: &View,
    query: &str,
    limit: usize,
    redact: Redact,
) -> Result<Vec<Hit>> {
    let queries = fts_queries(query)?;
    index(store, redact)?;
    let (b, s) = view.parts();
    let mut found = Vec::new();
    for q in queries {
        found = db(store, |c| {
            let mut stmt = c.prepare_cached(
                "SELECT f.run_id, f.step, f.role, snippet(run_search, 0, '[', ']', '…', 16),
                        r.task, r.backend, r.sandbox, r.created_ms
                 FROM run_search f JOIN runs r ON r.id = f.run_id
                 WHERE run_search MATCH ?3 AND (?1 IS NULL OR (r.backend = ?1 AND r.sandbox = ?2))
                 ORDER BY bm25(run_search), r.created_ms DESC LIMIT ?4",
            )?;
            let rows = stmt
                .query_map(params![b, s, q, limit as i64], |r| {
                    let task: String = r.get(4)?;
                    Ok(Hit {
                        run_id: r.get(0)?,
                        step: r.get(1)?,
                        role: r.get(2)?,
                        snippet: r.get(3)?,
                        task: task.chars().take(80).collect(),
                        backend: r.get(5)?,
                        sandbox: r.get(6)?,
                        created_ms: r.get(7)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })?;
        if !found.is_empty() {
            break;
        }
    }
    for h in &mut found {
        h.snippet = redact(&h.snippet);
        h.task = redact(&h.task);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_empty_query_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let e = search_runs(&store, &View::All, " ?! ", 5, &|t| t.into()).unwrap_err();
        assert!(matches!(e, berth_tools::Error::EmptyQuery), "{e}");
    }
}
