//! Processes: one exec each, through the task command router.
//!
//! Flow at a glance:
//! - `spawn` names the exec (a fresh UUID, so a retried `TaskExecStart` cannot
//!   start it twice) and starts it with both output streams piped.
//! - Two pump tasks read stdout and stderr with `TaskExecStdioRead`. Each
//!   counts the bytes it has passed on; when a stream breaks on a transient
//!   error it is reopened at that offset, so nothing is lost or doubled.
//! - stdin is a writer task fed through a bounded channel: it coalesces what
//!   is queued into one `TaskExecStdinWrite` at the next offset, and sends
//!   `eof` when the caller shuts or drops stdin.
//! - `wait` long-polls `TaskExecWait`. When the exec's answer cannot be had,
//!   or it was SIGKILLed, the sandbox's own state decides between a dead
//!   process and a sandbox that ended (its GenericResult says how).
//!
//! Every argv runs under `setsid -w`, as in the docker backend: the session
//! engine kills a command's tree by walking `/proc` for the shell's session.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use async_trait::async_trait;
use berth_core::backend::{ExitStatus, Pipes, Process, SpawnOpts};
use berth_core::error::{BackendFailure, Error, Result};
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;
use tonic::Code;

use super::client::{MAX_RETRIES, backoff, grpc_failure, random_id, retryable};
use super::proto::client::PtyInfo;
use super::proto::task_command_router::{
    TaskExecStartRequest, TaskExecStderrConfig, TaskExecStdinWriteRequest,
    TaskExecStdioFileDescriptor, TaskExecStdioReadRequest, TaskExecStdoutConfig,
    TaskExecWaitRequest, task_exec_wait_response::ExitStatus as WireExit,
};
use super::router::Router;
use super::{KIND, ModalSandbox};
use crate::chan_reader::channel_reader;

/// Output chunks buffered per stream before a pump waits for its reader.
const CHANNEL_CHUNKS: usize = 64;
/// The most stdin bytes sent in one write.
const STDIN_BATCH: usize = 1024 * 1024;

/// Start `argv` in the sandbox.
pub(crate) async fn spawn(
    sb: &ModalSandbox,
    argv: &[String],
    opts: SpawnOpts,
) -> Result<Box<dyn Process>> {
    if argv.is_empty() {
        return Err(Error::InvalidInput("empty argv".into()));
    }
    let exec_id = random_id();
    // On a terminal the process leads the session Modal gives it (its
    // controlling terminal is the pty, so a typed Ctrl-C reaches it); it
    // first writes the terminal's name where a resize finds it.
    let tty_file = opts.tty.then(|| format!("/tmp/.berth-tty-{exec_id}"));
    let mut command_args = match &tty_file {
        Some(f) => vec![
            "sh".to_string(),
            "-c".to_string(),
            "tty > \"$0\" 2>/dev/null; exec \"$@\"".to_string(),
            f.clone(),
        ],
        None => vec!["setsid".to_string(), "-w".to_string()],
    };
    // A session's shell adopts what its commands detach (see
    // `crate::subreaper`).
    command_args.extend(
        crate::subreaper::wrap(argv, opts.replaces.as_deref(), opts.tty)
            .iter()
            .cloned(),
    );
    let size = opts.tty_size.unwrap_or_default();
    let mut env = sb.env.clone();
    env.insert("BERTH_SANDBOX".into(), sb.name.clone());
    env.extend(opts.env.iter().cloned());
    let req = TaskExecStartRequest {
        task_id: sb.inner.router.task_id.clone(),
        exec_id: exec_id.clone(),
        command_args,
        stdout_config: TaskExecStdoutConfig::Pipe as i32,
        stderr_config: TaskExecStderrConfig::Pipe as i32,
        timeout_secs: None,
        workdir: Some(opts.cwd.unwrap_or_else(|| sb.layout.workdir.clone())),
        pty_info: tty_file.is_some().then(|| PtyInfo {
            enabled: true,
            winsz_rows: u32::from(size.rows),
            winsz_cols: u32::from(size.cols),
            env_term: "xterm-256color".into(),
        }),
        env: env.into_iter().collect(),
    };
    if let Err(s) = sb
        .inner
        .router
        .unary("TaskExecStart", req, |mut c, r| async move {
            c.task_exec_start(r).await
        })
        .await
    {
        return Err(sb.exec_error("starting a process", s).await);
    }
    let exec = Arc::new(Exec {
        sb: sb.handle(),
        exec_id,
    });
    let (out_tx, out_rx) = mpsc::channel(CHANNEL_CHUNKS);
    let (err_tx, err_rx) = mpsc::channel(CHANNEL_CHUNKS);
    let pumps = vec![
        tokio::spawn(pump(
            exec.clone(),
            TaskExecStdioFileDescriptor::Stdout,
            out_tx,
        )),
        tokio::spawn(pump(
            exec.clone(),
            TaskExecStdioFileDescriptor::Stderr,
            err_tx,
        )),
    ];
    let (in_tx, in_rx) = mpsc::channel(CHANNEL_CHUNKS);
    let failed = Arc::new(Mutex::new(None));
    pumps_push_writer(&exec, in_rx, failed.clone());
    Ok(Box::new(ModalProcess {
        exec,
        pipes: Pipes::new(
            Box::pin(StdinWriter {
                tx: PollSender::new(in_tx),
                failed,
            }),
            channel_reader(out_rx),
            channel_reader(err_rx),
        ),
        pumps,
        status: None,
        tty: tty_file.map(|f| {
            (
                ModalSandbox::new(sb.handle(), sb.layout.clone(), sb.env.clone()),
                f,
            )
        }),
    }))
}

