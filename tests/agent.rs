//! `berth run` end to end: the real binary, real sandboxes, and a scripted
//! model provider stand-in (`berth_standins::provider`) that records what it
//! was sent.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use berth_standins::provider::{ProviderStandin, Recorded, Reply};
use serde_json::{Value, json};

use crate::support::TestResult;

pub(crate) const KEY: &str = "sk-standin-0123456789abcdefSECRET";

pub(crate) fn cmd(state: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_berth"));
    c.args(args)
        .env("BERTH_STATE_DIR", state)
        .env("BERTH_POLICY", state.join("policy.toml"))
        .env("BERTH_CONFIG", state.join("config.toml"))
        .env("STANDIN_KEY", KEY)
        .stdin(Stdio::null());
    c
}

pub(crate) fn berth(state: &Path, args: &[&str]) -> std::io::Result<Output> {
    cmd(state, args).output()
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `berth run --json` against the stand-in at `url` (model `m`), with `extra`
/// (flags, then the prompt), as a command to spawn.
pub(crate) fn run_cmd(state: &Path, url: &str, extra: &[&str]) -> Command {
    let mut args = vec![
        "run",
        "--json",
        "--base-url",
        url,
        "--model",
        "m",
        "--api-key-env",
        "STANDIN_KEY",
    ];
    args.extend_from_slice(extra);
    cmd(state, &args)
}

/// `berth run` against one stand-in, ad hoc.
fn run_adhoc(
    state: &Path,
    s: &ProviderStandin,
    api: &str,
    extra: &[&str],
) -> std::io::Result<Output> {
    let url = s.url();
    let mut args = vec![
        "run",
        "--json",
        "--base-url",
        &url,
        "--model",
        "m1",
        "--api",
        api,
        "--api-key-env",
        "STANDIN_KEY",
    ];
    args.extend_from_slice(extra);
    berth(state, &args)
}

/// Each line of stdout that is JSON, as a value (`--json` output).
pub(crate) fn events(o: &Output) -> Vec<Value> {
    text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub(crate) fn exit_event(o: &Output) -> Value {
    events(o)
        .into_iter()
        .rfind(|e| e["type"] == "exit")
        .unwrap_or(Value::Null)
}

pub(crate) fn show(
    state: &Path,
    id: &str,
) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    let o = berth(state, &["runs", "show", id, "--json"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    Ok(serde_json::from_slice(&o.stdout)?)
}

/// The tool results the model was sent in request `r`, in either format.
pub(crate) fn tool_results(r: &Recorded) -> Vec<String> {
    let mut out = Vec::new();
    for m in r.body["messages"].as_array().into_iter().flatten() {
        if m["role"] == "tool" {
            out.push(m["content"].as_str().unwrap_or("").to_string());
        }
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_result" {
                out.push(b["content"].as_str().unwrap_or("").to_string());
            }
        }
    }
    out
}

/// The multi-step task: cd and export in one call, a file written by the
/// file tool, read back by a later command that sees the cwd and the variable.
/// The file tools resolve a relative path from the shell's cwd (`proj`), as
/// `terminal` does (#50 item 17).
fn multi_step_script() -> Vec<Reply> {
    vec![
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "mkdir -p proj && cd proj && export GREETING=hello-from-step-1"}"#,
        ),
        Reply::call(
            "c2",
            "write_file",
            r#"{"path": "note.txt", "content": "line one\nline two\n"}"#,
        ),
        Reply::calls(&[
            (
                "c3",
                "terminal",
                r#"{"command": "pwd; echo $GREETING; cat note.txt; env | grep -c STANDIN_KEY || true"}"#,
            ),
            ("c4", "read_file", r#"{"path": "note.txt"}"#),
        ]),
        Reply::text("All done: the note is written."),
    ]
}

