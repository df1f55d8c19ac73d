//! The server side of `berth serve`: one `Runtime` behind a unix socket.
//!
//! Flow at a glance:
//! 1. take `server.lock` (one server per state dir), remove a stale socket,
//!    bind a new one with mode 0600;
//! 2. accept connections, one task each, at most [`MAX_CONNECTIONS`] at once
//!    (past that, accepting waits and clients queue in the socket's backlog);
//!    each peer's uid is read with `SO_PEERCRED` and every call from another
//!    uid is refused;
//! 3. `Exec` runs on the shared runtime in a task of its own: commands for
//!    different sandboxes run at once, commands for one sandbox queue on its
//!    shell; a call whose client went away is interrupted;
//! 4. the dashboard (`berth ui`, [`crate::ui`]) runs beside, on its own
//!    loopback port, while its settings say so; an open page counts as use;
//! 5. every half second, in a task of its own: put a waiter on each
//!    unfinished job that has none, so job endings are recorded as they
//!    happen; in the accept loop: exit after the idle time
//!    with no call running and no job to watch, or at once when the socket is
//!    gone (the state dir was removed or another server took over);
//! 6. `Shutdown` or SIGTERM/SIGINT: give up the socket and the lock at once
//!    (a new server can start), let running calls end (woken when the last
//!    one does, interrupted after [`DRAIN`]), close the shells, exit.
//!
//! The server runs on a multi-threaded runtime
//! ([`berth_client::server_runtime`]): a call waiting on SQLite's write lock
//! (another berth holds it) blocks its own worker only, and hands that
//! worker's other tasks on, so other sessions, job watchers and clients go on.
//!
//! Why the accept loop is written here and not left to tonic's
//! `Server::serve_with_incoming_shutdown` (tonic 0.14): that function takes
//! the next connection whenever its incoming stream yields one and has no cap
//! on connections (`concurrency_limit_per_connection` limits the requests
//! *within* one connection), so the cap would have to be written anyway, as
//! a stream that waits for a semaphore permit plus an IO type that holds the
//! permit and forwards `AsyncRead`, `AsyncWrite` and `Connected`: more code
//! than the `select!` below, not less. Its shutdown is one future: once it
//! resolves, tonic stops accepting and then waits for every connection to
//! close, without a bound (only `max_connection_age_grace`, which would also
//! cut a long `exec` or `attach` in normal running). Ours is ordered, and
//! each step is bounded: give up the socket and the lock at once, wait up to
//! [`DRAIN`] for running calls (woken by the last one), interrupt what is
//! left, close the shells, and give clients [`CLOSE_WAIT`] to read their
//! last reply. The idle exit and the socket check need the server's own
//! counters at each tick. Each connection is served with hyper's HTTP/2
//! builder, as tonic would, with the peer's uid bound into its service.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use berth_core::backend::BackendKind;
use berth_core::runtime::{ExecRequest, Runtime, new_call_id};
use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{Instrument, info, warn};

use super::proto::berth_server::{Berth, BerthServer};
use super::proto::{
    CheckedExec, ClientId, ExecCall, ExecEvent, Failure, ForgetReply, ForgetRequest, HelloReply,
    HelloRequest, InterruptReply, InterruptRequest, ShutdownReply, ShutdownRequest, ToolCall,
    ToolEvent, exec_event, tool_event,
};
use crate::live::{LIVE_CAP, Live};

/// How long a shutdown waits for running calls before closing the shells.
const DRAIN: Duration = Duration::from_secs(15);

/// Connections served at once; past this, accepting waits.
pub const MAX_CONNECTIONS: usize = 1024;

/// What every connection shares.
struct Shared {
    rt: Arc<Runtime>,
    /// The tools `CallTool` runs, for the runtime's policy.
    registry: berth_tools::Registry,
    /// The typed API's service (`berth.v1`), over the same runtime.
    service: Arc<berth_service::Service>,
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
    /// The number of running calls, for a shutdown to wait on.
    active_now: tokio::sync::watch::Sender<usize>,
    /// `Run` calls taken so far.
    /// Whether `exec` is taken over the quick framing.
    quick: bool,
    /// `exec` calls taken over the quick framing so far.
    quick_calls: std::sync::atomic::AtomicU64,
    /// Calls of the typed API (`berth.v1`) answered so far.
    api_calls: Arc<std::sync::atomic::AtomicU64>,
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

