//! The durable state: SQLite in WAL mode with versioned migrations.
//!
//! Flow at a glance: every berth process opens the same database under the state
//! directory. Writes are single statements or short transactions, so concurrent
//! CLI invocations, the MCP server and the daemon interleave safely (WAL plus a
//! busy timeout). Every transition is written before it is acted on; a `kill -9`
//! leaves at worst a `started` event without its `finished` twin.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::backend::{BackendKind, SandboxSpec};
pub use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::events::EventKind;

pub mod excerpt;
mod migrations;

pub use migrations::{CORE, LEGACY};

/// One crate's tables: the crate that owns them, and their schema, one entry
/// per version. Never edit a shipped entry: append a new one. A crate names
/// its schema on every call to [`Store::with_db`] or [`Store::with_conn`], so
/// its tables are made (or brought up to date) before its first statement;
/// every table is written in the crate whose SQL uses it, and no other crate
/// queries it.
#[derive(Debug)]
pub struct Schema {
    /// The owning crate, as the version table names it (`core`, `agent`…).
    pub owner: &'static str,
    /// Its migrations, oldest first.
    pub versions: &'static [&'static str],
}

/// A sandbox berth knows about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRow {
    /// Its backend.
    pub backend: BackendKind,
    /// Sandbox name.
    pub name: String,
    /// The spec it was created with.
    pub spec: SandboxSpec,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Last use, ms since the epoch.
    pub last_used: i64,
}

/// One entry of the event log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Row id, increasing.
    pub id: i64,
    /// When, ms since the epoch.
    pub ts_ms: i64,
    /// What happened: `exec.started`, `exec.finished`, `sandbox.created`, ...
    pub kind: EventKind,
    /// Ties the events of one tool call together.
    pub call_id: Option<String>,
    /// Its backend.
    pub backend: Option<BackendKind>,
    /// Sandbox name.
    pub sandbox: Option<String>,
    /// Session name.
    pub session: Option<String>,
    /// The command text, redacted.
    pub command: Option<String>,
    /// The policy verdict.
    pub verdict: Option<String>,
    /// Exit code.
    pub exit_code: Option<i64>,
    /// Duration in ms.
    pub duration_ms: Option<i64>,
    /// Output bytes.
    pub bytes_out: Option<i64>,
    /// Anything else, as JSON text.
    pub detail: Option<String>,
}

/// The state store.
pub struct Store {
    /// Connections to the database: the first opened with the store, the
    /// others when every opened one is in use. A call takes any free one, so
    /// a writer waiting out another process's write lock holds up no reader
    /// and no other writer's turn (WAL lets readers go on beside a writer).
    pool: [std::sync::OnceLock<Mutex<Connection>>; POOL],
    path: PathBuf,
    /// The schemas brought up to date through this store so far.
    adopted: Mutex<Vec<&'static str>>,
    /// Events kept; older ones are pruned as events are appended (0: all).
    events_keep: AtomicU64,
}

/// How long a waiter on the store's bell lets a burst of writes settle.
const BELL_SETTLE: Duration = Duration::from_millis(30);

/// Connections a store opens at most.
const POOL: usize = 4;

/// Every this many appended events, the ones past `events_keep` are pruned.
const PRUNE_EVERY: i64 = 256;
/// Most events one prune deletes: a store that was never pruned (or whose
/// limit was just lowered) catches up over several appends, each cheap.
const PRUNE_BATCH: i64 = 4096;

