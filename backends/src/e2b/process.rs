//! A process in an E2B sandbox: one envd `Start` stream.
//!
//! Flow at a glance:
//! - `Start` (stdin enabled) answers with a stream whose first event is
//!   `start{pid}`; until it arrives, an error is a failed spawn, classified.
//! - A pump task turns `data` events into the stdout and stderr pipes and the
//!   one `end` event into the exit. A stream that breaks before `end` is
//!   re-attached with `Connect` by pid when the process still runs: each pipe
//!   then gets one [`OutputGap`] error (what was written in between is lost)
//!   and goes on, and `wait` reports the process as lost, never a success. A
//!   stream that cannot be re-attached, or ends before `end`, is a lost
//!   command: both pipes fail and `wait` says so.
//!   `deadline_exceeded`, or an `end` with exit code -1 after a deadline berth
//!   set, is a timeout.
//! - stdin is a writer whose bytes go out in order, one `SendInput` call at a
//!   time (queued writes are coalesced), over the kept-alive HTTP client;
//!   `shutdown` sends `CloseStdin`. `flush` waits until envd has taken the bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::backend::{BoxRead, BoxWrite, ExitStatus, OutputGap, Pipes, Process, TermSize};
use berth_core::error::{BackendFailure, Error, Result, SpawnFailure};
use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::PollSender;

use super::KIND;
use super::connect::{CallError, ConnectError, ServerStream, Step, connect_code_failure};
use super::envd::Envd;
use super::proto::{
    Empty, EndEvent, EventResponse, ProcessInput, Pty, PtySize, SelectRequest, Selector,
    SendInputRequest, SendSignalRequest, SignalName, UpdateRequest,
};

/// Output chunks buffered per pipe before the stream is back-pressured.
const PIPE_DEPTH: usize = 256;
/// How early before berth's own reckoning of a deadline envd's kill may land
/// and still count as the deadline (the two clocks start a request apart).
const DEADLINE_SLACK: Duration = Duration::from_millis(50);
/// The most stdin bytes sent in one `SendInput`.
const INPUT_CHUNK: usize = 256 * 1024;
/// Attempts to re-attach a broken stream with `Connect`, and the pause before
/// each: a connection that broke may take a moment to come back.
const REATTACH_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(250),
    Duration::from_secs(1),
];

/// How a process's stream ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ended with this status.
    Exited(ExitStatus),
    /// Its deadline passed and envd killed it.
    TimedOut,
    /// The stream broke before the `end` event: the outcome is unknown.
    Lost(String),
    /// The stream broke and was re-attached, and then the process ended with
    /// this status; but what it wrote in between is lost.
    Gapped(String, ExitStatus),
    /// envd ended the stream with an error.
    Failed(ConnectError),
}

/// A process started through envd.
pub struct E2bProcess {
    pid: u32,
    envd: Envd,
    sandbox: String,
    program: String,
    pipes: Pipes,
    exit: Option<oneshot::Receiver<Outcome>>,
    status: Option<ExitStatus>,
    /// Started on a terminal (`pty`): input goes as `pty` input, and it can
    /// be resized.
    tty: bool,
    _live: Option<Box<dyn Send + Sync>>,
}

/// What a start needs.
pub(crate) struct StartSpec {
    pub request: super::proto::StartRequest,
    pub deadline: Option<Duration>,
    pub sandbox: String,
}

