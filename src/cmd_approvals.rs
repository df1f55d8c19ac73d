//! `berth approvals ls`, `berth approve ID [--always]`, `berth deny ID`:
//! answering the commands that wait for a person, from any terminal.

use anyhow::{Context, Result};
use berth_core::approvals::Approval;
use berth_core::gate::Gate;
use berth_core::store::{Event, Store};
use berth_policies::shell::printable;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::context;
use crate::io::outln;

#[derive(Subcommand, Debug)]
pub enum ApprovalsCmd {
    /// List approvals: pending ones, or all with --all.
    Ls(LsArgs),
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Include answered and expired approvals.
    #[arg(long)]
    pub all: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  berth approvals ls\n  berth approve 3\n  berth approve 3 --always   # and allow this command from now on\n  berth deny 4"
)]
pub struct AnswerArgs {
    /// The approval's id, from `berth approvals ls`.
    pub id: i64,
    /// Also add an allow rule for this command to the policy file.
    #[arg(long)]
    pub always: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

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
    let ap: Approval = store.decide_approval(a.id, approve, a.always && approve, "cli")?;
    let mut rule_added = None;
    if approve && a.always {
        let path = context::policy_path()?;
        let name = format!("approved-{}", ap.id);
        berth_policies::append_allow_rule(
            &path,
            &name,
            &ap.argv,
            &format!("approved with --always (approval #{})", ap.id),
        )
        .with_context(|| {
            format!(
                "approval #{} is approved, but the allow rule was not added",
                ap.id
            )
        })?;
        rule_added = Some((name, path));
    }
    store.append(&Event {
        kind: berth_core::events::EventKind::ApprovalAnswered.into(),
        backend: Some(ap.backend.clone()),
        sandbox: Some(ap.sandbox.clone()),
        command: Some(gate.redact(&ap.command).into_owned()),
        verdict: Some(ap.state.to_string()),
        detail: Some(
            json!({
                "approval": ap.id,
                "always": ap.always,
                "rule_added": rule_added.as_ref().map(|(n, _)| n),
            })
            .to_string(),
        ),
        ..Default::default()
    })?;
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
