//! `berth run`: the agent loop, its model providers and its journal.
//!
//! Flow at a glance: a [`runner::Agent`] starts or resumes a run from the
//! [`journal`], asks a model through [`provider::Failover`], checks its tool
//! calls ([`validate`]), runs them through a [`host::ToolHost`] (the same
//! dispatch, gate and event log as every other front end), journals each call
//! before and after it runs, and stops with a recorded reason.

pub mod context;
mod error;
pub use error::{Error, Result};
pub mod history;
pub mod host;
pub mod journal;
pub mod notes;
pub mod provider;
pub mod runner;
pub mod tables;
pub mod validate;
pub mod waits;

pub use host::{RegistryTools, ToolHost, ToolOutcome, ToolSpec};
pub use journal::RunState;
pub use runner::{Agent, AgentEvent, Budget, Exit};
