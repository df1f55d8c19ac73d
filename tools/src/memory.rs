//! Memory across runs: curated notes, and a search over past runs'
//! transcripts.
//!
//! Flow at a glance:
//! - a *note* is a short text kept in the store, either for one sandbox or
//!   for the user across sandboxes. The model adds, searches and forgets notes
//!   with the `memory` tool, a person with `berth memory`. A new run's system
//!   prompt carries the newest notes it can see, within a budget of tokens
//!   (berth-agent's `notes::prompt_section`); a running run never gets new ones, so its prompt
//!   prefix stays byte-identical.
//! - the *history* is the search over past runs' transcripts ([`History`]).
//!   The runs are the agent's, so berth-agent keeps the index beside its
//!   journal (`berth_agent::history`) and gives it to the registry.
//!
//! Secrets are masked (with the policy's redactor) before a note is stored and
//! before a message is indexed; what a search prints is masked once more, for
//! secrets the policy learned after the text was stored.
//!
//! Who sees what: a sandbox's model sees its sandbox's notes and the user's;
//! unless the policy says `[tools] memory = "user"`, it writes and forgets only
//! its sandbox's notes and searches only its sandbox's runs, so an untrusted
//! sandbox can neither plant text in another sandbox's prompt nor read another
//! sandbox's transcripts.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::error::{Error, Result};

/// [`Store::with_db`] for this module's functions: the store's error is kept
/// whole as [`Error::Core`].
fn db<T>(
    store: &Store,
    f: impl FnOnce(&rusqlite::Connection) -> berth_core::Result<T>,
) -> Result<T> {
    Ok(store.with_db(&TABLES, f)?)
}

/// The memory's tables: curated notes and their full-text index. This
/// module makes them on first use (see `berth_core::store::Schema`).
pub static TABLES: Schema = Schema {
    owner: "memory",
    versions: &[r#"
    CREATE TABLE IF NOT EXISTS memory_notes (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        backend     TEXT,
        sandbox     TEXT,
        text        TEXT NOT NULL,
        author      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        CHECK ((backend IS NULL) = (sandbox IS NULL))
    );
    CREATE INDEX IF NOT EXISTS memory_notes_sandbox ON memory_notes(backend, sandbox);
    CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(text, content='memory_notes', content_rowid='id');
    CREATE TRIGGER IF NOT EXISTS memory_notes_ai AFTER INSERT ON memory_notes BEGIN
        INSERT INTO memory_fts(rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER IF NOT EXISTS memory_notes_ad AFTER DELETE ON memory_notes BEGIN
        INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    "#],
};
use berth_core::backend::BackendKind;
use berth_core::store::{Schema, Store, now_ms};

/// The longest note, in characters: notes are facts, not files.
pub const NOTE_MAX_CHARS: usize = 2000;

/// A masker for secrets (the runtime's redactor).
pub type Redact<'a> = &'a dyn Fn(&str) -> String;

/// Whose a note is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The user's, seen from every sandbox.
    User,
    /// One sandbox's.
    Sandbox {
        /// Its backend.
        backend: BackendKind,
        /// Its name.
        sandbox: String,
    },
}

impl Scope {
    /// One sandbox's scope.
    pub fn sandbox(backend: BackendKind, sandbox: &str) -> Scope {
        Scope::Sandbox {
            backend,
            sandbox: sandbox.into(),
        }
    }

    fn parts(&self) -> (Option<&str>, Option<&str>) {
        match self {
            Scope::User => (None, None),
            Scope::Sandbox { backend, sandbox } => (Some(backend.as_str()), Some(sandbox)),
        }
    }
}

/// Which notes (and runs) a caller sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum View {
    /// Everything: a person at the CLI.
    All,
    /// One sandbox's notes and the user's (and that sandbox's runs).
    Sandbox {
        /// Its backend.
        backend: BackendKind,
        /// Its name.
        sandbox: String,
    },
}

impl View {
    pub fn parts(&self) -> (Option<&str>, Option<&str>) {
        match self {
            View::All => (None, None),
            View::Sandbox { backend, sandbox } => (Some(backend.as_str()), Some(sandbox)),
        }
    }
}

