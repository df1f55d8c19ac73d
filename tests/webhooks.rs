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
