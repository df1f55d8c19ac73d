//! A stand-in for Modal's API: the control plane `modal.client.ModalClient`
//! and the task command router `modal.task_command_router.TaskCommandRouter`,
//! both served by tonic on one local port, from the public spec.
//!
//! Flow at a glance:
//! - [`ModalStandin::start`] binds a port, makes a token (`ak-…`/`as-…`) and
//!   serves both services. Any RPC it does not implement answers Unimplemented.
//! - Every control-plane call must carry the token headers; a JWT from
//!   `AuthTokenGet` is checked when sent. Router calls must carry
//!   `authorization: Bearer <jwt>` from `TaskGetCommandRouterAccess`.
//! - Sandboxes and execs really run, as local processes ([`sandbox`]).
//! - [`Faults`] injects what a real service does on a bad day: Unavailable
//!   (then success), stdio streams cut mid-output, expired router tokens, and
//!   a sandbox terminated from outside ([`ModalStandin::terminate`]).

mod control;
mod router;
pub mod sandbox;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use tokio::sync::oneshot;
use tonic::{Request, Status};

use self::pb::client::generic_result::GenericStatus;
use self::pb::client::modal_client_server::ModalClientServer;
use self::pb::task_command_router::task_command_router_server::TaskCommandRouterServer;
use self::sandbox::Sandbox;

/// Generated protocol code.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
/// A sandbox's `network_access` as recorded: its type, allowed CIDRs and
/// allowed domains.
pub type AllowList = (i32, Vec<String>, Vec<String>);

pub mod pb {
    /// `modal.client`.
    pub mod client {
        tonic::include_proto!("modal.client");
    }
    /// `modal.task_command_router`.
    pub mod task_command_router {
        tonic::include_proto!("modal.task_command_router");
    }
}

/// The image builder version the stand-in's environment advertises.
pub const BUILDER_VERSION: &str = "2024.10";

/// Faults to inject, set by a test while the stand-in runs.
#[derive(Default)]
pub struct Faults {
    /// The next N control-plane calls answer Unavailable.
    pub unavailable_next: AtomicU32,
    /// The next N router calls (unary and streams) answer Unavailable.
    pub router_unavailable_next: AtomicU32,
    /// The next N stdio streams are cut (Unavailable) after this many bytes...
    pub stdio_cuts: AtomicU32,
    /// ...namely after `stdio_cut_after` bytes of that stream.
    pub stdio_cut_after: AtomicU64,
    /// Lifetime of issued JWTs in seconds (0: one hour).
    pub jwt_ttl_secs: AtomicU64,
}

/// Counters of what was called, for tests to check the client's behaviour.
#[derive(Default)]
pub struct Calls {
    counts: Mutex<HashMap<&'static str, u32>>,
    /// `x-idempotency-key` values seen with `x-retry-attempt` > 0.
    pub retried_keys: Mutex<Vec<String>>,
}

