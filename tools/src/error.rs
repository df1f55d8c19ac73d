//! berth-tools' error: what the memory's functions refuse, by name, and what
//! failed below them, kept whole as the source.

/// berth-tools' error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A note with no text.
    #[error("a note needs text: say what is worth remembering")]
    EmptyNote,
    /// A note over the longest a note may be.
    #[error(
        "a note is at most {max} characters and this one has {chars}: keep the fact, and point to a file for the rest"
    )]
    NoteTooLong {
        /// Its length in characters.
        chars: usize,
        /// The most a note may have ([`crate::memory::NOTE_MAX_CHARS`]).
        max: usize,
    },
    /// No such note in what the caller sees.
    #[error(
        "no note {id}{}; list them with `memory` action `search` or `berth memory ls`",
        if *.in_sandbox { " in this sandbox" } else { "" }
    )]
    NoSuchNote {
        /// The id asked for.
        id: i64,
        /// The caller sees one sandbox's notes (and the user's).
        in_sandbox: bool,
    },
    /// A model asked to forget a note that is the user's.
    #[error(
        "note {id} is the user's, across sandboxes: only a person forgets it (`berth memory rm {id}`), unless the policy says [tools] memory = \"user\""
    )]
    UsersNote {
        /// The note.
        id: i64,
    },
    /// A search with nothing to search for.
    #[error("search for words: the query has no letters or digits")]
    EmptyQuery,
    /// The store (or another part of berth-core) failed.
    #[error(transparent)]
    Core(#[from] berth_core::Error),
}

impl Error {
    /// True when the caller's input was at fault (not the store).
    pub fn is_invalid_input(&self) -> bool {
        !matches!(self, Error::Core(_))
    }
}

/// berth-tools' result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