/// Start a process; the first `start` event is awaited before returning.
pub(crate) async fn start(
    envd: &Envd,
    spec: StartSpec,
    live: Option<Box<dyn Send + Sync>>,
) -> std::result::Result<E2bProcess, StartError> {
    let program = spec.request.process.cmd.clone();
    // Taken before the request: envd starts its clock later, never earlier.
    let deadline = spec.deadline.map(|d| Instant::now() + d);
    let mut stream = envd
        .stream("/process.Process/Start", &spec.request, spec.deadline)
        .await
        .map_err(StartError::Call)?;
    let pid = match stream.next::<EventResponse>().await {
        Step::Message(EventResponse {
            event: Some(ev), ..
        }) if ev.start.is_some() => ev.start.map(|s| s.pid).unwrap_or(0),
        Step::Message(_) => {
            return Err(StartError::Protocol(
                "envd's first event was not `start`".into(),
            ));
        }
        Step::Error(e) => return Err(StartError::Refused(e)),
        Step::End => {
            return Err(StartError::Protocol(
                "envd ended the stream before the process started".into(),
            ));
        }
        Step::Cut(why) => return Err(StartError::Cut(why)),
    };
    let (out_tx, out_rx) = mpsc::channel(PIPE_DEPTH);
    let (err_tx, err_rx) = mpsc::channel(PIPE_DEPTH);
    let (exit_tx, exit_rx) = oneshot::channel();
    let link = Link {
        envd: envd.clone(),
        pid,
    };
    tokio::spawn(pump(stream, out_tx, err_tx, exit_tx, deadline, link));
    let tty = spec.request.pty.is_some();
    let stdin: Option<BoxWrite> = if spec.request.stdin == Some(true) || tty {
        Some(Box::pin(InputWriter::new(envd.clone(), pid, tty)))
    } else {
        None
    };
    Ok(E2bProcess {
        pid,
        envd: envd.clone(),
        sandbox: spec.sandbox,
        program,
        pipes: Pipes {
            stdin,
            stdout: Some(reader(out_rx)),
            stderr: Some(reader(err_rx)),
        },
        exit: Some(exit_rx),
        status: None,
        tty,
        _live: live,
    })
}

/// Why a start failed, before mapping to berth's error.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The call itself failed (HTTP status, transport).
    Call(CallError),
    /// envd refused to start the process.
    Refused(ConnectError),
    /// The stream broke before `start`.
    Cut(String),
    /// envd broke the protocol.
    Protocol(String),
}

/// Classify envd's refusal to start `program`.
pub(crate) fn refused(program: &str, e: &ConnectError) -> Error {
    let m = e.message.to_ascii_lowercase();
    let kind = if m.contains("cwd") || m.contains("chdir") || m.contains("working directory") {
        SpawnFailure::BadCwd
    } else if m.contains("not found") || m.contains("no such file") {
        SpawnFailure::NotFound
    } else if m.contains("permission denied") {
        SpawnFailure::Permission
    } else {
        SpawnFailure::Other
    };
    Error::Spawn {
        kind,
        program: program.to_string(),
        detail: format!("envd: {}: {}", e.code, e.message),
    }
}

fn reader(rx: mpsc::Receiver<io::Result<Bytes>>) -> BoxRead {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Box::pin(tokio_util::io::StreamReader::new(Box::pin(stream)))
}

/// Where a process's stream can be re-attached.
struct Link {
    envd: Envd,
    pid: u32,
}

impl Link {
    /// `Connect` to the process by pid: a new stream of its events from now
    /// on, once envd confirms with `start`. `None` when it cannot be had: the
    /// process ended, or the sandbox or the link is gone for good.
    async fn reattach(&self) -> Option<ServerStream> {
        let req = SelectRequest {
            process: Selector::Pid(self.pid),
        };
        for pause in REATTACH_PAUSES {
            tokio::time::sleep(pause).await;
            let mut stream = match self
                .envd
                .stream("/process.Process/Connect", &req, None)
                .await
            {
                Ok(s) => s,
                // The link is still down: try again.
                Err(CallError::Transport(_)) => continue,
                // Refused (the process ended, the sandbox is gone): trying
                // again will not help.
                Err(_) => return None,
            };
            match stream.next::<EventResponse>().await {
                Step::Message(EventResponse {
                    event: Some(ev), ..
                }) if ev.start.as_ref().is_some_and(|s| s.pid == self.pid) => {
                    return Some(stream);
                }
                Step::Cut(_) => continue,
                _ => return None,
            }
        }
        None
    }
}

