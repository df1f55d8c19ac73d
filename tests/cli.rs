//! The `berth` binary from the outside, on the local backend.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::TestResult;

fn berth(state: &Path, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env("BERTH_STATE_DIR", state)
        // Not the user's own policy file.
        .env("BERTH_POLICY", state.join("policy.toml"))
        .stdin(Stdio::null())
        .output()
}

/// Run berth with `input` on its stdin.
fn berth_with_input(state: &Path, args: &[&str], input: &[u8]) -> std::io::Result<Output> {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env("BERTH_STATE_DIR", state)
        .env("BERTH_POLICY", state.join("policy.toml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(input)?;
    }
    child.wait_with_output()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn state_persists_across_invocations() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &["exec", "--", "cd /tmp && export A=1 && f() { echo fn; }"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = berth(dir.path(), &["exec", "--", "pwd; echo $A; f"])?;
    assert_eq!(stdout(&o), "/tmp\n1\nfn\n", "{}", stderr(&o));
    Ok(())
}

#[test]
fn named_sessions_keep_their_own_variables_between_calls() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Through `berth serve` and in-process alike (BERTH_SERVER=off).
    for (session, cmd) in [("a", "export X=in-a; cd /usr"), ("b", "export X=in-b")] {
        let o = berth(dir.path(), &["exec", "--session", session, "--", cmd])?;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let o = berth(
        dir.path(),
        &["exec", "--session", "a", "--", "echo $X $PWD"],
    )?;
    assert_eq!(stdout(&o), "in-a /usr\n", "{}", stderr(&o));
    let o = berth(
        dir.path(),
        &["exec", "--session", "b", "--", "echo $X $PWD"],
    )?;
    assert!(stdout(&o).starts_with("in-b /"), "{}", stderr(&o));
    assert!(!stdout(&o).contains("/usr"), "{}", stdout(&o));
    let o = berth(dir.path(), &["exec", "--", "echo main-${X:-unset}"])?;
    assert_eq!(stdout(&o), "main-unset\n", "{}", stderr(&o));
    let o = berth(dir.path(), &["exec", "--session", "../a", "--", "true"])?;
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("session name"), "{}", stderr(&o));
    Ok(())
}

#[test]
fn exit_code_is_the_commands() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &["exec", "--", "echo out; echo err >&2; (exit 7)"],
    )?;
    assert_eq!(o.status.code(), Some(7));
    // stdout and stderr come back apart, as from ssh or `docker exec`.
    assert_eq!(stdout(&o), "out\n");
    assert!(stderr(&o).starts_with("err\n"), "{}", stderr(&o));
    // Several words are joined like a shell line.
    let o = berth(dir.path(), &["exec", "--", "echo", "a", "b"])?;
    assert_eq!(stdout(&o), "a b\n");
    Ok(())
}

#[test]
fn json_output_has_the_documented_fields() -> TestResult {
    let dir = tempfile::tempdir()?;
    berth(dir.path(), &["exec", "--", "cd /tmp"])?;
    let o = berth(
        dir.path(),
        &["exec", "--json", "--", "cd /; printf abc; exit 3"],
    )?;
    assert_eq!(o.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["output"], "abc");
    assert_eq!(v["truncated"], false);
    assert_eq!(v["bytes"], 3);
    assert_eq!(v["timed_out"], false);
    assert!(v["duration_ms"].is_u64());
    // `exit` ended the shell, but its EXIT trap saved the state it ended in, so
    // the next shell starts where this command left it.
    assert_eq!(v["cwd"], "/");
    let o = berth(dir.path(), &["exec", "--json", "--", "pwd"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["cwd"], "/");
    assert_eq!(v["output"], "/\n");
    Ok(())
}

#[test]
fn timeout_exits_124_with_a_message() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &["exec", "--timeout", "0.5", "--", "echo before; sleep 1005"],
    )?;
    assert_eq!(o.status.code(), Some(124));
    assert_eq!(stdout(&o), "before\n");
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
    let o = berth(
        dir.path(),
        &["exec", "--json", "--timeout", "0.5", "--", "sleep 1005"],
    )?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["timed_out"], true);
    assert_eq!(v["exit_code"], 124);
    Ok(())
}

