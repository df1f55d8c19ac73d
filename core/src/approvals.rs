//! Approvals: an *ask* verdict becomes a pending row in the store; someone
//! answers it from any process (`berth approve ID`, `berth deny ID`); the
//! waiting call sees the answer, or denies itself when its time is up.
//!
//! Flow at a glance:
//! - [`create`] writes a pending approval (before anything waits on it, so a
//!   crash leaves a visible pending row, never a lost one);
//! - [`decide`] moves it from pending to approved or denied, once;
//! - [`find_reusable`] lets an answer given after a restart count when the
//!   same command is run again;
//! - [`wait`] polls the row until it is decided or the deadline passes, then
//!   [`expire`]s it (fail closed). Polling is what crosses processes: SQLite
//!   has no notifications, and a row survives a restart of berth.

use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

use crate::backend::{BackendKind, now_unix_secs};
use crate::store::CORE;
use crate::store::Store;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where an approval stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalState {
    /// Waiting for an answer.
    Pending,
    /// Someone said yes.
    Approved,
    /// Someone said no.
    Denied,
    /// Nobody answered in time; treated as no.
    Expired,
}

impl ApprovalState {
    fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Expired => "expired",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "pending" => ApprovalState::Pending,
            "approved" => ApprovalState::Approved,
            "denied" => ApprovalState::Denied,
            "expired" => ApprovalState::Expired,
            other => return Err(Error::Store(format!("approval in unknown state `{other}`"))),
        })
    }
}

impl std::fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is being asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewApproval {
    /// The sandbox the command would run in.
    pub sandbox: String,
    /// Its backend.
    pub backend: BackendKind,
    /// The whole command text.
    pub command: String,
    /// The part of it that asked.
    pub part: String,
    /// That part's argv after wrappers (what `--always` allows).
    pub argv: Vec<String>,
    /// The rule that asked.
    pub rule: String,
    /// Why.
    pub reason: String,
}

/// An approval as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Approval {
    /// Its id, the handle for `berth approve ID`.
    pub id: i64,
    /// When it was asked (unix seconds).
    pub created_unix: i64,
    /// The sandbox.
    pub sandbox: String,
    /// The backend.
    pub backend: BackendKind,
    /// The whole command.
    pub command: String,
    /// The part that asked.
    pub part: String,
    /// That part's argv after wrappers.
    pub argv: Vec<String>,
    /// The rule that asked.
    pub rule: String,
    /// Why.
    pub reason: String,
    /// Where it stands.
    pub state: ApprovalState,
    /// Approved with `--always`.
    pub always: bool,
    /// When it was decided.
    pub decided_unix: Option<i64>,
    /// Who or what decided (`cli`, `timeout`, …).
    pub decided_by: Option<String>,
}

/// Write a pending approval and return it.
fn create(conn: &Connection, a: &NewApproval) -> Result<Approval> {
    let argv_json =
        serde_json::to_string(&a.argv).map_err(|e| Error::Store(format!("approval argv: {e}")))?;
    conn.execute(
        "INSERT INTO approvals (created_unix, sandbox, backend, command, part, argv_json, rule, reason, state)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending')",
        params![now_unix_secs(), a.sandbox, a.backend, a.command, a.part, argv_json, a.rule, a.reason],
    )?;
    get(conn, conn.last_insert_rowid())
}

const COLUMNS: &str = "id, created_unix, sandbox, backend, command, part, argv_json, rule, reason, state, always, decided_unix, decided_by";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Approval, String, String)> {
    Ok((
        Approval {
            id: r.get(0)?,
            created_unix: r.get(1)?,
            sandbox: r.get(2)?,
            backend: r.get(3)?,
            command: r.get(4)?,
            part: r.get(5)?,
            argv: Vec::new(),
            rule: r.get(7)?,
            reason: r.get(8)?,
            state: ApprovalState::Pending,
            always: r.get::<_, i64>(10)? != 0,
            decided_unix: r.get(11)?,
            decided_by: r.get(12)?,
        },
        r.get(6)?,
        r.get(9)?,
    ))
}

fn finish((mut a, argv_json, state): (Approval, String, String)) -> Result<Approval> {
    a.argv = serde_json::from_str(&argv_json)
        .map_err(|e| Error::Store(format!("approval {}: bad argv: {e}", a.id)))?;
    a.state = ApprovalState::parse(&state)?;
    Ok(a)
}

