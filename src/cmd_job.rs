//! `berth job start|ls|logs|wait|kill|send|screen|resize|prune`: detached
//! background work.
//!
//! A client of the typed API's `Jobs` service (`berth.v1`): through the
//! server, or with `BERTH_SERVER=off` on the same service in this process.
//! It prints the API's values (as the runtime's own types, converted back
//! once); nothing is captured to form a reply. `job logs --follow` and `job
//! wait` carry on through a restart of the server ([`Reconnect`]).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use berth_core::backend::BackendKind;
use berth_core::backend::{Signal, TermSize};
use berth_core::events::EventKind;
use berth_core::jobs::{Job, JobOptions, JobState};
use berth_server::exec_report::approval_notice_words;
use berth_service::convert::{self, job_row};
use berth_service::proto;
use berth_service::proto::approvals_client::ApprovalsClient;
use berth_service::proto::events_client::EventsClient;
use berth_service::proto::jobs_client::JobsClient;
use serde_json::json;
use tonic::transport::Channel;

use crate::api_client::{self, Api, Reconnect, backend_kind, error};
use crate::{context, server};

use crate::api_args::job::{JobCmd, LogsArgs, LsArgs, SignalArg, WaitArgs};

fn jobs(ch: &Channel) -> JobsClient<Channel> {
    JobsClient::new(ch.clone())
}

/// Run a job subcommand against the state dir `dir`.
pub async fn run(dir: &Path, mode: server::Mode, cmd: JobCmd) -> Result<u8> {
    let api = Api::open(dir, mode).await?;
    let r = run_with(&api, dir, mode, cmd).await;
    api.close().await;
    r
}

/// Start a job through the server, and while the start waits for a
/// person's approval, say so on stderr as an in-process start does: the
/// server's runtime asks in its own log, so this follows the event log for
/// this sandbox's approval requests from before the call, and prints the
/// words an exec prints.
pub(crate) async fn served_start(
    ch: &Channel,
    backend: BackendKind,
    sandbox: &str,
    req: proto::StartJob,
) -> Result<proto::Job> {
    // The follow is in place (its reply came) before the start is sent, so
    // no request made by this start comes before it.
    let mut events = EventsClient::new(ch.clone())
        .follow(proto::FollowEvents {
            kind_prefix: "approval.".into(),
            after: None,
        })
        .await
        .ok()
        .map(|r| r.into_inner());
    let mut client = jobs(ch);
    let start = client.start(req);
    tokio::pin!(start);
    let mut told = std::collections::HashSet::new();
    loop {
        let Some(stream) = events.as_mut() else {
            return Ok(start.await.map_err(error)?.into_inner());
        };
        tokio::select! {
            r = &mut start => return Ok(r.map_err(error)?.into_inner()),
            m = stream.message() => match m {
                Ok(Some(e)) => {
                    let e = convert::event_row(e);
                    let ours = e.sandbox.as_deref() == Some(sandbox)
                        && e.backend == Some(backend)
                        && (e.kind == EventKind::ApprovalRequested
                            || e.kind == EventKind::ApprovalWaiting);
                    let id = e
                        .detail
                        .as_deref()
                        .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                        .and_then(|d| d["approval"].as_i64());
                    if let (true, Some(id)) = (ours, id)
                        && told.insert(id)
                    {
                        tell_approval(ch, id).await;
                    }
                }
                // The follow ended (a server too old for it, or its end):
                // the start is still awaited, without notices.
                Ok(None) | Err(_) => events = None,
            },
        }
    }
}

/// Print approval `id`'s notice, as the server lists it.
async fn tell_approval(ch: &Channel, id: i64) {
    let list = ApprovalsClient::new(ch.clone())
        .list(proto::ListApprovals { all: false })
        .await;
    let words = match list {
        Ok(l) => l.into_inner().approvals.into_iter().find(|a| a.id == id),
        Err(_) => None,
    };
    match words {
        Some(a) => eprintln!("{}", approval_notice_words(a.id, &a.part, &a.reason)),
        None => eprintln!(
            "berth: waiting for approval #{id}; `berth approvals` lists it, `berth approve {id}` answers it"
        ),
    }
}

/// The job `id` as it stands.
async fn get(api: &Api, id: &str) -> Result<Job> {
    Ok(match api {
        Api::Served(ch) => job_row(
            jobs(ch)
                .get(proto::JobRef { id: id.to_string() })
                .await
                .map_err(error)?
                .into_inner(),
        ),
        Api::Here(svc) => svc.job(id).await?,
    })
}

