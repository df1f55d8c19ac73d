//! Settling a model turn's tool calls: each is validated, checked against the
//! policy gate and its approvals, journaled started, run, and journaled
//! finished, so that a run killed at any point resumes without running a call
//! twice.

use std::collections::HashMap;

use super::delegate::{DELEGATE, Pending};
use super::wait::{WAIT_FOR, Waited};
use super::*;
use crate::context::bound;
use crate::journal::{CallKey, CallState};

/// Where an approval stands for the loop.
pub(super) enum Decision {
    Approved,
    Denied(String),
    Pending(i64),
    Cancelled,
}

impl Agent {
    /// Give every tool call of the last model turn a result, in order.
    /// Returns `Some` when the run must stop here.
    pub(super) async fn settle(
        &mut self,
        id: &str,
        setup: &Setup,
        msgs: &mut Vec<(i64, Message)>,
        cancel: &CancellationToken,
    ) -> Result<Stopped> {
        let Some(pos) = msgs.iter().rposition(|(_, m)| m.role == Role::Assistant) else {
            return Ok(None);
        };
        let (step, turn) = (msgs[pos].0, msgs[pos].1.clone());
        let answered: HashSet<String> = msgs[pos + 1..]
            .iter()
            .filter_map(|(_, m)| m.tool_call_id.clone())
            .collect();
        if turn.tool_calls.iter().all(|c| answered.contains(&c.id)) {
            return Ok(None);
        }
        let stop = if turn.truncated {
            Stop::MaxTokens
        } else {
            Stop::ToolUse
        };
        let checked = validate::turn(
            &turn.tool_calls,
            stop,
            &setup.tools,
            setup.max_calls_per_turn,
        );
        let journaled = journal::calls_of_step(&self.store, id, step)?;
        // The turn's `delegate` calls run together, at the first of them:
        // their sub-agents work at the same time.
        let batch: Vec<Pending> = turn
            .tool_calls
            .iter()
            .zip(&checked)
            .enumerate()
            .filter(|(_, (c, _))| c.name == DELEGATE && !answered.contains(&c.id))
            .filter_map(|(idx, (c, check))| {
                let args = check.as_ref().ok()?.clone();
                Some(Pending {
                    idx: idx as i64,
                    call_id: c.id.clone(),
                    args,
                    args_text: journal_args(&self.redact, &c.arguments),
                })
            })
            .collect();
        let mut delegated: Option<HashMap<String, ToolOutcome>> = None;
        for (idx, (call, check)) in turn.tool_calls.iter().zip(checked).enumerate() {
            if answered.contains(&call.id) {
                continue;
            }
            let args_text = journal_args(&self.redact, &call.arguments);
            let key = CallKey {
                call_id: &call.id,
                idx: idx as i64,
                name: &call.name,
                args: &args_text,
            };
            let prior = journaled
                .iter()
                .find(|c| c.call_id == call.id && c.step == step);
            match prior.map(|p| (p.state, p.approval)) {
                // A `delegate` cut off carries on: its sub-agents journal
                // their own calls, and the ones that ended are not rerun.
                Some((CallState::Started, _)) if call.name != DELEGATE && call.name != WAIT_FOR => {
                    let text = "[berth: this call was cut off: berth stopped while it was running, so its outcome is unknown. It was not run again. Check the sandbox's state (files, processes) before you repeat it.]";
                    self.verdict(&call.id, "cut_off", text, None);
                    self.finish(
                        id,
                        step,
                        key,
                        CallState::CutOff,
                        Some("cut_off"),
                        json!({ "cut_off": true }),
                        text,
                        true,
                        msgs,
                    )?;
                    continue;
                }
                Some((CallState::AwaitingApproval, Some(a))) => {
                    match self.decision(a, cancel).await? {
                        Decision::Approved => {}
                        Decision::Denied(why) => {
                            self.denied(id, step, key, a, &why, msgs)?;
                            continue;
                        }
                        Decision::Pending(a) => return Ok(Some(self.paused(id, &call.id, a))),
                        Decision::Cancelled => return Ok(Some(interrupted())),
                    }
                }
                _ => {}
            }
            let args = match check {
                Ok(a) => a,
                Err(why) => {
                    let text = format!("[berth: {why}]");
                    self.verdict(&call.id, "invalid", &why, None);
                    self.finish(
                        id,
                        step,
                        key,
                        CallState::Rejected,
                        Some("invalid"),
                        json!({ "invalid": why }),
                        &text,
                        true,
                        msgs,
                    )?;
                    continue;
                }
            };
            if call.name == WAIT_FOR {
                let started = prior.is_some_and(|p| p.state == CallState::Started);
                match self.wait_call(id, step, idx as i64, &call.id, &args, &args_text, started)? {
                    Waited::Result(outcome) => {
                        let state = match &outcome {
                            ToolOutcome::Done { detail, .. } if detail.is_null() => {
                                CallState::Rejected
                            }
                            _ => CallState::Finished,
                        };
                        self.ran(id, step, key, state, outcome, Instant::now(), msgs)?
                    }
                    Waited::Pause(why) => return Ok(Some((RunState::Waiting, Some(why), None))),
                }
                continue;
            }
            if call.name == DELEGATE {
                let t0 = Instant::now();
                if delegated.is_none() {
                    match self.delegate_turn(id, setup, step, &batch, cancel).await? {
                        Ok(map) => delegated = Some(map),
                        Err(stop) => return Ok(stop),
                    }
                }
                let outcome = delegated
                    .as_mut()
                    .and_then(|m| m.remove(&call.id))
                    .unwrap_or_else(|| {
                        ToolOutcome::error("[berth: this delegate call was not carried out]")
                    });
                self.ran(id, step, key, CallState::Finished, outcome, t0, msgs)?;
                continue;
            }
            loop {
                journal::call_started(
                    &self.store,
                    id,
                    &call.id,
                    step,
                    idx as i64,
                    &call.name,
                    &args_text,
                )?;
                (self.events)(&AgentEvent::ToolCall {
                    step,
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    args: serde_json::from_str(&args_text).unwrap_or(Value::Null),
                    describe: self.host.describe(&call.name, &args),
                });
                let t0 = Instant::now();
                let outcome = self
                    .host
                    .call(&call.name, &args, cancel.child_token())
                    .await;
                match outcome {
                    ToolOutcome::NeedsApproval { approval, reason } => {
                        journal::call_awaiting(&self.store, id, &call.id, approval)?;
                        self.verdict(&call.id, "ask", &reason, Some(approval));
                        if !self.wait_approvals {
                            return Ok(Some(self.paused(id, &call.id, approval)));
                        }
                        match self.decision(approval, cancel).await? {
                            Decision::Approved => continue,
                            Decision::Denied(why) => {
                                self.denied(id, step, key, approval, &why, msgs)?;
                                break;
                            }
                            Decision::Pending(a) => return Ok(Some(self.paused(id, &call.id, a))),
                            Decision::Cancelled => return Ok(Some(interrupted())),
                        }
                    }
                    done @ ToolOutcome::Done { .. } => {
                        self.ran(id, step, key, CallState::Finished, done, t0, msgs)?;
                        if cancel.is_cancelled() {
                            return Ok(Some(interrupted()));
                        }
                        break;
                    }
                }
            }
        }
        Ok(None)
    }