impl Store {
    /// Open (and migrate) the store in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Store> {
        private_dir(state_dir).map_err(|e| state_dir_error(state_dir, e))?;
        // Probe writability up front: SQLite's own error for a read-only directory
        // ("unable to open database file") names nothing the user can act on.
        let probe = state_dir.join(".berth-write-probe");
        std::fs::write(&probe, b"").map_err(|e| state_dir_error(state_dir, e))?;
        let _ = std::fs::remove_file(&probe);
        let path = state_dir.join("berth.db");
        // SQLite gives its WAL and shm files the database file's mode.
        private_file(&path).map_err(|e| state_dir_error(state_dir, e))?;
        let conn = connect(&path)?;
        // Processes opening a new database at once race to switch it to WAL;
        // the loser gets SQLITE_BUSY without a busy wait, so it tries again.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match conn.pragma_update(None, "journal_mode", "WAL") {
                Ok(()) => break,
                Err(rusqlite::Error::SqliteFailure(f, _))
                    if f.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let store = Store {
            pool: Default::default(),
            path,
            adopted: Mutex::new(Vec::new()),
            events_keep: AtomicU64::new(berth_policies::Limits::default().events_keep),
        };
        let _ = store.pool[0].set(Mutex::new(conn));
        store.migrate()?;
        Ok(store)
    }

    /// A bell that rings when anyone, in this process or another, writes
    /// the store (see [`crate::bell`]); a timer of `fallback` where the
    /// kernel cannot watch it.
    pub fn bell(&self, fallback: Duration) -> crate::bell::Bell {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        crate::bell::Bell::files(dir, &["berth.db", "berth.db-wal"], fallback).settle(BELL_SETTLE)
    }

    /// Keep the newest `n` events (`events_keep` under `[limits]`); 0 keeps all.
    pub fn keep_events(&self, n: u64) {
        self.events_keep.store(n, Ordering::Relaxed);
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A free connection: the first idle one, else a new one while the pool
    /// has room, else (all busy) the first, waited for without stalling the
    /// async runtime's other tasks.
    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        let poisoned = || Error::Store("connection lock poisoned".into());
        for slot in &self.pool {
            let m = match slot.get() {
                Some(m) => m,
                None => {
                    // Two threads may both open one here; the loser's is dropped.
                    let _ = slot.set(Mutex::new(connect(&self.path)?));
                    match slot.get() {
                        Some(m) => m,
                        None => continue,
                    }
                }
            };
            match m.try_lock() {
                Ok(g) => return Ok(g),
                Err(std::sync::TryLockError::WouldBlock) => continue,
                Err(std::sync::TryLockError::Poisoned(_)) => return Err(poisoned()),
            }
        }
        let Some(first) = self.pool[0].get() else {
            return Err(Error::Store("the store has no connection".into()));
        };
        blocking(|| first.lock()).map_err(|_| poisoned())
    }

    /// Bring the database up to date: first the schema as it was before each
    /// crate kept its own tables ([`LEGACY`], one list in `PRAGMA
    /// user_version`) for a database a berth of then made, then core's own
    /// tables. A new database skips the old list: each crate makes its own
    /// tables on first use.
    fn migrate(&self) -> Result<()> {
        let mut conn = self.conn()?;
        // Up to date (the common case): no write lock is taken, so opening
        // the store does not wait behind another process's write.
        let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if current as usize != LEGACY.len() || !has_table(&conn, "schema_parts")? {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            if version as usize > LEGACY.len() {
                return Err(Error::Store(format!(
                    "the database is at schema version {version}, newer than this berth ({}); upgrade berth",
                    LEGACY.len()
                )));
            }
            let fresh = version == 0 && !has_table(&tx, "sandboxes")?;
            if !fresh {
                for m in LEGACY.iter().skip(version as usize) {
                    tx.execute_batch(m)?;
                }
            }
            tx.pragma_update(None, "user_version", LEGACY.len() as i64)?;
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_parts (
                    owner   TEXT PRIMARY KEY,
                    version INTEGER NOT NULL
                );",
            )?;
            tx.commit()?;
        }
        drop(conn);
        self.adopt(&CORE)
    }

    /// Make `schema`'s tables, or bring them up to date, once per store.
    fn adopt(&self, schema: &'static Schema) -> Result<()> {
        let lock = || {
            self.adopted
                .lock()
                .map_err(|_| Error::Store("schema lock poisoned".into()))
        };
        if lock()?.contains(&schema.owner) {
            return Ok(());
        }
        let mut conn = self.conn()?;
        let want = schema.versions.len() as i64;
        let read = |c: &Connection| -> rusqlite::Result<Option<i64>> {
            c.query_row(
                "SELECT version FROM schema_parts WHERE owner = ?1",
                [schema.owner],
                |r| r.get(0),
            )
            .optional()
        };
        if read(&conn)? != Some(want) {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let at = read(&tx)?.unwrap_or(0);
            if at > want {
                return Err(Error::Store(format!(
                    "{}'s tables are at version {at}, newer than this berth ({want}); upgrade berth",
                    schema.owner
                )));
            }
            for m in schema.versions.iter().skip(at as usize) {
                tx.execute_batch(m)?;
            }
            tx.execute(
                "INSERT INTO schema_parts (owner, version) VALUES (?1, ?2)
                 ON CONFLICT(owner) DO UPDATE SET version = excluded.version",
                params![schema.owner, want],
            )?;
            tx.commit()?;
        }
        lock()?.push(schema.owner);
        Ok(())
    }

    /// The version of `owner`'s tables in this database (0: not made yet).
    pub fn schema_version(&self, owner: &str) -> Result<i64> {
        Ok(self
            .conn()?
            .query_row(
                "SELECT version FROM schema_parts WHERE owner = ?1",
                [owner],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(0))
    }

    /// Record a sandbox (or refresh its spec).
    pub fn put_sandbox(&self, backend: BackendKind, spec: &SandboxSpec) -> Result<()> {
        let json = serde_json::to_string(spec).map_err(|e| Error::Store(e.to_string()))?;
        let now = now_ms();
        self.conn()?.execute(
            "INSERT INTO sandboxes (backend, name, spec, created_at, last_used) VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT(backend, name) DO UPDATE SET spec = excluded.spec, last_used = excluded.last_used",
            params![backend, spec.name, json, now],
        )?;
        Ok(())
    }

    /// A sandbox by backend and name.
    pub fn sandbox(&self, backend: BackendKind, name: &str) -> Result<Option<SandboxRow>> {
        let conn = self.conn()?;
        let row = conn
            .prepare_cached(
                "SELECT backend, name, spec, created_at, last_used FROM sandboxes WHERE backend = ?1 AND name = ?2",
            )?
            .query_row(params![backend, name], row_to_sandbox)
            .optional()?;
        row.transpose()
    }

    /// All sandboxes, optionally of one backend.
    pub fn sandboxes(&self, backend: Option<BackendKind>) -> Result<Vec<SandboxRow>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT backend, name, spec, created_at, last_used FROM sandboxes
             WHERE ?1 IS NULL OR backend = ?1 ORDER BY backend, name",
        )?;
        let rows = stmt.query_map(params![backend], row_to_sandbox)?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r??);
        }
        Ok(out)
    }

    /// Forget a sandbox and its sessions. Returns whether it was known.
    pub fn delete_sandbox(&self, backend: BackendKind, name: &str) -> Result<bool> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "DELETE FROM sessions WHERE backend = ?1 AND sandbox = ?2",
            params![backend, name],
        )?;
        let n = tx.execute(
            "DELETE FROM sandboxes WHERE backend = ?1 AND name = ?2",
            params![backend, name],
        )?;
        tx.commit()?;
        Ok(n > 0)
    }

    /// Mark a sandbox used now.
    pub fn touch_sandbox(&self, backend: BackendKind, name: &str) -> Result<()> {
        self.touch_sandbox_at(backend, name, now_ms())
    }

    /// Mark a sandbox last used at `at_ms` (ms since the epoch).
    pub fn touch_sandbox_at(&self, backend: BackendKind, name: &str, at_ms: i64) -> Result<()> {
        touch_in(&*self.conn()?, backend, name, at_ms)
    }

    /// Record a command run in a session.
    pub fn session_used(
        &self,
        backend: BackendKind,
        sandbox: &str,
        name: &str,
        cwd: Option<&str>,
    ) -> Result<()> {
        session_used_in(&*self.conn()?, backend, sandbox, name, cwd)
    }

    /// The end of a command, in one transaction (one write to the log, not
    /// three): the sandbox and session marked used (`used`, when it ran) and
    /// its `exec.finished` or `exec.failed` event.
    pub fn record_call_end(&self, used: Option<&SessionUse<'_>>, finished: &Event) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        if let Some(u) = used {
            touch_in(&tx, u.backend, u.sandbox, now_ms())?;
            session_used_in(&tx, u.backend, u.sandbox, u.session, u.cwd)?;
        }
        append_in(&tx, finished, self.events_keep())?;
        tx.commit()?;
        Ok(())
    }

    /// The last known cwd of a session.
    pub fn session_cwd(
        &self,
        backend: BackendKind,
        sandbox: &str,
        name: &str,
    ) -> Result<Option<String>> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT cwd FROM sessions WHERE backend = ?1 AND sandbox = ?2 AND name = ?3",
                params![backend, sandbox, name],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()?
            .flatten())
    }

    /// How many sessions each sandbox has, by (backend, sandbox).
    pub fn session_counts(&self) -> Result<std::collections::BTreeMap<(BackendKind, String), i64>> {
        let conn = self.conn()?;
        let mut st =
            conn.prepare("SELECT backend, sandbox, COUNT(*) FROM sessions GROUP BY 1, 2")?;
        let rows = st.query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Append an event; returns its id.
    pub fn append(&self, e: &Event) -> Result<i64> {
        append_in(&*self.conn()?, e, self.events_keep())
    }

    /// Append `events` only if `claim` (run first, in the same immediate
    /// transaction) says so; returns what `claim` said. A record that must be
    /// written once however many writers race for it (a job's watch matches,
    /// scanned by the server, a `job wait` and an `events --follow` alike)
    /// claims its key in `claim`, so the loser writes nothing.
    pub(crate) fn append_claimed(
        &self,
        claim: impl FnOnce(&Connection) -> rusqlite::Result<bool>,
        events: &[Event],
    ) -> Result<bool> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if !claim(&tx)? {
            return Ok(false);
        }
        for e in events {
            append_in(&tx, e, self.events_keep())?;
        }
        tx.commit()?;
        Ok(true)
    }

    fn events_keep(&self) -> u64 {
        self.events_keep.load(Ordering::Relaxed)
    }

    /// The newest `limit` events with id greater than `after`, oldest first.
    pub fn events(
        &self,
        after: i64,
        limit: usize,
        kind_prefix: Option<&str>,
    ) -> Result<Vec<Event>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT * FROM (
               SELECT id, ts_ms, kind, call_id, backend, sandbox, session, command, verdict,
                      exit_code, duration_ms, bytes_out, detail
               FROM events WHERE id > ?1 AND (?3 IS NULL OR kind LIKE ?3 || '%')
               ORDER BY id DESC LIMIT ?2
             ) ORDER BY id ASC",
        )?;
        let rows = stmt.query_map(params![after, limit as i64, kind_prefix], row_to_event)?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r?);
        }
        Ok(out)
    }

    /// The newest `limit` events after id `after` that match every filter
    /// given, newest first: a sandbox's name, a kind's prefix, and a time
    /// (ms since the epoch) they are not older than.
    pub fn events_newest(
        &self,
        after: i64,
        sandbox: Option<&str>,
        kind_prefix: Option<&str>,
        since_ms: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT id, ts_ms, kind, call_id, backend, sandbox, session, command, verdict,
                    exit_code, duration_ms, bytes_out, detail
             FROM events
             WHERE id > ?1 AND (?2 IS NULL OR sandbox = ?2)
               AND (?3 IS NULL OR kind LIKE ?3 || '%') AND (?4 IS NULL OR ts_ms >= ?4)
             ORDER BY id DESC LIMIT ?5",
        )?;
        let rows = stmt.query_map(
            params![after, sandbox, kind_prefix, since_ms, limit as i64],
            row_to_event,
        )?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// The newest `limit` events of `kind` about call (or job) `call_id`,
    /// newest first.
    pub fn events_of_call(
        &self,
        kind: EventKind,
        call_id: &str,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT id, ts_ms, kind, call_id, backend, sandbox, session, command, verdict,
                    exit_code, duration_ms, bytes_out, detail
             FROM events WHERE kind = ?1 AND call_id = ?2 ORDER BY id DESC LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![kind, call_id, limit as i64], row_to_event)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Events after `after`, oldest first, up to `limit` (for following a log).
    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT id, ts_ms, kind, call_id, backend, sandbox, session, command, verdict,
                    exit_code, duration_ms, bytes_out, detail
             FROM events WHERE id > ?1 ORDER BY id ASC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![after, limit as i64], row_to_event)?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r?);
        }
        Ok(out)
    }

    /// Like [`Store::with_conn`], for functions that return berth's own `Result`.
    pub fn with_db<T>(
        &self,
        schema: &'static Schema,
        f: impl FnOnce(&Connection) -> Result<T>,
    ) -> Result<T> {
        self.adopt(schema)?;
        let conn = self.conn()?;
        f(&conn)
    }

    /// Run `f` with the raw connection, for a module that owns tables
    /// (`schema`) and puts typed methods over them: the jobs, approvals and
    /// checkpoints here, the agent's journal in berth-agent, the memory in
    /// berth-tools, the schedules in berth-schedules. The schema is made or
    /// brought up to date first, once per store. Callers never hold the
    /// connection past `f`: a pooled connection goes back when it returns.
    pub fn with_conn<T>(
        &self,
        schema: &'static Schema,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        self.adopt(schema)?;
        let mut conn = self.conn()?;
        Ok(f(&mut conn)?)
    }
}

