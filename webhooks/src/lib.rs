//! Webhooks: `berth serve` tells people when a run ends, a command waits for
//! an approval, or a job's watch pattern matches, by POSTing a small JSON
//! message to the URLs in the config file (`[[webhooks]]`), in Slack's,
//! Discord's or berth's own format.
//!
//! Flow at a glance: a supervisor looks at the config file every second and,
//! when it changed, restarts one delivery task per webhook. Each task reads
//! the event log after its own cursor (a file per webhook under the state
//! dir, replaced by rename), POSTs each event it wants, retrying with backoff,
//! and moves its cursor on once the message is delivered or given up. So a
//! server restart loses nothing: a task starts where its cursor is. A dead
//! webhook holds up only its own queue: never a run, a command, or another
//! webhook, because nothing waits on delivery but the task itself.
//!
//! No secret goes out: a message carries kinds, ids, names and texts the
//! event log already keeps masked, and the whole message is masked once more
//! with the gate's redactor before it leaves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_core::events::EventKind;
use berth_core::runtime::Runtime;
use berth_core::store::Event;
use serde_json::{Value, json};
use sha2::Digest;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use berth_client::config_path;

mod config;
pub use config::{HookFormat, Webhook, load};

/// The events a webhook is told about unless it lists its own.
pub const KINDS: [EventKind; 3] = [
    EventKind::RunEnded,
    EventKind::ApprovalRequested,
    EventKind::JobWatch,
];
/// Tries per message.
const ATTEMPTS: u32 = 5;
/// The wait before the second try; doubled each time after.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// One POST's limit.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle task looks for new events where the kernel cannot
/// watch the store; elsewhere an append wakes it.
const POLL: Duration = Duration::from_millis(250);
/// How often the config file is looked at where its directory cannot be
/// watched.
const CONFIG_POLL: Duration = Duration::from_secs(5);
/// The longest a task sleeps with nothing written.
const BACKSTOP: Duration = Duration::from_secs(60);

/// Start the supervisor; it stops with `shutdown`.
pub fn spawn(rt: Arc<Runtime>, state_dir: PathBuf, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(supervise(rt, state_dir, shutdown))
}