    /// A call that ran (or was answered without running): its result,
    /// bounded, told to the front end and journaled with `state`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ran(
        &self,
        id: &str,
        step: i64,
        key: CallKey<'_>,
        state: CallState,
        outcome: ToolOutcome,
        t0: Instant,
        msgs: &mut Vec<(i64, Message)>,
    ) -> Result<()> {
        let ToolOutcome::Done {
            text,
            is_error,
            detail,
        } = outcome
        else {
            return Ok(());
        };
        let sent = bound(&text, RESULT_LIMIT);
        (self.events)(&AgentEvent::Result {
            call_id: key.call_id.into(),
            is_error,
            bytes: sent.len(),
            detail: detail.clone(),
            duration_ms: t0.elapsed().as_millis() as u64,
        });
        self.finish(
            id,
            step,
            key,
            state,
            None,
            json!({ "is_error": is_error, "detail": detail }),
            &sent,
            is_error,
            msgs,
        )
    }

    pub(super) fn verdict(
        &self,
        call_id: &str,
        verdict: &str,
        detail: &str,
        approval: Option<i64>,
    ) {
        (self.events)(&AgentEvent::Verdict {
            call_id: call_id.into(),
            verdict: verdict.into(),
            detail: detail.into(),
            approval,
        });
    }

    pub(super) fn paused(
        &self,
        id: &str,
        call_id: &str,
        approval: i64,
    ) -> (RunState, Option<String>, Option<String>) {
        (
            RunState::AwaitingApproval,
            Some(format!(
                "tool call {call_id} waits for approval #{approval}: answer it with `berth approve {approval}` or `berth deny {approval}`, then carry on with `berth run --resume {id}`"
            )),
            None,
        )
    }

    /// Where approval `a` stands; with `--wait`, wait until someone answers.
    pub(super) async fn decision(&self, a: i64, cancel: &CancellationToken) -> Result<Decision> {
        let mut ap = self.store.approval(a)?;
        if ap.state == ApprovalState::Pending && self.wait_approvals {
            // A week: the person decides; the policy's timeout applies to
            // commands that block, not to a run that is saved either way.
            let wait = approvals::wait(
                &self.store,
                a,
                Duration::from_secs(7 * 86400),
                APPROVAL_POLL,
            );
            ap = tokio::select! {
                r = wait => r?,
                _ = cancel.cancelled() => return Ok(Decision::Cancelled),
            };
        }
        Ok(match ap.state {
            ApprovalState::Approved => Decision::Approved,
            ApprovalState::Pending => Decision::Pending(a),
            ApprovalState::Denied => Decision::Denied(format!(
                "approval #{a} was denied by {}",
                ap.decided_by.unwrap_or_else(|| "someone".into())
            )),
            ApprovalState::Expired => Decision::Denied(format!(
                "nobody answered approval #{a} in time, so it was denied"
            )),
        })
    }

    /// A call a person denied (approval `approval`): answered, not run.
    fn denied(
        &self,
        id: &str,
        step: i64,
        key: CallKey<'_>,
        approval: i64,
        why: &str,
        msgs: &mut Vec<(i64, Message)>,
    ) -> Result<()> {
        let text = format!(
            "[berth: the policy asked a person about this call and the answer was no: {why}. It was not run.]"
        );
        self.verdict(key.call_id, "denied", why, Some(approval));
        self.finish(
            id,
            step,
            key,
            CallState::Rejected,
            Some("denied"),
            json!({ "approval": approval, "denied": why }),
            &text,
            true,
            msgs,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &self,
        id: &str,
        step: i64,
        key: CallKey<'_>,
        state: CallState,
        verdict: Option<&str>,
        result: Value,
        text: &str,
        is_error: bool,
        msgs: &mut Vec<(i64, Message)>,
    ) -> Result<()> {
        let m = Message::tool(key.call_id, text, is_error);
        let result = journal_result(&self.redact, result);
        journal::call_finished(&self.store, id, step, key, state, verdict, &result, &m)?;
        msgs.push((step, m));
        Ok(())
    }
}

