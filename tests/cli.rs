//! The `berth` binary from the outside, on the local backend.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::TestResult;

fn berth(state: &Path, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env("BERTH_STATE_DIR", state)
        .stdin(Stdio::null())
        .output()
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
fn exit_code_is_the_commands() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = berth(
        dir.path(),
        &["exec", "--", "echo out; echo err >&2; (exit 7)"],
    )?;
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(stdout(&o), "out\nerr\n");
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
    // `exit` ended the shell before its snapshot, so there is no cwd to report,
    // and the next shell is back where the last completed command left it.
    assert!(v["cwd"].is_null());
    let o = berth(dir.path(), &["exec", "--json", "--", "pwd"])?;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["cwd"], "/tmp");
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["exec", "--stdin", "--", "tr a-z A-Z"])
        .env("BERTH_STATE_DIR", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut i = child.stdin.take().ok_or("no stdin")?;
        i.write_all(b"shout\n")?;
    }
    let o = child.wait_with_output()?;
    assert_eq!(stdout(&o), "SHOUT\n");
    Ok(())
}
