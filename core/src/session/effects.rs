//! Which commands can change what a snapshot holds.
//!
//! The engine asks this before each command, to skip the snapshot after one
//! that cannot change the shell's state. berth has one reader of shell text, in
//! `berth-policies`, which the policy gate uses too; this module only names it
//! for the engine. Its contract is unchanged: it errs one way only, and
//! anything it does not understand counts as a possible change (see
//! [`berth_policies::shell::effects`]).

pub use berth_policies::shell::{Effects, effects, journal};
