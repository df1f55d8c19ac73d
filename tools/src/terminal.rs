//! `terminal`: a command in the sandbox's persistent session, or a background job.
//!
//! Flow at a glance: check the arguments (a timeout must be a finite, positive
//! number within the sandbox's maximum), admit the command through the gate
//! ([`admit`]: wait for an approval or defer it, as the context says), run it in
//! the session with the call's id, cancellation token and a byte counter for
//! progress, and turn the result into text that ends with the exit code.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_policies::{Action, Verdict};
use serde_json::json;

use super::args::TerminalArgs;
use super::{ApprovalMode, Call, OutcomeKind, ToolOutcome};
use berth_core::approvals::{self, ApprovalState, NewApproval};
use berth_core::events::EventKind;
use berth_core::gate::ApprovalNotice;
use berth_core::runtime::ExecRequest;
use berth_core::session::script::quote;
use berth_core::store::Event;

/// A timeout in seconds from a model, checked: finite, positive, representable.
pub(crate) fn seconds(what: &str, secs: f64) -> Result<Duration, ToolOutcome> {
    if !secs.is_finite() || secs <= 0.0 {
        return Err(ToolOutcome::invalid(format!(
            "invalid argument `{what}`: {secs} is not a positive number of seconds"
        )));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| {
        ToolOutcome::invalid(format!(
            "invalid argument `{what}`: {secs} seconds is too long"
        ))
    })
}