async fn run_with(api: &Api, dir: &Path, mode: server::Mode, cmd: JobCmd) -> Result<u8> {
    let code = match cmd {
        JobCmd::Start(a) => {
            let command = a.command.join(" ");
            let backend = backend_kind(a.backend.as_str())?;
            let pty = a.pty.then(|| a.size.map(term_size).unwrap_or_default());
            let job = match api {
                Api::Served(ch) => job_row(
                    served_start(
                        ch,
                        backend,
                        &a.sandbox,
                        proto::StartJob {
                            sandbox: Some(api_client::sandbox_ref(a.backend, &a.sandbox)?),
                            command,
                            name: a.name,
                            watch: a.watch,
                            session: a.session,
                            pty: pty.map(convert::term_size_out),
                        },
                    )
                    .await?,
                ),
                Api::Here(svc) => {
                    let opts = JobOptions {
                        name: a.name,
                        watch: a.watch,
                        pty,
                        session: Some(a.session),
                    };
                    svc.start_job(backend, &a.sandbox, &command, opts).await?
                }
            };
            if a.json {
                context::print_json(&job_json(&job));
            } else {
                println!("{}", job.id);
            }
            0
        }
        JobCmd::Ls(a) => {
            let list = ls(api, &a, false).await?;
            if a.json {
                context::print_json(&serde_json::Value::Array(
                    list.iter().map(job_json).collect(),
                ));
            } else if list.is_empty()
                && (a.backend.is_some() || a.sandbox.is_some() || !a.state.is_empty())
            {
                println!("no jobs match; `berth job ls` lists them all");
            } else if list.is_empty() {
                println!("no jobs; start one with `berth job start -- COMMAND`");
            } else {
                print_table(&list);
            }
            0
        }
        JobCmd::Prune(a) => {
            let gone = ls(api, &a, true).await?;
            if a.json {
                context::print_json(&serde_json::Value::Array(
                    gone.iter().map(job_json).collect(),
                ));
            } else {
                println!(
                    "pruned {} ended job{}",
                    gone.len(),
                    if gone.len() == 1 { "" } else { "s" }
                );
            }
            0
        }
        JobCmd::Logs(a) => logs(api, dir, mode, a).await?,
        JobCmd::Wait(a) => wait(api, dir, mode, a).await?,
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
            // Only a kill that could not stop the job is an error.
            let (job, already) = match api {
                Api::Served(ch) => {
                    let k = jobs(ch)
                        .kill(proto::KillJob {
                            id: a.id.clone(),
                            signal: match sig {
                                Signal::Term => proto::Signal::Term,
                                Signal::Kill => proto::Signal::Kill,
                                Signal::Int => proto::Signal::Int,
                            } as i32,
                            grace_secs: Some(a.grace),
                        })
                        .await
                        .map_err(error)?
                        .into_inner();
                    let job = k.job.map(job_row).ok_or_else(|| {
                        anyhow::anyhow!("the server's answer to the kill named no job")
                    })?;
                    (job, k.already_ended)
                }
                Api::Here(svc) => {
                    svc.kill_job(&a.id, sig, Some(Duration::from_secs_f64(a.grace)))
                        .await?
                }
            };
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
                println!(
                    "job {} had already ended, {}; nothing to kill",
                    job.id,
                    how_it_ended(&job)
                );
            } else {
                println!("job {} {}", job.id, how_it_ended(&job));
            }
            0
        }
        JobCmd::Send(a) => {
            if a.data.is_none() && a.keys.is_empty() && !a.eof {
                bail!("nothing to send: give DATA, --keys, --eof, or any of them");
            }
            let data = a.data.unwrap_or_default().into_bytes();
            match api {
                Api::Served(ch) => {
                    jobs(ch)
                        .send(proto::SendInput {
                            id: a.id,
                            data,
                            eof: a.eof,
                            keys: a.keys,
                        })
                        .await
                        .map_err(error)?;
                }
                Api::Here(svc) => svc.send_job(&a.id, &data, &a.keys, a.eof).await?,
            }
            0
        }
        JobCmd::Screen(a) => {
            let screen = match api {
                Api::Served(ch) => convert::screen_row(
                    jobs(ch)
                        .screen(proto::JobRef { id: a.id })
                        .await
                        .map_err(error)?
                        .into_inner(),
                ),
                Api::Here(svc) => svc.job_screen(&a.id).await?,
            };
            if a.json {
                context::print_json(&serde_json::to_value(&screen)?);
            } else {
                print!("{}", screen.text());
                eprintln!("berth: screen {}", screen.summary());
            }
            0
        }
        JobCmd::Resize(a) => {
            let size = term_size(a.size);
            match api {
                Api::Served(ch) => {
                    jobs(ch)
                        .resize(proto::ResizeJob {
                            id: a.id,
                            size: Some(convert::term_size_out(size)),
                        })
                        .await
                        .map_err(error)?;
                }
                Api::Here(svc) => svc.resize_job(&a.id, size).await?,
            }
            0
        }
    };
    Ok(code)
}

