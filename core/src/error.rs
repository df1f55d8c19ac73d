//! berth-core's error type. Every variant says what failed and, where it can,
//! what to do next.

use std::path::PathBuf;

/// Why a process could not be started, classified so a caller can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnFailure {
    /// The program does not exist in the sandbox.
    NotFound,
    /// The working directory does not exist or is not a directory.
    BadCwd,
    /// Permission denied.
    Permission,
    /// Anything else.
    Other,
}

/// berth-core's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller's input is unusable.
    #[error("{0}")]
    InvalidInput(String),

    /// The named thing does not exist.
    #[error("{what} `{name}` not found{}", hint_suffix(.hint))]
    NotFound {
        /// What kind of thing: sandbox, job, file, approval.
        what: &'static str,
        /// Its name or id.
        name: String,
        /// What to do next.
        hint: String,
    },

    /// The sandbox is gone or unusable.
    #[error("sandbox `{sandbox}` ({backend}): {reason}{}", hint_suffix(.hint))]
    SandboxGone {
        /// The sandbox's name.
        sandbox: String,
        /// The backend's short name.
        backend: &'static str,
        /// What happened to it.
        reason: String,
        /// What to do next.
        hint: String,
    },

    /// The backend itself cannot be reached (daemon down, host unreachable).
    #[error("{backend}: {detail}{}", hint_suffix(.hint))]
    Unreachable {
        /// The backend's short name.
        backend: &'static str,
        /// What failed.
        detail: String,
        /// What to do next.
        hint: String,
    },

    /// A backend reported an error of its own.
    #[error("{backend}: {detail}")]
    Backend {
        /// The backend's short name.
        backend: &'static str,
        /// What failed.
        detail: String,
    },

    /// A process could not be started.
    #[error("cannot start `{program}`: {detail}")]
    Spawn {
        /// Why, classified.
        kind: SpawnFailure,
        /// The program.
        program: String,
        /// The underlying message.
        detail: String,
    },

    /// The session's shell broke its protocol or died.
    #[error("session `{session}`: {detail}")]
    Session {
        /// The session's name.
        session: String,
        /// What happened.
        detail: String,
    },

    /// The operation is not available on this backend.
    #[error("{0} is not supported here")]
    Unsupported(String),

    /// A local file operation failed.
    #[error("{context} `{}`: {source}", .path.display())]
    Io {
        /// What berth was doing.
        context: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// An I/O error on a stream.
    #[error("{context}: {source}")]
    Stream {
        /// What berth was doing.
        context: &'static str,
        /// The OS error.
        source: std::io::Error,
    },

    /// The state store failed: berth's own account of it.
    #[error("state store: {0}")]
    Store(String),

    /// The state store's database refused a statement.
    #[error("state store: {source}")]
    Database {
        /// SQLite's error, kept whole (code and all).
        source: rusqlite::Error,
    },

    /// A backend call failed with its own library's error, kept as the cause
    /// (an HTTP, SSH or Docker API error).
    #[error("{backend}: {detail}")]
    BackendCall {
        /// The backend's short name.
        backend: &'static str,
        /// What failed, and what to do next.
        detail: String,
        /// The library's error.
        source: BoxError,
    },

    /// A policy refused the command (a deny rule, or an ask that was denied or
    /// timed out).
    #[error("policy refused `{part}`: {reason} (rule `{rule}`){}", hint_suffix(.hint))]
    Denied {
        /// The rule (or `approval`) that refused.
        rule: String,
        /// Why.
        reason: String,
        /// The part of the command that was refused.
        part: String,
        /// What to do next.
        hint: String,
    },
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!("; {hint}")
    }
}

impl Error {
    /// A stream I/O error with context.
    pub fn stream(context: &'static str, source: std::io::Error) -> Self {
        Error::Stream { context, source }
    }

    /// A file I/O error with context and path.
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }

    /// A backend error caused by `source`, which the error keeps.
    pub fn backend_call(
        backend: &'static str,
        detail: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::BackendCall {
            backend,
            detail: detail.into(),
            source: source.into(),
        }
    }

    /// True when SQLite said the database is locked by another connection.
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Error::Database {
                source: rusqlite::Error::SqliteFailure(f, _)
            } if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        )
    }

    /// True when the error means the sandbox itself is gone.
    pub fn is_sandbox_gone(&self) -> bool {
        matches!(self, Error::SandboxGone { .. })
    }
}

impl From<rusqlite::Error> for Error {
    fn from(source: rusqlite::Error) -> Self {
        Error::Database { source }
    }
}

/// A library's error, boxed so a variant can keep it as its source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// berth-core's result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
