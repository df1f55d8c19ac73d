//! `berth sandbox reap`: remove sandboxes idle longer than the policy allows.

use anyhow::Result;
use berth_core::reaper;
use berth_core::runtime::Runtime;

use crate::context;
use crate::io::outln;

use berth_client::served::sandbox::ReapArgs;

pub async fn run(rt: &Runtime, a: ReapArgs) -> Result<u8> {
    let idle = reaper::reap_idle(rt, a.dry_run).await?;
    let mut failed = false;
    for i in &idle {
        failed |= i.error.is_some();
        if a.json {
            context::print_json(&serde_json::to_value(i)?);
            continue;
        }
        let what = match (&i.error, a.dry_run) {
            (Some(e), _) => format!("could not remove: {e}"),
            (None, true) => "would remove".into(),
            (None, false) => "removed".into(),
        };
        outln!(
            "{what}: {} ({}), idle {}s > {}s",
            i.name,
            i.backend,
            i.idle_secs,
            i.lifetime_secs
        );
    }
    if idle.is_empty() && !a.json {
        outln!("no idle sandboxes");
    }
    Ok(if failed { 1 } else { 0 })
}
