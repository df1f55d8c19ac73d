//! `berth job start|ls|logs|wait|kill|send|screen|resize`: detached background work.

use std::time::Duration;

use anyhow::{Result, bail};
use berth_core::backend::Signal;
use berth_core::backend::TermSize;
use berth_core::jobs::{Job, JobOptions, JobState, KillOutcome};
use serde_json::json;

use berth_core::runtime::Runtime;

use crate::context;
use crate::io::{errln, outln, outp};

use berth_client::served::job::{JobCmd, LsArgs, SignalArg};

/// Run a job subcommand on `rt` (in-process, or in the server for a client).
pub async fn run_on(rt: &Runtime, cmd: JobCmd) -> Result<u8> {
    let code = match cmd {
        JobCmd::Start(a) => {
            let command = a.command.join(" ");
            let opts = JobOptions {
                name: a.name.clone(),
                watch: a.watch.clone(),
                pty: a.pty.then(|| a.size.map(term_size).unwrap_or_default()),
                session: Some(a.session.clone()),
            };
            let job = rt
                .start_job_with(&a.backend, &a.sandbox, &command, opts)
                .await?;
            if a.json {
                context::print_json(&job_json(&job));
            } else {
                outln!("{}", job.id);
            }
            0
        }
        JobCmd::Ls(a) => {
            let keep = ls_filter(&a)?;
            let jobs: Vec<Job> = rt.list_jobs().await?.into_iter().filter(keep).collect();
            if a.json {
                context::print_json(&serde_json::Value::Array(
                    jobs.iter().map(job_json).collect(),
                ));
            } else if jobs.is_empty()
                && (a.backend.is_some() || a.sandbox.is_some() || !a.state.is_empty())
            {
                outln!("no jobs match; `berth job ls` lists them all");
            } else if jobs.is_empty() {
                outln!("no jobs; start one with `berth job start -- COMMAND`");
            } else {
                outln!(
                    "{:<10} {:<12} {:<16} {:<8} {:>5} {:>9} {:>10}  COMMAND",
                    "ID",
                    "NAME",
                    "SANDBOX",
                    "STATE",
                    "EXIT",
                    "RUNTIME",
                    "OUTPUT"
                );
                for j in &jobs {
                    let cmd: String = j
                        .command
                        .chars()
                        .take(40)
                        .map(|c| if c == '\n' { ' ' } else { c })
                        .collect();
                    outln!(
                        "{:<10} {:<12} {:<16} {:<8} {:>5} {:>9} {:>10}  {cmd}",
                        j.id,
                        j.name.clone().unwrap_or_else(|| "-".into()),
                        format!("{}/{}", j.backend, j.sandbox),
                        j.state.as_str(),
                        j.exit_code
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "-".into()),
                        human_ms(j.runtime_ms()),
                        j.out_bytes,
                    );
                    if let (JobState::Lost | JobState::Failed | JobState::Unknown, Some(r)) =
                        (j.state, &j.reason)
                    {
                        outln!("           ^ {r}");
                    } else if j.state == JobState::Killed {
                        outln!("           ^ {}", how_it_ended(j));
                    }
                }
            }
            0
        }
        JobCmd::Logs(a) => crate::cmd_job_logs::logs(rt, a).await?,
        JobCmd::Wait(a) => {
            let timeout = match a.timeout {
                Some(s) if !(s.is_finite() && s > 0.0) => {
                    bail!("--timeout must be a positive number of seconds, e.g. --timeout 30")
                }
                Some(s) => Some(Duration::from_secs_f64(s)),
                None => None,
            };
            let job = rt.wait_job(&a.id, timeout).await?;
            if a.json {
                context::print_json(&job_json(&job));
            }
            if !job.state.is_final() {
                errln!(
                    "berth: job {} is still running after the wait's timeout",
                    job.id
                );
                124
            } else {
                if !a.json {
                    errln!("berth: job {} {}", job.id, job.standing());
                }
                match (job.state, job.exit_code) {
                    (_, Some(c)) if (0..=255).contains(&c) => c as u8,
                    _ => crate::EXIT_BERTH_ERROR,
                }
            }
        }
        JobCmd::Kill(a) => {
            let sig = match a.signal {
                SignalArg::Term => Signal::Term,
                SignalArg::Kill => Signal::Kill,
                SignalArg::Int => Signal::Int,
            };
            if !(a.grace.is_finite() && a.grace >= 0.0) {
                bail!("--grace must be a number of seconds, 0 or more, e.g. --grace 5");
            }
            // Like kill(1) and `docker kill`: success once the job is gone,
            // whether this kill ended it or it had already ended. The job's
            // own exit code (128+N) is in the message and the JSON, not in
            // berth's status, so a script does not read the kill as failed.
            // Only a kill that could not stop the job is an error (above).
            let outcome = rt
                .kill_job_with_grace(&a.id, sig, Duration::from_secs_f64(a.grace))
                .await?;
            let job = rt.job(&a.id).await?;
            let already = matches!(outcome, KillOutcome::AlreadyEnded(..));
            if a.json {
                let mut v = job_json(&job);
                v["kill"] = if already {
                    "already_ended"
                } else {
                    "signalled"
                }
                .into();
                context::print_json(&v);
            } else if already {
                outln!(
                    "job {} had already ended, {}; nothing to kill",
                    job.id,
                    how_it_ended(&job)
                );
            } else {
                outln!("job {} {}", job.id, how_it_ended(&job));
            }
            0
        }
        JobCmd::Send(a) => {
            if a.data.is_none() && a.keys.is_empty() && !a.eof {
                bail!("nothing to send: give DATA, --keys, --eof, or any of them");
            }
            let text = a.data.unwrap_or_default().into_bytes();
            rt.send_input(&a.id, &text, &a.keys, a.eof).await?;
            0
        }
        JobCmd::Screen(a) => {
            let screen = rt.job_screen(&a.id).await?;
            if a.json {
                context::print_json(&serde_json::to_value(&screen)?);
            } else {
                outp!("{}", screen.text());
                errln!("berth: screen {}", screen.summary());
            }
            0
        }
        JobCmd::Prune(a) => {
            let keep = ls_filter(&a)?;
            let jobs: Vec<Job> = rt.list_jobs().await?.into_iter().filter(keep).collect();
            let gone = rt.prune_jobs(jobs).await?;
            if a.json {
                context::print_json(&serde_json::Value::Array(
                    gone.iter().map(job_json).collect(),
                ));
            } else {
                outln!(
                    "pruned {} ended job{}",
                    gone.len(),
                    if gone.len() == 1 { "" } else { "s" }
                );
            }
            0
        }
        JobCmd::Resize(a) => {
            rt.resize_job(&a.id, term_size(a.size)).await?;
            0
        }
    };
    Ok(code)
}

