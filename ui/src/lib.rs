//! `berth ui`: the dashboard the per-user server serves over HTTP, to watch
//! sandboxes, jobs, runs and events, and to answer approvals.
//!
//! Flow at a glance:
//! 1. `berth ui` writes the dashboard's settings (`ui.json` in the state dir,
//!    mode 0600: a secret token and the address to listen on) and makes sure
//!    the server runs;
//! 2. the server's [`watch`] task sees the settings (at start, and every
//!    half second after), binds the listener and writes where it listens to
//!    `ui.addr`; `berth ui` reads that and prints the URL with the token. A
//!    removed `ui.json` (`berth ui --stop`) stops the dashboard. A new server
//!    binds the address its predecessor had, when it is free, so a page's
//!    live streams reconnect by themselves across a restart;
//! 3. each connection's peer is looked up before it is served: a process
//!    inside a sandbox is dropped unheard (it could otherwise approve its own
//!    request), and so is any peer whose process cannot be found;
//! 4. every request must carry the token: once in the URL (`?token=`, or
//!    the one-time `?once=` code the browser is opened with, so that no
//!    command line holds the token), which sets an `HttpOnly`,
//!    `SameSite=Strict` cookie and redirects to the same page without it,
//!    and that cookie after. The cookie is a digest of the token and a key
//!    of the address bound ([`Bound::key`]), so it works nowhere else. Its `Host` must be the
//!    dashboard's own address (no DNS rebinding), and a request that changes
//!    state (a `POST`) must also come with the dashboard's own `Origin`.
//!
//! Pages are rendered on the server ([`pages`], with maud); their live parts
//! are Server-Sent Events ([`live`]) read by a few lines of plain JavaScript
//! ([`assets`]). Nothing is loaded from elsewhere.

mod actions;
mod assets;
mod auth;
mod data;
mod html;
mod live;
mod pages;
mod seen;
mod svg;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Router;
use axum::middleware;
use axum::routing::{get, post};
use berth_core::runtime::Runtime;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

/// The dashboard's settings, written by `berth ui`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The secret every request must carry (hex).
    pub token: String,
    /// Where to listen: `127.0.0.1:0` picks a free loopback port.
    pub listen: String,
}

impl Settings {
    /// A digest naming these settings, which the server writes beside the
    /// address it bound ([`Bound::serves`]): `berth ui` knows the dashboard
    /// serves what it just asked for by this, not by a file's time (a
    /// file's mtime comes from a coarse clock and can read earlier than
    /// the moment it was written after).
    pub fn tag(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"berth-ui-settings\0");
        h.update(self.token.as_bytes());
        h.update(b"\0");
        h.update(self.listen.as_bytes());
        hex::encode(&h.finalize()[..16])
    }
}

/// Where the server's dashboard listens, written by the server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    /// The address bound.
    pub addr: SocketAddr,
    /// The server's pid.
    pub pid: u32,
    /// The per-address key the cookie is bound to (hex): kept while the
    /// dashboard keeps its address, new when it moves, so a cookie the
    /// browser sends to an old address is worth nothing there. Empty in a
    /// file written before keys existed.
    #[serde(default)]
    pub key: String,
    /// [`Settings::tag`] of the settings served. Empty in a file written
    /// before tags existed.
    #[serde(default)]
    pub serves: String,
}

/// The default address: loopback, a port the kernel picks.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:0";

pub fn settings_path(state_dir: &Path) -> PathBuf {
    state_dir.join("ui.json")
}

pub fn bound_path(state_dir: &Path) -> PathBuf {
    state_dir.join("ui.addr")
}

/// The one-time code `berth ui` opens the browser with (mode 0600).
pub fn once_path(state_dir: &Path) -> PathBuf {
    state_dir.join("ui.once")
}

/// A one-time code for the browser's first visit, in place of the token: a
/// command line (`xdg-open URL`) is readable by every process of the host,
/// sandboxes too. Spent at its first use, and good for [`ONCE_TTL`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Once {
    pub code: String,
    /// Seconds since the epoch after which it is refused.
    pub until: u64,
}

/// How long a one-time code is good for: a browser's cold start.
pub const ONCE_TTL: Duration = Duration::from_secs(120);

