//! Each crate keeps its own tables (`berth_core::store::Schema`): a new
//! database gets them from each crate's schema, and a database made while
//! all tables were one numbered list (`LEGACY`) gets there through that
//! list. Both roads must end at the same tables, columns, indexes and
//! triggers, and an old database's rows must read through the new code.

use std::collections::BTreeMap;
use std::path::Path;

use berth_core::store::{CORE, LEGACY, Schema, Store};
use rusqlite::Connection;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Every crate's schema.
fn schemas() -> [&'static Schema; 5] {
    [
        &CORE,
        &berth_agent::tables::TABLES,
        &berth_agent::history::TABLES,
        &berth_tools::memory::TABLES,
        &berth_schedules::TABLES,
    ]
}

/// Open the store and make every crate's tables, as their first use would.
fn open_all(dir: &Path) -> Result<Store, Box<dyn std::error::Error>> {
    let store = Store::open(dir)?;
    for s in schemas() {
        store.with_db(s, |_| Ok(()))?;
    }
    Ok(store)
}

/// The database's shape: each table's columns (name, type, not null,
/// default, primary key), and each index's and trigger's SQL.
fn shape(path: &Path) -> Result<BTreeMap<String, String>, Box<dyn std::error::Error>> {
    let c = Connection::open(path)?;
    let mut out = BTreeMap::new();
    let mut stmt = c.prepare(
        "SELECT type, name, tbl_name, sql FROM sqlite_master
         WHERE name NOT LIKE 'sqlite_%' AND name != 'schema_parts' ORDER BY name",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (kind, name, table, sql) in rows {
        let facts = if kind == "table" {
            let mut cols = c.prepare(&format!("PRAGMA table_info(\"{name}\")"))?;
            cols.query_map([], |r| {
                Ok(format!(
                    "{}:{}:{}:{:?}:{}",
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?
            .join(", ")
        } else {
            // An index or a trigger: its SQL, spaces and IF NOT EXISTS aside.
            sql.unwrap_or_default()
                .replace("IF NOT EXISTS ", "")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        out.insert(format!("{kind} {name} on {table}"), facts);
    }
    Ok(out)
}

/// A database as a berth of the one-list days left it at `version`.
fn old_database(dir: &Path, version: usize) -> TestResult {
    let c = Connection::open(dir.join("berth.db"))?;
    for m in &LEGACY[..version] {
        c.execute_batch(m)?;
    }
    c.pragma_update(None, "user_version", version as i64)?;
    Ok(())
}

#[test]
fn a_new_and_an_upgraded_database_end_at_the_same_tables() -> TestResult {
    let fresh = tempfile::tempdir()?;
    drop(open_all(fresh.path())?);
    let fresh_shape = shape(&fresh.path().join("berth.db"))?;
    assert!(
        fresh_shape.contains_key("table runs on runs")
            && fresh_shape.contains_key("table schedules on schedules")
            && fresh_shape.contains_key("table memory_notes on memory_notes")
            && fresh_shape.contains_key("table jobs on jobs"),
        "a new database lacks a crate's tables: {:?}",
        fresh_shape.keys().collect::<Vec<_>>()
    );
    // Every version the one list ever had, from an empty file to its last.
    for version in [1, 4, 7, LEGACY.len()] {
        let old = tempfile::tempdir()?;
        old_database(old.path(), version)?;
        drop(open_all(old.path())?);
        let old_shape = shape(&old.path().join("berth.db"))?;
        for (k, v) in &fresh_shape {
            assert_eq!(
                old_shape.get(k),
                Some(v),
                "{k} differs between a new database and one upgraded from version {version}"
            );
        }
        assert_eq!(
            old_shape.len(),
            fresh_shape.len(),
            "an upgraded database (from {version}) has other tables: {:?}",
            old_shape.keys().collect::<Vec<_>>()
        );
    }
    Ok(())
}

#[test]
fn an_old_databases_rows_read_through_each_crates_code() -> TestResult {
    let old = tempfile::tempdir()?;
    old_database(old.path(), LEGACY.len())?;
    {
        let c = Connection::open(old.path().join("berth.db"))?;
        c.execute_batch(
            "INSERT INTO runs (id, created_ms, updated_ms, task, backend, sandbox, state, setup, schedule)
               VALUES ('r1', 1, 1, 'nightly', 'local', 'default', 'done', '{}', 'nightly');
             INSERT INTO schedules (name, cron, tz, task, args, missed, created_ms)
               VALUES ('nightly', '0 3 * * *', 'UTC', 'nightly', '[]', 'skip', 1);
             INSERT INTO memory_notes (text, author, created_ms) VALUES ('prod runs postgres 16', 'user', 1);",
        )?;
    }
    let store = open_all(old.path())?;
    let run = berth_agent::journal::run(&store, "r1")?.ok_or("the old run is gone")?;
    assert_eq!(run.task, "nightly");
    let last = berth_agent::journal::last_of_schedule(&store, "nightly")?;
    assert_eq!(last.map(|(id, ..)| id).as_deref(), Some("r1"));
    let s = berth_schedules::list(&store)?;
    assert_eq!(
        s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["nightly"]
    );
    for s in schemas() {
        assert_eq!(
            store.schema_version(s.owner)?,
            s.versions.len() as i64,
            "{}",
            s.owner
        );
    }
    Ok(())
}

#[test]
fn a_schema_newer_than_this_berth_is_refused_by_name() -> TestResult {
    let dir = tempfile::tempdir()?;
    drop(open_all(dir.path())?);
    {
        let c = Connection::open(dir.path().join("berth.db"))?;
        c.execute(
            "UPDATE schema_parts SET version = 99 WHERE owner = 'schedules'",
            [],
        )?;
    }
    let store = Store::open(dir.path())?;
    let e = match berth_schedules::list(&store) {
        Ok(_) => return Err("a newer schedules schema was used".into()),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("schedules") && e.contains("newer"), "{e}");
    // The other crates' tables are not held up by it.
    assert!(berth_agent::journal::runs(&store, 5)?.is_empty());
    Ok(())
}
