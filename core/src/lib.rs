//! berth-core: the domain types, the backend traits, the session engine and the store.
//!
//! Flow at a glance: a caller asks the [`runtime::Runtime`] to run a command in a named
//! sandbox; the runtime finds or provisions the sandbox through a [`backend::Backend`],
//! drives its persistent [`session::Session`], and records the call in the [`store::Store`].

pub mod approvals;
pub mod backend;
pub mod bell;
pub mod checkpoint;
pub mod clock;
pub mod error;
pub mod events;
pub mod gate;
pub mod identity;
pub mod job_state;
pub mod jobs;
pub mod owner;
pub mod pools;
mod procfs;
pub mod procs;
pub mod session;
pub mod spec_diff;

pub mod reaper;
pub mod runtime;
pub mod store;
pub use error::{BackendFailure, Error, Result};
