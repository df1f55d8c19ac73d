//! Job completions, watch matches and refused connections (the sandbox's
//! network rules, `net.refused`) as MCP logging notifications.
//!
//! Nothing of a job lives in berth's process, so a job's end is seen when its
//! sandbox is asked: while this sandbox has unfinished jobs, they are brought up
//! to date every [`POLL`], which writes `job.*` events; every new event of this
//! sandbox's jobs is then sent to every connected client. With no job to
//! ask about (or a server that records their ends), a write of the store
//! wakes the loop, not a timer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::backend::BackendKind;
use berth_core::events::EventKind;
use berth_core::jobs::JobState;
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::{Peer, RoleServer};
use serde_json::{Value, json};

use super::Shared;

/// How often unfinished jobs are looked at.
const POLL: Duration = Duration::from_millis(1000);

/// The connected clients.
#[derive(Default)]
pub(crate) struct Notifier {
    peers: Mutex<Vec<Peer<RoleServer>>>,
}

impl Notifier {
    pub(crate) fn add(&self, peer: Peer<RoleServer>) {
        if let Ok(mut p) = self.peers.lock() {
            p.push(peer);
        }
    }

    fn live(&self) -> Vec<Peer<RoleServer>> {
        match self.peers.lock() {
            Ok(mut p) => {
                p.retain(|x| !x.is_transport_closed());
                p.clone()
            }
            Err(_) => Vec::new(),
        }
    }

    #[allow(deprecated)]
    async fn send(&self, level: LoggingLevel, data: Value) {
        for peer in self.live() {
            let param =
                LoggingMessageNotificationParam::new(level, data.clone()).with_logger("berth.jobs");
            if let Err(e) = peer.notify_logging_message(param).await {
                tracing::debug!(error = %e, "could not send a job notification");
            }
        }
    }
}

/// Watch this sandbox's jobs for the life of the server.
#[allow(deprecated)]
pub(crate) async fn watch_jobs(shared: Arc<Shared>) {
    let store = shared.rt.store().clone();
    let mut last = store
        .events(0, 1, None)
        .ok()
        .and_then(|e| e.last().map(|e| e.id))
        .unwrap_or(0);
    // Events are written to the store, which rings; only jobs this process
    // must ask about are looked at on a timer.
    let mut bell = store.bell(POLL);
    let mut asks = false;
    loop {
        if asks {
            tokio::time::sleep(POLL).await;
        } else {
            bell.wait(Duration::from_secs(60)).await;
        }
        let own = |b: &Option<BackendKind>, s: &Option<String>| {
            *b == Some(shared.backend) && s.as_deref() == Some(shared.sandbox.as_str())
        };
        let running: Vec<String> = store
            .jobs()
            .unwrap_or_default()
            .into_iter()
            .filter(|j| !j.state.is_final())
            .filter(|j| j.backend == shared.backend && j.sandbox == shared.sandbox)
            .map(|j| j.id)
            .collect();
        // A berth server records job endings as they happen; with none, ask.
        let running = if shared.served { Vec::new() } else { running };
        asks = !running.is_empty();
        for id in running {
            if let Err(e) = shared.rt.job(&id).await {
                tracing::debug!(job = %id, error = %e, "could not refresh a job");
            }
        }
        let events = match store.events_after(last, 500) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the event log");
                continue;
            }
        };
        for e in events {
            last = last.max(e.id);
            let kind = e.kind;
            let wanted = matches!(
                kind,
                EventKind::Job(
                    JobState::Exited | JobState::Killed | JobState::Lost | JobState::Failed
                ) | EventKind::JobWatch
                    | EventKind::NetRefused
            );
            if !wanted || !own(&e.backend, &e.sandbox) {
                continue;
            }
            let detail: Value = e
                .detail
                .as_deref()
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or(Value::Null);
            let job = e.call_id.clone().unwrap_or_default();
            let (level, message) = if kind == EventKind::NetRefused {
                (
                    LoggingLevel::Warning,
                    format!(
                        "{} refused by the sandbox's network policy ({}): {}",
                        e.command
                            .as_deref()
                            .unwrap_or("")
                            .trim_start_matches("connect "),
                        detail["rule"].as_str().unwrap_or(""),
                        detail["reason"].as_str().unwrap_or("")
                    ),
                )
            } else if kind == EventKind::JobWatch {
                (
                    LoggingLevel::Notice,
                    format!(
                        "job {job} output matched `{}`: {}",
                        detail["detail"]["pattern"].as_str().unwrap_or(""),
                        detail["detail"]["line"].as_str().unwrap_or("")
                    ),
                )
            } else {
                let state = e.kind.as_str().trim_start_matches("job.");
                (
                    if kind == EventKind::Job(JobState::Exited) && e.exit_code == Some(0) {
                        LoggingLevel::Info
                    } else {
                        LoggingLevel::Warning
                    },
                    format!(
                        "job {job} {state}{}: {}",
                        e.exit_code
                            .map(|c| format!(" with exit code {c}"))
                            .unwrap_or_default(),
                        e.command.as_deref().unwrap_or("")
                    ),
                )
            };
            shared
                .notifier
                .send(
                    level,
                    json!({
                        "event": e.kind,
                        "job_id": job,
                        "exit_code": e.exit_code,
                        "message": message,
                        "detail": detail,
                    }),
                )
                .await;
        }
    }
}
