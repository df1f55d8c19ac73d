//! Sub-agents (`delegate`) end to end: the real binary, real sandboxes
//! (local and docker), and the scripted provider stand-in, where each
//! child's conversation has a script of its own (routed by its task).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_standins::provider::{ProviderStandin, Reply};
use serde_json::{Value, json};

use crate::agent::{
    KillOnDrop, Strays, berth, exit_event, run_cmd, show, text, tool_results, wait_for,
};
use crate::support::TestResult;

/// Every run, as `berth runs ls --json` lists them.
fn runs(state: &Path) -> Vec<Value> {
    berth(state, &["runs", "ls", "--json"])
        .map(|o| crate::agent::events(&o))
        .unwrap_or_default()
}

fn children_of(state: &Path, parent: &str) -> Vec<Value> {
    runs(state)
        .into_iter()
        .filter(|r| r["kind"] == "child" && r["parent"] == parent)
        .collect()
}

fn delegate_args(tasks: &[&str], extra: Value) -> String {
    let mut v = json!({ "tasks": tasks });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v.to_string()
}

/// How many `exec.started` events ran a command containing `needle`.
fn started(state: &Path, needle: &str) -> usize {
    let Ok(o) = berth(state, &["events", "--json", "--limit", "5000"]) else {
        return 0;
    };
    text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["kind"] == "exec.started" && e["command"].as_str().is_some_and(|c| c.contains(needle))
        })
        .count()
}

/// A parent hands three tasks to three children, each on a new docker
/// sandbox of its own. The children run at once: their commands' journaled
/// intervals overlap. Their answers reach the parent in one turn, their
/// spend is the parent's, and their sandboxes are gone when they end.
#[test]
fn three_children_on_new_docker_sandboxes_run_at_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let name = format!("t-deleg-{}", std::process::id());
    let o = berth(d, &["sandbox", "create", &name, "--backend", "docker"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let _guard = crate::agent::DockerSandbox {
        state: d,
        name: name.clone(),
    };
    let tasks = [
        "TASK-alpha: report",
        "TASK-beta: report",
        "TASK-gamma: report",
    ];
    let s = ProviderStandin::start(vec![
        Reply::call(
            "d1",
            "delegate",
            &delegate_args(&tasks, json!({ "sandbox": "new" })),
        ),
        Reply::text("all three reported"),
    ])?;
    for who in ["alpha", "beta", "gamma"] {
        s.route(
            &format!("TASK-{who}"),
            vec![
                Reply::call(
                    "c1",
                    "terminal",
                    &json!({ "command": format!("sleep 8; echo {who} on $BERTH_SANDBOX") })
                        .to_string(),
                ),
                Reply::text(&format!("{who} is done")),
            ],
        );
    }
    let url = s.url();
    let t0 = Instant::now();
    let o = run_cmd(
        d,
        &url,
        &["--backend", "docker", "--sandbox", &name, "fan out"],
    )
    .output()?;
    let wall = t0.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["reason"], "done", "{exit}");
    // Parent: 2 model calls; each child: 2. The parent's spend is all of it.
    assert_eq!(exit["steps"], 8, "{exit}");
    let parent = exit["run_id"].as_str().unwrap_or_default().to_string();
    // The three answers came back in the parent's one turn.
    let reqs = s.requests();
    let last = reqs
        .iter()
        .rfind(|r| {
            tool_results(r)
                .first()
                .is_some_and(|t| t.contains("sub-agent 1 of 3"))
        })
        .ok_or("the parent was never sent the children's results")?;
    let result = &tool_results(last)[0];
    for who in ["alpha", "beta", "gamma"] {
        assert!(result.contains(&format!("{who} is done")), "{result}");
    }
    // Three child runs, each on a new docker sandbox, now removed.
    let kids = children_of(d, &parent);
    assert_eq!(kids.len(), 3, "{kids:?}");
    let mut intervals = Vec::new();
    for k in &kids {
        assert_eq!(k["state"], "done", "{k}");
        assert_eq!(k["backend"], "docker");
        let sb = k["sandbox"].as_str().unwrap_or_default();
        assert!(sb.starts_with("child-"), "{k}");
        assert_ne!(sb, name);
        let run = show(d, k["id"].as_str().unwrap_or_default())?;
        let call = &run["calls"][0];
        assert_eq!(call["state"], "finished", "{call}");
        intervals.push((
            call["started_ms"].as_i64().unwrap_or(0),
            call["ended_ms"].as_i64().unwrap_or(0),
        ));
        let o = berth(d, &["sandbox", "ls", "--backend", "docker", "--json"])?;
        assert!(!text(&o.stdout).contains(sb), "{sb} was not removed");
    }
    // At once: every child's command started before any of them ended.
    let first_end = intervals.iter().map(|i| i.1).min().unwrap_or(0);
    assert!(
        intervals.iter().all(|i| i.0 < first_end),
        "the children ran one after another: {intervals:?}"
    );
    eprintln!("three 8 s children took {wall:?} in all");
    // The tree.
    let o = berth(d, &["runs", "ls"])?;
    let listing = text(&o.stdout);
    assert_eq!(listing.matches("└ ").count(), 3, "{listing}");
    Ok(())
}

