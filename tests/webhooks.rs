//! Webhooks end to end: a real `berth serve` POSTs to HTTP receivers the
//! tests run on loopback, for an approval asked by `berth exec` in another
//! process, a job's watch match, and the end of a `berth run`; one receiver
//! answers 503 first (the message is retried), one never answers at all
//! (it holds up nothing).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_standins::provider::{ProviderStandin, Reply};
use serde_json::Value;

use crate::agent::{KEY, KillOnDrop, Strays, cmd, run_cmd, text, wait_for};
use crate::support::TestResult;

/// A loopback HTTP receiver that records each JSON body it is sent.
struct Receiver {
    port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
    /// Connections accepted (attempts, for the one that never answers).
    accepted: Arc<Mutex<usize>>,
}

impl Receiver {
    /// `fail_first`: answer the first request 503. `hang`: never answer.
    fn start(fail_first: bool, hang: bool) -> std::io::Result<Receiver> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(Mutex::new(0usize));
        let (b, a) = (bodies.clone(), accepted.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for (n, conn) in l.incoming().enumerate() {
                let Ok(mut c) = conn else { continue };
                if let Ok(mut x) = a.lock() {
                    *x += 1;
                }
                if hang {
                    held.push(c);
                    continue;
                }
                let Some(body) = read_body(&mut c) else {
                    continue;
                };
                let status = if fail_first && n == 0 {
                    "503 Service Unavailable"
                } else {
                    if let (Ok(v), Ok(mut list)) = (serde_json::from_slice(&body), b.lock()) {
                        list.push(v);
                    }
                    "200 OK"
                };
                let _ = write!(
                    c,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        Ok(Receiver {
            port,
            bodies,
            accepted,
        })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().map(|b| b.clone()).unwrap_or_default()
    }

    fn texts(&self, key: &str) -> Vec<String> {
        self.bodies()
            .iter()
            .filter_map(|b| b[key].as_str().map(str::to_string))
            .collect()
    }
}

/// One HTTP request's body (by Content-Length).
fn read_body(c: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = c.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = c.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(buf[end + 4..end + 4 + len].to_vec());
        }
    }
}

fn berth_auto(state: &Path, args: &[&str]) -> Command {
    let mut c = cmd(state, args);
    c.env("BERTH_SERVER", "auto")
        .env_remove("BERTH_SERVER_IDLE");
    c
}

