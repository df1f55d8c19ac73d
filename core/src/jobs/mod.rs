//! Background jobs: detached inside the sandbox, durable, monitored from outside.
//!
//! Flow at a glance:
//! - `start_job` writes the job's row (`starting`) first, writes its command file
//!   into the sandbox, and launches it from the sandbox's session, so it inherits the
//!   session's cwd and exported environment. A wrapper in its own session waits for
//!   it and records its exit status in the sandbox ([`script`]).
//! - Nothing of a job lives in berth's process: `refresh` asks the sandbox for each
//!   unfinished job's state and output size, turns transitions into events, and scans
//!   new output for the job's watch patterns.
//! - `logs` streams the output file from a byte offset through the sandbox, so
//!   memory stays flat whatever the log's size.

mod here;
mod input;
mod monitor;
mod prune;
pub mod pty;
pub mod script;
mod store;

pub use crate::job_state::JobState;
pub use input::{JobInput, SCREEN_TAIL};

use std::collections::BTreeMap;
use std::time::Duration;

use berth_policies::redact::RedactStream;
use regex::Regex;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::backend::{BackendKind, Sandbox, SpawnOpts, TermSize, run_to_end};
use crate::error::{BackendFailure, Error, Result};
use crate::events::EventKind;
use crate::runtime::{ExecRequest, Runtime};
use crate::store::{Event, now_ms};

/// A job as the store knows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    /// Short id, e.g. `j1a2b3c4d`.
    pub id: String,
    /// Optional user-given name.
    pub name: Option<String>,
    /// Backend short name.
    pub backend: BackendKind,
    /// Sandbox name.
    pub sandbox: String,
    /// The command.
    pub command: String,
    /// Where it stands.
    pub state: JobState,
    /// Exit status once it ended (128+N when a signal ended it).
    pub exit_code: Option<i64>,
    /// Its pid (and process group) inside the sandbox.
    pub pid: Option<i64>,
    /// When it was created, ms since the epoch.
    pub created_at: i64,
    /// When it was seen to end, ms since the epoch.
    pub ended_at: Option<i64>,
    /// Why it failed or was lost.
    pub reason: Option<String>,
    /// Watch patterns.
    pub watch: Vec<String>,
    /// How far its output has been scanned for watch patterns.
    pub scan_offset: i64,
    /// Output bytes, as last seen.
    pub out_bytes: i64,
    /// The signal berth sent it, if any.
    pub kill_signal: Option<String>,
    /// A terminal job: the size of its terminal (as last set by berth).
    #[serde(default)]
    pub pty: Option<TermSize>,
}

/// How to start a job, besides its command.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    /// A name to refer to it by.
    pub name: Option<String>,
    /// Regexes over its output lines, each match an event.
    pub watch: Vec<String>,
    /// Run it on a terminal of this size (a terminal job).
    pub pty: Option<TermSize>,
    /// The session it is launched from, whose cwd and exported environment
    /// it inherits ([`crate::runtime::MAIN_SESSION`] when `None`).
    pub session: Option<String>,
}

impl Job {
    /// Its directory inside the sandbox.
    pub fn dir(&self, sandbox: &dyn Sandbox) -> String {
        job_dir(sandbox, &self.id)
    }

    /// Where it stands, for a person: `exited with code 3`, `running`.
    pub fn standing(&self) -> String {
        format!(
            "{}{}",
            self.state.as_str(),
            self.exit_code
                .map(|c| format!(" with code {c}"))
                .unwrap_or_default()
        )
    }

    /// How long it has run (until now, or until it ended).
    pub fn runtime_ms(&self) -> i64 {
        self.ended_at.unwrap_or_else(now_ms) - self.created_at
    }
}

fn job_dir(sandbox: &dyn Sandbox, id: &str) -> String {
    format!("{}/jobs/{id}", sandbox.layout().berth_dir)
}

/// How `kill_job` went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KillOutcome {
    /// The signal was sent.
    Signalled,
    /// The job had already ended, with this state and code.
    AlreadyEnded(JobState, Option<i64>),
}

