//! Processes: one attached exec each.
//!
//! `spawn` creates and starts an exec with stdin, stdout and stderr attached.
//! The daemon multiplexes stdout and stderr over one hijacked connection; a
//! pump task splits them into two byte streams for the [`Process`] trait.
//!
//! Every argv runs under `setsid -w` (util-linux), so the exec'd program leads
//! a session of its own. The session engine relies on that: it kills a
//! command's whole tree by walking `/proc` for the shell's session id, in-band,
//! through a second exec, because the exec API has no way to signal or kill a
//! process. An exec'd process already leads its process group, so setsid forks
//! the program into a new session and, with `-w`, waits for it and exits with
//! its exit code. A program killed by a signal is reported the way setsid
//! reports it: its exit code is the signal's number.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::backend::{ExitStatus, Pipes, Process, SpawnOpts, TermSize};
use berth_core::error::{BackendFailure, Error, Result, SpawnFailure};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{ContainerArchiveInfoOptions, WaitContainerOptions};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, warn};

use super::{DockerSandbox, api_error, gone, says_no_container, status_of};
use crate::chan_reader::channel_reader;

/// Output chunks buffered per stream before the pump waits for the reader.
const CHANNEL_CHUNKS: usize = 64;
/// How long a process may outlive the end of its output stream before berth
/// calls the stream cut. Normally the daemon marks the exec finished moments
/// after it closes the stream.
const STREAM_END_GRACE: Duration = Duration::from_secs(2);
/// The size of the daemon-stream read buffer.
const READ_CAPACITY: usize = 64 * 1024;

/// Start `argv` in the sandbox as an attached exec.
pub(crate) async fn spawn(
    sb: &DockerSandbox,
    argv: &[String],
    opts: SpawnOpts,
) -> Result<Box<dyn Process>> {
    let Some(program) = argv.first() else {
        return Err(Error::InvalidInput("empty argv".into()));
    };
    let shell = opts
        .replaces
        .as_deref()
        .is_some_and(|r| r.starts_with("berth-shell:"))
        && program == "bash"
        && !opts.tty;
    let mut cmd = Vec::new();
    if shell {
        // Under a `tini -s` of its own, from the image's execute-only bash
        // (see `under_tini`; the tree kill's anchor is that tini).
        cmd.extend(crate::subreaper::under_tini(argv));
    } else if opts.tty {
        // An exec with a terminal already leads its own session, with that
        // terminal as its controlling one (the runtime sets both up), so no
        // setsid here: it could not take the terminal from that session.
        // The exec API takes no size at creation; `stty` sets it before the
        // program starts.
        let size = opts.tty_size.unwrap_or_default();
        cmd.extend([
            "sh".to_string(),
            "-c".to_string(),
            format!(
                "stty cols {} rows {} 2>/dev/null; exec \"$@\"",
                size.cols, size.rows
            ),
            "berth-tty".to_string(),
        ]);
    } else {
        cmd.extend(["setsid".to_string(), "-w".to_string()]);
    }
    if !shell {
        cmd.extend(argv.iter().cloned());
    }
    // The environment travels in the API request, never in argv.
    let mut env = vec![format!("BERTH_SANDBOX={}", sb.name)];
    if opts.tty && !opts.env.iter().any(|(k, _)| k == "TERM") {
        env.push("TERM=xterm-256color".to_string());
    }
    env.extend(sb.env.iter().map(|(k, v)| format!("{k}={v}")));
    env.extend(opts.env.iter().map(|(k, v)| format!("{k}={v}")));
    let cwd = opts
        .cwd
        .clone()
        .unwrap_or_else(|| sb.layout.workdir.clone());
    if cwd != sb.layout.workdir {
        check_cwd(sb, program, &cwd).await?;
    }
    let config = CreateExecOptions {
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(opts.tty),
        env: Some(env),
        cmd: Some(cmd),
        user: Some(sb.user.spec.clone()),
        working_dir: Some(cwd.clone()),
        ..Default::default()
    };
    let exec = sb
        .docker
        .create_exec(&sb.container, config)
        .await
        .map_err(|e| sb.err("creating an exec", e))?;
    let start = StartExecOptions {
        detach: false,
        tty: opts.tty,
        output_capacity: Some(READ_CAPACITY),
    };
    let started = sb
        .docker
        .start_exec(&exec.id, Some(start))
        .await
        .map_err(|e| classify_start_error(sb, program, &cwd, e))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(Error::backend(
            super::KIND,
            BackendFailure::Protocol,
            "the daemon started the exec detached although berth asked to attach; report this with the output of `docker version`",
        ));
    };
    let (out_tx, out_rx) = mpsc::channel(CHANNEL_CHUNKS);
    let (err_tx, err_rx) = mpsc::channel(CHANNEL_CHUNKS);
    let done = Arc::new(Done::default());
    let pump = tokio::spawn(pump(
        output,
        out_tx,
        err_tx,
        done.clone(),
        (sb.docker.clone(), exec.id.clone()),
    ));
    debug!(sandbox = %sb.name, exec = %exec.id, program = %program, "spawned exec");
    Ok(Box::new(DockerProcess {
        docker: sb.docker.clone(),
        host: sb.host.clone(),
        sandbox: sb.name.clone(),
        container: sb.container.clone(),
        exec_id: exec.id,
        tty: opts.tty,
        pipes: Pipes::new(input, channel_reader(out_rx), channel_reader(err_rx)),
        pump,
        done,
    }))
}

