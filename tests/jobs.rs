//! The jobs suite: background jobs through the runtime, the same assertions for
//! every backend. A backend joins with one `jobs_suite!` line in `all.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::backend::{Backend, Signal};
use berth_core::jobs::{JobState, KillOutcome};
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
            case!(stdin_through_the_fifo_and_eof);
            case!(a_vanished_job_is_lost_not_exited);
            case!(watch_patterns_become_rate_limited_events);
            case!(wait_times_out_and_bad_ids_are_named);
        }
    };
}

/// Hands the harness's backend to a runtime.
struct One(Arc<dyn Backend>);

#[async_trait]
impl BackendSource for One {
    async fn open(&self, kind: &str) -> berth_core::Result<Arc<dyn Backend>> {
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
    kind: String,
    sandbox: String,
    state: tempfile::TempDir,
}

impl Rig {
    async fn new(h: &Harness, test: &str) -> Result<Rig, BoxError> {
        let state = tempfile::tempdir()?;
        let rt = runtime(h, state.path())?;
        let f = h.sandbox(test).await?;
        let kind = h.backend.kind().to_string();
        rt.create_sandbox(&kind, f.spec.clone()).await?;
        Ok(Rig {
            rt,
            kind,
            sandbox: f.spec.name.clone(),
            state,
        })
    }

    /// A second runtime on the same store: berth started again.
    fn restart(&self, h: &Harness) -> Result<Runtime, BoxError> {
        runtime(h, self.state.path())
    }

    async fn start(&self, cmd: &str) -> Result<String, BoxError> {
        Ok(self
            .rt
            .start_job(&self.kind, &self.sandbox, cmd, None, vec![])
            .await?
            .id)
    }

    async fn exec(&self, cmd: &str) -> Result<String, BoxError> {
        let r = self
            .rt
            .exec(ExecRequest {
                backend: self.kind.clone(),
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

    async fn finish(self) -> TestResult {
        self.rt.shutdown().await;
        self.rt
            .remove_sandbox(&self.kind, &self.sandbox, true)
            .await?;
        Ok(())
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
    let id = r
        .start("for i in $(seq 1 30); do echo line $i; sleep 0.1; done")
        .await?;
    // berth goes away without any shutdown (as after kill -9), and starts again.
    let again = r.restart(h)?;
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
    let mut up = String::new();
    for _ in 0..100 {
        up = r.exec(&count).await?;
        if up.trim() == "3" {
            break;
        }
    }
    assert_eq!(up.trim(), "3");
    assert_eq!(
        r.rt.kill_job(&id, Signal::Term).await?,
        KillOutcome::Signalled
    );
    let job = r.rt.wait_job(&id, WAIT).await?;
    assert_eq!(job.state, JobState::Killed, "{job:?}");
    assert_eq!(job.exit_code, Some(143));
    assert_eq!(
        r.exec(&count).await?.trim(),
        "0",
        "a process of the job survived"
    );
    match r.rt.kill_job(&id, Signal::Kill).await? {
        KillOutcome::AlreadyEnded(JobState::Killed, Some(143)) => {}
        other => panic!("killing a finished job said {other:?}"),
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

pub async fn a_vanished_job_is_lost_not_exited(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-lost").await?;
    let id = r.start("sleep 300").await?;
    let job = r.rt.job(&id).await?;
    let pid = job.pid.ok_or("no pid")?;
    // Kill the job and its wrapper from outside, as an OOM killer or a reboot would.
    let dir = {
        let sb = r.rt.attach(&r.kind, &r.sandbox).await?;
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

pub async fn watch_patterns_become_rate_limited_events(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-watch").await?;
    let job =
        r.rt.start_job(
            &r.kind,
            &r.sandbox,
            "for i in $(seq 1 50); do echo \"ERROR $i\"; echo fine; done",
            Some("noisy".into()),
            vec!["^ERROR [0-9]+$".into()],
        )
        .await?;
    let done = r.rt.wait_job("noisy", WAIT).await?;
    assert_eq!(done.id, job.id);
    let events = r.rt.store().events(0, 1000, Some("job."))?;
    let matches: Vec<_> = events.iter().filter(|e| e.kind == "job.watch").collect();
    assert_eq!(matches.len(), 10);
    assert!(
        matches[0]
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("ERROR 1"))
    );
    let dropped = events
        .iter()
        .find(|e| e.kind == "job.watch.dropped")
        .ok_or("no dropped-matches event")?;
    assert!(
        dropped
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("\"dropped\":40")),
        "{dropped:?}"
    );
    assert!(events.iter().any(|e| e.kind == "job.exited"));
    r.finish().await
}

pub async fn wait_times_out_and_bad_ids_are_named(h: &Harness) -> TestResult {
    let r = Rig::new(h, "job-wait").await?;
    let id = r.start("sleep 30").await?;
    let job = r.rt.wait_job(&id, Some(Duration::from_millis(300))).await?;
    assert_eq!(job.state, JobState::Running);
    r.rt.kill_job(&id, Signal::Kill).await?;
    match r.rt.job("j-nope").await {
        Err(berth_core::Error::NotFound { what: "job", .. }) => {}
        other => panic!("unknown job id gave {:?}", other.map(|j| j.id)),
    }
    let bad =
        r.rt.start_job(&r.kind, &r.sandbox, "true", None, vec!["(unclosed".into()])
            .await;
    assert!(bad.is_err());
    r.finish().await
}