/// The jobs `job ls` (or with `prune`, `job prune`) names.
async fn ls(api: &Api, a: &LsArgs, prune: bool) -> Result<Vec<Job>> {
    let req = ls_request(a)?;
    Ok(match api {
        Api::Served(ch) => {
            let mut c = jobs(ch);
            let r = if prune {
                c.prune(req).await
            } else {
                c.list(req).await
            };
            r.map_err(error)?
                .into_inner()
                .jobs
                .into_iter()
                .map(job_row)
                .collect()
        }
        Api::Here(svc) => {
            let only = convert::job_filter(&req).map_err(error)?;
            if prune {
                svc.prune_jobs(&only).await?
            } else {
                svc.jobs(&only).await?
            }
        }
    })
}

fn print_table(list: &[Job]) {
    println!(
        "{:<10} {:<12} {:<16} {:<8} {:>5} {:>9} {:>10}  COMMAND",
        "ID", "NAME", "SANDBOX", "STATE", "EXIT", "RUNTIME", "OUTPUT"
    );
    for j in list {
        let cmd: String = j
            .command
            .chars()
            .take(40)
            .map(|c| if c == '\n' { ' ' } else { c })
            .collect();
        println!(
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
            println!("           ^ {r}");
        } else if j.state == JobState::Killed {
            println!("           ^ {}", how_it_ended(j));
        }
    }
}

