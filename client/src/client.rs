//! The CLI's side of `berth serve`: find or start the server, check it is the
//! same berth, and run a call on it.
//!
//! Flow at a glance:
//! 1. connect to the socket; none there, or a stale one, and `BERTH_SERVER` is
//!    `auto`: start `berth-engine serve` detached (its own session, output to
//!    `server.log`) and wait for the socket;
//! 2. the call carries this client's identity (`ExecChecked`, `RunChecked`);
//!    a server of another version, protocol, engine build or configuration
//!    refuses it (an older one has no such method), and the client falls back
//!    to `Hello`: it `Shutdown`s that server (it gives up the socket at once),
//!    starts anew and calls again;
//! 3. `exec`: print output as it streams; Ctrl-C sends `Interrupt` and waits for
//!    the report; a stream that breaks before the report means the server died,
//!    and the command's outcome is unknown (exit 125, never success).
//!
//! Nothing here opens the store or a backend: a call costs a connect and one
//! round trip.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::Mode;
use crate::args::ExecArgs;
use crate::proto::berth_client::BerthClient;
use crate::proto::{
    CheckedExec, ClientId, ExecCall, ForgetRequest, HelloReply, HelloRequest, InterruptRequest,
    ShutdownRequest,
};
use crate::report::{Step, lost, on_exec_event};

/// How long the client waits for a server it started to listen.
const START_DEADLINE: Duration = Duration::from_secs(20);

pub use crate::report::EXIT_LOST;

/// A connected, checked server.
pub struct Server {
    pub client: BerthClient<Channel>,
    /// The connection, for the typed API's clients (`berth.v1`) on it.
    pub channel: Channel,
    /// What the server said about itself.
    pub hello: HelloReply,
}

/// Why a connection attempt failed.
enum ConnectError {
    /// Nobody listens: no socket, or a stale one.
    NoServer,
    /// Something else; a reason the caller should see.
    Other(anyhow::Error),
}

/// A connection to a server, not yet checked to be the same berth.
struct Connected {
    client: BerthClient<Channel>,
    channel: Channel,
    /// The server's pid, from the socket's peer credentials (0 if unknown).
    pid: u32,
}

/// Whether process `pid` is exiting or gone: no longer there, or its
/// leader a zombie. A server killed with SIGKILL keeps its listening socket
/// until its last thread has exited, and a connection made meanwhile is
/// accepted by the kernel and then reset; its leader is a zombie by then.
fn exiting(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
    }
}

/// How long a server that is exiting may keep its socket before a client
/// stops waiting for it to let go.
const EXIT_DEADLINE: Duration = Duration::from_secs(5);

/// Connect to the socket and speak gRPC over that one connection.
async fn connect_once(socket: &Path) -> std::result::Result<Connected, ConnectError> {
    let deadline = Instant::now() + EXIT_DEADLINE;
    let (stream, pid) = loop {
        let stream = match UnixStream::connect(socket).await {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Err(ConnectError::NoServer);
            }
            Err(e) => {
                return Err(ConnectError::Other(anyhow!(e).context(format!(
                    "cannot connect to the berth server at {}; set BERTH_SERVER=off to run without it",
                    socket.display()
                ))));
            }
        };
        let pid = stream
            .peer_cred()
            .ok()
            .and_then(|c| c.pid())
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0);
        // A server killed a moment ago: wait until its socket refuses, then
        // it is a stale one (and a new server is started).
        if pid == 0 || !exiting(pid) {
            break (stream, pid);
        }
        if Instant::now() >= deadline {
            return Err(ConnectError::Other(anyhow!(
                "the berth server (pid {pid}) is exiting but its socket {} still takes connections after {}s; try again, or set BERTH_SERVER=off",
                socket.display(),
                EXIT_DEADLINE.as_secs()
            )));
        }
        drop(stream);
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // The connector hands over the stream connected above, once: a channel
    // that needs a second connection fails instead of reaching another server.
    let slot = Arc::new(Mutex::new(Some(stream)));
    let connector = tower::service_fn(move |_: Uri| {
        let taken = slot.lock().ok().and_then(|mut s| s.take());
        async move {
            taken
                .map(hyper_util::rt::TokioIo::new)
                .ok_or_else(|| std::io::Error::other("the connection to the berth server closed"))
        }
    });
    let channel = Endpoint::from_static("http://berth.server")
        .connect_with_connector(connector)
        .await
        .map_err(|e| {
            ConnectError::Other(
                anyhow!(e).context("cannot open the connection to the berth server"),
            )
        })?;
    Ok(Connected {
        client: BerthClient::new(channel.clone()).max_decoding_message_size(usize::MAX),
        channel,
        pid,
    })
}

