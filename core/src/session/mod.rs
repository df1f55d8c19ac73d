//! The session engine: one persistent bash per session, driven over any [`Process`].
//!
//! Flow at a glance:
//! - `open` spawns `bash --noprofile --norc` through the sandbox, sends the helper
//!   functions, learns the shell's pid and session id, and restores the last
//!   snapshot found in the sandbox (cwd, exported env, functions, aliases).
//! - `exec` frames the command (see [`script`]), streams output into a bounded
//!   [`Capture`] until the nonce-bearing end marker arrives, and returns exit code
//!   and cwd. The shell writes a snapshot before every marker.
//! - A timeout or interrupt signals the command's process tree (INT, TERM, KILL)
//!   through a second spawn, and signals the shell to abandon the rest of the
//!   command's list, so the shell survives with its state. If no marker
//!   arrives even then, the shell is killed and replaced, never trusted again; the
//!   next command gets a new shell restored from the snapshot.

pub mod capture;
pub mod effects;
pub mod script;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::backend::{BoxWrite, Process, Sandbox, SpawnOpts};
use crate::error::{Error, Result};
pub use capture::{Capture, CaptureLimits, Output, Tee};
use script::SnapshotMode;

/// How long a new shell may take to answer its handshake and restore.
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
/// How much of the shell's own stderr is kept for diagnostics.
const STDERR_KEEP: usize = 4096;
/// The largest snapshot berth will read back.
const SNAPSHOT_LIMIT: u64 = 8 * 1024 * 1024;
/// How long the gate waits to read the session's definitions from its snapshot.
const DEFINITIONS_READ_LIMIT: Duration = Duration::from_secs(10);
/// How long the engine polls a local shell's stdout without sleeping after it
/// sends a command. Most commands answer within it, and a thread that never
/// sleeps needs no wake-up, which on a VM costs tens of microseconds. The cost is
/// at most this much CPU time per command.
const SPIN: Duration = Duration::from_micros(250);

/// Settings for a session.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// The session's name, used in errors and logs.
    pub name: String,
    /// Where in the sandbox the session keeps its snapshots and a command's
    /// stdin; `None`: the sandbox's berth dir (its `main` session). Several
    /// sessions of one sandbox each have their own.
    pub dir: Option<String>,
    /// The pause between INT, TERM and KILL when a command is stopped.
    pub grace: Duration,
    /// Environment for the shell, on top of the sandbox's own.
    pub env: Vec<(String, String)>,
    /// Skip the snapshot after commands whose text cannot change the shell's
    /// state (see [`effects`]). Off, only the backstop on cwd and `PATH` decides;
    /// the tests switch it off to check that backstop.
    #[doc(hidden)]
    pub read_commands: bool,
}

impl SessionConfig {
    /// Defaults for a session with this name.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            dir: None,
            grace: Duration::from_millis(1000),
            env: vec![
                ("PAGER".into(), "cat".into()),
                ("GIT_PAGER".into(), "cat".into()),
            ],
            read_commands: true,
        }
    }
}

/// Options for one command.
#[derive(Clone, Default)]
pub struct ExecOpts {
    /// Stop the command after this long.
    pub timeout: Option<Duration>,
    /// Bytes to feed the command's stdin; `/dev/null` when `None`.
    pub stdin: Option<Vec<u8>>,
    /// How much output to keep in memory.
    pub limits: CaptureLimits,
    /// Spool the output to this local file.
    pub spool: Option<PathBuf>,
    /// The most output the spool keeps (its first and last halves);
    /// [`capture::DEFAULT_SPOOL_CAP`] when `None`.
    pub spool_cap: Option<u64>,
    /// Interrupt the command when this is cancelled.
    pub cancel: Option<CancellationToken>,
    /// A live copy of the output as it arrives.
    pub tee: Option<Tee>,
    /// A transform every byte of output goes through first (redaction): the
    /// tee, the result and the spool see only its output.
    pub filter: Option<capture::FilterFactory>,
}

impl std::fmt::Debug for ExecOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOpts")
            .field("timeout", &self.timeout)
            .field("stdin", &self.stdin.as_ref().map(Vec::len))
            .field("limits", &self.limits)
            .field("spool", &self.spool)
            .field("spool_cap", &self.spool_cap)
            .field("tee", &self.tee.is_some())
            .field("filter", &self.filter.is_some())
            .finish()
    }
}

/// What a command did.
#[derive(Clone, Debug)]
pub struct ExecResult {
    /// The exit code; 124 after a timeout, 130 after an interrupt.
    pub exit_code: i32,
    /// The captured output (stdout and stderr interleaved as written).
    pub output: Output,
    /// The shell's cwd after the command, when the shell survived.
    pub cwd: Option<String>,
    /// Wall time.
    pub duration: Duration,
    /// The command hit its timeout.
    pub timed_out: bool,
    /// The command was interrupted by the caller.
    pub interrupted: bool,
    /// Things the caller should know: a discarded snapshot, a replaced shell.
    pub notices: Vec<String>,
    /// Set when this command ran in a new shell restored from this snapshot sequence.
    pub restored_from: Option<u64>,
    /// The shell wrote a snapshot after this command. It skips that when the
    /// command cannot have changed its state (see [`effects`]).
    pub snapshotted: bool,
}

/// Facts about the running shell.
#[derive(Clone, Debug, Serialize)]
pub struct ShellInfo {
    /// The shell's pid inside the sandbox.
    pub pid: u32,
    /// The shell's session id inside the sandbox.
    pub sid: u32,
    /// The snapshot sequence it was restored from, if any.
    pub restored_seq: Option<u64>,
}

