//! The jobs suite: background jobs through the runtime, the same assertions for
//! every backend. A backend joins with one `jobs_suite!` line in `all.rs`.

use berth_core::backend::BackendKind;
use berth_core::events::EventKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::backend::TermSize;
use berth_core::backend::{Backend, Signal};
use berth_core::jobs::pty::Screen;
use berth_core::jobs::{JobOptions, JobState, KillOutcome};
use berth_core::runtime::{BackendSource, ExecRequest, Runtime, RuntimeConfig};
use berth_core::store::Store;

use crate::support::{BoxError, Harness, TestResult};

/// Expand the whole jobs suite for one backend.
#[macro_export]
macro_rules! jobs_suite {
    ($name:ident, $harness:path) => {
        mod $name {
            use $crate::jobs as j;
            use $crate::support::TestResult;

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() -> TestResult {
                        let h = $harness().await?;
                        j::$case(&h).await
                    }
                };
            }

            case!(a_job_runs_detached_with_the_session_state);
            case!(jobs_survive_a_restart_of_berth);
            case!(kill_stops_the_whole_group);
            case!(kill_escalates_to_sigkill_after_the_grace);
            case!(a_job_killed_as_it_starts_ends_on_record);
            case!(wait_wakes_when_the_job_ends);
            case!(stdin_through_the_fifo_and_eof);
            case!(a_vanished_job_is_lost_not_exited);
            case!(watch_patterns_become_rate_limited_events);
            case!(wait_times_out_and_bad_ids_are_named);
            case!(a_failed_test_leaves_no_sandbox);
            case!(a_launching_job_is_starting_not_lost);
            case!(a_pty_job_is_a_terminal_a_program_can_be_driven_on);
            case!(a_pty_job_follows_resizes_and_renders_a_full_screen_program);
            case!(killing_a_pty_job_ends_the_program_on_its_terminal);
            case!(an_interrupt_reaches_a_job_that_handles_it);
            case!(named_sessions_keep_their_own_state_and_survive_a_restart);
            case!(a_flooding_job_keeps_at_most_twice_its_log_cap);
            case!(fifos_planted_in_a_jobs_directory_stall_no_call);
            case!(each_watch_match_is_recorded_once_however_many_refresh);
            case!(enter_on_a_job_without_a_terminal_is_a_newline);
        }
    };
}

/// Hands the harness's backend to a runtime.
struct One(Arc<dyn Backend>);

#[async_trait]
impl BackendSource for One {
    async fn open(
        &self,
        kind: berth_core::backend::BackendKind,
    ) -> berth_core::Result<Arc<dyn Backend>> {
        if kind == self.0.kind() {
            Ok(self.0.clone())
        } else {
            Err(berth_core::Error::InvalidInput(format!(
                "no backend {kind}"
            )))
        }
    }
}

/// A runtime over the harness's backend with its own store, plus a sandbox in it.
struct Rig {
    rt: Runtime,
    kind: berth_core::backend::BackendKind,
    sandbox: String,
    state: tempfile::TempDir,
    /// Removes the sandbox even when the test fails.
    fixture: crate::support::Fixture,
}

impl Rig {
    async fn new(h: &Harness, test: &str) -> Result<Rig, BoxError> {
        let state = tempfile::tempdir()?;
        let rt = runtime(h, state.path())?;
        let f = h.sandbox(test).await?;
        let kind = h.backend.kind();
        rt.create_sandbox(kind, f.spec.clone()).await?;
        Ok(Rig {
            rt,
            kind,
            sandbox: f.spec.name.clone(),
            state,
            fixture: f,
        })
    }

    /// A second runtime on the same store: berth started again.
    fn restart(&self, h: &Harness) -> Result<Runtime, BoxError> {
        runtime(h, self.state.path())
    }

    async fn start(&self, cmd: &str) -> Result<String, BoxError> {
        Ok(self
            .rt
            .start_job(self.kind, &self.sandbox, cmd, None, vec![])
            .await?
            .id)
    }

    async fn exec(&self, cmd: &str) -> Result<String, BoxError> {
        let r = self
            .rt
            .exec(ExecRequest {
                backend: self.kind,
                sandbox: self.sandbox.clone(),
                command: cmd.into(),
                timeout: Some(Duration::from_secs(60)),
                ..Default::default()
            })
            .await?;
        Ok(r.result.output.text())
    }