/// `yes` under a timeout once wrote gigabytes to the spool: each spool file
/// keeps its head and a rolling tail within its cap, and says so.
#[test]
fn the_spool_is_capped_and_says_so() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "exec",
            "--json",
            "--",
            "yes berth | head -c 5000000; echo last-line",
        ])
        .env("BERTH_STATE_DIR", dir.path())
        .env("BERTH_POLICY", dir.path().join("policy.toml"))
        .env("BERTH_SPOOL_CAP_MB", "1")
        .stdin(Stdio::null())
        .output()?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["exit_code"], 0, "{}", stderr(&o));
    let omitted = v["spool_omitted_bytes"].as_u64().unwrap_or(0);
    assert_eq!(omitted, 5_000_010 - 1024 * 1024);
    let notices = v["notices"].to_string();
    assert!(
        notices.contains("spool is capped at 1048576 bytes: of the 5000010 bytes, it keeps the first 524288 and the last 524288 and left out 3951434 in between"),
        "{notices}"
    );
    let path = v["spool"].as_str().ok_or("no spool path")?;
    let spooled = std::fs::read(path)?;
    assert!(spooled.len() < 1024 * 1024 + 200, "{} bytes", spooled.len());
    assert!(spooled.starts_with(b"berth\nberth\n"));
    assert!(spooled.ends_with(b"berth\nbelast-line\n"));
    let text = String::from_utf8_lossy(&spooled);
    assert!(text.contains("bytes left out of this spool"));
    // The directory as a whole is capped too: a second big output pushes the
    // first one out.
    let o = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["exec", "--json", "--", "head -c 3000000 /dev/zero"])
        .env("BERTH_STATE_DIR", dir.path())
        .env("BERTH_POLICY", dir.path().join("policy.toml"))
        .env("BERTH_SPOOL_CAP_MB", "1")
        .env("BERTH_SPOOL_DIR_CAP_MB", "1")
        .stdin(Stdio::null())
        .output()?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["exit_code"], 0, "{}", stderr(&o));
    assert!(
        !Path::new(path).exists(),
        "the older spool was kept past the dir cap"
    );
    let newest = v["spool"].as_str().ok_or("no spool path")?;
    assert!(Path::new(newest).exists());
    // A spool's last half is held in memory while its command runs: a cap
    // past the largest is refused, with what to do instead.
    let o = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["exec", "--", "true"])
        .env("BERTH_STATE_DIR", dir.path().join("big"))
        .env("BERTH_POLICY", dir.path().join("policy.toml"))
        .env("BERTH_SPOOL_CAP_MB", "1000")
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("BERTH_SPOOL_CAP_MB is more than 256 MiB") && err.contains("redirect it"),
        "{err}"
    );
    Ok(())
}

#[test]
fn bad_input_gets_clear_errors() -> TestResult {
    let dir = tempfile::tempdir()?;
    for (args, needle) in [
        (
            vec!["exec", "--timeout", "0", "--", "true"],
            "--timeout must be a positive",
        ),
        (
            vec!["exec", "--timeout", "-3", "--", "true"],
            "--timeout must be a positive",
        ),
        (vec!["exec", "--"], "empty command"),
        (vec!["exec", "--", "   "], "empty command"),
        (
            vec!["exec", "--sandbox", "nope", "--", "true"],
            "berth sandbox create nope",
        ),
        (
            vec!["exec", "--backend", "warp", "--", "true"],
            "unknown backend `warp`",
        ),
        (vec!["sandbox", "create", "../evil"], "invalid sandbox name"),
        (vec!["sandbox", "rm", "ghost"], "not found"),
        (
            vec!["sandbox", "create", "x", "--env", "NOEQUALS"],
            "KEY=VALUE",
        ),
    ] {
        let o = berth(dir.path(), &args)?;
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
    }
    Ok(())
}