/// One approval by id.
fn get(conn: &Connection, id: i64) -> Result<Approval> {
    let found = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
            params![id],
            row,
        )
        .optional()?;
    match found {
        Some(r) => finish(r),
        None => Err(Error::NotFound {
            what: "approval",
            name: id.to_string(),
            hint: "list them with `berth approvals ls --all`".into(),
        }),
    }
}

/// Approvals, newest first; only pending ones unless `all`.
fn list(conn: &Connection, all: bool) -> Result<Vec<Approval>> {
    let sql = if all {
        format!("SELECT {COLUMNS} FROM approvals ORDER BY id DESC")
    } else {
        format!("SELECT {COLUMNS} FROM approvals WHERE state = 'pending' ORDER BY id DESC")
    };
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([], row)?;
    let mut out = Vec::new();
    for r in rows {
        out.push(finish(r?)?);
    }
    Ok(out)
}

/// Answer a pending approval. Fails if it is unknown or already decided.
fn decide(conn: &Connection, id: i64, approve: bool, always: bool, by: &str) -> Result<Approval> {
    let state = if approve {
        ApprovalState::Approved
    } else {
        ApprovalState::Denied
    };
    let n = conn.execute(
        "UPDATE approvals SET state = ?2, always = ?3, decided_unix = ?4, decided_by = ?5
         WHERE id = ?1 AND state = 'pending'",
        params![id, state.as_str(), always as i64, now_unix_secs(), by],
    )?;
    let a = get(conn, id)?;
    if n == 0 {
        return Err(Error::InvalidInput(format!(
            "approval {id} is already {} (by {}); nothing to do",
            a.state,
            a.decided_by.as_deref().unwrap_or("unknown")
        )));
    }
    Ok(a)
}

/// Deny a still-pending approval because nobody answered in time.
/// Returns the final row, whatever decided it.
fn expire(conn: &Connection, id: i64) -> Result<Approval> {
    conn.execute(
        "UPDATE approvals SET state = 'expired', decided_unix = ?2, decided_by = 'timeout'
         WHERE id = ?1 AND state = 'pending'",
        params![id, now_unix_secs()],
    )?;
    get(conn, id)
}

/// An approval for exactly this command in this sandbox that can stand for a
/// new ask: a pending one (its asker may have died with a restart of berth)
/// or an approved one not yet used. Lets an answer given after a restart
/// count when the command is run again.
fn find_reusable(
    conn: &Connection,
    sandbox: &str,
    backend: BackendKind,
    command: &str,
) -> Result<Option<Approval>> {
    let id: Option<i64> = conn
        .query_row(
            "SELECT id FROM approvals
             WHERE sandbox = ?1 AND backend = ?2 AND command = ?3 AND used = 0
               AND state IN ('pending', 'approved')
             ORDER BY id DESC LIMIT 1",
            params![sandbox, backend, command],
            |r| r.get(0),
        )
        .optional()?;
    id.map(|id| get(conn, id)).transpose()
}

/// Mark an approved approval as spent, so it lets one run through, not many.
fn mark_used(conn: &Connection, id: i64) -> Result<()> {
    conn.execute("UPDATE approvals SET used = 1 WHERE id = ?1", params![id])?;
    Ok(())
}

/// Approvals in the state store, one typed method per question.
impl Store {
    /// Record a new pending approval.
    pub fn create_approval(&self, a: &NewApproval) -> Result<Approval> {
        self.with_db(&CORE, |c| create(c, a))
    }

    /// An approval by id.
    pub fn approval(&self, id: i64) -> Result<Approval> {
        self.with_db(&CORE, |c| get(c, id))
    }

    /// Pending approvals, or every approval with `all`.
    pub fn approvals(&self, all: bool) -> Result<Vec<Approval>> {
        self.with_db(&CORE, |c| list(c, all))
    }

    /// Answer a pending approval; fails if it is unknown or already decided.
    pub fn decide_approval(
        &self,
        id: i64,
        approve: bool,
        always: bool,
        by: &str,
    ) -> Result<Approval> {
        self.with_db(&CORE, |c| decide(c, id, approve, always, by))
    }

    /// Expire a still-pending approval; returns the final row.
    pub fn expire_approval(&self, id: i64) -> Result<Approval> {
        self.with_db(&CORE, |c| expire(c, id))
    }