/// What identifies a version of the config file.
fn stamp(path: &Path) -> Option<(u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

async fn supervise(rt: Arc<Runtime>, state_dir: PathBuf, shutdown: CancellationToken) {
    let mut seen: Option<Option<(u64, u64, i64, i64)>> = None;
    let mut tasks: Vec<(JoinHandle<()>, CancellationToken)> = Vec::new();
    let client = match reqwest::Client::builder().timeout(POST_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "webhooks: no HTTP client; no notifications will be sent");
            return;
        }
    };
    // Woken by an edit of the config file; a stat every few seconds where
    // the kernel cannot watch its directory.
    let mut bell = config_path()
        .ok()
        .map(|p| berth_core::bell::Bell::file(&p, CONFIG_POLL));
    loop {
        let now = config_path().ok().map(|p| stamp(&p)).unwrap_or(None);
        if seen.as_ref() != Some(&now) {
            seen = Some(now);
            for (t, stop) in tasks.drain(..) {
                stop.cancel();
                let _ = t.await;
            }
            match config_path().and_then(|p| load(&p)) {
                Ok((hooks, path)) => {
                    for hook in hooks {
                        let url = match hook.resolve_url() {
                            Ok(u) => u,
                            Err(e) => {
                                warn!(config = %path.display(), error = %e, "webhooks: skipping one");
                                continue;
                            }
                        };
                        let stop = shutdown.child_token();
                        let task = Hook {
                            rt: rt.clone(),
                            client: client.clone(),
                            cursor: cursor_path(&state_dir, &url, hook.format),
                            url,
                            hook,
                            stop: stop.clone(),
                        };
                        tasks.push((tokio::spawn(task.run()), stop));
                    }
                    if !tasks.is_empty() {
                        info!(webhooks = tasks.len(), "webhooks: delivering");
                    }
                }
                Err(e) => warn!(error = %format!("{e:#}"), "webhooks: the config does not read"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = async {
                match &mut bell {
                    Some(b) => {
                        b.wait(BACKSTOP).await;
                    }
                    None => tokio::time::sleep(CONFIG_POLL).await,
                }
            } => {}
        }
    }
    for (t, stop) in tasks {
        stop.cancel();
        let _ = t.await;
    }
}

/// A webhook's cursor file: named by a digest of its URL (which may be a
/// credential, so it is not written out) and format.
fn cursor_path(state_dir: &Path, url: &str, format: HookFormat) -> PathBuf {
    let mut h = sha2::Sha256::new();
    h.update(url.as_bytes());
    h.update(format!("{format:?}").as_bytes());
    let digest = hex::encode(&h.finalize()[..12]);
    state_dir.join("webhooks").join(format!("{digest}.cursor"))
}

/// One webhook's delivery task.
struct Hook {
    rt: Arc<Runtime>,
    client: reqwest::Client,
    url: String,
    hook: Webhook,
    cursor: PathBuf,
    stop: CancellationToken,
}

impl Hook {
    fn wants(&self, kind: &str) -> bool {
        match &self.hook.events {
            Some(list) => list.iter().any(|k| k == kind),
            None => KINDS.iter().any(|k| k.as_str() == kind),
        }
    }

    async fn run(self) {
        let store = self.rt.store().clone();
        // An appended event is a write of the store, which rings.
        let mut bell = store.bell(POLL);
        let mut cursor = match read_cursor(&self.cursor) {
            Some(c) => c,
            // A new webhook starts at the newest event: it is not sent history.
            None => {
                let s = store.clone();
                let newest = tokio::task::spawn_blocking(move || s.events(0, 1, None)).await;
                let c = match newest {
                    Ok(Ok(e)) => e.last().map_or(0, |e| e.id),
                    _ => 0,
                };
                if let Err(e) = write_cursor(&self.cursor, c) {
                    warn!(error = %e, "webhooks: cannot keep a cursor; messages may repeat after a restart");
                }
                c
            }
        };
        while !self.stop.is_cancelled() {
            let s = store.clone();
            let events =
                match tokio::task::spawn_blocking(move || s.events_after(cursor, 100)).await {
                    Ok(Ok(e)) => e,
                    Ok(Err(e)) => {
                        warn!(error = %e, "webhooks: cannot read the event log");
                        Vec::new()
                    }
                    Err(_) => Vec::new(),
                };
            if events.is_empty() {
                tokio::select! {
                    _ = self.stop.cancelled() => break,
                    _ = bell.wait(BACKSTOP) => {}
                }
                continue;
            }
            for e in events {
                if self.wants(e.kind.as_str()) {
                    let body = message(self.hook.format, &e, &|t| self.rt.redact(t));
                    if !self.post(&e, &body).await {
                        // Stopped mid-retry: the cursor stays, the message is
                        // sent again by the next server.
                        return;
                    }
                }
                cursor = e.id;
                if let Err(err) = write_cursor(&self.cursor, cursor) {
                    warn!(error = %err, "webhooks: cannot keep a cursor");
                }
            }
        }
    }

    /// POST `body`, retrying with backoff. False when stopped before the
    /// message was delivered or given up.
    async fn post(&self, e: &Event, body: &Value) -> bool {
        let mut wait = FIRST_BACKOFF;
        for attempt in 1..=ATTEMPTS {
            let sent = tokio::select! {
                _ = self.stop.cancelled() => return false,
                r = self.client.post(&self.url).json(body).send() => r,
            };
            let why = match sent {
                Ok(r) if r.status().is_success() => return true,
                Ok(r) => format!("HTTP {}", r.status()),
                Err(err) => berth_core::error::chain_text(&err),
            };
            if attempt == ATTEMPTS {
                warn!(event = e.id, kind = %e.kind, attempts = ATTEMPTS, why = %mask_url(&why, &self.url), "webhooks: giving up on a message");
                return true;
            }
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
            wait *= 2;
        }
        true
    }
}

/// An error's text without the URL, which may be a credential.
fn mask_url(text: &str, url: &str) -> String {
    text.replace(url, "<webhook url>")
}

fn read_cursor(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Write the cursor whole or not at all (a `kill -9` leaves the old one).
fn write_cursor(path: &Path, id: i64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A name of this process's own: a draining server and its successor
    // may both write a hook's cursor.
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::rename(&tmp, path)
}

/// An event as a webhook's message, masked.
pub fn message(format: HookFormat, e: &Event, redact: &dyn Fn(&str) -> String) -> Value {
    let d: Value = e
        .detail
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null);
    let place = format!(
        "{}/{}",
        e.backend.map_or("?", |b| b.as_str()),
        e.sandbox.as_deref().unwrap_or("?")
    );
    // Text from a sandbox (a command, a task, an output line, a reason)
    // is shown as text in chat, never read as markup: no `<!channel>`, no
    // `@everyone`, no `<https://evil|Approve here>` link.
    // Masked first: an escape inside a secret would hide it from the mask.
    let u = |t: &str| untrusted(format, &redact(t));
    let s = |v: &Value| u(v.as_str().unwrap_or(""));
    let code = |t: &str| code(format, &redact(t));
    let place = u(&place);
    let mut facts = json!({
        "event": e.kind, "id": e.id, "ts_ms": e.ts_ms,
        "backend": e.backend, "sandbox": e.sandbox,
    });
    let text = match e.kind {
        EventKind::RunEnded => {
            facts["run"] = d["run"].clone();
            facts["state"] = d["state"].clone();
            facts["steps"] = d["steps"].clone();
            let reason = d["reason"]
                .as_str()
                .map(|r| format!(": {}", u(r)))
                .unwrap_or_default();
            format!(
                "berth: run {} in {place} ended {} after {} step(s){reason}. Task: {}",
                s(&d["run"]),
                s(&d["state"]),
                d["steps"],
                s(&d["task"])
            )
        }
        EventKind::ApprovalRequested => {
            let id = &d["approval"];
            facts["approval"] = id.clone();
            facts["command"] = json!(e.command);
            format!(
                "berth: approval #{id} is needed in {place} for {}{}. Answer with `berth approve {id}` or `berth deny {id}`.",
                code(e.command.as_deref().unwrap_or("")),
                d["reason"]
                    .as_str()
                    .map(|r| format!(" ({})", u(r)))
                    .unwrap_or_default()
            )
        }
        EventKind::JobWatch => {
            let job = e.call_id.clone().unwrap_or_default();
            let inner = &d["detail"];
            facts["job"] = json!(job);
            facts["pattern"] = inner["pattern"].clone();
            facts["line"] = inner["line"].clone();
            format!(
                "berth: job {} in {place} matched {}: {}",
                u(&job),
                code(inner["pattern"].as_str().unwrap_or("")),
                s(&inner["line"])
            )
        }
        _ => format!("berth: {} in {place}", u(e.kind.as_str())),
    };
    let body = match format {
        HookFormat::Slack => json!({ "text": text }),
        // Nobody is pinged, whatever the text says.
        HookFormat::Discord => json!({ "content": text, "allowed_mentions": { "parse": [] } }),
        HookFormat::Json => {
            facts["text"] = json!(text);
            facts
        }
    };
    berth_core::gate::redact_json(&body, &|t| redact(t))
}

/// Text from a sandbox, escaped for `format`. Slack reads `&`, `<` and `>`
/// as markup (`<!channel>`, `<@U1>`, `<url|label>`): they become entities.
/// Discord reads markdown (`[label](url)`, emphasis, code), `@everyone`,
/// `@here` and `<@id>`, `<@&role>`, `<#channel>`: each markup character is
/// escaped with a backslash, and `@` is followed by a zero-width space.
/// Berth's own JSON carries it as data.
fn untrusted(format: HookFormat, t: &str) -> String {
    match format {
        HookFormat::Json => t.to_string(),
        HookFormat::Slack => t
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;"),
        HookFormat::Discord => {
            let mut out = String::with_capacity(t.len() + 8);
            for c in t.chars() {
                match c {
                    '\\' | '*' | '_' | '~' | '`' | '|' | '>' | '<' | '[' | ']' | '(' | ')'
                    | '#' => {
                        out.push('\\');
                        out.push(c);
                    }
                    '@' => out.push_str("@\u{200B}"),
                    c => out.push(c),
                }
            }
            out
        }
    }
}

/// Sandbox text shown as code: in backticks where they hold it (a backtick
/// inside cannot end them early in Slack, whose code spans end at the
/// next one, so it is replaced by a look-alike), escaped text in Discord,
/// where a backslash is not an escape inside a code span.
fn code(format: HookFormat, t: &str) -> String {
    match format {
        HookFormat::Discord => format!("\"{}\"", untrusted(format, t)),
        _ => format!("`{}`", untrusted(format, &t.replace('`', "\u{2018}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::backend::BackendKind;

    fn event(kind: EventKind, detail: Value) -> Event {
        Event {
            id: 7,
            kind,
            backend: Some(BackendKind::Docker),
            sandbox: Some("web".into()),
            command: Some("make deploy TOKEN=hunter2".into()),
            call_id: Some("j1".into()),
            detail: Some(detail.to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn each_format_carries_the_text_and_no_secret() {
        let mask = |t: &str| t.replace("hunter2", "[REDACTED:TOKEN]");
        let e = event(
            EventKind::ApprovalRequested,
            json!({ "approval": 3, "reason": "deploys" }),
        );
        let slack = message(HookFormat::Slack, &e, &mask);
        let text = slack["text"].as_str().unwrap_or("");
        assert!(
            text.contains("approval #3") && text.contains("berth approve 3"),
            "{text}"
        );
        assert!(!slack.to_string().contains("hunter2"), "{slack}");
        let discord = message(HookFormat::Discord, &e, &mask);
        let content = discord["content"].as_str().unwrap_or("");
        assert!(
            content.contains("approval #3") && content.contains("berth approve 3"),
            "{content}"
        );
        assert!(!discord.to_string().contains("hunter2"), "{discord}");
        assert_eq!(discord["allowed_mentions"]["parse"], json!([]));
        let j = message(HookFormat::Json, &e, &mask);
        assert_eq!(j["event"], "approval.requested");
        assert_eq!(j["approval"], 3);
        assert!(!j.to_string().contains("hunter2"), "{j}");
        let w = event(
            EventKind::JobWatch,
            json!({ "detail": { "pattern": "FAILED", "line": "3 FAILED" } }),
        );
        let j = message(HookFormat::Json, &w, &mask);
        assert_eq!(
            (j["job"].as_str(), j["pattern"].as_str()),
            (Some("j1"), Some("FAILED"))
        );
    }

    #[test]
    fn sandbox_text_is_never_markup() {
        let e = Event {
            command: Some(
                "touch '<!channel> @everyone <https://evil|Approve> [ok](https://evil) `x`'".into(),
            ),
            ..event(EventKind::ApprovalRequested, json!({ "approval": 3 }))
        };
        let slack = message(HookFormat::Slack, &e, &|t| t.to_string());
        let t = slack["text"].as_str().unwrap_or("");
        assert!(!t.contains('<') && !t.contains('>'), "{t}");
        assert!(t.contains("&lt;!channel&gt;"), "{t}");
        // One code span: the command's backtick cannot end it early.
        assert_eq!(t.matches('`').count(), 6, "{t}");
        let discord = message(HookFormat::Discord, &e, &|t| t.to_string());
        let t = discord["content"].as_str().unwrap_or("");
        for bad in ["@everyone", "<!channel>", "](", "<https://evil|"] {
            assert!(!t.contains(bad), "{bad}: {t}");
        }
        // A secret is masked before it is escaped.
        let e = Event {
            command: Some("echo tok_en_secret".into()),
            ..event(EventKind::ApprovalRequested, json!({ "approval": 4 }))
        };
        let d = message(HookFormat::Discord, &e, &|t| {
            t.replace("tok_en_secret", "[MASKED]")
        });
        assert!(!d.to_string().contains("tok"), "{d}");
    }

    #[test]
    fn a_cursor_is_whole_or_absent() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let p = cursor_path(
            dir.path(),
            "https://hooks.example/T0/secret",
            HookFormat::Slack,
        );
        assert!(!p.to_string_lossy().contains("secret"));
        assert_eq!(read_cursor(&p), None);
        write_cursor(&p, 42)?;
        assert_eq!(read_cursor(&p), Some(42));
        Ok(())
    }
}