/// More children in one turn than the policy allows: the model is told the
/// cap, and nothing starts.
#[test]
fn a_fan_out_beyond_the_cap_is_refused_to_the_model() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    std::fs::write(d.join("policy.toml"), "[agent]\nmax_fanout = 2\n")?;
    let s = ProviderStandin::start(vec![
        Reply::calls(&[
            ("d1", "delegate", &delegate_args(&["one", "two"], json!({}))),
            ("d2", "delegate", &delegate_args(&["three"], json!({}))),
        ]),
        Reply::text("I will do it myself"),
    ])?;
    let o = run_cmd(d, &s.url(), &["too wide"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let reqs = s.requests();
    assert_eq!(reqs.len(), 2, "a child asked the model");
    let results = tool_results(&reqs[1]);
    assert_eq!(results.len(), 2);
    for r in &results {
        assert!(r.contains("3 sub-agents") && r.contains("at most 2"), "{r}");
        assert!(r.contains("max_fanout"), "{r}");
    }
    assert_eq!(runs(d).len(), 1, "a child run was made");
    // The delegate tool is in the parent's tools, and the calls are journaled
    // as answered, not run.
    let tools = reqs[0].body["tools"].to_string();
    assert!(tools.contains("delegate"), "{tools}");
    Ok(())
}

/// A sub-agent at the policy's last level gets no `delegate` tool, and a
/// depth of 0 turns delegation off.
#[test]
fn depth_caps_who_may_delegate() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    std::fs::write(d.join("policy.toml"), "[agent]\nmax_depth = 1\n")?;
    let s = ProviderStandin::start(vec![
        Reply::call("d1", "delegate", &delegate_args(&["TASK-leaf"], json!({}))),
        Reply::text("done"),
    ])?;
    s.route(
        "TASK-leaf",
        vec![
            Reply::call("x", "delegate", &delegate_args(&["deeper"], json!({}))),
            Reply::text("leaf done alone"),
        ],
    );
    let o = run_cmd(d, &s.url(), &["depth"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let reqs = s.requests();
    // The child's tools lack delegate; its try is refused as an unknown tool.
    let child_req = reqs
        .iter()
        .find(|r| {
            r.body["messages"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["role"] == "user"))
                .is_some_and(|m| m["content"].to_string().contains("TASK-leaf"))
        })
        .ok_or("no request of the child")?;
    assert!(!child_req.body["tools"].to_string().contains("\"delegate\""));
    let child_second = reqs
        .iter()
        .filter(|r| {
            r.body["messages"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["role"] == "user"))
                .is_some_and(|m| m["content"].to_string().contains("TASK-leaf"))
        })
        .nth(1)
        .ok_or("the child asked once")?;
    let r = tool_results(child_second);
    assert!(r[0].contains("no tool `delegate`"), "{r:?}");
    // Depth 0: no delegate tool at all.
    std::fs::write(d.join("policy.toml"), "[agent]\nmax_depth = 0\n")?;
    let s = ProviderStandin::start(vec![Reply::text("alone")])?;
    let o = run_cmd(d, &s.url(), &["flat"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !s.requests()[0].body["tools"]
            .to_string()
            .contains("\"delegate\"")
    );
    Ok(())
}

/// The processes whose command line is exactly `argv`.
fn procs_running(argv: &[&str]) -> usize {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|p| std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == want))
                .count()
        })
        .unwrap_or(0)
}