    /// A pending, or approved and unused, approval for exactly this command.
    pub fn reusable_approval(
        &self,
        sandbox: &str,
        backend: BackendKind,
        command: &str,
    ) -> Result<Option<Approval>> {
        self.with_db(&CORE, |c| find_reusable(c, sandbox, backend, command))
    }

    /// The newest unused approval for exactly this command, whatever its state.
    pub fn latest_approval(
        &self,
        sandbox: &str,
        backend: BackendKind,
        command: &str,
    ) -> Result<Option<Approval>> {
        self.with_db(&CORE, |c| {
            let id: Option<i64> = c
                .query_row(
                    "SELECT id FROM approvals WHERE sandbox = ?1 AND backend = ?2 AND command = ?3 AND used = 0
                     ORDER BY id DESC LIMIT 1",
                    params![sandbox, backend, command],
                    |r| r.get(0),
                )
                .optional()?;
            id.map(|id| get(c, id)).transpose()
        })
    }

    /// Mark an approval spent.
    pub fn mark_approval_used(&self, id: i64) -> Result<()> {
        self.with_db(&CORE, |c| mark_used(c, id))
    }
}

/// Wait until approval `id` is decided or `timeout` passes (then it expires).
/// Answers come from other processes: the store's bell wakes the wait, and
/// `poll` is how often the row is read where the kernel cannot watch it.
pub async fn wait(store: &Store, id: i64, timeout: Duration, poll: Duration) -> Result<Approval> {
    let deadline = Instant::now() + timeout;
    // Woken by the answer's write, whoever writes it; `poll` only where the
    // kernel cannot watch the store.
    let mut bell = store.bell(poll);
    loop {
        let a = store.approval(id)?;
        if a.state != ApprovalState::Pending {
            return Ok(a);
        }
        let now = Instant::now();
        if now >= deadline {
            return store.expire_approval(id);
        }
        bell.wait(deadline - now).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ask() -> NewApproval {
        NewApproval {
            sandbox: "s".into(),
            backend: BackendKind::Local,
            command: "git push -f".into(),
            part: "git push -f".into(),
            argv: vec!["git".into(), "push".into(), "-f".into()],
            rule: "force-push".into(),
            reason: "rewrites history".into(),
        }
    }

    #[tokio::test]
    async fn lifecycle_across_stores() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(dir.path()).unwrap();
        let p = a.create_approval(&ask()).unwrap();
        assert_eq!(p.state, ApprovalState::Pending);
        assert_eq!(a.approvals(false).unwrap().len(), 1);
        // Another store (another process in real use) answers.
        let b = Store::open(dir.path()).unwrap();
        let waiter = wait(&a, p.id, Duration::from_secs(10), Duration::from_millis(10));
        let answer = async {
            tokio::task::yield_now().await;
            b.decide_approval(p.id, true, true, "cli").unwrap()
        };
        let (got, _) = tokio::join!(waiter, answer);
        let got = got.unwrap();
        assert_eq!(got.state, ApprovalState::Approved);
        assert!(got.always);
        assert_eq!(got.argv, ask().argv);
        assert!(a.approvals(false).unwrap().is_empty());
        let again = b
            .decide_approval(p.id, false, false, "cli")
            .unwrap_err()
            .to_string();
        assert!(again.contains("already approved"), "{again}");
        let missing = b
            .decide_approval(999, true, false, "cli")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("not found"), "{missing}");
        // An approved, unused approval stands for the same command once.
        let r = a
            .reusable_approval("s", BackendKind::Local, "git push -f")
            .unwrap();
        assert_eq!(r.map(|r| r.id), Some(p.id));
        a.mark_approval_used(p.id).unwrap();
        assert!(
            a.reusable_approval("s", BackendKind::Local, "git push -f")
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn unanswered_approvals_expire_denied() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let p = store.create_approval(&ask()).unwrap();
        let got = wait(
            &store,
            p.id,
            Duration::from_millis(30),
            Duration::from_millis(5),
        )
        .await
        .unwrap();
        assert_eq!(got.state, ApprovalState::Expired);
        assert_eq!(got.decided_by.as_deref(), Some("timeout"));
        // A late answer cannot turn it into a yes.
        assert!(store.decide_approval(p.id, true, false, "cli").is_err());
    }
}
