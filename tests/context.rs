//! `berth run` inside a small context window: the provider stand-in refuses
//! requests over its window the way the real APIs do, and the run must
//! compact its transcript to finish. What the model is sent shrinks; what
//! the journal keeps does not.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use berth_standins::provider::{Advertise, ProviderStandin, Recorded, Reply};
use serde_json::Value;

use crate::agent::{
    KillOnDrop, Strays, berth, events, exit_event, only_run, run_cmd, show, text, tool_results,
    wait_for,
};
use crate::support::TestResult;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TASK: &str = "TASK-7f3a: print about 3 KB, forty times over";
const STEPS: usize = 40;
const WINDOW: u64 = 9000;
const LINES: usize = 45;
const SUMMARY: &str = "## Task\nprint 3 KB forty times\n## Decisions\nnone\n## State of the sandbox\nunchanged\n## Open questions\nnone\n## Next step\nthe next print";

/// Step `k`'s command: about 3 KB of output that names its step.
fn command(k: usize) -> String {
    format!(
        "yes 'step {k}: the quick brown fox jumps over the lazy dog, again and again' | head -n {LINES}"
    )
}

/// Step `k`'s result as the tool reports it.
fn output(k: usize) -> String {
    let line = format!("step {k}: the quick brown fox jumps over the lazy dog, again and again\n");
    format!("{}[exit code 0]", line.repeat(LINES))
}

fn script(steps: std::ops::RangeInclusive<usize>, last: bool) -> Vec<Reply> {
    let mut s: Vec<Reply> = steps
        .map(|k| {
            let args = serde_json::json!({ "command": command(k) }).to_string();
            Reply::call(&format!("c{k}"), "terminal", &args)
        })
        .collect();
    if last {
        s.push(Reply::text("all forty printed"));
    }
    s
}

fn standin(window: u64, how: Advertise) -> std::io::Result<ProviderStandin> {
    let s = ProviderStandin::start(script(1..=STEPS, true))?;
    s.set_window(window, how);
    s.on_tools_off(Reply::text(SUMMARY));
    Ok(s)
}

fn tools_off(r: &Recorded) -> bool {
    r.body["tool_choice"] == "none" || r.body["tool_choice"]["type"] == "none"
}

/// The checks every windowed run must pass: done; at most one request over
/// the window; the task in every request; the newest tool result whole in
/// the request after it; the prefix byte-identical; compactions journaled;
/// every original message kept.
fn check_run(d: &Path, s: &ProviderStandin, o: &Output, window: u64) -> Result<Value, BoxError> {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}\nstdout tail: {}",
        text(&o.stderr),
        text(&o.stdout)
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let exit = exit_event(o);
    assert_eq!(exit["reason"], "done", "{exit}");
    assert_eq!(exit["answer"], "all forty printed");
    let reqs = s.requests();
    let over: Vec<u64> = reqs
        .iter()
        .map(|r| r.tokens)
        .filter(|t| *t > window)
        .collect();
    assert!(over.len() <= 1, "requests over the window: {over:?}");
    for (i, r) in reqs.iter().enumerate() {
        assert!(
            String::from_utf8_lossy(&r.raw).contains(TASK),
            "request {i} lacks the task"
        );
    }
    // The newest tool result is whole in every request that follows a call.
    let mut checked = 0;
    for r in reqs.iter().filter(|r| !tools_off(r)) {
        let Some(last) = tool_results(r).pop() else {
            continue;
        };
        let k: usize = last
            .strip_prefix("step ")
            .and_then(|t| t.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert_eq!(last, output(k), "the newest result, step {k}, is not whole");
        checked += 1;
    }
    assert!(checked >= STEPS, "{checked} requests checked");
    // System prompt and tool schemas are the same bytes in every request.
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
    for r in &reqs[1..] {
        assert_eq!(fixed(r), fixed(&reqs[0]));
    }
    let id = exit["run_id"].as_str().unwrap_or("").to_string();
    let run = show(d, &id)?;
    let compactions = run["compactions"].as_array().cloned().unwrap_or_default();
    assert!(!compactions.is_empty(), "no compaction journaled");
    for c in &compactions {
        let (b, a) = (
            c["tokens_before"].as_u64().unwrap_or(0),
            c["tokens_after"].as_u64().unwrap_or(u64::MAX),
        );
        assert!(a < b, "a compaction that did not shrink: {c}");
        assert!(
            ["mask", "summary", "rotate"].contains(&c["stage"].as_str().unwrap_or("")),
            "{c}"
        );
    }
    // The journal keeps every original message, whole.
    let msgs = run["messages"].as_array().cloned().unwrap_or_default();
    let results: Vec<&str> = msgs
        .iter()
        .filter(|m| m["message"]["role"] == "tool")
        .filter_map(|m| m["message"]["text"].as_str())
        .collect();
    assert_eq!(results.len(), STEPS);
    for (k, r) in results.iter().enumerate() {
        assert_eq!(*r, output(k + 1));
    }
    assert_eq!(msgs[0]["message"]["text"], TASK);
    // `berth runs show` lists them for people too.
    let o = berth(d, &["runs", "show", &id])?;
    let shown = text(&o.stdout);
    assert!(shown.contains("compaction before step"), "{shown}");
    Ok(run)
}