/// Which jobs `job ls` shows, from its filters; an unknown state is an error
/// that names the states.
fn ls_filter(a: &LsArgs) -> Result<impl Fn(&Job) -> bool + use<>> {
    const STATES: [&str; 6] = ["starting", "running", "exited", "killed", "failed", "lost"];
    for s in &a.state {
        if s != "done" && !STATES.contains(&s.as_str()) {
            bail!(
                "--state {s:?} is not a job state; use one of {}, or done (every ended job)",
                STATES.join(", ")
            );
        }
    }
    let (backend, sandbox, states) = (a.backend.clone(), a.sandbox.clone(), a.state.clone());
    Ok(move |j: &Job| {
        backend.as_ref().is_none_or(|b| *b == j.backend)
            && sandbox.as_ref().is_none_or(|s| *s == j.sandbox)
            && (states.is_empty()
                || states
                    .iter()
                    .any(|s| s == j.state.as_str() || (s == "done" && j.state.is_final())))
    })
}

fn job_json(j: &Job) -> serde_json::Value {
    json!({
        "id": j.id, "name": j.name, "backend": j.backend, "sandbox": j.sandbox,
        "command": j.command, "state": j.state.as_str(), "exit_code": j.exit_code,
        "pid": j.pid, "created_at": j.created_at, "ended_at": j.ended_at,
        "runtime_ms": j.runtime_ms(), "out_bytes": j.out_bytes, "reason": j.reason,
        "watch": j.watch, "kill_signal": j.kill_signal,
        "pty": j.pty.map(|p| p.to_string()),
    })
}

/// "killed by SIGTERM (exit 143)", and why SIGKILL followed if it did.
fn how_it_ended(j: &Job) -> String {
    let code = j
        .exit_code
        .map(|c| format!(" (exit {c})"))
        .unwrap_or_default();
    match (j.state, &j.kill_signal) {
        (JobState::Killed, Some(sig)) => {
            let why = j
                .reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            format!("killed by SIG{sig}{code}{why}")
        }
        (state, _) => format!("{}{code}", state.as_str()),
    }
}

fn human_ms(ms: i64) -> String {
    let s = ms / 1000;
    if s < 60 {
        format!("{}.{}s", s, (ms % 1000) / 100)
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// A size from the command line as the backends take it.
fn term_size(s: berth_client::served::TermSize) -> TermSize {
    TermSize {
        cols: s.cols,
        rows: s.rows,
    }
}
