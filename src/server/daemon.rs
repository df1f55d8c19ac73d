//! The server side of `berth serve`: one `Runtime` behind a unix socket.
//!
//! Flow at a glance:
//! 1. take `server.lock` (one server per state dir), remove a stale socket,
//!    bind a new one with mode 0600;
//! 2. accept connections, one task each; each peer's uid is read with
//!    `SO_PEERCRED` and every call from another uid is refused;
//! 3. `Exec` runs on the shared runtime in a task of its own: commands for
//!    different sandboxes run at once, commands for one sandbox queue on its
//!    shell; a call whose client went away is interrupted;
//! 4. every half second: put a waiter on each unfinished job that has none,
//!    so job endings are recorded as they happen; exit after the idle time
//!    with no call running and no job to watch, or at once when the socket is
//!    gone (the state dir was removed or another server took over);
//! 5. `Shutdown`: give up the socket and the lock at once (a new server can
//!    start), let running calls end, close the shells, exit.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use berth_core::runtime::{ExecRequest, Runtime, new_call_id};
use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::proto::berth_server::{Berth, BerthServer};
use super::proto::{
    ExecCall, ExecEvent, Failure, ForgetReply, ForgetRequest, HelloReply, HelloRequest,
    InterruptReply, InterruptRequest, Report, ShutdownReply, ShutdownRequest, exec_event,
};

/// How long a shutdown waits for running calls before closing the shells.
const DRAIN: Duration = Duration::from_secs(15);

/// What every connection shares.
struct Shared {
    rt: Runtime,
    state_dir: PathBuf,
    socket: PathBuf,
    /// (device, inode) of the socket this server bound.
    socket_id: (u64, u64),
    owner_uid: u32,
    started: Instant,
    idle: Duration,
    version: String,
    exe_id: String,
    config_key: String,
    active: AtomicUsize,
    last_active: Mutex<Instant>,
    /// Running calls by id, to interrupt them.
    calls: Mutex<HashMap<String, CancellationToken>>,
    /// Held while this server owns the state dir's socket.
    lock: Mutex<Option<File>>,
    /// Unfinished jobs with a waiter of this server's on them.
    watching: Mutex<HashSet<String>>,
    shutdown: CancellationToken,
}

impl Shared {
    /// Give up the socket and the lock: a new server may start from now on.
    fn release(&self) {
        if self.socket_is_ours() {
            let _ = std::fs::remove_file(&self.socket);
        }
        if let Ok(mut l) = self.lock.lock() {
            l.take();
        }
    }

    fn socket_is_ours(&self) -> bool {
        std::fs::symlink_metadata(&self.socket)
            .map(|m| (m.dev(), m.ino()) == self.socket_id)
            .unwrap_or(false)
    }

    fn interrupt_all(&self) {
        if let Ok(calls) = self.calls.lock() {
            for c in calls.values() {
                c.cancel();
            }
        }
    }
}

/// Counts a running call; the idle clock restarts when it ends.
struct Active(Arc<Shared>);