fn adhoc(d: &Path, s: &ProviderStandin, api: &str, extra: &[&str]) -> std::io::Result<Output> {
    let url = s.url();
    let mut args = vec!["--api", api];
    args.extend_from_slice(extra);
    args.push(TASK);
    run_cmd(d, &url, &args).output()
}

#[test]
fn forty_steps_of_3kb_finish_in_a_9k_window_openai_streaming() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    // vLLM's way: the window is in `/v1/models`, so nothing is ever refused.
    let s = standin(WINDOW, Advertise::Models)?;
    let o = adhoc(d, &s, "openai", &[])?;
    let run = check_run(d, &s, &o, WINDOW)?;
    assert!(s.requests().iter().all(|r| r.tokens <= WINDOW));
    assert!(
        s.probes().iter().any(|p| p == "/v1/models"),
        "{:?}",
        s.probes()
    );
    assert_eq!(s.requests()[0].body["stream"], true);
    // A summary was asked with tools off, journaled as a step of its own.
    let compactions = run["compactions"].as_array().cloned().unwrap_or_default();
    let summarised: Vec<&Value> = compactions
        .iter()
        .filter(|c| c["summary"].as_str() == Some(SUMMARY))
        .collect();
    assert!(!summarised.is_empty(), "{compactions:?}");
    let step = summarised[0]["summary_step"].as_i64().unwrap_or(-1);
    let steps = run["steps"].as_array().cloned().unwrap_or_default();
    assert!(
        steps
            .iter()
            .any(|s| s["step"] == step && s["summary"] == true),
        "summary step {step} not journaled"
    );
    // A fork before the first compaction replays the uncompacted transcript
    // (early enough that the fork, which has no usage to go by yet and so
    // counts by the cautious estimate, need not compact either).
    let first = compactions[0]["step"].as_i64().unwrap_or(0);
    assert!(first > 3, "{compactions:?}");
    let id = run["run"]["id"].as_str().unwrap_or("");
    s.push(vec![Reply::text("forked and done")]);
    let at = "2".to_string();
    let first = 3;
    let before = s.requests().len();
    let o = crate::agent::berth(d, &["run", "--json", "--fork", id, "--at", &at])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let fork_req = &s.requests()[before];
    let results = tool_results(fork_req);
    assert_eq!(results.len() as i64, first - 1);
    for (k, r) in results.iter().enumerate() {
        assert_eq!(*r, output(k + 1), "the fork sees step {} whole", k + 1);
    }
    Ok(())
}

#[test]
fn forty_steps_in_a_9k_window_openai_not_streaming_with_llama_cpp_props() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = standin(WINDOW, Advertise::Props)?;
    let o = adhoc(dir.path(), &s, "openai", &["--no-stream"])?;
    check_run(dir.path(), &s, &o, WINDOW)?;
    assert!(s.probes().iter().any(|p| p == "/props"), "{:?}", s.probes());
    assert!(s.requests().iter().all(|r| r.tokens <= WINDOW));
    assert_eq!(s.requests()[0].body["stream"], false);
    Ok(())
}