#[test]
fn an_unwritable_state_dir_is_named() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x")?;
    let state = file.join("state");
    let o = berth(&state, &["exec", "--", "true"])?;
    assert_eq!(o.status.code(), Some(125));
    let e = stderr(&o);
    assert!(e.contains("state dir") && e.contains("--state-dir"), "{e}");
    Ok(())
}

#[test]
fn sandboxes_and_events() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(dir.path(), &["sandbox", "create", "web", "--json"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["created"], true);
    // Idempotent.
    let o = berth(dir.path(), &["sandbox", "create", "web", "--json"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["created"], false);
    let o = berth(
        dir.path(),
        &["exec", "--sandbox", "web", "--", "echo hi > f.txt"],
    )?;
    assert_eq!(o.status.code(), Some(0));
    let o = berth(dir.path(), &["sandbox", "ls", "--json"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    let names: Vec<&str> = v
        .as_array()
        .ok_or("not a list")?
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, vec!["web"]);
    assert_eq!(v[0]["state"], "ready");
    let o = berth(dir.path(), &["events", "--json", "--kind", "exec.finished"])?;
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["exit_code"], 0);
    assert_eq!(lines[0]["sandbox"], "web");
    assert_eq!(lines[0]["command"], "echo hi > f.txt");
    let o = berth(dir.path(), &["sandbox", "rm", "web"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = berth(dir.path(), &["exec", "--sandbox", "web", "--", "true"])?;
    assert_eq!(
        o.status.code(),
        Some(125),
        "a removed sandbox is unknown again"
    );
    Ok(())
}

#[test]
fn stdin_flag_feeds_the_command() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth_with_input(
        dir.path(),
        &["exec", "--stdin", "--", "tr a-z A-Z"],
        b"shout\n",
    )?;
    assert_eq!(stdout(&o), "SHOUT\n", "{}", stderr(&o));

    // A command that points berth's stdin file at a host file must not get that
    // file overwritten by the next command's input.
    let outside = tempfile::tempdir()?;
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "original")?;
    let o = berth(
        dir.path(),
        &[
            "exec",
            "--",
            &format!("ln -sf {} \"$__berth_dir/stdin\"", victim.display()),
        ],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = berth_with_input(dir.path(), &["exec", "--stdin", "--", "cat"], b"pwned\n")?;
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("out of sandbox"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&victim)?, "original");
    Ok(())
}

#[test]
fn a_job_outlives_a_kill_9_of_berth() -> TestResult {
    use std::io::BufRead;
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &[
            "job",
            "start",
            "--name",
            "survivor",
            "--",
            "for i in $(seq 1 40); do echo tick $i; sleep 0.1; done",
        ],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let id = stdout(&o).trim().to_string();
    // A berth process following the job is killed with SIGKILL mid-stream.
    let mut follower = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["job", "logs", "--follow", &id])
        .env("BERTH_STATE_DIR", dir.path())
        .env("BERTH_POLICY", dir.path().join("policy.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut first = String::new();
    std::io::BufReader::new(follower.stdout.take().ok_or("no stdout")?).read_line(&mut first)?;
    assert_eq!(first, "tick 1\n");
    follower.kill()?;
    follower.wait()?;
    let o = berth(dir.path(), &["job", "ls", "--json"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v[0]["id"], id.as_str());
    assert_eq!(v[0]["state"], "running", "{v}");
    let o = berth(dir.path(), &["job", "wait", "survivor", "--timeout", "60"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = berth(dir.path(), &["job", "logs", &id])?;
    let want: String = (1..=40).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(stdout(&o), want);
    let o = berth(dir.path(), &["job", "kill", &id])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("had already ended, exited (exit 0)"),
        "{}",
        stdout(&o)
    );
    let o = berth(dir.path(), &["job", "logs", "j00000000"])?;
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("job `j00000000` not found"),
        "{}",
        stderr(&o)
    );
    Ok(())
}

#[test]
fn paging_a_huge_log_keeps_memory_flat() -> TestResult {
    let dir = tempfile::tempdir()?;
    let size: u64 = 1024 * 1024 * 1024;
    let o = berth(
        dir.path(),
        &["job", "start", "--", &format!("head -c {size} /dev/zero")],
    )?;
    let id = stdout(&o).trim().to_string();
    let o = berth(dir.path(), &["job", "wait", &id, "--timeout", "120"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Measure the paging process alone: wait4 gives the resource use of one child.
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["job", "logs", &id])
        .env("BERTH_STATE_DIR", dir.path())
        .env("BERTH_POLICY", dir.path().join("policy.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child by pid; status and ru are valid out-pointers.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(rc, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.ok_or("no stderr")?, &mut err)?;
    assert!(err.contains(&format!("next offset {size}")), "{err}");
    let max_rss_mib = ru.ru_maxrss / 1024;
    assert!(
        max_rss_mib < 64,
        "`berth job logs` peaked at {max_rss_mib} MiB while paging {} MiB",
        size >> 20
    );
    // The whole log went through: the job says so, and a resume from the end is empty.
    let o = berth(
        dir.path(),
        &["job", "logs", &id, "--offset", &size.to_string()],
    )?;
    assert!(o.stdout.is_empty());
    assert!(
        stderr(&o).contains(&format!("next offset {size}")),
        "{}",
        stderr(&o)
    );
    Ok(())
}

/// The same flow on docker: create, exec across invocations (each one a fresh
/// berth process), ls, gc, rm.
#[test]
fn docker_sandbox_create_exec_ls_gc_rm() -> TestResult {
    let dir = tempfile::tempdir()?;
    let name = format!("t-cli-{}", std::process::id());
    let d = dir.path();
    let _g = RmOnDrop(d.to_path_buf(), name.clone());
    let o = berth(d, &["sandbox", "create", &name, "--backend", "docker"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = |cmd: &str| {
        berth(
            d,
            &["exec", "--backend", "docker", "--sandbox", &name, "--", cmd],
        )
    };
    let o = run("cd /tmp && export A=1; whoami")?;
    assert_eq!(stdout(&o), "berth\n", "{}", stderr(&o));
    let o = run("pwd; echo $A; exit 4")?;
    assert_eq!(stdout(&o), "/tmp\n1\n", "{}", stderr(&o));
    assert_eq!(o.status.code(), Some(4));
    let o = berth(d, &["sandbox", "ls", "--backend", "docker", "--json"])?;
    let list: Value = serde_json::from_slice(&o.stdout)?;
    let mine = list
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == name.as_str()))
        .ok_or("the new sandbox is not listed")?;
    assert_eq!(mine["state"], "running");
    // gc with no age threshold: a stopped sandbox is collected, a running one
    // never. (Safe beside other tests: gc sees only this state dir's installation.)
    let stopped = format!("{name}-stopped");
    let _g2 = RmOnDrop(d.to_path_buf(), stopped.clone());
    let o = berth(d, &["sandbox", "create", &stopped, "--backend", "docker"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let installation = berth_backends::installation_id(d)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let b = berth_backends::docker::DockerBackend::connect()
                .await?
                .with_installation(&installation);
            b.client()
                .stop_container(&b.names().container(&stopped), None)
                .await?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })?;
    let o = berth(d, &["sandbox", "gc", "--older-than", "0", "--json"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let gc: Value = serde_json::from_slice(&o.stdout)?;
    let removed = gc["removed"].as_array().ok_or("no removed list")?;
    assert!(removed.iter().any(|n| n == stopped.as_str()), "{gc}");
    assert!(!removed.iter().any(|n| n == name.as_str()), "{gc}");
    let o = berth(d, &["sandbox", "rm", &name, "--backend", "docker"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = berth(d, &["sandbox", "ls", "--backend", "docker", "--json"])?;
    assert!(
        !stdout(&o).contains(&format!("\"{name}\"")),
        "{}",
        stdout(&o)
    );
    Ok(())
}

/// Removes a docker sandbox through the CLI when dropped, so a failed test
/// leaves no container or volume behind.
struct RmOnDrop(std::path::PathBuf, String);

impl Drop for RmOnDrop {
    fn drop(&mut self) {
        let _ = berth(&self.0, &["sandbox", "rm", &self.1, "--backend", "docker"]);
    }
}

#[test]
fn exec_background_starts_a_job_with_the_session_state() -> TestResult {
    let dir = tempfile::tempdir()?;
    berth(dir.path(), &["exec", "--", "cd /tmp && export BG=yes"])?;
    let o = berth(dir.path(), &["exec", "--background", "--", "echo $BG $PWD"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let id = stdout(&o).trim().to_string();
    assert!(id.starts_with('j'), "{id}");
    let o = berth(dir.path(), &["job", "wait", &id, "--timeout", "60"])?;
    assert_eq!(o.status.code(), Some(0));
    let o = berth(dir.path(), &["job", "logs", &id])?;
    assert_eq!(stdout(&o), "yes /tmp\n");
    Ok(())
}

/// `bench --egress`: the proxy against a direct connection, in one run,
/// with its ratios computed from the numbers it reports.
#[test]
fn bench_egress_reports_the_proxy_against_a_direct_connection() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &["bench", "--egress", "-n", "20", "--size-mb", "4", "--json"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    let num = |k: &str| v[k].as_f64().ok_or(format!("{k} missing in {v}"));
    let (d, p) = (num("direct_request_us")?, num("proxied_request_us")?);
    assert!(d > 0.0 && p > 0.0, "{v}");
    assert!(
        (num("request_ratio")? - p / d).abs() < 1e-6 * (p / d),
        "{v}"
    );
    let (dm, pm) = (num("direct_mib_per_s")?, num("proxied_mib_per_s")?);
    assert!(dm > 0.0 && pm > 0.0, "{v}");
    assert!(
        (num("throughput_ratio")? - pm / dm).abs() < 1e-6 * (pm / dm),
        "{v}"
    );
    assert_eq!(v["download_mib"], 4);
    assert_eq!(v["requests"], 20);
    // The credential path: two TLS handshakes against one.
    let (dt, pt) = (
        num("direct_https_request_us")?,
        num("credential_https_request_us")?,
    );
    assert!(dt > 0.0 && pt > 0.0, "{v}");
    assert!(
        (num("credential_request_ratio")? - pt / dt).abs() < 1e-6 * (pt / dt),
        "{v}"
    );
    let o = berth(dir.path(), &["bench", "--egress", "--size-mb", "0"])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("--size-mb must be at least 1"),
        "{}",
        stderr(&o)
    );
    Ok(())
}

#[test]
fn bench_reports_both_series_and_their_ratio() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(dir.path(), &["bench", "-n", "30", "--json"])?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    let num = |k: &str| v[k].as_f64().ok_or(format!("{k} missing in {v}"));
    let (session, stateful, floor) = (
        num("session_ms")?,
        num("session_stateful_ms")?,
        num("floor_ms")?,
    );
    assert!(session > 0.0 && stateful > 0.0 && floor > 0.0, "{v}");
    let ratio = num("speedup")?;
    assert!(
        (ratio - floor / session).abs() < 1e-6 * ratio.max(1.0),
        "{v}"
    );
    assert_eq!(v["backend"], "local");
    assert_eq!(v["count"], 30);
    // The bench sandbox is cleaned up.
    let o = berth(dir.path(), &["sandbox", "ls", "--json"])?;
    assert!(!stdout(&o).contains("berth-bench"), "{}", stdout(&o));
    Ok(())
}

/// On docker the floor is a fresh exec in the bench sandbox's own container,
/// found under this state dir's installation id (it once looked under a new
/// random one, and the bench failed with "No such container").
#[test]
fn bench_runs_on_docker_against_a_fresh_exec() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &["bench", "-n", "5", "--json", "--backend", "docker"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["backend"], "docker");
    for k in [
        "session_ms",
        "session_stateful_ms",
        "floor_ms",
        "snapshot_cost_ms",
        "snapshot_cost_functions_ms",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {v}");
    }
    assert!(v["floor_ms"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    let o = berth(
        dir.path(),
        &["sandbox", "ls", "--backend", "docker", "--json"],
    )?;
    assert!(!stdout(&o).contains("berth-bench"), "{}", stdout(&o));
    Ok(())
}

#[test]
fn state_spool_and_sandboxes_are_private() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    // An older berth left the state dir open to everyone: it is tightened.
    std::fs::create_dir_all(&state)?;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755))?;
    let o = berth(
        &state,
        &["exec", "--", "seq 1 200000; echo snap > snapfile"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mode = |p: &Path| -> std::io::Result<u32> {
        Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
    };
    assert_eq!(mode(&state)?, 0o700, "state dir");
    assert_eq!(mode(&state.join("berth.db"))? & 0o077, 0, "database");
    for f in ["berth.db-wal", "berth.db-shm"] {
        if state.join(f).exists() {
            assert_eq!(mode(&state.join(f))? & 0o077, 0, "{f}");
        }
    }
    let spool = state.join("spool");
    assert_eq!(mode(&spool)?, 0o700, "spool dir");
    let mut spooled = 0;
    for e in std::fs::read_dir(&spool)? {
        let p = e?.path();
        if p.is_file() {
            spooled += 1;
            assert_eq!(mode(&p)? & 0o077, 0, "{}", p.display());
        }
    }
    assert!(spooled > 0, "the long output was not spooled");
    let sandboxes = state.join("sandboxes").join("local");
    for e in std::fs::read_dir(&sandboxes)? {
        let sb = e?.path();
        for sub in ["work", "tmp", ".berth"] {
            assert_eq!(mode(&sb.join(sub))?, 0o700, "{}/{sub}", sb.display());
        }
    }
    Ok(())
}

/// True while some process on this host runs a `berth-wait` for job `id`
/// (local jobs are host processes).
fn waiting_for(id: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|p| {
        std::fs::read(p.path().join("cmdline")).is_ok_and(|c| {
            let c = String::from_utf8_lossy(&c);
            c.contains("berth-wait") && c.contains(id)
        })
    })
}

/// `events --follow` shows a job's end as it happens: it keeps a waiter in the
/// sandbox on every unfinished job (seen in /proc), three rounds in a row, each
/// job started after the follower. How soon a waiter wakes is `berth bench`'s
/// job-wake figure, not asserted here.
#[test]
fn events_follow_shows_a_job_end_at_once() -> TestResult {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    // The sandbox exists before the follower starts.
    berth(d, &["exec", "--", "true"])?;
    let mut follower = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "events",
            "--follow",
            "--json",
            "--kind",
            "job.exited",
            "-n",
            "0",
        ])
        .env("BERTH_STATE_DIR", d)
        .env("BERTH_POLICY", d.join("policy.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = follower.stdout.take().ok_or("no stdout")?;
    let _follower = KillOnDrop(follower);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    for round in 0..3 {
        let o = berth(d, &["job", "start", "--", "read -r x"])?;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let id = stdout(&o).trim().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !waiting_for(&id) {
            assert!(
                Instant::now() < deadline,
                "events --follow never waited on {id}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = berth(d, &["job", "send", &id, "go\n"])?;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .map_err(|_| format!("round {round}: no job.exited for {id} within 30s"))?;
            if line.contains(&id) {
                break;
            }
        }
    }
    Ok(())
}

/// `bench --cli` on a backend: served and in-process CLI calls against the
/// backend's own client without berth, measured in one run; the bench's
/// sandbox and server are cleaned up.
fn bench_cli(
    backend: &str,
    extra: &[&str],
    home: Option<&Path>,
    floor: &str,
) -> Result<Value, crate::support::BoxError> {
    let dir = tempfile::tempdir()?;
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_berth"));
        c.args(args)
            .env("BERTH_STATE_DIR", dir.path())
            .env("BERTH_POLICY", dir.path().join("policy.toml"))
            .env_remove("BERTH_SERVER")
            .stdin(Stdio::null());
        if let Some(h) = home {
            c.env("HOME", h).env_remove("SSH_AUTH_SOCK");
        }
        c.output()
    };
    let mut args = vec!["bench", "--cli", "-n", "5", "--json", "--backend", backend];
    args.extend_from_slice(extra);
    let o = run(&args)?;
    let stopped = run(&["server", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["floor"], floor, "{v}");
    for k in ["server_ms", "off_ms", "floor_ms", "bash_c_ms"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
    }
    let ratio = v["server_over_floor"].as_f64().ok_or("no ratio")?;
    let want = v["server_ms"].as_f64().unwrap_or(0.0) / v["floor_ms"].as_f64().unwrap_or(1.0);
    assert!((ratio - want).abs() < 1e-6 * want.max(1.0), "{v}");
    let stopped = stopped?;
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    Ok(v)
}

#[test]
fn bench_cli_on_local_against_bash_c() -> TestResult {
    bench_cli("local", &[], None, "bash -c")?;
    Ok(())
}

#[test]
fn bench_cli_on_docker_against_docker_exec() -> TestResult {
    bench_cli("docker", &[], None, "docker exec")?;
    Ok(())
}

/// The test sshd's home, with an `~/.ssh/config` alias `berthbench` for it
/// that both berth and OpenSSH read.
fn bench_ssh_home(
    sshd: &berth_backends::ssh::testing::Sshd,
) -> Result<std::path::PathBuf, crate::support::BoxError> {
    let home = sshd.home();
    std::fs::write(
        home.join(".ssh/config"),
        format!(
            "Host berthbench\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            sshd.port(),
            sshd.user(),
            sshd.user_key().display(),
            sshd.known_hosts().display()
        ),
    )?;
    Ok(home)
}

/// The ssh floor is OpenSSH over a ControlMaster, reaching the host through
/// the same ~/.ssh/config alias berth reads.
#[test]
fn bench_cli_on_ssh_against_a_control_master() -> TestResult {
    let sshd = berth_backends::ssh::testing::Sshd::start()?;
    let home = bench_ssh_home(&sshd)?;
    bench_cli(
        "ssh",
        &["--opt", "host=berthbench"],
        Some(&home),
        "ssh, ControlMaster",
    )?;
    Ok(())
}

/// Issue 36: one `berth bench --cli` run measures local, docker and ssh, each
/// with its own floor and a ratio to `bash -c` measured in the same run; a
/// `BACKEND:KEY=VALUE` option goes to that backend only.
#[test]
fn bench_cli_measures_three_backends_in_one_run() -> TestResult {
    let sshd = berth_backends::ssh::testing::Sshd::start()?;
    let home = bench_ssh_home(&sshd)?;
    let dir = tempfile::tempdir()?;
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .env("BERTH_STATE_DIR", dir.path())
            .env("BERTH_POLICY", dir.path().join("policy.toml"))
            .env_remove("BERTH_SERVER")
            .env("HOME", &home)
            .env_remove("SSH_AUTH_SOCK")
            .stdin(Stdio::null())
            .output()
    };
    let o = run(&[
        "bench",
        "--cli",
        "-n",
        "3",
        "--json",
        "-b",
        "local,docker,ssh",
        "-o",
        "ssh:host=berthbench",
    ])?;
    let _ = run(&["server", "stop"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let got: Vec<(&str, &str)> = lines
        .iter()
        .map(|v| {
            (
                v["backend"].as_str().unwrap_or(""),
                v["floor"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("local", "bash -c"),
            ("docker", "docker exec"),
            ("ssh", "ssh, ControlMaster")
        ]
    );
    for v in &lines {
        let want = v["server_ms"].as_f64().unwrap_or(0.0) / v["bash_c_ms"].as_f64().unwrap_or(1.0);
        let got = v["server_over_bash_c"]
            .as_f64()
            .ok_or("no ratio to bash -c")?;
        assert!(
            want > 0.0 && (got - want).abs() < 1e-6 * want.max(1.0),
            "{v}"
        );
    }
    Ok(())
}

/// The restricted local sandbox (the CLI's default) runs terminal jobs in a
/// devpts instance of its own: a REPL is driven, and a resize reaches it
/// through the job's resizer (the sandbox's `/dev/pts` is not the host's, so
/// berth cannot set the size by the terminal's name from outside).
#[test]
fn a_terminal_job_runs_and_resizes_in_the_restricted_local_sandbox() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let ok = |args: &[&str]| -> Result<String, crate::support::BoxError> {
        let o = berth(d, args)?;
        if o.status.code() != Some(0) {
            return Err(format!("{args:?}: {}", stderr(&o)).into());
        }
        Ok(stdout(&o))
    };
    let screen_shows = |want: &str| -> TestResult {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let s = ok(&["job", "screen", "py"])?;
            if s.contains(want) {
                return Ok(());
            }
            if std::time::Instant::now() > end {
                return Err(format!("the screen never showed {want:?}:\n{s}").into());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    ok(&[
        "job",
        "start",
        "--pty",
        "--size",
        "80x24",
        "--name",
        "py",
        "--",
        "python3 -q -i",
    ])?;
    screen_shows(">>>")?;
    ok(&[
        "job",
        "send",
        "py",
        "import os; os.get_terminal_size(0)",
        "--keys",
        "Enter",
    ])?;
    screen_shows("columns=80, lines=24")?;
    ok(&["job", "resize", "py", "100x30"])?;
    ok(&[
        "job",
        "send",
        "py",
        "os.get_terminal_size(0)",
        "--keys",
        "Enter",
    ])?;
    screen_shows("columns=100, lines=30")?;
    let v: Value = serde_json::from_str(&ok(&["job", "screen", "py", "--json"])?)?;
    assert_eq!(
        (v["cols"].as_u64(), v["rows"].as_u64()),
        (Some(100), Some(30)),
        "{v}"
    );
    let o = berth(d, &["job", "kill", "py", "--signal", "kill"])?;
    assert!(o.status.code().is_some(), "{}", stderr(&o));
    let _ = berth(d, &["server", "stop"]);
    Ok(())
}

/// `job kill` succeeds when the job is gone, as kill(1) and `docker kill` do:
/// exit 0 whether it was killed now or had already ended (and says which),
/// the job's own code (128+N) only in the message and the JSON; non-zero only
/// when berth could not stop it. Through the server and in-process alike.
#[test]
fn job_kill_exits_0_once_the_job_is_gone() -> TestResult {
    for server in ["auto", "off"] {
        let dir = tempfile::tempdir()?;
        let run = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_berth"))
                .args(args)
                .env("BERTH_STATE_DIR", dir.path())
                .env("BERTH_POLICY", dir.path().join("policy.toml"))
                .env("BERTH_SERVER", server)
                .stdin(Stdio::null())
                .output()
        };
        let o = run(&["job", "start", "--name", "nap", "--", "sleep 300"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", stderr(&o));
        let o = run(&["job", "kill", "nap", "--grace", "2"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("killed by SIGTERM (exit 143)"),
            "{server}: {}",
            stdout(&o)
        );
        // Again: already ended, still a success, and it says so.
        let o = run(&["job", "kill", "nap", "--json"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout)?;
        assert_eq!(v["state"], "killed", "{server}: {v}");
        assert_eq!(v["exit_code"], 143, "{server}: {v}");
        assert_eq!(v["kill"], "already_ended", "{server}: {v}");
        let o = run(&["job", "kill", "nap"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("had already ended, killed by SIGTERM (exit 143)"),
            "{server}: {}",
            stdout(&o)
        );
        // A job killed now, in JSON: the outcome and the job's own code.
        let o = run(&["job", "start", "--name", "nap2", "--", "sleep 300"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", stderr(&o));
        let o = run(&["job", "kill", "nap2", "--signal", "kill", "--json"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout)?;
        assert_eq!(v["kill"], "signalled", "{server}: {v}");
        assert_eq!(v["kill_signal"], "KILL", "{server}: {v}");
        assert_eq!(v["exit_code"], 137, "{server}: {v}");
        // Nothing to kill: an error that says what is wrong.
        let o = run(&["job", "kill", "j00000000"])?;
        assert_ne!(o.status.code(), Some(0), "{server}: {}", stdout(&o));
        assert!(
            stderr(&o).contains("job `j00000000` not found"),
            "{server}: {}",
            stderr(&o)
        );
        let _ = run(&["server", "stop"]);
    }
    Ok(())
}