struct Shell {
    process: Box<dyn Process>,
    stdin: BoxWrite,
    stdout: crate::backend::BoxRead,
    /// `stdout`'s raw non-blocking descriptor, for a local shell: see [`SPIN`].
    spin_fd: Option<std::os::fd::RawFd>,
    /// Read buffer, reused across commands.
    buf: Vec<u8>,
    /// Bytes read but not yet attributed to a command.
    pending: Vec<u8>,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// The task collecting stderr; done once the shell's stderr is closed.
    stderr_reader: Option<tokio::task::JoinHandle<()>>,
    info: ShellInfo,
    /// The shell's function and alias names as of its last snapshot; `None` until
    /// it first reports them, and until then every command snapshots.
    names: Option<HashSet<String>>,
    /// A command set up something (a trap) that can change state at any time:
    /// every command snapshots from then on.
    always_snapshot: bool,
    /// The shell's watermark (time and pid), from its last end marker (see `KILL_TREE`).
    watermark: u64,
    /// cwd and the length of `PATH` from the last end marker, and as of the last
    /// snapshot. When they differ after a command that skipped its snapshot, the
    /// engine asks for one: a backstop behind the reading of command texts.
    last_place: (String, u64),
    saved_place: Option<(String, u64)>,
}

impl Shell {
    /// Poll a local shell's stdout without waiting, for up to [`SPIN`], until the
    /// end marker is in `pending`, the output ends, or time is up. Whatever it
    /// reads lands in `pending` for the normal read loop to attribute.
    fn spin(&mut self, end_pat: &[u8]) {
        let Some(fd) = self.spin_fd else {
            return;
        };
        let until = Instant::now() + SPIN;
        loop {
            // SAFETY: `fd` belongs to `self.stdout`, which is alive for as long as
            // `self` is; it is non-blocking (checked when the shell started), so
            // this read returns at once; `buf` is valid for `buf.len()` bytes.
            let n = unsafe { libc::read(fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
            match usize::try_from(n) {
                Ok(0) => return,
                Ok(n) => {
                    self.pending.extend_from_slice(&self.buf[..n]);
                    if memchr::memmem::find(&self.pending, end_pat).is_some() {
                        return;
                    }
                }
                Err(_) => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::Interrupted
                    {
                        return;
                    }
                }
            }
            if Instant::now() >= until {
                return;
            }
            // Let the shell run, should it share this CPU.
            std::thread::yield_now();
        }
    }
}

/// Whether a descriptor is in non-blocking mode.
fn is_nonblocking(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags; an invalid descriptor
    // yields -1, which reads as "no".
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// How a framed command ended.
enum Ending {
    Marker {
        code: i32,
        cwd: String,
        /// The shell's function and alias names, sent after a snapshot (and only then).
        names: Option<HashSet<String>>,
        /// The shell is exiting (`exit`, `set -e`), its state saved.
        exiting: bool,
        /// The shell's watermark before this command.
        watermark_before: u64,
        /// The length of the shell's `PATH` after the command.
        path_len: u64,
    },
    /// The shell closed its stdout: it exited or died.
    Eof,
}

/// A persistent shell in a sandbox.
pub struct Session {
    sandbox: Arc<dyn Sandbox>,
    cfg: SessionConfig,
    shell: Option<Shell>,
    notices: Vec<String>,
    /// Set when a new shell was restored from a snapshot, until a command reports it.
    restored: Option<u64>,
}

impl Session {
    /// Start the session's shell and restore its last snapshot.
    pub async fn open(sandbox: Arc<dyn Sandbox>, cfg: SessionConfig) -> Result<Session> {
        let mut s = Session {
            sandbox,
            cfg,
            shell: None,
            notices: Vec::new(),
            restored: None,
        };
        s.ensure_shell(STARTUP_DEADLINE).await?;
        Ok(s)
    }

    /// The sandbox this session runs in.
    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
        &self.sandbox
    }

    /// Facts about the live shell, if one is running.
    pub fn shell_info(&self) -> Option<&ShellInfo> {
        self.shell.as_ref().map(|s| &s.info)
    }

    /// Whether the shell's output has ended since the last command: it exited, was
    /// killed, or the transport under it went away. Output that arrived while idle
    /// is kept for the next command. Cheap and non-blocking.
    pub fn shell_gone(&mut self) -> bool {
        let Some(shell) = self.shell.as_mut() else {
            return false;
        };
        // Poll the reader once per chunk without waiting: a noop waker is fine,
        // since nobody waits on this poll; the next exec reads normally.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if shell.buf.len() < 64 * 1024 {
                shell.buf.resize(64 * 1024, 0);
            }
            let mut rb = tokio::io::ReadBuf::new(&mut shell.buf);
            match shell.stdout.as_mut().poll_read(&mut cx, &mut rb) {
                std::task::Poll::Ready(Ok(())) if rb.filled().is_empty() => return true,
                std::task::Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    shell.pending.extend_from_slice(&shell.buf[..n]);
                }
                std::task::Poll::Ready(Err(_)) => return true,
                std::task::Poll::Pending => return false,
            }
        }
    }

    /// Notices gathered since the last command (restores, discarded snapshots).
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// Run one command in the persistent shell.
    pub async fn exec(&mut self, command: &str, opts: ExecOpts) -> Result<ExecResult> {
        if command.contains('\0') {
            return Err(Error::InvalidInput(
                "the command contains a NUL byte, which no shell command can hold; remove it"
                    .into(),
            ));
        }
        let started = Instant::now();
        // One deadline for the whole call: starting and restoring a shell count
        // against the caller's timeout too, so a shell that cannot start (say, one
        // a snapshot breaks) cannot hold the caller past it.
        let startup = opts
            .timeout
            .unwrap_or(STARTUP_DEADLINE)
            .min(STARTUP_DEADLINE);
        if self.shell_gone() {
            // It died while idle (killed, or its transport dropped): replace it
            // now rather than fail a command that never reached it.
            let status = match self.reap_dead_shell().await {
                Ok(s) => s,
                Err(e) => e.to_string(),
            };
            self.notices.push(format!(
                "the shell ended while idle ({status}); a new shell was started from the last snapshot"
            ));
        }
        self.ensure_shell(startup).await?;
        let stdin_path = match &opts.stdin {
            Some(data) => {
                let path = format!("{}/stdin", self.state_dir());
                let write = self.sandbox.write_file(&path, data, 0o600);
                match tokio::time::timeout(startup, write).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(self.session_error(&format!(
                            "writing the command's stdin to {path} did not finish within {}s",
                            startup.as_secs_f64()
                        )));
                    }
                }
                Some(path)
            }
            None => None,
        };
        let mode = self.snapshot_mode(command);
        let timeout = opts.timeout.map(|t| {
            t.saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        });
        let mut capture = Capture::new(opts.limits, opts.spool.clone())?
            .with_tee(opts.tee.clone())
            .with_filter(opts.filter.as_ref().map(|f| f()))
            .with_spool_cap(opts.spool_cap.unwrap_or(capture::DEFAULT_SPOOL_CAP));
        let outcome = self
            .run_framed(
                command,
                stdin_path.is_some(),
                mode,
                &mut capture,
                timeout,
                opts.cancel.clone(),
            )
            .await;
        let output = capture.finish()?;
        let (ending, stopped) = outcome?;
        let mut notices = self.take_notices();
        if output.spool_omitted > 0 {
            notices.push(format!(
                "the output spool is capped: it keeps the first and last halves of {} bytes and left out {} bytes in between",
                output.spool_omitted + opts.spool_cap.unwrap_or(capture::DEFAULT_SPOOL_CAP).max(2),
                output.spool_omitted
            ));
        }
        let restored_from = self.restored.take();
        let timed_out = stopped == Some(Stop::Timeout);
        let interrupted = stopped == Some(Stop::Interrupt);
        let mut snapshotted = false;
        let (exit_code, cwd) = match ending {
            Some(Ending::Marker {
                code,
                cwd,
                exiting,
                watermark_before,
                ref names,
                ..
            }) => {
                snapshotted = names.is_some();
                // A stopped command can end while processes it started live on
                // (background children ignore SIGINT). The shell is idle again, so
                // whatever was created since the command began is its leftover.
                if stopped.is_some()
                    && let Err(e) = self.kill_tree("KILL", Some(watermark_before), None).await
                {
                    warn!(session = %self.cfg.name, error = %e, "could not reap a stopped command's leftovers");
                }
                if exiting {
                    // Its EXIT trap saved its state and reported the command; let
                    // it go, so the next command starts a new shell at once.
                    let status = self
                        .reap_dead_shell()
                        .await
                        .unwrap_or_else(|e| e.to_string());
                    notices.push(format!(
                        "the shell exited ({status}); its state was saved, and the next command starts a new shell restored from it"
                    ));
                } else if !snapshotted && stopped.is_none() {
                    snapshotted = self.backstop_snapshot().await;
                    notices.append(&mut self.notices);
                }
                (code, Some(cwd))
            }
            Some(Ending::Eof) => {
                // A transport that lost its link reports that as an error: the
                // command's outcome is unknown, and must not read as an exit code.
                let status = self.reap_dead_shell().await;
                // An unreachable host is not a vanished sandbox: report it as
                // such. A lost stream (the transport's error above) is the
                // sandbox's death when the sandbox is gone.
                let alive = self.sandbox.alive().await;
                if matches!(alive, Ok(false)) {
                    return Err(Error::SandboxGone {
                        sandbox: self.sandbox.name().to_string(),
                        backend: self.sandbox.kind(),
                        reason: "the sandbox went away while the command ran".into(),
                        hint: "run the command again: berth recreates the sandbox and restores the session from its last snapshot".into(),
                    });
                }
                let status = status?;
                alive?;
                if is_lost_framing(&status) {
                    // This command never ran.
                    return Err(self.lost_framing());
                }
                notices.push(format!(
                    "the shell exited ({}); the next command starts a new shell restored from the last snapshot",
                    status
                ));
                let code = status
                    .strip_prefix("exit code ")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(-1);
                (code, None)
            }
            None => {
                notices.push(
                    "the command did not stop after INT, TERM and KILL; its shell was replaced and the next command restores the last snapshot"
                        .into(),
                );
                (-1, None)
            }
        };
        let exit_code = if timed_out {
            124
        } else if interrupted {
            130
        } else {
            exit_code
        };
        Ok(ExecResult {
            exit_code,
            output,
            cwd,
            duration: started.elapsed(),
            timed_out,
            interrupted,
            notices,
            restored_from,
            snapshotted,
        })
    }

    /// Whether this command's snapshot can be left to the shell's own check of
    /// cwd and `PATH`: only when the text cannot change state otherwise.
    fn snapshot_mode(&mut self, command: &str) -> SnapshotMode {
        let Some(shell) = self.shell.as_mut() else {
            return SnapshotMode::Force;
        };
        let Some(names) = &shell.names else {
            return SnapshotMode::Force;
        };
        if !self.cfg.read_commands {
            return SnapshotMode::Auto;
        }
        let fx = effects::effects(command, names);
        if fx.sticky {
            shell.always_snapshot = true;
        }
        if fx.may_change || shell.always_snapshot {
            SnapshotMode::Force
        } else {
            SnapshotMode::Auto
        }
    }

    /// Write a snapshot if cwd or `PATH` moved although the command's text said
    /// it could not change state. Returns whether one was written.
    async fn backstop_snapshot(&mut self) -> bool {
        let Some(shell) = self.shell.as_ref() else {
            return false;
        };
        if shell.saved_place.as_ref() == Some(&shell.last_place) {
            return false;
        }
        debug!(session = %self.cfg.name, place = ?shell.last_place, "state moved without a snapshot; writing one");
        // The loop defines `__berth_rs` before running this whenever the last
        // status was not 0, so `$?` is kept for the next command.
        match self
            .internal(
                "[[ $__berth_rc == 0 ]] || __berth_rs && :",
                SnapshotMode::Force,
                STARTUP_DEADLINE,
            )
            .await
        {
            Ok(_) => true,
            Err(e) => {
                warn!(session = %self.cfg.name, error = %e, "could not write a snapshot");
                self.notices
                    .push(format!("the shell's state could not be saved: {e}"));
                false
            }
        }
    }

    /// Stop the shell. Its state is already saved: every command that could
    /// change it wrote a snapshot.
    pub async fn close(mut self) {
        if let Some(mut shell) = self.shell.take() {
            // An `exit` frame, for transports where closing stdin does not reach
            // the shell as an end of file; the end of file ends its loop anyway.
            let bye = script::frame(&new_nonce(), "exit 0", SnapshotMode::Never, false, true);
            let _ = shell.stdin.write_all(&bye).await;
            let _ = shell.stdin.shutdown().await;
            if tokio::time::timeout(Duration::from_secs(2), shell.process.wait())
                .await
                .is_err()
            {
                let _ = shell.process.terminate().await;
            }
        }
    }

    /// Start a shell if there is none, restored from the last snapshot, within
    /// `limit`. A snapshot the shell cannot replay within it is set aside: a
    /// clean shell starts instead, and says so.
    async fn ensure_shell(&mut self, limit: Duration) -> Result<()> {
        if self.shell.is_some() {
            return Ok(());
        }
        let until = Instant::now() + limit;
        self.start_shell(limit).await?;
        let Some((seq, text)) = self.newest_snapshot(limit).await else {
            return Ok(());
        };
        let left = until.saturating_duration_since(Instant::now());
        match self.replay(seq, &text, left).await {
            Ok(()) => Ok(()),
            Err(e) => {
                warn!(session = %self.cfg.name, seq, error = %e, "could not restore snapshot");
                self.drop_shell().await;
                self.notices.push(format!(
                    "snapshot {seq} could not be restored ({e}); the session started from a clean shell"
                ));
                let left = until.saturating_duration_since(Instant::now());
                self.start_shell(left.max(Duration::from_secs(1))).await?;
                // Carry on the sequence, so the next snapshot supersedes the bad one.
                self.internal(
                    &format!("__berth_seq={seq}"),
                    SnapshotMode::Never,
                    STARTUP_DEADLINE,
                )
                .await?;
                Ok(())
            }
        }
    }

    /// Spawn a shell, send it the loop, and learn its pid and session id.
    async fn start_shell(&mut self, limit: Duration) -> Result<()> {
        let layout = self.sandbox.layout().clone();
        let argv: Vec<String> = ["bash", "--noprofile", "--norc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut process = self
            .sandbox
            .spawn(
                &argv,
                SpawnOpts {
                    env: self.cfg.env.clone(),
                    cwd: Some(layout.workdir.clone()),
                    helper: false,
                    ..SpawnOpts::default()
                },
            )
            .await?;
        let spin_fd = process.stdout_fd().filter(|fd| is_nonblocking(*fd));
        let (stdin, stdout, stderr) = match (
            process.take_stdin(),
            process.take_stdout(),
            process.take_stderr(),
        ) {
            (Some(i), Some(o), e) => (i, o, e),
            _ => {
                let _ = process.terminate().await;
                return Err(self.session_error("the backend gave the shell no stdin or stdout"));
            }
        };
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let stderr_reader = stderr
            .map(|err| tokio::spawn(keep_tail(err, stderr_tail.clone(), self.cfg.name.clone())));
        let mut shell = Shell {
            process,
            stdin,
            stdout,
            spin_fd,
            buf: vec![0u8; 64 * 1024],
            pending: Vec::new(),
            stderr_tail,
            stderr_reader,
            info: ShellInfo {
                pid: 0,
                sid: 0,
                restored_seq: None,
            },
            names: None,
            always_snapshot: false,
            watermark: 0,
            last_place: Default::default(),
            saved_place: None,
        };
        let boot = script::bootstrap(
            self.cfg.dir.as_deref().unwrap_or(&layout.berth_dir),
            &layout.workdir,
        );
        if let Err(e) = shell.stdin.write_all(boot.as_bytes()).await {
            // It died at once: its stderr says why (say, the sandbox wrapper's refusal).
            if let Some(reader) = shell.stderr_reader.take() {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
            }
            let said = shell
                .stderr_tail
                .lock()
                .map(|t| String::from_utf8_lossy(&t).trim().to_string())
                .unwrap_or_default();
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            };
            return Err(self.session_error(&format!("could not start the shell: {e}{said}")));
        }
        self.shell = Some(shell);

        let hello = self
            .internal(script::HELLO, SnapshotMode::Never, limit)
            .await?;
        let mut parts = hello.split_whitespace().map(str::parse::<u32>);
        let (pid, sid) = match (parts.next(), parts.next()) {
            (Some(Ok(p)), Some(Ok(s))) => (p, s),
            _ => {
                self.drop_shell().await;
                return Err(
                    self.session_error(&format!("the shell's handshake was garbled ({hello:?})"))
                );
            }
        };
        if let Some(sh) = self.shell.as_mut() {
            sh.info.pid = pid;
            sh.info.sid = sid;
        }
        if pid != sid {
            debug!(session = %self.cfg.name, pid, sid, "shell is not a session leader; tree kills use descent only");
        }
        Ok(())
    }

    /// The shell's function and alias names as of its last snapshot.
    pub fn names(&self) -> Option<&HashSet<String>> {
        self.shell.as_ref()?.names.as_ref()
    }

    /// What the session's aliases and functions run, read from its newest
    /// snapshot, so the policy gate can judge a call of one by its body. Every
    /// command that can define one writes a snapshot (see [`effects`]), so the
    /// newest snapshot holds every definition the names list.
    pub async fn definitions(&mut self) -> berth_policies::shell::Defined {
        let names = self.names().cloned().unwrap_or_default();
        if names.is_empty() {
            return berth_policies::shell::Defined::default();
        }
        let text = self
            .newest_snapshot(DEFINITIONS_READ_LIMIT)
            .await
            .map(|(_, t)| t)
            .unwrap_or_default();
        // berth's own loop functions are in the snapshot too; only the user's
        // definitions are for the gate to read.
        berth_policies::shell::Defined::read(names, &script::strip_own(&text))
    }

    /// The session's own directory in the sandbox (snapshots, stdin).
    fn state_dir(&self) -> String {
        self.cfg
            .dir
            .clone()
            .unwrap_or_else(|| self.sandbox.layout().berth_dir.clone())
    }

    /// The newest intact snapshot in the sandbox, if any. Each read is bounded by
    /// `limit`: the files live where commands can replace them (by a FIFO, say).
    async fn newest_snapshot(&mut self, limit: Duration) -> Option<(u64, String)> {
        let dir = self.state_dir();
        let mut best: Option<(u64, String)> = None;
        for slot in 0..2 {
            let path = format!("{dir}/snap.{slot}");
            let read = self.sandbox.read_file(&path, SNAPSHOT_LIMIT);
            let data = match tokio::time::timeout(limit, read).await {
                Ok(Ok(d)) => d,
                Ok(Err(Error::NotFound { .. })) => continue,
                Err(_) => {
                    warn!(session = %self.cfg.name, %path, "reading a snapshot timed out");
                    self.notices.push(format!(
                        "snapshot {path} could not be read within {}s; ignored",
                        limit.as_secs_f64()
                    ));
                    continue;
                }
                Ok(Err(e)) => {
                    warn!(session = %self.cfg.name, %path, error = %e, "cannot read snapshot");
                    self.notices
                        .push(format!("snapshot {path} could not be read ({e}); ignored"));
                    continue;
                }
            };
            match parse_snapshot(&data) {
                Some((seq, text)) => {
                    if best.as_ref().is_none_or(|(s, _)| seq > *s) {
                        best = Some((seq, text));
                    }
                }
                None => {
                    warn!(session = %self.cfg.name, %path, "discarding corrupt snapshot");
                    self.notices.push(format!(
                        "snapshot {path} is corrupt or incomplete and was discarded"
                    ));
                }
            }
        }
        best
    }

    /// Replay a snapshot into the new shell.
    async fn replay(&mut self, seq: u64, text: &str, limit: Duration) -> Result<()> {
        let replay = script::strip_own(text);
        let out = self.internal(&replay, SnapshotMode::Force, limit).await?;
        debug!(session = %self.cfg.name, seq, output = %out, "restored snapshot");
        if let Some(sh) = self.shell.as_mut() {
            sh.info.restored_seq = Some(seq);
        }
        self.restored = Some(seq);
        Ok(())
    }

    /// Run berth's own command in the shell and return its output as text.
    async fn internal(
        &mut self,
        text: &str,
        snapshot: SnapshotMode,
        limit: Duration,
    ) -> Result<String> {
        let mut capture = Capture::new(
            CaptureLimits {
                head: 64 * 1024,
                tail: 0,
            },
            None,
        )?;
        // berth's own commands finish at once: one that does not is not stopped
        // step by step like a user's, its shell is replaced.
        let framed = self.run_framed(text, false, snapshot, &mut capture, None, None);
        let Ok(framed) = tokio::time::timeout(limit, framed).await else {
            self.replace_shell().await;
            return Err(self.session_error(&format!(
                "the shell did not answer berth's own command within {:.1}s; it was replaced",
                limit.as_secs_f64()
            )));
        };
        let (ending, _) = framed?;
        let out = capture.finish()?.text();
        if let Some(Ending::Marker { .. }) = ending {
            return Ok(out);
        }
        // The shell ended. Its last words (say, the sandbox wrapper's refusal)
        // may still be in flight on stderr: give the reader a moment to finish,
        // and keep them before the shell is reaped, which drops its stderr.
        if let Some(reader) = self.shell.as_mut().and_then(|s| s.stderr_reader.take()) {
            let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
        }
        let stderr = self.stderr_text();
        if matches!(ending, Some(Ending::Eof))
            && self
                .reap_dead_shell()
                .await
                .is_ok_and(|st| is_lost_framing(&st))
        {
            return Err(self.lost_framing());
        }
        self.drop_shell().await;
        Err(self.session_error(&format!(
            "the shell died while starting{}",
            if stderr.is_empty() {
                String::new()
            } else {
                format!(": {stderr}")
            }
        )))
    }

    /// Send one framed command and read until its marker, the shell's end, or the
    /// end of the stop sequence. Returns `None` as the ending when the shell had to
    /// be replaced.
    async fn run_framed(
        &mut self,
        text: &str,
        with_stdin: bool,
        snapshot: SnapshotMode,
        capture: &mut Capture,
        timeout: Option<Duration>,
        cancel: Option<CancellationToken>,
    ) -> Result<(Option<Ending>, Option<Stop>)> {
        if text.len() > script::MAX_TEXT {
            return Err(Error::InvalidInput(format!(
                "the command text is {} bytes, more than a frame carries ({} bytes); write it to a file and run that",
                text.len(),
                script::MAX_TEXT
            )));
        }
        let nonce = new_nonce();
        // The guard runs after anything that may define a function; the engine's
        // reading of the text sends every such command with a snapshot.
        let guard = snapshot != SnapshotMode::Auto
            || !self.cfg.read_commands
            || text.contains("builtin")
            || text.contains("enable");
        let frame = script::frame(&nonce, text, snapshot, with_stdin, guard);

        let start_pat = format!("\u{1e}{nonce}:").into_bytes();
        let end_pat = format!(":{nonce}\u{1e}").into_bytes();
        let cancel = cancel.unwrap_or_default();
        // A command that sets traps may have replaced the one that abandons it
        // on an interrupt: stopping it kills its shell instead.
        let distrust = text.contains("trap");
        let mut deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut stop: Option<Stop> = None;
        let mut stage = 0usize;

        let Some(shell) = self.shell.as_mut() else {
            return Err(self.session_error("no shell"));
        };
        // The shell is idle at its `read`, so the frame drains promptly; a shell that
        // does not take it within the deadline is wedged and gets replaced.
        let write = async {
            shell.stdin.write_all(&frame).await?;
            shell.stdin.flush().await
        };
        let write_limit = timeout.unwrap_or(STARTUP_DEADLINE).min(STARTUP_DEADLINE);
        match tokio::time::timeout(write_limit, write).await {
            Ok(Ok(())) => {}
            // A closed stdin means the shell is gone; its stdout ends too and the
            // loop below reports that.
            Ok(Err(e)) => debug!(session = %self.cfg.name, error = %e, "shell stdin closed"),
            Err(_) => {
                self.replace_shell().await;
                return Err(self.session_error(
                    "the shell stopped reading its input; it was replaced, run the command again",
                ));
            }
        }

        if let Some(shell) = self.shell.as_mut() {
            shell.spin(&end_pat);
        }
        loop {
            // Attribute whatever is pending.
            if let Some(shell) = self.shell.as_mut()
                && let Some(mut ending) = scan(&mut shell.pending, &start_pat, &end_pat, capture)?
            {
                if let Ending::Marker {
                    names,
                    watermark_before,
                    cwd,
                    path_len,
                    ..
                } = &mut ending
                {
                    shell.last_place = (cwd.clone(), *path_len);
                    if let Some(n) = names.clone() {
                        shell.names = Some(n);
                        shell.saved_place = Some(shell.last_place.clone());
                    }
                    // The marker carried the watermark after the command.
                    std::mem::swap(&mut shell.watermark, watermark_before);
                }
                return Ok((Some(ending), stop));
            }
            let Some(shell) = self.shell.as_mut() else {
                return Ok((None, stop));
            };
            let sleep = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Read in place rather than through a pump task: one fewer hop per
                // round trip, and the pipe itself is the backpressure.
                n = shell.stdout.read(&mut shell.buf) => match n {
                    Ok(0) => {
                        capture.push(&std::mem::take(&mut shell.pending))?;
                        return Ok((Some(Ending::Eof), stop));
                    }
                    Ok(n) => shell.pending.extend_from_slice(&shell.buf[..n]),
                    Err(e) => {
                        debug!(session = %self.cfg.name, error = %e, "shell stdout failed");
                        capture.push(&std::mem::take(&mut shell.pending))?;
                        return Ok((Some(Ending::Eof), stop));
                    }
                },
                _ = sleep => {
                    let why = stop.unwrap_or(Stop::Timeout);
                    stop = Some(why);
                    if !self.escalate(stage, why, distrust).await {
                        return Ok((None, stop));
                    }
                    stage += 1;
                    deadline = Some(tokio::time::Instant::now() + self.cfg.grace);
                }
                _ = cancel.cancelled(), if stop.is_none() => {
                    stop = Some(Stop::Interrupt);
                    if !self.escalate(stage, Stop::Interrupt, distrust).await {
                        return Ok((None, stop));
                    }
                    stage += 1;
                    deadline = Some(tokio::time::Instant::now() + self.cfg.grace);
                }
            }
        }
    }

    /// One step of the stop sequence. Returns false once the shell was replaced.
    ///
    /// The first step also tells the shell to abandon the rest of the command's
    /// list (say, the `rm` of `sleep 60; rm x`), as Ctrl-C does at a terminal;
    /// see `script::traps`. `distrust` kills the shell instead.
    async fn escalate(&mut self, stage: usize, why: Stop, distrust: bool) -> bool {
        let sig = match stage {
            0 => "INT",
            1 => "TERM",
            2 => "KILL",
            _ => {
                self.replace_shell().await;
                return false;
            }
        };
        let cut = match (stage, why) {
            (0, _) if distrust => Some("KILL"),
            (0, Stop::Timeout) => Some("USR1"),
            (0, Stop::Interrupt) => Some("USR2"),
            _ => None,
        };
        if let Err(e) = self.kill_tree(sig, None, cut).await {
            warn!(session = %self.cfg.name, error = %e, "could not signal the command's processes");
        }
        true
    }

    /// Signal the running command's process tree through a second spawn: every
    /// process newer than `watermark` (the shell's current one by default).
    /// `cut`, when given, is the signal sent to the shell itself (see `KILL_TREE`).
    async fn kill_tree(
        &mut self,
        sig: &str,
        watermark: Option<u64>,
        cut: Option<&str>,
    ) -> Result<()> {
        let Some(shell) = self.shell.as_ref() else {
            return Ok(());
        };
        let watermark = watermark.unwrap_or(shell.watermark).to_string();
        let mut argv = vec![
            "bash".to_string(),
            "-c".to_string(),
            script::KILL_TREE.to_string(),
            "berth-kill".to_string(),
            shell.info.pid.to_string(),
            shell.info.sid.to_string(),
            watermark,
            sig.to_string(),
        ];
        argv.extend(cut.map(str::to_string));
        self.run_helper(&argv).await.map(|out| {
            debug!(session = %self.cfg.name, sig, killed = %out.trim(), "signalled command tree");
        })
    }

    /// Run a short helper process in the sandbox and return its stdout.
    async fn run_helper(&mut self, argv: &[String]) -> Result<String> {
        let c = crate::backend::run_to_end(
            self.sandbox.as_ref(),
            argv,
            None,
            64 * 1024,
            Duration::from_secs(10),
        )
        .await?;
        Ok(String::from_utf8_lossy(&c.stdout).into_owned())
    }

    /// Kill the shell itself and forget it.
    async fn replace_shell(&mut self) {
        if let Some(shell) = self.shell.as_ref() {
            let argv = vec![
                "kill".to_string(),
                "-KILL".to_string(),
                shell.info.pid.to_string(),
            ];
            if let Err(e) = self.run_helper(&argv).await {
                debug!(session = %self.cfg.name, error = %e, "could not kill the shell in-band");
            }
        }
        self.drop_shell().await;
    }

    async fn drop_shell(&mut self) {
        if let Some(mut shell) = self.shell.take() {
            let _ = shell.process.terminate().await;
            let _ = tokio::time::timeout(Duration::from_secs(2), shell.process.wait()).await;
        }
    }

    /// The shell's stdout ended: collect how it ended and forget it.
    async fn reap_dead_shell(&mut self) -> Result<String> {
        let Some(mut shell) = self.shell.take() else {
            return Ok("unknown status".into());
        };
        Ok(
            match tokio::time::timeout(Duration::from_secs(5), shell.process.wait()).await {
                Ok(Ok(st)) => match (st.code, st.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by signal {s}"),
                    _ => "unknown status".into(),
                },
                Ok(Err(e @ Error::Unreachable { .. })) => return Err(e),
                Ok(Err(e)) => format!("status unknown: {e}"),
                Err(_) => {
                    let _ = shell.process.terminate().await;
                    "did not exit after closing its output".into()
                }
            },
        )
    }

    fn stderr_text(&self) -> String {
        self.shell
            .as_ref()
            .and_then(|s| {
                s.stderr_tail
                    .lock()
                    .ok()
                    .map(|t| String::from_utf8_lossy(&t).trim().to_string())
            })
            .unwrap_or_default()
    }

    /// The loop found no nonce record where one belongs: a command read the
    /// loop's private input, and may have ended itself with a forged marker.
    fn lost_framing(&self) -> Error {
        self.session_error(
            "the shell lost its framing: a command read berth's private input, so the last result it reported may be false; the shell was replaced, run the command again",
        )
    }

    fn session_error(&self, detail: &str) -> Error {
        Error::Session {
            session: self.cfg.name.clone(),
            detail: detail.to_string(),
        }
    }
}

