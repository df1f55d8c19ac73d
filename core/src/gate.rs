//! The Gate: where the runtime meets the policies. Built once per berth
//! process from the policy file and berth's own environment, it answers
//! "may this run?", "what environment does a sandbox get?", "what must be
//! hidden from this text?" and "what are this sandbox's limits?".

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_policies::redact::RedactStream;
use berth_policies::shell::Defined;
use berth_policies::{Action, FileOp, Limits, Policy, Redactor, Verdict};
use serde_json::json;

use crate::approvals::{self, Approval, ApprovalState, NewApproval};
use crate::backend::{BackendKind, Layout};
use crate::error::{Error, Result};
use crate::events::EventKind;
use crate::session::capture::{FilterFactory, OutputFilter};
use crate::store::{Event, Store};

/// Called when a command starts waiting for an approval, to tell a person.
pub type ApprovalNotice = Arc<dyn Fn(&Approval) + Send + Sync>;

/// How often a waiting call re-reads its approval.
const APPROVAL_POLL: Duration = Duration::from_millis(200);

/// Policy decisions for one berth process.
#[derive(Debug)]
pub struct Gate {
    policy: Policy,
    policy_path: Option<PathBuf>,
    redactor: Redactor,
    sandbox_env: BTreeMap<String, String>,
}

impl Gate {
    /// A gate from the policy file at `path` (built-in defaults if it does not
    /// exist) and berth's environment `env` (pass `std::env::vars()`).
    pub fn load(path: &Path, env: impl IntoIterator<Item = (String, String)>) -> Result<Gate> {
        let policy = Policy::load(path).map_err(|e| {
            Error::InvalidInput(format!(
                "{e}; fix the file or move it aside to use the defaults"
            ))
        })?;
        Ok(Gate::new(policy, Some(path.to_path_buf()), env))
    }

    /// A gate from a policy already read.
    pub fn new(
        policy: Policy,
        policy_path: Option<PathBuf>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Gate {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let redactor = Redactor::from_env(env.iter().cloned());
        let sandbox_env = policy.env.filter(env);
        Gate {
            policy,
            policy_path,
            redactor,
            sandbox_env,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The policy file this gate was loaded from (where `--always` rules go).
    pub fn policy_path(&self) -> Option<&Path> {
        self.policy_path.as_deref()
    }

    /// The verdict for running `command` on `backend`.
    pub fn check(&self, command: &str, backend: BackendKind) -> Verdict {
        reading(command, || {
            self.policy.rules.check(command, backend.as_str())
        })
    }

    /// The verdict for running `command` on `backend` in a session that
    /// defined `defined`: its aliases and functions are resolved first.
    pub fn check_in(&self, command: &str, backend: BackendKind, defined: &Defined) -> Verdict {
        reading(command, || {
            self.policy
                .rules
                .check_in(command, backend.as_str(), defined)
        })
    }

    /// The verdict for running code the gate did not read, `why` in words:
    /// the policy's `opaque` action.
    pub fn opaque_verdict(&self, why: &str) -> Verdict {
        let action = self.policy.rules.opaque;
        Verdict {
            action,
            rule: "opaque".into(),
            reason: format!("{why}; the policy's verdict for what berth cannot read is {action}"),
            part: String::new(),
            argv: Vec::new(),
        }
    }

    /// The part of berth's environment a sandbox may see.
    pub fn sandbox_env(&self) -> &BTreeMap<String, String> {
        &self.sandbox_env
    }

    /// `text` with secrets masked.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redactor.redact(text)
    }

    /// `bytes` with secrets masked.
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        self.redactor.redact_bytes(bytes)
    }

    /// The limits of the named sandbox.
    pub fn limits(&self, sandbox: &str) -> &Limits {
        self.policy.limits.for_sandbox(sandbox)
    }
}

/// The verdict on a file access by berth's tools or `berth cp`: `op` on
/// `abs` (absolute, `.` and `..` applied) in a sandbox laid out as `layout`,
/// shown as `subject`. berth's own directory in the sandbox (snapshots, job
/// state) is refused whatever the policy says: a planted or clobbered file
/// there would break the session for everyone. Otherwise the policy's file
/// rules decide; `None` without a gate and outside berth's directory.
pub fn judge_file(
    gate: Option<&Gate>,
    op: FileOp,
    abs: &str,
    layout: &Layout,
    subject: &str,
) -> Option<Verdict> {
    if berth_policies::files::is_under(abs, &layout.berth_dir) {
        return Some(Verdict {
            action: Action::Deny,
            rule: "builtin:berth-dir".into(),
            reason: format!("`{abs}` is berth's private directory in the sandbox ({op})"),
            part: subject.to_string(),
            argv: Vec::new(),
        });
    }
    gate.map(|g| {
        let v = g.policy().files.check(op, abs, &layout.workdir);
        Verdict {
            action: v.action,
            rule: v.rule,
            reason: v.reason,
            part: subject.to_string(),
            argv: Vec::new(),
        }
    })
}

/// Text longer than this is read off the async worker (see [`reading`]).
const READ_INLINE_BYTES: usize = 16 * 1024;

/// Run `f`, which reads shell `text` (judging it, or asking what it may
/// change). Reading is linear in the text, but a text of hundreds of
/// kilobytes still takes milliseconds of CPU: on a worker of `berth serve`'s
/// multi-threaded runtime, that worker first hands its other tasks (other
/// sandboxes' calls) to another thread, so no call waits for another's
/// reading. Short text, nearly every command, is read in place.
pub fn reading<T>(text: &str, f: impl FnOnce() -> T) -> T {
    if text.len() > READ_INLINE_BYTES {
        crate::store::blocking(f)
    } else {
        f()
    }
}

/// `command` on one line, at most 120 characters, for a refusal's message.
fn short_part(command: &str) -> String {
    let line: String = command.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

/// A command and the rules' verdict on it.
#[derive(Clone, Debug)]
pub struct Judged<'a> {
    /// The command text.
    pub command: &'a str,
    /// What the rules decided.
    pub verdict: Verdict,
}

/// Where a command stands after the gate.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The rules' verdict.
    pub verdict: Verdict,
    /// The approval that let it through, if it was asked.
    pub approval: Option<i64>,
}

