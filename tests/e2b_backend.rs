//! The e2b backend's own paths against the stand-in: faults (401, 429, 503, a
//! cut stream, a sandbox killed mid-command, deadlines), finding sandboxes
//! again by label, resuming a paused one, keep-alive, and the official Python
//! SDK run unchanged against the stand-in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_backends::e2b::{E2bBackend, E2bConfig, E2bSandbox};
use berth_core::backend::{Backend, Process, Sandbox, SandboxSpec};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use berth_standins::e2b::{E2bStandin, FaultPlan};

use crate::support::{BoxError, TestResult, e2b_standin};

fn backend_with(
    standin: &E2bStandin,
    f: impl Fn(&str) -> Option<String>,
) -> Result<E2bBackend, BoxError> {
    let vars = standin.env();
    let cfg = E2bConfig::from_lookup(|k| {
        f(k).or_else(|| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    });
    Ok(E2bBackend::new(cfg)?)
}

async fn session(sb: Arc<dyn Sandbox>, name: &str) -> Result<Session, BoxError> {
    let mut c = SessionConfig::named(name);
    c.grace = Duration::from_millis(300);
    Ok(Session::open(sb, c).await?)
}

/// A concrete handle, for the calls the trait does not have (deadlines).
async fn concrete(b: &E2bBackend, name: &str) -> Result<E2bSandbox, BoxError> {
    b.provision(&SandboxSpec::named(name)).await?;
    Ok(b.attach_by_name(name).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_key_names_e2b_api_key() -> TestResult {
    let (standin, _) = e2b_standin().await?;
    let wrong = backend_with(&standin, |k| {
        (k == "E2B_API_KEY").then(|| "e2b_wrong".into())
    })?;
    let e = wrong
        .provision(&SandboxSpec::named("k1"))
        .await
        .err()
        .ok_or("a wrong key was accepted")?;
    assert!(e.to_string().contains("E2B_API_KEY"), "{e}");
    assert!(e.to_string().contains("401"), "{e}");
    let none = backend_with(&standin, |k| (k == "E2B_API_KEY").then(String::new))?;
    let e = none.list().await.err().ok_or("no key was accepted")?;
    assert!(e.to_string().contains("E2B_API_KEY"), "{e}");
    // A 401 injected on an otherwise good key reads the same.
    let (standin, good) = e2b_standin().await?;
    standin.faults().set(FaultPlan {
        api_unauthorized: 1,
        ..Default::default()
    });
    let e = good
        .list()
        .await
        .err()
        .ok_or("the injected 401 was ignored")?;
    assert!(e.to_string().contains("E2B_API_KEY"), "{e}");
    assert!(standin.sandbox_ids().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_and_5xx_are_retried_then_succeed() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    standin.faults().set(FaultPlan {
        api_rate_limited: 2,
        api_unavailable: 1,
        ..Default::default()
    });
    let p = b.provision(&SandboxSpec::named("rl")).await?;
    assert!(p.created);
    // Retried creates carry one idempotency key: one sandbox, not several.
    assert_eq!(standin.sandbox_ids().len(), 1);
    let mut s = session(p.sandbox, "rl").await?;
    let r = s.exec("echo ok", ExecOpts::default()).await?;
    assert_eq!((r.exit_code, r.output.text()), (0, "ok\n".to_string()));
    s.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lasting_outage_fails_clearly_after_retries() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    standin.faults().set(FaultPlan {
        api_unavailable: 1000,
        ..Default::default()
    });
    let e = b
        .provision(&SandboxSpec::named("down"))
        .await
        .err()
        .ok_or("an outage looked like success")?;
    let msg = e.to_string();
    assert!(msg.contains("attempts") && msg.contains("503"), "{msg}");
    assert!(standin.sandbox_ids().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_output_loses_the_command_never_success() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    let p = b.provision(&SandboxSpec::named("cut")).await?;
    let mut s = session(p.sandbox.clone(), "cut").await?;
    s.exec("export KEEP=1", ExecOpts::default()).await?;
    // A plain variable lives in the shell alone, never in a snapshot.
    let before = s.exec("plain=7; echo $$", ExecOpts::default()).await?;
    standin.faults().set(FaultPlan {
        cut_stream_on: Some("CUT-HERE".into()),
        ..Default::default()
    });
    let r = s
        .exec("echo CUT-HERE; echo after", ExecOpts::default())
        .await;
    match &r {
        Err(e) => assert!(
            e.to_string().contains("lost") && e.to_string().contains("re-attached"),
            "{e}"
        ),
        Ok(r) => panic!(
            "a cut stream reported exit {} with {:?}",
            r.exit_code,
            r.output.text()
        ),
    }
    // envd's `Connect` re-attached the same shell: its pid, its plain
    // variable and its exports are all still there, and the lost command's
    // tail (`after`) does not leak into the next command's output.
    let r = s.exec("echo $KEEP $plain $$", ExecOpts::default()).await?;
    assert_eq!(
        (r.exit_code, r.output.text()),
        (0, format!("1 7 {}", before.output.text()))
    );
    assert!(
        r.notices.iter().any(|n| n.contains("re-attached")),
        "{:?}",
        r.notices
    );
    // Directly on the process: a cut stream is an error from wait, not a status.
    let sb = concrete(&b, "cut").await?;
    standin.faults().set(FaultPlan {
        cut_stream_on: Some("CUT-AGAIN".into()),
        ..Default::default()
    });
    let argv: Vec<String> = ["bash", "-c", "echo CUT-AGAIN; sleep 1; exit 0"]
        .map(String::from)
        .to_vec();
    let mut p = sb.start_with_deadline(&argv, false, None).await?;
    let e = p
        .wait()
        .await
        .err()
        .ok_or("a cut stream gave an exit status")?;
    let msg = e.to_string();
    assert!(
        msg.contains("lost") && msg.contains("re-attached") && msg.contains("exit code 0"),
        "{msg}"
    );
    s.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_killed_mid_command_is_gone_with_a_recreate_hint() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    let p = b.provision(&SandboxSpec::named("doomed")).await?;
    let first = b.sandbox_id("doomed").await?.ok_or("no id")?;
    let mut s = session(p.sandbox.clone(), "doomed").await?;
    standin.faults().set(FaultPlan {
        kill_sandbox_on: Some("KILL-ME".into()),
        ..Default::default()
    });
    let r = s
        .exec("echo KILL-ME; sleep 5; echo survived", ExecOpts::default())
        .await;
    let e = match r {
        Err(e) => e,
        Ok(r) => panic!(
            "a killed sandbox reported exit {} with {:?}",
            r.exit_code,
            r.output.text()
        ),
    };
    let msg = e.to_string();
    assert!(
        msg.contains("doomed") && msg.contains("run the command again"),
        "{msg}"
    );
    assert!(!p.sandbox.alive().await?);
    // Provisioning again makes a new one and says why.
    let again = b.provision(&SandboxSpec::named("doomed")).await?;
    let second = b.sandbox_id("doomed").await?.ok_or("no id")?;
    assert_ne!(first, second);
    assert!(again.created || again.recreated.is_some());
    // A sandbox killed from outside between commands: the same clear error.
    let mut s = session(again.sandbox.clone(), "doomed").await?;
    s.exec("true", ExecOpts::default()).await?;
    assert!(standin.kill_sandbox(&second));
    let e = s
        .exec("echo hi", ExecOpts::default())
        .await
        .err()
        .ok_or("a dead sandbox ran a command")?;
    assert!(e.to_string().contains("run the command again"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_is_a_timeout_in_both_of_envds_forms() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    let sb = concrete(&b, "deadline").await?;
    let argv: Vec<String> = ["sleep", "30"].map(String::from).to_vec();
    for as_error in [false, true] {
        standin.faults().set(FaultPlan {
            deadline_as_error: as_error,
            ..Default::default()
        });
        let t = Instant::now();
        let mut p = sb
            .start_with_deadline(&argv, false, Some(Duration::from_millis(300)))
            .await?;
        let e = p
            .wait()
            .await
            .err()
            .ok_or("a deadline gave an exit status")?;
        assert!(
            e.to_string().contains("timed out"),
            "as_error={as_error}: {e}"
        );
        assert!(t.elapsed() < Duration::from_secs(20));
    }
    // Without a deadline, a process killed by a signal is a signal, not a timeout.
    let argv: Vec<String> = ["bash", "-c", "kill -9 $$"].map(String::from).to_vec();
    let mut p = sb.start_with_deadline(&argv, false, None).await?;
    let st = p.wait().await?;
    assert_eq!((st.code, st.signal), (None, Some(9)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_berth_finds_its_sandbox_by_label_and_resumes_a_paused_one() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    let p = b.provision(&SandboxSpec::named("keep")).await?;
    assert!(p.created);
    let id = b.sandbox_id("keep").await?.ok_or("no id")?;
    p.sandbox
        .write_file("note.txt", b"still here", 0o644)
        .await?;
    drop(p);
    // A second backend is a restarted berth: it knows nothing but the label.
    let b2 = backend_with(&standin, |_| None)?;
    let listed = b2.list().await?;
    assert!(
        listed
            .iter()
            .any(|s| s.name == "keep" && s.id == id && s.state == "running"),
        "{listed:?}"
    );
    b2.pause("keep").await?;
    let listed = b2.list().await?;
    assert!(
        listed
            .iter()
            .any(|s| s.name == "keep" && s.state == "paused"),
        "{listed:?}"
    );
    let again = b2.provision(&SandboxSpec::named("keep")).await?;
    assert!(!again.created);
    assert_eq!(b2.sandbox_id("keep").await?.as_deref(), Some(id.as_str()));
    assert_eq!(
        again.sandbox.read_file("note.txt", 100).await?,
        b"still here"
    );
    let mut s = session(again.sandbox.clone(), "keep").await?;
    let r = s.exec("cat note.txt", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "still here");
    s.close().await;
    // Paused while berth holds it: `alive` resumes it.
    b2.pause("keep").await?;
    assert!(again.sandbox.alive().await?);
    b2.remove("keep", Default::default()).await?;
    assert!(b2.list().await?.iter().all(|s| s.name != "keep"));
    assert!(!again.sandbox.alive().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_use_is_kept_alive_and_an_abandoned_one_times_out() -> TestResult {
    let (standin, b) = e2b_standin().await?;
    let mut spec = SandboxSpec::named("alive");
    spec.options.insert("timeout".into(), "2".into());
    let p = b.provision(&spec).await?;
    let id = b.sandbox_id("alive").await?.ok_or("no id")?;
    let mut s = session(p.sandbox.clone(), "alive").await?;
    // Used for three times its timeout: it must stay up.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let r = s.exec("sleep 0.5; echo up", ExecOpts::default()).await?;
        assert_eq!(r.output.text(), "up\n");
    }
    assert!(standin.sandbox_ids().contains(&id));
    // Let go: E2B (here, the stand-in) kills it once the timeout runs out.
    s.close().await;
    drop(p);
    let deadline = Instant::now() + Duration::from_secs(20);
    while standin.sandbox_ids().contains(&id) {
        assert!(
            Instant::now() < deadline,
            "an abandoned sandbox was kept alive"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_and_missing_ones_are_named() -> TestResult {
    let (_standin, b) = e2b_standin().await?;
    let p = b.provision(&SandboxSpec::named("files")).await?;
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    p.sandbox
        .write_file("deep/dir/blob.bin", &data, 0o600)
        .await?;
    assert_eq!(
        p.sandbox.read_file("deep/dir/blob.bin", 1 << 20).await?,
        data
    );
    assert_eq!(
        p.sandbox.read_file("deep/dir/blob.bin", 10).await?,
        &data[..10]
    );
    let mut s = session(p.sandbox.clone(), "files").await?;
    let r = s
        .exec("stat -c %a deep/dir/blob.bin", ExecOpts::default())
        .await?;
    assert_eq!(r.output.text(), "600\n");
    let e = p
        .sandbox
        .read_file("nope.txt", 10)
        .await
        .err()
        .ok_or("a missing file was read")?;
    assert!(e.to_string().contains("nope.txt"), "{e}");
    let e = p
        .sandbox
        .read_file("deep", 10)
        .await
        .err()
        .ok_or("a directory was read")?;
    assert!(e.to_string().contains("deep"), "{e}");
    s.close().await;
    Ok(())
}

/// The official Python SDK, unchanged, against the stand-in: create, run
/// (stdout, stderr, exit code), a background command, a file, a terminal
/// (pty: typed into, resized), kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_works_against_the_standin() -> TestResult {
    let standin = E2bStandin::start(0).await?;
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("sdk.py");
    std::fs::write(&script, SDK_SCRIPT)?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(&script).envs(standin.env()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .map_err(|_| "the SDK script did not finish within 120s")?
        .map_err(|e| {
            format!(
                "cannot run {python}: {e}; scripts/test installs the SDK with `pip install e2b`"
            )
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK script failed ({}); if `import e2b` failed, run `python3 -m pip install e2b` (scripts/test does)\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for line in [
        "run: 'hello\\n' 'oops\\n' 0",
        "fail: 3 'out\\n' 'err\\n'",
        "background: killed True",
        "file: 'written by the sdk'",
        "berth-sees-it: yes",
        "pty: tty, 30 100, resized 20 90, exited True",
        "killed: True",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    assert!(
        standin.sandbox_ids().is_empty(),
        "the SDK's kill left a sandbox"
    );
    Ok(())
}

const SDK_SCRIPT: &str = r#"
import sys
from e2b import Sandbox, CommandExitException

sb = Sandbox.create(timeout=120, metadata={"made-by": "sdk"})
r = sb.commands.run("echo hello; echo oops >&2")
print("run:", repr(r.stdout), repr(r.stderr), r.exit_code)
try:
    sb.commands.run("echo out; echo err >&2; exit 3")
    print("fail: no exception")
except CommandExitException as e:
    print("fail:", e.exit_code, repr(e.stdout), repr(e.stderr))
h = sb.commands.run("sleep 60", background=True)
pids = [p.pid for p in sb.commands.list()]
assert h.pid in pids, (h.pid, pids)
print("background: killed", h.kill())
sb.files.write("sub/dir/note.txt", "written by the sdk")
print("file:", repr(sb.files.read("sub/dir/note.txt")))
seen = sb.commands.run("cat sub/dir/note.txt").stdout
print("berth-sees-it:", "yes" if seen == "written by the sdk" else repr(seen))
# A terminal: bash on a 100x30 pty, typed into, resized, and left with exit.
import threading, time
from e2b import PtySize
out = bytearray()
term = sb.pty.create(PtySize(rows=30, cols=100), timeout=60)
reader = threading.Thread(target=lambda: term.wait(on_pty=out.extend), daemon=True)
reader.start()
def until(needle):
    deadline = time.time() + 30
    while needle not in out:
        assert time.time() < deadline, (needle, bytes(out))
        time.sleep(0.05)
sb.pty.send_stdin(term.pid, b"tty -s && echo on-a-$((6*7))-tty; stty size\n")
until(b"30 100")
until(b"on-a-42-tty")
sb.pty.resize(term.pid, PtySize(rows=20, cols=90))
sb.pty.send_stdin(term.pid, b"stty size\n")
until(b"20 90")
sb.pty.send_stdin(term.pid, b"exit\n")
reader.join(30)
print("pty: tty, 30 100, resized 20 90, exited", not reader.is_alive())
print("killed:", Sandbox.kill(sb.sandbox_id))
sys.stdout.flush()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standin_binary_prints_its_settings() -> TestResult {
    // Built by cargo for this workspace; found beside the test binary.
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no target dir")?;
    let bin = dir.join("e2b-standin");
    if !bin.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build -p berth-standins`",
            bin.display()
        )
        .into());
    }
    let mut child = tokio::process::Command::new(&bin)
        .args(["--port", "0"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut vars = Vec::new();
    while vars.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .map_err(|_| "the stand-in printed nothing in 10s")??
            .ok_or("the stand-in exited")?;
        let (k, v) = line.split_once('=').ok_or("not KEY=VALUE")?;
        vars.push((k.to_string(), v.to_string()));
    }
    let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"]);
    let cfg = E2bConfig::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
    let b = E2bBackend::new(cfg)?;
    let p = b.provision(&SandboxSpec::named("bin")).await?;
    let mut proc = p
        .sandbox
        .spawn(&["true".to_string()], Default::default())
        .await?;
    assert_eq!(proc.wait().await?.code, Some(0));
    b.remove("bin", Default::default()).await?;
    child.kill().await?;
    Ok(())
}

/// envd keeps a process whose stream dropped, so a berth killed mid-command
/// left its session's shell idle in the sandbox for as long as it lived. The
/// next berth to open that session ends it; a shell under the same session
/// whose berth is alive (this process's) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_left_by_a_killed_berth_is_ended_by_the_next() -> TestResult {
    use std::io::BufRead;
    let (standin, b) = e2b_standin().await?;
    // A berth CLI in its own process, killed while its command runs.
    let state = tempfile::tempdir()?;
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["exec", "-b", "e2b", "--", "echo started; sleep 5"])
        .envs(standin.env())
        .env("BERTH_STATE_DIR", state.path())
        .env("BERTH_SERVER", "off")
        .env("BERTH_POLICY", state.path().join("no-policy.toml"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(cli.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    assert_eq!(line, "started\n");
    cli.kill()?;
    cli.wait()?;
    let e2b = b.attach_by_name("default").await?;
    let orphans = e2b.processes().await?;
    assert_eq!(
        orphans.len(),
        1,
        "the killed berth's shell is left: {orphans:?}"
    );
    let sb: Arc<dyn Sandbox> = Arc::new(b.attach_by_name("default").await?);

    // Another session's shell does not touch it.
    let mut other = session(sb.clone(), "e2b/default/other").await?;
    other.exec("true", ExecOpts::default()).await?;
    assert!(e2b.processes().await?.contains(&orphans[0]));

    // The next berth's shell for that session ends it.
    let mut next = session(sb.clone(), "e2b/default/main").await?;
    let r = next.exec("echo $((6 * 7))", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "42\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while e2b.processes().await?.contains(&orphans[0]) {
        assert!(
            Instant::now() < deadline,
            "the orphaned shell {} still runs",
            orphans[0]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A second shell for the session while this berth lives leaves the first.
    let mut twin = session(sb.clone(), "e2b/default/main").await?;
    twin.exec("true", ExecOpts::default()).await?;
    for s in [&mut next, &mut other] {
        let r = s.exec("echo still", ExecOpts::default()).await?;
        assert_eq!(r.output.text(), "still\n");
    }
    for s in [next, other, twin] {
        s.close().await;
    }
    Ok(())
}
