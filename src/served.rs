//! The served subcommands: `sandbox …` and `exec --background` (`job …`,
//! `approvals`, `approve`, `deny` and `events` are clients of the typed
//! API, `berth.v1`, in `cmd_job`, `cmd_approvals` and `cmd_events`). `berth serve` runs them for a
//! client on its warm runtime; with `BERTH_SERVER=off` the CLI runs them
//! in-process. Both go through [`run_on`] here, below both: the server does
//! not reach up into the CLI's `main`.
//!
//! A served call arrives typed ([`berth_client::served::Call`]): the thin
//! client parsed the command line with the same clap types the engine's own
//! command line flattens, and sent the value. What the subcommand prints
//! streams back as it is printed (`job logs --follow`, `events --follow`)
//! through [`crate::io`]. `exec`, which is called far more often and whose
//! report scripts read field by field, has typed calls of its own (`Exec`,
//! and the quick framing).

use std::path::Path;

use anyhow::Result;
pub use berth_client::served::{Call, Served};
use berth_core::runtime::Runtime;

use crate::cmd_sandbox;

/// Run a served call on `rt`, whose state dir is `dir`.
pub async fn run_on(rt: &Runtime, dir: &Path, call: Call) -> Result<u8> {
    match call {
        Call::Sub(Served::Sandbox(c)) => cmd_sandbox::run_on(rt, dir, c).await,
        // Clients of the typed API (`berth.v1` Approvals), never a `Run`.
        Call::Sub(
            Served::Approvals(_)
            | Served::Approve(_)
            | Served::Deny(_)
            | Served::Events(_)
            | Served::Job(_),
        ) => Err(anyhow::anyhow!(
            "approvals, events and jobs are clients of the typed API (berth.v1 Approvals, Events, Jobs), not served subcommands; this client is older than the server: run the berth this server came with"
        )),
        Call::Background(_) => Err(anyhow::anyhow!(
            "`exec --background` is a client of the typed API (berth.v1 Jobs.Start), not a served subcommand; this client is older than the server: run the berth this server came with"
        )),
    }
}