    /// Interrupt the running call `id`; whether one ran.
    fn interrupt(&self, id: &str) -> bool {
        match self.calls.lock() {
            Ok(calls) => calls.get(id).map(|c| c.cancel()).is_some(),
            Err(_) => false,
        }
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
        let n = s.active.fetch_add(1, Ordering::SeqCst) + 1;
        s.active_now.send_replace(n);
        Active(s.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if let Ok(mut t) = self.0.last_active.lock() {
            *t = Instant::now();
        }
        let n = self.0.active.fetch_sub(1, Ordering::SeqCst) - 1;
        self.0.active_now.send_replace(n);
    }
}

/// A call being served: counted as running, registered so `Interrupt` and a
/// shutdown can cancel it, and unregistered when it ends (dropped).
struct Serving {
    _active: Active,
    shared: Arc<Shared>,
    id: String,
    cancel: CancellationToken,
}

impl Serving {
    fn new(shared: &Arc<Shared>) -> Serving {
        let id = new_call_id();
        let cancel = CancellationToken::new();
        if let Ok(mut calls) = shared.calls.lock() {
            calls.insert(id.clone(), cancel.clone());
        }
        Serving {
            _active: Active::new(shared),
            shared: shared.clone(),
            id,
            cancel,
        }
    }

    /// Run the call's `work`; should its client go away first (closed its
    /// terminal, was killed: the stream to it is dropped), cancel the call and
    /// wait for the work to stop. In the call's own task rather than a task
    /// of its own: a second spawn would hand the first to another worker, and
    /// every event of the call would then wake a thread.
    async fn unless_gone<T, W: std::future::Future>(&self, live: &Live<T>, work: W) -> W::Output {
        tokio::pin!(work);
        tokio::select! {
            biased;
            out = &mut work => out,
            () = live.closed() => {
                self.cancel.cancel();
                work.await
            }
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Ok(mut calls) = self.shared.calls.lock() {
            calls.remove(&self.id);
        }
    }
}

/// One connection: the shared state and the peer's uid.
struct Conn {
    shared: Arc<Shared>,
    peer_uid: Option<u32>,
}

impl Conn {
    /// Refuse a call from a client of another version, build or
    /// configuration: it shakes hands and replaces this server instead.
    fn check_client(&self, client: Option<ClientId>) -> Result<(), Status> {
        self.check_peer()?;
        let s = &self.shared;
        let own = ClientId {
            version: s.version.clone(),
            protocol: super::PROTOCOL,
            exe_id: s.exe_id.clone(),
            config_key: s.config_key.clone(),
        };
        let client = client.unwrap_or_default();
        match super::client::differs(&own, &client) {
            None => Ok(()),
            Some(why) => Err(Status::failed_precondition(why)),
        }
    }

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

type EventStream = super::quick::Events;

/// A quick call (`berth exec` from the CLI) runs as `ExecChecked` does.
impl super::quick::Exec for Conn {
    async fn exec(&self, call: CheckedExec) -> Result<EventStream, Status> {
        let events = self.exec_checked(Request::new(call)).await?.into_inner();
        self.shared.quick_calls.fetch_add(1, Ordering::SeqCst);
        Ok(events)
    }

    fn interrupt(&self, call_id: &str) {
        self.shared.interrupt(call_id);
    }
}
type ToolStream = Pin<Box<dyn Stream<Item = Result<ToolEvent, Status>> + Send>>;

fn tool_event(e: tool_event::Event) -> ToolEvent {
    ToolEvent { event: Some(e) }
}

/// The live copy of a command's output for a client that may read slowly:
/// what does not fit the client's budget ([`LIVE_CAP`]) is left out of the
/// live view, counted, and named in a notice once there is room again; the
/// spool keeps it (within its cap) and the report counts it. The command
/// never waits for the client.
struct LiveTee {
    live: Live<ExecEvent>,
    left_out: std::sync::atomic::AtomicU64,
}

impl LiveTee {
    /// Send a chunk of stdout (or, with `err`, of stderr kept apart).
    fn push(&self, b: &[u8], err: bool) {
        self.say_left_out();
        let chunk = if err {
            exec_event::Event::Stderr(b.to_vec())
        } else {
            exec_event::Event::Output(b.to_vec())
        };
        if self.left_out.load(Ordering::SeqCst) > 0
            || !self.live.send_if_room(event(chunk), b.len())
        {
            self.left_out.fetch_add(b.len() as u64, Ordering::SeqCst);
        }
    }

