//! `process`: the background jobs of the context's sandbox (and only those:
//! another sandbox's jobs are not found from here).
//!
//! `log` reads a bounded window of the job's output straight from the sandbox
//! and redacts it whole, starting a little before the asked offset, so a secret
//! that begins before the offset is masked, never shown from its middle.

use std::time::Duration;

use serde_json::json;

use super::args::{ProcessAction, ProcessArgs};
use super::terminal::seconds;
use super::{Call, ToolOutcome};
use berth_core::backend::{Signal, run_to_end};
use berth_core::jobs::{Job, KillOutcome};
use berth_policies::redact::RedactStream;

/// Default and largest `log` window.
const LOG_DEFAULT: u64 = 64 * 1024;
const LOG_MAX: u64 = 1024 * 1024;
/// How far before the offset a `log` read starts, so a secret that straddles
/// the offset is seen whole by the redactor.
const REDACT_OVERLAP: u64 = berth_policies::redact::STREAM_OVERLAP as u64;

pub(crate) async fn run(call: &Call<'_>, a: ProcessArgs) -> ToolOutcome {
    match run_inner(call, a).await {
        Ok(o) => o,
        Err(o) => o,
    }
}

fn describe(j: &Job) -> String {
    format!(
        "job {} {} exit={} output={} bytes: {}",
        j.id,
        j.state.as_str(),
        j.exit_code
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into()),
        j.out_bytes,
        j.command
    )
}

fn job_data(j: &Job) -> serde_json::Value {
    json!({
        "job_id": j.id, "state": j.state.as_str(), "exit_code": j.exit_code,
        "out_bytes": j.out_bytes, "reason": j.reason,
    })
}

async fn own_job(call: &Call<'_>, a: &ProcessArgs) -> Result<Job, ToolOutcome> {
    let Some(id) = a.job_id.as_deref().filter(|s| !s.is_empty()) else {
        return Err(ToolOutcome::invalid(format!(
            "invalid arguments: `job_id` is required for action {:?}",
            a.action
        )));
    };
    let ctx = call.ctx;
    let job = ctx.runtime.job(id).await.map_err(ToolOutcome::from)?;
    if job.backend != ctx.backend || job.sandbox != ctx.sandbox {
        return Err(ToolOutcome::error(format!(
            "job `{id}` not found in this sandbox; action list shows its jobs"
        )));
    }
    Ok(job)
}