/// Whether the database has a table `name`.
fn has_table(c: &Connection, name: &str) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )
}

/// How long a statement waits in all for another connection's write lock
/// before it fails with SQLITE_BUSY.
const BUSY_WAIT: Duration = Duration::from_secs(10);

/// Open one connection with berth's settings (the database is in WAL mode
/// from [`Store::open`] on; that setting lives in the file).
fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).map_err(|e| {
        Error::Store(format!(
            "cannot open {}: {e}; check the state dir's permissions or pass --state-dir",
            path.display()
        ))
    })?;
    conn.busy_handler(Some(wait_while_busy))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// Run `f`, which blocks this thread: on a worker of a multi-threaded tokio
/// runtime the worker first hands its other tasks to another thread.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    let on_worker = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_worker {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// SQLite's busy handler: called with the number of times it was already
/// called for this statement; true waits a little and tries again. The wait
/// never stalls an async runtime: on a worker of a multi-threaded tokio
/// runtime (`berth serve`, the MCP server), the worker hands its other tasks
/// to another thread while this one sleeps. The fast path, no other writer,
/// never gets here and costs nothing.
fn wait_while_busy(calls: i32) -> bool {
    const STEPS_MS: [u64; 6] = [1, 2, 5, 10, 20, 50];
    let step = |i: i32| STEPS_MS[(i.max(0) as usize).min(STEPS_MS.len() - 1)];
    let waited: u64 = (0..calls).map(step).sum();
    if waited >= BUSY_WAIT.as_millis() as u64 {
        return false;
    }
    let pause = Duration::from_millis(step(calls));
    blocking(|| std::thread::sleep(pause));
    true
}