pub(crate) async fn run(call: &Call<'_>, a: TerminalArgs) -> ToolOutcome {
    let ctx = call.ctx;
    let rt = &ctx.runtime;
    if a.command.trim().is_empty() {
        return ToolOutcome::invalid("invalid argument `command`: it is empty");
    }
    let requested = match a.timeout.map(|t| seconds("timeout", t)).transpose() {
        Ok(t) => t,
        Err(o) => return o,
    };
    let timeout = match rt.gate() {
        Some(g) => match g.limits(&ctx.sandbox).timeout(requested) {
            Ok(t) => t,
            Err(e) => return ToolOutcome::invalid(format!("invalid argument `timeout`: {e}")),
        },
        None => requested.unwrap_or(Duration::from_secs(600)),
    };
    let command = match a.workdir.as_deref().filter(|w| !w.is_empty()) {
        // A subshell, so the session's own cwd stays where it was.
        Some(w) => format!("( cd -- {} || exit; {}\n)", quote(w), a.command),
        None => a.command.clone(),
    };
    if a.background == Some(true) {
        // start_job admits the command itself (and would wait on an ask):
        // in Defer mode, answer an unanswered ask here first.
        if ctx.approval == ApprovalMode::Defer
            && let Some(g) = rt.gate()
        {
            let v = g.check(&command, ctx.backend);
            if v.action == Action::Ask
                && let Err(o) = defer(call, &command, &v)
            {
                return o;
            }
        }
        let pty = match (a.pty == Some(true), a.size.as_deref()) {
            (false, Some(_)) => {
                return ToolOutcome::invalid(
                    "invalid arguments: `size` is for a terminal job; add `pty: true`",
                );
            }
            (false, None) => None,
            (true, None) => Some(berth_core::backend::TermSize::default()),
            (true, Some(s)) => match s.parse() {
                Ok(size) => Some(size),
                Err(e) => return ToolOutcome::invalid(format!("invalid argument `size`: {e}")),
            },
        };
        let opts = berth_core::jobs::JobOptions {
            name: None,
            watch: a.watch.clone().unwrap_or_default(),
            pty,
            session: Some(a.session.clone().unwrap_or_else(|| ctx.session.clone())),
        };
        return match rt
            .start_job_with(ctx.backend, &ctx.sandbox, &command, opts)
            .await
        {
            Ok(job) => ToolOutcome::ok(
                format!(
                    "started background job {} (pid {}){}; follow it with the process tool ({}, job_id {})",
                    job.id,
                    job.pid.unwrap_or(0),
                    job.pty
                        .map(|s| format!(" on a {s} terminal"))
                        .unwrap_or_default(),
                    if job.pty.is_some() {
                        "action screen to see it, keys or send to type, kill to end it"
                    } else {
                        "action log, wait or kill"
                    },
                    job.id
                ),
                json!({ "job_id": job.id, "pid": job.pid }),
            ),
            Err(e) => e.into(),
        };
    }
    let verdict = tokio::select! {
        v = admit(call, &command, None) => v,
        _ = ctx.cancel.cancelled() => {
            return ToolOutcome::new(OutcomeKind::Cancelled, "cancelled by the caller before the command ran");
        }
    };
    if let Err(o) = verdict {
        return o;
    }
    let live = call.live.clone();
    let tee: berth_core::session::Tee = Arc::new(move |chunk: &[u8]| {
        live.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    });
    let session = a.session.clone().unwrap_or_else(|| ctx.session.clone());
    if let Err(e) = berth_core::runtime::check_session_name(&session) {
        return ToolOutcome::invalid(format!("invalid argument `session`: {e}"));
    }
    let report = rt
        .exec(ExecRequest {
            backend: ctx.backend,
            sandbox: ctx.sandbox.clone(),
            session: Some(session),
            command,
            timeout: Some(timeout),
            cancel: Some(ctx.cancel.clone()),
            tee: Some(tee),
            admitted: rt.gate().is_some(),
            call_id: Some(call.id.clone()),
            split_stderr: true,
            ..Default::default()
        })
        .await;
    let r = match report {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let res = &r.result;
    // Cut once, to the result's size, with the capture's own cut told in
    // the same line: the count is of everything the command wrote.
    let room =
        super::output::result_cap(rt, &ctx.sandbox).saturating_sub(super::output::TRAILER_ROOM);
    let room = room.max(512);
    // stdout, then stderr under a line of its own: each gets the room it
    // needs, and at most half of it when both need more.
    let kept = |o: &berth_core::session::Output| o.head.len() + o.tail.len();
    let err_len = res.stderr.as_ref().map_or(0, kept);
    let err_room = err_len.min((room / 2).max(room.saturating_sub(kept(&res.output))));
    let out_room = (room - err_room).max(256);
    let shown = super::output::spooled(rt, &call.id, &res.output, out_room);
    let (mut text, omitted) = super::output::command_output(&shown, out_room);
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let mut err_omitted = 0;
    if let Some(e) = res.stderr.as_ref().filter(|e| e.total_bytes > 0) {
        let shown =
            super::output::spooled(rt, &format!("{}.stderr", call.id), e, err_room.max(256));
        let (t, o) = super::output::command_output(&shown, err_room.max(256));
        err_omitted = o;
        text.push_str("[stderr]\n");
        text.push_str(&t);
        if !t.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(why) = &r.recreated {
        text.push_str(&format!(
            "[berth: the sandbox was brought back first: {why}]\n"
        ));
    }
    let kind = if res.timed_out {
        text.push_str(&format!(
            "[berth: timed out after {}s; the command and its processes were stopped; the session is still usable]\n",
            timeout.as_secs_f64()
        ));
        OutcomeKind::TimedOut
    } else if res.interrupted {
        text.push_str("[berth: cancelled; the command and its processes were stopped]\n");
        OutcomeKind::Cancelled
    } else {
        OutcomeKind::Ok
    };
    for n in &res.notices {
        text.push_str(&format!("[berth: {n}]\n"));
    }
    text.push_str(&format!("[exit code {}]", res.exit_code));
    let mut o = ToolOutcome::new(kind, text).with_data(json!({
        "exit_code": res.exit_code,
        "cwd": res.cwd,
        "timed_out": res.timed_out,
        "cancelled": res.interrupted,
        "truncated": omitted > 0 || err_omitted > 0,
        "bytes": res.output.total_bytes,
        "omitted_bytes": omitted,
        "stderr_bytes": res.stderr.as_ref().map_or(0, |e| e.total_bytes),
        "stderr_omitted_bytes": err_omitted,
        "spool": shown.spool.as_ref().filter(|_| omitted > 0),
        "duration_ms": res.duration.as_millis() as u64,
    }));
    if omitted > 0 {
        o.spool = shown.spool.clone();
    }
    o
}

/// Admit `subject` (a command, or a file operation's description with its
/// `verdict`) through the gate. In [`ApprovalMode::Wait`] an *ask* waits for an
/// answer; in [`ApprovalMode::Defer`] it returns `AwaitingApproval` at once,
/// and the same call dispatched again later finds the answer.
pub(crate) async fn admit(
    call: &Call<'_>,
    subject: &str,
    verdict: Option<Verdict>,
) -> Result<(), ToolOutcome> {
    let ctx = call.ctx;
    let rt = &ctx.runtime;
    let Some(g) = rt.gate() else {
        return Ok(());
    };
    let verdict = verdict.unwrap_or_else(|| g.check(subject, ctx.backend));
    if ctx.approval == ApprovalMode::Defer && verdict.action == Action::Ask {
        defer(call, subject, &verdict)?;
    }
    let live = call.live.clone();
    let notice: ApprovalNotice = Arc::new(move |a: &approvals::Approval| {
        live.approval.store(a.id, Ordering::Relaxed);
    });
    let r = g
        .admit_verdict(
            verdict,
            rt.store(),
            &call.id,
            ctx.backend,
            &ctx.sandbox,
            subject,
            Some(&notice),
        )
        .await;
    call.live.approval.store(0, Ordering::Relaxed);
    r.map(|_| ()).map_err(ToolOutcome::from)
}

/// The non-waiting half of an *ask*: `Ok` when an approval already lets it
/// run, else the outcome to return now (awaiting, or denied by the answer).
fn defer(call: &Call<'_>, subject: &str, verdict: &Verdict) -> Result<(), ToolOutcome> {
    let ctx = call.ctx;
    let rt = &ctx.runtime;
    let store = rt.store();
    let latest = store.latest_approval(&ctx.sandbox, ctx.backend, subject);
    let latest = latest.map_err(ToolOutcome::from)?;
    let awaiting = |id: i64| {
        ToolOutcome::new(
            OutcomeKind::AwaitingApproval { id },
            format!(
                "awaiting approval (id {id}): `{}` needs a person's approval (rule `{}`: {}); run `berth approve {id}` or `berth deny {id}`",
                subject, verdict.rule, verdict.reason
            ),
        )
        .with_data(json!({ "approval": id, "rule": verdict.rule }))
    };
    match latest {
        Some(a) if a.state == ApprovalState::Approved => Ok(()),
        Some(a) if a.state == ApprovalState::Pending => Err(awaiting(a.id)),
        Some(a) => {
            // Denied or expired: this answer is spent on this call.
            let _ = store.mark_approval_used(a.id);
            let why = if a.state == ApprovalState::Expired {
                format!("nobody answered approval #{} in time", a.id)
            } else {
                format!(
                    "approval #{} was denied by {}",
                    a.id,
                    a.decided_by.as_deref().unwrap_or("someone")
                )
            };
            Err(ToolOutcome::new(
                OutcomeKind::Denied {
                    rule: verdict.rule.clone(),
                },
                format!(
                    "policy refused `{subject}`: {why} (rule `{}`); calling it again asks again",
                    verdict.rule
                ),
            ))
        }
        None => {
            let a = store
                .create_approval(&NewApproval {
                    sandbox: ctx.sandbox.clone(),
                    backend: ctx.backend,
                    command: subject.into(),
                    part: verdict.part.clone(),
                    argv: verdict.argv.clone(),
                    rule: verdict.rule.clone(),
                    reason: verdict.reason.clone(),
                })
                .map_err(ToolOutcome::from)?;
            let _ = store.append(&Event {
                kind: EventKind::ApprovalRequested,
                call_id: Some(call.id.clone()),
                backend: Some(ctx.backend),
                sandbox: Some(ctx.sandbox.clone()),
                command: Some(rt.redact(subject)),
                verdict: Some(format!("ask (rule {})", verdict.rule)),
                detail: Some(rt.redact(
                    &json!({ "approval": a.id, "rule": verdict.rule, "reason": verdict.reason, "deferred": true })
                        .to_string(),
                )),
                ..Default::default()
            });
            Err(awaiting(a.id))
        }
    }
}
