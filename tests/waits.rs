//! Triggers end to end: a run that waits (`wait_for`, `berth run --on`)
//! holds no process and makes no model call while it waits; the real
//! `berth serve` holds the wait, across a restart of its own, and resumes
//! the run when the job ends or prints the pattern.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use berth_standins::provider::{ProviderStandin, Reply};
use serde_json::Value;

use crate::agent::{KEY, Strays, cmd, exit_event, run_cmd, show, text, tool_results, wait_for};
use crate::support::TestResult;

fn berth(state: &Path, args: &[&str]) -> std::io::Result<Output> {
    cmd(state, args)
        .env("BERTH_SERVER", "auto")
        .env_remove("BERTH_SERVER_IDLE")
        .output()
}

fn run(state: &Path, url: &str, extra: &[&str]) -> std::io::Result<Output> {
    run_cmd(state, url, extra)
        .env("BERTH_SERVER", "auto")
        .env_remove("BERTH_SERVER_IDLE")
        .output()
}

fn job_ended_ms(state: &Path, name: &str) -> Option<i64> {
    let o = berth(state, &["job", "ls", "--json"]).ok()?;
    let jobs: Vec<Value> = serde_json::from_slice(&o.stdout).ok()?;
    jobs.into_iter()
        .find(|j| j["name"] == name)
        .and_then(|j| j["ended_at"].as_i64())
}