/// Most watch events one refresh records per job; the rest are counted as dropped.
const WATCH_EVENTS_PER_REFRESH: usize = 10;
/// Most output one refresh scans per job.
const SCAN_CHUNK: usize = 4 * 1024 * 1024;
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes before a log offset read for context, so a secret that straddles the
/// offset is masked (the stream redactor's hold-back bounds a secret's length).
const LOG_CONTEXT: u64 = berth_policies::redact::STREAM_OVERLAP as u64;
/// How long a job may stay `starting` with no directory in its sandbox before
/// it is taken for lost: its launcher waits for the sandbox's session, which a
/// long command elsewhere may hold.
const LAUNCH_GRACE: Duration = Duration::from_secs(600);
/// How an earlier berth began the reason of a job it called `lost` when its
/// sandbox could not be reached, without checking the process; such jobs
/// are checked again. Today only a sandbox seen gone gives this reason.
const UNAVAILABLE: &str = "its sandbox is unavailable: ";
/// How long `kill_job` lets a job's group outlive its signal before SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

fn new_job_id() -> String {
    let n: u32 = rand::random();
    format!("j{n:08x}")
}

fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Called between pieces of a long read; the read waits for what it returns.
pub type Pace = dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Sync;

impl Runtime {
    /// Start `command` detached in a sandbox. Returns the job, already running.
    pub async fn start_job(
        &self,
        backend: BackendKind,
        sandbox: &str,
        command: &str,
        name: Option<String>,
        watch: Vec<String>,
    ) -> Result<Job> {
        let opts = JobOptions {
            name,
            watch,
            ..JobOptions::default()
        };
        self.start_job_with(backend, sandbox, command, opts).await
    }

    /// [`Runtime::start_job`] with every option: a terminal job with `pty`.
    pub async fn start_job_with(
        &self,
        backend: BackendKind,
        sandbox: &str,
        command: &str,
        opts: JobOptions,
    ) -> Result<Job> {
        let JobOptions {
            name,
            watch,
            pty,
            session,
        } = opts;
        if let Some(s) = &session {
            crate::runtime::check_session_name(s)?;
        }
        if command.trim().is_empty() {
            return Err(Error::InvalidInput(
                "empty command: put it after `--`, e.g. `berth job start -- make build`".into(),
            ));
        }
        for w in &watch {
            Regex::new(w).map_err(|e| {
                Error::InvalidInput(format!("--watch {w:?} is not a valid regex: {e}"))
            })?;
        }
        let id = new_job_id();
        // The command the job will run is what the policy judges, not its launcher.
        self.admit(&id, backend, sandbox, command).await?;
        let mut job = Job {
            id,
            name,
            backend,
            sandbox: sandbox.into(),
            command: command.into(),
            state: JobState::Starting,
            exit_code: None,
            pid: None,
            created_at: now_ms(),
            ended_at: None,
            reason: None,
            watch,
            scan_offset: 0,
            out_bytes: 0,
            kill_signal: None,
            pty,
        };
        // The row first: if berth dies during the launch, the job is still on record.
        self.store().insert_job(&job)?;
        match self.launch(&job, session).await {
            Ok(pid) => {
                job.state = JobState::Running;
                job.pid = Some(pid);
            }
            Err(e) => {
                job.state = JobState::Failed;
                job.reason = Some(e.full_text());
                job.ended_at = Some(now_ms());
            }
        }
        self.store().save_job(&job)?;
        self.job_event(&job, EventKind::JobStarted, None)?;
        if job.state == JobState::Failed {
            return Err(Error::backend(
                "job",
                BackendFailure::Rejected,
                format!(
                    "job {} could not start: {}",
                    job.id,
                    job.reason.clone().unwrap_or_default()
                ),
            ));
        }
        Ok(job)
    }

