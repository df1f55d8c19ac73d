//! Following jobs and events from the CLI, as a person does: through a
//! restart of the berth server (issue 50 item 10), with the job list's
//! filters and the log's flags (item 13), and into a pipe its reader closed
//! (item 14).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{BoxError, TestResult, text};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

/// A state dir whose server is stopped when the test ends.
struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Result<Dir, BoxError> {
        Ok(Dir {
            dir: tempfile::tempdir()?,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `berth ARGS` with `BERTH_SERVER=mode`.
    fn cmd(&self, mode: &str, args: &[&str]) -> Command {
        let mut c = Command::new(BERTH);
        c.args(args)
            .env("BERTH_STATE_DIR", self.path())
            .env("BERTH_POLICY", self.path().join("policy.toml"))
            .env("BERTH_SERVER", mode)
            .env_remove("BERTH_SERVER_IDLE")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> std::io::Result<Output> {
        self.cmd("auto", args).output()
    }

    fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
        let o = self.run(args)?;
        if o.status.code() != Some(0) {
            return Err(format!("berth {args:?}: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    fn status(&self) -> Result<Option<Value>, BoxError> {
        let o = self.run(&["server", "status", "--json"])?;
        let v: Value = serde_json::from_slice(&o.stdout)
            .map_err(|e| format!("status is not JSON ({e}): {}", text(&o)))?;
        Ok(if v["running"] == true { Some(v) } else { None })
    }

    fn pid(&self) -> Result<u32, BoxError> {
        let s = self.status()?.ok_or("no server runs")?;
        Ok(s["pid"].as_u64().ok_or("status without a pid")? as u32)
    }

    /// Wait until a server runs `n` calls.
    fn wait_active(&self, n: u64) -> TestResult {
        wait_for("the followers to be served", || {
            Ok(self
                .status()?
                .is_some_and(|s| s["active_calls"].as_u64() == Some(n)))
        })
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = self.run(&["server", "stop"]);
    }
}

/// Whether every thread of `pid` has exited (a zombie leader counts as gone).
fn gone(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with(['Z', 'X']))
        })
    })
}

