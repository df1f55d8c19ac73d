//! Warm pools: sandboxes made ahead of time, with their shell started, so
//! that `sandbox create --from-pool` costs a store write and not a
//! container start.
//!
//! A sandbox's name is also its backend's handle (docker names its
//! container and volumes from it, k8s its objects), and neither can be
//! renamed. So a member is made under a name of its own,
//! `pool-POOL-RANDOM`, and a sandbox taken from a pool records that name as
//! its *instance* ([`INSTANCE`] in its options): the runtime gives the
//! backend the instance ([`on_backend`]) and shows everyone else the
//! sandbox's own name ([`Aliased`]).
//!
//! The tables: `pools` (a pool's backend, size and the settings every
//! member is made with) and `pool_members` (each member, `making` until it
//! is provisioned and its shell is up, then `ready`). A member is written
//! before it is made, so a berth killed mid-make finishes it (a provision is
//! idempotent) or removes it, and never leaks it. Taking a member, deleting
//! its row and writing the new sandbox's row are one transaction: two
//! claims never get one member.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::backend::{BackendKind, Layout, Process, Sandbox, SandboxSpec, SpawnOpts};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::store::{Schema, Store};

/// The option that names a sandbox's instance: the backend-side name of
/// the member it was taken from. Set by berth, never by a caller.
pub const INSTANCE: &str = "instance";

/// The backends a pool can be made on.
pub const POOL_BACKENDS: &[BackendKind] = &[BackendKind::Docker, BackendKind::K8s];

/// The pools' tables.
pub static POOLS: Schema = Schema {
    owner: "pools",
    versions: &[r#"
    CREATE TABLE IF NOT EXISTS pools (
        name        TEXT PRIMARY KEY,
        backend     TEXT NOT NULL,
        size        INTEGER NOT NULL,
        spec        TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS pool_members (
        backend     TEXT NOT NULL,
        instance    TEXT NOT NULL,
        pool        TEXT NOT NULL,
        state       TEXT NOT NULL CHECK (state IN ('making', 'ready')),
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (backend, instance)
    );
    CREATE INDEX IF NOT EXISTS pool_members_pool ON pool_members(pool, state);
    "#],
};

/// A pool as recorded.
#[derive(Clone, Debug, Serialize)]
pub struct PoolRow {
    /// Its name.
    pub name: String,
    /// The backend its members are made on.
    pub backend: BackendKind,
    /// How many ready members it keeps.
    pub size: u32,
    /// The settings every member is made with (its name unused).
    pub spec: SandboxSpec,
    /// When it was made, ms since the epoch.
    pub created_at: i64,
}

/// A member of a pool as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Its backend-side name.
    pub instance: String,
    /// `making` or `ready`.
    pub state: String,
}

/// A pool's name: letters, digits, '-' and '_', at most 40.
pub fn check_pool_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 40
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Error::InvalidInput(format!(
            "pool name {name:?}: use 1 to 40 letters, digits, '-' or '_', e.g. `agents`"
        )));
    }
    Ok(())
}

/// A fresh member's name in pool `pool`.
pub fn member_name(pool: &str) -> String {
    let n: u32 = rand::random();
    format!("pool-{pool}-{n:08x}")
}

/// The spec as the backend knows the sandbox: under its instance's name
/// when it was taken from a pool, without berth's own option.
pub fn on_backend(spec: &SandboxSpec) -> Cow<'_, SandboxSpec> {
    match spec.option(INSTANCE) {
        Some(instance) => {
            let mut s = spec.clone();
            s.name = instance.to_string();
            s.options.remove(INSTANCE);
            Cow::Owned(s)
        }
        None => Cow::Borrowed(spec),
    }
}

/// The backend-side name of a recorded sandbox.
pub fn instance_of(spec: &SandboxSpec) -> &str {
    spec.option(INSTANCE).unwrap_or(&spec.name)
}

/// A sandbox shown under another name than its backend's: one taken from a
/// pool is its member underneath, and every message says its own name.
pub struct Aliased {
    inner: Arc<dyn Sandbox>,
    name: String,
}

impl Aliased {
    /// `inner`, named `name`. A sandbox already named so is returned as is.
    pub fn wrap(inner: Arc<dyn Sandbox>, name: &str) -> Arc<dyn Sandbox> {
        if inner.name() == name {
            return inner;
        }
        Arc::new(Aliased {
            inner,
            name: name.to_string(),
        })
    }
}