/// Ctrl-C on the parent stops every child's command, and every run is
/// saved interrupted.
#[test]
fn cancelling_the_parent_stops_every_childs_command() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![Reply::call(
        "d1",
        "delegate",
        &delegate_args(&["TASK-one", "TASK-two"], json!({})),
    )])?;
    // Sleeps no other test runs, so they can be counted.
    for (who, secs) in [("one", "6171"), ("two", "6172")] {
        s.route(
            &format!("TASK-{who}"),
            vec![Reply::call(
                "c",
                "terminal",
                &json!({ "command": format!("sleep {secs}; echo late > late-{who}") }).to_string(),
            )],
        );
    }
    let child = run_cmd(d, &s.url(), &["cancel me"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut child = KillOnDrop(child);
    wait_for("both children's sleeps", Duration::from_secs(60), || {
        procs_running(&["sleep", "6171"]) == 1 && procs_running(&["sleep", "6172"]) == 1
    })?;
    let status = crate::agent::ctrl_c(&mut child.0)?;
    assert_eq!(status.code(), Some(130));
    assert_eq!(procs_running(&["sleep", "6171"]), 0);
    assert_eq!(procs_running(&["sleep", "6172"]), 0);
    let parent = only_parent(d).ok_or("no parent run")?;
    assert_eq!(show(d, &parent)?["run"]["state"], "interrupted");
    for k in children_of(d, &parent) {
        assert_eq!(k["state"], "interrupted", "{k}");
        let run = show(d, k["id"].as_str().unwrap_or_default())?;
        assert_eq!(run["calls"][0]["result"]["detail"]["interrupted"], true);
    }
    Ok(())
}

fn only_parent(state: &Path) -> Option<String> {
    runs(state)
        .into_iter()
        .find(|r| r["kind"].is_null())
        .and_then(|r| r["id"].as_str().map(str::to_string))
}

/// `kill -9` of berth while one child has ended and another runs a
/// command; `--resume` of the parent resumes the unfinished child (its
/// cut-off call reported, not rerun), never reruns the ended one, and the
/// parent finishes with both answers.
#[test]
fn kill_9_mid_fan_out_then_resume_runs_no_tool_call_twice() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![Reply::call(
        "d1",
        "delegate",
        &delegate_args(&["TASK-quick", "TASK-slow"], json!({})),
    )])?;
    s.route(
        "TASK-quick",
        vec![
            Reply::call("q", "terminal", r#"{"command": "echo Q >> marks"}"#),
            Reply::text("quick is done"),
        ],
    );
    s.route(
        "TASK-slow",
        vec![
            Reply::call(
                "w",
                "terminal",
                r#"{"command": "echo W >> marks; sleep 6173"}"#,
            ),
            Reply::text("slow was cut off and stopped"),
        ],
    );
    let child = run_cmd(d, &s.url(), &["two children"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut child = KillOnDrop(child);
    let mut parent = String::new();
    wait_for(
        "quick done and slow running",
        Duration::from_secs(60),
        || {
            let Some(p) = only_parent(d) else {
                return false;
            };
            parent = p;
            let kids = children_of(d, &parent);
            kids.len() == 2
                && kids.iter().any(|k| k["state"] == "done")
                && procs_running(&["sleep", "6173"]) == 1
        },
    )?;
    child.0.kill()?; // SIGKILL
    child.0.wait()?;
    assert_eq!(show(d, &parent)?["run"]["state"], "running");
    let quick_asks = s.requests().len();
    s.push(vec![Reply::text("both reported")]);
    let o = berth(d, &["run", "--json", "--resume", &parent])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["reason"], "done", "{exit}");
    // The quick child was not asked again: only the slow one and the parent.
    let after: Vec<_> = s.requests().into_iter().skip(quick_asks).collect();
    assert_eq!(
        after.len(),
        2,
        "the model was asked {} times after the resume",
        after.len()
    );
    // The slow child heard its call was cut off.
    let slow = tool_results(&after[0]);
    assert!(slow[0].contains("cut off"), "{slow:?}");
    // The parent got both answers in its one delegate result.
    let r = tool_results(&after[1]);
    assert!(
        r[0].contains("quick is done") && r[0].contains("slow was cut off"),
        "{r:?}"
    );
    // No command ran twice.
    assert_eq!(started(d, "echo Q >> marks"), 1);
    assert_eq!(started(d, "echo W >> marks"), 1);
    let o = berth(d, &["exec", "--", "sort marks"])?;
    assert_eq!(text(&o.stdout), "Q\nW\n");
    for k in children_of(d, &parent) {
        assert_eq!(k["state"], "done", "{k}");
    }
    Ok(())
}

/// A sub-agent whose model fails is its parent's tool result, not a crash:
/// the parent hears which child failed and why, and finishes.
#[test]
fn a_child_that_fails_is_a_result_not_a_crash() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![
        Reply::call(
            "d1",
            "delegate",
            &delegate_args(&["TASK-fine", "TASK-broken"], json!({})),
        ),
        Reply::text("one of two failed"),
    ])?;
    s.route("TASK-fine", vec![Reply::text("fine")]);
    // Its script is empty: the stand-in answers every request with a 500.
    s.route("TASK-broken", vec![]);
    let o = run_cmd(d, &s.url(), &["one fails"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(exit_event(&o)["reason"], "done");
    let parent = only_parent(d).ok_or("no parent run")?;
    let states: Vec<String> = children_of(d, &parent)
        .iter()
        .map(|k| k["state"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(states.len(), 2);
    assert!(states.contains(&"done".to_string()), "{states:?}");
    assert!(
        states.contains(&"provider_failed".to_string()),
        "{states:?}"
    );
    let run = show(d, &parent)?;
    let call = &run["calls"][0];
    assert_eq!(call["state"], "finished", "{call}");
    let result = run["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["message"]["tool_call_id"] == "d1"))
        .map(|m| m["message"]["text"].as_str().unwrap_or("").to_string())
        .unwrap_or_default();
    assert!(result.contains("fine"), "{result}");
    assert!(
        result.contains("provider_failed") && result.contains("without an answer"),
        "{result}"
    );
    Ok(())
}

/// A parent's budget bounds its whole tree (#49 item 12): children that
/// delegate again, at every level, make no more model calls in all than
/// the parent's `--max-steps` (and its own last summary), and with too
/// little left to give each child a step and its summary, nothing starts.
#[test]
fn a_parents_budget_bounds_every_model_call_of_its_tree() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    std::fs::write(
        d.join("policy.toml"),
        "[agent]\nmax_depth = 3\nmax_fanout = 8\n",
    )?;
    let grand: Vec<&str> = vec!["GRAND-x"; 8];
    let s = ProviderStandin::start(vec![
        Reply::call(
            "d1",
            "delegate",
            &delegate_args(&["CHILD-a", "CHILD-b", "CHILD-c"], json!({})),
        ),
        Reply::text("parent done"),
    ])?;
    // Every child delegates eight more; every grandchild runs a command.
    s.route(
        "CHILD-",
        (0..200)
            .map(|i| {
                Reply::call(
                    &format!("c{i}"),
                    "delegate",
                    &delegate_args(&grand, json!({})),
                )
            })
            .collect(),
    );
    s.route(
        "GRAND-",
        (0..400)
            .map(|i| {
                Reply::call(
                    &format!("g{i}"),
                    "terminal",
                    &json!({ "command": "echo grand-ran" }).to_string(),
                )
            })
            .collect(),
    );
    s.on_tools_off(Reply::text("summary: out of budget"));
    let o = run_cmd(d, &s.url(), &["--max-steps", "7", "tree"]).output()?;
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert_eq!(exit_event(&o)["reason"], "budget_spent");
    let calls = s.requests().len();
    assert!(
        calls <= 8,
        "--max-steps 7 made {calls} model calls in its tree (at most 7 and the parent's summary)"
    );
    let commands = started(d, "echo grand-ran");
    assert_eq!(commands, 0, "grandchildren ran with no budget left");
    // Too little for the fan-out: refused, nothing started.
    let s = ProviderStandin::start(vec![
        Reply::call(
            "d1",
            "delegate",
            &delegate_args(&["GRAND-1", "GRAND-2", "GRAND-3"], json!({})),
        ),
        Reply::text("did it myself"),
    ])?;
    s.on_tools_off(Reply::text("summary"));
    let before = runs(d).len();
    let o = run_cmd(d, &s.url(), &["--max-steps", "2", "wide"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        s.requests().len() <= 3,
        "{} model calls",
        s.requests().len()
    );
    assert_eq!(runs(d).len(), before + 1, "a child run was made");
    let reqs = s.requests();
    let r = tool_results(&reqs[1]);
    assert!(r[0].contains("budget left"), "{r:?}");
    Ok(())
}
