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

/// Why a backend call failed, classified so a caller can act on it without
/// reading the message: retry a [`Transport`](Self::Transport) or
/// [`Timeout`](Self::Timeout), ask for credentials on [`Auth`](Self::Auth),
/// give up on [`Rejected`](Self::Rejected). A vanished sandbox is not here:
/// it is [`Error::SandboxGone`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendFailure {
    /// An identity was not accepted: berth's credentials were missing or
    /// refused (HTTP 401/403, SSH authentication, gRPC `Unauthenticated` or
    /// `PermissionDenied`), or the server's host key was.
    Auth,
    /// A deadline passed before the backend answered.
    Timeout,
    /// The connection could not be made or broke: refused, reset, DNS, TLS, a
    /// lost SSH channel, gRPC `Unavailable`.
    Transport,
    /// The backend was reached and refused or failed the request: an HTTP or
    /// Docker API error status, a gRPC error code, a helper that failed in the
    /// sandbox. The same request will most likely fail the same way.
    Rejected,
    /// A quota or resource ran out: a rate limit, a full disk, gRPC
    /// `ResourceExhausted`. Retrying later, or with less, may work.
    Exhausted,
    /// The backend's answer broke the protocol berth expects: an unreadable
    /// body or archive, a message out of order, output that is not what the
    /// helper prints.
    Protocol,
    /// berth's own side failed before the request left: building a client,
    /// encoding a request, a local file berth keeps for the backend.
    Local,
}

impl BackendFailure {
    /// A short name: `auth`, `timeout`, `transport`, `rejected`, `exhausted`,
    /// `protocol`, `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendFailure::Auth => "auth",
            BackendFailure::Timeout => "timeout",
            BackendFailure::Transport => "transport",
            BackendFailure::Rejected => "rejected",
            BackendFailure::Exhausted => "exhausted",
            BackendFailure::Protocol => "protocol",
            BackendFailure::Local => "local",
        }
    }

    /// The class of an HTTP error status: 401/403 are [`Auth`](Self::Auth),
    /// 408/504 [`Timeout`](Self::Timeout), 429/507
    /// [`Exhausted`](Self::Exhausted), 502/503 (a gateway or proxy that could
    /// not reach the service) [`Transport`](Self::Transport), any other
    /// [`Rejected`](Self::Rejected).
    pub fn from_http_status(status: u16) -> Self {
        match status {
            401 | 403 => BackendFailure::Auth,
            408 | 504 => BackendFailure::Timeout,
            429 | 507 => BackendFailure::Exhausted,
            502 | 503 => BackendFailure::Transport,
            _ => BackendFailure::Rejected,
        }
    }

    /// The class of a local I/O error met while talking to a backend: a
    /// refused, reset or aborted connection is [`Transport`](Self::Transport),
    /// a timed-out one [`Timeout`](Self::Timeout), anything else
    /// [`Local`](Self::Local).
    pub fn from_io(e: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::TimedOut => BackendFailure::Timeout,
            K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::AddrNotAvailable
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown => BackendFailure::Transport,
            _ => BackendFailure::Local,
        }
    }
}

