//! `berth approvals ls`, `berth approve ID [--always]`, `berth deny ID`:
//! answering the commands that wait for a person, from any terminal.

use anyhow::Result;
use berth_core::approvals::Approval;
use berth_core::gate::Gate;
use berth_core::store::Store;
use berth_policies::shell::printable;
use serde_json::json;

use crate::context;
use crate::io::outln;

use berth_client::served::approvals::{AnswerArgs, ApprovalsCmd};

/// `approvals ls` on `store`, redacting with `gate`.
pub fn ls(store: &Store, gate: &Gate, cmd: ApprovalsCmd) -> Result<u8> {
    let ApprovalsCmd::Ls(a) = cmd;
    let list = store.approvals(a.all)?;
    if a.json {
        for ap in &list {
            outln!("{}", serde_json::to_value(gate.redact_approval(ap))?);
        }
        return Ok(0);
    }
    if list.is_empty() {
        outln!("no {}approvals", if a.all { "" } else { "pending " });
        return Ok(0);
    }
    let list: Vec<Approval> = list.iter().map(|a| gate.redact_approval(a)).collect();
    for ap in &list {
        outln!(
            "#{:<4} {:<8} {}/{}  {}",
            ap.id,
            ap.state,
            ap.backend,
            ap.sandbox,
            printable(&gate.redact(&ap.command))
        );
        outln!(
            "       rule {}: {}",
            ap.rule,
            printable(&gate.redact(&ap.reason))
        );
    }
    Ok(0)
}

/// `approve`/`deny` on `store`, redacting with `gate`.
pub fn answer(store: &Store, gate: &Gate, a: AnswerArgs, approve: bool) -> Result<u8> {
    if a.always && !approve {
        anyhow::bail!(
            "--always only goes with `berth approve`; `berth deny {}` denies this once",
            a.id
        );
    }
    let policy = if a.always {
        Some(context::policy_path()?)
    } else {
        None
    };
    let done = berth_service::answers::answer(store, gate, a.id, approve, a.always, policy, "cli")?;
    let (ap, rule_added) = (done.approval, done.rule_added);
    if a.json {
        context::print_json(&json!({
            "approval": ap.id,
            "state": ap.state,
            "rule_added": rule_added.as_ref().map(|(n, p)| json!({ "name": n, "file": p })),
        }));
    } else {
        outln!(
            "approval #{} {}: {}",
            ap.id,
            ap.state,
            printable(&gate.redact(&ap.command))
        );
        if let Some((name, path)) = &rule_added {
            outln!("added allow rule `{name}` to {}", path.display());
        }
    }
    Ok(0)
}
