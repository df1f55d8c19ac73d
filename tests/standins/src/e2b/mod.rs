//! A local stand-in for E2B: the control-plane REST API and envd, on one port.
//!
//! Flow at a glance:
//! - [`E2bStandin::start`] binds a port and serves HTTP/1.1 and HTTP/2 without
//!   TLS (h2c prior knowledge), as the official SDK's HTTP/2 client speaks it.
//! - The control plane ([`control`]) answers `/sandboxes` and `/v2/sandboxes`
//!   with the spec's status codes and bodies, checking `X-API-Key`.
//! - envd ([`envd`]) answers `/process.Process/*` over Connect with JSON and
//!   `/files`, routed to a sandbox by `E2b-Sandbox-Id` (or a
//!   `49983-{id}.{domain}` host), checking `X-Access-Token`.
//! - Processes really run here ([`sandbox`]), each sandbox in its own temp dir.
//! - [`Faults`] injects failures on request: from Rust, or with
//!   `POST /_standin/faults` for a client in another language.

// Handlers return the error answer itself (`Result<_, Response>`), axum's
// idiom; its size does not matter on a test server.
#![allow(clippy::result_large_err)]

pub mod control;
pub mod envd;
pub mod envelope;
pub mod sandbox;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use sandbox::{Sandbox, lock};

/// The port envd listens on inside a sandbox.
pub const ENVD_PORT: u16 = 49983;
/// The envd version the stand-in claims: the features it implements.
pub const ENVD_VERSION: &str = "0.5.7";

/// Failures to inject, each consumed as it fires.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct FaultPlan {
    /// The next N control-plane calls answer 401.
    pub api_unauthorized: u32,
    /// The next N control-plane calls answer 429.
    pub api_rate_limited: u32,
    /// The next N control-plane calls answer 503.
    pub api_unavailable: u32,
    /// Cut the stream of the first process whose output contains this text,
    /// after sending part of that output.
    pub cut_stream_on: Option<String>,
    /// Kill the whole sandbox when a process's output contains this text.
    pub kill_sandbox_on: Option<String>,
    /// On a `Start` deadline, end the stream with `deadline_exceeded` instead
    /// of forwarding the killed process's `end` event.
    pub deadline_as_error: bool,
}

/// The fault switchboard.
#[derive(Debug, Default)]
pub struct Faults {
    plan: Mutex<FaultPlan>,
}

impl Faults {
    /// Replace the plan.
    pub fn set(&self, plan: FaultPlan) {
        *lock(&self.plan) = plan;
    }

    /// Change the plan in place.
    pub fn update(&self, f: impl FnOnce(&mut FaultPlan)) {
        f(&mut lock(&self.plan));
    }

    /// The control-plane status to answer instead of doing the call, if any.
    fn take_api_fault(&self) -> Option<StatusCode> {
        let mut guard = lock(&self.plan);
        let p = &mut *guard;
        for (n, code) in [
            (&mut p.api_unauthorized, StatusCode::UNAUTHORIZED),
            (&mut p.api_rate_limited, StatusCode::TOO_MANY_REQUESTS),
            (&mut p.api_unavailable, StatusCode::SERVICE_UNAVAILABLE),
        ] {
            if *n > 0 {
                *n -= 1;
                return Some(code);
            }
        }
        None
    }

    /// Whether output `data` triggers a stream cut (consumed when it does).
    fn take_cut(&self, data: &[u8]) -> bool {
        take_trigger(&mut lock(&self.plan).cut_stream_on, data)
    }

    /// Whether output `data` triggers a sandbox kill (consumed when it does).
    fn take_kill(&self, data: &[u8]) -> bool {
        take_trigger(&mut lock(&self.plan).kill_sandbox_on, data)
    }

    fn deadline_as_error(&self) -> bool {
        lock(&self.plan).deadline_as_error
    }
}

fn take_trigger(slot: &mut Option<String>, data: &[u8]) -> bool {
    let hit = slot
        .as_deref()
        .is_some_and(|t| data.windows(t.len().max(1)).any(|w| w == t.as_bytes()));
    if hit {
        *slot = None;
    }
    hit
}

/// Shared server state.
pub struct Shared {
    /// The one valid API key.
    pub api_key: String,
    /// Live sandboxes by id.
    pub sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// Injected failures.
    pub faults: Faults,
}