/// One note.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Note {
    /// Its id (`berth memory rm ID`, `memory` action `forget`).
    pub id: i64,
    /// `user`, or the sandbox as `BACKEND/NAME`.
    pub scope: String,
    /// The note, secrets masked.
    pub text: String,
    /// Who wrote it: `person`, or `model` (with the run's sandbox).
    pub author: String,
    /// When, ms since the epoch.
    pub created_ms: i64,
}

fn row_to_note(r: &rusqlite::Row<'_>) -> rusqlite::Result<Note> {
    let backend: Option<BackendKind> = r.get(1)?;
    let sandbox: Option<String> = r.get(2)?;
    Ok(Note {
        id: r.get(0)?,
        scope: match (backend, sandbox) {
            (Some(b), Some(s)) => format!("{b}/{s}"),
            _ => "user".into(),
        },
        text: r.get(3)?,
        author: r.get(4)?,
        created_ms: r.get(5)?,
    })
}

const NOTE_COLUMNS: &str = "n.id, n.backend, n.sandbox, n.text, n.author, n.created_ms";
/// Notes `view` (?1 backend, ?2 sandbox, both NULL for all) sees.
const VISIBLE: &str = "(?1 IS NULL OR n.backend IS NULL OR (n.backend = ?1 AND n.sandbox = ?2))";

/// Keep a note, masked; its id comes back.
pub fn add(store: &Store, scope: &Scope, text: &str, author: &str, redact: Redact) -> Result<Note> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Error::EmptyNote);
    }
    let chars = text.chars().count();
    if chars > NOTE_MAX_CHARS {
        return Err(Error::NoteTooLong {
            chars,
            max: NOTE_MAX_CHARS,
        });
    }
    let text = redact(text);
    let (backend, sandbox) = scope.parts();
    let now = now_ms();
    let id = db(store, |c| {
        c.execute(
            "INSERT INTO memory_notes (backend, sandbox, text, author, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![backend, sandbox, text, author, now],
        )?;
        Ok(c.last_insert_rowid())
    })?;
    Ok(Note {
        id,
        scope: match scope {
            Scope::User => "user".into(),
            Scope::Sandbox { backend, sandbox } => format!("{backend}/{sandbox}"),
        },
        text,
        author: author.into(),
        created_ms: now,
    })
}

/// The notes `view` sees, newest first.
pub fn list(store: &Store, view: &View, limit: usize) -> Result<Vec<Note>> {
    let (b, s) = view.parts();
    db(store, |c| {
        let mut stmt = c.prepare_cached(&format!(
            "SELECT {NOTE_COLUMNS} FROM memory_notes n WHERE {VISIBLE}
             ORDER BY n.created_ms DESC, n.id DESC LIMIT ?3"
        ))?;
        let rows = stmt
            .query_map(params![b, s, limit as i64], row_to_note)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    })
}

/// The notes `view` sees that match `query`'s words, best first. All the
/// words must match; failing that, any.
pub fn search(store: &Store, view: &View, query: &str, limit: usize) -> Result<Vec<Note>> {
    let (b, s) = view.parts();
    let mut found = Vec::new();
    for q in fts_queries(query)? {
        found = db(store, |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {NOTE_COLUMNS} FROM memory_fts f JOIN memory_notes n ON n.id = f.rowid
                 WHERE memory_fts MATCH ?4 AND {VISIBLE}
                 ORDER BY bm25(memory_fts), n.id DESC LIMIT ?3"
            ))?;
            let rows = stmt
                .query_map(params![b, s, limit as i64, q], row_to_note)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })?;
        if !found.is_empty() {
            break;
        }
    }
    Ok(found)
}

/// Forget note `id` if `view` may: a sandbox's view forgets its own notes, and
/// the user's only when `user` is true. The note, if one was forgotten.
pub fn forget(store: &Store, view: &View, id: i64, user: bool) -> Result<Note> {
    let (b, s) = view.parts();
    let note = db(store, |c| {
        Ok(c.query_row(
            &format!("SELECT {NOTE_COLUMNS} FROM memory_notes n WHERE n.id = ?3 AND {VISIBLE}"),
            params![b, s, id],
            row_to_note,
        )
        .optional()?)
    })?;
    let Some(note) = note else {
        return Err(Error::NoSuchNote {
            id,
            in_sandbox: b.is_some(),
        });
    };
    if note.scope == "user" && !user && b.is_some() {
        return Err(Error::UsersNote { id });
    }
    db(store, |c| {
        c.execute("DELETE FROM memory_notes WHERE id = ?1", params![id])?;
        Ok(())
    })?;
    Ok(note)
}