impl Admission {
    /// A one-line summary for the event log's verdict column.
    pub fn summary(&self) -> String {
        match self.approval {
            Some(id) => format!("ask -> approved #{id} (rule {})", self.verdict.rule),
            None => format!("{} (rule {})", self.verdict.action, self.verdict.rule),
        }
    }
}

impl Gate {
    /// Decide whether `command` may run in `sandbox` on `backend`. Records
    /// refusals and approvals in the event log under `call_id`; on an ask,
    /// writes (or reuses) an approval, tells `notice`, and waits for an answer
    /// from any process until the policy's approval timeout, then refuses.
    pub async fn admit(
        &self,
        store: &Store,
        call_id: &str,
        backend: BackendKind,
        sandbox: &str,
        command: &str,
        notice: Option<&ApprovalNotice>,
    ) -> Result<Admission> {
        let verdict = self.check(command, backend);
        let judged = Judged { command, verdict };
        self.admit_judged(store, call_id, backend, sandbox, judged, notice)
            .await
    }

    /// [`Gate::admit`] for a verdict already reached (a file rule's, say):
    /// `command` is the text an approval shows and is matched on.
    #[allow(clippy::too_many_arguments)]
    pub async fn admit_verdict(
        &self,
        verdict: Verdict,
        store: &Store,
        call_id: &str,
        backend: BackendKind,
        sandbox: &str,
        command: &str,
        notice: Option<&ApprovalNotice>,
    ) -> Result<Admission> {
        let judged = Judged { command, verdict };
        self.admit_judged(store, call_id, backend, sandbox, judged, notice)
            .await
    }

