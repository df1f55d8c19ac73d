//! Checkpoints through the CLI and the agent loop: a fork at a step runs in a
//! clone that holds the sandbox as that step left it, a rollback restores the
//! run's own sandbox and carries on, and the faults: a busy sandbox, a
//! checkpoint killed mid-way, a cap, retention. The per-backend semantics
//! are in the conformance suite.

use std::path::Path;
use std::time::{Duration, Instant};

use berth_standins::provider::{ProviderStandin, Reply};
use serde_json::Value;

use crate::agent::{berth, cmd, exit_event, run_cmd, show, text};
use crate::support::TestResult;

fn ok(d: &Path, args: &[&str]) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let o = berth(d, args)?;
    if o.status.code() != Some(0) {
        return Err(format!("berth {args:?} failed: {}", text(&o.stderr)).into());
    }
    Ok(text(&o.stdout))
}

fn json(d: &Path, args: &[&str]) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    Ok(serde_json::from_str(&ok(d, args)?)?)
}

#[test]
fn a_fork_at_step_2_runs_in_a_clone_that_still_has_what_step_3_deleted_and_a_rollback_carries_on()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let s = ProviderStandin::start(vec![
        // The run: step 3 deletes a file steps 1 and 2 made.
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "echo data > keep.txt && echo v1 > note.txt"}"#,
        ),
        Reply::call(
            "c2",
            "write_file",
            r#"{"path": "note.txt", "content": "v2\n"}"#,
        ),
        Reply::call(
            "c3",
            "terminal",
            r#"{"command": "rm keep.txt && echo v3 > note.txt"}"#,
        ),
        Reply::text("original end"),
        // The fork's step 3.
        Reply::call("f1", "terminal", r#"{"command": "cat keep.txt note.txt"}"#),
        Reply::text("forked end"),
        // After the rollback.
        Reply::call("r1", "terminal", r#"{"command": "cat keep.txt note.txt"}"#),
        Reply::text("rolled end"),
    ])?;
    let o = run_cmd(d, &s.url(), &["clean up"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let id = exit_event(&o)["run_id"].as_str().unwrap_or("").to_string();
    let run = show(d, &id)?;
    let steps: Vec<i64> = run["checkpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["step"].as_i64())
        .collect();
    assert_eq!(
        steps,
        vec![0, 1, 2, 3],
        "a checkpoint before the run and after each writing step"
    );
    let human = ok(d, &["runs", "show", &id])?;
    assert!(human.contains("◆ checkpoint"), "{human}");

    // The fork: a clone at step 2, side by side with the original.
    let o = berth(d, &["run", "--json", "--fork", &id, "--at", "2"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("a clone of"),
        "{}",
        text(&o.stderr)
    );
    let fork = exit_event(&o)["run_id"].as_str().unwrap_or("").to_string();
    assert_eq!(exit_event(&o)["answer"], "forked end");
    let fork_sb = show(d, &fork)?["run"]["sandbox"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert_eq!(fork_sb, format!("fork-{fork}"));
    let reqs = s.requests();
    let seen = crate::agent::tool_results(&reqs[5]);
    assert!(
        seen.last()
            .is_some_and(|r| r.contains("data") && r.contains("v2")),
        "the fork's command saw {seen:?}"
    );
    // The original's sandbox is as step 3 left it.
    let now = ok(d, &["exec", "--", "ls; cat note.txt"])?;
    assert!(!now.contains("keep.txt") && now.contains("v3"), "{now}");

    // A rollback of the original to step 2 restores its own sandbox and carries on.
    let o = berth(d, &["runs", "rollback", &id, "--to", "2", "--json"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(exit_event(&o)["answer"], "rolled end");
    let seen = crate::agent::tool_results(&s.requests()[7]);
    assert!(
        seen.last()
            .is_some_and(|r| r.contains("data") && r.contains("v2")),
        "after the rollback the command saw {seen:?}"
    );
    let run = show(d, &id)?;
    assert_eq!(run["rollbacks"][0]["to_step"], 2);
    let marked: Vec<i64> = run["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["rolled_back"] == true)
        .filter_map(|m| m["step"].as_i64())
        .collect();
    assert!(
        !marked.is_empty() && marked.iter().all(|s| (3..=4).contains(s)),
        "{marked:?}"
    );
    // The transcript sent after the rollback has steps 1 and 2, not 3 and 4.
    let sent = serde_json::to_string(&s.requests()[6].body["messages"])?;
    assert!(
        sent.contains("c2") && !sent.contains("c3") && !sent.contains("original end"),
        "{sent}"
    );

    // Bad input.
    let o = berth(d, &["runs", "rollback", &id, "--to", "99"])?;
    assert_ne!(o.status.code(), Some(0));
    assert!(
        text(&o.stderr).contains("--to takes a step"),
        "{}",
        text(&o.stderr)
    );
    Ok(())
}

#[test]
fn a_busy_sandbox_is_refused_unless_forced_and_a_killed_checkpoint_leaves_nothing_half()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    ok(d, &["sandbox", "create", "ck"])?;
    ok(d, &["exec", "--sandbox", "ck", "--", "echo one > a.txt"])?;
    let c = json(
        d,
        &["sandbox", "checkpoint", "ck", "--label", "first", "--json"],
    )?;
    let first = c["id"].as_str().unwrap_or("").to_string();
    ok(d, &["exec", "--sandbox", "ck", "--", "echo two > a.txt"])?;

    // A command runs in the sandbox's session (in the server): a restore
    // names it and is refused; --force interrupts it.
    let mut long = cmd(d, &["exec", "--sandbox", "ck", "--", "sleep 120"]).spawn()?;
    crate::agent::wait_for("the command to start", Duration::from_secs(30), || {
        ok(d, &["events", "--json", "--limit", "5"])
            .is_ok_and(|e| e.contains("exec.started") && e.contains("sleep 120"))
    })?;
    let o = berth(d, &["sandbox", "restore", "ck", &first])?;
    let err = text(&o.stderr);
    assert!(
        o.status.code() != Some(0) && err.contains("session `main` runs `sleep 120`"),
        "{err}"
    );
    ok(d, &["sandbox", "restore", "ck", &first, "--force"])?;
    let ended = long.wait()?;
    assert_eq!(
        ended.code(),
        Some(130),
        "the forced restore did not interrupt it"
    );
    assert_eq!(
        ok(d, &["exec", "--sandbox", "ck", "--", "cat a.txt"])?,
        "one\n"
    );
    ok(d, &["exec", "--sandbox", "ck", "--", "echo two > a.txt"])?;

    // A job runs: a restore names it and is refused; --force stops it.
    let job = ok(
        d,
        &["exec", "--sandbox", "ck", "--background", "--", "sleep 300"],
    )?
    .trim()
    .to_string();
    let o = berth(d, &["sandbox", "restore", "ck", &first])?;
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("busy") && err.contains(&job) && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        ok(d, &["exec", "--sandbox", "ck", "--", "cat a.txt"])?,
        "two\n"
    );
    let r = json(
        d,
        &["sandbox", "restore", "ck", &first, "--force", "--json"],
    )?;
    assert!(r["stopped"].to_string().contains(&job), "{r}");
    assert_eq!(
        ok(d, &["exec", "--sandbox", "ck", "--", "cat a.txt"])?,
        "one\n"
    );
    // The job ended: a wait returns its end, not the wait's timeout (124).
    let w = berth(d, &["job", "wait", &job, "--timeout", "30"])?;
    assert_ne!(
        w.status.code(),
        Some(124),
        "the forced restore left the job running"
    );

    // A checkpoint killed mid-pack: no half checkpoint in the list, and the
    // next one and a restore work.
    ok(
        d,
        &[
            "exec",
            "--sandbox",
            "ck",
            "--",
            "head -c 400000000 /dev/urandom > big.bin",
        ],
    )?;
    let packs = d.join("sandboxes/local/ck/.berth/packs");
    let mut child = cmd(d, &["sandbox", "checkpoint", "ck"])
        .env("BERTH_SERVER", "off")
        .spawn()?;
    let t0 = Instant::now();
    let mut caught = false;
    while t0.elapsed() < Duration::from_secs(60) {
        // A new pack appears when packing starts; the checkpoint is recorded
        // only after it is whole, hashed and checked.
        let packing = std::fs::read_dir(&packs)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.ends_with(".tar") && n != format!("{first}.tar")
            });
        if packing {
            child.kill()?;
            caught = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = child.wait()?;
    assert!(
        caught,
        "the checkpoint was never seen packing (it ended {status})"
    );
    let list = json(d, &["sandbox", "checkpoints", "ck", "--json"])?;
    let ids: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str().map(String::from))
        .collect();
    assert_eq!(ids, vec![first.clone()], "a killed checkpoint left a row");
    // Wait for the orphaned tar to end, then take one whole.
    std::thread::sleep(Duration::from_secs(3));
    let c = json(d, &["sandbox", "checkpoint", "ck", "--json"])?;
    assert!(c["new_bytes"].as_i64().unwrap_or(0) >= 400_000_000, "{c}");
    ok(d, &["exec", "--sandbox", "ck", "--", "rm big.bin"])?;
    ok(
        d,
        &["sandbox", "restore", "ck", c["id"].as_str().unwrap_or("")],
    )?;
    assert_eq!(
        ok(d, &["exec", "--sandbox", "ck", "--", "stat -c %s big.bin"])?,
        "400000000\n"
    );

    // Over the cap: refused with what to do.
    std::fs::write(
        d.join("policy.toml"),
        "[checkpoints]\nmax_mb = 1\nkeep = 1\n",
    )?;
    ok(
        d,
        &[
            "exec",
            "--sandbox",
            "ck",
            "--",
            "head -c 3000000 /dev/urandom > mid.bin",
        ],
    )?;
    let o = berth(d, &["sandbox", "checkpoint", "ck"])?;
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("over the 1 MiB cap") && err.contains("mid.bin") && err.contains("max_mb"),
        "{err}"
    );
    // Retention: keep = 1 leaves the newest unlabelled and the labelled one.
    ok(d, &["exec", "--sandbox", "ck", "--", "rm mid.bin big.bin"])?;
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["id"].as_str().map(String::from))
            .collect()
    };
    let before = ids(&json(d, &["sandbox", "checkpoints", "ck", "--json"])?);
    // keep = 1: the next checkpoint lets the big one go, and gc finds the rest.
    ok(d, &["sandbox", "checkpoint", "ck"])?;
    let g = json(d, &["sandbox", "gc", "-b", "local", "--json"])?;
    assert!(g["checkpoints"].is_array(), "{g}");
    let left = json(d, &["sandbox", "checkpoints", "ck", "--json"])?;
    let labels: Vec<Value> = left
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["label"].clone())
        .collect();
    assert_eq!(labels.len(), 2, "{left}");
    assert_eq!(labels[0], "first");
    // The packs of the checkpoints retention let go are gone with them.
    let after = ids(&left);
    let went: Vec<&String> = before.iter().filter(|i| !after.contains(i)).collect();
    assert!(!went.is_empty(), "gc let no checkpoint go: {before:?}");
    for id in went {
        assert!(
            !packs.join(format!("{id}.tar")).exists(),
            "pack {id} outlived its checkpoint"
        );
    }

    // Bad input, and removal takes the checkpoints with it.
    let o = berth(d, &["sandbox", "restore", "ck", "knothere"])?;
    assert!(
        text(&o.stderr).contains("checkpoint `knothere` not found")
            && text(&o.stderr).contains("berth sandbox checkpoints ck"),
        "{}",
        text(&o.stderr)
    );
    ok(d, &["sandbox", "rm", "ck"])?;
    let left = json(d, &["sandbox", "checkpoints", "ck", "--json"])?;
    assert_eq!(left, Value::Array(vec![]));
    Ok(())
}