/// Poll `cond` every 20 ms until it holds, failing after 60 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> Result<bool, BoxError>) -> TestResult {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!("gave up after 60s waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running berth whose stdout and stderr are collected as they come.
struct Live {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Live {
    fn spawn(mut c: Command) -> Result<Live, BoxError> {
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let collect = |r: Option<Box<dyn Read + Send>>| {
            let buf = Arc::new(Mutex::new(Vec::new()));
            if let Some(mut r) = r {
                let b = buf.clone();
                std::thread::spawn(move || {
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = r.read(&mut chunk) {
                        if n == 0 {
                            break;
                        }
                        if let Ok(mut b) = b.lock() {
                            b.extend_from_slice(&chunk[..n]);
                        }
                    }
                });
            }
            buf
        };
        let out = collect(child.stdout.take().map(|s| Box::new(s) as _));
        let err = collect(child.stderr.take().map(|s| Box::new(s) as _));
        Ok(Live { child, out, err })
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().map(|b| b.clone()).unwrap_or_default())
            .into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().map(|b| b.clone()).unwrap_or_default())
            .into_owned()
    }

    fn until_stdout(&self, what: &str, has: impl Fn(&str) -> bool) -> TestResult {
        wait_for(what, || Ok(has(&self.stdout()))).map_err(|e| {
            format!("{e}; stdout: {}\nstderr: {}", self.stdout(), self.stderr()).into()
        })
    }

    /// Its exit status, once it exits (60 s at most).
    fn exit(&mut self) -> Result<Option<i32>, BoxError> {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait()? {
                // The readers have the rest once the pipes close.
                std::thread::sleep(Duration::from_millis(100));
                return Ok(s.code());
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                return Err(format!(
                    "did not exit within 60s; stdout: {}\nstderr: {}",
                    self.stdout(),
                    self.stderr()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn interrupt(&self) {
        // SAFETY: SIGINT to the child this test started, as Ctrl-C would.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("line {i}\n")).collect()
}

/// Issue 50 item 10: `job logs --follow`, `job wait` and `events --follow`
/// carry on through a kill -9 of the server and through a clean stop: each
/// reconnects to the next server and resumes where it was, so the log is
/// whole and printed once, each event is printed once, and `job wait` exits
/// with the job's own status.
#[test]
fn followers_carry_on_through_a_server_killed_and_a_server_stopped() -> TestResult {
    let d = Dir::new()?;
    // Ten lines, then ten more for each line sent to its stdin.
    let script = "for i in $(seq 1 10); do echo line $i; done; read -r a; \
                  for i in $(seq 11 20); do echo line $i; done; read -r b; \
                  for i in $(seq 21 30); do echo line $i; done; exit 3";
    d.ok(&[
        "job",
        "start",
        "--name",
        "f",
        "--watch",
        "^line (5|15|25)$",
        "--",
        script,
    ])?;
    let logs = Live::spawn(d.cmd("auto", &["job", "logs", "--follow", "f"]))?;
    let mut wait = Live::spawn(d.cmd("auto", &["job", "wait", "f"]))?;
    let events = Live::spawn(d.cmd(
        "auto",
        &[
            "events", "--follow", "--json", "--kind", "job.", "-n", "1000",
        ],
    ))?;
    logs.until_stdout("the first ten lines", |s| s.contains("line 10\n"))?;
    d.wait_active(3)?;
    let first = d.pid()?;
    // SAFETY: SIGKILL to the server this test's calls started.
    assert_eq!(
        unsafe { libc::kill(first as libc::pid_t, libc::SIGKILL) },
        0
    );
    // The kill is delivered, not yet done: until the process is gone, its
    // socket may still take a connection and then reset it, which a call
    // rightly reports as lost mid-way. Wait for it to go: for every thread,
    // since a leader shows `Z` while its other threads still hold the socket.
    wait_for("the killed server to be gone", || Ok(gone(first)))?;
    // A new server (started by this call, or by a follower reconnecting).
    d.ok(&["job", "send", "f", "go\n"])?;
    logs.until_stdout("lines 11 to 20 after the kill", |s| s.contains("line 20\n"))?;
    d.wait_active(3)?;
    assert_ne!(d.pid()?, first, "a new server serves the followers");
    d.ok(&["server", "stop"])?;
    d.ok(&["job", "send", "f", "go\n"])?;
    let mut logs = logs;
    assert_eq!(logs.exit()?, Some(0), "logs: {}", logs.stderr());
    assert_eq!(logs.stdout(), lines(1, 30), "stderr: {}", logs.stderr());
    assert!(
        logs.stderr().contains("reconnecting"),
        "the follower says it reconnected: {}",
        logs.stderr()
    );
    assert_eq!(wait.exit()?, Some(3), "wait: {}", wait.stderr());
    events.until_stdout("the job's end", |s| s.contains("\"job.exited\""))?;
    let mut events = events;
    events.interrupt();
    events.exit()?;
    let mut ids = Vec::new();
    let mut matched = Vec::new();
    for l in events.stdout().lines() {
        let v: Value = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
        ids.push(v["id"].as_i64().ok_or("an event without an id")?);
        if v["kind"] == "job.watch" {
            let d: Value = serde_json::from_str(v["detail"].as_str().unwrap_or("{}"))?;
            matched.push(d["detail"]["line"].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(
        ids.windows(2).all(|p| p[0] < p[1]),
        "an event printed twice or out of order: {ids:?}\n{}",
        events.stdout()
    );
    assert_eq!(
        matched,
        ["line 5", "line 15", "line 25"],
        "{}",
        events.stdout()
    );
    // And the store holds each match once, whoever scanned.
    let o = d.ok(&["events", "--json", "--kind", "job.watch", "-n", "1000"])?;
    assert_eq!(o.lines().count(), 3, "{o}");
    Ok(())
}

/// Issue 50 item 13: `job ls` filters by backend, sandbox and state, `job
/// logs` takes `-b` as `job start` does, and `--tail N --follow` prints the
/// last lines then what follows; in-process and through the server alike.
#[test]
fn job_ls_filters_and_logs_take_the_flags_of_start() -> TestResult {
    let d = Dir::new()?;
    for mode in ["auto", "off"] {
        let run = |args: &[&str]| d.cmd(mode, args).output();
        let name = format!("t-{mode}");
        let o = run(&["sandbox", "create", "-b", "local", &name])?;
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", text(&o));
        let o = run(&[
            "job", "start", "-b", "local", "-s", &name, "--name", &name, "--", "seq 1 5",
        ])?;
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", text(&o));
        let o = run(&["job", "wait", &name])?;
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", text(&o));
        let o = run(&["job", "logs", "-b", "local", &name])?;
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "1\n2\n3\n4\n5\n",
            "{mode}: {}",
            text(&o)
        );
        let o = run(&["job", "logs", "-b", "docker", &name])?;
        assert_eq!(o.status.code(), Some(125), "{mode}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("local backend"),
            "{mode}: {}",
            text(&o)
        );
        let o = run(&["job", "logs", "--tail", "2", "--follow", &name])?;
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "4\n5\n",
            "{mode}: {}",
            text(&o)
        );
        let ls = |args: &[&str]| -> Result<Vec<String>, BoxError> {
            let mut all = vec!["job", "ls", "--json"];
            all.extend_from_slice(args);
            let o = run(&all)?;
            assert_eq!(o.status.code(), Some(0), "{mode} {args:?}: {}", text(&o));
            let v: Value = serde_json::from_slice(&o.stdout)?;
            Ok(v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|j| j["name"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default())
        };
        assert!(ls(&["-b", "local", "-s", &name, "--state", "exited"])? == [name.clone()]);
        assert!(ls(&["-s", &name, "--state", "running,lost"])?.is_empty());
        assert!(ls(&["-s", &name, "--state", "done"])? == [name.clone()]);
        assert!(ls(&["-b", "docker", "-s", &name])?.is_empty());
        let o = run(&["job", "ls", "--state", "sleeping"])?;
        assert_eq!(o.status.code(), Some(125), "{mode}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("running"),
            "{}",
            text(&o)
        );
    }
    // Prune forgets ended jobs, those of a removed sandbox too; running ones stay.
    d.ok(&[
        "job", "start", "-s", "t-auto", "--name", "runs", "--", "sleep 60",
    ])?;
    let v: Value = serde_json::from_str(&d.ok(&["job", "prune", "-s", "t-auto", "--json"])?)?;
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    let v: Value = serde_json::from_str(&d.ok(&["job", "ls", "-s", "t-auto", "--json"])?)?;
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["name"], "runs", "{v}");
    d.ok(&["job", "kill", "runs", "--signal", "kill"])?;
    d.ok(&["sandbox", "rm", "t-off"])?;
    d.ok(&["job", "prune", "-s", "t-off"])?;
    let v: Value = serde_json::from_str(&d.ok(&["job", "ls", "-s", "t-off", "--json"])?)?;
    assert_eq!(v.as_array().map(Vec::len), Some(0), "{v}");
    Ok(())
}

/// Issue 50 item 13: Ctrl-C on `job logs --follow` says the offset to resume
/// at, in-process and through the server.
#[test]
fn ctrl_c_on_a_follow_prints_the_offset_to_resume_at() -> TestResult {
    let d = Dir::new()?;
    for mode in ["auto", "off"] {
        let name = format!("c-{mode}");
        let o = d
            .cmd(
                mode,
                &[
                    "job",
                    "start",
                    "--name",
                    &name,
                    "--",
                    "echo hello; sleep 60",
                ],
            )
            .output()?;
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", text(&o));
        let mut f = Live::spawn(d.cmd(mode, &["job", "logs", "--follow", &name]))?;
        f.until_stdout("the job's first line", |s| s == "hello\n")?;
        f.interrupt();
        assert_eq!(f.exit()?, Some(130), "{mode}: {}", f.stderr());
        assert!(
            f.stderr().contains("resume with --offset 6"),
            "{mode}: {}",
            f.stderr()
        );
        d.cmd(mode, &["job", "kill", &name, "--signal", "kill"])
            .output()?;
    }
    Ok(())
}

/// Issue 50 item 14, issue 49 item 24: a closed stdout (`berth … | head -1`,
/// `| true`) is a quiet exit for every command, not a panic (exit 101 and a
/// backtrace): in-process, through the server and in the thin client; and
/// a follow into a closed pipe stops instead of following on.
#[test]
fn a_closed_stdout_is_a_quiet_exit_for_every_command() -> TestResult {
    let d = Dir::new()?;
    d.ok(&["exec", "--", "true"])?;
    d.ok(&[
        "job",
        "start",
        "--name",
        "long",
        "--",
        "seq 1 1000; sleep 120",
    ])?;
    let commands: &[&[&str]] = &[
        &["server", "status"],
        &["server", "status", "--json"],
        &["policy", "check", "--", "ls", "-la"],
        &["policy", "show"],
        &["job", "ls"],
        &["job", "ls", "--json"],
        &["events"],
        &["sandbox", "ls"],
        &["exec", "--json", "--", "echo hi"],
        &["job", "logs", "long"],
        &["job", "logs", "--follow", "long"],
        &["events", "--follow"],
        &["--help"],
    ];
    for mode in ["auto", "off"] {
        for args in commands {
            let (r, w) = std::io::pipe()?;
            // The reader is gone before berth writes a byte.
            drop(r);
            let mut c = d.cmd(mode, args);
            c.stdout(w).stderr(Stdio::piped());
            let child = c.spawn()?;
            drop(c);
            let mut child = Live {
                child,
                out: Default::default(),
                err: Default::default(),
            };
            let mut err = String::new();
            if let Some(mut e) = child.child.stderr.take() {
                // Bounded by the exit below: a follow that does not stop
                // keeps its stderr open, and the wait fails first.
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let mut s = String::new();
                    let _ = e.read_to_string(&mut s);
                    let _ = tx.send(s);
                });
                let code = child.exit().map_err(|e| format!("{mode} {args:?}: {e}"))?;
                err = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
                assert!(
                    code == Some(141) || code == Some(0),
                    "{mode} {args:?}: exit {code:?}, stderr: {err}"
                );
            }
            assert!(!err.contains("panicked"), "{mode} {args:?}: {err}");
            assert!(!err.contains("Broken pipe"), "{mode} {args:?}: {err}");
        }
    }
    d.ok(&["job", "kill", "long", "--signal", "kill"])?;
    Ok(())
}
