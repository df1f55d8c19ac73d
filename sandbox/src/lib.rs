//! berth-sandbox: the local backend's kernel sandbox.
//!
//! Flow at a glance:
//! - berth (multi-threaded, async) builds a [`WrapperCommand`]: the typed argv
//!   prefix `berth __sandbox-exec --policy … --sandbox-dir … -- ` that the local
//!   backend puts in front of every process it spawns;
//! - the new process enters [`dispatch`] first thing in `main`, still single
//!   threaded, and [`exec`] restricts itself, one module per mechanism:
//!   [`env`] (inherited fds), [`cgroup`] (pids bound), [`rlimits`],
//!   [`mounts`] (a mount namespace where all but the write grants is
//!   read-only, so no metadata outside them changes), [`own_uid`] (berth
//!   run as root: the sandbox runs as a uid of its own), [`caps`], no_new_privs,
//!   [`landlock`] (files, TCP, signal and socket scopes) and [`seccomp`]
//!   (syscalls and their arguments);
//! - then it execs the real argv, so the restrictions hold for the whole
//!   process tree that follows.
//!
//! What is granted comes from `berth-policies` ([`berth_policies::LocalPolicy`]
//! and [`berth_policies::SandboxProfile`]); this crate only enforces it.

pub mod caps;
pub mod cgroup;
mod command;
pub mod door;
pub mod env;
mod error;
pub mod exec;
pub mod landlock;
pub mod mounts;
pub mod own_uid;
pub mod private;
#[cfg(test)]
mod readback;
pub mod rlimits;
pub mod seccomp;

pub use command::{SpawnTarget, WrapperCommand};
pub use error::{Error, Result};
pub use exec::{SUBCOMMAND, dispatch};