/// A match in a past run's transcript.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hit {
    /// The run (`berth runs show RUN`).
    pub run_id: String,
    /// The step of the message.
    pub step: i64,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// The matching words in context, the matches in `[` `]`.
    pub snippet: String,
    /// The run's task, cut short.
    pub task: String,
    /// Where the run ran.
    pub backend: BackendKind,
    /// And in which sandbox.
    pub sandbox: String,
    /// When the run started, ms since the epoch.
    pub created_ms: i64,
}

/// The search over past runs' transcripts. The runs are the agent's
/// (berth-agent keeps the journal and its index, `berth_agent::history`);
/// the `history_search` tool is offered where a front end gives one
/// ([`crate::Registry::with_history`]).
pub trait History: Send + Sync {
    /// Past runs' messages that match `query`, best first, in the runs
    /// `view` sees, masked by `redact`.
    fn search(
        &self,
        store: &Store,
        view: &View,
        query: &str,
        limit: usize,
        redact: Redact,
    ) -> Result<Vec<Hit>>;
}

/// FTS5 queries for a person's or a model's words: every word quoted (so no
/// word is read as FTS5 syntax), all of them first, then any of them.
pub fn fts_queries(query: &str) -> Result<Vec<String>> {
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .take(32)
        .map(|w| format!("\"{w}\""))
        .collect();
    if words.is_empty() {
        return Err(Error::EmptyQuery);
    }
    let mut out = vec![words.join(" ")];
    if words.len() > 1 {
        out.push(words.join(" OR "));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mask(t: &str) -> String {
        t.replace("hunter2", "[REDACTED]")
    }

    #[test]
    fn notes_are_masked_scoped_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let web = Scope::sandbox(BackendKind::Docker, "web");
        let n1 = add(&store, &web, "db password is hunter2", "model", &mask).unwrap();
        assert_eq!(n1.text, "db password is [REDACTED]");
        add(
            &store,
            &Scope::User,
            "prefer ripgrep over grep",
            "person",
            &mask,
        )
        .unwrap();
        add(
            &store,
            &Scope::sandbox(BackendKind::Ssh, "prod"),
            "prod runs postgres 16",
            "person",
            &mask,
        )
        .unwrap();
        let from_web = View::Sandbox {
            backend: BackendKind::Docker,
            sandbox: "web".into(),
        };
        let seen = list(&store, &from_web, 10).unwrap();
        let texts: Vec<&str> = seen.iter().map(|n| n.text.as_str()).collect();
        assert_eq!(
            texts,
            ["prefer ripgrep over grep", "db password is [REDACTED]"]
        );
        assert_eq!(list(&store, &View::All, 10).unwrap().len(), 3);
        // Another sandbox's note is neither found nor forgettable from here.
        assert!(search(&store, &from_web, "postgres", 5).unwrap().is_empty());
        let prod = search(&store, &View::All, "postgres", 5).unwrap();
        assert_eq!(prod.len(), 1);
        assert!(forget(&store, &from_web, prod[0].id, false).is_err());
        // The user's note: only with the user's say.
        let user = search(&store, &from_web, "ripgrep", 5).unwrap();
        assert!(forget(&store, &from_web, user[0].id, false).is_err());
        assert_eq!(
            forget(&store, &from_web, user[0].id, true).unwrap().id,
            user[0].id
        );
        assert!(search(&store, &View::All, "ripgrep", 5).unwrap().is_empty());
        // Any word matches when all do not; syntax is not syntax.
        assert_eq!(
            search(&store, &from_web, "password OR-NOT zebra", 5)
                .unwrap()
                .len(),
            1
        );
        assert!(search(&store, &from_web, "\"*(", 5).is_err());
        assert!(add(&store, &web, "  ", "model", &mask).is_err());
        assert!(
            add(
                &store,
                &web,
                &"x".repeat(NOTE_MAX_CHARS + 1),
                "model",
                &mask
            )
            .is_err()
        );
    }
}