/// The run's state, from its journal.
fn state_of(state: &Path, id: &str) -> String {
    show(state, id)
        .map(|v| v["run"]["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

#[test]
fn a_run_waits_on_a_job_with_no_model_call_and_wakes_when_it_ends() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let o = berth(
        d,
        &[
            "job",
            "start",
            "--name",
            "build",
            "--",
            "sleep 6; echo built",
        ],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = ProviderStandin::start(vec![
        Reply::call("w1", "wait_for", r#"{"job": "build", "timeout": 120}"#),
        Reply::text("the build finished"),
    ])?;
    let o = run(d, &s.url(), &["wait for the build"])?;
    // The run stops waiting: exit 5, one model call.
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
    let exit = exit_event(&o);
    assert_eq!(exit["reason"], "waiting", "{exit}");
    let id = exit["run_id"].as_str().unwrap_or_default().to_string();
    assert_eq!(s.requests().len(), 1);
    // While it waits: no model call, and no process of the run's own.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(state_of(d, &id), "waiting");
    assert_eq!(s.requests().len(), 1, "a model call while waiting");
    // The server says what it holds.
    let o = berth(d, &["server", "status", "--json"])?;
    let st: Value = serde_json::from_slice(&o.stdout)?;
    let held = st["waits"].as_array().cloned().unwrap_or_default();
    assert!(held.iter().any(|w| w["run"] == id.as_str()), "{st}");
    wait_for(
        "the run to finish after the job",
        Duration::from_secs(60),
        || state_of(d, &id) == "done",
    )?;
    let reqs = s.requests();
    assert_eq!(reqs.len(), 2);
    let r = tool_results(&reqs[1]);
    assert!(
        r[0].contains("ended") && r[0].contains("exit code 0"),
        "{r:?}"
    );
    // How soon after the job's end the run asked the model again.
    let ended = job_ended_ms(d, "build").ok_or("the job has no end time")?;
    let run = show(d, &id)?;
    let step2 = run["steps"][1]["started_ms"].as_i64().unwrap_or(0);
    assert!(step2 >= ended, "the run went on before the job ended");
    eprintln!("woke {} ms after the job ended", step2 - ended);
    assert!(!serde_json::to_string(&run)?.contains(KEY));
    Ok(())
}

#[test]
fn a_watch_match_wakes_the_run_across_a_server_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let o = berth(
        d,
        &[
            "job",
            "start",
            "--name",
            "tests",
            "--",
            "sleep 5; echo 'step 3 FAILED'; sleep 120",
        ],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = ProviderStandin::start(vec![
        Reply::call(
            "w1",
            "wait_for",
            r#"{"job": "tests", "pattern": "FAIL(ED)?$", "timeout": 300}"#,
        ),
        Reply::text("a step failed"),
    ])?;
    let o = run(d, &s.url(), &["watch the tests"])?;
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
    let id = exit_event(&o)["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The server goes away while the run waits, and a new one takes over.
    let o = berth(d, &["server", "stop"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(state_of(d, &id), "waiting");
    let o = berth(d, &["job", "ls"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for("the match to wake the run", Duration::from_secs(60), || {
        state_of(d, &id) == "done"
    })?;
    let reqs = s.requests();
    assert_eq!(reqs.len(), 2);
    let r = tool_results(&reqs[1]);
    assert!(
        r[0].contains("matched") && r[0].contains("step 3 FAILED"),
        "{r:?}"
    );
    // The job itself still runs: the match, not its end, woke the run.
    let o = berth(d, &["job", "ls", "--json"])?;
    assert!(
        text(&o.stdout).contains("\"running\""),
        "{}",
        text(&o.stdout)
    );
    let _ = berth(d, &["job", "kill", "tests"]);
    Ok(())
}

#[test]
fn a_person_puts_a_run_to_sleep_until_a_job_ends() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![
        Reply::text("started; tell me when it is built"),
        Reply::text("noted: built"),
    ])?;
    let o = run(d, &s.url(), &["start"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let id = exit_event(&o)["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let o = berth(d, &["job", "start", "--name", "build", "--", "sleep 3"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Bad input first: an unknown event and an unknown job.
    let o = berth(d, &["run", "--resume", &id, "--on", "tomorrow"])?;
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("job:ID"), "{}", text(&o.stderr));
    let o = berth(d, &["run", "--resume", &id, "--on", "job:nosuch"])?;
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("nosuch"), "{}", text(&o.stderr));
    let o = berth(d, &["run", "--resume", &id, "--on", "job:build"])?;
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
    assert_eq!(state_of(d, &id), "waiting");
    wait_for("the run to carry on", Duration::from_secs(60), || {
        state_of(d, &id) == "done" && s.requests().len() == 2
    })?;
    let last = s.requests()[1].body["messages"].to_string();
    assert!(
        last.contains("waited as asked") && last.contains("ended"),
        "{last}"
    );
    Ok(())
}

/// `wait_for` names an approval by id: only one of the run's own sandbox
/// (#49 item 17). Another sandbox's approval is not found, neither waited
/// on nor told of (its answer stays unknown to the run).
#[test]
fn wait_for_refuses_another_sandboxs_approval() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    std::fs::write(
        d.join("policy.toml"),
        "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"creates files\"\n",
    )?;
    let o = berth(d, &["sandbox", "create", "other"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let asker = cmd(
        d,
        &["exec", "--sandbox", "other", "--", "touch secret-plan.txt"],
    )
    .env("BERTH_SERVER", "auto")
    .env_remove("BERTH_SERVER_IDLE")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()?;
    let _asker = crate::agent::KillOnDrop(asker);
    let mut id = 0;
    wait_for(
        "the other sandbox's approval",
        Duration::from_secs(30),
        || {
            let o = berth(d, &["approvals", "ls", "--json"]);
            id = o
                .ok()
                .and_then(|o| {
                    text(&o.stdout)
                        .lines()
                        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                        .find(|v| v["sandbox"] == "other")
                })
                .and_then(|v| v["id"].as_i64())
                .unwrap_or(0);
            id > 0
        },
    )?;
    let o = berth(d, &["deny", &id.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = ProviderStandin::start(vec![
        Reply::call(
            "w1",
            "wait_for",
            &format!(r#"{{"approval": {id}, "timeout": 60}}"#),
        ),
        Reply::text("not mine"),
    ])?;
    let o = run(d, &s.url(), &["wait on it"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let reqs = s.requests();
    assert_eq!(reqs.len(), 2);
    let r = tool_results(&reqs[1]);
    assert!(
        r[0].contains(&format!("no approval #{id} in this sandbox")),
        "{r:?}"
    );
    assert!(!r[0].contains("denied"), "{r:?}");
    Ok(())
}