/// Refuse an argument the action does not use: a dropped argument is work
/// the model believes was done (`keys` on `send` was said "wrote 5 bytes").
fn unused_args(a: &ProcessArgs) -> Result<(), ToolOutcome> {
    use ProcessAction as A;
    let given = [
        ("job_id", a.job_id.is_some()),
        ("data", a.data.is_some()),
        ("eof", a.eof.is_some()),
        ("timeout", a.timeout.is_some()),
        ("offset", a.offset.is_some()),
        ("limit", a.limit.is_some()),
        ("signal", a.signal.is_some()),
        ("keys", a.keys.is_some()),
    ];
    let used: &[&str] = match a.action {
        A::List => &[],
        A::Status | A::Screen => &["job_id"],
        A::Log => &["job_id", "offset", "limit"],
        A::Wait => &["job_id", "timeout"],
        A::Kill => &["job_id", "signal"],
        A::Send => &["job_id", "data", "eof"],
        A::Keys => &["job_id", "data", "keys"],
    };
    let unused: Vec<&str> = given
        .iter()
        .filter(|(n, set)| *set && !used.contains(n))
        .map(|(n, _)| *n)
        .collect();
    if unused.is_empty() {
        return Ok(());
    }
    let hint = if unused.contains(&"keys") && a.action == A::Send {
        "; to press keys use action `keys` (with `data` for text before them)"
    } else if unused.contains(&"eof") {
        "; to close a job's stdin use action `send` with `eof: true`"
    } else {
        ""
    };
    Err(ToolOutcome::invalid(format!(
        "invalid arguments: action `{}` does not use {}; nothing was done{hint}",
        format!("{:?}", a.action).to_lowercase(),
        unused
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

async fn run_inner(call: &Call<'_>, a: ProcessArgs) -> Result<ToolOutcome, ToolOutcome> {
    let ctx = call.ctx;
    let rt = &ctx.runtime;
    unused_args(&a)?;
    match a.action {
        ProcessAction::List => {
            let jobs: Vec<Job> = rt
                .list_jobs()
                .await
                .map_err(ToolOutcome::from)?
                .into_iter()
                .filter(|j| j.backend == ctx.backend && j.sandbox == ctx.sandbox)
                .collect();
            let text = if jobs.is_empty() {
                "no background jobs in this sandbox".to_string()
            } else {
                jobs.iter().map(describe).collect::<Vec<_>>().join("\n")
            };
            let data: Vec<_> = jobs.iter().map(job_data).collect();
            Ok(ToolOutcome::ok(text, json!({ "jobs": data })))
        }
        ProcessAction::Status => {
            let j = own_job(call, &a).await?;
            Ok(ToolOutcome::ok(describe(&j), job_data(&j)))
        }
        ProcessAction::Wait => {
            let j = own_job(call, &a).await?;
            let t = seconds("timeout", a.timeout.unwrap_or(60.0))?;
            let j = rt
                .wait_job(&j.id, Some(t))
                .await
                .map_err(ToolOutcome::from)?;
            let mut text = describe(&j);
            if !j.state.is_final() {
                text.push_str(&format!(
                    "\n[berth: still running after {}s; the job goes on]",
                    t.as_secs_f64()
                ));
            }
            Ok(ToolOutcome::ok(text, job_data(&j)))
        }
        ProcessAction::Log => {
            let j = own_job(call, &a).await?;
            let offset = a.offset.unwrap_or(0);
            // Within what one result may hold: a window cut by the result's
            // bound would skip its middle, and the next offset past it.
            let room = super::output::result_cap(rt, &ctx.sandbox)
                .saturating_sub(super::output::TRAILER_ROOM)
                .max(512) as u64;
            let limit = a.limit.unwrap_or(LOG_DEFAULT).clamp(1, LOG_MAX).min(room);
            let sb = rt
                .attach(j.backend, &j.sandbox)
                .await
                .map_err(ToolOutcome::from)?;
            let start = offset.saturating_sub(REDACT_OVERLAP);
            let lead = (offset - start) as usize;
            let file = format!("{}/out", j.dir(sb.as_ref()));
            let argv: Vec<String> = [
                "bash",
                "-c",
                "tail -c +\"$(( $2 + 1 ))\" -- \"$1\" 2>/dev/null | head -c \"$3\"",
                "berth-log",
                &file,
                &start.to_string(),
                &(limit + lead as u64).to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let c = run_to_end(
                sb.as_ref(),
                &argv,
                None,
                (limit as usize) + lead,
                Duration::from_secs(30),
            )
            .await
            .map_err(ToolOutcome::from)?;
            let raw = c.stdout;
            let lead = lead.min(raw.len());
            // Read to the file's end (a short read) of a job that has ended:
            // nothing more can follow, so nothing is held back.
            let complete = (raw.len() as u64) < limit + lead as u64 && j.state.is_final();
            let (shown, next) = match rt.gate() {
                Some(g) => {
                    // Context before the offset masks a secret that straddles
                    // it; a tail that may be the start of one is left for the
                    // next read, which resumes there.
                    let mut st = RedactStream::with_context(lead);
                    let mut shown = Vec::new();
                    g.redact_stream(&mut st, &raw, &mut shown);
                    if complete {
                        g.redact_stream_end(&mut st, &mut shown);
                    }
                    (shown, (start + st.consumed()).max(offset))
                }
                None => (raw[lead..].to_vec(), offset + (raw.len() - lead) as u64),
            };
            let mut text =
                berth_core::session::capture::strip_ansi(&String::from_utf8_lossy(&shown));
            let more = next < j.out_bytes as u64;
            if more {
                text.push_str(&format!(
                    "\n[berth: more output; read on with offset={next}]"
                ));
            }
            Ok(ToolOutcome::ok(
                text,
                json!({ "offset": offset, "next_offset": next, "state": j.state.as_str() }),
            ))
        }
        ProcessAction::Kill => {
            let j = own_job(call, &a).await?;
            let sig = match a
                .signal
                .as_deref()
                .unwrap_or("TERM")
                .trim_start_matches("SIG")
                .to_ascii_uppercase()
                .as_str()
            {
                "TERM" => Signal::Term,
                "KILL" => Signal::Kill,
                "INT" => Signal::Int,
                other => {
                    return Err(ToolOutcome::invalid(format!(
                        "invalid argument `signal`: unknown signal `{other}`; use TERM, INT or KILL"
                    )));
                }
            };
            let text = match rt.kill_job(&j.id, sig).await.map_err(ToolOutcome::from)? {
                KillOutcome::Signalled => {
                    format!("sent SIG{} to job {}'s process group", sig.name(), j.id)
                }
                KillOutcome::AlreadyEnded(st, code) => format!(
                    "job {} had already {}{}",
                    j.id,
                    st.as_str(),
                    code.map(|c| format!(" with code {c}")).unwrap_or_default()
                ),
            };
            Ok(ToolOutcome::ok(text, json!({ "job_id": j.id })))
        }
        ProcessAction::Screen => {
            let j = own_job(call, &a).await?;
            let s = rt.job_screen(&j.id).await.map_err(ToolOutcome::from)?;
            let mut text = format!("[screen {}; job {}]\n", s.summary(), j.state.as_str());
            text.push_str(&s.text());
            Ok(ToolOutcome::ok(
                text,
                json!({
                    "job_id": j.id, "state": j.state.as_str(), "cols": s.cols, "rows": s.rows,
                    "cursor": { "row": s.cursor_row, "col": s.cursor_col },
                    "alternate_screen": s.alternate_screen, "lines": s.lines,
                }),
            ))
        }
        ProcessAction::Keys => {
            let j = own_job(call, &a).await?;
            let keys = a.keys.unwrap_or_default();
            let data = a.data.unwrap_or_default();
            if keys.is_empty() && data.is_empty() {
                return Err(ToolOutcome::invalid(
                    "invalid arguments: give `keys` (e.g. [\"C-c\"] or [\"Enter\"]), `data`, or both",
                ));
            }
            let mut bytes = data.into_bytes();
            bytes.extend(
                berth_core::jobs::pty::keys_bytes_for(&keys, j.pty.is_some())
                    .map_err(|e| ToolOutcome::invalid(format!("invalid argument `keys`: {e}")))?,
            );
            rt.send_job(&j.id, &bytes, false)
                .await
                .map_err(ToolOutcome::from)?;
            Ok(ToolOutcome::ok(
                format!(
                    "pressed {} in job {}; look with action screen",
                    if keys.is_empty() {
                        "the text".to_string()
                    } else {
                        keys.join(" ")
                    },
                    j.id
                ),
                json!({ "job_id": j.id, "bytes": bytes.len() }),
            ))
        }
        ProcessAction::Send => {
            let j = own_job(call, &a).await?;
            let data = a.data.unwrap_or_default();
            let eof = a.eof.unwrap_or(false);
            if data.is_empty() && !eof {
                return Err(ToolOutcome::invalid(
                    "invalid arguments: give `data`, `eof: true`, or both",
                ));
            }
            rt.send_job(&j.id, data.as_bytes(), eof)
                .await
                .map_err(ToolOutcome::from)?;
            Ok(ToolOutcome::ok(
                format!(
                    "wrote {} bytes to job {}'s stdin{}",
                    data.len(),
                    j.id,
                    if eof { "; its stdin is closed" } else { "" }
                ),
                json!({ "job_id": j.id, "bytes": data.len(), "eof": eof }),
            ))
        }
    }
}