async fn pump(
    mut stream: ServerStream,
    out: mpsc::Sender<io::Result<Bytes>>,
    err: mpsc::Sender<io::Result<Bytes>>,
    exit: oneshot::Sender<Outcome>,
    deadline: Option<Instant>,
    link: Link,
) {
    let mut end: Option<EndEvent> = None;
    // Why the stream broke, once it was re-attached after a break.
    let mut gap: Option<String> = None;
    let outcome = loop {
        match stream.next::<EventResponse>().await {
            Step::Message(r) => {
                let Some(ev) = r.event else { continue };
                if let Some(d) = ev.data {
                    // A reader that was dropped does not want the bytes.
                    if let Some(b) = d.stdout.or(d.pty) {
                        let _ = out.send(Ok(Bytes::from(b))).await;
                    }
                    if let Some(b) = d.stderr {
                        let _ = err.send(Ok(Bytes::from(b))).await;
                    }
                }
                if let Some(e) = ev.end {
                    end = Some(e);
                }
            }
            Step::End => {
                break match end.take() {
                    Some(e) => from_end(e, deadline),
                    None => Outcome::Lost("envd closed the stream without an `end` event".into()),
                };
            }
            Step::Error(e) if e.code == "deadline_exceeded" => break Outcome::TimedOut,
            Step::Error(e) => {
                break match end.take() {
                    Some(end) => from_end(end, deadline),
                    None => Outcome::Failed(e),
                };
            }
            // The `end` event arrived, only the trailer was lost: the outcome is known.
            Step::Cut(why) => {
                if let Some(e) = end.take() {
                    break from_end(e, deadline);
                }
                // The link broke, perhaps not the process: re-attach to it, and
                // tell each reader, in its stream, that bytes are missing.
                let Some(again) = link.reattach().await else {
                    break Outcome::Lost(why);
                };
                tracing::debug!(pid = link.pid, %why, "re-attached a broken envd stream");
                let _ = out.send(Err(OutputGap(why.clone()).into_io())).await;
                let _ = err.send(Err(OutputGap(why.clone()).into_io())).await;
                gap = Some(why);
                stream = again;
            }
        }
    };
    let outcome = match (outcome, gap) {
        (Outcome::Exited(s), Some(why)) => Outcome::Gapped(why, s),
        (o, _) => o,
    };
    if let Outcome::Lost(why) = &outcome {
        let e = || io::Error::new(io::ErrorKind::ConnectionAborted, why.clone());
        let _ = out.send(Err(e())).await;
        let _ = err.send(Err(e())).await;
    }
    let _ = exit.send(outcome);
}

fn from_end(e: EndEvent, deadline: Option<Instant>) -> Outcome {
    if let Some(err) = e.error.as_ref().filter(|s| !s.is_empty()) {
        return Outcome::Failed(ConnectError {
            code: "unknown".into(),
            message: err.clone(),
        });
    }
    if e.exited {
        return Outcome::Exited(ExitStatus {
            code: Some(e.exit_code),
            signal: None,
        });
    }
    // -1 is Go's exit code for a process a signal ended; after a deadline berth
    // set, that signal was envd enforcing it.
    if e.exit_code == -1 && deadline.is_some_and(|d| Instant::now() + DEADLINE_SLACK >= d) {
        return Outcome::TimedOut;
    }
    Outcome::Exited(ExitStatus {
        code: None,
        signal: e.signal(),
    })
}

impl E2bProcess {
    /// The pid inside the sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait for the stream's outcome, unmapped.
    pub async fn outcome(&mut self) -> Outcome {
        match self.exit.take() {
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| Outcome::Lost("the stream reader stopped".into())),
            None => Outcome::Lost("the outcome was already taken".into()),
        }
    }

    /// Send a signal through envd.
    pub async fn signal(&self, sig: SignalName) -> std::result::Result<(), CallError> {
        send_signal(self.envd.clone(), self.pid, sig).await
    }
}