#[async_trait]
impl Sandbox for Aliased {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn layout(&self) -> &Layout {
        self.inner.layout()
    }
    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        self.inner.spawn(argv, opts).await
    }
    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        self.inner.read_file(path, limit).await
    }
    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        self.inner.write_file(path, data, mode).await
    }
    async fn alive(&self) -> Result<bool> {
        self.inner.alive().await
    }
    async fn destroy(&self) -> Result<()> {
        self.inner.destroy().await
    }
    fn host_processes(&self) -> bool {
        self.inner.host_processes()
    }
    fn sandbox_procs(&self) -> crate::procs::SandboxProcs {
        self.inner.sandbox_procs()
    }
    fn memory(&self) -> Option<crate::backend::MemoryState> {
        self.inner.memory()
    }
}

fn to_json(spec: &SandboxSpec) -> Result<String> {
    serde_json::to_string(spec).map_err(|e| Error::Store(e.to_string()))
}

fn from_json(text: &str) -> rusqlite::Result<SandboxSpec> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn row_to_pool(r: &rusqlite::Row<'_>) -> rusqlite::Result<PoolRow> {
    Ok(PoolRow {
        name: r.get(0)?,
        backend: r.get(1)?,
        size: r.get(2)?,
        spec: from_json(&r.get::<_, String>(3)?)?,
        created_at: r.get(4)?,
    })
}

/// Record a new pool; an existing one of that name is an error.
pub fn put_pool(store: &Store, pool: &PoolRow) -> Result<()> {
    let json = to_json(&pool.spec)?;
    let added = store.with_conn(&POOLS, |c| {
        c.execute(
            "INSERT INTO pools (name, backend, size, spec, created_at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(name) DO NOTHING",
            params![pool.name, pool.backend, pool.size, json, pool.created_at],
        )
    })?;
    if added == 0 {
        return Err(Error::InvalidInput(format!(
            "pool `{}` exists; remove it first (`berth pool rm {}`) or pick another name",
            pool.name, pool.name
        )));
    }
    Ok(())
}

/// A pool by name.
pub fn pool(store: &Store, name: &str) -> Result<Option<PoolRow>> {
    store.with_conn(&POOLS, |c| {
        c.query_row(
            "SELECT name, backend, size, spec, created_at FROM pools WHERE name = ?1",
            [name],
            row_to_pool,
        )
        .optional()
    })
}

/// Every pool, by name.
pub fn pools(store: &Store) -> Result<Vec<PoolRow>> {
    store.with_conn(&POOLS, |c| {
        let mut stmt =
            c.prepare("SELECT name, backend, size, spec, created_at FROM pools ORDER BY name")?;
        stmt.query_map([], row_to_pool)?.collect()
    })
}

/// Forget a pool (its members stay until each is removed).
pub fn delete_pool(store: &Store, name: &str) -> Result<bool> {
    Ok(store.with_conn(&POOLS, |c| {
        c.execute("DELETE FROM pools WHERE name = ?1", [name])
    })? > 0)
}

/// A pool's members, oldest first.
pub fn members(store: &Store, backend: BackendKind, pool: &str) -> Result<Vec<Member>> {
    store.with_conn(&POOLS, |c| {
        let mut stmt = c.prepare(
            "SELECT instance, state FROM pool_members WHERE backend = ?1 AND pool = ?2
             ORDER BY created_at, instance",
        )?;
        stmt.query_map(params![backend, pool], |r| {
            Ok(Member {
                instance: r.get(0)?,
                state: r.get(1)?,
            })
        })?
        .collect()
    })
}

/// The backend-side names of every member on `backend`, of any pool.
pub fn member_instances(store: &Store, backend: BackendKind) -> Result<Vec<String>> {
    store.with_conn(&POOLS, |c| {
        let mut stmt = c.prepare("SELECT instance FROM pool_members WHERE backend = ?1")?;
        stmt.query_map([backend], |r| r.get(0))?.collect()
    })
}

/// Record a member about to be made.
pub fn add_member(store: &Store, backend: BackendKind, pool: &str, instance: &str) -> Result<()> {
    store.with_conn(&POOLS, |c| {
        c.execute(
            "INSERT INTO pool_members (backend, instance, pool, state, created_at)
             VALUES (?1, ?2, ?3, 'making', ?4)",
            params![backend, instance, pool, now_ms()],
        )
    })?;
    Ok(())
}

/// Mark a member ready. False when it is no longer on record (its pool was
/// removed meanwhile).
pub fn mark_ready(store: &Store, backend: BackendKind, instance: &str) -> Result<bool> {
    Ok(store.with_conn(&POOLS, |c| {
        c.execute(
            "UPDATE pool_members SET state = 'ready' WHERE backend = ?1 AND instance = ?2",
            params![backend, instance],
        )
    })? > 0)
}

