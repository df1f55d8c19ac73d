//! berth's end-to-end tests, compiled as one binary.
//!
//! - `conformance`: one set of assertions about the session engine, run against
//!   every backend; a backend joins by adding one `conformance_suite!` line.
//! - `jobs`: background jobs through the runtime, likewise per backend.
//! - `cli`: the `berth` binary from the outside, on the local backend.
//! - `sandbox_escape`, `restricted_session`: the kernel-restricted local shell
//!   (kernel-dependent: they fail, naming the missing feature, on a kernel
//!   without Landlock ABI >= 4, seccomp or, as root, a pids cgroup).

mod support;

mod cli;
mod mcp;
#[macro_use]
mod conformance;
#[macro_use]
mod jobs;
mod policy_cli;
mod restricted_session;
mod sandbox_escape;

conformance_suite!(local, crate::support::local_harness);
conformance_suite!(ssh, crate::support::ssh_harness);
conformance_suite!(docker, crate::support::docker_harness);
jobs_suite!(local_jobs, crate::support::local_harness);
jobs_suite!(ssh_jobs, crate::support::ssh_harness);
jobs_suite!(docker_jobs, crate::support::docker_harness);
