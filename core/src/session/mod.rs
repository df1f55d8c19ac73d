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
//!
//! Where it lives: this file holds the session's types and a command's run;
//! [`framing`] sends a command and reads it to its marker, `shell` starts, restores and reaps
//! the shell, and `stop` escalates a timeout or an interrupt.

pub mod capture;
mod cut;
pub mod effects;
mod framing;
pub mod script;
mod shell;
mod stderr;
mod stop;
mod tree;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::backend::{OutputGap, Sandbox};
use crate::error::{BackendFailure, Error, Result};
pub use capture::{Capture, CaptureLimits, Output, Tee};
use framing::{Ending, Plan, is_lost_framing, new_nonce};
use script::SnapshotMode;
use shell::Shell;
pub use stop::SURVIVED;
use stop::Stop;

/// How long a new shell may take to answer its handshake and restore.
pub(crate) const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
/// How much of the shell's own stderr is kept for diagnostics.
const STDERR_KEEP: usize = 4096;
/// How much of a shell's output one read takes: large output costs a wakeup
/// and a pass of the capture per read (the local backend's pipe holds 1 MiB).
const READ_BUF: usize = 256 * 1024;
/// How a shell that was to exit but did not is reported (see
/// `reap_dead_shell`).
const DID_NOT_EXIT: &str = "did not exit after closing its output";
/// The largest snapshot berth will read back.
const SNAPSHOT_LIMIT: u64 = 8 * 1024 * 1024;
/// How long the engine polls a local shell's stdout without sleeping after it
/// sends a command. Most commands answer within it, and a thread that never
/// sleeps needs no wake-up, which on a VM costs tens of microseconds. The cost is
/// at most this much CPU time per command.
const SPIN: Duration = Duration::from_micros(250);
/// Output a command streams before a local shell's reads wait for its pipe to
/// fill (see `Shell::settle`).
const BULK: u64 = 1 << 20;
/// A read smaller than this, past [`BULK`], means the reader keeps pace.
const BULK_READ: usize = 64 * 1024;
/// How long a read waits for the pipe to fill, past [`BULK`].
const SETTLE: Duration = Duration::from_micros(300);

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
    /// Keep the command's stderr apart from its stdout: `output` holds its
    /// stdout, and [`ExecResult::stderr`] its stderr (each in the order it
    /// was written; how the two interleaved is not kept).
    pub split_stderr: bool,
    /// With `split_stderr`: a live copy of the stderr as it arrives.
    pub stderr_tee: Option<Tee>,
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
            .field("split_stderr", &self.split_stderr)
            .finish()
    }
}