    async fn launch(&self, job: &Job, session: Option<String>) -> Result<i64> {
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let dir = job.dir(sb.as_ref());
        // A terminal job's screen is drawn from the newest output at its
        // offsets in `out`, which a capped log stops growing: not capped.
        let cap = match job.pty {
            Some(_) => 0,
            None => match self.gate() {
                Some(g) => g.limits(&job.sandbox).job_log_cap_bytes,
                None => berth_policies::Limits::default().job_log_cap_bytes,
            },
        };
        let mut launch = script::launch(&dir, sb.name(), cap);
        match job.pty {
            None => {
                sb.write_file(&format!("{dir}/cmd"), job.command.as_bytes(), 0o600)
                    .await?
            }
            Some(size) => {
                // The program goes in `prog`; `cmd` puts it on a terminal.
                sb.write_file(&format!("{dir}/prog"), job.command.as_bytes(), 0o600)
                    .await?;
                let cmd = script::pty_cmd(&dir, size);
                sb.write_file(&format!("{dir}/cmd"), cmd.as_bytes(), 0o600)
                    .await?;
                launch = format!("{}{launch}; fi", script::PTY_PRECHECK);
            }
        }
        let report = self
            .exec(ExecRequest {
                backend: job.backend,
                sandbox: job.sandbox.clone(),
                command: launch,
                timeout: Some(Duration::from_secs(60)),
                admitted: true,
                session,
                ..Default::default()
            })
            .await?;
        let out = report.result.output.text();
        if report.result.exit_code != 0 {
            return Err(Error::backend(
                sb.kind().as_str(),
                BackendFailure::Rejected,
                format!("launching the job failed: {}", out.trim()),
            ));
        }
        let pid = launcher_pid(&out).ok_or_else(|| {
            Error::backend(
                sb.kind().as_str(),
                BackendFailure::Protocol,
                format!("the job launcher printed {out:?} instead of a pid"),
            )
        })?;
        if out.trim().contains('\n') {
            tracing::warn!(job = %job.id, output = %out.trim(), "the job launcher printed more than its pid");
        }
        Ok(pid)
    }

    fn job_event(
        &self,
        job: &Job,
        kind: EventKind,
        detail: Option<serde_json::Value>,
    ) -> Result<()> {
        self.store().append(&self.job_event_of(job, kind, detail))?;
        Ok(())
    }

    /// The event [`Runtime::job_event`] appends, not yet appended.
    fn job_event_of(&self, job: &Job, kind: EventKind, detail: Option<serde_json::Value>) -> Event {
        let mut d = serde_json::json!({ "job": job.id, "state": job.state.as_str() });
        if let Some(name) = &job.name {
            d["name"] = name.clone().into();
        }
        if let Some(reason) = &job.reason {
            d["reason"] = reason.clone().into();
        }
        if let Some(extra) = detail {
            d["detail"] = extra;
        }
        Event {
            kind,
            call_id: Some(job.id.clone()),
            backend: Some(job.backend),
            sandbox: Some(job.sandbox.clone()),
            command: Some(self.redact(&job.command)),
            exit_code: job.exit_code,
            duration_ms: job.ended_at.map(|e| e - job.created_at),
            bytes_out: Some(job.out_bytes),
            detail: Some(crate::gate::redact_json(&d, &|t| self.redact(t)).to_string()),
            ..Default::default()
        }
    }

    /// Every job, with unfinished ones brought up to date from their sandboxes.
    pub async fn list_jobs(&self) -> Result<Vec<Job>> {
        self.store().reopen_unchecked()?;
        let jobs = self.store().jobs()?;
        let mut groups: BTreeMap<(BackendKind, String), Vec<Job>> = BTreeMap::new();
        for j in jobs.iter().filter(|j| !j.state.is_final()) {
            groups
                .entry((j.backend, j.sandbox.clone()))
                .or_default()
                .push(j.clone());
        }
        for ((backend, sandbox), group) in groups {
            self.refresh_group(backend, &sandbox, group).await?;
        }
        self.store().jobs()
    }

    /// One job, brought up to date.
    pub async fn job(&self, id: &str) -> Result<Job> {
        self.store().reopen_unchecked()?;
        let job = self.store().job(id)?;
        if !job.state.is_final() {
            self.refresh_group(job.backend, &job.sandbox, vec![job.clone()])
                .await?;
        }
        self.store().job(&job.id)
    }