fn check_multi_step(state: &Path, s: &ProviderStandin, o: &Output) -> TestResult {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}\nstdout: {}",
        text(&o.stderr),
        text(&o.stdout)
    );
    let exit = exit_event(o);
    assert_eq!(exit["reason"], "done");
    assert_eq!(exit["answer"], "All done: the note is written.");
    let reqs = s.requests();
    assert_eq!(reqs.len(), 4);
    let last = tool_results(&reqs[3]);
    assert_eq!(last.len(), 4, "{last:?}");
    let r3 = &last[2];
    let lines: Vec<&str> = r3.lines().collect();
    assert!(lines[0].ends_with("/proj"), "cwd persisted: {r3}");
    assert_eq!(lines[1], "hello-from-step-1", "export persisted: {r3}");
    assert_eq!(&lines[2..4], ["line one", "line two"]);
    // The provider's key never reaches the sandbox.
    assert_eq!(lines[4], "0", "{r3}");
    assert!(r3.ends_with("[exit code 0]"));
    assert_eq!(last[3], "line one\nline two\n");
    // The key went to the provider, and nowhere else.
    for r in &reqs {
        let auth = r
            .header("authorization")
            .or(r.header("x-api-key"))
            .unwrap_or("");
        assert!(auth.contains(KEY), "key sent: {auth}");
    }
    let db = std::fs::read(state.join("berth.db"))?;
    let wal = std::fs::read(state.join("berth.db-wal")).unwrap_or_default();
    for bytes in [&db, &wal] {
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "key in the store"
        );
    }
    assert!(!text(&o.stdout).contains(KEY) && !text(&o.stderr).contains(KEY));
    // The journal: four steps, every call finished, token usage with cached tokens.
    let id = exit["run_id"].as_str().unwrap_or("");
    let run = show(state, id)?;
    assert_eq!(run["run"]["state"], "done");
    assert_eq!(run["steps"].as_array().map(Vec::len), Some(4));
    assert_eq!(run["steps"][0]["usage"]["cached_input_tokens"], 100);
    let calls = run["calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 4);
    assert!(calls.iter().all(|c| c["state"] == "finished"), "{calls:?}");
    // The prompt prefix is byte-identical on every step.
    let fixed = |r: &Recorded| -> (String, String) {
        if r.path.ends_with("/messages") {
            (r.body["system"].to_string(), r.body["tools"].to_string())
        } else {
            (
                r.body["messages"][0].to_string(),
                r.body["tools"].to_string(),
            )
        }
    };
    let first = fixed(&reqs[0]);
    assert!(first.1.contains("terminal") && first.0.contains("sandbox"));
    for r in &reqs[1..] {
        assert_eq!(fixed(r), first);
        assert_eq!(r.body["tool_choice"], reqs[0].body["tool_choice"]);
    }
    Ok(())
}

#[test]
fn multi_step_task_on_local_openai_streaming() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = ProviderStandin::start(multi_step_script())?;
    let o = run_adhoc(dir.path(), &s, "openai", &["write a note"])?;
    check_multi_step(dir.path(), &s, &o)?;
    // Arguments arrived split across many chunks and were assembled exactly.
    let reqs = s.requests();
    assert_eq!(reqs[0].body["stream"], true);
    let msgs = reqs[3].body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let call = msgs
        .iter()
        .find(|m| m["tool_calls"].is_array())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        call["tool_calls"][0]["function"]["arguments"],
        r#"{"command": "mkdir -p proj && cd proj && export GREETING=hello-from-step-1"}"#
    );
    Ok(())
}

/// Removes a docker sandbox when dropped, also when the test fails.
pub(crate) struct DockerSandbox<'a> {
    pub(crate) state: &'a Path,
    pub(crate) name: String,
}

impl Drop for DockerSandbox<'_> {
    fn drop(&mut self) {
        let _ = berth(
            self.state,
            &[
                "sandbox",
                "rm",
                &self.name,
                "--backend",
                "docker",
                "--volumes",
            ],
        );
    }
}

