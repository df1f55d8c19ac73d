//! Faithful local stand-ins for services berth talks to but cannot reach from
//! a test machine. Each speaks the real wire protocol, from the public spec,
//! and really runs what it is asked to run, so a client tested against it is
//! tested against the protocol, not against itself.
//!
//! Nothing here depends on berth's own crates: a stand-in follows the spec,
//! not berth's client.

pub mod e2b;
pub mod k8s;
#[cfg(feature = "modal")]
pub mod modal;
pub mod provider;
pub mod pty;
