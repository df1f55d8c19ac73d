//! Answering an approval: what `berth approve`/`deny` and the dashboard's
//! buttons both do, written once below them.

use std::path::PathBuf;

use anyhow::{Context, Result};
use berth_core::approvals::Approval;
use berth_core::gate::Gate;
use berth_core::store::{Event, Store};
use serde_json::json;

/// What an answer did.
pub struct Answered {
    /// The approval as it stands now.
    pub approval: Approval,
    /// The allow rule `always` added, and the policy file it went to.
    pub rule_added: Option<(String, PathBuf)>,
}

/// Approve or deny approval `id` as `by` (`cli`, `ui`); `always` (approve
/// only) also adds an allow rule for its command to the policy file at
/// `policy`. The answer is recorded as an `approval.answered` event.
pub fn answer(
    store: &Store,
    gate: &Gate,
    id: i64,
    approve: bool,
    always: bool,
    policy: Option<PathBuf>,
    by: &str,
) -> Result<Answered> {
    if always && !approve {
        anyhow::bail!("`always` only goes with approving; deny #{id} denies this once");
    }
    let ap: Approval = store.decide_approval(id, approve, always, by)?;
    let mut rule_added = None;
    if approve && always && ap.rule == berth_core::runtime::NET_ASK_RULE {
        // A connection: the host joins the sandbox's own allow rules.
        let host = ap.argv.first().cloned().unwrap_or_default();
        berth_core::runtime::add_network_rule(store, ap.backend, &ap.sandbox, true, &host)
            .with_context(|| {
                format!(
                    "approval #{} is approved, but {host} was not added to sandbox `{}`'s rules",
                    ap.id, ap.sandbox
                )
            })?;
        rule_added = Some((
            host,
            PathBuf::from(format!("sandbox `{}`'s network rules", ap.sandbox)),
        ));
    } else if approve && always {
        let path = policy.context("no policy file to add the allow rule to; set BERTH_POLICY")?;
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
        kind: berth_core::events::EventKind::ApprovalAnswered,
        backend: Some(ap.backend),
        sandbox: Some(ap.sandbox.clone()),
        command: Some(gate.redact(&ap.command).into_owned()),
        verdict: Some(ap.state.to_string()),
        detail: Some(
            json!({
                "approval": ap.id,
                "always": ap.always,
                "by": by,
                "rule_added": rule_added.as_ref().map(|(n, _)| n),
            })
            .to_string(),
        ),
        ..Default::default()
    })?;
    Ok(Answered {
        approval: ap,
        rule_added,
    })
}