impl Calls {
    fn hit(&self, rpc: &'static str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.entry(rpc).or_default() += 1;
        }
    }

    /// How often `rpc` was called.
    pub fn count(&self, rpc: &str) -> u32 {
        self.counts
            .lock()
            .map(|c| c.get(rpc).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// A token the stand-in issued.
struct Issued {
    task_id: Option<String>,
    exp: u64,
}

/// Everything the stand-in knows.
pub struct State {
    token_id: String,
    token_secret: String,
    url: String,
    seq: AtomicU64,
    apps: Mutex<HashMap<(String, String), String>>,
    images: Mutex<HashMap<String, bool>>,
    sandboxes: Mutex<Vec<Arc<Sandbox>>>,
    tokens: Mutex<HashMap<String, Issued>>,
    /// Faults to inject.
    pub faults: Faults,
    /// What was called.
    pub calls: Calls,
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl State {
    /// An id in Modal's shape: a prefix and 22 base62 characters (a V1
    /// sandbox's shape, which the SDK tells from a V2 one's).
    fn next_id(&self, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut id = format!("{n:06}");
        while id.len() < 22 {
            id.push(ALPHABET[usize::from(rand::random::<u8>()) % ALPHABET.len()] as char);
        }
        format!("{prefix}-{id}")
    }

    /// A JWT-shaped token (header.payload.signature, base64url) with `exp`.
    fn issue(&self, task_id: Option<&str>) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let ttl = match self.faults.jwt_ttl_secs.load(Ordering::Relaxed) {
            0 => 3600,
            t => t,
        };
        let exp = now_secs() as u64 + ttl;
        let payload = serde_json::json!({
            "exp": exp,
            "sub": self.token_id,
            "task_id": task_id,
            "jti": self.next_id("jt"),
        });
        let sig: [u8; 24] = rand::random();
        let tok = format!(
            "{}.{}.{}",
            b64(br#"{"alg":"HS256","typ":"JWT"}"#),
            b64(payload.to_string().as_bytes()),
            b64(&sig)
        );
        if let Ok(mut t) = self.tokens.lock() {
            t.insert(
                tok.clone(),
                Issued {
                    task_id: task_id.map(str::to_string),
                    exp,
                },
            );
        }
        tok
    }

    fn token_ok(&self, tok: &str, task_id: Option<&str>) -> bool {
        let now = now_secs() as u64;
        self.tokens.lock().is_ok_and(|t| {
            t.get(tok)
                .is_some_and(|i| i.exp > now && i.task_id.as_deref() == task_id)
        })
    }

    /// Check a control-plane call's credentials and inject control-plane faults.
    fn check_control<T>(&self, rpc: &'static str, r: &Request<T>) -> Result<(), Status> {
        self.calls.hit(rpc);
        let m = r.metadata();
        let get = |k: &str| m.get(k).and_then(|v| v.to_str().ok());
        if get("x-retry-attempt").is_some_and(|a| a != "0")
            && let (Some(k), Ok(mut keys)) =
                (get("x-idempotency-key"), self.calls.retried_keys.lock())
        {
            keys.push(k.to_string());
        }
        if take_one(&self.faults.unavailable_next) {
            return Err(Status::unavailable("injected fault: service unavailable"));
        }
        if get("x-modal-token-id") != Some(self.token_id.as_str())
            || get("x-modal-token-secret") != Some(self.token_secret.as_str())
        {
            return Err(Status::unauthenticated(
                "Token ID or secret is invalid or missing",
            ));
        }
        if let Some(tok) = get("x-modal-auth-token")
            && !self.token_ok(tok, None)
        {
            return Err(Status::unauthenticated("auth token is invalid or expired"));
        }
        Ok(())
    }

    /// Check a router call's bearer JWT against the task it names.
    fn check_router<T>(
        &self,
        rpc: &'static str,
        r: &Request<T>,
        task_id: &str,
    ) -> Result<(), Status> {
        self.calls.hit(rpc);
        if take_one(&self.faults.router_unavailable_next) {
            return Err(Status::unavailable("injected fault: router unavailable"));
        }
        let tok = r
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match tok {
            Some(t) if self.token_ok(t, Some(task_id)) => Ok(()),
            _ => Err(Status::unauthenticated("missing, invalid or expired JWT")),
        }
    }

    fn by_id(&self, id: &str) -> Result<Arc<Sandbox>, Status> {
        self.sandboxes
            .lock()
            .ok()
            .and_then(|s| s.iter().find(|s| s.id == id).cloned())
            .ok_or_else(|| Status::not_found(format!("Sandbox {id} not found")))
    }

    fn by_task(&self, task_id: &str) -> Result<Arc<Sandbox>, Status> {
        self.sandboxes
            .lock()
            .ok()
            .and_then(|s| s.iter().find(|s| s.task_id == task_id).cloned())
            .ok_or_else(|| Status::not_found(format!("Task {task_id} not found")))
    }

    /// Make every router JWT issued so far invalid (as if they expired).
    pub fn expire_router_tokens(&self) {
        if let Ok(mut t) = self.tokens.lock() {
            t.retain(|_, i| i.task_id.is_none());
        }
    }
}

/// Decrement a fault counter; true when a fault was due.
fn take_one(c: &AtomicU32) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// A running stand-in. Dropping it stops the server and kills every sandbox.
pub struct ModalStandin {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
}

impl ModalStandin {
    /// Serve on `127.0.0.1:port` (0: any free port) from the current tokio runtime.
    pub async fn start(port: u16) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let hex = |n: usize| {
            (0..n)
                .map(|_| format!("{:x}", rand::random::<u8>() & 15))
                .collect::<String>()
        };
        let state = Arc::new(State {
            token_id: format!("ak-{}", hex(22)),
            token_secret: format!("as-{}", hex(22)),
            url,
            seq: AtomicU64::new(1),
            apps: Mutex::new(HashMap::new()),
            images: Mutex::new(HashMap::new()),
            sandboxes: Mutex::new(Vec::new()),
            tokens: Mutex::new(HashMap::new()),
            faults: Faults::default(),
            calls: Calls::default(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let control = ModalClientServer::new(control::Control(state.clone()))
            .max_decoding_message_size(64 * 1024 * 1024);
        let router = TaskCommandRouterServer::new(router::RouterService(state.clone()))
            .max_decoding_message_size(64 * 1024 * 1024);
        // Replies are small and interactive: without TCP_NODELAY, Nagle and
        // delayed ACKs add ~40 ms to every round trip.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |s| {
                if let Ok(s) = &s {
                    let _ = s.set_nodelay(true);
                }
                s
            },
        );
        tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(control)
                .add_service(router)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "modal stand-in stopped");
            }
        });
        Ok(Self {
            addr,
            state,
            stop: Some(stop),
        })
    }

    /// `MODAL_SERVER_URL` for a client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `MODAL_TOKEN_ID`.
    pub fn token_id(&self) -> &str {
        &self.state.token_id
    }

    /// `MODAL_TOKEN_SECRET`.
    pub fn token_secret(&self) -> &str {
        &self.state.token_secret
    }

    /// The settings a client needs, as `KEY=VALUE` pairs.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("MODAL_SERVER_URL".into(), self.url()),
            ("MODAL_TOKEN_ID".into(), self.token_id().into()),
            ("MODAL_TOKEN_SECRET".into(), self.token_secret().into()),
        ]
    }

    /// The shared state: faults to inject, calls made.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// End the running sandbox called `name` from outside, as the dashboard
    /// or a timeout would, with `status` (TERMINATED or TIMEOUT). Returns
    /// whether there was one.
    pub fn end_sandbox(&self, name: &str, status: GenericStatus) -> bool {
        let found = self.state.sandboxes.lock().ok().and_then(|s| {
            s.iter()
                .find(|s| s.name.as_deref() == Some(name) && s.result().is_none())
                .cloned()
        });
        match found {
            Some(sb) => {
                sb.finish(status, 0, "ended from outside the client");
                true
            }
            None => false,
        }
    }

    /// [`end_sandbox`](Self::end_sandbox) with TERMINATED.
    pub fn terminate(&self, name: &str) -> bool {
        self.end_sandbox(name, GenericStatus::Terminated)
    }

    /// The network the running sandbox `id` was made with: `block_network`,
    /// and its `network_access` (type, allowed CIDRs, allowed domains).
    pub fn network_of(&self, id: &str) -> Option<(bool, Option<AllowList>)> {
        let s = self.state.sandboxes.lock().ok()?;
        let sb = s.iter().find(|s| s.id == id)?;
        Some((
            sb.block_network,
            sb.network_access.as_ref().map(|n| {
                (
                    n.network_access_type,
                    n.allowed_cidrs.clone(),
                    n.allowed_domains.clone(),
                )
            }),
        ))
    }

    /// Ids of the sandboxes that still run.
    pub fn running(&self) -> Vec<String> {
        self.state
            .sandboxes
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|s| s.result().is_none())
                    .map(|s| s.id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Serve until SIGINT or SIGTERM, then stop every sandbox.
    pub async fn serve_forever(self) {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => std::future::pending::<()>().await,
        }
        drop(self);
    }
}

impl Drop for ModalStandin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Ok(s) = self.state.sandboxes.lock() {
            for sb in s.iter() {
                sb.finish(GenericStatus::Terminated, 0, "stand-in stopped");
            }
        }
    }
}

/// How long a `SandboxWait` or `ImageJoinStreaming` may hold a call open.
fn clamp_wait(secs: f32) -> Duration {
    Duration::from_secs_f32(secs.clamp(0.0, 60.0))
}
