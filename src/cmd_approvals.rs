//! `berth approvals ls`, `berth approve ID [--always]`, `berth deny ID`:
//! answering the commands that wait for a person, from any terminal.
//!
//! A client of the typed API's `Approvals` service (`berth.v1`): through
//! the server, or with `BERTH_SERVER=off` on the same service in this
//! process. Either way the values are the API's, and this prints them: no
//! output is captured to form a reply.

use std::path::Path;

use anyhow::{Result, anyhow};
use berth_policies::shell::printable;
use berth_service::proto;
use berth_service::proto::approvals_client::ApprovalsClient;
use berth_service::proto::approvals_server::Approvals;
use serde_json::json;

use crate::api_client::{Api, call};
use crate::server;

use crate::api_args::Served;
use crate::api_args::approvals::{AnswerArgs, ApprovalsCmd};

async fn list(api: &Api, all: bool) -> Result<Vec<proto::Approval>> {
    let req = proto::ListApprovals { all };
    Ok(call!(api, ApprovalsClient, Approvals, list, req)?.approvals)
}

async fn answer_call(api: &Api, id: i64, allow: bool, always: bool) -> Result<proto::Approval> {
    let req = proto::AnswerApproval {
        id,
        allow,
        always,
        via: proto::AnsweredVia::Cli as i32,
    };
    call!(api, ApprovalsClient, Approvals, answer, req)
}

/// Run `approvals ls`, `approve` or `deny` against the state dir `dir`.
pub async fn run(dir: &Path, mode: server::Mode, cmd: Served) -> Result<u8> {
    if let Served::Deny(a) = &cmd
        && a.always
    {
        anyhow::bail!(
            "--always only goes with `berth approve`; `berth deny {}` denies this once",
            a.id
        );
    }
    let api = Api::open(dir, mode).await?;
    let r = match cmd {
        Served::Approvals(ApprovalsCmd::Ls(a)) => {
            let list = list(&api, a.all).await;
            list.map(|l| print_list(&l, a.all, a.json))
        }
        Served::Approve(a) => answer(&api, &a, true).await,
        Served::Deny(a) => answer(&api, &a, false).await,
        other => Err(anyhow!("not an approvals command: {other:?}")),
    };
    api.close().await;
    r.map(|()| 0)
}

async fn answer(api: &Api, a: &AnswerArgs, allow: bool) -> Result<()> {
    let ap = answer_call(api, a.id, allow, a.always).await?;
    if a.json {
        println!(
            "{}",
            json!({
                "approval": ap.id,
                "state": state(&ap),
                "rule_added": ap.rule_added.as_ref().map(|n| json!({ "name": n, "file": ap.rule_file })),
            })
        );
    } else {
        println!(
            "approval #{} {}: {}",
            ap.id,
            state(&ap),
            printable(&ap.command)
        );
        if let (Some(name), Some(file)) = (&ap.rule_added, &ap.rule_file) {
            println!("added allow rule `{name}` to {file}");
        }
    }
    Ok(())
}

fn state(ap: &proto::Approval) -> &'static str {
    match proto::ApprovalState::try_from(ap.state) {
        Ok(proto::ApprovalState::ApprovalPending) => "pending",
        Ok(proto::ApprovalState::ApprovalApproved) => "approved",
        Ok(proto::ApprovalState::ApprovalDenied) => "denied",
        Ok(proto::ApprovalState::ApprovalExpired) => "expired",
        _ => "unknown",
    }
}

/// The sandbox's backend and name.
fn place(ap: &proto::Approval) -> (String, String) {
    let r = ap.sandbox.clone().unwrap_or_default();
    let backend = berth_service::convert::backend(r.backend)
        .map(|b| b.as_str().to_string())
        .unwrap_or_else(|_| "?".into());
    (backend, r.name)
}

fn print_list(list: &[proto::Approval], all: bool, as_json: bool) {
    if as_json {
        for ap in list {
            let (backend, sandbox) = place(ap);
            println!(
                "{}",
                json!({
                    "id": ap.id, "created_unix": ap.created_unix,
                    "sandbox": sandbox, "backend": backend,
                    "command": ap.command, "part": ap.part, "argv": ap.argv,
                    "rule": ap.rule, "reason": ap.reason, "state": state(ap),
                    "always": ap.always, "decided_unix": ap.decided_unix,
                    "decided_by": ap.decided_by,
                })
            );
        }
        return;
    }
    if list.is_empty() {
        println!("no {}approvals", if all { "" } else { "pending " });
        return;
    }
    for ap in list {
        let (backend, sandbox) = place(ap);
        println!(
            "#{:<4} {:<8} {}/{}  {}",
            ap.id,
            state(ap),
            backend,
            sandbox,
            printable(&ap.command)
        );
        println!("       rule {}: {}", ap.rule, printable(&ap.reason));
    }
}
