//! The `berth` binary on the ssh backend, against a real sshd: what a
//! sandbox keeps of the host it was made on (issue 50), so that later calls,
//! through the server or not, need no `--host` again.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{self, BoxError, TestResult, text};

/// `box1` and a state dir; the server a call started is stopped on drop.
struct Box1 {
    host: support::box1::Box1,
    state: tempfile::TempDir,
}

impl Box1 {
    fn start() -> Result<Box1, BoxError> {
        Ok(Box1 {
            host: support::box1::Box1::start()?,
            state: tempfile::tempdir()?,
        })
    }

    fn run(&self, args: &[&str]) -> std::io::Result<Output> {
        self.host
            .apply(
                Command::new(env!("CARGO_BIN_EXE_berth"))
                    .args(args)
                    .env("BERTH_STATE_DIR", self.state.path())
                    .env("BERTH_POLICY", self.state.path().join("policy.toml"))
                    .stdin(Stdio::null()),
            )
            .output()
    }

    /// `args`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
        let o = self.run(args)?;
        if o.status.code() != Some(0) {
            return Err(format!(
                "berth {args:?} exited {:?}: {}{}",
                o.status.code(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
            .into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The job called `name` as `job ls --json` shows it.
    fn job(&self, name: &str) -> Result<Value, BoxError> {
        let all: Value = serde_json::from_str(&self.ok(&["job", "ls", "--json"])?)?;
        all.as_array()
            .and_then(|v| v.iter().find(|j| j["name"] == name))
            .cloned()
            .ok_or_else(|| format!("no job {name} in {all}").into())
    }
}

impl Drop for Box1 {
    fn drop(&mut self) {
        let _ = self.run(&["server", "stop"]);
    }
}

/// Issue 50, item 1, as it was reported: a job started with `--host` is
/// followed, waited on and killed by calls that do not repeat it, and is
/// never reported `lost` while it runs.
#[test]
fn a_job_started_with_host_is_found_again_without_it() -> TestResult {
    let b = Box1::start()?;
    b.ok(&[
        "job", "start", "-b", "ssh", "--host", "box1", "--name", "sleeper2", "--", "sleep", "300",
    ])?;
    let j = b.job("sleeper2")?;
    assert_eq!(j["state"], "running", "{j}");
    let ls = b.ok(&["job", "ls"])?;
    assert!(!ls.contains("lost") && !ls.contains("needs a host"), "{ls}");
    // Still running: the wait times out (124), with or without --host.
    for extra in [&[][..], &["--host", "box1"][..]] {
        let mut args = vec!["job", "wait", "sleeper2", "--timeout", "1"];
        args.extend_from_slice(extra);
        let o = b.run(&args)?;
        assert_eq!(o.status.code(), Some(124), "{args:?}: {}", text(&o));
    }
    b.ok(&["job", "logs", "sleeper2"])?;
    let killed = b.ok(&["job", "kill", "sleeper2"])?;
    assert!(!killed.contains("nothing to kill"), "{killed}");
    assert!(killed.contains("killed by SIGTERM"), "{killed}");
    let j = b.job("sleeper2")?;
    assert_eq!(j["state"], "killed", "{j}");
    // The default sandbox keeps box1: another host is refused, and says why.
    let o = b.run(&["exec", "-b", "ssh", "--host", "127.0.0.2", "--", "true"])?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(text(&o).contains("keeps its host `box1`"), "{}", text(&o));
    assert_eq!(
        b.ok(&["exec", "-b", "ssh", "--", "echo", "here"])?,
        "here\n"
    );
    Ok(())
}

/// `sandbox create --host` is enough: `exec -s`, `ls` and `rm` find the
/// sandbox on its host without it, and a new sandbox's `-o workdir=~`
/// starts the session in the remote home.
#[test]
fn a_sandbox_made_with_host_keeps_it() -> TestResult {
    let b = Box1::start()?;
    b.ok(&["sandbox", "create", "srv", "-b", "ssh", "--host", "box1"])?;
    let pwd = b.ok(&["exec", "-b", "ssh", "-s", "srv", "--", "pwd"])?;
    assert!(pwd.trim_end().ends_with("/.berth/sandboxes/srv"), "{pwd}");
    let o = b.run(&[
        "sandbox",
        "create",
        "srv",
        "-b",
        "ssh",
        "--host",
        "127.0.0.2",
    ])?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(text(&o).contains("keeps its host `box1`"), "{}", text(&o));
    b.ok(&[
        "sandbox",
        "create",
        "home",
        "-b",
        "ssh",
        "--host",
        "box1",
        "-o",
        "workdir=~",
    ])?;
    let home = b.ok(&["exec", "-b", "ssh", "-s", "home", "--", "pwd; echo $HOME"])?;
    let lines: Vec<&str> = home.lines().collect();
    assert!(lines.len() == 2 && lines[0] == lines[1], "{home}");
    // Listed across backends, without --host: local's default and both here.
    b.ok(&["exec", "--", "true"])?;
    let all: Value = serde_json::from_str(&b.ok(&["sandbox", "ls", "--all", "--json"])?)?;
    let got: Vec<(String, String, String)> = all
        .as_array()
        .ok_or("not a list")?
        .iter()
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap_or("").to_string();
            (f("backend"), f("name"), f("state"))
        })
        .collect();
    // Each ssh sandbox is shown on its host as the user named it.
    for s in all.as_array().ok_or("not a list")? {
        if s["backend"] == "ssh" {
            let id = s["id"].as_str().unwrap_or("");
            assert!(id.starts_with("box1:"), "{s}");
        }
    }
    let table = b.ok(&["sandbox", "ls", "--all"])?;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("srv ") && l.contains(" box1:")),
        "{table}"
    );
    for want in [("local", "default"), ("ssh", "srv"), ("ssh", "home")] {
        assert!(
            got.iter()
                .any(|(b, n, s)| (b.as_str(), n.as_str()) == want && s != "missing"),
            "{want:?} in {got:?}"
        );
    }
    b.ok(&["sandbox", "rm", "srv", "-b", "ssh"])?;
    b.ok(&["sandbox", "rm", "home", "-b", "ssh"])?;
    assert!(!remote_dir(&b, "srv").exists() && !remote_dir(&b, "home").exists());
    Ok(())
}

fn remote_dir(b: &Box1, name: &str) -> PathBuf {
    b.host.remote.path().join(".berth/sandboxes").join(name)
}

/// A host that does not answer leaves its job `unknown`, not `lost`, and
/// the next look after it answers again finds it running.
#[test]
fn an_unreachable_host_leaves_a_job_unknown_not_lost() -> TestResult {
    let mut b = Box1::start()?;
    b.ok(&[
        "job", "start", "-b", "ssh", "--host", "box1", "--name", "nap", "--", "sleep", "300",
    ])?;
    b.host.sshd.stop();
    let j = b.job("nap")?;
    assert_eq!(j["state"], "unknown", "{j}");
    assert!(
        j["reason"].as_str().unwrap_or("").contains("may still run"),
        "{j}"
    );
    b.host.sshd.restart()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let j = b.job("nap")?;
        if j["state"] == "running" {
            assert!(j["reason"].is_null(), "{j}");
            break;
        }
        assert!(Instant::now() < deadline, "never running again: {j}");
        std::thread::sleep(Duration::from_millis(200));
    }
    b.ok(&["job", "kill", "nap"])?;
    Ok(())
}