    /// [`Gate::admit`] for a verdict already reached (say, with the session's
    /// aliases and functions resolved by [`Gate::check_in`]).
    pub async fn admit_judged(
        &self,
        store: &Store,
        call_id: &str,
        backend: BackendKind,
        sandbox: &str,
        judged: Judged<'_>,
        notice: Option<&ApprovalNotice>,
    ) -> Result<Admission> {
        let Judged {
            command,
            mut verdict,
        } = judged;
        // A verdict on the text as a whole (an opaque reading that belongs
        // to no one command) names the text, cut short for a message.
        if verdict.part.is_empty() && verdict.action != Action::Allow {
            verdict.part = short_part(command);
        }
        let event = |kind: EventKind, detail: serde_json::Value| Event {
            kind,
            call_id: Some(call_id.into()),
            backend: Some(backend),
            sandbox: Some(sandbox.into()),
            command: Some(self.redact(command).into_owned()),
            verdict: Some(format!("{} (rule {})", verdict.action, verdict.rule)),
            detail: Some(redact_json(&detail, &|t| self.redact(t).into_owned()).to_string()),
            ..Default::default()
        };
        let why = json!({ "rule": verdict.rule, "reason": verdict.reason, "part": verdict.part });
        match verdict.action {
            Action::Allow => Ok(Admission {
                verdict,
                approval: None,
            }),
            Action::Deny => {
                store.append(&event(EventKind::ExecDenied, why))?;
                Err(Error::Denied {
                    rule: verdict.rule.clone(),
                    reason: verdict.reason.clone(),
                    part: verdict.part.clone(),
                    hint: format!(
                        "`berth policy check --backend {backend} -- '…'` explains verdicts; a rule in the policy file can change this one"
                    ),
                }
                .redacted(self))
            }
            Action::Ask => {
                let existing = store.reusable_approval(sandbox, backend, command)?;
                let pending = match existing {
                    Some(a) if a.state == ApprovalState::Approved => a,
                    Some(a) => {
                        store.append(&event(
                            EventKind::ApprovalWaiting,
                            json!({ "approval": a.id }),
                        ))?;
                        a
                    }
                    None => {
                        let a = store.create_approval(&NewApproval {
                            sandbox: sandbox.into(),
                            backend,
                            command: command.into(),
                            part: verdict.part.clone(),
                            argv: verdict.argv.clone(),
                            rule: verdict.rule.clone(),
                            reason: verdict.reason.clone(),
                        })?;
                        store.append(&event(
                            EventKind::ApprovalRequested,
                            json!({ "approval": a.id, "rule": verdict.rule, "reason": verdict.reason, "part": verdict.part }),
                        ))?;
                        a
                    }
                };
                let decided = if pending.state == ApprovalState::Pending {
                    if let Some(n) = notice {
                        n(&self.redact_approval(&pending));
                    }
                    let timeout = Duration::from_secs(self.policy.approvals.timeout_secs);
                    approvals::wait(store, pending.id, timeout, APPROVAL_POLL).await?
                } else {
                    pending
                };
                let id = decided.id;
                let by = decided
                    .decided_by
                    .clone()
                    .unwrap_or_else(|| "unknown".into());
                match decided.state {
                    ApprovalState::Approved => {
                        store.mark_approval_used(id)?;
                        store.append(&event(
                            EventKind::ApprovalGranted,
                            json!({ "approval": id, "by": by, "always": decided.always }),
                        ))?;
                        Ok(Admission {
                            verdict,
                            approval: Some(id),
                        })
                    }
                    state => {
                        let reason = if state == ApprovalState::Expired {
                            format!(
                                "nobody answered approval #{id} within {}s, so it was denied (berth fails closed)",
                                self.policy.approvals.timeout_secs
                            )
                        } else {
                            format!("approval #{id} was denied by {by}")
                        };
                        store.append(&event(
                            EventKind::ApprovalRefused,
                            json!({ "approval": id, "state": state.to_string(), "by": by }),
                        ))?;
                        Err(Error::Denied {
                            rule: verdict.rule.clone(),
                            reason,
                            part: verdict.part.clone(),
                            hint: "run it again to ask again".into(),
                        }
                        .redacted(self))
                    }
                }
            }
        }
    }

    /// A copy of `a` with secrets masked, for showing to people.
    pub fn redact_approval(&self, a: &Approval) -> Approval {
        Approval {
            command: self.redact(&a.command).into_owned(),
            part: self.redact(&a.part).into_owned(),
            reason: self.redact(&a.reason).into_owned(),
            argv: a.argv.iter().map(|w| self.redact(w).into_owned()).collect(),
            ..a.clone()
        }
    }

    /// A filter that masks secrets in a command's output as it streams, for
    /// [`ExecOpts::filter`](crate::session::ExecOpts): everything after it
    /// (the live tee, the result, the spool file) sees masked output only. It
    /// holds back just a tail that may still grow into a secret (a secret
    /// written in two pieces, however far apart, is masked whole) and lets it
    /// out when the output ends.
    pub fn output_filter(self: &Arc<Self>) -> FilterFactory {
        let gate = self.clone();
        Arc::new(move || {
            Box::new(RedactFilter {
                gate: gate.clone(),
                stream: RedactStream::default(),
            }) as Box<dyn OutputFilter>
        })
    }