    /// Stream a job's output from `offset` into `sink`; with `follow`, until the job
    /// ends. Returns the offset after the last byte delivered.
    pub async fn job_logs(
        &self,
        id: &str,
        offset: u64,
        follow: bool,
        sink: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<u64> {
        self.job_logs_paced(id, offset, follow, sink, None).await
    }

    /// [`Runtime::job_logs`], awaiting `pace` after each piece handed to
    /// `sink`: a sink that forwards to a slow reader holds the read back
    /// there, instead of buffering without bound.
    pub async fn job_logs_paced(
        &self,
        id: &str,
        offset: u64,
        follow: bool,
        sink: &mut (dyn FnMut(&[u8]) + Send),
        pace: Option<&Pace>,
    ) -> Result<u64> {
        let mut at = |b: &[u8], _: u64| sink(b);
        self.job_logs_at(id, offset, follow, &mut at, pace).await
    }

    /// [`Runtime::job_logs_paced`] with, for each piece, the offset a read
    /// resumes at to get what follows it: a follower that loses its
    /// connection (`job logs --follow` through a restarted server) carries on
    /// from the last piece it printed, and prints nothing twice. With
    /// redaction, output held back (a secret that may still be growing) is
    /// not past that offset.
    pub async fn job_logs_at(
        &self,
        id: &str,
        offset: u64,
        follow: bool,
        sink: &mut (dyn FnMut(&[u8], u64) + Send),
        pace: Option<&Pace>,
    ) -> Result<u64> {
        let job = self.job(id).await?;
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let dir = job.dir(sb.as_ref());
        let wrapper = if follow && !job.state.is_final() {
            let w = sb
                .read_file(&format!("{dir}/wrapper"), 64)
                .await
                .unwrap_or_default();
            String::from_utf8_lossy(&w).trim().to_string()
        } else {
            String::new()
        };
        // With redaction on, the read starts a little before `offset`, so a
        // secret that straddles it is recognised and shown masked, not in part.
        let gate = self.gate();
        let context = if gate.is_some() {
            offset.min(LOG_CONTEXT)
        } else {
            0
        };
        let start = offset - context;
        let args = argv(&[
            "bash",
            "-c",
            script::READ,
            "berth-logs",
            &format!("{dir}/out"),
            &start.to_string(),
            &wrapper,
        ]);
        // A helper: `tail --pid` must see the job's wrapper, an earlier spawn.
        let opts = SpawnOpts {
            helper: true,
            ..SpawnOpts::default()
        };
        let mut p = sb.spawn(&args, opts).await?;
        drop(p.take_stdin());
        let mut stream = RedactStream::with_context(context as usize);
        let mut read = 0u64;
        let mut shown = Vec::new();
        if let Some(mut out) = p.take_stdout() {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = out
                    .read(&mut buf)
                    .await
                    .map_err(|e| Error::stream("reading job output", e))?;
                if n == 0 {
                    break;
                }
                read += n as u64;
                match gate {
                    Some(g) => {
                        shown.clear();
                        g.redact_stream(&mut stream, &buf[..n], &mut shown);
                        if !shown.is_empty() {
                            sink(&shown, (start + stream.consumed()).max(offset));
                        }
                    }
                    None => sink(&buf[..n], start + read),
                }
                if let Some(pace) = pace {
                    pace().await;
                }
            }
        }
        p.wait().await?;
        let head_end = match gate {
            None => start + read,
            Some(g) => {
                // The output is complete once the job has ended (a follow ends with
                // it): let out the held tail. Otherwise a tail that may still grow
                // into a secret waits for the next read, which resumes at it.
                if follow || job.state.is_final() {
                    shown.clear();
                    g.redact_stream_end(&mut stream, &mut shown);
                    if !shown.is_empty() {
                        sink(&shown, (start + stream.consumed()).max(offset));
                    }
                }
                (start + stream.consumed()).max(offset)
            }
        };
        if job.pty.is_some() {
            return Ok(head_end);
        }
        self.capped_tail(sb.as_ref(), &dir, head_end, sink).await
    }