    async fn logs(&self, id: &str) -> Result<String, BoxError> {
        let mut buf = Vec::new();
        let mut sink = |b: &[u8]| buf.extend_from_slice(b);
        self.rt.job_logs(id, 0, false, &mut sink).await?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Wait until `check` holds, re-checking every 50 ms, for at most 30 s.
    async fn until<F, Fut>(&self, what: &str, mut check: F) -> TestResult
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, BoxError>>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check().await? {
            if Instant::now() > deadline {
                return Err(format!("gave up after 30s waiting for {what}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// A rig for terminal jobs, or `None` where a local sandbox cannot open
    /// terminals (its Landlock profile closes them): there a terminal job is
    /// refused with a message that says why and what to use instead, and
    /// nothing is left running.
    async fn for_pty(h: &Harness, test: &str) -> Result<Option<Rig>, BoxError> {
        let r = Rig::new(h, test).await?;
        let err = match r.start_pty("true", 80, 24).await {
            Ok(_) => return Ok(Some(r)),
            // Only where the kernel really gives this user no mount
            // namespace (as root, or with user namespaces, it does).
            Err(e) if r.kind == BackendKind::Local && !mount_namespaces_here() => e.to_string(),
            Err(e) => return Err(e),
        };
        assert!(
            err.contains("cannot open a terminal") && err.contains("docker or ssh"),
            "{err}"
        );
        let jobs = r.rt.list_jobs().await?;
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].state, JobState::Failed, "{jobs:?}");
        r.finish().await?;
        Ok(None)
    }

    /// Start a terminal job of `size`.
    async fn start_pty(&self, cmd: &str, cols: u16, rows: u16) -> Result<String, BoxError> {
        let opts = JobOptions {
            pty: Some(TermSize { cols, rows }),
            ..JobOptions::default()
        };
        let job = self
            .rt
            .start_job_with(self.kind, &self.sandbox, cmd, opts)
            .await?;
        assert_eq!(job.pty, Some(TermSize { cols, rows }));
        Ok(job.id)
    }

    /// The job's screen once `check` holds on it (for at most 30 s).
    async fn screen_until(
        &self,
        id: &str,
        what: &str,
        check: impl Fn(&Screen) -> bool,
    ) -> Result<Screen, BoxError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.rt.job_screen(id).await?;
            if check(&s) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "gave up after 30s waiting for {what}; the screen:\n{}",
                    s.text()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish(self) -> TestResult {
        self.rt.shutdown().await;
        self.fixture.remove().await
    }
}

fn runtime(h: &Harness, state: &std::path::Path) -> Result<Runtime, BoxError> {
    let store = Store::open(state)?;
    let mut cfg = RuntimeConfig::new(state.to_path_buf());
    cfg.grace = Duration::from_millis(300);
    Ok(Runtime::new(
        Arc::new(store),
        Arc::new(One(h.backend.clone())),
        cfg,
    ))
}

const WAIT: Option<Duration> = Some(Duration::from_secs(60));

pub async fn a_job_runs_detached_with_the_session_state(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-basic").await?;
    r.exec("mkdir -p /tmp/jobwd && cd /tmp/jobwd && export JV=42")
        .await?;
    let id = r.start("echo \"$JV $PWD\"; echo err >&2; exit 3").await?;
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!(job.state, JobState::Exited);
    assert_eq!(job.exit_code, Some(3));
    assert_eq!(r.logs(&id).await?, "42 /tmp/jobwd\nerr\n");
    assert_eq!(job.out_bytes, 18);
    // The session is untouched by the job.
    assert_eq!(r.exec("echo $JV").await?, "42\n");
    // Following a running job returns once it ends, with all of its output.
    let id = r
        .start("for i in 1 2 3 4 5; do echo f$i; sleep 0.1; done")
        .await?;
    let mut buf = Vec::new();
    let mut sink = |b: &[u8]| buf.extend_from_slice(b);
    let end = r.rt.job_logs(&id, 0, true, &mut sink).await?;
    assert_eq!(String::from_utf8_lossy(&buf), "f1\nf2\nf3\nf4\nf5\n");
    assert_eq!(end, 15);
    r.finish().await
}

pub async fn jobs_survive_a_restart_of_berth(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-restart").await?;
    let cmd = "for i in $(seq 1 30); do echo line $i; sleep 0.1; done";
    let (id, again) = match &h.cli {
        // The job is started by another berth process, which then ends: nothing
        // of the process that started it is left when this one looks.
        Some(cli) => {
            let o = cli.run(&["sandbox", "create", &r.sandbox, "-b", cli.backend])?;
            assert_eq!(o.status.code(), Some(0), "{o:?}");
            let o = cli.run(&[
                "job",
                "start",
                "-b",
                cli.backend,
                "-s",
                &r.sandbox,
                "--",
                cmd,
            ])?;
            assert_eq!(o.status.code(), Some(0), "{o:?}");
            let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
            (id, runtime(h, &cli.state_dir)?)
        }
        // No CLI route to this backend's test server: the first runtime is
        // shut down and dropped (its connections closed) before the second.
        None => {
            let first = runtime(h, r.state.path())?;
            let id = first
                .start_job(r.kind, &r.sandbox, cmd, None, vec![])
                .await?
                .id;
            first.shutdown().await;
            drop(first);
            (id, r.restart(h)?)
        }
    };
    let job = again.job(&id).await?;
    assert_eq!(job.state, JobState::Running, "{job:?}");
    let job = again.wait_job(&id, WAIT).await?;
    assert_eq!((job.state, job.exit_code), (JobState::Exited, Some(0)));
    let mut buf = Vec::new();
    let mut sink = |b: &[u8]| buf.extend_from_slice(b);
    let end = again.job_logs(&id, 0, false, &mut sink).await?;
    let want: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&buf), want);
    assert_eq!(end as usize, want.len());
    // Resuming from an offset gives exactly the rest.
    let mut rest = Vec::new();
    let mut sink = |b: &[u8]| rest.extend_from_slice(b);
    again.job_logs(&id, 8, false, &mut sink).await?;
    assert_eq!(rest, want.as_bytes()[8..]);
    again.shutdown().await;
    r.finish().await
}

pub async fn kill_stops_the_whole_group(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-kill").await?;
    let salt = std::process::id();
    let id = r
        .start(&format!(
            "sleep 2001.{salt} & (sleep 2002.{salt} &) ; bash -c 'sleep 2003.{salt}'"
        ))
        .await?;
    let count = format!(
        r#"n=0; for f in /proc/[0-9]*/cmdline; do c=$(tr '\0' ' ' 2>/dev/null < "$f"); case "$c" in *"sleep 200"[123]".{salt}"*) n=$((n+1));; esac; done; echo $n"#
    );
    // All three are up before the kill.
    r.until("all three sleeps are up", || async {
        Ok(r.exec(&count).await?.trim() == "3")
    })
    .await?;
    assert_eq!(
        r.rt.kill_job(&id, Signal::Term).await?,
        KillOutcome::Signalled
    );
    // The kill returns once the tree is gone, and the ending is already on record.
    assert_eq!(
        r.exec(&count).await?.trim(),
        "0",
        "a process of the job survived its kill"
    );
    let job = r.rt.store().job(&id)?;
    assert_eq!(job.state, JobState::Killed, "{job:?}");
    assert_eq!(job.exit_code, Some(143));
    assert_eq!(job.kill_signal.as_deref(), Some("TERM"));
    match r.rt.kill_job(&id, Signal::Kill).await? {
        KillOutcome::AlreadyEnded(JobState::Killed, Some(143)) => {}
        other => panic!("killing a finished job said {other:?}"),
    }
    r.finish().await
}

pub async fn kill_escalates_to_sigkill_after_the_grace(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-escalate").await?;
    let salt = std::process::id();
    let stubborn = format!("trap '' TERM; echo armed; sleep 600.{salt}");
    let count = format!(
        r#"n=0; for f in /proc/[0-9]*/cmdline; do c=$(tr '\0' ' ' 2>/dev/null < "$f"); case "$c" in *"sleep 600.{salt}"*) n=$((n+1));; esac; done; echo $n"#
    );
    let id = r.start(&stubborn).await?;
    // The trap is set once it says so; a TERM before that would simply work.
    r.until("the job to set its trap", || async {
        Ok(r.logs(&id).await? == "armed\n")
    })
    .await?;
    assert_eq!(
        r.rt.kill_job_with_grace(&id, Signal::Term, Duration::from_millis(500))
            .await?,
        KillOutcome::Signalled
    );
    assert_eq!(
        r.exec(&count).await?.trim(),
        "0",
        "the job outlived its kill"
    );
    let job = r.rt.store().job(&id)?;
    assert_eq!(job.state, JobState::Killed, "{job:?}");
    assert_eq!(job.exit_code, Some(137), "{job:?}");
    assert_eq!(job.kill_signal.as_deref(), Some("KILL"), "{job:?}");
    let reason = job.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("SIGTERM") && reason.contains("SIGKILL"),
        "{reason}"
    );
    let events = r.rt.store().events(0, 1000, Some("job.signalled"))?;
    assert!(
        events.iter().any(|e| e
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("escalated_to"))),
        "{events:?}"
    );

    // SIGKILL needs no grace: a long one is never waited out.
    let id = r.start(&stubborn).await?;
    r.until("the second job to set its trap", || async {
        Ok(r.logs(&id).await? == "armed\n")
    })
    .await?;
    let started = Instant::now();
    r.rt.kill_job_with_grace(&id, Signal::Kill, Duration::from_secs(600))
        .await?;
    assert!(started.elapsed() < Duration::from_secs(300));
    let job = r.rt.store().job(&id)?;
    assert_eq!((job.state, job.exit_code), (JobState::Killed, Some(137)));
    assert_eq!(job.reason, None, "nothing was escalated: {job:?}");
    assert_eq!(r.exec(&count).await?.trim(), "0");
    r.finish().await
}

