//! Schedules end to end: the real `berth serve` starts `berth run` on a
//! cron expression (with seconds, so the test takes seconds, not minutes),
//! across a restart of its own, never two runs of one schedule at once, and
//! slots missed while no server ran follow the schedule's policy.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use berth_core::store::{Store, now_ms};
use berth_standins::provider::{ProviderStandin, Reply};
use serde_json::Value;

use crate::agent::{Strays, cmd, text, wait_for};
use crate::support::TestResult;

fn berth(state: &Path, args: &[&str]) -> std::io::Result<Output> {
    cmd(state, args)
        .env("BERTH_SERVER", "auto")
        .env_remove("BERTH_SERVER_IDLE")
        .output()
}

fn config(state: &Path, s: &ProviderStandin) -> std::io::Result<()> {
    std::fs::write(
        state.join("config.toml"),
        format!(
            "[[providers]]\nname = \"standin\"\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"STANDIN_KEY\"\n",
            s.url()
        ),
    )
}

/// `berth schedule ls --json`: each schedule and its recent slots.
fn schedules(state: &Path) -> Vec<Value> {
    berth(state, &["schedule", "ls", "--json"])
        .map(|o| crate::agent::events(&o))
        .unwrap_or_default()
}

fn outcomes(state: &Path, name: &str) -> Vec<String> {
    schedules(state)
        .into_iter()
        .find(|s| s["schedule"]["name"] == name)
        .and_then(|s| s["recent"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .rev()
        .filter_map(|f| f["outcome"].as_str().map(str::to_string))
        .collect()
}

/// Every run, as `berth runs ls --json` lists them.
fn runs_of(state: &Path) -> Vec<Value> {
    berth(state, &["runs", "ls", "--json"])
        .map(|o| crate::agent::events(&o))
        .unwrap_or_default()
}

#[test]
fn a_schedule_fires_on_time_across_a_restart_and_never_overlaps() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![])?;
    s.route(
        "TASK-nightly",
        vec![
            // The first run outlasts the next slot.
            Reply::call("c1", "terminal", r#"{"command": "sleep 7"}"#),
            Reply::text("first done"),
            Reply::text("second done"),
            Reply::text("third done"),
        ],
    );
    config(d, &s)?;
    let o = berth(
        d,
        &[
            "schedule",
            "add",
            "nightly",
            "--cron",
            "*/5 * * * * *",
            "--provider",
            "standin",
            "TASK-nightly: check the backups",
        ],
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Any served call starts the server, which holds the schedule.
    let o = berth(d, &["job", "ls"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for("the first run", Duration::from_secs(30), || {
        outcomes(d, "nightly").contains(&"started".to_string())
    })?;
    // A restart while the first run goes.
    let o = berth(d, &["server", "stop"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = berth(d, &["job", "ls"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for(
        "a second run after an overlap",
        Duration::from_secs(60),
        || {
            let o = outcomes(d, "nightly");
            o.iter().filter(|x| *x == "started").count() >= 2 && o.iter().any(|x| x == "overlap")
        },
    )?;
    let o = berth(d, &["schedule", "pause", "nightly"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for("the runs to end", Duration::from_secs(60), || {
        runs_of(d).iter().all(|r| r["state"] == "done")
    })?;
    let mut runs = runs_of(d);
    runs.sort_by_key(|r| r["created_ms"].as_i64());
    assert!(runs.len() >= 2, "{runs:?}");
    // Never two at once: each run ended before the next began.
    for w in runs.windows(2) {
        assert!(
            w[0]["updated_ms"].as_i64() <= w[1]["created_ms"].as_i64(),
            "two runs of one schedule overlapped: {w:?}"
        );
    }
    // On time: each start is at or just after its slot.
    let list = schedules(d);
    for f in list[0]["recent"].as_array().cloned().unwrap_or_default() {
        let (slot, fired) = (
            f["slot_ms"].as_i64().unwrap_or(0),
            f["fired_ms"].as_i64().unwrap_or(0),
        );
        assert!(fired >= slot, "{f}");
        eprintln!(
            "slot {} {} {} ms after it",
            slot,
            f["outcome"],
            fired - slot
        );
    }
    let o = berth(d, &["schedule", "rm", "nightly"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    Ok(())
}

#[test]
fn missed_slots_follow_the_schedules_policy_and_bad_input_says_what_to_do() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let s = ProviderStandin::start(vec![])?;
    s.route("TASK-catch", vec![Reply::text("caught up")]);
    config(d, &s)?;
    for (name, missed, task) in [
        ("skipper", "skip", "TASK-skip"),
        ("catcher", "once", "TASK-catch"),
    ] {
        let o = berth(
            d,
            &[
                "schedule",
                "add",
                name,
                "--cron",
                "0 0 1 1 *",
                "--missed",
                missed,
                "--provider",
                "standin",
                task,
            ],
        )?;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    // Both were due two minutes ago, while no server ran.
    let store = Store::open(d)?;
    store.with_db(&berth_schedules::TABLES, |c| {
        c.execute(
            "UPDATE schedules SET next_ms = ?1",
            rusqlite::params![now_ms() - 120_000],
        )?;
        Ok(())
    })?;
    drop(store);
    let o = berth(d, &["job", "ls"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for(
        "both missed slots dealt with",
        Duration::from_secs(30),
        || outcomes(d, "skipper") == ["missed"] && outcomes(d, "catcher") == ["started"],
    )?;
    wait_for("the catch-up run", Duration::from_secs(30), || {
        runs_of(d).iter().any(|r| r["state"] == "done")
    })?;
    let runs = runs_of(d);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(
        runs[0]["task"]
            .as_str()
            .unwrap_or("")
            .contains("TASK-catch")
    );
    // Bad input.
    for (args, says) in [
        (
            vec!["schedule", "add", "x", "--cron", "every night", "t"],
            "5 fields",
        ),
        (
            vec![
                "schedule",
                "add",
                "x",
                "--cron",
                "0 2 * * *",
                "--tz",
                "Mars/Base",
                "t",
            ],
            "IANA",
        ),
        (
            vec!["schedule", "add", "catcher", "--cron", "0 2 * * *", "t"],
            "exists",
        ),
        (vec!["schedule", "rm", "nosuch"], "berth schedule ls"),
    ] {
        let o = berth(d, &args)?;
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        assert!(
            text(&o.stderr).contains(says),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
    Ok(())
}

/// Unattended: `berth serve --idle 0` never idles out, says so, and a
/// SIGTERM (systemd's stop) ends it cleanly.
#[test]
fn serve_idle_0_stays_up_and_stops_cleanly_on_sigterm() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let child = cmd(d, &["serve", "--idle", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut child = crate::agent::KillOnDrop(child);
    wait_for("the server to listen", Duration::from_secs(30), || {
        berth(d, &["server", "status"])
            .is_ok_and(|o| text(&o.stdout).contains("never exits when idle"))
    })?;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.0.try_wait()? {
            break st;
        }
        if std::time::Instant::now() > end {
            return Err("berth serve did not stop on SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let o = berth(d, &["server", "status", "--json"])?;
    assert!(
        text(&o.stdout).contains("\"running\":false"),
        "{}",
        text(&o.stdout)
    );
    Ok(())
}