/// Whether a dead shell's status says its loop lost the framing.
fn is_lost_framing(status: &str) -> bool {
    status == format!("exit code {}", script::LOST_FRAMING)
}

/// Why a command was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Timeout,
    Interrupt,
}

/// Move output out of `pending` into `capture` until the marker; return the
/// ending once the whole marker is there.
fn scan(
    pending: &mut Vec<u8>,
    start_pat: &[u8],
    end_pat: &[u8],
    capture: &mut Capture,
) -> Result<Option<Ending>> {
    if pending.is_empty() {
        return Ok(None);
    }
    match memchr::memmem::find(pending, start_pat) {
        Some(i) => {
            if i > 0 {
                capture.push(&pending[..i])?;
                pending.drain(..i);
            }
            let body_start = start_pat.len();
            if let Some(j) = memchr::memmem::find(&pending[body_start..], end_pat) {
                let body =
                    String::from_utf8_lossy(&pending[body_start..body_start + j]).into_owned();
                pending.drain(..body_start + j + end_pat.len());
                return Ok(Some(parse_marker(&body)));
            }
            Ok(None)
        }
        None => {
            // Hold back only a suffix that could begin the marker, so output reaches
            // a live tee as soon as it arrives. The marker's only 0x1e is its first
            // byte, so the last 0x1e is the only candidate.
            let window = pending.len().saturating_sub(start_pat.len() - 1);
            let cut = match memchr::memrchr(0x1e, &pending[window..]) {
                Some(k) if start_pat.starts_with(&pending[window + k..]) => window + k,
                _ => pending.len(),
            };
            if cut > 0 {
                capture.push(&pending[..cut])?;
                pending.drain(..cut);
            }
            Ok(None)
        }
    }
}

