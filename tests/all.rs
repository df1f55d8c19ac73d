//! berth's end-to-end tests, compiled as one binary.
//!
//! - `conformance`: one set of assertions about the session engine, run against
//!   every backend; a backend joins by adding one `conformance_suite!` line.
//! - `jobs`: background jobs through the runtime, likewise per backend.
//! - `e2b_backend`: the e2b backend's faults, recovery and keep-alive against the
//!   stand-in, and the official Python SDK against the same stand-in.
//! - `k8s_backend`: the k8s backend's faults against the stand-in: an
//!   evicted or deleted pod, a drained or lost node, a lost API server, a
//!   job in a pod that is gone; plain pods where agent-sandbox is missing.
//! - `k8s_standin`: the Kubernetes stand-in checked with `kubectl` and the
//!   official Python client (pods on the real Docker engine).
//! - `agent`, `context`: `berth run` against the model provider stand-in;
//!   `context` keeps a run inside a small context window.
//! - `memory`: notes across runs and the search over past transcripts.
//! - `pools`: warm pools (`berth pool`, `sandbox create --from-pool`) on
//!   docker and on the k8s stand-in, from the CLI: taken warm, refilled,
//!   kept through a killed server, bad input refused; `bench --create`.
//! - `schema`: each crate's own tables, on a new database and on one made
//!   while all tables were one list.
//! - `cli`: the `berth` binary from the outside, on the local backend.
//! - `cp`: `berth cp` both ways on local, docker and ssh: trees, large files,
//!   ownership, archives on stdin and stdout, errors, the file rules.
//! - `readme`: the README's tour, Docker and SSH blocks, line by line as shown.
//! - `ssh_cli`: the `berth` binary on the ssh backend, against a real sshd.
//! - `serve`: the CLI as a client of `berth serve`, and the server's faults.
//! - `sdk`: the Python SDK's pytest suite over the typed API (`berth.v1`),
//!   against a real server on local and docker.
//! - `ui`: `berth ui` in headless Chromium against a real server, and its
//!   refusals (no token, a wrong origin or host, a sandboxed peer).
//! - `sandbox_escape`, `restricted_session`: the kernel-restricted local shell
//!   (kernel-dependent: they fail, naming the missing feature, on a kernel
//!   without Landlock ABI >= 4, seccomp or, as root, a pids cgroup).

mod support;

mod agent;
mod checkpoints;
mod cli;
mod context;
mod cp;
mod delegate;
#[cfg(feature = "docker")]
mod docker_settings;
mod e2b_backend;
mod egress;
mod follow;
#[cfg(feature = "docker")]
mod k8s_backend;
#[cfg(feature = "docker")]
mod k8s_standin;
mod mcp;
mod mcp_tools;
mod memory;
#[macro_use]
mod conformance;
#[macro_use]
mod jobs;
mod listeners;
mod modal_faults;
mod modal_sdk;
mod policy_cli;
#[cfg(feature = "docker")]
mod pools;
mod readme;
mod restricted_session;
mod schedules;
mod schema;
mod sdk;
mod shell;
mod ssh_cli;
#[cfg(feature = "docker")]
mod ui;
#[macro_use]
mod terminal;
mod sandbox_escape;
mod serve;
mod waits;
mod webhooks;

conformance_suite!(local, crate::support::local_harness);
#[cfg(feature = "ssh")]
conformance_suite!(ssh, crate::support::ssh_harness);
#[cfg(feature = "docker")]
conformance_suite!(docker, crate::support::docker_harness);
conformance_suite!(e2b, crate::support::e2b_harness);
conformance_suite!(modal, crate::support::modal_harness);
#[cfg(feature = "docker")]
conformance_suite!(k8s, crate::support::k8s_harness);
jobs_suite!(local_jobs, crate::support::local_harness);
#[cfg(feature = "ssh")]
jobs_suite!(ssh_jobs, crate::support::ssh_harness);
#[cfg(feature = "docker")]
jobs_suite!(docker_jobs, crate::support::docker_harness);
jobs_suite!(e2b_jobs, crate::support::e2b_harness);
jobs_suite!(modal_jobs, crate::support::modal_harness);
#[cfg(feature = "docker")]
jobs_suite!(k8s_jobs, crate::support::k8s_pods_harness);
terminal_suite!(local_terminal, crate::support::local_harness);
#[cfg(feature = "ssh")]
terminal_suite!(ssh_terminal, crate::support::ssh_harness);
#[cfg(feature = "docker")]
terminal_suite!(docker_terminal, crate::support::docker_harness);
terminal_suite!(e2b_terminal, crate::support::e2b_harness);
terminal_suite!(modal_terminal, crate::support::modal_harness);
#[cfg(feature = "docker")]
terminal_suite!(k8s_terminal, crate::support::k8s_harness);
