//! berth-agent's error: what a run could not do, by name, with the cause kept
//! as the source (a journal that cannot be read, the store or the sandbox
//! below, a memory call refused).

/// berth-agent's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No run has this id.
    #[error("run `{0}` not found; list runs with `berth runs ls`")]
    RunNotFound(String),
    /// A fork at a step the run does not have.
    #[error("run {run} has steps 1 to {last}; pick --at within them")]
    NoSuchStep {
        /// The run forked.
        run: String,
        /// Its last step.
        last: i64,
    },
    /// Another live berth carries the run on.
    #[error(
        "run {run} is being carried on by another berth (pid {pid}); wait for it to stop, or stop it first"
    )]
    Busy {
        /// The run.
        run: String,
        /// The other berth's pid.
        pid: i64,
    },
    /// The journal holds what this berth cannot read back.
    #[error("run journal: {what}")]
    Journal {
        /// What could not be read or written.
        what: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The journal names a state this berth does not know (a newer berth wrote it).
    #[error("run journal: {what} in unknown state `{state}`; a newer berth may have written it")]
    UnknownState {
        /// A run, or a tool call.
        what: &'static str,
        /// The state as stored.
        state: String,
    },
    /// The store, a sandbox or the gate below failed.
    #[error(transparent)]
    Core(#[from] berth_core::Error),
    /// A memory call failed.
    #[error(transparent)]
    Tools(#[from] berth_tools::Error),
}

impl Error {
    /// A journal's (de)serialisation error, kept as the source.
    pub(crate) fn journal(what: impl Into<String>, source: serde_json::Error) -> Self {
        Error::Journal {
            what: what.into(),
            source,
        }
    }
}

/// berth-agent's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