#[test]
fn approvals_watch_matches_and_run_ends_reach_webhooks_and_a_dead_one_slows_nothing() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let hung = Receiver::start(false, true)?;
    let slack = Receiver::start(false, false)?;
    let discord = Receiver::start(false, false)?;
    let generic = Receiver::start(true, false)?;
    // The hung one first: were deliveries serial, it would hold up the rest.
    std::fs::write(
        d.join("config.toml"),
        format!(
            "[[webhooks]]\nurl = \"{}\"\n\n[[webhooks]]\nurl = \"{}\"\nformat = \"slack\"\n\n\
             [[webhooks]]\nurl = \"{}\"\nformat = \"discord\"\n\n\
             [[webhooks]]\nurl_env = \"GENERIC_HOOK\"\nformat = \"json\"\n",
            hung.url(),
            slack.url(),
            discord.url()
        ),
    )?;
    std::fs::write(
        d.join("policy.toml"),
        "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"creates files\"\n",
    )?;
    let env_hook = generic.url();
    let run = |args: &[&str]| berth_auto(d, args).env("GENERIC_HOOK", &env_hook).output();
    // The server starts, and each webhook's cursor with it.
    let o = run(&["exec", "--", "true"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for("four webhook cursors", Duration::from_secs(30), || {
        std::fs::read_dir(d.join("webhooks"))
            .map(|r| {
                r.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "cursor"))
                    .count()
                    == 4
            })
            .unwrap_or(false)
    })?;
    // An ask, from another process: the message names the approval.
    let asker = berth_auto(d, &["exec", "--", "touch approved.txt"])
        .env("GENERIC_HOOK", &env_hook)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let asker = KillOnDrop(asker);
    let mut approval = 0;
    wait_for("the approval's webhook", Duration::from_secs(30), || {
        approval = generic
            .bodies()
            .iter()
            .find(|b| b["event"] == "approval.requested")
            .and_then(|b| b["approval"].as_i64())
            .unwrap_or(0);
        approval > 0
    })?;
    let o = run(&["approve", &approval.to_string()])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let mut asker = asker;
    let status = asker.0.wait()?;
    let mut err = String::new();
    if let Some(mut e) = asker.0.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    assert_eq!(status.code(), Some(0), "{err}");
    // A watch match of a job.
    let o = run(&[
        "job",
        "start",
        "--name",
        "tests",
        "--watch",
        "FAILED",
        "--",
        "sleep 1; echo '2 tests FAILED'; sleep 2",
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for("the watch match's webhook", Duration::from_secs(30), || {
        generic
            .bodies()
            .iter()
            .any(|b| b["event"] == "job.watch" && b["pattern"] == "FAILED")
    })?;
    // The end of a run whose task holds a secret.
    let s = ProviderStandin::start(vec![Reply::text("finished")])?;
    let task = format!("deploy with {KEY}");
    let o = run_cmd(d, &s.url(), &[&task])
        .env("BERTH_SERVER", "auto")
        .env("GENERIC_HOOK", &env_hook)
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for(
        "the run's end on every live webhook",
        Duration::from_secs(30),
        || {
            slack.texts("text").iter().any(|t| t.contains("ended done"))
                && discord
                    .texts("content")
                    .iter()
                    .any(|t| t.contains("ended done"))
                && generic.bodies().iter().any(|b| b["event"] == "run.ended")
        },
    )?;
    // Slack's and Discord's formats carry the same words.
    let st = slack.texts("text");
    assert!(
        st.iter()
            .any(|t| t.contains(&format!("berth approve {approval}"))),
        "{st:?}"
    );
    assert!(st.iter().any(|t| t.contains("matched `FAILED`")), "{st:?}");
    let dt = discord.texts("content");
    assert_eq!(st.len(), dt.len(), "{st:?} {dt:?}");
    assert!(
        dt.iter()
            .any(|t| t.contains(&format!("berth approve {approval}"))),
        "{dt:?}"
    );
    assert!(
        dt.iter().any(|t| t.contains("matched \"FAILED\"")),
        "{dt:?}"
    );
    // The generic one failed once (503) and was sent each message all the same.
    let kinds: Vec<String> = generic
        .bodies()
        .iter()
        .filter_map(|b| b["event"].as_str().map(str::to_string))
        .collect();
    assert_eq!(kinds, ["approval.requested", "job.watch", "run.ended"]);
    // No secret in any message.
    for r in [&slack, &discord, &generic] {
        let all = serde_json::to_string(&r.bodies())?;
        assert!(!all.contains(KEY), "{all}");
    }
    assert!(serde_json::to_string(&generic.bodies())?.contains("[REDACTED"));
    // The hung receiver was tried, and never answered.
    assert!(*hung.accepted.lock().map_err(|_| "poisoned")? >= 1);
    assert!(hung.bodies().is_empty());
    Ok(())
}

/// Text from a sandbox reaches Slack and Discord as text, never as markup
/// (#49 item 16): no channel-wide ping, no mention, no link dressed up as
/// something else, in a watch match's line and in an approval's command.
#[test]
fn sandbox_text_in_chat_messages_is_escaped_per_format() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let slack = Receiver::start(false, false)?;
    let discord = Receiver::start(false, false)?;
    std::fs::write(
        d.join("config.toml"),
        format!(
            "[[webhooks]]\nurl = \"{}\"\nformat = \"slack\"\n\n\
             [[webhooks]]\nurl = \"{}\"\nformat = \"discord\"\n",
            slack.url(),
            discord.url()
        ),
    )?;
    std::fs::write(
        d.join("policy.toml"),
        "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"creates files\"\n",
    )?;
    let o = berth_auto(d, &["exec", "--", "true"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_for("two webhook cursors", Duration::from_secs(30), || {
        std::fs::read_dir(d.join("webhooks"))
            .map(|r| r.flatten().count() >= 2)
            .unwrap_or(false)
    })?;
    let evil = "ALERT <!channel> <!here> @everyone @here <@123456> <@&42> <https://evil.example|Approve here> [Approve](https://evil.example)";
    let o = berth_auto(
        d,
        &[
            "job",
            "start",
            "--name",
            "evil",
            "--watch",
            "ALERT",
            "--",
            &format!("sleep 1; echo '{evil}'; sleep 1"),
        ],
    )
    .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let asker = berth_auto(
        d,
        &[
            "exec",
            "--timeout",
            "60",
            "--",
            "touch '<!channel> @everyone [x](https://evil.example)'",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()?;
    let _asker = KillOnDrop(asker);
    wait_for(
        "both messages on both hooks",
        Duration::from_secs(60),
        || slack.texts("text").len() >= 2 && discord.texts("content").len() >= 2,
    )?;
    for t in slack.texts("text") {
        assert!(
            !t.contains('<') && !t.contains('>'),
            "slack markup passed: {t}"
        );
        assert!(t.contains("&lt;!channel&gt;"), "{t}");
    }
    for b in discord.bodies() {
        assert_eq!(b["allowed_mentions"]["parse"], serde_json::json!([]), "{b}");
        let t = b["content"].as_str().unwrap_or("");
        for bad in [
            "@everyone",
            "@here",
            "<@123456>",
            "<@&42>",
            "<!channel>",
            "](",
        ] {
            assert!(!t.contains(bad), "discord markup `{bad}` passed: {t}");
        }
        assert!(t.contains("@\u{200B}everyone"), "{t}");
    }
    Ok(())
}

/// Each thread of process `pid` and how often it has slept of its own
/// accord (`voluntary_ctxt_switches`: the kernel's count of each time the
/// thread blocked, so of each time it was woken again), with its name.
fn sleeps(pid: u32) -> std::collections::HashMap<String, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in dir.flatten() {
        let p = t.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let n = std::fs::read_to_string(p.join("status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok());
        if let Some(n) = n {
            out.insert(
                t.file_name().to_string_lossy().into_owned(),
                (name.trim().to_string(), n),
            );
        }
    }
    out
}

/// #51 item 4: an idle server with a running job, a schedule and a webhook
/// sleeps until something it waits for happens: no loop of its own polls
/// the store. Over 10 s its threads are woken at most 2 times a second (the
/// loops this replaced woke it about 22 times), counted by the kernel; and
/// it still hears at once what it sleeps on: a job's end and an event for
/// the webhook.
#[test]
fn an_idle_server_with_a_job_a_schedule_and_a_webhook_sleeps() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let _strays = Strays(d.canonicalize()?);
    let hook = Receiver::start(false, false)?;
    std::fs::write(
        d.join("config.toml"),
        format!(
            "[[webhooks]]\nurl = \"{}\"\nformat = \"json\"\nevents = [\"job.killed\"]\n\n\
             [[providers]]\nname = \"standin\"\nkind = \"openai\"\n\
             base_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"STANDIN_KEY\"\n",
            hook.url()
        ),
    )?;
    let ok = |args: &[&str]| -> TestResult {
        let o = berth_auto(d, args).output()?;
        if o.status.code() != Some(0) {
            return Err(format!("{args:?}: {}", text(&o.stderr)).into());
        }
        Ok(())
    };
    ok(&["job", "start", "--name", "idle", "--", "sleep 600"])?;
    ok(&[
        "schedule",
        "add",
        "yearly",
        "--cron",
        "0 0 0 1 1 *",
        "--provider",
        "standin",
        "TASK: once a year",
    ])?;
    let status = || -> Value {
        berth_auto(d, &["server", "status", "--json"])
            .output()
            .ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    };
    wait_for("the job watched", Duration::from_secs(30), || {
        status()["watched_jobs"] == 1
    })?;
    wait_for("the webhook's cursor", Duration::from_secs(30), || {
        std::fs::read_dir(d.join("webhooks")).is_ok_and(|r| r.count() > 0)
    })?;
    let pid = status()["pid"].as_u64().ok_or("status without a pid")? as u32;
    // What the calls above set going settles (blocking threads park).
    std::thread::sleep(Duration::from_secs(3));
    let before = sleeps(pid);
    std::thread::sleep(Duration::from_secs(10));
    let after = sleeps(pid);
    let mut woke = 0;
    let mut by_thread = Vec::new();
    for (tid, (name, n)) in &after {
        let was = before.get(tid).map_or(0, |b| b.1);
        if *n > was {
            woke += n - was;
            by_thread.push(format!("{name}/{tid}: {}", n - was));
        }
    }
    assert!(
        !after.is_empty(),
        "the server (pid {pid}) has no threads to read"
    );
    assert!(
        woke <= 20,
        "an idle server was woken {woke} times in 10 s: {by_thread:?}"
    );
    // Asleep, not deaf: the job's end is recorded and reaches the webhook.
    ok(&["job", "kill", "idle"])?;
    wait_for(
        "the job's end at the webhook",
        Duration::from_secs(30),
        || {
            hook.bodies()
                .iter()
                .any(|b| b.to_string().contains("job.killed"))
        },
    )?;
    Ok(())
}
