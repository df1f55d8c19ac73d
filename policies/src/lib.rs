//! berth-policies: the pure decisions that make berth safe to hand to an agent.
//!
//! Flow at a glance:
//! - [`Policy`] is read from a TOML file on top of built-in defaults ([`file`]).
//! - [`CommandRules::check`] reads shell text with [`shell::parse`], judges
//!   every simple command in it, and returns a [`Verdict`] (allow, ask or deny)
//!   that names its rule and reason ([`rules`], [`dangerous`]).
//! - [`EnvFilter`] decides which of berth's variables enter a sandbox ([`env`]).
//! - [`Redactor`] masks secrets in output and event text ([`redact`]).
//! - [`Limits`] holds timeouts, output caps and idle lifetimes ([`limits`]).
//! - [`SandboxProfile`] is what the local exec wrapper enforces ([`profile`]).
//! - [`FileRules`] judge the file tools' reads and writes by path ([`files`]).
//!
//! Nothing here runs commands or touches the kernel; enforcement lives at the
//! seams that use these decisions.

pub mod apt;
pub mod argv;
pub mod caution;
pub mod checkpoints;
pub mod dangerous;
pub mod delegation;
pub mod egress;
pub mod embedded;
pub mod env;
pub mod file;
pub mod files;
pub mod limits;
pub mod opaque;
pub mod profile;
pub mod redact;
pub mod rules;
pub mod shell;
pub mod sources;

pub use checkpoints::CheckpointPolicy;
pub use dangerous::Pattern;
pub use delegation::AgentPolicy;
pub use env::EnvFilter;
pub use file::{Approvals, Policy, PolicyError, append_allow_rule};
pub use files::{FileOp, FileRule, FileRules, FileVerdict, MemoryAccess, ToolSwitches};
pub use limits::{Limits, LimitsTable, TimeoutTooLong};
pub use profile::{LocalPolicy, RLimits, SandboxProfile};
pub use redact::Redactor;
pub use rules::{Action, CommandRules, Matcher, Rule, Verdict};
