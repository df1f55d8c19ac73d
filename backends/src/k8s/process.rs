//! Processes: one `pods/exec` WebSocket each (kube-rs speaks
//! `v5.channel.k8s.io`, with its close signal for stdin, and falls back to
//! `v4`).
//!
//! Flow at a glance:
//! - The exec's command is a fixed launcher plus the cwd and argv
//!   (`crate::launcher`), never an environment value: the request's URL is
//!   what the API server's audit log keeps. The launcher reads the
//!   environment from stdin, changes directory, checks the program, prints
//!   a ready token and `exec`s it; until that token a failure is classified
//!   (bad cwd, not found) and returned from `spawn` itself.
//! - On a terminal the launcher first makes it raw and silent and says so
//!   with a token of its own; only then is the environment sent, so the
//!   line discipline never echoes or edits it.
//! - A session's shell runs under `tini -s` from the image's execute-only
//!   bash (`crate::subreaper::under_tini`); everything else under
//!   `setsid -w`, as on docker: the session engine kills a command's tree by
//!   walking `/proc` for the shell's session.
//! - `wait` reads the exit from the status channel. A WebSocket that ends
//!   without one is a lost connection or a lost pod; berth asks the API
//!   which, and never reports an exit that did not happen.

use std::io;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::backend::{ExitStatus, Pipes, Process, SpawnOpts, TermSize};
use berth_core::error::{BackendFailure, Error, Result, SpawnFailure};
use bytes::Bytes;
use futures::{FutureExt, SinkExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadHalf, SimplexStream};
use tokio::sync::{mpsc, watch};

use super::{CONTAINER, K8sSandbox, KIND, PodRef, cluster};
use crate::chan_reader::channel_reader;
use crate::launcher::{LAUNCHER, READY, TERMINAL_LAUNCHER, env_block, refusal};

/// The token a terminal's launcher prints once the terminal is raw and silent.
const TERMINAL_RAW: &[u8] = b"berth-terminal-raw\n";
/// How long a launcher may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The buffer of each stream between the WebSocket and its reader.
const STREAM_BUFFER: usize = 256 * 1024;
/// Chunks buffered per output pipe before the pump waits for its reader.
const PIPE_DEPTH: usize = 64;

type StatusFuture = Pin<Box<dyn std::future::Future<Output = Option<Status>> + Send>>;