/// Forget a member.
pub fn delete_member(store: &Store, backend: BackendKind, instance: &str) -> Result<bool> {
    Ok(store.with_conn(&POOLS, |c| {
        c.execute(
            "DELETE FROM pool_members WHERE backend = ?1 AND instance = ?2",
            params![backend, instance],
        )
    })? > 0)
}

/// What [`take_member`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The sandbox is recorded, on this member.
    Member(String),
    /// The pool had no ready member; nothing was written.
    Empty,
    /// A sandbox of that name is on record; nothing was written.
    Exists,
}

/// In one transaction: take the oldest ready member of `pool`, forget it,
/// and record sandbox `spec.name` on it (its [`INSTANCE`] set).
pub fn take_member(
    store: &Store,
    backend: BackendKind,
    pool: &str,
    spec: &SandboxSpec,
) -> Result<Taken> {
    store.with_conn(&POOLS, |c| {
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let exists: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE backend = ?1 AND name = ?2)",
            params![backend, spec.name],
            |r| r.get(0),
        )?;
        if exists {
            return Ok(Taken::Exists);
        }
        let member: Option<String> = tx
            .query_row(
                "SELECT instance FROM pool_members WHERE backend = ?1 AND pool = ?2 AND state = 'ready'
                 ORDER BY created_at, instance LIMIT 1",
                params![backend, pool],
                |r| r.get(0),
            )
            .optional()?;
        let Some(instance) = member else {
            return Ok(Taken::Empty);
        };
        let mut spec = spec.clone();
        spec.options.insert(INSTANCE.into(), instance.clone());
        let json = serde_json::to_string(&spec).map_err(|e| {
            rusqlite::Error::ToSqlConversionFailure(Box::new(e))
        })?;
        tx.execute(
            "DELETE FROM pool_members WHERE backend = ?1 AND instance = ?2",
            params![backend, instance],
        )?;
        let now = now_ms();
        tx.execute(
            "INSERT INTO sandboxes (backend, name, spec, created_at, last_used) VALUES (?1, ?2, ?3, ?4, ?4)",
            params![backend, spec.name, json, now],
        )?;
        tx.commit()?;
        Ok(Taken::Member(instance))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn a_member_is_taken_once_and_becomes_the_sandbox() -> TestResult {
        let dir = tempfile::tempdir()?;
        let s = Store::open(dir.path())?;
        let b = BackendKind::Docker;
        let mut spec = SandboxSpec::named("");
        spec.image = Some("img".into());
        put_pool(
            &s,
            &PoolRow {
                name: "p".into(),
                backend: b,
                size: 2,
                spec: spec.clone(),
                created_at: 0,
            },
        )?;
        // A second pool of the same name is refused.
        let again = put_pool(&s, &pool(&s, "p")?.ok_or("no pool p")?);
        assert!(matches!(again, Err(Error::InvalidInput(_))), "{again:?}");
        add_member(&s, b, "p", "pool-p-1")?;
        add_member(&s, b, "p", "pool-p-2")?;
        let mut x = spec.clone();
        x.name = "x".into();
        // Nothing ready yet: nothing taken, nothing written.
        assert_eq!(take_member(&s, b, "p", &x)?, Taken::Empty);
        assert!(s.sandbox(b, "x")?.is_none());
        assert!(mark_ready(&s, b, "pool-p-2")?);
        assert_eq!(
            take_member(&s, b, "p", &x)?,
            Taken::Member("pool-p-2".into())
        );
        let row = s.sandbox(b, "x")?.ok_or("no row")?;
        assert_eq!(row.spec.option(INSTANCE), Some("pool-p-2"));
        assert_eq!(on_backend(&row.spec).name, "pool-p-2");
        assert_eq!(on_backend(&row.spec).option(INSTANCE), None);
        assert_eq!(
            members(&s, b, "p")?,
            vec![Member {
                instance: "pool-p-1".into(),
                state: "making".into()
            }]
        );
        // The name is taken now.
        assert_eq!(take_member(&s, b, "p", &x)?, Taken::Exists);
        Ok(())
    }

    #[test]
    fn pool_names_are_checked() {
        assert!(check_pool_name("agents_1").is_ok());
        for bad in ["", "a b", "x/y", &"a".repeat(41)] {
            assert!(check_pool_name(bad).is_err(), "{bad}");
        }
    }
}