/// A call's result as the journal keeps it: redacted, failing closed (see
/// [`berth_core::gate::redact_json`]): a mask that breaks the JSON text must not
/// fall back to the raw result, secrets and all.
fn journal_result(redact: &Redact, result: Value) -> Value {
    berth_core::gate::redact_json(&result, &|t| redact(t))
}

/// A call's arguments as the journal keeps them: redacted. Masking the text
/// alone misses a secret the JSON holds escaped (a quote, a backslash in
/// it); so when they are JSON and a secret is in them, they are kept as
/// [`berth_core::gate::redact_json`] masks them. Without a secret they stay as
/// the model wrote them.
fn journal_args(redact: &Redact, args: &str) -> String {
    let text = redact(args);
    let Ok(v) = serde_json::from_str::<Value>(args) else {
        return text;
    };
    let masked = berth_core::gate::redact_json(&v, &|t| redact(t));
    if masked == v {
        text
    } else {
        masked.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor(name: &str, value: &str) -> Redact {
        let r = berth_policies::Redactor::with_values([(name.to_string(), value.to_string())]);
        Arc::new(move |t: &str| r.redact(t).into_owned())
    }

    /// A secret that is also a JSON number elsewhere in the result: masking
    /// the JSON text leaves `"pid":[REDACTED:…]`, no JSON at all. The journal
    /// must keep a masked form, never the raw result with the secret in it.
    #[test]
    fn a_mask_that_breaks_the_json_does_not_journal_the_secret() {
        let redact = redactor("DB_PASSWORD", "31415926");
        let result = json!({ "pid": 31415926, "stdout": "the password is 31415926\n" });
        let stored = journal_result(&redact, result).to_string();
        assert!(!stored.contains("31415926"), "{stored}");
        assert!(stored.contains("[REDACTED:DB_PASSWORD]"), "{stored}");
    }

    /// A secret with a quote or a backslash in it is escaped in JSON text,
    /// where a search for the secret itself does not find it: it is masked
    /// in the strings, keys included, and the result stays JSON.
    #[test]
    fn a_secret_json_escapes_is_masked_and_the_result_stays_json() {
        let secret = r#"pa"ss\word-42"#;
        let redact = redactor("API_TOKEN", secret);
        let result = json!({ "stdout": format!("token={secret}\n"), secret: [secret], "ok": true });
        let stored = journal_result(&redact, result);
        let text = stored.to_string();
        assert!(stored.is_object(), "{text}");
        assert_eq!(stored["ok"], true, "{text}");
        assert!(!text.contains("ss\\\\word"), "{text}");
        assert!(!text.contains("pa\\\"ss"), "{text}");
        assert_eq!(stored["stdout"], "token=[REDACTED:API_TOKEN]\n", "{text}");
    }

    /// The model's arguments are JSON text too: a secret with a quote in it
    /// is escaped there, and is masked all the same.
    #[test]
    fn arguments_with_an_escaped_secret_are_masked() -> serde_json::Result<()> {
        let secret = r#"pa"ss\word-42"#;
        let redact = redactor("API_TOKEN", secret);
        let args = json!({ "command": format!("login --password '{secret}'") }).to_string();
        let stored = journal_args(&redact, &args);
        assert!(!stored.contains("ss\\\\word"), "{stored}");
        let v: Value = serde_json::from_str(&stored)?;
        assert_eq!(v["command"], "login --password '[REDACTED:API_TOKEN]'");
        // Arguments with no secret are kept as the model wrote them.
        let plain = "{ \"command\": \"ls\" }";
        assert_eq!(journal_args(&redact, plain), plain);
        // Arguments that are not JSON are masked as text.
        let broken = format!("{{\"command\": \"echo {secret}");
        assert!(!journal_args(&redact, &broken).contains(secret));
        Ok(())
    }
}