#[async_trait]
impl Process for E2bProcess {
    fn pipes(&mut self) -> &mut Pipes {
        &mut self.pipes
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let sandbox = self.sandbox.clone();
        let program = self.program.clone();
        match self.outcome().await {
            Outcome::Exited(s) => {
                self.status = Some(s);
                Ok(s)
            }
            Outcome::TimedOut => Err(Error::backend(
                KIND,
                BackendFailure::Timeout,
                format!(
                    "sandbox `{sandbox}`: `{program}` hit its deadline and envd killed it (timed out)"
                ),
            )),
            // Re-attached after a break: the status is known, but not all of
            // the output, so it is no success.
            Outcome::Gapped(why, s) => Err(Error::unreachable(
                KIND,
                BackendFailure::Transport,
                format!(
                    "sandbox `{sandbox}`: the stream of `{program}` broke ({why}); berth re-attached and it then ended with {}, but the output written in between is lost",
                    match (s.code, s.signal) {
                        (Some(c), _) => format!("exit code {c}"),
                        (None, Some(sig)) => format!("signal {sig}"),
                        _ => "an unknown status".into(),
                    }
                ),
                "check the network; check the command's effects before running it again",
            )),
            // A lost link, as the engine expects it: the outcome is unknown.
            Outcome::Lost(why) => Err(Error::unreachable(
                KIND,
                BackendFailure::Transport,
                format!(
                    "sandbox `{sandbox}`: the stream of `{program}` broke before it ended ({why}); the command is lost and its exit status is unknown"
                ),
                "check the network; the command may or may not have finished inside the sandbox, so check its effects before running it again",
            )),
            Outcome::Failed(e) => Err(Error::backend(
                KIND,
                connect_code_failure(&e.code).unwrap_or(BackendFailure::Rejected),
                format!(
                    "sandbox `{sandbox}`: envd failed `{program}`: {}: {}",
                    e.code, e.message
                ),
            )),
        }
    }

    async fn resize(&mut self, size: TermSize) -> Result<()> {
        if !self.tty {
            return Err(Error::InvalidInput(
                "resizing a process that has no terminal (spawn it with `tty`)".into(),
            ));
        }
        let _: Empty = self
            .envd
            .unary(
                "/process.Process/Update",
                &UpdateRequest {
                    process: Selector::Pid(self.pid),
                    pty: pty(size),
                },
            )
            .await
            .map_err(|e| {
                Error::backend_call(
                    KIND,
                    e.failure(),
                    format!(
                        "sandbox `{}`: resizing the terminal of pid {} failed",
                        self.sandbox, self.pid
                    ),
                    e,
                )
            })?;
        Ok(())
    }

    async fn terminate(&mut self) -> Result<()> {
        match send_signal(self.envd.clone(), self.pid, SignalName::Kill).await {
            // Already gone is what terminate wants.
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("not_found") => Ok(()),
            Err(CallError::Status { status: 502, .. }) => Ok(()),
            Err(e) => Err(Error::backend_call(
                KIND,
                e.failure(),
                format!(
                    "sandbox `{}`: killing pid {} failed",
                    self.sandbox, self.pid
                ),
                e,
            )),
        }
    }
}

/// envd's terminal of `size`.
pub(crate) fn pty(size: TermSize) -> Pty {
    Pty {
        size: PtySize {
            cols: size.cols.into(),
            rows: size.rows.into(),
        },
    }
}

async fn send_signal(envd: Envd, pid: u32, sig: SignalName) -> std::result::Result<(), CallError> {
    let _: Empty = envd
        .unary(
            "/process.Process/SendSignal",
            &SendSignalRequest {
                process: Selector::Pid(pid),
                signal: sig,
            },
        )
        .await?;
    Ok(())
}

/// What the stdin writer hands its sender task.
enum Input {
    Data(Vec<u8>),
    Close,
}

struct InputState {
    /// Messages queued so far.
    sent: AtomicU64,
    /// Messages envd has taken; `u64::MAX` after a failure.
    acked: watch::Sender<u64>,
    error: Mutex<Option<String>>,
}