/// A missing working directory would only show as exit code 126 once the exec
/// runs; look first, so the caller gets a classified error.
async fn check_cwd(sb: &DockerSandbox, program: &str, cwd: &str) -> Result<()> {
    /// Go's `os.ModeDir` and `os.ModeSymlink`, as the daemon reports modes.
    const MODE_DIR: u32 = 1 << 31;
    const MODE_SYMLINK: u32 = 1 << 27;
    let opts = ContainerArchiveInfoOptions {
        path: cwd.to_string(),
    };
    let bad = |detail: String| Error::Spawn {
        kind: SpawnFailure::BadCwd,
        program: program.to_string(),
        detail,
    };
    match sb
        .docker
        .get_container_archive_info(&sb.container, Some(opts))
        .await
    {
        Ok(st) if st.file_mode & (MODE_DIR | MODE_SYMLINK) != 0 => Ok(()),
        Ok(_) => Err(bad(format!("working directory {cwd} is not a directory"))),
        Err(e) if status_of(&e) == Some(404) && !says_no_container(&e) => {
            Err(bad(format!("working directory {cwd} does not exist")))
        }
        Err(e) => Err(sb.err("checking the working directory", e)),
    }
}

/// Turn a failed exec start into an error the caller can act on.
///
/// Why a program could not start is read from the message: the daemon relays
/// the OCI runtime's text (`exec: "x": executable file not found in $PATH`,
/// `chdir to cwd ...`) under a bare HTTP status, with no code or errno to
/// match on. Only a daemon's answer is read so; a transport error is never
/// mistaken for a missing program.
fn classify_start_error(
    sb: &DockerSandbox,
    program: &str,
    cwd: &str,
    e: bollard::errors::Error,
) -> Error {
    let bollard::errors::Error::DockerResponseServerError { message, .. } = &e else {
        return api_error(&sb.host, &sb.name, "starting an exec", e);
    };
    let msg = message.clone();
    let kind = if msg.contains("chdir") || msg.contains("working directory") {
        Some(SpawnFailure::BadCwd)
    } else if msg.contains("executable file not found") || msg.contains("no such file") {
        Some(SpawnFailure::NotFound)
    } else if msg.contains("permission denied") {
        Some(SpawnFailure::Permission)
    } else {
        None
    };
    match kind {
        Some(kind) => Error::Spawn {
            kind,
            program: program.to_string(),
            detail: if kind == SpawnFailure::BadCwd {
                format!("working directory {cwd} does not exist: {msg}")
            } else {
                msg
            },
        },
        None => api_error(&sb.host, &sb.name, "starting an exec", e),
    }
}

