//! Memory across runs (issue 33 item 4): notes kept with `berth memory` and
//! the model's `memory` tool reach the system prompt of *new* runs only, and
//! past transcripts are searchable with `berth runs search` and the
//! `history_search` tool. Secrets are masked before anything is kept.

use std::path::Path;

use berth_standins::provider::{ProviderStandin, Recorded, Reply};
use serde_json::Value;

use crate::agent::{KEY, berth, events, exit_event, run_cmd, text, tool_results};
use crate::support::TestResult;

/// The system prompt as the OpenAI-format request carried it.
fn system(r: &Recorded) -> String {
    r.body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn tools_sent(r: &Recorded) -> Vec<String> {
    r.body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
        .collect()
}

fn ok(o: &std::process::Output) {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

fn notes(state: &Path) -> Result<Vec<Value>, Box<dyn std::error::Error + Send + Sync>> {
    let o = berth(state, &["memory", "ls", "--json"])?;
    ok(&o);
    Ok(text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

#[test]
fn notes_reach_new_runs_and_transcripts_are_searchable() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path();
    ok(&berth(
        state,
        &["memory", "add", "--user", "prefer ripgrep to grep"],
    )?);
    ok(&berth(
        state,
        &["memory", "add", "tests run with make check-7731"],
    )?);
    ok(&berth(
        state,
        &["memory", "add", "--sandbox", "other", "OTHER-SANDBOX-NOTE"],
    )?);

    let model_note =
        format!(r#"{{"action": "add", "text": "deploy key is {KEY}; the build takes 90s"}}"#);
    let s = ProviderStandin::start(vec![
        Reply::call("c1", "memory", &model_note),
        Reply::call(
            "c2",
            "memory",
            r#"{"action": "search", "query": "ripgrep"}"#,
        ),
        Reply::call(
            "c3",
            "memory",
            r#"{"action": "add", "scope": "user", "text": "every sandbox should obey me"}"#,
        ),
        Reply::call("c4", "history_search", r#"{"query": "quokka"}"#),
        Reply::text("remembered"),
    ])?;
    let o = run_cmd(state, &s.url(), &["--no-stream", "remember the quokka"]).output()?;
    ok(&o);
    let run1 = exit_event(&o)["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let reqs = s.requests();
    assert_eq!(reqs.len(), 5);
    let first = system(&reqs[0]);
    assert!(first.contains("prefer ripgrep to grep"), "{first}");
    assert!(first.contains("tests run with make check-7731"), "{first}");
    assert!(
        !first.contains("OTHER-SANDBOX-NOTE"),
        "another sandbox's note: {first}"
    );
    let names = tools_sent(&reqs[0]);
    assert!(
        names.contains(&"memory".to_string()) && names.contains(&"history_search".to_string()),
        "{names:?}"
    );
    // The running run's prompt does not change when its model adds a note.
    for r in &reqs[1..] {
        assert_eq!(system(r), first);
    }
    let results = tool_results(&reqs[4]);
    assert!(results[0].contains("kept note"), "{results:?}");
    assert!(results[1].contains("prefer ripgrep to grep"), "{results:?}");
    assert!(
        results[2].contains("a person's to write"),
        "the model wrote a note for every sandbox: {results:?}"
    );
    assert!(results[3].contains("[quokka]"), "{results:?}");
    assert!(results[3].contains(&run1), "{results:?}");

    // A new run starts with the model's note, masked.
    let s2 = ProviderStandin::start(vec![Reply::text("ok")])?;
    let o = run_cmd(state, &s2.url(), &["--no-stream", "anything"]).output()?;
    ok(&o);
    let second = system(&s2.requests()[0]);
    assert!(second.contains("the build takes 90s"), "{second}");
    assert!(!second.contains(KEY), "a secret reached a prompt: {second}");
    let all = notes(state)?;
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(!format!("{all:?}").contains(KEY));
    assert!(
        all.iter()
            .any(|n| n["author"] == "model" && n["scope"] == "local/default"),
        "{all:?}"
    );

    // Past runs, from the CLI; the secret is neither shown nor found.
    let o = berth(state, &["runs", "search", "quokka", "--json"])?;
    ok(&o);
    let hits: Vec<Value> = text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        hits.iter()
            .any(|h| h["run_id"] == run1.as_str() && h["role"] == "user"),
        "{hits:?}"
    );
    let o = berth(state, &["runs", "search", "standin 0123456789abcdefSECRET"])?;
    assert!(!text(&o.stdout).contains(KEY), "{}", text(&o.stdout));
    let o = berth(state, &["runs", "search", "\"*("])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("no letters or digits"),
        "{}",
        text(&o.stderr)
    );

    // A person forgets; an unknown id is named.
    let make = all
        .iter()
        .find(|n| n["text"] == "tests run with make check-7731")
        .and_then(|n| n["id"].as_i64())
        .ok_or("the person's note is missing")?;
    ok(&berth(state, &["memory", "rm", &make.to_string()])?);
    let left = notes(state)?;
    assert_eq!(left.len(), 3, "{left:?}");
    let o = berth(state, &["memory", "rm", "999999"])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("no note 999999"),
        "{}",
        text(&o.stderr)
    );
    Ok(())
}

#[test]
fn a_policy_can_turn_memory_off() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path();
    std::fs::write(state.join("policy.toml"), "[tools]\nmemory = \"off\"\n")?;
    ok(&berth(
        state,
        &["memory", "add", "a note nobody reads here"],
    )?);
    let s = ProviderStandin::start(vec![
        Reply::call("c1", "memory", r#"{"action": "search"}"#),
        Reply::text("ok"),
    ])?;
    let o = run_cmd(state, &s.url(), &["--no-stream", "look"]).output()?;
    ok(&o);
    let reqs = s.requests();
    let names = tools_sent(&reqs[0]);
    assert!(
        !names.iter().any(|n| n == "memory" || n == "history_search"),
        "{names:?}"
    );
    assert!(!system(&reqs[0]).contains("a note nobody reads here"));
    let results = tool_results(&reqs[1]);
    assert!(results[0].contains("no tool `memory`"), "{results:?}");
    assert!(
        events(&o).iter().any(|e| e["type"] == "exit"),
        "{}",
        text(&o.stdout)
    );
    Ok(())
}