/// Create `dir` (and missing parents) readable by this user only, and take
/// group and other access away from it if it existed: it holds the event log,
/// output spools and sandboxes. A shared directory (sticky, like `/tmp`, or
/// someone else's) is left as it is.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    let mode = meta.permissions().mode();
    // SAFETY: geteuid has no preconditions.
    let mine = meta.uid() == unsafe { libc::geteuid() };
    if mine && mode & 0o1000 == 0 && mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7700))?;
    }
    Ok(())
}

/// Create `path` as an empty file readable by this user only, or take group
/// and other access away from an existing one.
pub fn private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    let mode = f.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7700))?;
    }
    Ok(())
}

fn state_dir_error(dir: &Path, e: std::io::Error) -> Error {
    Error::Store(format!(
        "state dir {} is not writable ({e}); fix its permissions, or point --state-dir / BERTH_STATE_DIR at a writable directory",
        dir.display()
    ))
}

fn row_to_event(r: &rusqlite::Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        id: r.get(0)?,
        ts_ms: r.get(1)?,
        kind: r.get(2)?,
        call_id: r.get(3)?,
        backend: r.get(4)?,
        sandbox: r.get(5)?,
        session: r.get(6)?,
        command: r.get(7)?,
        verdict: r.get(8)?,
        exit_code: r.get(9)?,
        duration_ms: r.get(10)?,
        bytes_out: r.get(11)?,
        detail: r.get(12)?,
    })
}