    /// Name what was left out, if anything was and there is room to say so.
    fn say_left_out(&self) {
        let n = self.left_out.load(Ordering::SeqCst);
        if n == 0 || !self.live.half_empty() {
            return;
        }
        let notice = format!(
            "{n} bytes of output were left out here: this client read more slowly than the command wrote. The report's spool file (`--json`: `spool`) keeps it, up to the spool's cap (`BERTH_SPOOL_CAP_MB`, 16 by default)"
        );
        if self
            .live
            .send_if_room(event(exec_event::Event::Notice(notice)), 0)
        {
            self.left_out.store(0, Ordering::SeqCst);
        }
    }

    /// Before the report: say what was left out, whatever the queue holds.
    fn finish(&self) {
        let n = self.left_out.swap(0, Ordering::SeqCst);
        if n > 0 {
            self.live.send(
                event(exec_event::Event::Notice(format!(
                    "{n} bytes of output at the end were left out: this client read more slowly than the command wrote. The report's spool file (`--json`: `spool`) keeps it, up to the spool's cap (`BERTH_SPOOL_CAP_MB`, 16 by default)"
                ))),
                0,
            );
        }
    }
}

/// The backend a call of the socket protocol names (empty: the default).
fn backend_named(name: &str) -> Result<BackendKind, Status> {
    if name.is_empty() {
        return Ok(BackendKind::default());
    }
    BackendKind::named(name).map_err(Status::invalid_argument)
}

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
            quick_calls: s.quick_calls.load(Ordering::SeqCst),
            api_calls: s.api_calls.load(Ordering::SeqCst),
        }))
    }

    type ExecCheckedStream = EventStream;

    async fn exec_checked(
        &self,
        req: Request<CheckedExec>,
    ) -> Result<Response<EventStream>, Status> {
        let c = req.into_inner();
        self.check_client(c.client)?;
        let call = c
            .call
            .ok_or_else(|| Status::invalid_argument("the call has no command"))?;
        self.exec(Request::new(call)).await
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
        let serving = Serving::new(&shared);
        let (call_id, cancel) = (serving.id.clone(), serving.cancel.clone());
        let (tx, rx) = crate::live::live::<ExecEvent>(LIVE_CAP);
        tx.send(event(exec_event::Event::Started(call_id.clone())), 0);
        let backend = backend_named(&call.backend)?;
        let (span_call, span_sandbox) = (call_id.clone(), call.sandbox.clone());
        let span_session = if call.session.is_empty() {
            berth_core::runtime::MAIN_SESSION
        } else {
            call.session.as_str()
        }
        .to_string();
        tokio::spawn(async move {
            let session = if call.session.is_empty() {
                berth_core::runtime::MAIN_SESSION.to_string()
            } else {
                call.session.clone()
            };
            if shared
                .rt
                .is_busy(backend, &call.sandbox, &session)
                .await
            {
                tx.send(
                    event(exec_event::Event::Notice(format!(
                        "waiting for the command before this one in sandbox `{}` (session {session}) to end",
                        call.sandbox
                    ))),
                    0,
                );
            }
            let tee = Arc::new(LiveTee {
                live: tx.clone(),
                left_out: Default::default(),
            });
            let out = tee.clone();
            let err_out = tee.clone();
            let notices = tx.clone();
            let req = ExecRequest {
                backend,
                sandbox: call.sandbox.clone(),
                session: Some(session),
                command: call.command,
                timeout,
                stdin: call.stdin,
                cancel: Some(cancel),
                tee: Some(Arc::new(move |b: &[u8]| out.push(b, false))),
                stderr_tee: Some(Arc::new(move |b: &[u8]| err_out.push(b, true))),
                on_approval: Some(Arc::new(move |ap| {
                    notices.send(
                        event(exec_event::Event::Notice(
                            crate::exec_report::approval_notice_text(ap),
                        )),
                        0,
                    );
                })),
                call_id: Some(call_id.clone()),
                split_stderr: call.split_stderr,
                ..Default::default()
            };
            let applied =
                crate::exec_report::effective_timeout(timeout, shared.rt.gate(), &call.sandbox);
            let outcome = serving.unless_gone(&tx, shared.rt.exec(req)).await;
            let last = match outcome {
                Ok(r) => exec_event::Event::Report(crate::exec_report::to_proto(
                    &r,
                    backend,
                    &call.sandbox,
                    applied,
                )),
                Err(e) => exec_event::Event::Failure(Failure {
                    denied: matches!(e, berth_core::Error::Denied { .. }),
                    message: e.full_text(),
                }),
            };
            tee.finish();
            tx.send(event(last), 0);
            drop(serving);
        }.instrument(tracing::info_span!("exec", call = %span_call, sandbox = %span_sandbox, session = %span_session)));
        let stream = futures::StreamExt::map(rx.into_stream(), Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    type CallToolStream = ToolStream;

    async fn call_tool(&self, req: Request<ToolCall>) -> Result<Response<ToolStream>, Status> {
        use berth_tools::{ApprovalMode, Progress, ToolContext};
        self.check_peer()?;
        let call = req.into_inner();
        let args: serde_json::Value = serde_json::from_str(&call.args_json).map_err(|e| {
            Status::invalid_argument(format!("the tool's arguments are not JSON: {e}"))
        })?;
        if !call.session.is_empty() {
            berth_core::runtime::check_session_name(&call.session)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        let shared = self.shared.clone();
        let serving = Serving::new(&shared);
        let cancel = serving.cancel.clone();
        let (tx, rx) = crate::live::live::<ToolEvent>(LIVE_CAP);
        tx.send(
            tool_event(tool_event::Event::Started(serving.id.clone())),
            0,
        );
        let backend = backend_named(&call.backend)?;
        let (span_call, span_sandbox, span_tool) =
            (serving.id.clone(), call.sandbox.clone(), call.name.clone());
        tokio::spawn(async move {
            let mut ctx = ToolContext::new(shared.rt.clone(), backend, &call.sandbox)
                .with_cancel(cancel)
                .with_approval(if call.defer_approvals {
                    ApprovalMode::Defer
                } else {
                    ApprovalMode::Wait
                });
            if !call.session.is_empty() {
                ctx = ctx.with_session(&call.session);
            }
            if call.progress {
                let tx = tx.clone();
                ctx = ctx.with_progress(Arc::new(move |p: &Progress| {
                    if let Ok(j) = serde_json::to_string(p) {
                        // Progress is advisory: a client behind on reading misses some.
                        tx.send_if_room(tool_event(tool_event::Event::Progress(j)), 0);
                    }
                }));
            }
            let o = serving
                .unless_gone(&tx, shared.registry.dispatch(&ctx, &call.name, args))
                .await;
            let json = serde_json::to_string(&o).unwrap_or_else(|e| {
                serde_json::json!({
                    "call_id": o.call_id, "text": format!("cannot encode the outcome: {e}"),
                    "is_error": true, "kind": {"kind": "error"}, "data": null, "spool": null,
                })
                .to_string()
            });
            tx.send(tool_event(tool_event::Event::Outcome(json)), 0);
            drop(serving);
        }.instrument(tracing::info_span!("tool", call = %span_call, sandbox = %span_sandbox, tool = %span_tool)));
        let stream = futures::StreamExt::map(rx.into_stream(), Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn interrupt(
        &self,
        req: Request<InterruptRequest>,
    ) -> Result<Response<InterruptReply>, Status> {
        self.check_peer()?;
        let id = req.into_inner().call_id;
        let found = self.shared.interrupt(&id);
        Ok(Response::new(InterruptReply { found }))
    }

    async fn forget(&self, req: Request<ForgetRequest>) -> Result<Response<ForgetReply>, Status> {
        self.check_peer()?;
        let r = req.into_inner();
        self.shared
            .rt
            .forget_session(backend_named(&r.backend)?, &r.sandbox)
            .await;
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
    let path = super::lock_path(state_dir);
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open the server lock {}", path.display()))?;
    // std's file lock is flock(2) on Linux: held until the file is closed,
    // released by the kernel when the process dies.
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// Bind the socket with mode 0600 from the start, with no window where
/// another user could connect: it is bound in a fresh directory only this
/// user can enter, made 0600 there, then renamed into place. (No umask: the
/// server's other threads may be creating files meanwhile.)
fn bind(socket: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = socket.parent().unwrap_or(Path::new("."));
    let private = parent.join(format!(".bind-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("cannot create {}", private.display()))?;
    let staged = private.join("s");
    let bound = UnixListener::bind(&staged)
        .with_context(|| format!("cannot listen on {}", socket.display()))
        .and_then(|l| {
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot set the mode of {}", staged.display()))?;
            std::fs::rename(&staged, socket)
                .with_context(|| format!("cannot move the socket to {}", socket.display()))?;
            Ok(l)
        });
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Run the server in the foreground until it is idle, stopped or replaced.
/// Returns 0, also when another server already holds the state dir.
/// How a server runs, beyond its state dir and runtime.
pub struct Options {
    /// Exit after this long with nothing to do.
    pub idle: Duration,
    /// The version the handshake reports.
    pub version: String,
    /// Take `exec` calls over the quick framing; off, the server answers as
    /// one from before that framing (tests of the client's fallback).
    pub quick: bool,
}

pub async fn serve(state_dir: PathBuf, rt: Runtime, opts: Options) -> Result<u8> {
    let Options {
        idle,
        version,
        quick,
    } = opts;
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
    let rt = Arc::new(rt);
    // Sandboxes whose way out is berth's egress proxy: their doors open
    // now, not at their next call, so a background job's connections go
    // through again after a restart.
    {
        let rt = rt.clone();
        tokio::spawn(async move {
            match rt.open_doors().await {
                Ok(0) => {}
                Ok(n) => info!(doors = n, "opened sandboxes' network doors"),
                Err(e) => tracing::warn!(error = %e, "could not open sandboxes' network doors"),
            }
        });
    }
    // Warm pools: their members' shells open now, so the first take after
    // a restart is as quick as any.
    {
        let rt = rt.clone();
        tokio::spawn(async move {
            match rt.fill_pools().await {
                Ok(0) => {}
                Ok(n) => info!(pools = n, "filled warm pools"),
                Err(e) => tracing::warn!(error = %e, "could not fill warm pools"),
            }
        });
    }
    let shared = Arc::new(Shared {
        registry: berth_tools::Registry::new(&rt)
            .with_history(std::sync::Arc::new(berth_agent::history::Journal)),
        service: Arc::new(berth_service::Service::new(
            rt.clone(),
            berth_client::policy_path().ok(),
        )),
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
        active_now: tokio::sync::watch::Sender::new(0),
        quick,
        quick_calls: Default::default(),
        api_calls: Default::default(),
        last_active: Mutex::new(Instant::now()),
        calls: Mutex::new(HashMap::new()),
        lock: Mutex::new(Some(lock)),
        watching: Mutex::new(HashSet::new()),
        shutdown: CancellationToken::new(),
    });
    info!(pid = std::process::id(), socket = %socket.display(), idle_secs = idle.as_secs(), "berth server listening");
    // The socket and the idle time are looked at on this tick; everything
    // else the server does is woken by what it waits for.
    let mut tick = tokio::time::interval((idle / 2).clamp(Duration::from_millis(500), IDLE_TICK));
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // The store is read in a task of its own, never in this loop: accepting
    // goes on whatever the store waits for.
    let watcher = {
        let s = shared.clone();
        tokio::spawn(async move {
            // A job started by any process is a write of the store, which
            // rings; the slow look retries a watch that ended in an error.
            let mut bell = s.rt.store().bell(Duration::from_millis(500));
            loop {
                watch_jobs(&s);
                bell.wait(RETRY_WATCH).await;
                // Every job is read per look: a busy store (each command
                // writes) is looked at a few times a second, not per write.
                tokio::time::sleep(WATCH_GAP).await;
            }
        })
    };
    // Webhooks deliver from the event log, each at its own pace.
    let hooks_stop = CancellationToken::new();
    let hooks = berth_webhooks::spawn(shared.rt.clone(), state_dir.clone(), hooks_stop.clone());
    // Runs that wait for an event: held here, resumed when it comes.
    let waiting = Arc::new(AtomicUsize::new(0));
    let waits = super::waits::spawn(
        shared.rt.clone(),
        state_dir.clone(),
        waiting.clone(),
        hooks_stop.clone(),
    );
    // Schedules: due slots start runs.
    let scheduled = Arc::new(AtomicUsize::new(0));
    let cron = berth_schedules::runner::spawn(
        shared.rt.clone(),
        state_dir.clone(),
        scheduled.clone(),
        hooks_stop.clone(),
    );
    // The dashboard (`berth ui`), when its settings say it is on; its open
    // pages keep the server from going idle.
    let ui_busy = Arc::new(AtomicUsize::new(0));
    let ui = berth_ui::watch(
        shared.rt.clone(),
        state_dir.clone(),
        ui_busy.clone(),
        hooks_stop.clone(),
    );
    let mut ui_seen = Instant::now();
    loop {
        // Backpressure: no accept while every slot is taken.
        let slot = tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            _ = sigterm.recv() => {
                info!("SIGTERM; stopping");
                shared.shutdown.cancel();
            }
            _ = sigint.recv() => {
                info!("SIGINT; stopping");
                shared.shutdown.cancel();
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let s = shared.clone();
                    tokio::spawn(async move {
                        // Nothing in a sandbox may call berth (answer its own
                        // approval, start sandboxes): a peer that is a
                        // sandbox's process is dropped unheard. Checked here,
                        // not in the accept loop: it reads `/proc`, and the
                        // next connection need not wait for it.
                        let peer = stream.peer_cred().ok().and_then(|c| c.pid());
                        if let Some(sandbox) = peer.and_then(berth_core::identity::sandbox_of) {
                            warn!(pid = peer, %sandbox, "refused a connection from inside a sandbox");
                            return;
                        }
                        serve_connection(s, stream).await;
                        drop(slot);
                    });
                }
                Err(e) => warn!(error = %e, "accept failed"),
            },
            _ = tick.tick() => {
                if !shared.socket_is_ours() {
                    info!("the socket was removed or replaced; exiting");
                    break;
                }
                let since = shared.last_active.lock().map(|t| t.elapsed()).unwrap_or_default();
                let watched = shared.watching.lock().map(|w| w.len()).unwrap_or(0);
                let held = waiting.load(Ordering::SeqCst) + scheduled.load(Ordering::SeqCst);
                if ui_busy.load(Ordering::SeqCst) > 0 {
                    ui_seen = Instant::now();
                }
                let since = since.min(ui_seen.elapsed());
                if shared.active.load(Ordering::SeqCst) == 0 && watched == 0 && held == 0 && since >= idle {
                    info!(idle_secs = idle.as_secs(), "idle; exiting");
                    break;
                }
            }
        }
    }
    drop(listener);
    watcher.abort();
    // Each webhook's cursor is on disk; a message cut short is sent again
    // by the next server.
    hooks_stop.cancel();
    let _ = tokio::time::timeout(CLOSE_WAIT, hooks).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, waits).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, cron).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, ui).await;
    shared.release();
    // Woken when the last running call ends, not polled.
    let mut running = shared.active_now.subscribe();
    if tokio::time::timeout(DRAIN, running.wait_for(|n| *n == 0))
        .await
        .is_err()
    {
        warn!("calls still running after the drain period; interrupting them");
        shared.interrupt_all();
    }
    shared.rt.shutdown().await;
    // Let the connections finish what they send (the reply to `Shutdown`
    // itself, a report) before the process exits under them.
    let _ = tokio::time::timeout(CLOSE_WAIT, slots.acquire_many(MAX_CONNECTIONS as u32)).await;
    Ok(0)
}

/// The longest the server goes without looking at its socket and idle time.
const IDLE_TICK: Duration = Duration::from_secs(5);
/// How often unfinished jobs are looked at with no write of the store.
const RETRY_WATCH: Duration = Duration::from_secs(10);
/// The least time between two looks at the jobs.
const WATCH_GAP: Duration = Duration::from_millis(250);

/// How long an exiting server waits for its clients to hang up.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

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
        let span_job = job.id.clone();
        tokio::spawn(
            async move {
                let id = job.id;
                match s.rt.wait_job(&id, None).await {
                    Ok(j) => info!(job = %id, state = j.state.as_str(), "job ended"),
                    // Tried again at the next look; a sandbox that is gone marks
                    // its jobs lost, which ends the watch.
                    Err(e) => {
                        warn!(job = %id, error = %e, "waiting for a job");
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
                if let Ok(mut w) = s.watching.lock() {
                    w.remove(&id);
                }
            }
            .instrument(tracing::info_span!("watch", job = %span_job)),
        );
    }
}

async fn serve_connection(shared: Arc<Shared>, stream: UnixStream) {
    let peer_uid = stream.peer_cred().ok().map(|c| c.uid());
    if peer_uid != Some(shared.owner_uid) {
        warn!(?peer_uid, "refusing a connection from another uid");
    }
    let quick = shared.quick;
    let conn = Conn { shared, peer_uid };
    if quick {
        match super::quick::is_quick(&stream).await {
            Some(true) => return super::quick::serve(stream, conn).await,
            Some(false) => {}
            None => return,
        }
    }
    // A call carries `--stdin` whole: take what the quick framing takes
    // (tonic's default is 4 MiB), so a large input is refused by the client
    // with what to do, not by the decoder as a lost server.
    let caller = match conn.check_peer() {
        Ok(()) => berth_service::Caller::allowed(conn.shared.api_calls.clone()),
        Err(s) => berth_service::Caller::refused(s.message()),
    };
    let service = conn.shared.service.clone();
    let host: Arc<dyn berth_service::Host> = Arc::new(V1Host(Conn {
        shared: conn.shared.clone(),
        peer_uid: conn.peer_uid,
    }));
    let berth = BerthServer::new(conn).max_decoding_message_size(berth_client::quick::MAX_FRAME);
    // The CLI's own service and the typed API, side by side.
    let svc = berth_service::api::add_to(tonic::service::Routes::new(berth), service, host, caller)
        .prepare();
    let conn = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(svc),
        );
    if let Err(e) = conn.await {
        info!(error = %e, "connection ended");
    }
}

pub use berth_client::check_socket_path;

/// What the typed API (`berth.v1`) borrows of the server: the CLI's own
/// exec path, so an SDK's command is counted, queued, interrupted and
/// drained as a CLI's is.
struct V1Host(Conn);

impl berth_service::Host for V1Host {
    fn exec(
        &self,
        req: berth_service::proto::ExecRequest,
    ) -> berth_service::api::HostFuture<
        Result<berth_service::api::Replies<berth_service::proto::ExecEvent>, Status>,
    > {
        let conn = Conn {
            shared: self.0.shared.clone(),
            peer_uid: self.0.peer_uid,
        };
        Box::pin(async move {
            let (backend, sandbox) = berth_service::convert::target(req.sandbox.as_ref())?;
            let call = ExecCall {
                backend: backend.as_str().to_string(),
                sandbox,
                command: req.command,
                timeout_secs: req.timeout_secs,
                stdin: req.stdin,
                session: req.session,
                split_stderr: req.split_stderr,
            };
            let events = Berth::exec(&conn, Request::new(call)).await?.into_inner();
            let typed: berth_service::api::Replies<berth_service::proto::ExecEvent> =
                Box::pin(futures::StreamExt::map(events, |e| e.map(v1_exec_event)));
            Ok(typed)
        })
    }

    fn interrupt(&self, call_id: &str) -> bool {
        self.0.shared.interrupt(call_id)
    }

    fn hold(&self) -> berth_service::api::Held {
        berth_service::api::Held {
            guard: Box::new(Serving::new(&self.0.shared)),
            stopping: self.0.shared.shutdown.clone(),
        }
    }
}

/// One event of the CLI's exec as the typed API's.
fn v1_exec_event(e: ExecEvent) -> berth_service::proto::ExecEvent {
    use berth_service::proto::{ExecFailure, ExecResult, exec_event as v1};
    let event = e.event.map(|e| match e {
        exec_event::Event::Started(id) => v1::Event::Started(id),
        exec_event::Event::Output(b) => v1::Event::Stdout(b),
        exec_event::Event::Stderr(b) => v1::Event::Stderr(b),
        exec_event::Event::Notice(n) => v1::Event::Notice(n),
        exec_event::Event::Report(r) => v1::Event::Result(ExecResult {
            exit_code: r.exit_code,
            stdout: r.output,
            stderr: r.stderr,
            omitted_bytes: r.omitted_bytes,
            spool: r.spool,
            cwd: r.cwd,
            timed_out: r.timed_out,
            interrupted: r.interrupted,
            duration_ms: r.duration_ms,
            notices: r.notices,
            recreated: r.recreated,
            call_id: r.call_id,
        }),
        exec_event::Event::Failure(f) => v1::Event::Failure(ExecFailure {
            message: f.message,
            denied: f.denied,
        }),
    });
    berth_service::proto::ExecEvent { event }
}