    /// A stream redactor's hold-back and masks, by this gate's secrets.
    pub fn redact_stream(&self, st: &mut RedactStream, chunk: &[u8], out: &mut Vec<u8>) {
        st.push(&self.redactor, chunk, out);
    }

    /// The end of a stream: what [`Gate::redact_stream`] still held, masked.
    pub fn redact_stream_end(&self, st: &mut RedactStream, out: &mut Vec<u8>) {
        st.finish(&self.redactor, out);
    }
}

/// [`Gate::output_filter`]'s filter: one stream redactor per command.
struct RedactFilter {
    gate: Arc<Gate>,
    stream: RedactStream,
}

impl OutputFilter for RedactFilter {
    fn push<'a>(&mut self, chunk: &'a [u8], out: &'a mut Vec<u8>) -> [&'a [u8]; 2] {
        self.stream.push_borrowed(&self.gate.redactor, chunk, out)
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        self.stream.finish(&self.gate.redactor, out);
    }
}

impl Error {
    /// The same error with secrets masked in what it shows.
    pub fn redacted(self, gate: &Gate) -> Self {
        match self {
            Error::Denied {
                rule,
                reason,
                part,
                hint,
            } => Error::Denied {
                rule,
                reason: gate.redact(&reason).into_owned(),
                part: gate.redact(&part).into_owned(),
                hint,
            },
            other => other,
        }
    }
}

/// `v` with every secret masked, and always JSON: it fails closed.
///
/// Each string, object key and number is masked on its own (a secret with a
/// quote or a backslash in it is escaped in JSON text, where a search for the
/// secret does not find it); then the JSON text as a whole, for a secret that
/// spans values. When that last mask leaves text that is no longer JSON, the
/// masked text itself is kept, as a string: never the value as it came in.
pub fn redact_json(v: &serde_json::Value, redact: &dyn Fn(&str) -> String) -> serde_json::Value {
    let walked = redact_parts(v, redact);
    let text = walked.to_string();
    let again = redact(&text);
    if again == text {
        return walked;
    }
    serde_json::from_str(&again).unwrap_or(serde_json::Value::String(again))
}

fn redact_parts(v: &serde_json::Value, redact: &dyn Fn(&str) -> String) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(redact(s)),
        Value::Number(n) => {
            let t = n.to_string();
            let r = redact(&t);
            if r == t { v.clone() } else { Value::String(r) }
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| redact_parts(x, redact)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (redact(k), redact_parts(x, redact)))
                .collect(),
        ),
        Value::Null | Value::Bool(_) => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn secret_dark_env_and_redaction() {
        let env = vec![
            (
                "OPENAI_API_KEY".to_string(),
                "sk-test-0123456789abcdefghij".to_string(),
            ),
            ("LANG".into(), "C.UTF-8".into()),
            ("PATH".into(), "/usr/bin".into()),
        ];
        let g = Gate::new(Policy::default(), None, env);
        assert_eq!(g.sandbox_env().keys().collect::<Vec<_>>(), vec!["LANG"]);
        assert_eq!(
            g.redact("k=sk-test-0123456789abcdefghij"),
            "k=[REDACTED:OPENAI_API_KEY]"
        );
    }

    /// Issue 49, item 9: while a call reads a huge text (judges it, asks
    /// what it may change), the server's other calls go on. On a runtime of
    /// one worker, a task spawned just before the reading waits on that
    /// worker; the reading here waits for that task, so it ends only if
    /// reading hands the worker's other tasks on. Read in place, the two
    /// would wait for each other (the bound below only ends the test).
    #[test]
    fn reading_a_huge_text_never_holds_up_the_workers_other_calls() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let huge = "v=1 ".repeat(READ_INLINE_BYTES);
        let other_ran = rt.block_on(async move {
            tokio::spawn(async move {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                // Queued on this worker, behind the reading.
                let other = tokio::spawn(async move { tx.send(()).is_ok() });
                let seen = reading(&huge, || {
                    rx.recv_timeout(std::time::Duration::from_secs(60)).is_ok()
                });
                seen && other.await.unwrap_or(false)
            })
            .await
            .unwrap()
        });
        assert!(
            other_ran,
            "a call queued on the worker never ran while a huge text was read"
        );
    }
}