/// Read a marker's body: `<exit>\x1f<names>\x1f<watermark>\x1f<PATH length>\x1f<cwd>`, where
/// `<names>` is an optional `!` (the shell is exiting), then `-`, or `=` and one
/// function or alias name per line. The watermark is returned in
/// `watermark_before`, which the caller swaps with the shell's current one.
fn parse_marker(body: &str) -> Ending {
    let mut parts = body.splitn(5, '\u{1f}');
    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
    let names = parts.next().unwrap_or_default();
    let (exiting, names) = match names.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, names),
    };
    let names = names.strip_prefix('=').map(|list| {
        list.lines()
            .filter(|n| !n.is_empty() && !n.starts_with("__berth_"))
            .map(str::to_string)
            .collect()
    });
    let watermark = parts.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let path_len = parts.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let cwd = parts.next().unwrap_or_default().to_string();
    Ending::Marker {
        code,
        cwd,
        names,
        exiting,
        watermark_before: watermark,
        path_len,
    }
}

/// Check a snapshot's header and trailer; return its sequence and text. Snapshots
/// are rewritten in place, so bytes after the matching trailer are stale and ignored.
fn parse_snapshot(data: &[u8]) -> Option<(u64, String)> {
    let nl = memchr::memchr(b'\n', data)?;
    let first = std::str::from_utf8(&data[..nl]).ok()?;
    let seq: u64 = first
        .strip_prefix("# berth snapshot v2 seq=")
        .or_else(|| first.strip_prefix("# berth snapshot v1 seq="))?
        .parse()
        .ok()?;
    let trailer = format!("\n# berth snapshot end seq={seq}\n");
    // Cut before decoding: the stale bytes past the trailer may split a UTF-8
    // sequence of the older snapshot they came from.
    let end = memchr::memmem::find(data, trailer.as_bytes())? + trailer.len();
    let text = std::str::from_utf8(&data[..end]).ok()?;
    Some((seq, text.to_string()))
}