    /// A capped log's newest output (see [`script::CAPPER`]), from logical
    /// offset `pos` on, once everything in `out` has been read: first a line
    /// that says how much was dropped before it, if `pos` lies before it.
    /// Offsets count every byte the job printed, dropped ones too, so a
    /// reader resumes where it stopped. Returns the offset after the last
    /// byte; `pos` unchanged for a log that was never capped.
    async fn capped_tail(
        &self,
        sb: &dyn Sandbox,
        dir: &str,
        pos: u64,
        sink: &mut (dyn FnMut(&[u8], u64) + Send),
    ) -> Result<u64> {
        let args = argv(&["bash", "-c", script::TAIL, "berth-tail", dir]);
        let opts = SpawnOpts {
            helper: true,
            ..SpawnOpts::default()
        };
        let mut p = sb.spawn(&args, opts).await?;
        drop(p.take_stdin());
        let Some(out) = p.take_stdout() else {
            p.wait().await?;
            return Ok(pos);
        };
        let mut out = tokio::io::BufReader::new(out);
        let mut header = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut header)
            .await
            .map_err(|e| Error::stream("reading a job's capped output", e))?;
        let sizes: Vec<u64> = header
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let &[head, dropped, older, newest] = sizes.as_slice() else {
            // Not capped, or not past its cap.
            p.wait().await?;
            return Ok(pos);
        };
        // Only once the head is all read: its end is where the tail joins.
        if pos < head {
            p.wait().await?;
            return Ok(pos);
        }
        let kept = head + dropped;
        let end = kept + older + newest;
        if pos < kept {
            let note = format!(
                "\n[berth: {} bytes of this job's output were dropped here: its log keeps the first {head} bytes and the newest {} (job_log_cap_bytes under [limits] in the policy file)]\n",
                kept - pos,
                older + newest
            );
            sink(note.as_bytes(), kept);
        }
        let mut skip = pos.saturating_sub(kept);
        // Where the bytes given to the redactor start, and how many went past it.
        let from = pos.max(kept);
        let mut passed = 0u64;
        let gate = self.gate();
        let mut stream = RedactStream::with_context(0);
        let mut shown = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = out
                .read(&mut buf)
                .await
                .map_err(|e| Error::stream("reading a job's capped output", e))?;
            if n == 0 {
                break;
            }
            let take = (skip.min(n as u64)) as usize;
            skip -= take as u64;
            let piece = &buf[take..n];
            if piece.is_empty() {
                continue;
            }
            passed += piece.len() as u64;
            match gate {
                Some(g) => {
                    shown.clear();
                    g.redact_stream(&mut stream, piece, &mut shown);
                    if !shown.is_empty() {
                        sink(&shown, from + stream.consumed());
                    }
                }
                None => sink(piece, from + passed),
            }
        }
        if let Some(g) = gate {
            shown.clear();
            g.redact_stream_end(&mut stream, &mut shown);
            if !shown.is_empty() {
                sink(&shown, from + stream.consumed());
            }
        }
        p.wait().await?;
        Ok(end.max(pos))
    }

    /// The last `lines` lines of a job's output.
    pub async fn job_tail(&self, id: &str, lines: u64) -> Result<Vec<u8>> {
        Ok(self.job_tail_at(id, lines).await?.0)
    }

    /// [`Runtime::job_tail`], and the offset just after those lines, where a
    /// follow carries on (`job logs --tail N --follow`).
    pub async fn job_tail_at(&self, id: &str, lines: u64) -> Result<(Vec<u8>, u64)> {
        let job = self.store().job(id)?;
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let dir = job.dir(sb.as_ref());
        // A capped log's last lines are in its newest part (`tail.1`, `tail`),
        // and its offsets count the dropped bytes too (see `script::TAIL`).
        // The lines read end at the size printed on stderr, whatever the job
        // writes meanwhile.
        let last = r#"d=$1; n=$2
if [ -s "$d/tail" ] || [ -s "$d/tail.1" ]; then
  exec 7>>"$d/tail.lock" && flock -s 7
  h=$(stat -c %s -- "$d/out"); dr=0; [ -s "$d/dropped" ] && read -r dr < "$d/dropped"
  s1=0; [ -e "$d/tail.1" ] && s1=$(stat -c %s -- "$d/tail.1"); s=$(stat -c %s -- "$d/tail")
  echo "$((h + dr + s1 + s))" >&2
  { [ "$s1" -gt 0 ] && head -c "$s1" -- "$d/tail.1"; head -c "$s" -- "$d/tail"; } | tail -n "$n"
else
  s=$(stat -c %s -- "$d/out") || exit 1
  echo "$s" >&2
  head -c "$s" -- "$d/out" | tail -n "$n"
fi"#;
        let c = run_to_end(
            sb.as_ref(),
            &argv(&["bash", "-c", last, "berth-last", &dir, &lines.to_string()]),
            None,
            64 << 20,
            HELPER_TIMEOUT,
        )
        .await?;
        let end = String::from_utf8_lossy(&c.stderr)
            .lines()
            .next_back()
            .and_then(|l| l.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::backend(
                    sb.kind().as_str(),
                    BackendFailure::Protocol,
                    format!(
                        "could not read job {}'s output size: {}",
                        job.id,
                        String::from_utf8_lossy(&c.stderr).trim()
                    ),
                )
            })?;
        let text = match self.gate() {
            Some(g) => g.redact_bytes(&c.stdout).into_owned(),
            None => c.stdout,
        };
        Ok((text, end))
    }

    /// End a job's whole process group: `signal`, then SIGKILL if anything of it is
    /// left after [`DEFAULT_KILL_GRACE`]. Returns once the group is gone.
    pub async fn kill_job(&self, id: &str, signal: crate::backend::Signal) -> Result<KillOutcome> {
        self.kill_job_with_grace(id, signal, DEFAULT_KILL_GRACE)
            .await
    }

    /// [`Runtime::kill_job`] with its own grace period between `signal` and SIGKILL.
    ///
    /// The job ends `killed`; its `kill_signal` names the signal that ended it and,
    /// when SIGKILL had to follow, its `reason` says so.
    pub async fn kill_job_with_grace(
        &self,
        id: &str,
        signal: crate::backend::Signal,
        grace: Duration,
    ) -> Result<KillOutcome> {
        let mut job = self.job(id).await?;
        if job.state.is_final() {
            return Ok(KillOutcome::AlreadyEnded(job.state, job.exit_code));
        }
        // Recorded before the signal is sent, so the ending reads as a kill.
        job.kill_signal = Some(signal.name().into());
        self.store().save_job(&job)?;
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let c = if sb.host_processes() {
            let sig = crate::procs::signal(signal.name())?;
            let base = format!("{}/jobs", sb.layout().berth_dir);
            here::end(
                std::path::Path::new(&base),
                &job.id,
                &sb.sandbox_procs(),
                sig,
                grace,
            )
            .await
        } else {
            let grace_ms = grace.as_millis().min(u32::MAX as u128).to_string();
            let args = argv(&[
                "bash",
                "-c",
                script::KILL,
                "berth-kill",
                &job.dir(sb.as_ref()),
                signal.name(),
                &grace_ms,
            ]);
            let c = run_to_end(sb.as_ref(), &args, None, 4096, HELPER_TIMEOUT + grace).await?;
            here::Ended {
                code: c.status.code.unwrap_or(-1),
                stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&c.stderr).into_owned(),
            }
        };
        if c.code != 0 {
            let now = self.job(&job.id).await?;
            if now.state.is_final() && c.code != 5 {
                return Ok(KillOutcome::AlreadyEnded(now.state, now.exit_code));
            }
            return Err(Error::backend(
                sb.kind().as_str(),
                BackendFailure::Rejected,
                format!("could not end job {}: {}", job.id, c.stderr.trim()),
            ));
        }
        let escalated = c.stdout.trim() == "escalated";
        let mut detail = serde_json::json!({ "signal": signal.name() });
        if escalated {
            job.kill_signal = Some(crate::backend::Signal::Kill.name().into());
            job.reason = Some(format!(
                "it outlived SIG{} by {} ms; ended with SIGKILL",
                signal.name(),
                grace.as_millis()
            ));
            self.store().note_kill(&job)?;
            detail["escalated_to"] = "KILL".into();
        }
        self.job_event(&job, EventKind::JobSignalled, Some(detail))?;
        // The group is gone and its status recorded: bring the row up to date.
        self.job(&job.id).await?;
        Ok(KillOutcome::Signalled)
    }
}

/// The pid the job launcher printed: its last line. Lines before it are the
/// shell's own warnings on stderr, which the session merges into the output:
/// under a process limit bash says `fork: retry: Resource temporarily
/// unavailable` and then starts the job all the same, so refusing the output
/// would report a running job as never started.
fn launcher_pid(out: &str) -> Option<i64> {
    out.trim().lines().next_back()?.trim().parse().ok()
}

#[cfg(test)]
mod launcher_tests {
    #[test]
    fn the_launchers_pid_is_its_last_line() {
        assert_eq!(super::launcher_pid("4242\n"), Some(4242));
        let retried = "bash: fork: retry: Resource temporarily unavailable\nbash: fork: retry: Resource temporarily unavailable\n26218";
        assert_eq!(super::launcher_pid(retried), Some(26218));
        assert_eq!(
            super::launcher_pid("bash: fork: Resource temporarily unavailable\n"),
            None
        );
        assert_eq!(super::launcher_pid(""), None);
    }
}