/// `job wait`: until the job ends or the timeout; the job's own exit code,
/// 124 when it still runs, berth's error status when it ended without one.
async fn wait(api: &Api, dir: &Path, mode: server::Mode, a: WaitArgs) -> Result<u8> {
    let timeout = match a.timeout {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            bail!("--timeout must be a positive number of seconds, e.g. --timeout 30")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let job = match api {
        Api::Here(svc) => tokio::select! {
            j = svc.wait_job(&a.id, timeout) => j?,
            _ = tokio::signal::ctrl_c() => return Ok(130),
        },
        Api::Served(ch) => {
            let started = Instant::now();
            let mut client = jobs(ch);
            let mut again = Reconnect::new(dir, mode);
            loop {
                // The time left; a wait past its timeout still asks once,
                // and says the job is still running.
                let left = timeout.map(|t| {
                    t.saturating_sub(started.elapsed())
                        .max(Duration::from_millis(1))
                        .as_secs_f64()
                });
                let req = proto::WaitJob {
                    id: a.id.clone(),
                    timeout_secs: left,
                };
                let why = tokio::select! {
                    r = client.wait(req) => match r {
                        Ok(j) => break job_row(j.into_inner()),
                        Err(s) if api_client::lost(&s) => s.message().to_string(),
                        Err(s) => return Err(error(s)),
                    },
                    _ = tokio::signal::ctrl_c() => return Ok(130),
                };
                match again.again(why, "wait again").await? {
                    Some(ch) => client = JobsClient::new(ch),
                    None => return Ok(130),
                }
            }
        }
    };
    if a.json {
        context::print_json(&job_json(&job));
    }
    if !job.state.is_final() {
        eprintln!(
            "berth: job {} is still running after the wait's timeout",
            job.id
        );
        return Ok(124);
    }
    if !a.json {
        eprintln!("berth: job {} {}", job.id, job.standing());
    }
    Ok(match (job.state, job.exit_code) {
        (_, Some(c)) if (0..=255).contains(&c) => c as u8,
        _ => crate::EXIT_BERTH_ERROR,
    })
}

/// `job logs`: a job's output, from an offset or its last lines, and with
/// `--follow` until the job ends; the offset to resume at goes to stderr.
async fn logs(api: &Api, dir: &Path, mode: server::Mode, a: LogsArgs) -> Result<u8> {
    if let Some(b) = &a.backend {
        let job = get(api, &a.id).await?;
        if job.backend != *b {
            bail!(
                "job {} runs on the {} backend, not {b}; leave out -b, or pass -b {}",
                job.id,
                job.backend,
                job.backend
            );
        }
    }
    let note = |at: u64| eprintln!("berth: next offset {at} (resume with --offset {at})");
    match api {
        Api::Here(svc) => {
            let mut offset = a.offset;
            if let Some(n) = a.tail {
                let (text, end) = svc.job_tail(&a.id, n).await?;
                api_client::out(&text);
                if !a.follow {
                    return Ok(0);
                }
                offset = end;
            }
            let last = std::sync::atomic::AtomicU64::new(offset);
            let mut sink = |b: &[u8], at: u64| {
                api_client::out(b);
                last.store(at, std::sync::atomic::Ordering::SeqCst);
            };
            let read = svc
                .runtime()
                .job_logs_at(&a.id, offset, a.follow, &mut sink, None);
            let end = tokio::select! {
                r = read => r?,
                _ = tokio::signal::ctrl_c(), if a.follow => {
                    note(last.load(std::sync::atomic::Ordering::SeqCst));
                    return Ok(130);
                }
            };
            note(end);
            Ok(0)
        }
        Api::Served(ch) => {
            let mut client = jobs(ch);
            let mut again = Reconnect::new(dir, mode);
            let mut offset = a.offset;
            // Asked for until the first piece came: then on from its end.
            let mut tail = a.tail.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            loop {
                let req = proto::JobLogs {
                    id: a.id.clone(),
                    offset,
                    follow: a.follow,
                    tail_lines: tail,
                };
                let why = match client.logs(req).await {
                    Ok(r) => {
                        again.answered();
                        let mut stream = r.into_inner();
                        loop {
                            tokio::select! {
                                m = stream.message() => match m {
                                    Ok(Some(c)) => {
                                        api_client::out(&c.data);
                                        offset = c.offset;
                                        tail = None;
                                    }
                                    Ok(None) => {
                                        if a.tail.is_none() || a.follow {
                                            note(offset);
                                        }
                                        return Ok(0);
                                    }
                                    Err(s) if a.follow && api_client::lost(&s) => {
                                        break s.message().to_string();
                                    }
                                    Err(s) => return Err(error(s)),
                                },
                                _ = tokio::signal::ctrl_c(), if a.follow => {
                                    note(offset);
                                    return Ok(130);
                                }
                            }
                        }
                    }
                    Err(s) if a.follow && api_client::lost(&s) => s.message().to_string(),
                    Err(s) => return Err(error(s)),
                };
                let resume = format!("next offset {offset} (resume with --offset {offset})");
                match again.again(why, &resume).await? {
                    Some(ch) => client = JobsClient::new(ch),
                    None => {
                        note(offset);
                        return Ok(130);
                    }
                }
            }
        }
    }
}

/// The API's listing request from `job ls`'s filters; an unknown state is
/// an error that names the states.
fn ls_request(a: &LsArgs) -> Result<proto::ListJobs> {
    const STATES: [&str; 6] = ["starting", "running", "exited", "killed", "failed", "lost"];
    let mut req = proto::ListJobs {
        sandbox_name: a.sandbox.clone(),
        ..Default::default()
    };
    if let Some(b) = a.backend {
        req.backend = convert::backend_out(b) as i32;
    }
    for s in &a.state {
        let state = match s.as_str() {
            "done" => {
                req.ended = true;
                continue;
            }
            "starting" => JobState::Starting,
            "running" => JobState::Running,
            "exited" => JobState::Exited,
            "killed" => JobState::Killed,
            "failed" => JobState::Failed,
            "lost" => JobState::Lost,
            _ => bail!(
                "--state {s:?} is not a job state; use one of {}, or done (every ended job)",
                STATES.join(", ")
            ),
        };
        req.states.push(convert::job_state(state) as i32);
    }
    Ok(req)
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
fn term_size(s: crate::api_args::TermSize) -> TermSize {
    TermSize {
        cols: s.cols,
        rows: s.rows,
    }
}