async fn hello(client: &mut BerthClient<Channel>) -> Result<HelloReply> {
    match client.hello(HelloRequest {}).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) if s.code() == tonic::Code::PermissionDenied => {
            bail!("the berth server refused this client: {}", s.message())
        }
        Err(s) => Err(anyhow!(
            "the berth server did not answer its handshake: {}",
            s.message()
        )),
    }
}

/// Why a client `client` and a server `server` do not belong together, if
/// they do not (phrased for the client's user).
pub fn differs(server: &ClientId, client: &ClientId) -> Option<String> {
    if server.version != client.version || server.protocol != client.protocol {
        return Some(format!(
            "it is berth {} (protocol {}), this is {} (protocol {})",
            server.version, server.protocol, client.version, client.protocol
        ));
    }
    if server.exe_id != client.exe_id {
        return Some("it runs another build of berth".into());
    }
    if server.config_key != client.config_key {
        return Some("it was started with another environment or policy file".into());
    }
    None
}

/// Why this client will not use `h`'s server, if it will not.
fn mismatch(h: &HelloReply) -> Option<String> {
    let server = ClientId {
        version: h.version.clone(),
        protocol: h.protocol,
        exe_id: h.exe_id.clone(),
        config_key: h.config_key.clone(),
    };
    differs(&server, &crate::identity())
}

/// Start `berth serve` for `state_dir`, detached from this process: its own
/// session (no terminal signals), no stdin, output to the server log.
fn spawn_server(state_dir: &Path) -> Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("cannot create the state dir {}", state_dir.display()))?;
    let log_path = crate::log_path(state_dir);
    use std::os::unix::fs::OpenOptionsExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("cannot open the server log {}", log_path.display()))?;
    let exe = crate::engine_path()?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("serve")
        .arg("--idle")
        .arg(crate::idle_from_env()?.to_string())
        .env("BERTH_STATE_DIR", state_dir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| {
        format!(
            "cannot start `{} serve`; berth and {} are built and installed together (`cargo build --release` builds both)",
            exe.display(),
            crate::ENGINE
        )
    })
}