/// What a command did.
#[derive(Clone, Debug)]
pub struct ExecResult {
    /// The exit code; 124 after a timeout, 130 after an interrupt.
    pub exit_code: i32,
    /// The captured output: stdout and stderr interleaved as written, or
    /// stdout alone when the caller asked for stderr apart.
    pub output: Output,
    /// The command's stderr, when the caller asked for it apart
    /// ([`ExecOpts::split_stderr`]); bounded like `output`, never spooled.
    pub stderr: Option<Output>,
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

/// A persistent shell in a sandbox.
pub struct Session {
    sandbox: Arc<dyn Sandbox>,
    cfg: SessionConfig,
    shell: Option<Shell>,
    notices: Vec<String>,
    /// Set when a new shell was restored from a snapshot, until a command reports it.
    restored: Option<u64>,
    /// The shell the link was lost under while a command ran: what is left
    /// of that command is stopped before the next shell starts (see [`cut`]).
    cut_off: Option<cut::CutOff>,
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
            cut_off: None,
        };
        s.ensure_shell(STARTUP_DEADLINE).await?;
        Ok(s)
    }

    /// The sandbox this session runs in.
    /// Show this session as session `session` of sandbox `sandbox`: a pool
    /// member's shell, handed to the sandbox taken from the pool.
    pub fn rename(&mut self, session: String, sandbox: &str) {
        self.cfg.name = session;
        self.sandbox = crate::pools::Aliased::wrap(self.sandbox.clone(), sandbox);
    }

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
            shell.reserve();
            match tokio_util::io::poll_read_buf(shell.stdout.as_mut(), &mut cx, &mut shell.pending)
            {
                std::task::Poll::Ready(Ok(0)) => return true,
                std::task::Poll::Ready(Ok(_)) => {}
                // The link broke and was re-attached while the shell was idle:
                // it lives on, and the next command first resynchronises.
                std::task::Poll::Ready(Err(e)) if OutputGap::of(&e).is_some() => {
                    shell.resync = true;
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
    /// Have a live shell, restored from the last snapshot, within `startup`:
    /// replace one that died while idle, start one if there is none. Its
    /// names are known afterwards (a restore ends with a snapshot), so the
    /// gate can judge a command against what the restored shell defines
    /// before it is sent (issue 49 item 10: a handler planted in the
    /// snapshot files runs for the first unknown word after a restore).
    pub async fn prepare(&mut self, startup: Duration) -> Result<()> {
        if self.shell_gone() {
            // It died while idle (killed, or its transport dropped): replace it
            // now rather than fail a command that never reached it.
            let notice = match self.reap_dead_shell().await {
                Ok(status) => format!(
                    "the shell ended while idle ({status}); a new shell was started from the last snapshot"
                ),
                // No command ran: only the link went, and the shell with it.
                Err(Error::Unreachable { .. }) => "the link to the shell was lost while it was idle; berth reconnected and started a new shell from the last snapshot".to_string(),
                Err(e) => format!(
                    "the shell ended while idle (status unknown: {}); a new shell was started from the last snapshot",
                    e.full_text()
                ),
            };
            self.notices.push(notice);
        }
        self.ensure_shell(startup).await?;
        self.resync(startup).await?;
        Ok(())
    }

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
        self.prepare(startup).await?;
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
        let mut plan = self.plan(command);
        plan.stdin = stdin_path.is_some();
        let timeout = opts.timeout.map(|t| {
            t.saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        });
        let mut capture = Capture::new(opts.limits, opts.spool.clone())?
            .with_tee(opts.tee.clone())
            .with_filter(opts.filter.as_ref().map(|f| f()))
            .with_spool_cap(opts.spool_cap.unwrap_or(capture::DEFAULT_SPOOL_CAP));
        let mut err_capture = if opts.split_stderr {
            Some(
                Capture::new(opts.limits, None)?
                    .with_tee(opts.stderr_tee.clone())
                    .with_filter(opts.filter.as_ref().map(|f| f())),
            )
        } else {
            None
        };
        let outcome = self
            .run_framed(
                command,
                plan,
                &mut capture,
                timeout,
                opts.cancel.clone(),
                err_capture.as_mut(),
            )
            .await;
        let output = capture.finish()?;
        let stderr = err_capture.map(Capture::finish).transpose()?;
        let (ending, stopped) = outcome?;
        let mut notices = self.take_notices();
        if output.spool_omitted > 0 {
            let cap = output.total_bytes - output.spool_omitted;
            notices.push(format!(
                "the output spool is capped at {cap} bytes: of the {} bytes, it keeps the first {} and the last {} and left out {} in between; to keep all of it, redirect the command's output to a file (or raise BERTH_SPOOL_CAP_MB)",
                output.total_bytes,
                cap / 2,
                cap - cap / 2,
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
                journaled,
                cut,
                ..
            }) => {
                snapshotted = names.is_some() || journaled;
                // A stopped command can end while processes it started live on
                // (background children ignore SIGINT). The shell is idle again, so
                // whatever was created since the command began is its leftover.
                if stopped.is_some() {
                    if let Some(n) = self.reap_stopped(Some(watermark_before)).await {
                        notices.push(n);
                    }
                    // bash reports the jobs that KILL just ended ("Killed
                    // sleep 100") at its next chance: let that be a command
                    // of berth's own, whose output is dropped, rather than the
                    // caller's next one.
                    if !exiting
                        && let Err(e) = self
                            .internal(
                                // `$?` stays the stopped command's (124 or 130:
                                // `__berth_rs` returns it, and `&& :` keeps
                                // `set -e` from taking it as a failure).
                                "builtin jobs -n >/dev/null 2>&1; __berth_rs && :",
                                // A snapshot, with the definitions: the stopped
                                // command's report came on the cut nonce, which
                                // cannot vouch for them.
                                if cut {
                                    SnapshotMode::Force
                                } else {
                                    SnapshotMode::Never
                                },
                                Duration::from_secs(10),
                            )
                            .await
                    {
                        debug!(session = %self.cfg.name, error = %e, "taking the job reports after a stop");
                    }
                }
                if exiting {
                    // Its EXIT trap saved its state and reported the command; let
                    // it go, so the next command starts a new shell at once.
                    let status = self
                        .reap_dead_shell()
                        .await
                        .unwrap_or_else(|e| e.full_text());
                    // An exiting report on the cut nonce (which a command can
                    // read) is the shell's only if the shell then exits.
                    if cut && status == DID_NOT_EXIT {
                        return Err(self.lost_framing());
                    }
                    notices.push(format!(
                        "the shell exited ({status}); its state was saved, and the next command starts a new shell restored from it"
                    ));
                } else if !snapshotted && stopped.is_none() {
                    snapshotted = self.backstop_snapshot().await;
                    notices.append(&mut self.notices);
                }
                (code, Some(cwd))
            }
            Some(Ending::Gap(why)) => {
                // The transport re-attached to the same shell: it lives on with
                // its state, but this command's output and status are lost.
                if let Some(sh) = self.shell.as_mut() {
                    sh.resync = true;
                }
                return Err(Error::unreachable(
                    self.sandbox.kind().as_str(),
                    BackendFailure::Transport,
                    format!(
                        "sandbox `{}`: the link to the shell broke while the command ran ({why}); berth re-attached to the same shell, which keeps its state, but the command's output and exit status are lost",
                        self.sandbox.name()
                    ),
                    "check the network, and check the command's effects before running it again",
                ));
            }
            Some(Ending::Eof) => {
                // A transport that lost its link reports that as an error: the
                // command's outcome is unknown, and must not read as an exit code.
                // A shell that died while its command was being stopped (one
                // the stop killed, since the engine distrusted it) leaves the
                // command's processes behind: they go now.
                if stopped.is_some()
                    && let Some(n) = self.reap_stopped(None).await
                {
                    notices.push(n);
                }
                self.note_cut_off(command);
                let status = self.reap_dead_shell().await;
                if !matches!(status, Err(Error::Unreachable { .. })) {
                    self.cut_off = None;
                }
                // An unreachable host is not a vanished sandbox: report it as
                // such. A lost stream (the transport's error above) is the
                // sandbox's death when the sandbox is gone.
                let alive = self.sandbox.alive().await;
                if matches!(alive, Ok(false)) {
                    return Err(Error::SandboxGone {
                        sandbox: self.sandbox.name().to_string(),
                        backend: self.sandbox.kind().as_str(),
                        reason: "the sandbox went away while the command ran".into(),
                        hint: "run the command again: berth recreates the sandbox and restores the session from its last snapshot".into(),
                    });
                }
                let status = match status {
                    Err(Error::Unreachable {
                        backend,
                        kind,
                        source,
                        ..
                    }) => {
                        return Err(Error::Unreachable {
                            backend,
                            kind,
                            detail: format!(
                                "sandbox `{}`: the connection was lost while the command ran, so its output and exit status are lost, and it may still run on the host",
                                self.sandbox.name()
                            ),
                            hint: "the next command in this session reconnects and first stops what is left of it (and says so); check the command's effects before running it again".into(),
                            source,
                        });
                    }
                    s => s?,
                };
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
            stderr,
            cwd,
            duration: started.elapsed(),
            timed_out,
            interrupted,
            notices,
            restored_from,
            snapshotted,
        })
    }

    /// How to frame this command, from a reading of its text:
    /// - its snapshot can be left to the shell's own check of cwd and `PATH`
    ///   only when the text cannot change state otherwise;
    /// - the snapshot leaves the shell's functions out (they are in a file of
    ///   their own, written after the last command that could change one)
    ///   when the text cannot define, change or remove a function: printing
    ///   them all is the largest part of a snapshot in a session that sourced
    ///   a tool's functions (a venv's `deactivate`, nvm, conda);
    /// - the guard, which undoes what would break the loop (a function named
    ///   `builtin`, a disabled builtin, a replaced trap), runs after anything
    ///   that may define a function or change how builtins resolve, and after
    ///   every command once a trap was set (a trap can run any code later).
    ///   Most state changes (`export`, `cd`, assignments) cannot, and skip it.
    fn plan(&mut self, command: &str) -> Plan {
        let named = |snapshot| Plan {
            snapshot,
            guard: true,
            distrust: true,
            journal: String::new(),
            stdin: false,
        };
        let Some(shell) = self.shell.as_mut() else {
            return named(SnapshotMode::Force);
        };
        let Some(names) = &shell.names else {
            return named(SnapshotMode::Force);
        };
        if !self.cfg.read_commands {
            return named(SnapshotMode::Auto);
        }
        let (fx, listed) = crate::gate::reading(command, || effects::journal(command, names));
        if fx.sticky {
            shell.always_snapshot = true;
        }
        let builtins = command.contains("builtin") || command.contains("enable");
        let listed = listed
            .filter(|l| !l.is_empty() && shell.journal_len < script::JOURNAL_MAX)
            .map(|l| l.join(" "))
            .filter(|l| l.len() <= script::JOURNAL_LIST_MAX);
        let mut journal = String::new();
        let snapshot = if fx.may_redefine || shell.always_snapshot || builtins {
            SnapshotMode::Force
        } else if let Some(l) = listed {
            journal = l;
            SnapshotMode::Journal
        } else if fx.may_change {
            SnapshotMode::State
        } else {
            SnapshotMode::Auto
        };
        Plan {
            journal,
            stdin: false,
            snapshot,
            guard: fx.may_define || shell.always_snapshot || builtins,
            // Not for stickiness: the guard put the handlers back after the
            // command that set a trap, so a plain command later is trusted.
            distrust: fx.may_define || builtins,
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
            let bye = script::frame(
                &new_nonce(),
                &new_nonce(),
                "exit 0",
                SnapshotMode::Never,
                script::Io::default(),
                true,
                "",
            );
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

    /// The shell's function and alias names as of its last snapshot.
    pub fn names(&self) -> Option<&HashSet<String>> {
        self.shell.as_ref()?.names.as_ref()
    }

    /// Whether berth itself puts variable `name` in the shell's environment
    /// (`PAGER=cat`, what the policy passes): its value is berth's, not a
    /// command's.
    pub fn sets_env(&self, name: &str) -> bool {
        self.cfg.env.iter().any(|(k, _)| k == name)
    }

    /// What the session's aliases and functions run, so the policy gate can
    /// judge a call of one by its body. They come from the shell's end
    /// markers, which carry them after every snapshot (and every command that
    /// can define one writes a snapshot, see [`effects`]): never from the
    /// snapshot files, which commands in the sandbox can edit.
    pub async fn definitions(&mut self) -> berth_policies::shell::Defined {
        let names = self.names().cloned().unwrap_or_default();
        if names.is_empty() {
            return berth_policies::shell::Defined::default();
        }
        let text = self
            .shell
            .as_ref()
            .map(|s| s.defs_text())
            .unwrap_or_default();
        // berth's own loop functions are in the text too; only the user's
        // definitions are for the gate to read.
        let text = script::strip_own(&text);
        crate::gate::reading(&text, || berth_policies::shell::Defined::read(names, &text))
    }

    /// The session's own directory in the sandbox (snapshots, stdin).
    fn state_dir(&self) -> String {
        self.cfg
            .dir
            .clone()
            .unwrap_or_else(|| self.sandbox.layout().berth_dir.clone())
    }

    fn stderr_text(&self) -> String {
        self.shell
            .as_ref()
            .and_then(|s| {
                s.stderr_feed
                    .lock()
                    .ok()
                    .map(|f| String::from_utf8_lossy(&f.tail).trim().to_string())
            })
            .unwrap_or_default()
    }

    /// The loop found no nonce record where one belongs: a command read the
    /// loop's private input (and may have ended itself with a forged marker),
    /// or changed a variable the loop reports with (`readonly __berth_rc`).
    fn lost_framing(&self) -> Error {
        self.session_error(
            "the shell lost its framing: a command read berth's private input or changed berth's variables in the shell, so the last result it reported may be false; the shell was replaced, run the command again",
        )
    }

    fn session_error(&self, detail: &str) -> Error {
        Error::Session {
            session: self.cfg.name.clone(),
            detail: detail.to_string(),
        }
    }
}