fn row_to_sandbox(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<SandboxRow>> {
    let spec_text: String = r.get(2)?;
    let spec = serde_json::from_str(&spec_text)
        .map_err(|e| Error::Store(format!("corrupt sandbox spec: {e}")));
    let backend = match r.get(0) {
        Ok(b) => b,
        Err(e) => return Ok(Err(e.into())),
    };
    Ok(spec.map(|spec| SandboxRow {
        backend,
        name: r.get(1).unwrap_or_default(),
        spec,
        created_at: r.get(3).unwrap_or_default(),
        last_used: r.get(4).unwrap_or_default(),
    }))
}

/// A command run in a session, for [`Store::record_call_end`].
pub struct SessionUse<'a> {
    pub backend: BackendKind,
    pub sandbox: &'a str,
    pub session: &'a str,
    pub cwd: Option<&'a str>,
}

// Statements run on every call are prepared once per connection.

fn touch_in(c: &Connection, backend: BackendKind, name: &str, at_ms: i64) -> Result<()> {
    c.prepare_cached("UPDATE sandboxes SET last_used = ?3 WHERE backend = ?1 AND name = ?2")?
        .execute(params![backend, name, at_ms])?;
    Ok(())
}

fn session_used_in(
    c: &Connection,
    backend: BackendKind,
    sandbox: &str,
    name: &str,
    cwd: Option<&str>,
) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO sessions (backend, sandbox, name, created_at, last_used, commands, cwd)
         VALUES (?1, ?2, ?3, ?4, ?4, 1, ?5)
         ON CONFLICT(backend, sandbox, name) DO UPDATE SET
           last_used = excluded.last_used, commands = commands + 1,
           cwd = COALESCE(excluded.cwd, cwd)",
    )?
    .execute(params![backend, sandbox, name, now_ms(), cwd])?;
    Ok(())
}