/// The last lines of the server log, for an error message.
fn log_tail(state_dir: &Path) -> String {
    let text = std::fs::read_to_string(crate::log_path(state_dir)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Wait for a server to listen on the socket, watching the one we started.
async fn wait_for_server(
    state_dir: &Path,
    socket: &Path,
    mut child: std::process::Child,
) -> Result<Connected> {
    let deadline = Instant::now() + START_DEADLINE;
    let mut pause = Duration::from_millis(1);
    loop {
        match connect_once(socket).await {
            Ok(c) => return Ok(c),
            Err(ConnectError::Other(e)) => return Err(e),
            Err(ConnectError::NoServer) => {}
        }
        if let Ok(Some(status)) = child.try_wait()
            && !status.success()
        {
            bail!(
                "`berth serve` exited ({status}) before listening on {}; its log ({}) ends:\n{}\nset BERTH_SERVER=off to run without a server",
                socket.display(),
                crate::log_path(state_dir).display(),
                log_tail(state_dir)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "`berth serve` did not listen on {} within {}s; see {} or set BERTH_SERVER=off",
                socket.display(),
                START_DEADLINE.as_secs(),
                crate::log_path(state_dir).display()
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}

/// Connect to the running server of `state_dir` without starting one.
pub async fn running(state_dir: &Path) -> Result<Option<Server>> {
    let socket = crate::socket_path(state_dir);
    for _ in 0..3 {
        match connect_once(&socket).await {
            Ok(Connected {
                mut client,
                channel,
                pid,
            }) => {
                let hello = match hello(&mut client).await {
                    Ok(h) => h,
                    // Killed as this client connected (see `connect`).
                    Err(_) if pid != 0 && exiting(pid) => continue,
                    Err(e) => return Err(e),
                };
                return Ok(Some(Server {
                    client,
                    channel,
                    hello,
                }));
            }
            Err(ConnectError::NoServer) => return Ok(None),
            Err(ConnectError::Other(e)) => return Err(e),
        }
    }
    Ok(None)
}

/// The server for `state_dir`, connected but not checked: the running one, or
/// (`auto`) one started now. The call that follows carries this client's
/// identity ([`call_checked`]), or asks for the server's ([`connect`]).
async fn open(state_dir: &Path, mode: Mode) -> Result<Connected> {
    crate::check_socket_path(state_dir)?;
    if mode == Mode::Auto {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            anyhow!(
                "state dir {} is not writable ({e}); fix its permissions, or point --state-dir / BERTH_STATE_DIR at a writable directory",
                state_dir.display()
            )
        })?;
    }
    let socket = crate::socket_path(state_dir);
    match connect_once(&socket).await {
        Ok(c) => {
            tracing::debug!(socket = %socket.display(), pid = c.pid, "connected to the berth server");
            Ok(c)
        }
        Err(ConnectError::Other(e)) => Err(e),
        Err(ConnectError::NoServer) if mode == Mode::Require => bail!(
            "no berth server runs for {} and BERTH_SERVER=require; start one with `berth serve`, or use BERTH_SERVER=auto",
            state_dir.display()
        ),
        Err(ConnectError::NoServer) => {
            let child = spawn_server(state_dir)?;
            tracing::debug!(socket = %socket.display(), pid = child.id(), "no berth server ran; started one");
            wait_for_server(state_dir, &socket, child).await
        }
    }
}

/// Send a call that carries this client's identity to the server of
/// `state_dir`: one round trip. A server that refuses the identity (another
/// version, build or configuration; or an older server without the method) is
/// replaced through the handshake ([`connect`]) and the call is sent again.
/// Returns the client (for `Interrupt`), the server's pid, and the call's
/// own result.
async fn call_checked<T, F, Fut>(
    state_dir: &Path,
    mode: Mode,
    mut send: F,
) -> Result<(
    BerthClient<Channel>,
    u32,
    std::result::Result<T, tonic::Status>,
)>
where
    F: FnMut(BerthClient<Channel>, ClientId) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let Connected {
        mut client,
        mut pid,
        ..
    } = open(state_dir, mode).await?;
    let id = crate::identity();
    let mut handshaken = false;
    loop {
        match send(client.clone(), id.clone()).await {
            Err(s)
                if !handshaken
                    && matches!(
                        s.code(),
                        tonic::Code::FailedPrecondition | tonic::Code::Unimplemented
                    ) =>
            {
                tracing::debug!(pid, code = ?s.code(), reason = s.message(), "the server did not take the checked call; handshaking");
                let server = connect(state_dir, mode).await?;
                (client, pid) = (server.client, server.hello.pid);
                handshaken = true;
            }
            Err(s) if s.code() == tonic::Code::PermissionDenied => {
                bail!("the berth server refused this client: {}", s.message())
            }
            Err(s) if s.code() == tonic::Code::FailedPrecondition => bail!(
                "the berth server (pid {pid}) does not match this client: {}; stop it with `berth server stop` or set BERTH_SERVER=off",
                s.message()
            ),
            r => return Ok((client, pid, r.map(tonic::Response::into_inner))),
        }
    }
}

/// The server for `state_dir`: the running one if it is the same berth, else a
/// new one (`auto`); `require` fails when none runs.
pub async fn connect(state_dir: &Path, mode: Mode) -> Result<Server> {
    // Twice at most: a mismatched server is replaced once.
    let mut dead = 0;
    let mut replaced = 0;
    while replaced < 2 {
        let Connected {
            mut client,
            channel,
            pid,
        } = open(state_dir, mode).await?;
        let h = match hello(&mut client).await {
            Ok(h) => h,
            // Connected to a server in the moment it was killed: the kernel
            // took the connection, then reset it. Nothing ran; again, with
            // the socket stale now.
            Err(e) if pid != 0 && exiting(pid) && dead < 3 => {
                tracing::debug!(pid, error = %e, "the berth server died as this client connected; connecting again");
                dead += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        replaced += 1;
        let Some(why) = mismatch(&h) else {
            return Ok(Server {
                client,
                channel,
                hello: h,
            });
        };
        if mode == Mode::Require {
            bail!(
                "the berth server (pid {}) does not match this client: {why}; stop it with `berth server stop`",
                h.pid
            );
        }
        tracing::info!(pid = h.pid, %why, "replacing the berth server");
        client
            .shutdown(ShutdownRequest { interrupt: false })
            .await
            .map_err(|s| {
                anyhow!(
                    "cannot stop the old berth server (pid {}): {}",
                    h.pid,
                    s.message()
                )
            })?;
    }
    bail!(
        "the berth server for {} was replaced but the new one still does not match; stop it with `berth server stop` or set BERTH_SERVER=off",
        state_dir.display()
    )
}

impl Server {
    /// Ask the server to stop; `interrupt` stops its running commands too.
    pub async fn shutdown(&mut self, interrupt: bool) -> Result<u32> {
        let r = self
            .client
            .shutdown(ShutdownRequest { interrupt })
            .await
            .map_err(|s| anyhow!("the berth server did not stop: {}", s.message()))?;
        Ok(r.into_inner().pid)
    }
}

/// Tell a running server (never starting one) to let go of a sandbox's shell,
/// before this process removes the sandbox. Best effort: with no server, or an
/// old one, there is nothing to tell.
pub async fn forget(state_dir: &Path, backend: &str, sandbox: &str) {
    let socket = crate::socket_path(state_dir);
    if let Ok(Connected { mut client, .. }) = connect_once(&socket).await {
        let _ = client
            .forget(ForgetRequest {
                backend: backend.into(),
                sandbox: sandbox.into(),
            })
            .await;
    }
}

/// The call `berth exec` makes, from its command line (reads stdin with `--stdin`).
pub fn exec_call(a: &ExecArgs) -> Result<ExecCall> {
    let command = a.command_line()?;
    if let Some(t) = a.timeout {
        crate::report::timeout_from_secs(t)?;
    }
    Ok(ExecCall {
        backend: a.backend.clone(),
        sandbox: a.sandbox.clone(),
        command,
        timeout_secs: a.timeout,
        stdin: a.read_stdin()?,
        session: a.session.clone(),
        split_stderr: true,
    })
}

/// Where `berth exec`'s first try left it.
pub enum Quick {
    /// The call ran over the quick framing; exit with this.
    Done(u8),
    /// Nothing ran: make this call over gRPC ([`exec_grpc`]).
    Grpc(ExecCall),
}

/// `berth exec`'s first try, blocking and with no async runtime: the quick
/// framing ([`crate::quick`]).
pub fn exec_quick(
    state_dir: &Path,
    a: &ExecArgs,
    early: Option<crate::quick::Early>,
) -> Result<Quick> {
    let call = exec_call(a)?;
    Ok(match crate::quick::exec(state_dir, &call, a.json, early)? {
        Some(code) => Quick::Done(code),
        None => Quick::Grpc(call),
    })
}

/// `berth exec` through the server: over the quick framing when the server
/// takes it, else over gRPC.
pub async fn exec(state_dir: PathBuf, mode: Mode, a: ExecArgs) -> Result<u8> {
    match exec_quick(&state_dir, &a, None)? {
        Quick::Done(code) => Ok(code),
        Quick::Grpc(call) => exec_grpc(state_dir, mode, call, a.json).await,
    }
}

/// `berth exec` through the server over gRPC: finds, starts or replaces the
/// server as `mode` says.
pub async fn exec_grpc(state_dir: PathBuf, mode: Mode, call: ExecCall, json: bool) -> Result<u8> {
    let (mut interrupter, pid, opened) = call_checked(&state_dir, mode, |mut c, id| {
        let call = CheckedExec {
            client: Some(id),
            call: Some(call.clone()),
        };
        async move { c.exec_checked(call).await }
    })
    .await?;
    let mut stream = match opened {
        Ok(s) => s,
        Err(s) if s.code() == tonic::Code::InvalidArgument => bail!("{}", s.message()),
        Err(s) => return Ok(lost(pid, json, &s.to_string())),
    };
    let mut call_id = None;
    let mut interrupts = 0u32;
    loop {
        let next = tokio::select! {
            m = stream.message() => m,
            c = tokio::signal::ctrl_c() => {
                if c.is_err() {
                    continue;
                }
                interrupts += 1;
                if interrupts > 1 {
                    // A second Ctrl-C: stop waiting; the dropped stream interrupts.
                    eprintln!("berth: interrupted again; not waiting for the command's report");
                    return Ok(130);
                }
                if let Some(id) = call_id.clone() {
                    let _ = interrupter.interrupt(InterruptRequest { call_id: id }).await;
                }
                continue;
            }
        };
        let event = match next {
            Ok(Some(m)) => m.event,
            Ok(None) => return Ok(lost(pid, json, "the stream ended without a report")),
            Err(s) => return Ok(lost(pid, json, &s.to_string())),
        };
        match on_exec_event(event, json)? {
            Step::Started(id) => call_id = Some(id),
            Step::Done(code) => return Ok(code),
            Step::Next => {}
        }
    }
}