impl std::fmt::Display for BackendFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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

    /// The backend itself cannot be reached or will not let berth in (daemon
    /// down, host unreachable, credentials refused). The sandbox may be fine:
    /// the next call tries again.
    #[error("{backend}: {detail}{}", hint_suffix(.hint))]
    Unreachable {
        /// The backend's short name.
        backend: &'static str,
        /// Why, classified: usually [`BackendFailure::Transport`],
        /// [`BackendFailure::Timeout`] or [`BackendFailure::Auth`].
        kind: BackendFailure,
        /// What failed.
        detail: String,
        /// What to do next.
        hint: String,
        /// The library's error, when there was one.
        #[source]
        source: Option<BoxError>,
    },

    /// A backend call failed: the backend answered with an error, broke its
    /// protocol, or a helper in the sandbox failed.
    #[error("{backend}: {detail}")]
    Backend {
        /// The backend's short name.
        backend: &'static str,
        /// Why, classified.
        kind: BackendFailure,
        /// What failed, and what to do next.
        detail: String,
        /// The library's error, when there was one (an HTTP, SSH, gRPC or
        /// Docker API error), kept whole rather than flattened into `detail`.
        #[source]
        source: Option<BoxError>,
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
    /// The message with its causes after it (`msg: cause: cause`), each cause
    /// once: what a person or a model is shown, where `to_string` gives only
    /// the top line (a backend's library error is kept as the source, not
    /// written into the message).
    pub fn full_text(&self) -> String {
        chain_text(self)
    }

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

    /// The sandbox `sandbox` of `backend` is gone: `reason` says what
    /// happened, `hint` how to get it back.
    pub fn sandbox_gone(
        backend: &'static str,
        sandbox: impl Into<String>,
        reason: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Error::SandboxGone {
            sandbox: sandbox.into(),
            backend,
            reason: reason.into(),
            hint: hint.into(),
        }
    }

    /// A backend error of class `kind`, with no library error behind it.
    pub fn backend(backend: &'static str, kind: BackendFailure, detail: impl Into<String>) -> Self {
        Error::Backend {
            backend,
            kind,
            detail: detail.into(),
            source: None,
        }
    }

    /// A backend error of class `kind` caused by `source`, which the error
    /// keeps: `detail` says what berth was doing, the source says what the
    /// library met.
    pub fn backend_call(
        backend: &'static str,
        kind: BackendFailure,
        detail: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            kind,
            detail: detail.into(),
            source: Some(source.into()),
        }
    }

    /// The backend cannot be reached or will not let berth in; `hint` says
    /// what to do.
    pub fn unreachable(
        backend: &'static str,
        kind: BackendFailure,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Error::Unreachable {
            backend,
            kind,
            detail: detail.into(),
            hint: hint.into(),
            source: None,
        }
    }

    /// This error with `cause` kept as its source, where the variant keeps
    /// one ([`Error::Backend`], [`Error::Unreachable`]); other errors are
    /// returned as they are.
    pub fn caused_by(mut self, cause: impl Into<BoxError>) -> Self {
        if let Error::Backend { source, .. } | Error::Unreachable { source, .. } = &mut self {
            *source = Some(cause.into());
        }
        self
    }

    /// How a backend call failed, for [`Error::Backend`] and
    /// [`Error::Unreachable`]; `None` for every other error, a vanished
    /// sandbox included (see [`Error::is_sandbox_gone`]).
    pub fn backend_kind(&self) -> Option<BackendFailure> {
        match self {
            Error::Backend { kind, .. } | Error::Unreachable { kind, .. } => Some(*kind),
            _ => None,
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

/// `e`'s message followed by each source's that it does not already hold.
pub fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let c = cause.to_string();
        if !c.is_empty() && !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn http_statuses_classify() {
        assert_eq!(BackendFailure::from_http_status(401), BackendFailure::Auth);
        assert_eq!(BackendFailure::from_http_status(403), BackendFailure::Auth);
        assert_eq!(
            BackendFailure::from_http_status(504),
            BackendFailure::Timeout
        );
        assert_eq!(
            BackendFailure::from_http_status(429),
            BackendFailure::Exhausted
        );
        assert_eq!(
            BackendFailure::from_http_status(503),
            BackendFailure::Transport
        );
        assert_eq!(
            BackendFailure::from_http_status(400),
            BackendFailure::Rejected
        );
        assert_eq!(
            BackendFailure::from_http_status(500),
            BackendFailure::Rejected
        );
    }

    #[test]
    fn io_errors_classify() {
        let io = |k| std::io::Error::from(k);
        use std::io::ErrorKind as K;
        assert_eq!(
            BackendFailure::from_io(&io(K::ConnectionRefused)),
            BackendFailure::Transport
        );
        assert_eq!(
            BackendFailure::from_io(&io(K::ConnectionReset)),
            BackendFailure::Transport
        );
        assert_eq!(
            BackendFailure::from_io(&io(K::TimedOut)),
            BackendFailure::Timeout
        );
        assert_eq!(
            BackendFailure::from_io(&io(K::PermissionDenied)),
            BackendFailure::Local
        );
    }

    #[test]
    fn backend_errors_keep_kind_and_source() {
        let cause = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let e = Error::backend_call("ssh", BackendFailure::Transport, "reading a file", cause);
        assert_eq!(e.backend_kind(), Some(BackendFailure::Transport));
        assert_eq!(e.to_string(), "ssh: reading a file");
        let source = e.source().map(ToString::to_string);
        assert_eq!(
            source,
            Some(std::io::Error::from(std::io::ErrorKind::ConnectionReset).to_string())
        );

        let e = Error::unreachable(
            "e2b",
            BackendFailure::Auth,
            "key refused",
            "set E2B_API_KEY",
        )
        .caused_by(std::io::Error::other("401"));
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
        assert!(e.source().is_some());
        assert_eq!(e.to_string(), "e2b: key refused; set E2B_API_KEY");

        let plain = Error::backend("docker", BackendFailure::Protocol, "odd answer");
        assert!(plain.source().is_none());
        let gone = Error::SandboxGone {
            sandbox: "s".into(),
            backend: "docker",
            reason: "gone".into(),
            hint: String::new(),
        };
        assert_eq!(gone.backend_kind(), None);
        assert!(gone.is_sandbox_gone());
    }

    #[test]
    fn full_text_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer reset");
        let e = Error::backend_call("ssh", BackendFailure::Transport, "the link dropped", io);
        assert_eq!(e.to_string(), "ssh: the link dropped");
        assert_eq!(e.full_text(), "ssh: the link dropped: peer reset");
        let said = Error::backend_call(
            "ssh",
            BackendFailure::Transport,
            "the link dropped (peer reset)",
            std::io::Error::other("peer reset"),
        );
        assert_eq!(said.full_text(), "ssh: the link dropped (peer reset)");
    }
}