/// Sets a terminal's size from beside it: the router has no resize call, so a
/// helper exec in the same container runs `stty` on the terminal by name.
const RESIZE: &str = "i=0; while [ ! -s \"$0\" ] && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done; \
read -r t < \"$0\" && stty -F \"$t\" cols \"$1\" rows \"$2\"";

/// What the pumps, the stdin writer and `wait` share about one exec.
pub(crate) struct Exec {
    pub(crate) sb: super::SandboxHandle,
    exec_id: String,
}

impl Exec {
    fn router(&self) -> &Router {
        &self.sb.router
    }
}

/// Read one output stream to its end, resuming at the offset reached after a
/// transient break.
async fn pump(
    exec: Arc<Exec>,
    fd: TaskExecStdioFileDescriptor,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let mut offset = 0u64;
    let mut failures = 0u32;
    loop {
        let req = TaskExecStdioReadRequest {
            task_id: exec.router().task_id.clone(),
            exec_id: exec.exec_id.clone(),
            offset,
            file_descriptor: fd as i32,
        };
        let err = match exec
            .router()
            .stream(
                req,
                |mut c, r| async move { c.task_exec_stdio_read(r).await },
            )
            .await
        {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(m)) => {
                        if m.data.is_empty() {
                            continue;
                        }
                        offset += m.data.len() as u64;
                        failures = 0;
                        if tx.send(Ok(Bytes::from(m.data))).await.is_err() {
                            // Nobody reads this stream any more.
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(s) => break s,
                }
            },
            Err(s) => s,
        };
        if (retryable(err.code()) || err.code() == Code::Cancelled) && failures < MAX_RETRIES {
            failures += 1;
            tracing::debug!(exec = %exec.exec_id, ?fd, offset, code = ?err.code(), "stdio stream broke; resuming at its offset");
            tokio::time::sleep(backoff(failures)).await;
            continue;
        }
        let e = exec.sb.exec_error("reading a process's output", err).await;
        let _ = tx
            .send(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                e.to_string(),
            )))
            .await;
        return;
    }
}

enum StdinMsg {
    Data(Bytes),
    Eof,
}

fn pumps_push_writer(
    exec: &Arc<Exec>,
    rx: mpsc::Receiver<StdinMsg>,
    failed: Arc<Mutex<Option<String>>>,
) {
    tokio::spawn(stdin_writer(exec.clone(), rx, failed));
}

