//! berth's end-to-end tests, compiled as one binary.
//!
//! - `conformance`: one set of assertions about the session engine, run against
//!   every backend; a backend joins by adding one `conformance_suite!` line.
//! - `cli`: the `berth` binary from the outside, on the local backend.

mod support;

mod cli;
#[macro_use]
mod conformance;

conformance_suite!(local, crate::support::local_harness);
conformance_suite!(ssh, crate::support::ssh_harness);