/// Anthropic says nothing of its window before refusing: the first refusal
/// teaches it, is not a provider failure, and the step is retried once after
/// a harder compaction.
#[test]
fn forty_steps_in_a_9k_window_anthropic_learns_the_window_from_its_refusal() -> TestResult {
    for stream in [true, false] {
        let dir = tempfile::tempdir()?;
        let s = standin(WINDOW, Advertise::Nothing)?;
        let extra: &[&str] = if stream { &[] } else { &["--no-stream"] };
        let o = adhoc(dir.path(), &s, "anthropic", extra)?;
        let run = check_run(dir.path(), &s, &o, WINDOW)?;
        let over = s.requests().iter().filter(|r| r.tokens > WINDOW).count();
        assert_eq!(over, 1, "stream {stream}: learned from one refusal");
        assert!(s.requests().iter().all(|r| r.path == "/v1/messages"));
        // The refusal is in the step's attempts, and no provider failed over.
        let steps = run["steps"].as_array().cloned().unwrap_or_default();
        let refused = steps
            .iter()
            .flat_map(|s| s["attempts"].as_array().cloned().unwrap_or_default())
            .filter(|a| {
                a["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("prompt is too long"))
            })
            .count();
        assert_eq!(refused, 0, "the retried step's attempts are its own");
        let ev = events(&o);
        assert!(
            ev.iter().any(|e| e["type"] == "failover"
                && e["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("prompt is too long"))),
            "the refusal was reported"
        );
    }
    Ok(())
}

#[test]
fn a_provider_that_never_reports_usage_is_counted_by_estimate() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = standin(WINDOW, Advertise::Models)?;
    s.set_usage(false);
    let o = adhoc(dir.path(), &s, "openai", &[])?;
    let run = check_run(dir.path(), &s, &o, WINDOW)?;
    assert!(s.requests().iter().all(|r| r.tokens <= WINDOW));
    let steps = run["steps"].as_array().cloned().unwrap_or_default();
    assert!(steps.iter().all(|s| s["usage"]["input_tokens"] == 0));
    Ok(())
}

/// The first provider has a large window and answers until it is rate
/// limited; the second has a small one. The run is fitted to the smaller,
/// so the failover lands on requests it can take.
#[test]
fn failover_from_a_large_window_to_a_small_one_fits_the_small_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let mut first = script(1..=12, false);
    first.push(Reply::Status {
        code: 429,
        retry_after: Some(600),
    });
    let a = ProviderStandin::start(first)?;
    a.set_window(64_000, Advertise::Models);
    a.on_tools_off(Reply::text(SUMMARY));
    let b = ProviderStandin::start(script(13..=STEPS, true))?;
    b.set_window(WINDOW, Advertise::Models);
    b.on_tools_off(Reply::text(SUMMARY));
    std::fs::write(
        d.join("config.toml"),
        format!(
            "[[providers]]\nname = \"big\"\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"STANDIN_KEY\"\n\n\
             [[providers]]\nname = \"small\"\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"STANDIN_KEY\"\n",
            a.url(),
            b.url()
        ),
    )?;
    let o = berth(d, &["run", "--json", "--provider", "big,small", TASK])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(exit_event(&o)["reason"], "done");
    assert!(!b.requests().is_empty(), "the small provider answered");
    for r in a.requests().iter().chain(b.requests().iter()) {
        assert!(r.tokens <= WINDOW, "{} tokens sent", r.tokens);
        assert!(String::from_utf8_lossy(&r.raw).contains(TASK));
    }
    Ok(())
}

/// `kill -9` while the model writes a compaction's summary: nothing of it
/// is journaled, every message is, and the resume compacts again and
/// finishes.
#[test]
fn kill_9_during_a_compaction_then_resume_finishes_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    // A window small enough that masking alone soon stops being enough.
    let window = 6000;
    let s = ProviderStandin::start(script(1..=STEPS, true))?;
    s.set_window(window, Advertise::Models);
    s.on_tools_off(Reply::Slow(
        Duration::from_secs(60),
        Box::new(Reply::text(SUMMARY)),
    ));
    let url = s.url();
    let child = run_cmd(d, &url, &["--no-stream", TASK])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut child = KillOnDrop(child);
    wait_for("a summary call", Duration::from_secs(120), || {
        s.requests().iter().any(tools_off)
    })?;
    child.0.kill()?; // SIGKILL
    child.0.wait()?;
    let id = only_run(d).ok_or("no run")?;
    let before = show(d, &id)?;
    let summaries = |v: &Value| {
        v["compactions"]
            .as_array()
            .map(|c| c.iter().filter(|c| c["summary"].is_string()).count())
            .unwrap_or(0)
    };
    assert_eq!(
        summaries(&before),
        0,
        "a half-done compaction was journaled"
    );
    let stored = before["messages"].as_array().map(Vec::len).unwrap_or(0);
    s.on_tools_off(Reply::text(SUMMARY));
    let o = berth(d, &["run", "--json", "--resume", &id])?;
    let run = check_run(d, &s, &o, window)?;
    assert!(summaries(&run) >= 1);
    // Every message from before the kill is still there, first in order.
    let after = run["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        before["messages"].as_array().cloned().unwrap_or_default()[..],
        after[..stored]
    );
    Ok(())
}

