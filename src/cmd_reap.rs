//! `berth sandbox reap`: remove sandboxes idle longer than the policy allows.

use anyhow::Result;
use berth_core::reaper;
use berth_core::runtime::Runtime;
use clap::Args;

use crate::context;
use crate::io::outln;

#[derive(Args, Debug)]
#[command(
    after_help = "The idle lifetime is `idle_lifetime_secs` under [limits] in the policy file \
(per sandbox under [limits.sandbox.NAME]); 0 keeps a sandbox forever.\n\n\
Examples:\n  berth sandbox reap --dry-run\n  berth sandbox reap --json"
)]
pub struct ReapArgs {
    /// Only list what would be removed.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON object per sandbox.
    #[arg(long)]
    pub json: bool,
}

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