#[test]
fn a_clone_moves_files_and_session_to_another_backend() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    ok(d, &["sandbox", "create", "src"])?;
    ok(
        d,
        &[
            "exec",
            "--sandbox",
            "src",
            "--",
            "mkdir -p app && echo hi > app/x && cd app && export CLONED=yes",
        ],
    )?;
    // Enough paths that the lists berth sends its helpers (the changed
    // paths, the restore plan) travel as files, not in the command text.
    ok(
        d,
        &[
            "exec",
            "--sandbox",
            "src",
            "--",
            "mkdir -p ../many && (cd ../many && for i in $(seq 12000); do : > a-rather-long-file-name-$i.txt; done)",
        ],
    )?;
    // No --at: a checkpoint of the sandbox as it is now.
    let c = json(
        d,
        &["sandbox", "clone", "src", "dst", "--to", "docker", "--json"],
    )?;
    assert_eq!(c["backend"], "docker", "{c}");
    let out = ok(
        d,
        &[
            "exec",
            "--backend",
            "docker",
            "--sandbox",
            "dst",
            "--",
            "pwd; cat x; echo $CLONED; ls ../many | wc -l",
        ],
    );
    let cleanup = ok(d, &["sandbox", "rm", "dst", "--backend", "docker"]);
    assert_eq!(out?, "/workspace/app\nhi\nyes\n12000\n");
    cleanup?;
    // A clone onto a name in use is refused before anything is made.
    ok(d, &["sandbox", "create", "taken"])?;
    let o = berth(d, &["sandbox", "clone", "src", "taken"])?;
    assert!(
        text(&o.stderr).contains("already exists"),
        "{}",
        text(&o.stderr)
    );
    Ok(())
}

