//! The served subcommands: `job …`, `sandbox …`, `events` and `exec
//! --background` (`approvals`, `approve` and `deny` are clients of the typed
//! API, `berth.v1`, in `cmd_approvals`). `berth serve` runs them for a
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

use crate::{cmd_events, cmd_exec, cmd_job, cmd_sandbox};

/// Run a served call on `rt`, whose state dir is `dir`.
pub async fn run_on(rt: &Runtime, dir: &Path, call: Call) -> Result<u8> {
    match call {
        Call::Sub(Served::Job(c)) => cmd_job::run_on(rt, c).await,
        Call::Sub(Served::Sandbox(c)) => cmd_sandbox::run_on(rt, dir, c).await,
        Call::Sub(Served::Events(a)) => cmd_events::run_on(rt, a).await,
        // Clients of the typed API (`berth.v1` Approvals), never a `Run`.
        Call::Sub(Served::Approvals(_) | Served::Approve(_) | Served::Deny(_)) => {
            Err(anyhow::anyhow!(
                "approvals are answered through the typed API (berth.v1 Approvals), not as a served subcommand; this client is older than the server: run the berth this server came with"
            ))
        }
        Call::Background(a) => cmd_exec::background_on(rt, a).await,
    }
}