/// A kill right after the start can land before the job has opened its
/// output pipe: its log capper, blocked in its own open of that pipe, then
/// waited for a writer that never came, and the status was not recorded for
/// 30 s (the kill returned with the job still `running`). The wrapper's own
/// test (`jobs::script`) hits that race on purpose; this is the same
/// through the runtime on every backend: each kill returns with the job
/// `killed` on record.
pub async fn a_job_killed_as_it_starts_ends_on_record(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-kill-early").await?;
    for round in 0..8 {
        let id = r.start("sleep 300").await?;
        let sig = if round % 2 == 0 {
            Signal::Kill
        } else {
            Signal::Term
        };
        assert_eq!(r.rt.kill_job(&id, sig).await?, KillOutcome::Signalled);
        let job = r.rt.store().job(&id)?;
        assert_eq!(
            job.state,
            JobState::Killed,
            "round {round}: the kill returned before the job's end was recorded: {job:?}"
        );
    }
    r.finish().await
}

/// `wait_job` wakes on the job's end, not on a poll: the waiter is already
/// waiting in the sandbox when the test ends the job, and returns within half a
/// second of it, three times in a row. A one-second poll (as `tail --pid` does)
/// passes that by chance one time in eight; the event takes ~10-70 ms here. The
/// latency itself is measured by `berth bench`.
pub async fn wait_wakes_when_the_job_ends(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-wake").await?;
    let waiting = r#"n=0; for f in /proc/[0-9]*/cmdline; do c=$(tr '\0' ' ' 2>/dev/null < "$f"); case "$c" in *"berth-"wait*) n=$((n+1));; esac; done; echo $n"#;
    for round in 0..3 {
        let id = r.start("read -r line; echo \"got $line\"").await?;
        let waiter = r.rt.wait_job(&id, WAIT);
        let ender = async {
            // The job ends only once the waiter is waiting in the sandbox.
            r.until("the waiter to be waiting", || async {
                Ok(r.exec(waiting).await?.trim() != "0")
            })
            .await?;
            r.rt.send_job(&id, b"go\n", false).await?;
            Ok::<Instant, BoxError>(Instant::now())
        };
        let (job, ended) = tokio::join!(waiter, ender);
        let woke = Instant::now();
        let (job, ended) = (job?, ended?);
        assert_eq!((job.state, job.exit_code), (JobState::Exited, Some(0)));
        let late = woke.saturating_duration_since(ended);
        assert!(
            late < Duration::from_millis(500),
            "round {round}: job wait returned {late:?} after the job's end"
        );
        // The ending was recorded, with its event, by the time the wait returned.
        let events = r.rt.store().events(0, 1000, Some("job.exited"))?;
        assert!(
            events
                .iter()
                .any(|e| e.call_id.as_deref() == Some(id.as_str()))
        );
    }
    r.finish().await
}

