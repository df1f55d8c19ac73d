//! A process on the remote host: one session channel running one command.
//!
//! Flow at a glance:
//! - The channel's `exec` request carries a fixed launcher plus the argv and cwd,
//!   never an environment value: argv is visible to every user of the host in
//!   `/proc/*/cmdline`. The launcher (`bash -c LAUNCHER`) first reads the
//!   environment from the channel's stdin as NUL-separated `KEY=VALUE` records
//!   ending in an empty one (bash reads a pipe byte by byte, so it takes nothing
//!   beyond), exports it, changes directory, checks that the program exists,
//!   prints a ready token and `exec`s the program. The chain `sshd -> $SHELL -c
//!   'exec bash ...' -> exec argv` keeps one pid, so the program is the session
//!   leader sshd made with `setsid`, which the engine's tree kill relies on.
//! - A pump task reads the channel's messages: stdout and stderr into two pipes,
//!   the exit status or signal into [`Process::wait`]. Until the ready token, a
//!   failure is classified (bad cwd, not found) and returned from `spawn` itself.
//! - If the connection dies before the channel closes, stdout ends in an error and
//!   `wait` reports the lost connection: never an exit code that did not happen.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use berth_core::backend::{ExitStatus, Pipes, Process, TermSize};
use berth_core::error::{BackendFailure, Error, Result, SpawnFailure};
use berth_core::session::script::quote;
use bytes::Bytes;
use russh::client::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Sig};
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::connection::{Connection, russh_failure};
use crate::chan_reader::channel_reader;
use crate::launcher::{LAUNCHER, READY, TERMINAL_LAUNCHER, env_block, refusal};

/// How much output before the ready token is kept (login scripts may print).
const PRE_READY_KEEP: usize = 64 * 1024;
/// Chunks buffered per output pipe before the channel is back-pressured.
const PIPE_DEPTH: usize = 256;

/// The modes a terminal is asked for: no echo, no line editing, no signals,
/// no translation either way, until the launcher runs `stty sane`.
const RAW_MODES: &[(russh::Pty, u32)] = &[
    (russh::Pty::ECHO, 0),
    (russh::Pty::ICANON, 0),
    (russh::Pty::ISIG, 0),
    (russh::Pty::IEXTEN, 0),
    (russh::Pty::ICRNL, 0),
    (russh::Pty::IXON, 0),
    (russh::Pty::OPOST, 0),
];

/// Start `argv` in `cwd` with `env` on `conn`.
pub async fn spawn(
    conn: &Arc<Connection>,
    argv: &[String],
    env: &[(String, String)],
    cwd: &str,
) -> Result<SshProcess> {
    launch(conn, argv, env, cwd, None).await
}

/// Start `argv` like [`spawn`], on a terminal of `size` (a `pty-req`).
pub async fn spawn_terminal(
    conn: &Arc<Connection>,
    argv: &[String],
    env: &[(String, String)],
    cwd: &str,
    size: TermSize,
) -> Result<SshProcess> {
    launch(conn, argv, env, cwd, Some(size)).await
}

async fn launch(
    conn: &Arc<Connection>,
    argv: &[String],
    env: &[(String, String)],
    cwd: &str,
    tty: Option<TermSize>,
) -> Result<SshProcess> {
    let Some(program) = argv.first().cloned() else {
        return Err(Error::InvalidInput("empty argv".into()));
    };
    let block = env_block(env)?;
    let mut command = String::from("exec bash --noprofile --norc -c ");
    command.push_str(&quote(if tty.is_some() {
        TERMINAL_LAUNCHER
    } else {
        LAUNCHER
    }));
    command.push_str(" berth-spawn ");
    command.push_str(&quote(cwd));
    for a in argv {
        command.push(' ');
        command.push_str(&quote(a));
    }
    let (channel, generation) = conn.open_session().await?;
    let label = conn.target().label();
    let lost = |e: russh::Error| {
        conn.unreachable(
            russh_failure(&e),
            format!("the connection failed while starting `{program}`"),
        )
        .caused_by(e)
    };
    if let Some(size) = tty {
        // No reply asked: a refusal would read as the exec's own failure.
        channel
            .request_pty(
                false,
                "xterm-256color",
                u32::from(size.cols),
                u32::from(size.rows),
                0,
                0,
                RAW_MODES,
            )
            .await
            .map_err(lost)?;
    }
    channel.exec(true, command).await.map_err(lost)?;
    let (read, write) = channel.split();
    let write = Arc::new(write);
    write.data_bytes(Bytes::from(block)).await.map_err(lost)?;

    let (out_tx, out_rx) = mpsc::channel(PIPE_DEPTH);
    let (err_tx, err_rx) = mpsc::channel(PIPE_DEPTH);
    let (ready_tx, ready_rx) = oneshot::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    tokio::spawn(pump(read, out_tx, err_tx, ready_tx, exit_tx));

    let timeout = conn.target().connect_timeout;
    let ready = match tokio::time::timeout(timeout, ready_rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(Launch::Lost),
        Err(_) => {
            let _ = write.close().await;
            return Err(conn.unreachable(
                BackendFailure::Timeout,
                format!("`{program}` did not start within {timeout:?}"),
            ));
        }
    };
    if let Err(fail) = ready {
        if matches!(fail, Launch::Lost) {
            conn.mark_dead(generation).await;
        }
        return Err(fail.into_error(&program, cwd, &label, conn));
    }
    Ok(SshProcess {
        pipes: Pipes::new(
            Box::pin(Stdin {
                inner: Box::pin(write.make_writer()),
                half: write.clone(),
                shut: false,
            }),
            channel_reader(out_rx),
            channel_reader(err_rx),
        ),
        exit: Some(exit_rx),
        status: None,
        write,
        program,
        label,
        tty: tty.is_some(),
    })
}