/// 64 random bits: unguessable for one command's lifetime.
fn new_nonce() -> String {
    let n: u64 = rand::random();
    format!("{n:016x}")
}

async fn keep_tail(mut err: crate::backend::BoxRead, tail: Arc<Mutex<Vec<u8>>>, name: String) {
    let mut buf = vec![0u8; 8192];
    loop {
        match err.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                debug!(session = %name, stderr = %String::from_utf8_lossy(&buf[..n]), "shell stderr");
                if let Ok(mut t) = tail.lock() {
                    t.extend_from_slice(&buf[..n]);
                    let len = t.len();
                    if len > STDERR_KEEP {
                        t.drain(..len - STDERR_KEEP);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> Capture {
        match Capture::new(CaptureLimits::default(), None) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn scan_finds_marker_split_across_chunks() -> Result<()> {
        let start = b"\x1eabc:".to_vec();
        let end = b":abc\x1e".to_vec();
        let mut c = cap();
        let mut pending = b"hello \x1eab".to_vec();
        assert!(scan(&mut pending, &start, &end, &mut c)?.is_none());
        pending.extend_from_slice(b"c:0\x1f-\x1f77\x1f9\x1f/tm");
        assert!(scan(&mut pending, &start, &end, &mut c)?.is_none());
        pending.extend_from_slice(b"p:x\x1fy:abc\x1eleft");
        match scan(&mut pending, &start, &end, &mut c)? {
            Some(Ending::Marker {
                code,
                cwd,
                names,
                exiting,
                watermark_before,
                path_len,
            }) => {
                assert_eq!(code, 0);
                assert_eq!(cwd, "/tmp:x\x1fy");
                assert_eq!(path_len, 9);
                assert!(names.is_none());
                assert!(!exiting);
                assert_eq!(watermark_before, 77);
            }
            _ => panic!("no marker"),
        }
        assert_eq!(pending, b"left");
        assert_eq!(c.finish()?.text(), "hello ");
        Ok(())
    }

    #[test]
    fn a_marker_carries_names_after_a_snapshot() {
        match parse_marker("3\x1f!=hello\nll\n__berth_post\n\x1f12\x1f4\x1f/a b") {
            Ending::Marker {
                code,
                cwd,
                names,
                exiting,
                ..
            } => {
                assert_eq!(code, 3);
                assert_eq!(cwd, "/a b");
                assert!(exiting);
                let mut n: Vec<String> = names.unwrap_or_default().into_iter().collect();
                n.sort();
                assert_eq!(n, ["hello", "ll"]);
            }
            Ending::Eof => panic!("no marker"),
        }
        match parse_marker("0\x1f=\x1f1\x1f0\x1f/") {
            Ending::Marker { names, .. } => assert_eq!(names.map(|n| n.len()), Some(0)),
            Ending::Eof => panic!("no marker"),
        }
    }

    #[test]
    fn a_marker_with_another_nonce_is_output() -> Result<()> {
        let mut c = cap();
        let mut pending = b"\x1exyz:0:/:xyz\x1e".to_vec();
        assert!(scan(&mut pending, b"\x1eabc:", b":abc\x1e", &mut c)?.is_none());
        pending.clear();
        let out = c.finish()?;
        assert!(out.text().contains("xyz:0"));
        Ok(())
    }

    #[test]
    fn snapshot_needs_its_trailer() {
        let good = b"# berth snapshot v1 seq=7\nexport A=1\n# berth snapshot end seq=7\n";
        assert_eq!(parse_snapshot(good).map(|s| s.0), Some(7));
        let cut = b"# berth snapshot v1 seq=7\nexport A=1\n";
        assert!(parse_snapshot(cut).is_none());
        let wrong = b"# berth snapshot v1 seq=7\n# berth snapshot end seq=6\n";
        assert!(parse_snapshot(wrong).is_none());
        // Rewritten in place over a longer, older one: the stale tail is cut off.
        let stale = b"# berth snapshot v1 seq=9\nexport B=2\n# berth snapshot end seq=9\nexport OLD=1\n# berth snapshot end seq=7\n";
        let (seq, text) = parse_snapshot(stale).unwrap_or_default();
        assert_eq!(seq, 9);
        assert!(!text.contains("OLD"));
        // ... even where the cut splits a UTF-8 sequence of the older one.
        let split =
            b"# berth snapshot v1 seq=9\nexport B=2\n# berth snapshot end seq=9\n\x98\x80x\n";
        assert_eq!(parse_snapshot(split).map(|s| s.0), Some(9));
        assert!(parse_snapshot(b"\xff\xfe").is_none());
    }
}