#[test]
fn bench_checkpoint_measures_each_kind_against_cp_and_tar() -> TestResult {
    let dir = tempfile::tempdir()?;
    let v = json(
        dir.path(),
        &["bench", "--checkpoint", "--size-mb", "8", "--json"],
    )?;
    let num = |k: &str| v[k].as_f64().ok_or(format!("{k} missing in {v}"));
    for k in [
        "cp_a_ms",
        "tar_ms",
        "full_ms",
        "incremental_ms",
        "unchanged_ms",
        "restore_ms",
    ] {
        assert!(num(k)? >= 0.0, "{k}: {v}");
    }
    assert!(num("full_bytes")? >= 8.0 * 1024.0 * 1024.0, "{v}");
    assert_eq!(v["incremental_changed"], 10, "{v}");
    assert_eq!(v["unchanged_bytes"], 0, "{v}");
    assert_eq!(v["restore_written"], 10, "{v}");
    // The bench sandbox is removed.
    let left = ok(dir.path(), &["sandbox", "ls"])?;
    assert!(!left.contains("berth-bench-checkpoint"), "{left}");
    Ok(())
}

/// A pack rewritten inside the sandbox (#49 item 18): the next checkpoint
/// finds it out, reports it, and stores the files it held anew instead of
/// depending on it, so that checkpoint restores; on every backend berth
/// checkpoints through the same code (local and docker here).
fn a_rewritten_pack_is_found_and_not_depended_on(backend: &str) -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let name = format!("ckt-{}-{backend}", std::process::id());
    ok(d, &["sandbox", "create", &name, "--backend", backend])?;
    let _guard = crate::agent::DockerSandbox {
        state: d,
        name: name.clone(),
    };
    let exec = |command: &str| {
        ok(
            d,
            &[
                "exec",
                "--backend",
                backend,
                "--sandbox",
                &name,
                "--",
                command,
            ],
        )
    };
    exec("echo one > a.txt; echo keep-this > k.txt")?;
    let c1 = json(
        d,
        &[
            "sandbox",
            "checkpoint",
            &name,
            "--backend",
            backend,
            "--json",
        ],
    )?;
    let c1 = c1["id"].as_str().unwrap_or("").to_string();
    // From inside: the same size, other bytes (in a subshell: the
    // session's cwd stays in the workspace).
    exec(&format!(
        "(cd \"$__berth_dir/packs\" && test -f {c1}.tar && sed -i 's/keep-this/KEEP-THIS/' {c1}.tar && grep -c KEEP-THIS {c1}.tar)"
    ))?;
    exec("echo two > b.txt")?;
    let c2 = json(
        d,
        &[
            "sandbox",
            "checkpoint",
            &name,
            "--backend",
            backend,
            "--json",
        ],
    )?;
    let c2 = c2["id"].as_str().unwrap_or("").to_string();
    // Reported.
    let events = ok(d, &["events", "--json", "--limit", "50"])?;
    let reported = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "checkpoint.taken")
        .filter_map(|e| serde_json::from_str::<Value>(e["detail"].as_str()?).ok())
        .any(|dt| {
            dt["checkpoint"] == c2.as_str() && dt["tampered_packs"].to_string().contains(&c1)
        });
    assert!(reported, "the rewritten pack was not reported: {events}");
    // The later checkpoint restores whole.
    exec("rm -f a.txt k.txt b.txt")?;
    ok(d, &["sandbox", "restore", &name, &c2, "--backend", backend])?;
    assert_eq!(exec("cat a.txt k.txt b.txt")?, "one\nkeep-this\ntwo\n");
    Ok(())
}

#[test]
fn a_rewritten_pack_is_found_and_not_depended_on_local() -> TestResult {
    a_rewritten_pack_is_found_and_not_depended_on("local")
}

#[test]
fn a_rewritten_pack_is_found_and_not_depended_on_docker() -> TestResult {
    a_rewritten_pack_is_found_and_not_depended_on("docker")
}