/// Set once the daemon's output stream has ended.
#[derive(Default)]
struct Done {
    flag: AtomicBool,
    /// The stream ended while the exec still ran: the connection was cut.
    cut: AtomicBool,
    notify: Notify,
}

/// Split the daemon's multiplexed stream into stdout and stderr.
///
/// stdout waits for its reader (backpressure: a flood cannot exhaust memory).
/// stderr never blocks the pump: a caller that does not read stderr (a helper
/// whose stdout is all it wants) must not stall stdout, so when stderr's buffer
/// is full its excess is dropped and logged.
async fn pump(
    mut output: Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    out: mpsc::Sender<io::Result<Bytes>>,
    err: mpsc::Sender<io::Result<Bytes>>,
    done: Arc<Done>,
    exec: (Docker, String),
) {
    let mut dropped = 0usize;
    while let Some(item) = output.next().await {
        match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                // A closed reader just means nobody wants stdout any more.
                let _ = out.send(Ok(message)).await;
            }
            Ok(LogOutput::StdErr { message }) => {
                if let Err(mpsc::error::TrySendError::Full(Ok(m))) = err.try_send(Ok(message)) {
                    dropped += m.len();
                }
            }
            Ok(LogOutput::StdIn { .. }) => {}
            Err(e) => {
                debug!(error = %e, "exec stream failed");
                let _ = out
                    .send(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("the exec's stream from the Docker daemon was cut: {e}"),
                    )))
                    .await;
                break;
            }
        }
    }
    if dropped > 0 {
        warn!(bytes = dropped, "dropped stderr nobody was reading");
    }
    // The daemon records an exec's exit before it closes the exec's stream, so
    // an exec still running now lost its stream: it was cut. Look before the
    // readers see end-of-file, so `wait` already knows.
    let (docker, id) = exec;
    if let Ok(info) = docker.inspect_exec(&id).await
        && info.running == Some(true)
    {
        debug!(exec = %id, "exec stream ended while the process runs: cut");
        done.cut.store(true, Ordering::SeqCst);
    }
    drop((out, err));
    done.flag.store(true, Ordering::SeqCst);
    done.notify.notify_waiters();
}

/// A process in a docker sandbox: one exec.
struct DockerProcess {
    docker: Docker,
    host: String,
    sandbox: String,
    container: String,
    exec_id: String,
    /// Spawned on a terminal (resizable).
    tty: bool,
    pipes: Pipes,
    pump: tokio::task::JoinHandle<()>,
    done: Arc<Done>,
}

/// The exec's connection to the daemon broke while its process ran: how the
/// process ends can no longer be seen.
fn cut_error(sandbox: &str) -> Error {
    Error::stream(
        "waiting for a process in the docker sandbox",
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!(
                "the exec's stream from the Docker daemon was cut while its process in sandbox `{sandbox}` still ran; its exit status is unknown"
            ),
        ),
    )
}

/// How long to watch a container after one of its execs was killed.
const CONTAINER_STOP_WATCH: Duration = Duration::from_millis(500);

/// Whether the container stops within a moment (it was killed or stopped from
/// outside, taking an exec with it).
/// Whether the daemon says `container` is running. An error counts as not
/// running: the caller then reports the sandbox as gone, which the next call
/// re-checks by provisioning.
async fn container_running(docker: Docker, container: String) -> bool {
    match docker.inspect_container(&container, None).await {
        Ok(c) => c.state.and_then(|s| s.running) == Some(true),
        Err(_) => false,
    }
}

async fn container_stopping(docker: Docker, container: String) -> bool {
    let opts = WaitContainerOptions {
        condition: "not-running".to_string(),
    };
    let mut stream = docker.wait_container(&container, Some(opts));
    // Any answer (an exit code, the error bollard makes of a non-zero one, or
    // "no such container") means it stopped; silence means it runs on.
    matches!(
        tokio::time::timeout(CONTAINER_STOP_WATCH, stream.next()).await,
        Ok(Some(_))
    )
}