impl Shared {
    fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        lock(&self.sandboxes).get(id).cloned()
    }

    /// Remove and kill a sandbox.
    pub fn kill(&self, id: &str) -> bool {
        let sb = lock(&self.sandboxes).remove(id);
        match sb {
            Some(sb) => {
                // The kill walks /proc and waits: off the async threads.
                std::thread::spawn(move || sb.kill_all());
                true
            }
            None => false,
        }
    }
}

/// A running stand-in. Dropping it stops the server and kills its sandboxes.
pub struct E2bStandin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
    reaper: tokio::task::JoinHandle<()>,
}

impl E2bStandin {
    /// Serve on `127.0.0.1:port` (0 picks a free port) with a fresh API key.
    pub async fn start(port: u16) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            api_key: format!("e2b_{}", random_hex(20)),
            sandboxes: Mutex::new(HashMap::new()),
            faults: Faults::default(),
        });
        let app = router(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let reaper = tokio::spawn(reap(shared.clone()));
        Ok(Self {
            addr,
            shared,
            server,
            reaper,
        })
    }

    /// The control plane's base URL (`E2B_API_URL`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// envd's base URL for every sandbox (`E2B_SANDBOX_URL`).
    pub fn sandbox_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The API key it accepts (`E2B_API_KEY`).
    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// The settings a client needs, as `KEY=VALUE` pairs.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("E2B_API_URL".into(), self.api_url()),
            ("E2B_SANDBOX_URL".into(), self.sandbox_url()),
            ("E2B_API_KEY".into(), self.api_key().to_string()),
        ]
    }

    /// The fault switchboard.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Kill a sandbox from the outside, as its timeout or the dashboard would.
    pub fn kill_sandbox(&self, id: &str) -> bool {
        self.shared.kill(id)
    }

    /// The ids of the live sandboxes.
    pub fn sandbox_ids(&self) -> Vec<String> {
        lock(&self.shared.sandboxes).keys().cloned().collect()
    }

    /// A sandbox's network as last set: whether it may reach the internet,
    /// and its egress filter (`{allowOut, denyOut}`), if it has one.
    pub fn network_of(&self, id: &str) -> Option<(bool, Option<serde_json::Value>)> {
        let sb = self.shared.get(id)?;
        let open = *lock(&sb.allow_internet_access);
        let net = lock(&sb.network).clone();
        Some((open, net))
    }

    /// The seconds left before a sandbox times out.
    pub fn seconds_left(&self, id: &str) -> Option<u64> {
        let sb = self.shared.get(id)?;
        let end = *lock(&sb.end_at);
        Some(
            end.saturating_duration_since(std::time::Instant::now())
                .as_secs(),
        )
    }
}

impl Drop for E2bStandin {
    fn drop(&mut self) {
        self.server.abort();
        self.reaper.abort();
        let all: Vec<_> = lock(&self.shared.sandboxes)
            .drain()
            .map(|(_, s)| s)
            .collect();
        for sb in all {
            sb.kill_all();
        }
    }
}

/// Kill sandboxes whose timeout passed. A paused sandbox does not time out.
async fn reap(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = std::time::Instant::now();
        let due: Vec<String> = lock(&shared.sandboxes)
            .values()
            .filter(|s| *lock(&s.state) == sandbox::State::Running && *lock(&s.end_at) <= now)
            .map(|s| s.id.clone())
            .collect();
        for id in due {
            shared.kill(&id);
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/sandboxes", post(control::create).get(control::list_v1))
        .route("/v2/sandboxes", post(control::create).get(control::list_v2))
        .route(
            "/sandboxes/{id}",
            get(control::get_one).delete(control::kill),
        )
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(control::set_network),
        )
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/process.Process/{method}", post(envd::process))
        .route("/filesystem.Filesystem/{method}", post(envd::filesystem))
        .route("/files", get(envd::download).post(envd::upload))
        .route("/health", get(envd::health))
        .route("/_standin/faults", post(set_faults))
        .layer(DefaultBodyLimit::max(512 * 1024 * 1024))
        .with_state(shared)
}

async fn set_faults(
    State(shared): State<Arc<Shared>>,
    axum::Json(plan): axum::Json<FaultPlan>,
) -> Response {
    shared.faults.set(plan);
    StatusCode::NO_CONTENT.into_response()
}

/// Random lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// An RFC 3339 UTC timestamp for unix seconds.
pub fn rfc3339(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn envelopes_frame_and_unframe() {
        let e = envelope::encode(0, b"{}");
        assert_eq!(e, [0, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(envelope::decode_single(&e), Ok(&b"{}"[..]));
        assert!(envelope::decode_single(&e[..6]).is_err());
        assert!(envelope::decode_single(&envelope::end_stream(None)).is_err());
    }
}
