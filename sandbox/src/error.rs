//! The sandbox's errors: either the kernel cannot enforce what the policy asks
//! (berth refuses to run rather than run unconfined), or setting it up failed.

/// What went wrong while restricting a process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This kernel lacks a feature the profile needs.
    #[error("{0}")]
    Unsupported(String),
    /// Applying a restriction failed.
    #[error("{what}: {source}")]
    Setup {
        /// The step that failed.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The wrapper's arguments are wrong.
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// A failed setup step.
    pub fn setup(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Error::Setup {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