fn append_in(c: &Connection, e: &Event, keep: u64) -> Result<i64> {
    c.prepare_cached(
        "INSERT INTO events (ts_ms, kind, call_id, backend, sandbox, session, command, verdict,
                             exit_code, duration_ms, bytes_out, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        if e.ts_ms == 0 { now_ms() } else { e.ts_ms },
        e.kind,
        e.call_id,
        e.backend,
        e.sandbox,
        e.session,
        // Bounded by size, not only by count: a long command is kept as an
        // excerpt with its length and digest.
        e.command
            .as_deref()
            .map(|c| excerpt::excerpt(c, excerpt::COMMAND_KEEP)),
        e.verdict
            .as_deref()
            .map(|v| excerpt::excerpt(v, excerpt::COMMAND_KEEP)),
        e.exit_code,
        e.duration_ms,
        e.bytes_out,
        e.detail.as_deref().map(excerpt::bound_detail)
    ])?;
    let id = c.last_insert_rowid();
    // Ids only grow (AUTOINCREMENT), so the events past the newest `keep` are
    // a range of the primary key: deleting a batch of them is an index walk.
    // A small limit is pruned more often, so the table stays within twice it.
    let every = PRUNE_EVERY
        .min(i64::try_from(keep).unwrap_or(i64::MAX))
        .max(1);
    if keep > 0 && id % every == 0 {
        let below = id.saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX));
        c.prepare_cached(
            "DELETE FROM events WHERE id IN
               (SELECT id FROM events WHERE id <= ?1 ORDER BY id LIMIT ?2)",
        )?
        .execute(params![below, PRUNE_BATCH])?;
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newer berth may share the state directory and write a backend or
    /// an event kind this one does not know: the event reads back with its
    /// text, and the sandbox row is an error that says what happened, never
    /// a row passed off as another backend's.
    #[test]
    fn rows_a_newer_berth_wrote_read_back_or_say_why() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let s = Store::open(dir.path())?;
        s.with_conn(&CORE, |c| {
            c.execute(
                "INSERT INTO events (ts_ms, kind, backend, sandbox) VALUES (1, 'pod.evicted', 'docker', 'w')",
                [],
            )?;
            c.execute(
                "INSERT INTO sandboxes (backend, name, spec, created_at, last_used)
                 VALUES ('nomad', 'far', '{\"name\":\"far\"}', 1, 1)",
                [],
            )
        })?;
        let e = s.events(0, 10, None)?;
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].kind.as_str(), "pod.evicted");
        assert_eq!(e[0].backend, Some(BackendKind::Docker));
        assert_eq!(s.events(0, 10, Some("pod."))?.len(), 1);
        let err = match s.sandboxes(None) {
            Ok(rows) => panic!("a nomad row read as {rows:?}"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("'nomad'") && err.contains("newer berth"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn migrates_and_round_trips() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let s = Store::open(dir.path())?;
        assert_eq!(s.schema_version("core")?, CORE.versions.len() as i64);
        s.put_sandbox(BackendKind::Local, &SandboxSpec::named("a"))?;
        assert_eq!(
            s.sandbox(BackendKind::Local, "a")?.map(|r| r.name),
            Some("a".into())
        );
        assert!(s.sandbox(BackendKind::Docker, "a")?.is_none());
        let id = s.append(&Event {
            kind: EventKind::ExecFinished,
            exit_code: Some(3),
            ..Default::default()
        })?;
        let ev = s.events(0, 10, None)?;
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].id, id);
        assert_eq!(ev[0].exit_code, Some(3));
        assert!(s.delete_sandbox(BackendKind::Local, "a")?);
        assert!(!s.delete_sandbox(BackendKind::Local, "a")?);
        // Reopening does not re-run migrations.
        drop(s);
        let s = Store::open(dir.path())?;
        assert_eq!(s.events(0, 10, None)?.len(), 1);
        Ok(())
    }

    #[test]
    fn events_past_the_limit_are_pruned_as_events_come() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let s = Store::open(dir.path())?;
        s.keep_events(100);
        let mut last = 0;
        for i in 0..1000 {
            last = s.append(&Event {
                kind: EventKind::read(&format!("test.{i}")),
                ..Default::default()
            })?;
        }
        let count: i64 = s.with_conn(&CORE, |c| {
            c.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        })?;
        assert!(
            (100..=200).contains(&count),
            "{count} events kept with events_keep = 100"
        );
        let oldest: i64 = s.with_conn(&CORE, |c| {
            c.query_row("SELECT min(id) FROM events", [], |r| r.get(0))
        })?;
        assert!(oldest > last - 200, "event {oldest} outlived the limit");
        // The newest are all there, in order.
        let newest = s.events(0, 100, None)?;
        assert_eq!(newest.len(), 100);
        assert_eq!(newest.last().map(|e| e.id), Some(last));
        assert_eq!(newest.last().map(|e| e.kind.as_str()), Some("test.999"));
        // 0 keeps everything.
        s.keep_events(0);
        for _ in 0..300 {
            s.append(&Event::default())?;
        }
        let all: i64 = s.with_conn(&CORE, |c| {
            c.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        })?;
        assert_eq!(all, count + 300);
        Ok(())
    }

    #[test]
    fn refuses_a_newer_schema() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        {
            let s = Store::open(dir.path())?;
            s.with_conn(&CORE, |c| c.pragma_update(None, "user_version", 999))?;
        }
        match Store::open(dir.path()) {
            Err(Error::Store(m)) => assert!(m.contains("newer"), "{m}"),
            other => panic!("expected a schema error, got {:?}", other.map(|_| ())),
        }
        Ok(())
    }

    /// Another process holding the write lock makes a statement wait, but on a
    /// multi-threaded runtime (the server's) the waiting worker hands its other
    /// tasks on: they keep running, and the write lands once the lock is free.
    #[test]
    fn a_write_waiting_for_the_lock_does_not_stall_other_tasks() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let store = std::sync::Arc::new(Store::open(dir.path())?);
        let other = Connection::open(dir.path().join("berth.db"))?;
        other.execute_batch("BEGIN IMMEDIATE")?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| Error::stream("runtime", e))?;
        rt.block_on(async {
            let s = store.clone();
            let write = tokio::spawn(async move {
                s.append(&Event {
                    kind: EventKind::read("waited"),
                    ..Event::default()
                })
            });
            // Let the one worker take the write and block on the lock.
            std::thread::sleep(Duration::from_millis(100));
            let other_task = tokio::spawn(async {
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
            });
            other_task.await.map_err(|e| Error::Store(e.to_string()))?;
            assert!(
                !write.is_finished(),
                "the write should still be waiting for the lock"
            );
            other.execute_batch("COMMIT")?;
            write.await.map_err(|e| Error::Store(e.to_string()))??;
            Ok::<(), Error>(())
        })?;
        assert_eq!(store.events(0, 10, None)?.len(), 1);
        Ok(())
    }
}