impl InputState {
    fn error(&self) -> Option<io::Error> {
        let e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        e.as_ref()
            .map(|m| io::Error::new(io::ErrorKind::BrokenPipe, m.clone()))
    }
}

type FlushFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// stdin as an `AsyncWrite` over `SendInput`.
struct InputWriter {
    tx: PollSender<Input>,
    state: Arc<InputState>,
    flush: Option<FlushFuture>,
    closed: bool,
}

impl InputWriter {
    fn new(envd: Envd, pid: u32, tty: bool) -> Self {
        let (tx, rx) = mpsc::channel(64);
        let state = Arc::new(InputState {
            sent: AtomicU64::new(0),
            acked: watch::channel(0).0,
            error: Mutex::new(None),
        });
        tokio::spawn(feed(envd, pid, tty, rx, state.clone()));
        Self {
            tx: PollSender::new(tx),
            state,
            flush: None,
            closed: false,
        }
    }

    fn queue(&mut self, cx: &mut Context<'_>, item: Input) -> Poll<io::Result<()>> {
        if let Some(e) = self.state.error() {
            return Poll::Ready(Err(e));
        }
        let broken = || io::Error::new(io::ErrorKind::BrokenPipe, "the stdin sender stopped");
        ready!(self.tx.poll_reserve(cx)).map_err(|_| broken())?;
        self.tx.send_item(item).map_err(|_| broken())?;
        self.state.sent.fetch_add(1, Ordering::SeqCst);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for InputWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stdin was closed",
            )));
        }
        let n = buf.len().min(INPUT_CHUNK);
        ready!(self.queue(cx, Input::Data(buf[..n].to_vec())))?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.flush.is_none() {
            let target = self.state.sent.load(Ordering::SeqCst);
            let state = self.state.clone();
            let mut acked = state.acked.subscribe();
            self.flush = Some(Box::pin(async move {
                let _ = acked.wait_for(|a| *a >= target).await.map(|_| ());
                match state.error() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }));
        }
        let r = match self.flush.as_mut() {
            Some(f) => ready!(f.as_mut().poll(cx)),
            None => Ok(()),
        };
        self.flush = None;
        Poll::Ready(r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closed {
            ready!(self.queue(cx, Input::Close))?;
            self.closed = true;
        }
        self.poll_flush(cx)
    }
}

/// Send queued input in order, coalescing what is waiting.
async fn feed(
    envd: Envd,
    pid: u32,
    tty: bool,
    mut rx: mpsc::Receiver<Input>,
    state: Arc<InputState>,
) {
    let mut done: u64 = 0;
    let mut pending_close = false;
    while let Some(first) = rx.recv().await {
        let mut taken = 1u64;
        let result = match first {
            Input::Close => close(&envd, pid).await,
            Input::Data(mut data) => {
                while data.len() < INPUT_CHUNK {
                    match rx.try_recv() {
                        Ok(Input::Data(more)) => {
                            data.extend_from_slice(&more);
                            taken += 1;
                        }
                        Ok(Input::Close) => {
                            pending_close = true;
                            taken += 1;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let sent = envd
                    .unary::<_, Empty>(
                        "/process.Process/SendInput",
                        &SendInputRequest {
                            process: Selector::Pid(pid),
                            input: if tty {
                                ProcessInput::Pty(data)
                            } else {
                                ProcessInput::Stdin(data)
                            },
                        },
                    )
                    .await
                    .map(|_| ());
                match sent {
                    Ok(()) if pending_close => close(&envd, pid).await,
                    other => other,
                }
            }
        };
        if let Err(e) = result {
            *state.error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("sending stdin to pid {pid}: {e}"));
            state.acked.send_replace(u64::MAX);
            return;
        }
        done += taken;
        state.acked.send_replace(done);
        if pending_close {
            return;
        }
    }
}

async fn close(envd: &Envd, pid: u32) -> std::result::Result<(), CallError> {
    let _: Empty = envd
        .unary(
            "/process.Process/CloseStdin",
            &SelectRequest {
                process: Selector::Pid(pid),
            },
        )
        .await?;
    Ok(())
}