pub async fn stdin_through_the_fifo_and_eof(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-stdin").await?;
    let id = r
        .start("read -r first; echo \"first=$first\"; cat; echo done")
        .await?;
    r.rt.send_job(&id, b"one\n", false).await?;
    r.rt.send_job(&id, b"two\nthree", true).await?;
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!((job.state, job.exit_code), (JobState::Exited, Some(0)));
    assert_eq!(r.logs(&id).await?, "first=one\ntwo\nthreedone\n");
    let err = r.rt.send_job(&id, b"late", false).await;
    assert!(err.is_err(), "sending to a finished job must fail");
    r.finish().await
}

/// Issue 32 item 6: a job's record files are written by the sandbox, so a
/// command can replace them with FIFOs, which block whoever opens them. Every
/// call that reads them (list, status, wait, kill) returns at once, reports
/// the job lost (its record cannot be trusted), signals nothing, and the
/// session stays usable.
pub async fn fifos_planted_in_a_jobs_directory_stall_no_call(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-fifo").await?;
    let id = r.start("sleep 30").await?;
    let job = r.rt.job(&id).await?;
    assert_eq!(job.state, JobState::Running, "{job:?}");
    let dir = {
        let sb = r.rt.attach(r.kind, &r.sandbox).await?;
        job.dir(sb.as_ref())
    };
    let planted = r
        .exec(&format!(
            "cd {dir} && for f in status wrapper pid; do rm -f $f && mkfifo $f; done; ls -l status wrapper pid | cut -c1 | tr -d '\\n'"
        ))
        .await?;
    assert_eq!(planted.trim(), "ppp", "the FIFOs are in place");
    // Bounded only so that a stall fails here instead of hanging the suite.
    let bound = Duration::from_secs(60);
    let listed = tokio::time::timeout(bound, r.rt.list_jobs())
        .await
        .map_err(|_| "listing jobs stalled on a FIFO")??;
    let listed = listed
        .iter()
        .find(|j| j.id == id)
        .ok_or("the job is missing from the list")?;
    assert_eq!(listed.state, JobState::Lost, "{listed:?}");
    let waited = tokio::time::timeout(bound, r.rt.wait_job(&id, WAIT))
        .await
        .map_err(|_| "waiting for the job stalled on a FIFO")??;
    assert_eq!((waited.state, waited.exit_code), (JobState::Lost, None));
    let killed = tokio::time::timeout(bound, r.rt.kill_job(&id, Signal::Kill))
        .await
        .map_err(|_| "killing the job stalled on a FIFO")??;
    assert_eq!(killed, KillOutcome::AlreadyEnded(JobState::Lost, None));
    assert_eq!(r.exec("echo still here").await?.trim(), "still here");
    r.finish().await
}

pub async fn a_vanished_job_is_lost_not_exited(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-lost").await?;
    let id = r.start("sleep 300").await?;
    let job = r.rt.job(&id).await?;
    let pid = job.pid.ok_or("no pid")?;
    // Kill the job and its wrapper from outside, as an OOM killer or a reboot would.
    let dir = {
        let sb = r.rt.attach(r.kind, &r.sandbox).await?;
        job.dir(sb.as_ref())
    };
    r.exec(&format!("kill -9 $(cat {dir}/wrapper) {pid}"))
        .await?;
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!(job.state, JobState::Lost, "{job:?}");
    assert_eq!(job.exit_code, None);
    assert!(job.reason.is_some());
    r.finish().await
}

/// A job whose sandbox's machine was taken away under it (a pod deleted):
/// `replace` does that to the named sandbox. Once berth has looked, the job
/// is `lost`, never `running`, and the sandbox runs commands again.
pub async fn a_job_whose_sandbox_was_replaced_is_lost<F, Fut>(h: &Harness, replace: F) -> TestResult
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = TestResult>,
{
    let r = Rig::new(h, "job-replaced").await?;
    let id = r.start("echo up; sleep 300").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !r.logs(&id).await?.contains("up") {
        if tokio::time::Instant::now() > deadline {
            return Err("the job never started".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replace(r.sandbox.clone()).await?;
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!(job.state, JobState::Lost, "{job:?}");
    assert_eq!(job.exit_code, None);
    assert!(job.reason.is_some(), "{job:?}");
    assert_eq!(r.exec("echo back").await?.trim(), "back");
    r.finish().await
}

pub async fn watch_patterns_become_rate_limited_events(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-watch").await?;
    let job =
        r.rt.start_job(
            r.kind,
            &r.sandbox,
            "for i in $(seq 1 50); do echo \"ERROR $i\"; echo fine; done",
            Some("noisy".into()),
            vec!["^ERROR [0-9]+$".into()],
        )
        .await?;
    let done = r.rt.wait_job("noisy", WAIT).await?;
    assert_eq!(done.id, job.id);
    let events = r.rt.store().events(0, 1000, Some("job."))?;
    let detail = |e: &berth_core::store::Event| -> serde_json::Value {
        e.detail
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default()
    };
    // How many refreshes saw the output depends on timing; the limit holds in
    // each, and every match is either recorded or counted as dropped.
    let mut per_window: std::collections::BTreeMap<i64, (usize, u64)> = Default::default();
    let mut lines = Vec::new();
    for e in &events {
        let d = detail(e);
        let window = d["detail"]["window"].as_i64();
        match e.kind.as_str() {
            "job.watch" => {
                let w = window.ok_or("a watch event without its window")?;
                per_window.entry(w).or_default().0 += 1;
                lines.push(d["detail"]["line"].as_str().unwrap_or_default().to_string());
            }
            "job.watch.dropped" => {
                let w = window.ok_or("a dropped event without its window")?;
                assert_eq!(d["detail"]["limit"], 10, "{d}");
                per_window.entry(w).or_default().1 += d["detail"]["dropped"].as_u64().unwrap_or(0);
            }
            _ => {}
        }
    }
    for (w, (recorded, dropped)) in &per_window {
        assert!(
            *recorded <= 10,
            "window {w}: {recorded} watch events, limit 10"
        );
        if *dropped > 0 {
            assert_eq!(*recorded, 10, "window {w} dropped matches below its limit");
        }
    }
    let recorded: usize = per_window.values().map(|v| v.0).sum();
    let dropped: u64 = per_window.values().map(|v| v.1).sum();
    assert_eq!(recorded as u64 + dropped, 50, "{per_window:?}");
    // Recorded in output order, each at most once.
    assert_eq!(
        lines.first().map(String::as_str),
        Some("ERROR 1"),
        "{lines:?}"
    );
    let nums: Vec<u32> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("ERROR ")?.parse().ok())
        .collect();
    assert_eq!(nums.len(), lines.len(), "{lines:?}");
    assert!(nums.windows(2).all(|p| p[0] < p[1]), "{nums:?}");
    assert!(
        events
            .iter()
            .any(|e| e.kind == EventKind::Job(JobState::Exited))
    );
    r.finish().await
}

pub async fn wait_times_out_and_bad_ids_are_named(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-wait").await?;
    let id = r.start("sleep 30").await?;
    let job = r.rt.wait_job(&id, Some(Duration::from_millis(300))).await?;
    assert_eq!(job.state, JobState::Running);
    r.rt.kill_job(&id, Signal::Kill).await?;
    match r.rt.job("j-nope").await {
        Err(e @ berth_core::Error::NotFound { what: "job", .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("j-nope"),
                "the message does not name the id: {msg}"
            );
        }
        other => panic!("unknown job id gave {:?}", other.map(|j| j.id)),
    }
    match r
        .rt
        .start_job(r.kind, &r.sandbox, "true", None, vec!["(unclosed".into()])
        .await
    {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("(unclosed"),
                "the message does not name the pattern: {msg}"
            );
        }
        Ok(j) => panic!("a bad watch regex started job {}", j.id),
    }
    r.finish().await
}