/// Why a launch failed before the ready token.
enum Launch {
    Exited(Option<u32>, String),
    Refused,
    Lost,
}

impl Launch {
    fn into_error(self, program: &str, cwd: &str, label: &str, conn: &Connection) -> Error {
        if let Launch::Exited(Some(code), _) = &self
            && let Some(e) = refusal(*code as i32, program, cwd, label)
        {
            return e;
        }
        match self {
            Launch::Exited(code, stderr) => Error::Spawn {
                kind: SpawnFailure::Other,
                program: program.into(),
                detail: format!(
                    "the launcher on {label} exited ({}) before starting it{}; is bash installed there?",
                    code.map(|c| format!("code {c}"))
                        .unwrap_or_else(|| "no status".into()),
                    if stderr.trim().is_empty() {
                        String::new()
                    } else {
                        format!(": {}", stderr.trim())
                    }
                ),
            },
            Launch::Refused => Error::Spawn {
                kind: SpawnFailure::Permission,
                program: program.into(),
                detail: format!(
                    "{label} refused to run a command on this connection (a forced command or `no-exec` restriction?)"
                ),
            },
            Launch::Lost => conn.unreachable(
                BackendFailure::Transport,
                format!("the connection was lost while starting `{program}`"),
            ),
        }
    }
}

/// How the channel ended, as `wait` reports it.
type Exit = std::result::Result<ExitStatus, ()>;

async fn pump(
    mut read: ChannelReadHalf,
    out: mpsc::Sender<io::Result<Bytes>>,
    err: mpsc::Sender<io::Result<Bytes>>,
    ready_tx: oneshot::Sender<std::result::Result<(), Launch>>,
    exit_tx: oneshot::Sender<Exit>,
) {
    let mut ready_tx = Some(ready_tx);
    let mut pre: Vec<u8> = Vec::new();
    let mut pre_err: Vec<u8> = Vec::new();
    let mut out = Some(out);
    let mut err = Some(err);
    let mut status: Option<ExitStatus> = None;
    let mut exit_code: Option<u32> = None;
    let mut closed = false;
    let mut refused = false;
    while let Some(msg) = read.wait().await {
        match msg {
            ChannelMsg::Data { data } => {
                if ready_tx.is_some() {
                    pre.extend_from_slice(&data);
                    if let Some(i) = memchr::memmem::find(&pre, READY) {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Ok(()));
                        }
                        let rest = pre.split_off(i + READY.len());
                        pre.clear();
                        if !rest.is_empty() {
                            send(&mut out, Bytes::from(rest)).await;
                        }
                    } else if pre.len() > PRE_READY_KEEP {
                        let cut = pre.len() - READY.len();
                        pre.drain(..cut);
                    }
                } else {
                    send(&mut out, data).await;
                }
            }
            ChannelMsg::ExtendedData { data, ext: 1 } => {
                if ready_tx.is_some() && pre_err.len() < 4096 {
                    pre_err.extend_from_slice(&data);
                }
                send(&mut err, data).await;
            }
            ChannelMsg::ExitStatus { exit_status } => {
                exit_code = Some(exit_status);
                status = Some(ExitStatus {
                    code: Some(exit_status as i32),
                    signal: None,
                });
            }
            ChannelMsg::ExitSignal { signal_name, .. } => {
                status = Some(ExitStatus {
                    code: None,
                    signal: signal_number(&signal_name),
                });
            }
            ChannelMsg::Failure => refused = true,
            ChannelMsg::Eof => {
                out = None;
                err = None;
            }
            ChannelMsg::Close => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    if let Some(tx) = ready_tx.take() {
        let why = if refused {
            Launch::Refused
        } else if closed || status.is_some() {
            Launch::Exited(exit_code, String::from_utf8_lossy(&pre_err).into_owned())
        } else {
            Launch::Lost
        };
        let _ = tx.send(Err(why));
    }
    // The channel vanished without closing: the connection is gone. Readers get an
    // error rather than a clean end, so nobody mistakes this for the program's exit.
    let lost = !closed && status.is_none();
    if lost {
        for pipe in [&mut out, &mut err] {
            if let Some(tx) = pipe.take() {
                let _ = tx
                    .send(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the ssh connection was lost",
                    )))
                    .await;
            }
        }
    }
    drop(out);
    drop(err);
    let _ = exit_tx.send(match status {
        Some(s) => Ok(s),
        // Closed without a status: OpenSSH does this only when it could not
        // report one; treat it like a lost connection, never as success.
        None => Err(()),
    });
}