#[test]
fn multi_step_task_on_docker_anthropic_streaming() -> TestResult {
    let dir = tempfile::tempdir()?;
    let name = format!("t-agent-{}", std::process::id());
    let o = berth(
        dir.path(),
        &["sandbox", "create", &name, "--backend", "docker"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let _guard = DockerSandbox {
        state: dir.path(),
        name: name.clone(),
    };
    let s = ProviderStandin::start(multi_step_script())?;
    let o = run_adhoc(
        dir.path(),
        &s,
        "anthropic",
        &["--backend", "docker", "--sandbox", &name, "write a note"],
    )?;
    check_multi_step(dir.path(), &s, &o)?;
    assert!(s.requests().iter().all(|r| r.path == "/v1/messages"));
    Ok(())
}

#[test]
fn malformed_arguments_then_a_corrected_call() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = ProviderStandin::start(vec![
        Reply::call("c1", "terminal", r#"{"command": "echo fixed"#),
        Reply::call("c2", "terminal", r#"{"command": 42}"#),
        Reply::call("c3", "terminal", r#"{"command": "echo fixed"}"#),
        Reply::text("ok"),
    ])?;
    let o = run_adhoc(dir.path(), &s, "openai", &["--no-stream", "say fixed"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let reqs = s.requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[0].body["stream"], false);
    let r1 = tool_results(&reqs[1]);
    assert!(
        r1[0].contains("not valid JSON") && r1[0].contains("was not run"),
        "{r1:?}"
    );
    let r2 = tool_results(&reqs[2]);
    assert!(
        r2[1].contains("field `command` must be string, got an integer"),
        "{r2:?}"
    );
    let r3 = tool_results(&reqs[3]);
    assert_eq!(r3[2], "fixed\n[exit code 0]");
    let ev = events(&o);
    let invalid = ev
        .iter()
        .filter(|e| e["type"] == "verdict" && e["verdict"] == "invalid")
        .count();
    assert_eq!(invalid, 2);
    Ok(())
}

#[test]
fn unknown_tool_and_duplicate_calls_are_answered_not_run() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = ProviderStandin::start(vec![
        Reply::calls(&[
            ("t1", "launch_rockets", r#"{"count": 3}"#),
            ("t2", "terminal", r#"{"command": "echo once >> dup.txt"}"#),
            ("t3", "terminal", r#"{"command": "echo once >> dup.txt"}"#),
        ]),
        Reply::call("t4", "terminal", r#"{"command": "cat dup.txt"}"#),
        Reply::text("ok"),
    ])?;
    let o = run_adhoc(dir.path(), &s, "anthropic", &["--no-stream", "go"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let reqs = s.requests();
    let r = tool_results(&reqs[1]);
    assert!(
        r[0].contains("no tool `launch_rockets`")
            && r[0].contains("terminal, process, read_file, write_file, edit_file"),
        "{r:?}"
    );
    assert!(r[2].contains("identical to call 2"), "{r:?}");
    // The error flag reaches Anthropic's tool_result blocks.
    let blocks = reqs[1].body["messages"][2]["content"].clone();
    assert_eq!(blocks[0]["is_error"], true, "{blocks}");
    assert_eq!(blocks[1]["is_error"], false);
    assert_eq!(tool_results(&reqs[2])[3], "once\n[exit code 0]");
    Ok(())
}

fn write_config(state: &Path, a: &ProviderStandin, b: &ProviderStandin) -> std::io::Result<()> {
    std::fs::write(
        state.join("config.toml"),
        format!(
            r#"
[[providers]]
name = "first"
kind = "openai"
base_url = "{}"
model = "m-first"
api_key_env = "STANDIN_KEY"
headers = {{ "x-team" = "berth-tests" }}

[[providers]]
name = "second"
kind = "anthropic"
base_url = "{}"
model = "m-second"
api_key_env = "STANDIN_KEY"
"#,
            a.url(),
            b.url()
        ),
    )
}

#[test]
fn a_429_fails_over_to_the_next_provider_and_retry_after_is_honoured() -> TestResult {
    let dir = tempfile::tempdir()?;
    let a = ProviderStandin::start(vec![Reply::Status {
        code: 429,
        retry_after: Some(120),
    }])?;
    let b = ProviderStandin::start(vec![
        Reply::call("c1", "terminal", r#"{"command": "echo via-second"}"#),
        Reply::text("done by the second"),
    ])?;
    write_config(dir.path(), &a, &b)?;
    let o = berth(
        dir.path(),
        &["run", "--json", "--provider", "first,second", "go"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // The first was asked once; on step 2 its Retry-After kept it aside.
    assert_eq!(a.requests().len(), 1);
    assert_eq!(a.requests()[0].header("x-team"), Some("berth-tests"));
    assert_eq!(b.requests().len(), 2);
    let exit = exit_event(&o);
    let run = show(dir.path(), exit["run_id"].as_str().unwrap_or(""))?;
    let s1 = &run["steps"][0];
    assert_eq!(s1["provider"], "second");
    assert_eq!(s1["attempts"][0]["provider"], "first");
    assert_eq!(s1["attempts"][0]["outcome"], "failed");
    assert!(
        s1["attempts"][0]["why"]
            .as_str()
            .unwrap_or("")
            .contains("429"),
        "{s1}"
    );
    let s2 = &run["steps"][1];
    assert_eq!(s2["attempts"][0]["outcome"], "skipped");
    assert!(
        s2["attempts"][0]["why"]
            .as_str()
            .unwrap_or("")
            .contains("Retry-After"),
        "{s2}"
    );
    assert_eq!(s2["provider"], "second");
    Ok(())
}

#[test]
fn a_stream_cut_mid_response_is_retried() -> TestResult {
    let dir = tempfile::tempdir()?;
    for api in ["openai", "anthropic"] {
        let s = ProviderStandin::start(vec![
            Reply::Cut(Box::new(Reply::call(
                "c1",
                "terminal",
                r#"{"command": "echo should-not-run-from-half-a-call"}"#,
            ))),
            Reply::text("the whole answer"),
        ])?;
        let o = run_adhoc(dir.path(), &s, api, &["go"])?;
        assert_eq!(o.status.code(), Some(0), "{api}: {}", text(&o.stderr));
        assert_eq!(s.requests().len(), 2);
        let exit = exit_event(&o);
        assert_eq!(exit["answer"], "the whole answer");
        let run = show(dir.path(), exit["run_id"].as_str().unwrap_or(""))?;
        let att = &run["steps"][0]["attempts"];
        assert_eq!(att[0]["outcome"], "failed", "{api}: {att}");
        assert!(
            att[0]["why"].as_str().unwrap_or("").contains("stream"),
            "{api}: {att}"
        );
        assert_eq!(att[1]["outcome"], "answered");
        assert_eq!(run["calls"].as_array().map(Vec::len), Some(0));
    }
    Ok(())
}

pub(crate) fn wait_for(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) -> TestResult {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("timed out waiting for {what}").into())
}

/// Press Ctrl-C on a `berth run` (SIGINT), and wait for it to exit.
pub(crate) fn ctrl_c(
    child: &mut Child,
) -> Result<std::process::ExitStatus, Box<dyn std::error::Error + Send + Sync>> {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if Instant::now() > end {
            return Err("berth did not stop after Ctrl-C".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) struct KillOnDrop(pub(crate) Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills, when dropped, every process whose cwd is under `dir`: the shell a
/// SIGKILLed berth left behind in its local sandbox, and its children.
pub(crate) struct Strays(pub(crate) std::path::PathBuf);
impl Drop for Strays {
    fn drop(&mut self) {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if std::fs::read_link(p.path().join("cwd")).is_ok_and(|c| c.starts_with(&self.0)) {
                // SAFETY: kill(2) on a pid we just read; at worst it is gone.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

pub(crate) fn only_run(state: &Path) -> Option<String> {
    let o = berth(state, &["runs", "ls", "--json"]).ok()?;
    let line = text(&o.stdout).lines().next()?.to_string();
    let v: Value = serde_json::from_str(&line).ok()?;
    v["id"].as_str().map(str::to_string)
}

#[test]
fn kill_9_mid_tool_call_then_resume_runs_no_finished_call_twice() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![Reply::calls(&[
        ("a", "terminal", r#"{"command": "echo A >> marks"}"#),
        (
            "b",
            "terminal",
            r#"{"command": "echo B >> marks; sleep 30"}"#,
        ),
    ])])?;
    let url = s.url();
    let child = run_cmd(d, &url, &["work"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut child = KillOnDrop(child);
    let mut id = String::new();
    wait_for("call b to start", Duration::from_secs(60), || {
        let Some(r) = only_run(d) else { return false };
        id = r;
        show(d, &id).is_ok_and(|v| {
            v["calls"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["call_id"] == "b" && c["state"] == "started")
            })
        })
    })?;
    // The command is running: B is in the file.
    wait_for("B written", Duration::from_secs(30), || {
        berth(d, &["exec", "--", "cat marks"]).is_ok_and(|o| text(&o.stdout) == "A\nB\n")
    })?;
    child.0.kill()?; // SIGKILL
    child.0.wait()?;
    let before = show(d, &id)?;
    assert_eq!(before["run"]["state"], "running");
    s.push(vec![Reply::text("resumed and finished")]);
    let o = berth(d, &["run", "--json", "--resume", &id])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // The model was told: a's result, and b cut off with an unknown outcome.
    let reqs = s.requests();
    assert_eq!(reqs.len(), 2);
    let results = tool_results(&reqs[1]);
    assert_eq!(results[0], "[exit code 0]");
    assert!(
        results[1].contains("cut off") && results[1].contains("unknown"),
        "{results:?}"
    );
    // Neither call ran again: the file and the event log say so.
    let o = berth(d, &["exec", "--", "cat marks"])?;
    assert_eq!(text(&o.stdout), "A\nB\n");
    let o = berth(d, &["events", "--json", "--limit", "1000"])?;
    let started = |needle: &str| {
        text(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                e["kind"] == "exec.started"
                    && e["command"].as_str().is_some_and(|c| c.contains(needle))
            })
            .count()
    };
    assert_eq!(started("echo A >> marks"), 1);
    assert_eq!(started("echo B >> marks"), 1);
    let after = show(d, &id)?;
    assert_eq!(after["run"]["state"], "done");
    let b = after["calls"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["call_id"] == "b").cloned())
        .unwrap_or(Value::Null);
    assert_eq!(b["state"], "cut_off");
    Ok(())
}

fn pending_approval(state: &Path) -> Option<i64> {
    let o = berth(state, &["approvals", "ls", "--json"]).ok()?;
    let v: Value = serde_json::from_str(text(&o.stdout).lines().next()?).ok()?;
    v["id"].as_i64()
}

#[test]
fn an_ask_pauses_the_run_and_approval_from_another_process_resumes_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"creates files\"\n",
    )?;
    let s = ProviderStandin::start(vec![
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "touch approved.txt && echo made"}"#,
        ),
        Reply::call(
            "c2",
            "terminal",
            r#"{"command": "touch denied.txt && echo made-too"}"#,
        ),
        Reply::text("finished"),
    ])?;
    let o = run_adhoc(d, &s, "openai", &["make files"])?;
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["reason"], "awaiting_approval");
    let id = exit["run_id"].as_str().unwrap_or("").to_string();
    assert_eq!(show(d, &id)?["run"]["state"], "awaiting_approval");
    let ask = events(&o)
        .into_iter()
        .find(|e| e["verdict"] == "ask")
        .unwrap_or(Value::Null);
    let n = pending_approval(d).ok_or("no pending approval")?;
    assert_eq!(ask["approval"], n);
    // Approved from another process; the resumed run carries on.
    let o = berth(d, &["approve", &n.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = berth(d, &["run", "--json", "--resume", &id])?;
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let m = pending_approval(d).ok_or("no second approval")?;
    assert_ne!(m, n);
    let o = berth(d, &["deny", &m.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = berth(d, &["run", "--json", "--resume", &id])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let reqs = s.requests();
    assert_eq!(reqs.len(), 3);
    let r = tool_results(&reqs[2]);
    assert_eq!(r[0], "made\n[exit code 0]");
    assert!(r[1].contains("answer was no"), "{r:?}");
    let o = berth(d, &["exec", "--", "ls"])?;
    assert!(text(&o.stdout).contains("approved.txt") && !text(&o.stdout).contains("denied.txt"));
    Ok(())
}

#[test]
fn a_spent_budget_ends_with_a_summary_call_without_tools() -> TestResult {
    let dir = tempfile::tempdir()?;
    for api in ["openai", "anthropic"] {
        let s = ProviderStandin::start(vec![
            Reply::call("c1", "terminal", r#"{"command": "echo 1"}"#),
            Reply::call("c2", "terminal", r#"{"command": "echo 2"}"#),
            // Told tools are off, a model may still try: nothing runs.
            Reply::Turn {
                text: "Summary: two steps done.".into(),
                calls: vec![berth_standins::provider::Call {
                    id: "c3".into(),
                    name: "terminal".into(),
                    args: r#"{"command": "echo 3 > three"}"#.into(),
                }],
                stop: "tool_calls".into(),
            },
        ])?;
        let o = run_adhoc(dir.path(), &s, api, &["--max-steps", "2", "count"])?;
        assert_eq!(o.status.code(), Some(2), "{api}: {}", text(&o.stderr));
        let exit = exit_event(&o);
        assert_eq!(exit["reason"], "budget_spent");
        assert_eq!(exit["answer"], "Summary: two steps done.");
        let reqs = s.requests();
        assert_eq!(reqs.len(), 3);
        let choice = &reqs[2].body["tool_choice"];
        assert!(
            *choice == json!("none") || *choice == json!({ "type": "none" }),
            "{api}: {choice}"
        );
        assert!(
            reqs[2].raw.windows(12).any(|w| w == b"budget is sp"),
            "{api}: the model is told why"
        );
        for r in &reqs[..2] {
            assert!(
                r.body["tool_choice"] == json!("auto")
                    || r.body["tool_choice"] == json!({ "type": "auto" })
            );
        }
        let run = show(dir.path(), exit["run_id"].as_str().unwrap_or(""))?;
        assert_eq!(run["run"]["state"], "budget_spent");
        assert_eq!(run["steps"][2]["summary"], true);
        assert_eq!(run["calls"].as_array().map(Vec::len), Some(2));
    }
    let o = berth(dir.path(), &["exec", "--", "ls three 2>&1 || true"])?;
    assert!(text(&o.stdout).contains("No such file"));
    Ok(())
}

#[test]
fn a_fork_from_step_2_replays_the_transcript_up_to_there() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let s = ProviderStandin::start(vec![
        Reply::call("c1", "terminal", r#"{"command": "echo one"}"#),
        Reply::call("c2", "terminal", r#"{"command": "echo two"}"#),
        Reply::call("c3", "terminal", r#"{"command": "echo three"}"#),
        Reply::text("original end"),
        Reply::text("forked end"),
    ])?;
    let o = run_adhoc(d, &s, "openai", &["count"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let id = exit_event(&o)["run_id"].as_str().unwrap_or("").to_string();
    let o = berth(d, &["run", "--json", "--fork", &id, "--at", "2"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["answer"], "forked end");
    let fork = exit["run_id"].as_str().unwrap_or("").to_string();
    assert_ne!(fork, id);
    let reqs = s.requests();
    assert_eq!(reqs.len(), 5);
    // The fork's first request is the original's third: steps 1 and 2 with their results.
    assert_eq!(reqs[4].body["messages"], reqs[2].body["messages"]);
    let run = show(d, &fork)?;
    assert_eq!(run["run"]["parent"], id.as_str());
    assert_eq!(run["run"]["parent_step"], 2);
    assert_eq!(run["steps"][0]["step"], 3);
    let o = berth(d, &["run", "--fork", &id, "--at", "9"])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("steps 1 to 4"),
        "{}",
        text(&o.stderr)
    );
    Ok(())
}

#[test]
fn ctrl_c_mid_tool_call_kills_the_command_and_saves_the_run_interrupted() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![Reply::call(
        "c1",
        "terminal",
        r#"{"command": "sh -c 'sleep 60; echo after > after.txt'"}"#,
    )])?;
    let url = s.url();
    let child = run_cmd(d, &url, &["wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut child = KillOnDrop(child);
    let mut id = String::new();
    wait_for("the call to start", Duration::from_secs(60), || {
        let Some(r) = only_run(d) else { return false };
        id = r;
        show(d, &id).is_ok_and(|v| v["calls"][0]["state"] == "started")
    })?;
    let status = ctrl_c(&mut child.0)?;
    assert_eq!(status.code(), Some(130));
    let run = show(d, &id)?;
    assert_eq!(run["run"]["state"], "interrupted");
    let call = &run["calls"][0];
    assert_eq!(call["state"], "finished");
    assert_eq!(call["result"]["detail"]["interrupted"], true, "{call}");
    assert_eq!(call["result"]["detail"]["exit_code"], 130);
    // Resumed: the model hears the call was interrupted, and nothing reruns it.
    s.push(vec![Reply::text("stopped as asked")]);
    let o = berth(d, &["run", "--json", "--resume", &id])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r = tool_results(&s.requests()[1]);
    assert!(r[0].contains("interrupted by the user"), "{r:?}");
    let o = berth(d, &["exec", "--", "ls after.txt 2>&1 || true"])?;
    assert!(
        text(&o.stdout).contains("No such file"),
        "{}",
        text(&o.stdout)
    );
    Ok(())
}

#[test]
fn with_wait_an_ask_is_answered_while_berth_waits() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\n",
    )?;
    let s = ProviderStandin::start(vec![
        // Cut by the output limit first: answered, not run.
        Reply::truncated("c0", "terminal", r#"{"command": "touch wai"#),
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "touch waited.txt && echo waited"}"#,
        ),
        Reply::text("finished"),
    ])?;
    let url = s.url();
    let child = run_cmd(d, &url, &["--wait", "go"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut child = KillOnDrop(child);
    let mut n = 0;
    wait_for("the approval to be asked", Duration::from_secs(60), || {
        pending_approval(d).map(|id| n = id).is_some()
    })?;
    assert!(
        child.0.try_wait()?.is_none(),
        "berth waits rather than exiting"
    );
    let o = berth(d, &["approve", &n.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.0.try_wait()? {
            break st;
        }
        if Instant::now() > end {
            return Err("berth did not finish after the approval".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let reqs = s.requests();
    assert_eq!(reqs.len(), 3);
    let r = tool_results(&reqs[1]);
    assert!(r[0].contains("cut off by the output limit"), "{r:?}");
    let r = tool_results(&reqs[2]);
    assert_eq!(r[1], "waited\n[exit code 0]");
    Ok(())
}

#[test]
fn no_provider_answering_ends_the_run_provider_failed_and_resumable() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    // A port nobody listens on: bind one, then let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let o = berth(
        d,
        &["run", "--json", "--base-url", &url, "--model", "m", "go"],
    )?;
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["reason"], "provider_failed");
    assert!(
        exit["detail"]
            .as_str()
            .unwrap_or("")
            .contains("could not connect"),
        "{exit}"
    );
    let id = exit["run_id"].as_str().unwrap_or("").to_string();
    // The provider is back: the same run carries on.
    let s = ProviderStandin::start(vec![Reply::text("back")])?;
    let o = run_adhoc(d, &s, "openai", &["--resume", &id])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(exit_event(&o)["answer"], "back");
    assert_eq!(show(d, &id)?["run"]["state"], "done");
    Ok(())
}

/// `berth run --server`: the run's tools run in the berth server the CLI
/// uses, so the run and the CLI share one shell, plain variables included.
#[test]
fn a_run_through_the_server_shares_the_cli_shell() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let o = cmd(d, &["exec", "--", "cli_plain=from-cli"])
        .env("BERTH_SERVER", "auto")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = ProviderStandin::start(vec![
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "echo seen-$cli_plain; run_plain=from-run"}"#,
        ),
        Reply::text("done"),
    ])?;
    let url = s.url();
    let o = run_cmd(d, &url, &["--server", "look around"])
        .env("BERTH_SERVER", "auto")
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r = tool_results(&s.requests()[1]);
    assert!(r[0].starts_with("seen-from-cli"), "{r:?}");
    let o = cmd(d, &["exec", "--", "echo $run_plain"])
        .env("BERTH_SERVER", "require")
        .output()?;
    assert_eq!(text(&o.stdout), "from-run\n", "{}", text(&o.stderr));
    // Off and --server contradict each other: said, not guessed.
    let o = run_cmd(d, &url, &["--server", "again"])
        .env("BERTH_SERVER", "off")
        .output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("BERTH_SERVER=off"));
    let _ = cmd(d, &["server", "stop"]).output();
    Ok(())
}