/// Deliver stdin in order, each write at the offset after the last.
async fn stdin_writer(
    exec: Arc<Exec>,
    mut rx: mpsc::Receiver<StdinMsg>,
    failed: Arc<Mutex<Option<String>>>,
) {
    let mut offset = 0u64;
    let mut pending: Option<StdinMsg> = None;
    loop {
        let first = match pending.take() {
            Some(m) => Some(m),
            None => rx.recv().await,
        };
        // A dropped writer closes stdin, like a closed pipe.
        let (mut buf, mut eof) = match first {
            Some(StdinMsg::Data(b)) => (BytesMut::from(&b[..]), false),
            Some(StdinMsg::Eof) | None => (BytesMut::new(), true),
        };
        while !eof && buf.len() < STDIN_BATCH {
            match rx.try_recv() {
                Ok(StdinMsg::Data(b)) if buf.len() + b.len() <= STDIN_BATCH => {
                    buf.extend_from_slice(&b)
                }
                Ok(m @ StdinMsg::Data(_)) => {
                    pending = Some(m);
                    break;
                }
                Ok(StdinMsg::Eof) | Err(mpsc::error::TryRecvError::Disconnected) => eof = true,
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        let data = buf.freeze();
        let req = TaskExecStdinWriteRequest {
            task_id: exec.router().task_id.clone(),
            exec_id: exec.exec_id.clone(),
            offset,
            data: data.to_vec(),
            eof,
        };
        match exec
            .router()
            .unary("TaskExecStdinWrite", req, |mut c, r| async move {
                c.task_exec_stdin_write(r).await
            })
            .await
        {
            Ok(_) => offset += data.len() as u64,
            Err(s) => {
                let e = exec.sb.exec_error("writing to a process's stdin", s).await;
                if let Ok(mut f) = failed.lock() {
                    *f = Some(e.to_string());
                }
                rx.close();
                return;
            }
        }
        if eof {
            return;
        }
    }
}

/// stdin as an `AsyncWrite` feeding the writer task.
struct StdinWriter {
    tx: PollSender<StdinMsg>,
    failed: Arc<Mutex<Option<String>>>,
}

impl StdinWriter {
    fn broken(&self) -> io::Error {
        let why = self
            .failed
            .lock()
            .ok()
            .and_then(|f| f.clone())
            .unwrap_or_else(|| "the process's stdin is closed".into());
        io::Error::new(io::ErrorKind::BrokenPipe, why)
    }
}

impl AsyncWrite for StdinWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if ready!(self.tx.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(self.broken()));
        }
        let n = buf.len().min(STDIN_BATCH);
        if self
            .tx
            .send_item(StdinMsg::Data(Bytes::copy_from_slice(&buf[..n])))
            .is_err()
        {
            return Poll::Ready(Err(self.broken()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.tx.is_closed() {
            return Poll::Ready(Ok(()));
        }
        if ready!(self.tx.poll_reserve(cx)).is_ok() {
            let _ = self.tx.send_item(StdinMsg::Eof);
        }
        self.tx.close();
        Poll::Ready(Ok(()))
    }
}

/// A process in a Modal sandbox: one exec.
struct ModalProcess {
    exec: Arc<Exec>,
    pipes: Pipes,
    pumps: Vec<tokio::task::JoinHandle<()>>,
    status: Option<ExitStatus>,
    /// On a terminal: the sandbox, for resizes, and where the terminal's name is.
    tty: Option<(ModalSandbox, String)>,
}

#[async_trait]
impl Process for ModalProcess {
    fn pipes(&mut self) -> &mut Pipes {
        &mut self.pipes
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let req = TaskExecWaitRequest {
            task_id: self.exec.router().task_id.clone(),
            exec_id: self.exec.exec_id.clone(),
        };
        let mut attempts = 0u32;
        let status = loop {
            let r = self
                .exec
                .router()
                .unary("TaskExecWait", req.clone(), |mut c, r| async move {
                    c.task_exec_wait(r).await
                })
                .await;
            match r {
                Ok(resp) => match resp.exit_status {
                    Some(WireExit::Code(c)) => {
                        break ExitStatus {
                            code: Some(c),
                            signal: None,
                        };
                    }
                    Some(WireExit::Signal(s)) => {
                        // SIGKILL is also how a terminated sandbox takes its
                        // processes down: ask the sandbox.
                        if s == 9
                            && let Some(e) = self.exec.sb.ended_error().await
                        {
                            return Err(e);
                        }
                        break ExitStatus {
                            code: None,
                            signal: Some(s),
                        };
                    }
                    // A long poll that ended without an exit: poll again.
                    None => {}
                },
                // The long poll's own deadline passed while the process runs.
                Err(s) if s.code() == Code::DeadlineExceeded => {}
                Err(s) => return Err(self.exec.sb.exec_error("waiting for a process", s).await),
            }
            attempts += 1;
            tokio::time::sleep(backoff(attempts.min(6))).await;
        };
        self.status = Some(status);
        Ok(status)
    }

    async fn resize(&mut self, size: berth_core::backend::TermSize) -> Result<()> {
        let Some((sb, file)) = &self.tty else {
            return Err(Error::Unsupported(
                "resizing a process that has no terminal (spawn it with `tty`)".into(),
            ));
        };
        let argv: Vec<String> = [
            "sh",
            "-c",
            RESIZE,
            file,
            &size.cols.to_string(),
            &size.rows.to_string(),
        ]
        .map(String::from)
        .into();
        let c = berth_core::backend::run_to_end(
            sb,
            &argv,
            None,
            4096,
            std::time::Duration::from_secs(15),
        )
        .await?;
        if c.status.code != Some(0) {
            return Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "could not resize the terminal: {}",
                    String::from_utf8_lossy(&c.stderr).trim()
                ),
            ));
        }
        Ok(())
    }

    /// Drop the exec's streams. The router cannot signal an exec; the session
    /// engine kills the process in-band first, and a shell that still lives
    /// reads end-of-file on its stdin and exits.
    async fn terminate(&mut self) -> Result<()> {
        self.pipes = Pipes::default();
        for p in &self.pumps {
            p.abort();
        }
        Ok(())
    }
}

impl Drop for ModalProcess {
    fn drop(&mut self) {
        for p in &self.pumps {
            p.abort();
        }
    }
}

/// A process's failure that is the sandbox's: its GenericResult, mapped.
pub(crate) fn unknown_status(sandbox: &str, doing: &str, s: &tonic::Status) -> Error {
    Error::backend(
        KIND,
        grpc_failure(s.code()),
        format!(
            "sandbox `{sandbox}`: {doing}: {:?}: {}",
            s.code(),
            s.message()
        ),
    )
}