#[async_trait]
impl Process for DockerProcess {
    fn pipes(&mut self) -> &mut Pipes {
        &mut self.pipes
    }

    /// Wait until the daemon reports the exec finished, and return its exit code.
    /// The end of the output stream is only a hint, so the exec's own state
    /// decides; a stream that ended while the exec still ran was cut, and its
    /// status is reported as unknown (an error) rather than guessed.
    async fn wait(&mut self) -> Result<ExitStatus> {
        let mut pause = Duration::from_millis(2);
        let mut ended: Option<Instant> = None;
        let mut no_code: Option<Instant> = None;
        loop {
            if self.done.cut.load(Ordering::SeqCst) {
                return Err(cut_error(&self.sandbox));
            }
            let info = match self.docker.inspect_exec(&self.exec_id).await {
                Ok(i) => i,
                Err(e) if status_of(&e) == Some(404) => {
                    return Err(gone(
                        &self.sandbox,
                        "the process's container went away while it ran",
                    ));
                }
                Err(e) => {
                    return Err(api_error(
                        &self.host,
                        &self.sandbox,
                        "inspecting an exec",
                        e,
                    ));
                }
            };
            if info.running != Some(true) {
                return match info.exit_code {
                    // Killed: maybe with its whole container, which the daemon
                    // notices a moment after the exec. Tell the two apart, so the
                    // caller sees a gone sandbox rather than a dead process.
                    Some(code @ (137 | 143))
                        if container_stopping(self.docker.clone(), self.container.clone())
                            .await =>
                    {
                        debug!(sandbox = %self.sandbox, code, "exec died with its container");
                        Err(gone(
                            &self.sandbox,
                            "its container was stopped or killed while the process ran",
                        ))
                    }
                    Some(code) => Ok(ExitStatus {
                        code: Some(code as i32),
                        signal: None,
                    }),
                    // No exit code yet. Under load the daemon can show an exec
                    // as no longer running a moment before it records the code
                    // (seen after a `kill -9` of the process). Only a container
                    // that is really down means it died under the exec.
                    None if container_running(self.docker.clone(), self.container.clone())
                        .await =>
                    {
                        let since = *no_code.get_or_insert_with(Instant::now);
                        if since.elapsed() > STREAM_END_GRACE {
                            return Err(cut_error(&self.sandbox));
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    None => Err(gone(
                        &self.sandbox,
                        "the process's container stopped while it ran",
                    )),
                };
            }
            // Until the stream ends, poll slowly; after it ends the exit is
            // moments away, so look again soon.
            if !self.done.flag.load(Ordering::SeqCst) {
                let notified = self.done.notify.notified();
                let _ = tokio::time::timeout(pause, notified).await;
                pause = (pause * 2).min(Duration::from_millis(250));
            } else {
                let since = *ended.get_or_insert_with(Instant::now);
                if since.elapsed() > STREAM_END_GRACE {
                    return Err(cut_error(&self.sandbox));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    async fn resize(&mut self, size: TermSize) -> Result<()> {
        if !self.tty {
            return Err(Error::Unsupported(
                "resizing a process that has no terminal (spawn it with `tty`)".into(),
            ));
        }
        let opts = bollard::exec::ResizeExecOptions {
            width: size.cols,
            height: size.rows,
        };
        self.docker
            .resize_exec(&self.exec_id, opts)
            .await
            .map_err(|e| api_error(&self.host, &self.sandbox, "resizing a terminal", e))
    }

    /// Drop the exec's streams. The Engine API cannot signal or kill an exec; the
    /// session engine kills the process in-band before it calls this, and a
    /// shell that is still alive reads end-of-file on its stdin and exits.
    async fn terminate(&mut self) -> Result<()> {
        self.pipes = Pipes::default();
        self.pump.abort();
        Ok(())
    }
}

impl Drop for DockerProcess {
    fn drop(&mut self) {
        self.pump.abort();
    }
}
