//! `berth serve` from the outside: the CLI as a thin client of a server it
//! starts itself, and the server's faults.
//!
//! Every test has its own state dir and stops its server at the end (`Served`'s
//! `Drop`); a server also exits by itself once its socket is gone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{BoxError, TestResult, text};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

/// A state dir whose server is stopped when the test ends, pass or fail.
struct Served {
    dir: tempfile::TempDir,
}

impl Served {
    fn new() -> Result<Served, BoxError> {
        Ok(Served {
            dir: tempfile::tempdir()?,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BERTH);
        c.args(args)
            .env("BERTH_STATE_DIR", self.path())
            .env("BERTH_POLICY", self.path().join("policy.toml"))
            .env("BERTH_SERVER", "auto")
            .env_remove("BERTH_SERVER_IDLE")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> std::io::Result<Output> {
        self.cmd(args).output()
    }

    /// `berth exec -- COMMAND`, which must succeed; its stdout.
    fn exec(&self, command: &str) -> Result<String, BoxError> {
        self.exec_in("default", command)
    }

    fn exec_in(&self, sandbox: &str, command: &str) -> Result<String, BoxError> {
        let o = self.run(&["exec", "--sandbox", sandbox, "--", command])?;
        if o.status.code() != Some(0) {
            return Err(format!("`{command}` failed: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// `berth server status --json`, or `None` when no server runs.
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

    /// Wait until the server runs `n` calls.
    fn wait_active(&self, n: u64) -> TestResult {
        wait_for(Duration::from_secs(20), || {
            Ok(self
                .status()?
                .is_some_and(|s| s["active_calls"].as_u64() == Some(n)))
        })
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.run(&["server", "stop"]);
    }
}

/// Poll `cond` until it holds, failing after `limit`.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> Result<bool, BoxError>) -> TestResult {
    let end = Instant::now() + limit;
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!("condition not met within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait for a child to exit, killing it if it does not within `limit`.
fn wait_child(child: &mut Child, limit: Duration) -> Result<Output, BoxError> {
    let end = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() >= end {
            let _ = child.kill();
            return Err(format!("process did not exit within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = Vec::new();
    let mut err = Vec::new();
    if let Some(mut s) = child.stdout.take() {
        std::io::Read::read_to_end(&mut s, &mut out)?;
    }
    if let Some(mut s) = child.stderr.take() {
        std::io::Read::read_to_end(&mut s, &mut err)?;
    }
    Ok(Output {
        status: child.wait()?,
        stdout: out,
        stderr: err,
    })
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[test]
fn what_a_terminal_keeps_survives_between_calls() -> TestResult {
    let s = Served::new()?;
    s.exec("x=42; umask 027; set -o noglob; shopt -s extglob; sleep 60 & child=$!")?;
    let pid = s.pid()?;
    let out = s.exec(
        "echo $x; umask; [[ -o noglob ]] && echo noglob; shopt -q extglob && echo extglob; \
         kill -0 $child && echo child; kill $child",
    )?;
    assert_eq!(out, "42\n0027\nnoglob\nextglob\nchild\n");
    assert_eq!(s.pid()?, pid, "both calls reached one server");
    Ok(())
}

#[test]
fn six_concurrent_exports_on_one_sandbox_all_survive() -> TestResult {
    let s = Served::new()?;
    s.exec("true")?;
    let children: Vec<Child> = (0..6)
        .map(|i| {
            s.cmd(&["exec", "--", &format!("export C{i}=v{i}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut c in children {
        let o = wait_child(&mut c, Duration::from_secs(60))?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let out = s.exec("env | grep '^C[0-9]=' | sort")?;
    assert_eq!(out, "C0=v0\nC1=v1\nC2=v2\nC3=v3\nC4=v4\nC5=v5\n");
    Ok(())
}

#[test]
fn commands_on_two_sandboxes_run_at_once() -> TestResult {
    let s = Served::new()?;
    for name in ["one", "two"] {
        let o = s.run(&["sandbox", "create", name])?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        s.exec_in(name, "true")?;
    }
    let start = Instant::now();
    let children: Vec<Child> = ["one", "two"]
        .iter()
        .map(|name| {
            s.cmd(&["exec", "--sandbox", name, "--", "sleep 1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut c in children {
        let o = wait_child(&mut c, Duration::from_secs(30))?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    // A concurrency check, not a speed one: in sequence they take 2 s.
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(1800),
        "two 1 s sleeps took {took:?}"
    );
    Ok(())
}

/// Issue 36: another process holding the store's write lock stalls only the
/// calls that must write, never the server: a running command's output keeps
/// streaming and `server status` answers while a new call waits for the lock,
/// and that call goes through once the lock is let go. (On a server whose one
/// thread slept in SQLite's busy handler, nothing would move until the
/// waiting call gave up, and it would fail.)
#[test]
fn a_held_write_lock_stalls_only_the_calls_that_must_write() -> TestResult {
    use std::io::{BufRead, BufReader};
    let s = Served::new()?;
    for name in ["one", "two"] {
        let o = s.run(&["sandbox", "create", name])?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        s.exec_in(name, "true")?;
    }
    // A command that streams, started before the lock is taken.
    let mut streaming = s
        .cmd(&[
            "exec",
            "--sandbox",
            "one",
            "--",
            "for i in $(seq 1 150); do echo tick $i; sleep 0.1; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let out = streaming.stdout.take().ok_or("no stdout")?;
        let ticks = ticks.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("tick ") {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let seen = || ticks.load(std::sync::atomic::Ordering::SeqCst);
    wait_for(Duration::from_secs(20), || Ok(seen() > 0))?;
    // Another process takes the write lock and holds it until its stdin closes.
    let db = s.path().join("berth.db");
    let mut holder = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n\
             c.execute('BEGIN IMMEDIATE')\n\
             print('held', flush=True)\n\
             sys.stdin.read()\n",
        ])
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(holder.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    assert_eq!(line.trim(), "held", "python3 could not take the lock");
    // A call that must write (its start goes to the event log) now waits.
    let mut waiting = s
        .cmd(&["exec", "--sandbox", "two", "--", "echo through"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    s.wait_active(2)?;
    // Meanwhile the rest goes on: output streams, status answers.
    let before = seen();
    wait_for(Duration::from_secs(8), || Ok(seen() >= before + 5)).map_err(|_| {
        format!(
            "the streaming command's output stopped while the lock was held ({} ticks)",
            seen()
        )
    })?;
    let status = s
        .status()?
        .ok_or("no server answered while the lock was held")?;
    assert_eq!(status["active_calls"], 2, "{status}");
    assert!(
        waiting.try_wait()?.is_none(),
        "the call that needs the lock ended while it was held"
    );
    // Let go: the waiting call goes through.
    drop(holder.stdin.take());
    holder.wait()?;
    let o = wait_child(&mut waiting, Duration::from_secs(30))?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "through\n");
    let o = wait_child(&mut streaming, Duration::from_secs(60))?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    reader.join().map_err(|_| "the reader panicked")?;
    assert_eq!(seen(), 150);
    Ok(())
}

/// SIGTERM stops the server as `berth server stop` does: the running command
/// ends and is reported, the server exits, and the next call's new server
/// has the session's state.
#[test]
fn sigterm_lets_running_calls_end_and_loses_nothing() -> TestResult {
    let s = Served::new()?;
    s.exec("export K=kept")?;
    let old = s.pid()?;
    let mut client = s
        .cmd(&["exec", "--", "sleep 1; echo finished"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    s.wait_active(1)?;
    // SAFETY: sending SIGTERM to the server this test started.
    assert_eq!(unsafe { libc::kill(old as libc::pid_t, libc::SIGTERM) }, 0);
    let o = wait_child(&mut client, Duration::from_secs(30))?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "finished\n");
    wait_for(Duration::from_secs(20), || Ok(!alive(old)))?;
    assert_eq!(s.exec("echo $K")?, "kept\n");
    assert_ne!(s.pid()?, old);
    Ok(())
}

#[test]
fn a_server_killed_mid_command_is_reported_lost_and_replaced() -> TestResult {
    let s = Served::new()?;
    s.exec("export K=kept")?;
    let old = s.pid()?;
    let mut client = s
        .cmd(&["exec", "--", "sleep 5; echo finished"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    s.wait_active(1)?;
    // SAFETY: sending SIGKILL to the server this test started.
    assert_eq!(unsafe { libc::kill(old as libc::pid_t, libc::SIGKILL) }, 0);
    let o = wait_child(&mut client, Duration::from_secs(20))?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("outcome is unknown"),
        "{}",
        text(&o)
    );
    // The next call starts a new server, which restores the session.
    assert_eq!(s.exec("echo $K")?, "kept\n");
    assert_ne!(s.pid()?, old);
    Ok(())
}

#[test]
fn ctrl_c_in_the_client_interrupts_the_command_and_the_session_lives() -> TestResult {
    let s = Served::new()?;
    s.exec("v=still-here")?;
    let pid = s.pid()?;
    let mut client = s
        .cmd(&["exec", "--", "sleep 30; echo finished"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    s.wait_active(1)?;
    // SAFETY: SIGINT to the client this test started, as Ctrl-C would send.
    assert_eq!(
        unsafe { libc::kill(client.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let o = wait_child(&mut client, Duration::from_secs(20))?;
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert_eq!(s.exec("echo $v")?, "still-here\n");
    assert_eq!(s.pid()?, pid);
    Ok(())
}

/// Over both framings: the quick one (the CLI's) and gRPC (a server
/// without the quick framing, as `berth mcp --server` and older servers
/// speak), where the call's own task watches for its client to go.
#[test]
fn a_client_killed_mid_command_interrupts_it() -> TestResult {
    let s = Served::new()?;
    s.exec("true")?;
    kill_a_client_mid_command(&s)?;
    s.run(&["server", "stop"])?;
    let mut grpc = s
        .cmd(&["serve", "--idle", "60", "--no-quick"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_for(Duration::from_secs(20), || Ok(s.status()?.is_some()))?;
    kill_a_client_mid_command(&s)?;
    let st = s.status()?.ok_or("no server")?;
    assert_eq!(st["quick_calls"].as_u64(), Some(0), "{st}");
    s.run(&["server", "stop"])?;
    wait_child(&mut grpc, Duration::from_secs(20))?;
    Ok(())
}

fn kill_a_client_mid_command(s: &Served) -> TestResult {
    let mut client = s
        .cmd(&["exec", "--", "sleep 60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    s.wait_active(1)?;
    client.kill()?;
    client.wait()?;
    // Interrupted, not left to sleep its minute.
    s.wait_active(0)?;
    assert_eq!(s.exec("echo ok")?, "ok\n");
    Ok(())
}

#[test]
fn a_stale_socket_is_replaced() -> TestResult {
    let s = Served::new()?;
    let sock = s.path().join("server.sock");
    // A socket file nobody listens on, as a dead server leaves it.
    drop(std::os::unix::net::UnixListener::bind(&sock)?);
    assert!(sock.exists());
    assert_eq!(s.exec("echo hi")?, "hi\n");
    assert!(s.status()?.is_some());
    Ok(())
}

/// A call made the moment the server is killed (SIGKILL), while the dying
/// process still holds its socket: the kernel takes the connection and then
/// resets it. The client sees the server exiting, and the call goes to a
/// new one; it never fails with a broken handshake. Ten kills, each
/// followed at once by a `sandbox ls` and a `server status`.
#[test]
fn a_call_as_the_server_is_killed_goes_to_a_new_one() -> TestResult {
    let s = Served::new()?;
    for round in 0..10 {
        let ls = s.run(&["sandbox", "ls"])?;
        assert_eq!(ls.status.code(), Some(0), "round {round}: {}", text(&ls));
        let pid = s.pid()?;
        // SAFETY: SIGKILL to the server this test started.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
        let which = if round % 2 == 0 {
            ["sandbox", "ls"].as_slice()
        } else {
            ["server", "status", "--json"].as_slice()
        };
        let o = s.run(which)?;
        assert!(
            matches!(o.status.code(), Some(0) | Some(3)),
            "round {round}: {which:?}: {}",
            text(&o)
        );
        assert!(
            !text(&o).contains("handshake"),
            "round {round}: {}",
            text(&o)
        );
    }
    Ok(())
}

#[test]
fn a_server_of_another_version_is_replaced() -> TestResult {
    let s = Served::new()?;
    let mut old = s
        .cmd(&["serve", "--idle", "60", "--pretend-version", "0.0.0-old"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_for(Duration::from_secs(20), || Ok(s.status()?.is_some()))?;
    assert_eq!(s.status()?.ok_or("no server")?["version"], "0.0.0-old");
    assert_eq!(s.exec("echo hi")?, "hi\n");
    let now = s.status()?.ok_or("no server after the call")?;
    assert_eq!(now["version"], env!("CARGO_PKG_VERSION"));
    assert_ne!(now["pid"].as_u64(), Some(u64::from(old.id())));
    // The old server stopped cleanly.
    let o = wait_child(&mut old, Duration::from_secs(20))?;
    assert_eq!(o.status.code(), Some(0));
    Ok(())
}

#[test]
fn the_socket_refuses_another_uid() -> TestResult {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("this test switches to uid 65534 with setpriv and must run as root".into());
    }
    use std::os::unix::fs::PermissionsExt;
    let s = Served::new()?;
    s.exec("true")?;
    let sock: PathBuf = s.path().join("server.sock");
    let mode = std::fs::metadata(&sock)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let as_nobody = || {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BERTH])
            .args(["server", "status"])
            .env("BERTH_STATE_DIR", s.path())
            .env("BERTH_SERVER", "require")
            .stdin(Stdio::null());
        c
    };
    std::fs::set_permissions(s.path(), std::fs::Permissions::from_mode(0o711))?;
    // The socket's mode keeps another user out...
    let o = as_nobody().output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        text(&o)
    );
    // ...and so does the server's own check of the peer's uid.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))?;
    let o = as_nobody().output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("uid 65534 may not use it"),
        "{}",
        text(&o)
    );
    // A call that carries its identity (`berth exec`, the thin client's
    // one round trip) meets the same check.
    // (`server status` above is the engine's; this is the thin client's.)
    let mut c = Command::new("setpriv");
    let o = c
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BERTH])
        .args(["exec", "--", "id -u"])
        .env("BERTH_STATE_DIR", s.path())
        .env("BERTH_SERVER", "require")
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("uid 65534 may not use it"),
        "{}",
        text(&o)
    );
    assert!(o.stdout.is_empty(), "{}", text(&o));
    // The owner still can.
    assert_eq!(s.exec("echo mine")?, "mine\n");
    Ok(())
}

#[test]
fn an_idle_server_exits_and_stop_stops_one() -> TestResult {
    let s = Served::new()?;
    let o = s
        .cmd(&["exec", "--", "true"])
        .env("BERTH_SERVER_IDLE", "1")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let pid = s.pid()?;
    wait_for(Duration::from_secs(20), || Ok(!alive(pid)))?;
    assert!(s.status()?.is_none());
    assert!(!s.path().join("server.sock").exists());
    s.exec("true")?;
    let pid = s.pid()?;
    let o = s.run(&["server", "stop"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!alive(pid));
    let o = s.run(&["server", "status"])?;
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    Ok(())
}

/// A job's end is recorded with no one asking: the server keeps a waiter on
/// every unfinished job, whoever started it, and stays up while it has one.
#[test]
fn the_server_records_a_job_end_with_no_one_asking() -> TestResult {
    let s = Served::new()?;
    s.exec("true")?;
    let o = s
        .cmd(&["job", "start", "--name", "quiet", "--", "sleep 1; exit 4"])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    wait_for(Duration::from_secs(20), || {
        Ok(s.status()?.is_some_and(|v| v["watched_jobs"] == 1))
    })?;
    // From here on only the event log is read: nothing asks about the job.
    wait_for(Duration::from_secs(30), || {
        let o = s.run(&["events", "--kind", "job.", "--json", "-n", "10"])?;
        Ok(String::from_utf8_lossy(&o.stdout).contains("\"exit_code\":4"))
    })?;
    let v = s.status()?.ok_or("the server stopped")?;
    assert_eq!(v["watched_jobs"], 0, "{v}");
    Ok(())
}

#[test]
fn berth_server_off_runs_in_process() -> TestResult {
    let s = Served::new()?;
    let o = s
        .cmd(&["exec", "--", "export A=1"])
        .env("BERTH_SERVER", "off")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(s.status()?.is_none(), "no server was started");
    let o = s
        .cmd(&["exec", "--", "echo $A"])
        .env("BERTH_SERVER", "require")
        .output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    // The snapshot carries the export into the server's session.
    assert_eq!(s.exec("echo $A")?, "1\n");
    Ok(())
}

/// `berth shell` runs in-process beside a server that holds a warm shell of
/// the same sandbox: what either side exports, the other sees.
#[test]
fn berth_shell_and_exec_through_the_server_see_each_others_state() -> TestResult {
    let s = Served::new()?;
    s.exec("export FROM_EXEC=1")?;
    assert!(s.status()?.is_some(), "exec started no server");
    let mut shell = s
        .cmd(&["shell"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut stdin = shell.stdin.take().ok_or("no stdin")?;
        stdin.write_all(b"echo seen=$FROM_EXEC\nexport FROM_SHELL=2; cd /tmp\n")?;
    }
    let o = wait_child(&mut shell, Duration::from_secs(60))?;
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("seen=1"),
        "{}",
        text(&o)
    );
    assert_eq!(s.exec("echo $FROM_EXEC $FROM_SHELL; pwd")?, "1 2\n/tmp\n");
    Ok(())
}

/// `job`, `sandbox`, `events`, approvals and `exec --background` run in the
/// server, on its warm runtime, and print what they print in-process: as
/// clients of the typed API (`berth.v1`), one call each.
#[test]
fn job_sandbox_events_and_approvals_calls_run_in_the_server() -> TestResult {
    let s = Served::new()?;
    s.exec("true")?;
    let count = |what: &str| -> Result<u64, BoxError> {
        Ok(s.status()?.ok_or("no server")?[what]
            .as_u64()
            .ok_or_else(|| format!("status without {what}"))?)
    };
    let api_before = count("api_calls")?;
    let ok = |args: &[&str]| -> Result<String, BoxError> {
        let o = s.run(args)?;
        if o.status.code() != Some(0) {
            return Err(format!("{args:?}: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let id = ok(&["job", "start", "--name", "j", "--", "echo from-job"])?;
    assert!(id.trim().starts_with('j'), "{id}");
    let o = s.run(&["job", "wait", "j", "--json"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["state"], "exited", "{v}");
    assert_eq!(ok(&["job", "logs", "j"])?, "from-job\n");
    assert!(ok(&["job", "ls"])?.contains("from-job"));
    let bg = ok(&["exec", "--background", "--", "true"])?;
    assert!(bg.trim().starts_with('j'), "{bg}");
    assert!(ok(&["events", "--kind", "job.", "-n", "5"])?.contains("job.started"));
    assert_eq!(ok(&["approvals", "ls"])?, "no pending approvals\n");
    // An error comes back as berth's error, with its exit status.
    let o = s.run(&["job", "logs", "no-such-job"])?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("job `no-such-job` not found"),
        "{}",
        text(&o)
    );
    assert!(ok(&["sandbox", "ls"])?.contains("default"));
    // Eleven: `job start` and `exec --background` are two each (each
    // follows the event log for an approval notice while Jobs.Start runs),
    // every other command one.
    assert_eq!(
        count("api_calls")? - api_before,
        11,
        "each typed call went to the server"
    );
    // Nothing else answers them: the server's Run is gone.
    assert!(
        s.status()?
            .ok_or("no server")?
            .get("served_calls")
            .is_none()
    );
    Ok(())
}

/// Ctrl-C ends a `job logs --follow` that runs in the server; the job runs on.
#[test]
fn ctrl_c_ends_a_follow_in_the_server_and_the_job_runs_on() -> TestResult {
    let s = Served::new()?;
    let o = s
        .cmd(&[
            "job",
            "start",
            "--name",
            "long",
            "--",
            "echo started; sleep 60",
        ])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut follow = s
        .cmd(&["job", "logs", "--follow", "long"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // The follow is under way once the job's first line came through it.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(follow.stdout.take().ok_or("no stdout")?),
        &mut line,
    )?;
    assert_eq!(line, "started\n");
    s.wait_active(1)?;
    // SAFETY: SIGINT to the client this test started, as Ctrl-C would send.
    assert_eq!(
        unsafe { libc::kill(follow.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let o = wait_child(&mut follow, Duration::from_secs(20))?;
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    // The server dropped the follow; the job was not touched.
    s.wait_active(0)?;
    let o = s.run(&["job", "ls", "--json"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v[0]["state"], "running", "{v}");
    let o = s.run(&["job", "kill", "long", "--signal", "kill"])?;
    assert!(o.status.code().is_some(), "{}", text(&o));
    Ok(())
}

/// A client that reads more slowly than its command writes costs the server
/// a bounded queue, not memory without end: what did not fit is left out of
/// the live view, and the client is told exactly how much (the spool has it).
#[test]
fn a_slow_client_is_told_exactly_what_it_missed() -> TestResult {
    const TOTAL: usize = 40_000_000;
    let s = Served::new()?;
    s.exec("true")?;
    let client = s
        .cmd(&["exec", "--", &format!("head -c {TOTAL} /dev/zero")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read nothing while the command writes everything.
    std::thread::sleep(Duration::from_secs(3));
    let o = client.wait_with_output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let missed: usize = err
        .lines()
        .filter(|l| l.contains("bytes of output") && l.contains("left out"))
        .map(|l| {
            l.trim_start_matches("berth: ")
                .split(' ')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert!(missed > 0, "nothing was left out: {err}");
    assert_eq!(o.stdout.len() + missed, TOTAL, "{err}");
    Ok(())
}

/// `berth exec` connects to the server of the environment's state dir
/// before it parses its line; a `--state-dir` on the line still decides
/// which server runs the call, and the early connection, unused, leaves its
/// server as it was.
#[test]
fn exec_runs_on_the_state_dir_its_line_names_not_the_one_it_connected_to_first() -> TestResult {
    let first = Served::new()?;
    let other = Served::new()?;
    first.exec("export MARK=first")?;
    other.exec("export MARK=other")?;
    let o = first
        .cmd(&["exec", "--state-dir"])
        .arg(other.path())
        .args(["--", "echo ${MARK:-none}"])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "other\n",
        "{}",
        text(&o)
    );
    assert_eq!(first.exec("echo ${MARK:-none}")?, "first\n");
    // The first call started the server (over gRPC); the last was quick.
    // The early connection that went unused ran nothing.
    let s = first.status()?.ok_or("the first server stopped")?;
    assert_eq!(s["quick_calls"].as_u64(), Some(1), "{s}");
    Ok(())
}

/// build.rs links the thin client as a static PIE where glibc's static
/// archives are installed (libc6-dev ships them, and `.ci/run` installs it):
/// no dynamic loader runs at its start, and its address is still randomised.
#[test]
fn the_thin_client_is_a_static_pie() -> TestResult {
    let elf = std::fs::read(BERTH)?;
    let (kind, segments) = elf_kind_and_segments(&elf)?;
    const ET_DYN: u16 = 3;
    const PT_INTERP: u32 = 3;
    assert_eq!(kind, ET_DYN, "{BERTH} is not position-independent");
    assert!(
        !segments.contains(&PT_INTERP),
        "{BERTH} names a dynamic loader, so it linked dynamically: `cargo build -vv` shows \
         build.rs's warning saying why (is glibc's libc.a installed?)"
    );
    Ok(())
}

/// An ELF64 little-endian file's type and the types of its segments.
fn elf_kind_and_segments(elf: &[u8]) -> Result<(u16, Vec<u32>), BoxError> {
    let u16_at = |o: usize| -> Result<u16, BoxError> {
        Ok(u16::from_le_bytes(
            elf.get(o..o + 2).ok_or("short ELF")?.try_into()?,
        ))
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err("not an ELF64 little-endian file".into());
    }
    let phoff = u64::from_le_bytes(elf.get(0x20..0x28).ok_or("short ELF")?.try_into()?) as usize;
    let (size, count) = (u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    let mut segments = Vec::new();
    for i in 0..count {
        let at = phoff + i * size;
        let t = elf.get(at..at + 4).ok_or("short program header")?;
        segments.push(u32::from_le_bytes(t.try_into()?));
    }
    Ok((u16_at(0x10)?, segments))
}

/// The thin client's start is its own (`#![no_main]`), and does what std's
/// did for it: a closed standard descriptor is reopened on /dev/null, so the
/// server's socket never takes its number (the command's output would go
/// into the socket), and a reader that goes away ends the client with a
/// status, not SIGPIPE.
#[test]
fn the_thin_client_starts_as_std_would_with_closed_stdio_and_a_closed_pipe() -> TestResult {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let s = Served::new()?;
    s.exec("true")?;
    for fd in [0, 1, 2] {
        let mut c = s.cmd(&["exec", "--", "echo out; echo err >&2"]);
        // SAFETY: close(2) is async-signal-safe, and the child owns its table.
        unsafe {
            c.pre_exec(move || {
                libc::close(fd);
                Ok(())
            });
        }
        let o = c.output()?;
        assert_eq!(o.status.code(), Some(0), "fd {fd} closed: {}", text(&o));
        assert_eq!(s.exec("echo after")?, "after\n", "fd {fd} closed");
    }
    // More than a pipe holds, to a reader that leaves before reading any.
    let mut child = s
        .cmd(&["exec", "--", "seq 1 300000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(child.stdout.take());
    let o = child.wait_with_output()?;
    assert_eq!(o.status.signal(), None, "killed by a signal: {}", text(&o));
    assert_eq!(s.exec("echo after")?, "after\n");
    Ok(())
}

/// `berth` is a thin client: what it does not take as its own goes to
/// `berth-engine`, argv unchanged, and prints exactly as the engine prints it.
#[test]
fn the_thin_client_hands_the_rest_to_the_engine() -> TestResult {
    let s = Served::new()?;
    // A usage error in a served subcommand: the server's parser refuses the
    // line, and the engine prints clap's error with clap's status.
    let o = s.run(&["job", "frobnicate"])?;
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unrecognized subcommand 'frobnicate'"),
        "{}",
        text(&o)
    );
    // Help, the version, and commands that never go to the server.
    let o = s.run(&["job", "ls", "--help"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: berth job ls"));
    let o = s.run(&["--version"])?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("berth {}", env!("CARGO_PKG_VERSION"))
    );
    let o = s.run(&["policy", "check", "--", "rm -rf /"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("deny: "),
        "{}",
        text(&o)
    );
    // A global option after a served subcommand's name is the caller's: the
    // thin client's parse of the whole served line reads it, and it chooses
    // the server.
    let other = tempfile::tempdir()?;
    s.exec("true")?;
    let started = s
        .cmd(&["job", "start", "--name", "elsewhere", "--state-dir"])
        .arg(other.path())
        .args(["--", "sleep 0"])
        .output()?;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));
    let mine = s.run(&["job", "ls", "--json"])?;
    assert!(
        !String::from_utf8_lossy(&mine.stdout).contains("elsewhere"),
        "the job went to the default state dir: {}",
        text(&mine)
    );
    let theirs = s
        .cmd(&["job", "ls", "--json", "--state-dir"])
        .arg(other.path())
        .output()?;
    assert!(
        String::from_utf8_lossy(&theirs.stdout).contains("elsewhere"),
        "{}",
        text(&theirs)
    );
    let _ = s
        .cmd(&["server", "stop", "--state-dir"])
        .arg(other.path())
        .output();
    Ok(())
}

/// `--log`/`BERTH_LOG` reach the thin client's own diagnostics: how it found
/// or started the server. The default prints none of them.
#[test]
fn the_thin_client_prints_its_diagnostics_when_asked() -> TestResult {
    let s = Served::new()?;
    let o = s
        .cmd(&["exec", "--", "echo hi"])
        .env("BERTH_LOG", "berth_client=debug")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("berth: DEBUG berth_client::client: no berth server ran; started one"),
        "{err}"
    );
    // Only the target asked for: h2's own debug lines stay out.
    assert!(!err.contains("h2::"), "{err}");
    let o = s.cmd(&["--log", "debug", "exec", "--", "true"]).output()?;
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("berth: DEBUG berth_client::quick: connected to the berth server"),
        "{}",
        text(&o)
    );
    let o = s
        .cmd(&["exec", "--", "true"])
        .env_remove("BERTH_LOG")
        .output()?;
    assert_eq!(String::from_utf8_lossy(&o.stderr), "", "{}", text(&o));
    Ok(())
}

/// Nothing in a sandbox may call the server, where approvals are answered
/// (#32 item 3). A restricted local sandbox gets no unix socket at all
/// (tests/sandbox_escape.rs); here the sandbox runs unrestricted, so its
/// process can connect, and the server must drop it unheard. Control: the
/// same probe from outside any sandbox is served.
#[test]
fn the_server_drops_a_peer_from_inside_a_sandbox() -> TestResult {
    let s = Served::new()?;
    let sock = s.path().join("server.sock");
    let probe = format!(
        "python3 -c 'import socket, sys\nc = socket.socket(socket.AF_UNIX)\nc.settimeout(2)\nc.connect(sys.argv[1])\ntry:\n    print(\"CLOSED\" if c.recv(1) == b\"\" else \"SERVED\")\nexcept socket.timeout:\n    print(\"SERVED\")' {}",
        sock.display()
    );
    let o = s
        .cmd(&["exec", "--", &probe])
        .env("BERTH_UNRESTRICTED", "1")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        s.status()?.is_some(),
        "the exec did not go through a server"
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "CLOSED",
        "{}\nserver log: {}",
        text(&o),
        std::fs::read_to_string(s.path().join("server.log")).unwrap_or_default()
    );
    // Control: outside a sandbox, the same probe is served.
    let o = Command::new("bash").args(["-c", &probe]).output()?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "SERVED",
        "{}",
        text(&o)
    );
    Ok(())
}

/// `berth exec` to a running server takes the quick framing (no HTTP/2):
/// output, exit code, `--json`, `--stdin` and a timeout all come through it.
#[test]
fn a_served_exec_takes_the_quick_framing() -> TestResult {
    use std::io::Write;
    let s = Served::new()?;
    // No server yet: this call starts one, over gRPC.
    assert_eq!(s.exec("export Q=kept; echo one")?, "one\n");
    let quick = |s: &Served| -> Result<u64, BoxError> {
        let st = s.status()?.ok_or("no server")?;
        st["quick_calls"]
            .as_u64()
            .ok_or_else(|| format!("no quick_calls in {st}").into())
    };
    assert_eq!(quick(&s)?, 0);
    assert_eq!(s.exec("echo $Q")?, "kept\n");
    let o = s
        .cmd(&["exec", "--json", "--", "echo out; exit 3"])
        .output()?;
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(
        (v["exit_code"].as_i64(), v["output"].as_str()),
        (Some(3), Some("out\n"))
    );
    let mut fed = s
        .cmd(&["exec", "--stdin", "--", "tr a-z A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    fed.stdin.take().ok_or("no stdin")?.write_all(b"fed in\n")?;
    let o = wait_child(&mut fed, Duration::from_secs(20))?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "FED IN\n",
        "{}",
        text(&o)
    );
    let o = s
        .cmd(&["exec", "--timeout", "0.5", "--", "sleep 30"])
        .output()?;
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("timed out"),
        "{}",
        text(&o)
    );
    assert_eq!(quick(&s)?, 4);
    Ok(())
}

/// A server from before the quick framing closes a connection that opens with
/// it: the client makes the call over gRPC instead, once, on that server.
#[test]
fn an_exec_falls_back_to_grpc_on_a_server_without_the_quick_framing() -> TestResult {
    let s = Served::new()?;
    let mut old = s
        .cmd(&["serve", "--idle", "60", "--no-quick"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    wait_for(Duration::from_secs(20), || Ok(s.status()?.is_some()))?;
    let pid = s.pid()?;
    assert_eq!(s.exec("echo ran >> runs; wc -l < runs")?, "1\n");
    assert_eq!(s.exec("wc -l < runs")?, "1\n");
    let st = s.status()?.ok_or("no server")?;
    assert_eq!(st["pid"].as_u64(), Some(u64::from(pid)), "not replaced");
    assert_eq!(st["quick_calls"].as_u64(), Some(0), "{st}");
    s.run(&["server", "stop"])?;
    let o = wait_child(&mut old, Duration::from_secs(20))?;
    assert_eq!(o.status.code(), Some(0));
    Ok(())
}

/// The quick framing's faults, spoken raw: a wrong magic is closed unheard, a
/// malformed or oversized frame is answered with the magic and refused, a
/// client of another build is refused as `FAILED_PRECONDITION` (the CLI then
/// shakes hands over gRPC); none of it harms the server.
#[test]
fn the_quick_framing_refuses_what_it_cannot_run() -> TestResult {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let s = Served::new()?;
    s.exec("true")?;
    let pid = s.pid()?;
    let sock = s.path().join("server.sock");
    let exchange = |sent: &[u8]| -> Result<Vec<u8>, BoxError> {
        let mut c = UnixStream::connect(&sock)?;
        c.set_read_timeout(Some(Duration::from_secs(20)))?;
        c.write_all(sent)?;
        c.shutdown(std::net::Shutdown::Write)?;
        let mut got = Vec::new();
        match c.read_to_end(&mut got) {
            // Closed with bytes of ours unread: what came before is kept.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            r => {
                r?;
            }
        }
        Ok(got)
    };
    let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    const MAGIC: &[u8] = b"berthq1\n";

    assert_eq!(exchange(b"bogus!!!")?, b"");

    let got = exchange(&[MAGIC, b"\x00\x00\x00\x03\xff\xff\xff"].concat())?;
    assert!(got.starts_with(MAGIC), "{got:?}");
    assert!(
        has(&got, b"malformed quick call"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    // Over the frame limit: the magic, then the connection ends.
    assert_eq!(exchange(&[MAGIC, b"\xff\xff\xff\xff"].concat())?, MAGIC);

    // CheckedExec { client: { version: "0.0.0" }, call: { backend: "local",
    // sandbox: "default", command: "touch ran" } }, encoded by hand.
    let call = [
        &b"\x0a\x07\x0a\x050.0.0"[..],
        b"\x12\x1b\x0a\x05local\x12\x07default\x1a\x09touch ran",
    ]
    .concat();
    let framed = [MAGIC, &(call.len() as u32).to_be_bytes(), &call].concat();
    let got = exchange(&framed)?;
    assert!(got.starts_with(MAGIC), "{got:?}");
    // QuickReply { refused: { code: 9 (FAILED_PRECONDITION), .. } }
    let reply = &got[MAGIC.len() + 4..];
    assert_eq!((reply[0], reply[2], reply[3]), (0x12, 0x08, 9), "{got:?}");
    assert!(
        has(reply, b"it is berth"),
        "{}",
        String::from_utf8_lossy(reply)
    );
    // Refused, so never run.
    assert_eq!(s.exec("ls ran 2>/dev/null | wc -l")?, "0\n");
    assert_eq!(s.pid()?, pid);
    Ok(())
}

/// `--stdin` takes a large input over either framing (the first call starts
/// the server over gRPC, the next goes quick), and one past the limit is
/// refused by the client with what to do, before anything runs; the session
/// lives on.
#[test]
fn a_large_stdin_goes_through_and_one_past_the_limit_is_refused_with_what_to_do() -> TestResult {
    let s = Served::new()?;
    let feed = |command: &str, len: usize| -> Result<Output, BoxError> {
        use std::io::Write;
        let mut c = s
            .cmd(&["exec", "--stdin", "--", command])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut input = c.stdin.take().ok_or("no stdin")?;
        // The client stops reading past the limit: the rest meets a closed pipe.
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'x'; 1 << 20];
            let mut left = len;
            while left > 0 {
                let n = left.min(chunk.len());
                if input.write_all(&chunk[..n]).is_err() {
                    break;
                }
                left -= n;
            }
        });
        let o = wait_child(&mut c, Duration::from_secs(60))?;
        writer.join().map_err(|_| "the writer panicked")?;
        Ok(o)
    };
    for _ in 0..2 {
        let o = feed("wc -c", 5 << 20)?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "5242880");
    }
    let o = feed("export FED=1; wc -c", 33 << 20)?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--stdin carries at most 32 MiB") && err.contains("berth cp FILE :PATH"),
        "{err}"
    );
    assert!(!err.contains("lost the berth server"), "{err}");
    // Nothing of it ran, and the server and the session are as they were.
    assert_eq!(s.exec("echo ${FED:-none}")?, "none\n");
    Ok(())
}

/// Issue 51 item 5: the server's identity is berth's build, the policy and
/// the variables that change what berth does. A call from another `PATH`
/// and venv reuses the running server; one with another docker host, a
/// secret, or another value of a variable the policy passes into sandboxes
/// replaces it.
#[test]
fn a_call_from_another_path_or_venv_keeps_the_server_and_settings_replace_it() -> TestResult {
    let s = Served::new()?;
    std::fs::write(
        s.path().join("policy.toml"),
        "[env]\nallow = [\"MY_TOOL_*\"]\n",
    )?;
    s.exec("true")?;
    let first = s.pid()?;
    let path = std::env::var("PATH")?;
    let o = s
        .cmd(&["exec", "--", "true"])
        .env("PATH", format!("/tmp/berth-venv/bin:/opt/other/bin:{path}"))
        .env("VIRTUAL_ENV", "/tmp/berth-venv")
        .env("CONDA_DEFAULT_ENV", "base")
        .env("PS1", "(berth-venv) $ ")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(s.pid()?, first, "another PATH and venv replaced the server");
    for (k, v) in [
        ("DOCKER_HOST", "unix:///tmp/berth-other-docker.sock"),
        ("SOME_API_TOKEN", "0123456789abcdef0123"),
        ("MY_TOOL_MODE", "fast"),
    ] {
        let before = s.pid()?;
        let o = s.cmd(&["exec", "--", "true"]).env(k, v).output()?;
        assert_eq!(o.status.code(), Some(0), "{k}: {}", text(&o));
        let after = s.pid()?;
        assert_ne!(after, before, "another {k} kept the server");
    }
    Ok(())
}

/// The server's identity counts every variable the redactor treats as a
/// secret: the client's list holds each of the redactor's name parts.
#[test]
fn the_identity_counts_every_secret_the_redactor_masks() {
    for part in berth_policies::redact::SECRET_NAME_PARTS {
        assert!(
            berth_client::SECRET_PARTS.contains(part),
            "{part} marks a secret for the redactor but not for the server's identity"
        );
    }
}
