//! The tools' results as a model gets them over MCP (#50 items 15 to 17,
//! #49 item 14): output cut once and told truly, with the whole kept;
//! `process` arguments that are used or refused, never dropped; file tools
//! and `terminal` that name the same file by the same relative path; and
//! an event log bounded by size.

use serde_json::{Value, json};

use crate::mcp::{Client, Env, data, text};
use crate::support::TestResult;

/// The `[... berth: N of the T bytes ...]` line of a result, parsed.
fn omitted_line(t: &str) -> Option<(u64, u64)> {
    let line = t.lines().find(|l| l.contains("bytes of output omitted"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "of")?;
    let n = words.get(i - 1)?.parse().ok()?;
    let total = words.get(i + 2)?.parse().ok()?;
    Some((n, total))
}

async fn large_output(c: &Client, cap: usize) -> TestResult {
    // Cut by the capture (256 KiB) and again to the result's size: one
    // marker, the truth about the whole, and where the whole is.
    let r = c.run("seq 1 200000").await?;
    let t = text(&r);
    assert!(t.len() <= cap, "{} bytes returned, over {cap}", t.len());
    assert_eq!(t.matches("bytes of output omitted").count(), 1, "{t}");
    assert!(
        !t.contains("bytes omitted"),
        "the capture's own marker is shown: {t}"
    );
    let total = (1..=200000u64)
        .map(|i| i.to_string().len() as u64 + 1)
        .sum::<u64>();
    let (omitted, said_total) = omitted_line(&t).ok_or("no omitted line")?;
    assert_eq!(said_total, total, "{t}");
    let shown = total - omitted;
    assert!(
        shown > cap as u64 / 2 && shown <= cap as u64,
        "{shown} shown: {t}"
    );
    assert!(t.starts_with("1\n2\n3\n"), "{t}");
    assert!(t.contains("199999\n200000\n"), "{t}");
    let d = data(&r);
    assert_eq!(d["omitted_bytes"], omitted, "{d}");
    let spool = d["spool"].as_str().ok_or("no spool")?.to_string();
    assert!(t.contains(&spool), "{t}");
    // Within the capture, over the result: the whole is kept all the same.
    let r = c.run("seq 1 20000").await?;
    let t = text(&r);
    assert!(t.len() <= cap, "{} bytes", t.len());
    let (_, total) = omitted_line(&t).ok_or("no omitted line")?;
    assert_eq!(total, 108894, "{t}");
    let spool = data(&r)["spool"].as_str().ok_or("no spool")?.to_string();
    let whole = std::fs::read_to_string(&spool)?;
    assert_eq!(whole.len(), 108894);
    assert!(whole.ends_with("19999\n20000\n"));
    // A paged read never cuts its page: each window follows the last.
    c.run("seq 1 30000 > big.txt").await?;
    let mut next = 1u64;
    let mut pages = 0;
    while next <= 30000 {
        let r = c
            .call("read_file", json!({ "path": "big.txt", "offset": next }))
            .await?;
        let t = text(&r);
        assert!(t.len() <= cap, "{} bytes", t.len());
        assert!(!t.contains("omitted"), "{t}");
        let first: u64 = t.lines().next().unwrap_or("").parse()?;
        assert_eq!(first, next, "a page skipped lines: {t}");
        next = data(&r)["last"].as_u64().ok_or("no last")? + 1;
        pages += 1;
        assert!(pages < 100);
    }
    assert!(pages > 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_output_is_cut_once_told_truly_and_kept_whole() -> TestResult {
    let env = Env::new("local")?;
    let c = env.stdio().await?;
    large_output(&c, 32 * 1024).await?;
    c.service.cancel().await?;
    // The size is the policy's.
    let policy = env.dir.path().join("policy.toml");
    let mut p = std::fs::read_to_string(&policy)?;
    p.push_str("\n[limits]\ntool_result_bytes = 4096\n");
    std::fs::write(&policy, p)?;
    let c = env.stdio().await?;
    large_output(&c, 4096).await?;
    c.service.cancel().await?;
    Ok(())
}

async fn job_input(c: &Client) -> TestResult {
    // A job that reads one line and ends: the data and the EOF arrive, and
    // the call says so, though the job is gone by the time of the EOF.
    let r = c
        .call(
            "terminal",
            json!({ "command": "read a; echo \"got $a\"", "background": true }),
        )
        .await?;
    let job = data(&r)["job_id"].as_str().ok_or("no job")?.to_string();
    let r = c
        .call(
            "process",
            json!({ "action": "send", "job_id": job, "data": "hi\n", "eof": true }),
        )
        .await?;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = c
        .call(
            "process",
            json!({ "action": "wait", "job_id": job, "timeout": 30 }),
        )
        .await?;
    assert_eq!(data(&r)["state"], "exited", "{}", text(&r));
    let r = c
        .call("process", json!({ "action": "log", "job_id": job }))
        .await?;
    assert!(text(&r).contains("got hi"), "{}", text(&r));
    // `cat` ends at EOF only.
    let r = c
        .call("terminal", json!({ "command": "cat", "background": true }))
        .await?;
    let job = data(&r)["job_id"].as_str().ok_or("no job")?.to_string();
    // `keys` on `send` is refused, not dropped; nothing is written.
    let r = c
        .call(
            "process",
            json!({ "action": "send", "job_id": job, "data": "x", "keys": ["Enter"] }),
        )
        .await?;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(
        text(&r).contains("`keys`") && text(&r).contains("nothing was done"),
        "{}",
        text(&r)
    );
    let r = c
        .call(
            "process",
            json!({ "action": "send", "job_id": job, "data": "abc\n", "eof": true }),
        )
        .await?;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = c
        .call(
            "process",
            json!({ "action": "wait", "job_id": job, "timeout": 30 }),
        )
        .await?;
    assert_eq!(data(&r)["state"], "exited", "{}", text(&r));
    let r = c
        .call("process", json!({ "action": "log", "job_id": job }))
        .await?;
    assert_eq!(text(&r), "abc\n");
    // Any other argument an action does not use is refused too.
    let r = c
        .call("process", json!({ "action": "list", "signal": "KILL" }))
        .await?;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_send_delivers_closes_and_refuses_what_it_does_not_use_local() -> TestResult {
    let env = Env::new("local")?;
    let c = env.stdio().await?;
    job_input(&c).await?;
    c.service.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_send_delivers_closes_and_refuses_what_it_does_not_use_docker() -> TestResult {
    let env = Env::new("docker")?;
    let c = env.stdio().await?;
    job_input(&c).await?;
    c.service.cancel().await?;
    Ok(())
}

async fn same_relative_paths(c: &Client) -> TestResult {
    // Before any cd, and after one: a relative path names one file for
    // the file tools and for `terminal`.
    for (cd, file) in [
        ("true", "notes/first.txt"),
        ("mkdir -p sub && cd sub", "notes/todo.txt"),
    ] {
        let r = c.run(cd).await?;
        assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
        let r = c
            .call(
                "write_file",
                json!({ "path": file, "content": "buy milk\n" }),
            )
            .await?;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        assert!(
            text(&r).contains("cwd"),
            "the base is not said: {}",
            text(&r)
        );
        let r = c.run(&format!("cat {file}")).await?;
        assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
        assert!(text(&r).starts_with("buy milk\n"), "{}", text(&r));
        let r = c.run(&format!("echo more >> {file}")).await?;
        assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
        let r = c.call("read_file", json!({ "path": file })).await?;
        assert_eq!(text(&r), "buy milk\nmore\n");
        let r = c
            .call(
                "edit_file",
                json!({ "path": file, "old": "more", "new": "eggs" }),
            )
            .await?;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let r = c.run(&format!("cat {file}")).await?;
        assert!(text(&r).starts_with("buy milk\neggs\n"), "{}", text(&r));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_and_terminal_share_the_cwd_local() -> TestResult {
    let env = Env::new("local")?;
    let c = env.stdio().await?;
    same_relative_paths(&c).await?;
    c.service.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_and_terminal_share_the_cwd_docker() -> TestResult {
    let env = Env::new("docker")?;
    let c = env.stdio().await?;
    same_relative_paths(&c).await?;
    c.service.cancel().await?;
    Ok(())
}

fn db_bytes(env: &Env) -> u64 {
    ["berth.db", "berth.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(env.dir.path().join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Refused commands of megabytes leave excerpts in the event log, each
/// with the whole command's length and digest (#49 item 14).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_huge_commands_leave_bounded_events() -> TestResult {
    let env = Env::new("local")?;
    let c = env.stdio().await?;
    c.run("true").await?;
    let before = db_bytes(&env);
    let huge = format!("shred victim # {}", "y".repeat(2 << 20));
    for _ in 0..3 {
        let r = c.run(&huge).await?;
        assert_eq!(
            r.is_error,
            Some(true),
            "{}",
            &text(&r)[..200.min(text(&r).len())]
        );
    }
    c.service.cancel().await?;
    let grown = db_bytes(&env).saturating_sub(before);
    assert!(grown < 1 << 20, "the event log grew by {grown} bytes");
    let o = env
        .berth()
        .args(["events", "--json", "--limit", "50"])
        .output()?;
    let denied: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "exec.denied")
        .collect();
    assert_eq!(denied.len(), 3);
    for e in &denied {
        let cmd = e["command"].as_str().unwrap_or("");
        assert!(cmd.len() < 10 * 1024, "{} bytes kept", cmd.len());
        assert!(
            cmd.starts_with("shred victim"),
            "{}",
            &cmd[..100.min(cmd.len())]
        );
        assert!(cmd.contains(&format!("{} bytes", huge.len())) && cmd.contains("sha256"));
    }
    Ok(())
}