/// A summary call that fails, or is itself refused for size: berth writes
/// the summary from the journal, says so, and the run carries on.
#[test]
fn a_summary_call_that_fails_or_overflows_falls_back_to_berths_own() -> TestResult {
    let refusal = serde_json::json!({ "error": {
        "message": "This model's maximum context length is 5000 tokens. However, your messages resulted in 9999 tokens.",
        "code": "context_length_exceeded" } });
    for (what, reply) in [
        (
            "fails",
            Reply::Status {
                code: 400,
                retry_after: None,
            },
        ),
        ("overflows", Reply::Refuse(refusal.clone())),
    ] {
        let dir = tempfile::tempdir()?;
        let s = ProviderStandin::start(script(1..=STEPS, true))?;
        s.set_window(6000, Advertise::Models);
        s.on_tools_off(reply);
        let o = adhoc(dir.path(), &s, "openai", &[])?;
        let run = check_run(dir.path(), &s, &o, 6000)?;
        let notes: Vec<Value> = run["compactions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                c["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("summary call failed"))
            })
            .collect();
        assert!(!notes.is_empty(), "{what}: no fallback noted");
        let summary = notes[0]["summary"].as_str().unwrap_or("");
        for section in [
            "## Task",
            "## Decisions",
            "## State of the sandbox",
            "## Open questions",
            "## Next step",
        ] {
            assert!(summary.contains(section), "{what}: {summary}");
        }
        assert!(
            summary.contains(TASK) && summary.contains("step 1:"),
            "{what}: {summary}"
        );
    }
    Ok(())
}

/// A window that cannot hold the system prompt, the task and a tool result:
/// a clear error, and the journal resumes once the window is right.
#[test]
fn a_window_too_small_for_the_run_says_so_and_resumes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let s = ProviderStandin::start(script(1..=3, false))?;
    s.set_window(WINDOW, Advertise::Nothing);
    s.push(vec![Reply::text("all forty printed")]);
    let url = s.url();
    let o = run_cmd(d, &url, &["--context-window", "900", TASK]).output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["reason"], "error");
    let detail = exit["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("context window (900 tokens")
            && detail.contains("system prompt and tool schemas")
            && detail.contains("--resume"),
        "{detail}"
    );
    assert!(
        s.requests().is_empty(),
        "nothing was sent that could not fit"
    );
    let id = exit["run_id"].as_str().unwrap_or("").to_string();
    let o = berth(
        d,
        &["run", "--json", "--resume", &id, "--context-window", "8000"],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(exit_event(&o)["reason"], "done");
    Ok(())
}
