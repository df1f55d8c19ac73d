//! `wait_for`: the model pauses its run until an event comes, at no model
//! cost and with no process of its own: a background job ends, a line of its
//! output matches a pattern, an approval is answered, or a timeout passes.
//!
//! Flow at a glance: the call is journaled started; if the event has already
//! happened (the job ended, the approval was answered), its result is given
//! at once. Otherwise a wait is written ([`crate::waits`]) and the run stops
//! `waiting`. `berth serve` watches the wait, writes what happened, and
//! resumes the run, whose settle finds the started call, reads the outcome
//! as its result, and goes on. A person's `--resume` of a waiting run checks
//! again and, if nothing happened yet, leaves it waiting.

use super::*;
use crate::waits::{self, Wait};

/// The tool's name.
pub const WAIT_FOR: &str = "wait_for";
/// Seconds a wait lasts unless told.
const DEFAULT_TIMEOUT: f64 = 3600.0;
/// The longest wait: a week.
const MAX_TIMEOUT: f64 = 7.0 * 86400.0;

/// The tool as the model sees it.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: WAIT_FOR.into(),
        description: "Pause the run, at no model cost, until a background job ends or prints a line matching `pattern`, an approval is answered, or `timeout` seconds pass. The result says which.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "job": { "type": "string", "description": "Job id or name." },
                "pattern": { "type": "string", "description": "Regex over the job's output lines." },
                "approval": { "type": "integer" },
                "timeout": { "type": "number", "minimum": 1, "description": "Seconds (default 3600)." }
            }
        }),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    job: Option<String>,
    #[serde(default)]
    pattern: Option<String>,
    #[serde(default)]
    approval: Option<i64>,
    #[serde(default)]
    timeout: Option<f64>,
}

/// What a `wait_for` call came to.
pub(super) enum Waited {
    /// Its result.
    Result(ToolOutcome),
    /// The run waits; the words say for what.
    Pause(String),
}

impl Agent {
    /// Carry out (or carry on) run `id`'s `wait_for` call.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn wait_call(
        &self,
        id: &str,
        step: i64,
        idx: i64,
        call_id: &str,
        args: &Value,
        args_text: &str,
        started: bool,
    ) -> Result<Waited> {
        let mine =
            waits::of_run(&self.store, id)?.filter(|w| w.call_id.as_deref() == Some(call_id));
        if let Some(w) = &mine
            && let Some(o) = &w.outcome
        {
            waits::done(&self.store, id)?;
            return Ok(Waited::Result(woke(o)));
        }
        let a: Args = match serde_json::from_value(args.clone()) {
            Ok(a) => a,
            Err(e) => {
                return Ok(Waited::Result(refuse(format!(
                    "its arguments are wrong: {e}"
                ))));
            }
        };
        if a.job.is_none() && a.approval.is_none() && a.timeout.is_none() {
            return Ok(Waited::Result(refuse(
                "say what to wait for: `job` (and `pattern`), `approval`, or `timeout`".into(),
            )));
        }
        if a.pattern.is_some() && a.job.is_none() {
            return Ok(Waited::Result(refuse("`pattern` needs `job`".into())));
        }
        if let Some(p) = &a.pattern
            && let Err(e) = regex::Regex::new(p)
        {
            return Ok(Waited::Result(refuse(format!(
                "`pattern` is not a regular expression: {e}"
            ))));
        }
        let timeout = a.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if !(timeout.is_finite() && (1.0..=MAX_TIMEOUT).contains(&timeout)) {
            return Ok(Waited::Result(refuse(format!(
                "`timeout` is seconds from 1 to {MAX_TIMEOUT}"
            ))));
        }
        let Some(run) = journal::run(&self.store, id)? else {
            return Err(not_found(id));
        };
        let job = match &a.job {
            None => None,
            Some(j) => match self.store.job(j) {
                // Only this run's own sandbox's jobs: a model may not watch
                // (and read the output of) another sandbox's.
                Ok(job) if job.backend == run.backend && job.sandbox == run.sandbox => Some(job),
                _ => {
                    return Ok(Waited::Result(refuse(format!(
                        "there is no job `{j}` in this sandbox; `process` with action `list` shows its jobs"
                    ))));
                }
            },
        };
        // Only this run's own sandbox's approvals: another sandbox's answer
        // is not this run's to wait on (nor to learn of).
        let approval = match a.approval {
            None => None,
            Some(n) => match self.store.approval(n) {
                Ok(ap) if ap.backend == run.backend && ap.sandbox == run.sandbox => Some(ap),
                _ => {
                    return Ok(Waited::Result(refuse(format!(
                        "there is no approval #{n} in this sandbox"
                    ))));
                }
            },
        };
        if !started {
            journal::call_started(&self.store, id, call_id, step, idx, WAIT_FOR, args_text)?;
            (self.events)(&AgentEvent::ToolCall {
                step,
                call_id: call_id.into(),
                name: WAIT_FOR.into(),
                args: serde_json::from_str(args_text).unwrap_or(Value::Null),
                describe: describe(&a),
            });
        }
        // Already happened: no need to wait.
        if let Some(j) = &job
            && j.state.is_final()
        {
            waits::done(&self.store, id)?;
            return Ok(Waited::Result(woke(&json!({
                "woke": "job_end", "job": j.id, "state": j.state.as_str(), "exit_code": j.exit_code,
            }))));
        }
        if let Some(ap) = &approval
            && ap.state != ApprovalState::Pending
        {
            waits::done(&self.store, id)?;
            return Ok(Waited::Result(woke(&json!({
                "woke": "approval", "approval": ap.id, "state": format!("{:?}", ap.state).to_lowercase(),
            }))));
        }
        if mine.is_none() {
            waits::put(
                &self.store,
                &Wait {
                    run_id: id.into(),
                    call_id: Some(call_id.into()),
                    job: job.as_ref().map(|j| j.id.clone()),
                    pattern: a.pattern.clone(),
                    approval: a.approval,
                    deadline_ms: Some(now_ms() + (timeout * 1000.0) as i64),
                    ..Default::default()
                },
            )?;
        }
        Ok(Waited::Pause(format!(
            "{}; the berth server resumes the run when it comes (`berth runs show {id}`); `berth run --resume {id}` checks again now",
            describe(&a)
        )))
    }
}

fn refuse(why: String) -> ToolOutcome {
    ToolOutcome::error(format!("[berth: wait_for: {why}. Nothing is waited for.]"))
}

fn woke(outcome: &Value) -> ToolOutcome {
    ToolOutcome::Done {
        text: format!("[berth: {}]", waits::describe(outcome)),
        is_error: false,
        detail: outcome.clone(),
    }
}

/// A line for people.
fn describe(a: &Args) -> String {
    let mut parts = Vec::new();
    if let Some(j) = &a.job {
        parts.push(match &a.pattern {
            Some(p) => format!("job {j} to end or print a line matching `{p}`"),
            None => format!("job {j} to end"),
        });
    }
    if let Some(ap) = a.approval {
        parts.push(format!("approval #{ap} to be answered"));
    }
    let t = a.timeout.unwrap_or(DEFAULT_TIMEOUT);
    format!(
        "waits for {}, at most {t} s",
        if parts.is_empty() {
            "time to pass".into()
        } else {
            parts.join(" or ")
        }
    )
}