async fn send(pipe: &mut Option<mpsc::Sender<io::Result<Bytes>>>, data: Bytes) {
    if let Some(tx) = pipe {
        // A reader that went away just stops receiving; the channel keeps draining
        // so other channels on the connection are not held up.
        if tx.send(Ok(data)).await.is_err() {
            *pipe = None;
        }
    }
}

/// The Linux number of a signal named in an `exit-signal` message.
fn signal_number(sig: &Sig) -> Option<i32> {
    Some(match sig {
        Sig::ABRT => 6,
        Sig::ALRM => 14,
        Sig::FPE => 8,
        Sig::HUP => 1,
        Sig::ILL => 4,
        Sig::INT => 2,
        Sig::KILL => 9,
        Sig::PIPE => 13,
        Sig::QUIT => 3,
        Sig::SEGV => 11,
        Sig::TERM => 15,
        Sig::USR1 => 10,
        Sig::Custom(name) => match name.as_str() {
            "BUS" => 7,
            "USR2" => 12,
            "STKFLT" => 16,
            "CHLD" => 17,
            "CONT" => 18,
            "STOP" => 19,
            "TSTP" => 20,
            "TTIN" => 21,
            "TTOU" => 22,
            "URG" => 23,
            "XCPU" => 24,
            "XFSZ" => 25,
            "VTALRM" => 26,
            "PROF" => 27,
            "WINCH" => 28,
            "IO" => 29,
            "PWR" => 30,
            "SYS" => 31,
            _ => return None,
        },
    })
}

/// A remote process.
pub struct SshProcess {
    pipes: Pipes,
    exit: Option<oneshot::Receiver<Exit>>,
    status: Option<ExitStatus>,
    write: Arc<ChannelWriteHalf<Msg>>,
    program: String,
    label: String,
    /// Spawned on a terminal (resizable).
    tty: bool,
}

impl SshProcess {
    /// Read all of stdout and stderr, then wait: for short helper commands.
    pub async fn collect(mut self, stdin: &[u8]) -> Result<(ExitStatus, Vec<u8>, Vec<u8>)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut input = self.take_stdin();
        let mut out = self.take_stdout();
        let mut err = self.take_stderr();
        let write = async {
            if let Some(mut i) = input.take() {
                let _ = i.write_all(stdin).await;
                let _ = i.shutdown().await;
            }
        };
        let read_out = async {
            let mut v = Vec::new();
            if let Some(o) = out.as_mut() {
                o.read_to_end(&mut v).await.map(|_| v)
            } else {
                Ok(v)
            }
        };
        let read_err = async {
            let mut v = Vec::new();
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_end(&mut v).await;
            }
            v
        };
        let ((), o, e) = tokio::join!(write, read_out, read_err);
        let status = self.wait().await?;
        let o = o.map_err(|e| Error::stream("reading remote output", e))?;
        Ok((status, o, e))
    }
}

#[async_trait]
impl Process for SshProcess {
    fn pipes(&mut self) -> &mut Pipes {
        &mut self.pipes
    }

    async fn resize(&mut self, size: TermSize) -> Result<()> {
        if !self.tty {
            return Err(Error::Unsupported(
                "resizing a process that has no terminal (spawn it with `tty`)".into(),
            ));
        }
        self.write
            .window_change(u32::from(size.cols), u32::from(size.rows), 0, 0)
            .await
            .map_err(|e| Error::stream("resizing the remote terminal", io::Error::other(e)))
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let outcome = match self.exit.take() {
            Some(rx) => rx.await.unwrap_or(Err(())),
            None => Err(()),
        };
        match outcome {
            Ok(s) => {
                self.status = Some(s);
                Ok(s)
            }
            Err(()) => Err(Error::unreachable(
                super::KIND,
                BackendFailure::Transport,
                format!(
                    "{}: the connection was lost while `{}` was running; its outcome is unknown",
                    self.label, self.program
                ),
                "berth redials on the next command and restores the session from its last snapshot",
            )),
        }
    }

    async fn terminate(&mut self) -> Result<()> {
        if let Err(e) = self.write.signal(Sig::KILL).await {
            debug!(error = %e, "signal request failed; closing the channel");
        }
        let _ = self.write.eof().await;
        let _ = self.write.close().await;
        Ok(())
    }
}

/// stdin: the channel's writer, sending EOF when shut down or dropped.
struct Stdin {
    inner: Pin<Box<dyn AsyncWrite + Send>>,
    half: Arc<ChannelWriteHalf<Msg>>,
    shut: bool,
}

impl AsyncWrite for Stdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = self.inner.as_mut().poll_shutdown(cx);
        if r.is_ready() {
            self.shut = true;
        }
        r
    }
}

impl Drop for Stdin {
    fn drop(&mut self) {
        if self.shut {
            return;
        }
        let half = self.half.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = half.eof().await;
            });
        }
    }
}