/// A test that fails between provisioning and cleanup must not leak its
/// sandbox (container, volumes, directory): dropping the fixture removes it.
pub async fn a_failed_test_leaves_no_sandbox(h: &Harness) -> TestResult {
    let name = {
        let f = h.sandbox("leak").await?;
        let listed = h.backend.list().await?;
        assert!(listed.iter().any(|i| i.name == f.spec.name), "{listed:?}");
        f.spec.name.clone()
        // Dropped here without `remove`, as when a test fails.
    };
    let listed = h.backend.list().await?;
    assert!(
        !listed.iter().any(|i| i.name == name),
        "the dropped fixture's sandbox is still there: {listed:?}"
    );
    Ok(())
}

/// A job whose launch waits for the sandbox's session (a long command holds
/// it) is `starting` to anyone who looks meanwhile, not lost because its
/// directory is not there yet; a waiter armed then still sees its end.
pub async fn a_launching_job_is_starting_not_lost(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-launching").await?;
    let busy = r.exec("sleep 2; echo busy-done");
    let launch = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        r.start("echo launched").await
    };
    let look = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        let job = loop {
            let jobs = r.rt.list_jobs().await?;
            if let Some(j) = jobs.into_iter().find(|j| j.command == "echo launched") {
                break j;
            }
            if Instant::now() > deadline {
                return Err::<_, BoxError>("the launching job's row never showed up".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(job.state, JobState::Starting, "{job:?}");
        Ok(r.rt.wait_job(&job.id, WAIT).await?)
    };
    let (busy, id, done) = tokio::join!(busy, launch, look);
    assert_eq!(busy?, "busy-done\n");
    let (id, done) = (id?, done?);
    assert_eq!(done.id, id);
    assert_eq!(
        (done.state, done.exit_code),
        (JobState::Exited, Some(0)),
        "{done:?}"
    );
    assert_eq!(r.logs(&id).await?, "launched\n");
    let lost = r.rt.store().events(0, 100, Some("job.lost"))?;
    assert!(lost.is_empty(), "a job.lost was recorded: {lost:?}");
    r.finish().await
}

/// A REPL on a terminal, driven as an agent would: type, read the screen,
/// press control keys.
pub async fn a_pty_job_is_a_terminal_a_program_can_be_driven_on(h: &Harness) -> TestResult {
    let Some(r) = Rig::for_pty(h, "job-pty").await? else {
        return Ok(());
    };
    let id = r
        .start_pty(
            "python3 -q -i -c 'import sys; print(\"tty\", sys.stdin.isatty(), sys.stdout.isatty())'",
            100,
            30,
        )
        .await?;
    r.screen_until(&id, "the >>> prompt", |s| s.text().contains(">>>"))
        .await?;
    r.rt.send_job(&id, b"6*7\n", false).await?;
    let s = r
        .screen_until(&id, "42", |s| s.lines.iter().any(|l| l == "42"))
        .await?;
    assert_eq!((s.cols, s.rows), (100, 30));
    assert!(s.lines.iter().any(|l| l == "tty True True"), "{s:?}");
    assert!(
        s.lines.iter().any(|l| l == ">>> 6*7"),
        "the terminal echoes: {s:?}"
    );
    // The cursor sits after the last prompt.
    let last = s.lines.iter().rposition(|l| !l.is_empty()).ok_or("blank")?;
    assert_eq!(s.lines[last], ">>>");
    assert_eq!((s.cursor_row as usize, s.cursor_col), (last, 4));
    // Ctrl-C interrupts the program's work, not the program.
    r.rt.send_job(&id, b"import time; time.sleep(120)\n", false)
        .await?;
    r.screen_until(&id, "the sleep to start", |s| {
        s.lines.iter().any(|l| l.ends_with("time.sleep(120)"))
    })
    .await?;
    r.rt.send_keys(&id, &["C-c"]).await?;
    let s = r
        .screen_until(&id, "KeyboardInterrupt and a new prompt", |s| {
            let t = s.text();
            t.contains("KeyboardInterrupt") && t.trim_end().ends_with(">>>")
        })
        .await?;
    assert!(!s.alternate_screen);
    // The REPL lives on.
    r.rt.send_job(&id, b"print('still', 6*7)\n", false).await?;
    r.screen_until(&id, "the REPL after Ctrl-C", |s| {
        s.lines.iter().any(|l| l == "still 42")
    })
    .await?;
    // Ctrl-D at the prompt ends it, as on any terminal.
    r.rt.send_keys(&id, &["C-d"]).await?;
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!(
        (job.state, job.exit_code),
        (JobState::Exited, Some(0)),
        "{job:?}"
    );
    assert_eq!(job.kill_signal, None);
    // The log is the raw stream the terminal received.
    let log = r.logs(&id).await?;
    assert!(log.contains("6*7") && log.contains("\r\n42\r\n"), "{log:?}");
    // Not a terminal job: a screen is refused with what to do instead.
    let plain = r.start("echo plain").await?;
    let err =
        r.rt.job_screen(&plain)
            .await
            .err()
            .ok_or("a screen of a plain job")?;
    assert!(err.to_string().contains("--pty"), "{err}");
    let err =
        r.rt.send_keys(&id, &["Hyper"])
            .await
            .err()
            .ok_or("a bad key")?;
    assert!(err.to_string().contains("unknown key"), "{err}");
    r.finish().await
}

/// `tput cols` follows a resize, and a full-screen program's screen (less, on
/// the alternate screen) has the rows a terminal of that size shows.
pub async fn a_pty_job_follows_resizes_and_renders_a_full_screen_program(
    h: &Harness,
) -> TestResult {
    let Some(r) = Rig::for_pty(h, "job-pty-size").await? else {
        return Ok(());
    };
    let id = r
        .start_pty(
            "unset LESS LESSOPEN; read -r _; tput cols; read -r _; tput cols; stty size; \
             read -r _; seq 1 500 | less; echo less-done",
            80,
            24,
        )
        .await?;
    r.rt.send_job(&id, b"\n", false).await?;
    r.screen_until(&id, "80 columns", |s| s.lines.iter().any(|l| l == "80"))
        .await?;
    r.rt.resize_job(
        &id,
        TermSize {
            cols: 100,
            rows: 30,
        },
    )
    .await?;
    assert_eq!(
        r.rt.job(&id).await?.pty,
        Some(TermSize {
            cols: 100,
            rows: 30
        })
    );
    r.rt.send_job(&id, b"\n", false).await?;
    let s = r
        .screen_until(&id, "100 columns", |s| {
            s.lines.iter().any(|l| l == "30 100")
        })
        .await?;
    assert_eq!((s.cols, s.rows), (100, 30));
    assert!(s.lines.iter().any(|l| l == "100"), "{s:?}");
    r.rt.send_job(&id, b"\n", false).await?;
    let s = r
        .screen_until(&id, "less's first page", |s| {
            s.alternate_screen && s.lines.get(29).is_some_and(|l| l == ":")
        })
        .await?;
    let want: Vec<String> = (1..=29).map(|i| i.to_string()).collect();
    assert_eq!(s.lines[..29], want[..], "{s:?}");
    // The last page, then out.
    r.rt.send_keys(&id, &["G"]).await?;
    let s = r
        .screen_until(&id, "less's last page", |s| {
            s.lines.get(28).is_some_and(|l| l == "500")
        })
        .await?;
    assert_eq!(s.lines[0], "472");
    r.rt.send_keys(&id, &["q"]).await?;
    let s = r
        .screen_until(&id, "less to exit", |s| s.text().contains("less-done"))
        .await?;
    assert!(!s.alternate_screen, "{s:?}");
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!((job.state, job.exit_code), (JobState::Exited, Some(0)));
    let err =
        r.rt.resize_job(&id, TermSize { cols: 90, rows: 20 })
            .await
            .err()
            .ok_or("resizing an ended job")?;
    assert!(err.to_string().contains("terminal is gone"), "{err}");
    r.finish().await
}

/// The program on a job's terminal is in a session of its own; a kill ends
/// it too, even when it ignores SIGHUP and SIGTERM.
pub async fn killing_a_pty_job_ends_the_program_on_its_terminal(h: &Harness) -> TestResult {
    let Some(r) = Rig::for_pty(h, "job-pty-kill").await? else {
        return Ok(());
    };
    let id = r
        .start_pty(
            "trap '' HUP TERM INT; sleep 300 & echo \"$$ $!\" > pty-kill.pids; echo started; wait; wait",
            80,
            24,
        )
        .await?;
    r.screen_until(&id, "the program to start", |s| {
        s.lines.iter().any(|l| l == "started")
    })
    .await?;
    let outcome =
        r.rt.kill_job_with_grace(&id, Signal::Term, Duration::from_millis(300))
            .await?;
    assert_eq!(outcome, KillOutcome::Signalled);
    let job = r.rt.job(&id).await?;
    assert_eq!(job.state, JobState::Killed, "{job:?}");
    let left = r
        .exec(
            // A zombie is not alive (an init that does not reap may keep it).
            "for p in $(cat pty-kill.pids); do read -r st 2>/dev/null < /proc/$p/stat || continue; \
             st=${st##*) }; [ \"${st%% *}\" = Z ] || echo alive $p; done; echo checked",
        )
        .await?;
    assert_eq!(left, "checked\n", "the program outlived its job's kill");
    r.finish().await
}

/// SIGINT reaches a job as it would a program in a terminal: the job's trap
/// runs (a job started in the background must not inherit SIGINT ignored).
pub async fn an_interrupt_reaches_a_job_that_handles_it(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-int").await?;
    let id = r
        // Armed once the sleep has become `sleep`: a child not yet past
        // setting its INT to ignored (as bash does for `&`) dies of the INT.
        .start("trap 'echo got-int; kill $!; exit 7' INT; sleep 300 & until [ \"$(cat /proc/$!/comm 2>/dev/null)\" = sleep ]; do :; done; echo armed; wait")
        .await?;
    r.until("the trap to be armed", || async {
        Ok(r.logs(&id).await?.contains("armed"))
    })
    .await?;
    let outcome =
        r.rt.kill_job_with_grace(&id, Signal::Int, Duration::from_secs(20))
            .await?;
    assert_eq!(outcome, KillOutcome::Signalled);
    let job = r.rt.job(&id).await?;
    assert_eq!(job.exit_code, Some(7), "{job:?}");
    assert_eq!(job.kill_signal.as_deref(), Some("INT"), "{job:?}");
    assert_eq!(r.logs(&id).await?, "armed\ngot-int\n");
    r.finish().await
}

/// `exec` in a named session of `rt`'s sandbox, returning the output; fails
/// unless the command exits 0.
async fn in_session(rt: &Runtime, r: &Rig, session: &str, cmd: &str) -> Result<String, BoxError> {
    let rep = rt
        .exec(ExecRequest {
            backend: r.kind,
            sandbox: r.sandbox.clone(),
            session: Some(session.into()),
            command: cmd.into(),
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        })
        .await?;
    let out = rep.result.output.text();
    assert_eq!(rep.result.exit_code, 0, "`{cmd}` in {session}: {out}");
    Ok(out)
}

/// Two shells in one sandbox: each keeps its own cwd, environment and
/// functions, they share the sandbox's files, one does not wait for the
/// other, and both come back after berth restarts.
pub async fn named_sessions_keep_their_own_state_and_survive_a_restart(h: &Harness) -> TestResult {
    let r = Rig::new(h, "sessions").await?;
    in_session(
        &r.rt,
        &r,
        "main",
        "mkdir -p sess-srv sess-tst && cd sess-srv && export WHO=server",
    )
    .await?;
    in_session(
        &r.rt,
        &r,
        "tests",
        "cd sess-tst && export WHO=tests; f() { echo fn-tests; }",
    )
    .await?;
    let probe = "echo \"$WHO ${PWD##*/} $(type -t f || echo nofn)\"";
    assert_eq!(
        in_session(&r.rt, &r, "main", probe).await?,
        "server sess-srv nofn\n"
    );
    assert_eq!(
        in_session(&r.rt, &r, "tests", probe).await?,
        "tests sess-tst function\n"
    );
    // One sandbox: the files are shared.
    in_session(&r.rt, &r, "main", "echo shared > ../sess-note").await?;
    assert_eq!(
        in_session(&r.rt, &r, "tests", "cat ../sess-note").await?,
        "shared\n"
    );
    // A command held up in main does not hold up tests: tests itself releases it.
    in_session(&r.rt, &r, "tests", "mkfifo ../sess-gate").await?;
    let held = in_session(&r.rt, &r, "main", "cat ../sess-gate");
    let release = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !r.rt.is_busy(r.kind, &r.sandbox, "main").await {
            if Instant::now() > deadline {
                return Err::<String, BoxError>("main never started its command".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        in_session(&r.rt, &r, "tests", "echo go > ../sess-gate; echo released").await
    };
    let (held, released) = tokio::join!(held, release);
    assert_eq!(released?, "released\n");
    assert_eq!(held?, "go\n");
    // A job started from a session has that session's cwd and environment.
    let opts = JobOptions {
        session: Some("tests".into()),
        ..JobOptions::default()
    };
    let job =
        r.rt.start_job_with(r.kind, &r.sandbox, "echo \"$WHO ${PWD##*/}\"", opts)
            .await?;
    r.rt.wait_job(&job.id, WAIT).await?;
    assert_eq!(r.logs(&job.id).await?, "tests sess-tst\n");
    // berth again: each session is restored from its own snapshot.
    let again = r.restart(h)?;
    assert_eq!(
        in_session(&again, &r, "tests", probe).await?,
        "tests sess-tst function\n"
    );
    assert_eq!(
        in_session(&again, &r, "main", probe).await?,
        "server sess-srv nofn\n"
    );
    again.shutdown().await;
    // A name that is not one is refused before anything runs.
    let err =
        r.rt.exec(ExecRequest {
            backend: r.kind,
            sandbox: r.sandbox.clone(),
            session: Some("../main".into()),
            command: "true".into(),
            ..Default::default()
        })
        .await
        .err()
        .ok_or("a session named ../main ran")?;
    assert!(err.to_string().contains("session name"), "{err}");
    r.finish().await
}

/// Whether this user can make a mount namespace, as the local sandbox does
/// for its own terminals (`unshare -m` as root; with a user namespace as an
/// ordinary user).
fn mount_namespaces_here() -> bool {
    let ok = |args: &[&str]| {
        std::process::Command::new("unshare")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    ok(&["-m", "true"]) || ok(&["-r", "-m", "true"])
}

/// The log cap of [`a_flooding_job_keeps_at_most_twice_its_log_cap`].
const LOG_CAP: u64 = 64 * 1024;

/// A job that prints as fast as it can for seconds (4.8 GB in 4 s, uncapped)
/// keeps at most twice `job_log_cap_bytes` on disk: the first cap bytes and
/// the newest ones. It runs on to its end, and its log says what was dropped
/// and ends with what it printed last.
pub async fn a_flooding_job_keeps_at_most_twice_its_log_cap(h: &Harness) -> TestResult {
    let mut r = Rig::new(h, "job-logcap").await?;
    let policy = berth_policies::Policy::from_toml(
        &format!("[limits]\njob_log_cap_bytes = {LOG_CAP}\n"),
        "test",
    )?;
    let gate = Arc::new(berth_core::gate::Gate::new(policy, None, Vec::new()));
    r.rt = runtime(h, r.state.path())?.with_gate(gate);
    let id = r
        .start("echo FIRST-LINE; timeout 3 yes flood-flood-flood; echo LAST-LINE")
        .await?;
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!(job.state, JobState::Exited, "{job:?}");
    assert_eq!(job.exit_code, Some(0), "the job ran on to its end: {job:?}");
    let sb = r.rt.attach(r.kind, &r.sandbox).await?;
    let dir = job.dir(sb.as_ref());
    let sizes = r
        .exec(&format!(
            "cd {dir} && cat out tail.1 tail 2>/dev/null | wc -c && cat dropped"
        ))
        .await?;
    let mut nums = sizes.split_whitespace().map(|w| w.parse::<u64>());
    let (kept, dropped) = match (nums.next(), nums.next()) {
        (Some(Ok(k)), Some(Ok(d))) => (k, d),
        _ => return Err(format!("sizes of the job's log files: {sizes:?}").into()),
    };
    assert!(
        kept <= 2 * LOG_CAP,
        "{kept} bytes of log on disk, cap {LOG_CAP}"
    );
    assert!(
        dropped > 4 * LOG_CAP,
        "the job printed far more than the cap, yet only {dropped} bytes were dropped"
    );
    let mut buf = Vec::new();
    let mut sink = |b: &[u8]| buf.extend_from_slice(b);
    let end = r.rt.job_logs(&id, 0, false, &mut sink).await?;
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.starts_with("FIRST-LINE\nflood-flood-flood\n"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(
        text.contains(&format!(
            "[berth: {dropped} bytes of this job's output were dropped here"
        )),
        "the log says nothing of the dropped output"
    );
    // `timeout` may stop `yes` in the middle of a line.
    let last = &text[text.len().saturating_sub(200)..];
    assert!(
        last.ends_with("\nLAST-LINE\n") && last.contains("flood-flood-flood\n"),
        "{last}"
    );
    // Offsets count the dropped bytes: the end is where the job's output
    // ends, and a read from there has nothing more to give.
    assert_eq!(end, kept + dropped, "logical end of the log");
    let mut more = Vec::new();
    let mut sink = |b: &[u8]| more.extend_from_slice(b);
    let again = r.rt.job_logs(&id, end, false, &mut sink).await?;
    assert_eq!((again, more.len()), (end, 0));
    // A read from inside the newest part resumes there, with no notice.
    let mut last = Vec::new();
    let mut sink = |b: &[u8]| last.extend_from_slice(b);
    r.rt.job_logs(&id, end - 10, false, &mut sink).await?;
    assert_eq!(String::from_utf8_lossy(&last), "LAST-LINE\n");
    r.finish().await
}

/// Issue 50 item 11: a job's watch matches are recorded once, however many
/// refresh the job at once: a restarted server catching up, a `job wait`, an
/// `events --follow` (here, two runtimes on one store, as two processes).
pub async fn each_watch_match_is_recorded_once_however_many_refresh(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-watch-once").await?;
    // Three matches before the restart; three more only once both runtimes
    // (the old one and the restarted one) are refreshing the job, so that
    // both scan the same new output.
    let job =
        r.rt.start_job(
            r.kind,
            &r.sandbox,
            "for i in 1 2 3; do echo \"tick $i\"; done; read -r _; \
             for i in 4 5 6; do echo \"tick $i\"; done; sleep 60",
            None,
            vec!["^tick".into()],
        )
        .await?;
    r.until("the job's output", || async {
        Ok(r.logs(&job.id).await? == "tick 1\ntick 2\ntick 3\n")
    })
    .await?;
    let other = r.restart(h)?;
    let refresh = || async {
        let (a, b, c, d) = tokio::join!(
            r.rt.list_jobs(),
            other.list_jobs(),
            other.job(&job.id),
            r.rt.job(&job.id)
        );
        a?;
        b?;
        c?;
        d?;
        Ok::<_, BoxError>(())
    };
    refresh().await?;
    other.send_job(&job.id, b"go\n", false).await?;
    r.until("the output after the restart", || async {
        refresh().await?;
        Ok(r.logs(&job.id).await?.ends_with("tick 6\n"))
    })
    .await?;
    for _ in 0..3 {
        refresh().await?;
    }
    let lines: Vec<String> =
        r.rt.store()
            .events(0, 1000, Some("job.watch"))?
            .iter()
            .map(|e| {
                let d: serde_json::Value = e
                    .detail
                    .as_deref()
                    .and_then(|d| serde_json::from_str(d).ok())
                    .unwrap_or_default();
                d["detail"]["line"].as_str().unwrap_or_default().to_string()
            })
            .collect();
    assert_eq!(
        lines,
        ["tick 1", "tick 2", "tick 3", "tick 4", "tick 5", "tick 6"]
    );
    r.rt.kill_job(&job.id, Signal::Kill).await?;
    other.shutdown().await;
    r.finish().await
}

/// Issue 50 item 12: `Enter` on a job that reads a pipe, not a terminal, is
/// the newline a program reading a line waits for, not a terminal's `\r`.
pub async fn enter_on_a_job_without_a_terminal_is_a_newline(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-enter").await?;
    let id = r
        .start("IFS= read -r name; printf '%s' \"$name\" | od -An -c | tr -s ' '")
        .await?;
    r.rt.send_job(&id, b"alice", false).await?;
    r.rt.send_keys(&id, &["Enter"]).await?;
    let job = r.rt.wait_job(&id, Some(Duration::from_secs(20))).await?;
    assert_eq!(
        (job.state, job.exit_code),
        (JobState::Exited, Some(0)),
        "the job got no newline: {:?}",
        r.logs(&id).await?
    );
    assert_eq!(r.logs(&id).await?.trim(), "a l i c e");
    r.finish().await
}