/// Start `argv` in the sandbox's pod.
pub(crate) async fn spawn(
    sb: &K8sSandbox,
    argv: &[String],
    opts: SpawnOpts,
) -> Result<Box<dyn Process>> {
    let Some(program) = argv.first().cloned() else {
        return Err(Error::InvalidInput("empty argv".into()));
    };
    let tty = opts.tty;
    let inner: Vec<String> = if crate::subreaper::is_shell(argv, opts.replaces.as_deref(), tty) {
        crate::subreaper::under_tini(argv)
    } else if tty {
        // An exec with a terminal already leads its own session, with that
        // terminal as its controlling one.
        argv.to_vec()
    } else {
        let mut v = vec!["setsid".to_string(), "-w".to_string()];
        v.extend(argv.iter().cloned());
        v
    };
    let cwd = opts
        .cwd
        .clone()
        .unwrap_or_else(|| sb.layout.workdir.clone());
    let mut env: Vec<(String, String)> =
        sb.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.push(("BERTH_SANDBOX".into(), sb.pod.name.clone()));
    if tty && !opts.env.iter().any(|(k, _)| k == "TERM") {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    env.extend(opts.env.iter().cloned());
    let block = env_block(&env)?;
    let launcher = if tty {
        format!(
            "stty raw -echo 2>/dev/null; printf '%s\\n' {}; {TERMINAL_LAUNCHER}",
            String::from_utf8_lossy(&TERMINAL_RAW[..TERMINAL_RAW.len() - 1])
        )
    } else {
        LAUNCHER.to_string()
    };
    let mut command: Vec<String> = vec![
        "bash".into(),
        "--noprofile".into(),
        "--norc".into(),
        "-c".into(),
        launcher,
        "berth-spawn".into(),
        cwd.clone(),
    ];
    command.extend(inner);
    let mut ap = AttachParams::default()
        .container(CONTAINER)
        .stdin(true)
        .stdout(true)
        .stderr(!tty)
        .tty(tty);
    ap.max_stdin_buf_size = Some(STREAM_BUFFER);
    ap.max_stdout_buf_size = Some(STREAM_BUFFER);
    ap.max_stderr_buf_size = Some(STREAM_BUFFER);
    let mut attached = match sb.pod.pods.exec(&sb.pod.object, command, &ap).await {
        Ok(a) => a,
        Err(e) => return Err(exec_failed(&sb.pod, &format!("starting `{program}`"), e).await),
    };
    let (Some(mut stdin), Some(mut stdout)) = (attached.stdin(), attached.stdout()) else {
        return Err(Error::backend(
            KIND,
            BackendFailure::Protocol,
            "the exec gave no stdin or stdout although berth asked for both",
        ));
    };
    let stderr = attached.stderr();
    let mut status: StatusFuture = match attached.take_status() {
        Some(s) => Box::pin(s),
        None => Box::pin(async { None }),
    };
    let mut resize = attached.terminal_size();
    if let Some(r) = resize.as_mut() {
        let size = opts.tty_size.unwrap_or_default();
        let _ = r
            .send(TerminalSize {
                width: size.cols,
                height: size.rows,
            })
            .await;
    }
    let started = async {
        if tty {
            read_past(&mut stdout, TERMINAL_RAW).await?;
        }
        stdin.write_all(&block).await?;
        stdin.flush().await?;
        read_past(&mut stdout, READY).await
    };
    let rest = match tokio::time::timeout(START_TIMEOUT, started).await {
        Ok(Ok(rest)) => rest,
        Ok(Err(_)) => {
            // The launcher ended before the program started: say why.
            let code = tokio::time::timeout(Duration::from_secs(5), &mut status)
                .await
                .ok()
                .flatten()
                .map(|s| exit_of(&s));
            let place = sb.pod.place();
            return Err(match code {
                Some(Ok(c)) => match c.code.and_then(|c| refusal(c, &program, &cwd, &place)) {
                    Some(e) => e,
                    None => Error::Spawn {
                        kind: SpawnFailure::Other,
                        program: program.clone(),
                        detail: format!(
                            "the launcher in {place} exited ({}) before starting it; does the image have bash?",
                            c.shell_code()
                        ),
                    },
                },
                Some(Err(message)) => Error::backend(
                    KIND,
                    BackendFailure::Rejected,
                    format!("{place} could not run `{program}`: {message}"),
                ),
                None => lost(&sb.pod, &format!("starting `{program}`")).await,
            });
        }
        Err(_) => {
            return Err(Error::backend(
                KIND,
                BackendFailure::Timeout,
                format!(
                    "`{program}` did not start in {} within {}s",
                    sb.pod.place(),
                    START_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    // The exit, once the connection has ended (`None`: ended without one).
    let (ended_tx, ended) = watch::channel::<Option<Option<Status>>>(None);
    tokio::spawn(async move {
        let _ = ended_tx.send(Some(status.await));
    });
    let (out_tx, out_rx) = mpsc::channel(PIPE_DEPTH);
    tokio::spawn(pump(stdout, rest, out_tx, ended.clone()));
    let stderr = stderr.map(|e| {
        let (err_tx, err_rx) = mpsc::channel(PIPE_DEPTH);
        tokio::spawn(pump(e, Vec::new(), err_tx, ended.clone()));
        channel_reader(err_rx)
    });
    Ok(Box::new(K8sProcess {
        pipes: Pipes {
            stdin: Some(Box::pin(stdin)),
            stdout: Some(channel_reader(out_rx)),
            stderr,
        },
        ended,
        waited: false,
        resize,
        attached,
        pod: sb.pod.clone(),
        program,
    }))
}

/// Pass one of the exec's streams on, after `first`. kube-rs leaves a
/// stream open when the connection breaks (it shuts the streams only on a
/// clean end), so the pump also watches for the connection's end: then it
/// passes on what is buffered and ends the stream, with an error when no
/// exit came, so a reader never waits on a connection that is gone.
async fn pump(
    mut r: ReadHalf<SimplexStream>,
    first: Vec<u8>,
    tx: mpsc::Sender<io::Result<Bytes>>,
    mut ended: watch::Receiver<Option<Option<Status>>>,
) {
    if !first.is_empty() && tx.send(Ok(Bytes::from(first))).await.is_err() {
        return;
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            biased;
            n = r.read(&mut buf) => match n {
                Ok(0) => return,
                Ok(n) => {
                    if tx.send(Ok(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            },
            _ = async { ended.wait_for(Option::is_some).await.is_ok() } => break,
        }
    }
    // The connection has ended: what is buffered is all there will be.
    while let Some(Ok(n)) = r.read(&mut buf).now_or_never() {
        if n == 0
            || tx
                .send(Ok(Bytes::copy_from_slice(&buf[..n])))
                .await
                .is_err()
        {
            return;
        }
    }
    let clean = matches!(&*ended.borrow(), Some(Some(_)));
    if !clean {
        let _ = tx
            .send(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the exec connection to the pod was lost",
            )))
            .await;
    }
}

/// Read `r` until `token` has gone by; what came after it in the last read.
async fn read_past<R: AsyncRead + Unpin>(r: &mut R, token: &[u8]) -> io::Result<Vec<u8>> {
    let mut seen: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        seen.extend_from_slice(&buf[..n]);
        if let Some(i) = memchr::memmem::find(&seen, token) {
            return Ok(seen.split_off(i + token.len()));
        }
        // Nothing but the token is expected first; keep a bounded tail.
        if seen.len() > 64 * 1024 {
            let cut = seen.len() - token.len();
            seen.drain(..cut);
        }
    }
}

/// How the exec's status says the process ended; `Err` with the message
/// when the status is a failure of the exec itself, not an exit.
fn exit_of(s: &Status) -> std::result::Result<ExitStatus, String> {
    if s.status.as_deref() == Some("Success") {
        return Ok(ExitStatus {
            code: Some(0),
            signal: None,
        });
    }
    if s.reason.as_deref() == Some("NonZeroExitCode")
        && let Some(code) = s
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
            .and_then(|c| c.message.as_deref())
            .and_then(|m| m.trim().parse::<i32>().ok())
    {
        return Ok(ExitStatus {
            code: Some(code),
            signal: None,
        });
    }
    Err(s.message.clone().unwrap_or_else(|| format!("{s:?}")))
}

/// berth's error for an exec that could not be started.
async fn exec_failed(pod: &PodRef, doing: &str, e: kube::Error) -> Error {
    if let Ok(Some(reason)) = pod.gone_reason().await {
        return pod.gone(&reason);
    }
    cluster::api_error(&pod.context, &pod.namespace, doing, e)
}

/// berth's error for an exec whose connection ended without a status: the
/// pod's end when it has ended, else the lost connection.
async fn lost(pod: &PodRef, doing: &str) -> Error {
    match pod.gone_reason().await {
        Ok(Some(reason)) => pod.gone(&reason),
        Ok(None) => Error::unreachable(
            KIND,
            BackendFailure::Transport,
            format!(
                "{doing}: the exec connection to {} ended without the process's exit status",
                pod.place()
            ),
            "the API server or the node's kubelet dropped it; the pod still runs, run the command again",
        ),
        Err(e) => e,
    }
}

/// A process in the pod.
pub(crate) struct K8sProcess {
    pipes: Pipes,
    ended: watch::Receiver<Option<Option<Status>>>,
    waited: bool,
    resize: Option<futures::channel::mpsc::Sender<TerminalSize>>,
    attached: AttachedProcess,
    pod: std::sync::Arc<PodRef>,
    program: String,
}

#[async_trait]
impl Process for K8sProcess {
    fn pipes(&mut self) -> &mut Pipes {
        &mut self.pipes
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        if std::mem::replace(&mut self.waited, true) {
            return Err(Error::InvalidInput(format!(
                "`{}` was already waited for",
                self.program
            )));
        }
        let status = match self.ended.wait_for(Option::is_some).await {
            Ok(s) => s.clone().flatten(),
            Err(_) => None,
        };
        let status: Option<Status> = status;
        match status {
            Some(s) => exit_of(&s).map_err(|message| {
                Error::backend(
                    KIND,
                    BackendFailure::Rejected,
                    format!("{}: `{}`: {message}", self.pod.place(), self.program),
                )
            }),
            None => Err(lost(&self.pod, &format!("running `{}`", self.program)).await),
        }
    }

    async fn resize(&mut self, size: TermSize) -> Result<()> {
        let Some(r) = self.resize.as_mut() else {
            return Err(Error::Unsupported(
                "resizing a process that has no terminal (spawn it with `tty`)".into(),
            ));
        };
        r.send(TerminalSize {
            width: size.cols,
            height: size.rows,
        })
        .await
        .map_err(|_| Error::stream("resizing the terminal", io::ErrorKind::BrokenPipe.into()))
    }

    async fn terminate(&mut self) -> Result<()> {
        // Closing the exec closes the process's stdin and terminal; the
        // session engine's tree kill reaches what ignores that.
        self.pipes = Pipes::default();
        self.attached.abort();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn the_status_channel_gives_exact_exit_codes() {
        let ok = Status {
            status: Some("Success".into()),
            ..Status::default()
        };
        assert_eq!(exit_of(&ok).unwrap().code, Some(0));
        let five = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("5".into()),
                    ..StatusCause::default()
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        };
        assert_eq!(exit_of(&five).unwrap().code, Some(5));
        let broken = Status {
            status: Some("Failure".into()),
            reason: Some("InternalError".into()),
            message: Some("no such container".into()),
            ..Status::default()
        };
        assert_eq!(exit_of(&broken).unwrap_err(), "no such container");
    }

    #[tokio::test]
    async fn the_ready_token_is_found_across_reads_and_what_follows_kept() {
        let (mut w, mut r) = tokio::io::duplex(64);
        tokio::spawn(async move {
            w.write_all(b"berth-spawn-").await.unwrap();
            w.write_all(b"ready\nhello").await.unwrap();
        });
        assert_eq!(read_past(&mut r, READY).await.unwrap(), b"hello");
    }
}