/// The settings, if the dashboard is on.
pub fn settings(state_dir: &Path) -> Option<Settings> {
    let text = std::fs::read(settings_path(state_dir)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Where the dashboard listens, as the server last wrote it.
pub fn bound(state_dir: &Path) -> Option<Bound> {
    let text = std::fs::read(bound_path(state_dir)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Write `value` to `path` as JSON, mode 0600, whole or not at all.
pub fn write_private(path: &Path, value: &impl Serialize) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(&serde_json::to_vec(value)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The cookie for `token` at an address whose key is `key`: not the token
/// itself, which works at any address the dashboard moves to.
fn cookie_value(token: &str, key: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"berth-ui-cookie\0");
    h.update(token.as_bytes());
    h.update(b"\0");
    h.update(key.as_bytes());
    hex::encode(h.finalize())
}

/// A new secret token: 32 random bytes, in hex.
pub fn new_token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// What the dashboard's handlers share.
pub(crate) struct Ui {
    pub rt: Arc<Runtime>,
    pub state_dir: PathBuf,
    pub token: String,
    /// The cookie's value: a digest of the token and [`Bound::key`].
    pub cookie: String,
    /// The address bound.
    pub addr: SocketAddr,
    /// The `Host` values a request may carry; `None`: any (a dashboard on
    /// every address, `0.0.0.0`, is reached by names berth cannot know).
    pub hosts: Option<Vec<String>>,
    /// The `Origin` values a state-changing request may carry.
    pub origins: Vec<String>,
    /// The policy file `Always` adds its rule to.
    pub policy: Option<PathBuf>,
    /// Open live streams and running requests.
    pub busy: Arc<AtomicUsize>,
    /// Set when the dashboard stops: live streams end.
    pub stop: CancellationToken,
}

impl Ui {
    /// The cookie's name: one per port, so two servers on one host (two
    /// state dirs) do not overwrite each other's.
    pub fn cookie_name(&self) -> String {
        format!("berth_ui_{}", self.addr.port())
    }
}

/// Counts a live stream or a request as dashboard activity while it lives.
pub(crate) struct Busy(Arc<AtomicUsize>);

impl Busy {
    pub fn new(n: &Arc<AtomicUsize>) -> Busy {
        n.fetch_add(1, Ordering::SeqCst);
        Busy(n.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `Host` and `Origin` values of a dashboard at `addr`. One on every
/// address takes any `Host`, and actions only from its loopback names (its
/// other peers are read-only anyway: see [`peer_is_refused`]).
fn names(addr: SocketAddr) -> (Option<Vec<String>>, Vec<String>) {
    let port = addr.port();
    let loopback = vec![
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ];
    let origins = |hosts: &[String]| hosts.iter().map(|h| format!("http://{h}")).collect();
    if addr.ip().is_unspecified() {
        return (None, origins(&loopback));
    }
    let mut hosts = vec![match addr {
        SocketAddr::V4(a) => format!("{}:{port}", a.ip()),
        SocketAddr::V6(a) => format!("[{}]:{port}", a.ip()),
    }];
    if addr.ip().is_loopback() {
        hosts.push(format!("localhost:{port}"));
    }
    let o = origins(&hosts);
    (Some(hosts), o)
}

/// A running dashboard.
struct Running {
    settings: Settings,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

/// The server's dashboard task: follow `ui.json`, start, restart or stop the
/// dashboard to match it. `busy` counts the dashboard's open streams and
/// requests, for the server's idle check.
pub fn watch(
    rt: Arc<Runtime>,
    state_dir: PathBuf,
    busy: Arc<AtomicUsize>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(
        async move {
            let mut running: Option<Running> = None;
            // Woken by a write of `ui.json` (`berth ui` on, off, a new
            // token); a dashboard that would not start is tried again.
            let mut bell = berth_core::bell::Bell::file(
                &settings_path(&state_dir),
                Duration::from_millis(500),
            );
            let mut last_error: Option<(String, Instant)> = None;
            let mut next = Duration::ZERO;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = bell.wait(next) => {}
                }
                next = Duration::from_secs(60);
                let want = settings(&state_dir);
                if running.as_ref().map(|r| &r.settings) == want.as_ref() {
                    continue;
                }
                if let Some(r) = running.take() {
                    r.stop.cancel();
                    let _ = r.done.await;
                    info!("dashboard stopped");
                }
                // Off: forget the address. Changed (a new token, say): the
                // same address is bound again, so open pages find it.
                let Some(want) = want else {
                    let _ = std::fs::remove_file(bound_path(&state_dir));
                    continue;
                };
                match start(&rt, &state_dir, &want, &busy).await {
                    Ok(r) => running = Some(r),
                    Err(e) => {
                        next = Duration::from_secs(2);
                        // Said once a minute, not every tick.
                        let text = berth_client::error_text(&e);
                        let again = last_error.as_ref().is_none_or(|(t, at)| {
                            *t != text || at.elapsed() > Duration::from_secs(60)
                        });
                        if again {
                            warn!(error = %text, "cannot start the dashboard");
                            last_error = Some((text, Instant::now()));
                        }
                    }
                }
            }
            if let Some(r) = running.take() {
                r.stop.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(2), r.done).await;
            }
        }
        .instrument(tracing::info_span!("ui")),
    )
}

/// Bind and serve the dashboard for `settings`. The address the last
/// server bound is tried first, so open pages reconnect to this one.
async fn start(
    rt: &Arc<Runtime>,
    state_dir: &Path,
    settings: &Settings,
    busy: &Arc<AtomicUsize>,
) -> Result<Running> {
    let listen: SocketAddr = settings.listen.parse().with_context(|| {
        format!(
            "the dashboard's address `{}` is not IP:PORT; run `berth ui --listen 127.0.0.1:8080`",
            settings.listen
        )
    })?;
    let last = bound(state_dir);
    let before = last
        .as_ref()
        .map(|b| b.addr)
        .filter(|a| listen.port() == 0 && a.ip() == listen.ip());
    let listener = match before {
        Some(a) => match TcpListener::bind(a).await {
            Ok(l) => l,
            Err(_) => TcpListener::bind(listen).await?,
        },
        None => TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?,
    };
    let addr = listener.local_addr()?;
    // The same address as before: the same key, so open pages go on. A new
    // one: a new key, so a cookie sent to the old address is worth nothing.
    let key = last
        .filter(|b| b.addr == addr && !b.key.is_empty())
        .map_or_else(new_token, |b| b.key);
    let (hosts, origins) = names(addr);
    let stop = CancellationToken::new();
    let ui = Arc::new(Ui {
        rt: rt.clone(),
        state_dir: state_dir.to_path_buf(),
        token: settings.token.clone(),
        cookie: cookie_value(&settings.token, &key),
        addr,
        hosts,
        origins,
        policy: berth_client::policy_path().ok(),
        busy: busy.clone(),
        stop: stop.clone(),
    });
    write_private(
        &bound_path(state_dir),
        &Bound {
            addr,
            pid: std::process::id(),
            key,
            serves: settings.tag(),
        },
    )?;
    info!(%addr, "dashboard listening");
    let done = tokio::spawn(serve(ui, listener));
    Ok(Running {
        settings: settings.clone(),
        stop,
        done,
    })
}

/// Every route, behind the checks of [`auth::check`].
fn router(ui: Arc<Ui>) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/jobs/{id}", get(pages::job))
        .route("/runs/{id}", get(pages::run))
        .route("/events", get(pages::events))
        .route("/live/overview", get(live::overview))
        .route("/live/jobs/{id}", get(live::job))
        .route("/live/runs/{id}", get(live::run))
        .route("/live/events", get(live::events))
        .route("/approvals/{id}/{answer}", post(actions::answer))
        .route("/jobs/{id}/kill", post(actions::kill))
        .route("/runs/{id}/resume", post(actions::resume))
        .route("/runs/{id}/fork", post(actions::fork))
        .route("/assets/app.js", get(assets::js))
        .route("/assets/app.css", get(assets::css))
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(ui.clone(), auth::check))
        .with_state(ui)
}

async fn fallback(uri: axum::http::Uri) -> axum::response::Response {
    html::not_found("page", uri.path())
}

/// Connections served at once; past this, accepting waits.
const MAX_CONNECTIONS: usize = 256;

/// The accept loop: each peer is checked, then served over HTTP/1.1.
async fn serve(ui: Arc<Ui>, listener: TcpListener) {
    let app = router(ui.clone());
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = ui.stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (stream, peer) = tokio::select! {
            _ = ui.stop.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => { warn!(error = %e, "dashboard: accept failed"); continue; }
            },
        };
        let (ui, app) = (ui.clone(), app.clone());
        tokio::spawn(async move {
            // The connection's own local address: on a dashboard bound to
            // every address that is the one the peer connected to.
            let local = stream.local_addr().unwrap_or(ui.addr);
            let loopback = ui.addr.ip().to_canonical().is_loopback();
            let who =
                tokio::task::spawn_blocking(move || peer_is_refused(peer, local, loopback)).await;
            let here = match who {
                Ok(Ok(here)) => here,
                Ok(Err(why)) => {
                    warn!(%peer, %why, "dashboard: refused a connection");
                    return;
                }
                Err(e) => {
                    warn!(%peer, error = %e, "dashboard: could not check a connection's peer; refused it");
                    return;
                }
            };
            // Each request carries its connection's peer, for the checks.
            let app = tower::ServiceExt::map_request(
                app,
                move |mut r: hyper::Request<hyper::body::Incoming>| {
                    r.extensions_mut().insert(auth::Peer { here });
                    r
                },
            );
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(
                hyper_util::rt::TokioIo::new(stream),
                hyper_util::service::TowerToHyperService::new(app),
            );
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r { info!(error = %e, "dashboard: connection ended") },
                _ = ui.stop.cancelled() => {}
            }
            drop(slot);
        });
    }
}

/// Whether a connection from `peer` is served, and how: `Ok(true)` from a
/// process of this host, of this server's uid and in no sandbox (looked up
/// by its socket, whatever its source address); `Ok(false)` from another
/// host (`--listen` on a public address), which cannot be looked up, so such
/// a peer only reads (see [`auth`]). Refused (`Err`, why): a sandbox's
/// process (it could answer its own approval, with a token it read or
/// guessed), another uid's, or, on a loopback dashboard, a peer that
/// cannot be found.
fn peer_is_refused(
    peer: SocketAddr,
    local: SocketAddr,
    loopback: bool,
) -> std::result::Result<bool, String> {
    berth_core::identity::check_tcp_peer(peer, local, loopback)
}