impl Active {
    fn new(s: &Arc<Shared>) -> Active {
        s.active.fetch_add(1, Ordering::SeqCst);
        Active(s.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if let Ok(mut t) = self.0.last_active.lock() {
            *t = Instant::now();
        }
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection: the shared state and the peer's uid.
struct Conn {
    shared: Arc<Shared>,
    peer_uid: Option<u32>,
}

impl Conn {
    fn check_peer(&self) -> Result<(), Status> {
        match self.peer_uid {
            Some(uid) if uid == self.shared.owner_uid => Ok(()),
            Some(uid) => Err(Status::permission_denied(format!(
                "this berth server belongs to uid {}; uid {uid} may not use it. Use your own state dir (BERTH_STATE_DIR) or BERTH_SERVER=off",
                self.shared.owner_uid
            ))),
            None => Err(Status::permission_denied(
                "cannot read the peer's credentials (SO_PEERCRED); refusing the connection",
            )),
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<ExecEvent, Status>> + Send>>;

fn event(e: exec_event::Event) -> ExecEvent {
    ExecEvent { event: Some(e) }
}

#[tonic::async_trait]
impl Berth for Conn {
    async fn hello(&self, _: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        self.check_peer()?;
        let s = &self.shared;
        Ok(Response::new(HelloReply {
            version: s.version.clone(),
            protocol: super::PROTOCOL,
            exe_id: s.exe_id.clone(),
            config_key: s.config_key.clone(),
            pid: std::process::id(),
            uptime_ms: s.started.elapsed().as_millis() as u64,
            active_calls: s.active.load(Ordering::SeqCst) as u32,
            sessions: s.rt.open_sessions().await as u32,
            idle_secs: s.idle.as_secs(),
            state_dir: s.state_dir.display().to_string(),
            watched_jobs: s.watching.lock().map(|w| w.len()).unwrap_or(0) as u32,
        }))
    }

    type ExecStream = EventStream;

    async fn exec(&self, req: Request<ExecCall>) -> Result<Response<EventStream>, Status> {
        self.check_peer()?;
        let call = req.into_inner();
        let timeout = match call.timeout_secs {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                return Err(Status::invalid_argument(format!(
                    "--timeout must be a positive number of seconds, got {t}; e.g. --timeout 30"
                )));
            }
            t => t.map(Duration::from_secs_f64),
        };
        let shared = self.shared.clone();
        let active = Active::new(&shared);
        let call_id = new_call_id();
        let cancel = CancellationToken::new();
        if let Ok(mut calls) = shared.calls.lock() {
            calls.insert(call_id.clone(), cancel.clone());
        }
        let (tx, rx) = mpsc::unbounded_channel::<ExecEvent>();
        let _ = tx.send(event(exec_event::Event::Started(call_id.clone())));
        tokio::spawn(async move {
            let _active = active;
            // The client went away (closed its terminal, was killed): interrupt.
            let gone = {
                let (tx, cancel) = (tx.clone(), cancel.clone());
                tokio::spawn(async move {
                    tx.closed().await;
                    cancel.cancel();
                })
            };
            let session = if call.session.is_empty() {
                berth_core::runtime::MAIN_SESSION.to_string()
            } else {
                call.session.clone()
            };
            if shared
                .rt
                .is_busy(&call.backend, &call.sandbox, &session)
                .await
            {
                let _ = tx.send(event(exec_event::Event::Notice(format!(
                    "waiting for the command before this one in sandbox `{}` (session {session}) to end",
                    call.sandbox
                ))));
            }
            let out = tx.clone();
            let notices = tx.clone();
            let req = ExecRequest {
                backend: call.backend.clone(),
                sandbox: call.sandbox.clone(),
                session: Some(session),
                command: call.command,
                timeout,
                stdin: call.stdin,
                cancel: Some(cancel),
                tee: Some(Arc::new(move |b: &[u8]| {
                    let _ = out.send(event(exec_event::Event::Output(b.to_vec())));
                })),
                on_approval: Some(Arc::new(move |ap| {
                    let _ = notices.send(event(exec_event::Event::Notice(
                        crate::context::approval_notice_text(ap),
                    )));
                })),
                call_id: Some(call_id.clone()),
                ..Default::default()
            };
            let applied =
                crate::cmd_exec::effective_timeout(timeout, shared.rt.gate(), &call.sandbox);
            let outcome = shared.rt.exec(req).await;
            let last = match outcome {
                Ok(r) => exec_event::Event::Report(Report {
                    json: crate::cmd_exec::report_json(&r, &call.backend, &call.sandbox)
                        .to_string(),
                    exit_code: r.result.exit_code,
                    timeout_secs: applied.as_secs_f64(),
                }),
                Err(e) => exec_event::Event::Failure(Failure {
                    denied: matches!(e, berth_core::Error::Denied { .. }),
                    message: e.to_string(),
                }),
            };
            let _ = tx.send(event(last));
            gone.abort();
            if let Ok(mut calls) = shared.calls.lock() {
                calls.remove(&call_id);
            }
        });
        let stream =
            futures::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
            );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn interrupt(
        &self,
        req: Request<InterruptRequest>,
    ) -> Result<Response<InterruptReply>, Status> {
        self.check_peer()?;
        let id = req.into_inner().call_id;
        let found = match self.shared.calls.lock() {
            Ok(calls) => calls.get(&id).map(|c| c.cancel()).is_some(),
            Err(_) => false,
        };
        Ok(Response::new(InterruptReply { found }))
    }

    async fn forget(&self, req: Request<ForgetRequest>) -> Result<Response<ForgetReply>, Status> {
        self.check_peer()?;
        let r = req.into_inner();
        self.shared.rt.forget_session(&r.backend, &r.sandbox).await;
        Ok(Response::new(ForgetReply {}))
    }

    async fn shutdown(
        &self,
        req: Request<ShutdownRequest>,
    ) -> Result<Response<ShutdownReply>, Status> {
        self.check_peer()?;
        let interrupt = req.into_inner().interrupt;
        info!(interrupt, "shutdown requested");
        // Before replying: the caller may start a new server right away.
        self.shared.release();
        if interrupt {
            self.shared.interrupt_all();
        }
        self.shared.shutdown.cancel();
        Ok(Response::new(ShutdownReply {
            pid: std::process::id(),
        }))
    }
}

/// Take the state dir's server lock without waiting; `None` if a server holds it.
fn take_lock(state_dir: &Path) -> Result<Option<File>> {
    use std::os::fd::AsRawFd;
    let path = super::lock_path(state_dir);
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open the server lock {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(Some(f));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(None);
    }
    Err(err).with_context(|| format!("cannot lock {}", path.display()))
}

/// Bind the socket with mode 0600 from the start (no window where another user
/// could connect), then put the process's umask back for the shells.
fn bind(socket: &Path) -> Result<UnixListener> {
    // SAFETY: umask only swaps the process's file-creation mask; no thread of
    // this process creates files in between (the server is single-threaded here).
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(socket);
    // SAFETY: as above, restoring the mask the process had.
    unsafe { libc::umask(old) };
    let l = bound.with_context(|| format!("cannot listen on {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot set the mode of {}", socket.display()))?;
    Ok(l)
}

/// Run the server in the foreground until it is idle, stopped or replaced.
/// Returns 0, also when another server already holds the state dir.
pub async fn serve(state_dir: PathBuf, rt: Runtime, idle: Duration, version: String) -> Result<u8> {
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("cannot create the state dir {}", state_dir.display()))?;
    let Some(lock) = take_lock(&state_dir)? else {
        eprintln!(
            "berth: a server already runs for {}; `berth server status` shows it",
            state_dir.display()
        );
        return Ok(0);
    };
    let socket = super::socket_path(&state_dir);
    // We hold the lock, so whatever socket is there belongs to a dead server.
    match std::fs::remove_file(&socket) {
        Ok(()) => info!(socket = %socket.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot remove the stale socket {}", socket.display()));
        }
    }
    let listener = bind(&socket)?;
    let meta = std::fs::symlink_metadata(&socket)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let owner_uid = unsafe { libc::geteuid() };
    let shared = Arc::new(Shared {
        rt,
        state_dir: state_dir.clone(),
        socket: socket.clone(),
        socket_id: (meta.dev(), meta.ino()),
        owner_uid,
        started: Instant::now(),
        idle,
        version,
        exe_id: super::exe_id(),
        config_key: super::config_key(),
        active: AtomicUsize::new(0),
        last_active: Mutex::new(Instant::now()),
        calls: Mutex::new(HashMap::new()),
        lock: Mutex::new(Some(lock)),
        watching: Mutex::new(HashSet::new()),
        shutdown: CancellationToken::new(),
    });
    info!(pid = std::process::id(), socket = %socket.display(), idle_secs = idle.as_secs(), "berth server listening");
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(shared.clone(), stream));
                }
                Err(e) => warn!(error = %e, "accept failed"),
            },
            _ = tick.tick() => {
                if !shared.socket_is_ours() {
                    info!("the socket was removed or replaced; exiting");
                    break;
                }
                watch_jobs(&shared);
                let since = shared.last_active.lock().map(|t| t.elapsed()).unwrap_or_default();
                let watched = shared.watching.lock().map(|w| w.len()).unwrap_or(0);
                if shared.active.load(Ordering::SeqCst) == 0 && watched == 0 && since >= idle {
                    info!(idle_secs = idle.as_secs(), "idle; exiting");
                    break;
                }
            }
        }
    }
    drop(listener);
    shared.release();
    let deadline = Instant::now() + DRAIN;
    while shared.active.load(Ordering::SeqCst) > 0 {
        if Instant::now() >= deadline {
            warn!("calls still running after the drain period; interrupting them");
            shared.interrupt_all();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shared.rt.shutdown().await;
    Ok(0)
}

/// Put a waiter on every unfinished job that has none, whoever started it, so
/// its ending (`job.exited`, `job.killed`, ...) is recorded when it happens,
/// not when someone next asks. A server with jobs to watch is not idle.
fn watch_jobs(shared: &Arc<Shared>) {
    let jobs = match shared.rt.store().jobs() {
        Ok(j) => j,
        Err(e) => {
            warn!(error = %e, "listing jobs to watch");
            return;
        }
    };
    for job in jobs.into_iter().filter(|j| !j.state.is_final()) {
        let fresh = shared
            .watching
            .lock()
            .map(|mut w| w.insert(job.id.clone()))
            .unwrap_or(false);
        if !fresh {
            continue;
        }
        let s = shared.clone();
        tokio::spawn(async move {
            let id = job.id;
            match s.rt.wait_job(&id, None).await {
                Ok(j) => info!(job = %id, state = j.state.as_str(), "job ended"),
                // Tried again at the next tick; a sandbox that is gone marks
                // its jobs lost, which ends the watch.
                Err(e) => {
                    warn!(job = %id, error = %e, "waiting for a job");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
            if let Ok(mut w) = s.watching.lock() {
                w.remove(&id);
            }
        });
    }
}

async fn serve_connection(shared: Arc<Shared>, stream: UnixStream) {
    let peer_uid = stream.peer_cred().ok().map(|c| c.uid());
    if peer_uid != Some(shared.owner_uid) {
        warn!(?peer_uid, "refusing a connection from another uid");
    }
    let svc = BerthServer::new(Conn { shared, peer_uid });
    let conn = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(svc),
        );
    if let Err(e) = conn.await {
        info!(error = %e, "connection ended");
    }
}

/// Fail early with a clear message when the state dir cannot hold a socket path.
pub fn check_socket_path(state_dir: &Path) -> Result<()> {
    let p = super::socket_path(state_dir);
    // sun_path holds 108 bytes with its NUL.
    if p.as_os_str().len() >= 108 {
        bail!(
            "the server socket path {} is too long for a unix socket (107 bytes at most); use a shorter --state-dir or BERTH_SERVER=off",
            p.display()
        );
    }
    Ok(())
}
