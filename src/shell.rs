//! `berth shell`: an interactive prompt over a sandbox's persistent session.
//!
//! Flow at a glance:
//! 1. open the sandbox's session (restoring its last snapshot) and the
//!    sandbox's history file in the state dir (`history/<backend>/<sandbox>`);
//! 2. loop: show the prompt (`berth:<sandbox>:<cwd>$`, the workspace as `~`)
//!    and read a line with the editor ([`editor`]: line editing, history,
//!    Tab answered by the session's own `compgen` through [`complete`]);
//! 3. run the line through the runtime like `berth exec` does (policy gate,
//!    event log, redaction), its output streamed to the terminal;
//! 4. Ctrl-C while it runs cancels only that command: the engine kills its
//!    process tree, `$?` becomes 130 and the prompt comes back with the
//!    session intact. Ctrl-C at the prompt drops the line; Ctrl-D (or `exit`)
//!    leaves with status 0.
//!
//! The session's shell has no terminal (its stdin is /dev/null). A line that
//! needs one (`tty COMMAND`, or a known terminal program alone on the line)
//! runs instead as a terminal job with the user's terminal connected to it
//! ([`tty`]), when berth shell itself is on a terminal.
//!
//! While a command runs the terminal is in its ordinary (cooked) mode, so
//! Ctrl-C reaches berth as SIGINT; berth catches it for the whole shell, so it
//! never ends berth itself. At the prompt the editor reads Ctrl-C as a key.

mod complete;
mod editor;
mod tty;

use berth_core::backend::BackendKind;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use berth_core::runtime::{DEFAULT_SANDBOX, ExecRequest, MAIN_SESSION, Runtime};
use berth_core::session::{ExecOpts, Tee};
use clap::Args;
use futures::FutureExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cmd_exec::timeout_from_secs;
use crate::context::{self, DEFAULT_BACKEND};
use editor::Input;

/// How long a completion may take in the sandbox.
const COMPLETE_TIMEOUT: Duration = Duration::from_secs(5);
/// berth shell's status when its terminal closed, as a shell's (128 + SIGHUP).
const EXIT_HANGUP: u8 = 129;
/// Said once when berth shell starts on a terminal.
const BANNER: &str = "berth: commands here run without a terminal; `tty COMMAND`, vim, less, top \
and bare REPLs (python3, node...) get one (see --help)";

#[derive(Args, Debug)]
#[command(
    after_help = "Each line you type runs in the sandbox's persistent shell; state carries over \
between lines and to later `berth exec` calls.\n\n\
Keys: Up/Down walk the history (kept per sandbox in the state dir), Tab completes commands \
and paths as the sandbox's bash sees them, Ctrl-C stops the running command (its exit code \
is 130) or clears the line, Ctrl-D or `exit` leaves.\n\n\
Terminals: a line runs in the session's shell without a terminal (its stdin is /dev/null, so \
`read` gets EOF). `tty COMMAND` runs COMMAND on a terminal instead, as `ssh -t` does, and so \
does a line that is only an editor, pager or monitor (vim, vi, nvim, nano, emacs, less, more, \
man, top, htop) or a REPL with no script or query (python, python3, ipython, node, irb, bash, \
sh, zsh, psql, mysql, sqlite3, `ssh HOST`). Such a line is a terminal job of the sandbox, \
launched from the session (its cwd and exported variables; what it changes stays in it, as in a \
subshell), judged by the policy like any command, and removed from `berth job ls` when it ends; \
its exit status is `$?`. Ctrl-] detaches and leaves it running (`berth attach ID` returns). \
A pipeline is not detected: `cat log | less` prints through; `tty cat log | less` pages. \
When berth shell's input is not a terminal, nothing runs on one."
)]
pub struct ShellArgs {
    /// Backend to run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Sandbox to run in.
    #[arg(long, short = 's', default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// The sandbox's session: a named one is a shell of its own (cwd,
    /// environment) beside the others; `main` is the one `berth exec` uses.
    #[arg(long, value_name = "NAME", default_value = MAIN_SESSION)]
    pub session: String,
    /// Per-command timeout in seconds.
    #[arg(
        long,
        short = 't',
        default_value_t = 600.0,
        allow_negative_numbers = true
    )]
    pub timeout: f64,
}

/// The shell's state between lines.
struct Prompt {
    /// Where the sandbox is, but on the local backend: `(docker)`,
    /// `(ssh box1)`; empty for local.
    place: String,
    /// `sandbox`, or `sandbox/session` for a named session.
    sandbox: String,
    workdir: String,
    cwd: String,
    last: i32,
}

impl Prompt {
    fn render(&self) -> String {
        let status = if self.last == 0 {
            String::new()
        } else {
            format!("[{}] ", self.last)
        };
        format!(
            "berth{}:{}:{} {status}$ ",
            self.place,
            self.sandbox,
            home_relative(&self.cwd, &self.workdir)
        )
    }
}

/// Where a sandbox is, for the prompt: the backend, and an ssh sandbox's
/// host; nothing for the local backend.
fn place(rt: &berth_core::runtime::Runtime, backend: BackendKind, sandbox: &str) -> String {
    if backend == BackendKind::Local {
        return String::new();
    }
    let host = rt
        .store()
        .sandbox(backend, sandbox)
        .ok()
        .flatten()
        .and_then(|r| r.spec.option("host").map(str::to_string));
    match host {
        Some(h) => format!("({backend} {h})"),
        None => format!("({backend})"),
    }
}

/// `cwd` with the workspace shown as `~`.
fn home_relative(cwd: &str, workdir: &str) -> String {
    let workdir = workdir.trim_end_matches('/');
    if workdir.is_empty() {
        return cwd.to_string();
    }
    if cwd == workdir {
        return "~".into();
    }
    match cwd.strip_prefix(workdir) {
        Some(rest) if rest.starts_with('/') => format!("~{rest}"),
        _ => cwd.to_string(),
    }
}

pub async fn run(state_dir: Option<PathBuf>, a: ShellArgs) -> Result<u8> {
    let timeout = timeout_from_secs(a.timeout)?;
    let dir = context::state_dir(state_dir)?;
    let rt = context::runtime(Some(dir.clone()))?;
    // Caught for the whole shell: SIGINT never ends berth, it stops a command.
    let mut sigint = signal(SignalKind::interrupt())
        .context("cannot catch Ctrl-C (SIGINT); berth shell needs it to stop commands")?;
    // A closed terminal ends what runs with the shell, as with ssh: a
    // command is stopped, a terminal program ended, rather than going on
    // unseen in the sandbox. Nothing is printed then: there is no terminal.
    let mut hangup = signal(SignalKind::hangup()).context(
        "cannot catch SIGHUP; berth shell needs it to end what runs when its terminal closes",
    )?;
    // This shell runs in-process. A running `berth serve` holding a warm shell
    // of the same sandbox lets go of it now, and again at the end, so each
    // side starts from the other's last snapshot rather than from a stale
    // live shell. (Plain, unexported variables of the server's shell go.)
    crate::server::client::forget(&dir, a.backend.as_str(), &a.sandbox).await;
    let (session, recreated) = rt.named_session(a.backend, &a.sandbox, &a.session).await?;
    if let Some(why) = recreated {
        eprintln!("berth: the sandbox was brought back: {why}");
    }
    let workdir = session.lock().await.sandbox().layout().workdir.clone();
    drop(session);
    let cwd = rt
        .store()
        .session_cwd(a.backend, &a.sandbox, &a.session)
        .ok()
        .flatten()
        .unwrap_or_else(|| workdir.clone());
    let mut prompt = Prompt {
        place: place(&rt, a.backend, &a.sandbox),
        sandbox: if a.session == MAIN_SESSION {
            a.sandbox.clone()
        } else {
            format!("{}/{}", a.sandbox, a.session)
        },
        workdir,
        cwd,
        last: 0,
    };
    let on_terminal = crate::terminal::is_terminal();
    if on_terminal {
        eprintln!("{BANNER}");
    }
    let history = dir
        .join("history")
        .join(a.backend.as_str())
        .join(&a.sandbox);
    let (prompts, mut inputs) = editor::spawn(Some(history));
    // Whether the last output byte ended a line, so the prompt starts on its own.
    let at_line_start = Arc::new(AtomicBool::new(true));
    let line_start = at_line_start.clone();
    let tee: Tee = Arc::new(move |b: &[u8]| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b);
        let _ = out.flush();
        if let Some(last) = b.last() {
            line_start.store(*last == b'\n', Ordering::Relaxed);
        }
    });
    let code = 'shell: loop {
        if !at_line_start.swap(true, Ordering::Relaxed) {
            println!();
        }
        if prompts.send(prompt.render()).is_err() {
            break 0;
        }
        let line = loop {
            let input = tokio::select! {
                i = inputs.recv() => i,
                _ = hangup.recv() => break 'shell EXIT_HANGUP,
            };
            match input {
                Some(Input::Complete { line, pos, reply }) => {
                    let found = complete(&rt, &a, &line, pos, prompt.last).await;
                    let _ = reply.send(found);
                }
                Some(other) => break other,
                None => break Input::Eof,
            }
        };
        let line = match line {
            Input::Line(l) => l,
            Input::Interrupted => continue,
            Input::Eof => break 0,
            Input::Failed(e) => {
                eprintln!("berth: the terminal failed: {e}");
                break crate::EXIT_BERTH_ERROR;
            }
            Input::Complete { .. } => continue,
        };
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(code) = exit_request(trimmed) {
            break code;
        }
        let on_tty = match tty::classify(trimmed) {
            tty::Line::Plain => None,
            tty::Line::Explicit(command) if on_terminal => Some(command.to_string()),
            tty::Line::Detected(_) if on_terminal => Some(trimmed.to_string()),
            tty::Line::Explicit(command) => {
                eprintln!(
                    "berth: `tty` needs berth shell on a terminal, and its input or output is \
                     not one; `{}` runs it on a terminal of its own",
                    job_start_hint(&a, command)
                );
                prompt.last = 2;
                set_status(&rt, &a, 2).await;
                continue;
            }
            tty::Line::Detected(program) => {
                eprintln!(
                    "berth: {program} runs without a terminal (stdin is /dev/null), as berth \
                     shell's input or output is not one; `{}` gives it one",
                    job_start_hint(&a, trimmed)
                );
                None
            }
        };
        if let Some(command) = on_tty {
            match terminal_line(&rt, &a, &command, &at_line_start, &mut hangup).await {
                TtyEnd::Status(code) => prompt.last = code,
                TtyEnd::Same => {}
                TtyEnd::HungUp => break EXIT_HANGUP,
            }
            continue;
        }
        // A Ctrl-C that came while no command ran must not stop this one.
        while sigint.recv().now_or_never().is_some() {}
        let cancel = CancellationToken::new();
        let req = ExecRequest {
            backend: a.backend,
            sandbox: a.sandbox.clone(),
            command: line,
            timeout: Some(timeout),
            tee: Some(tee.clone()),
            cancel: Some(cancel.clone()),
            session: Some(a.session.clone()),
            ..Default::default()
        };
        let exec = rt.exec(req);
        tokio::pin!(exec);
        let mut hung_up = false;
        let outcome = loop {
            tokio::select! {
                r = &mut exec => break r,
                _ = sigint.recv() => cancel.cancel(),
                _ = hangup.recv(), if !hung_up => {
                    hung_up = true;
                    cancel.cancel();
                }
            }
        };
        if hung_up {
            break EXIT_HANGUP;
        }
        if !at_line_start.swap(true, Ordering::Relaxed) {
            println!();
        }
        match outcome {
            Ok(r) => {
                for n in &r.result.notices {
                    eprintln!("berth: {n}");
                }
                if r.result.timed_out {
                    eprintln!(
                        "berth: timed out after {}s; the command's processes were stopped",
                        timeout.as_secs_f64()
                    );
                }
                if let Some(c) = r.result.cwd {
                    prompt.cwd = c;
                }
                prompt.last = r.result.exit_code;
            }
            Err(e) => eprintln!("berth: error: {e}"),
        }
    };
    drop(prompts);
    rt.shutdown().await;
    crate::server::client::forget(&dir, a.backend.as_str(), &a.sandbox).await;
    Ok(code)
}

/// What a terminal line leaves for the prompt.
enum TtyEnd {
    /// Its program's status.
    Status(i32),
    /// The status as it was: the line goes on detached, or could not run
    /// (said on stderr).
    Same,
    /// The terminal closed; its program was ended.
    HungUp,
}

/// Run a line on a terminal job ([`tty::run`]).
async fn terminal_line(
    rt: &Runtime,
    a: &ShellArgs,
    command: &str,
    at_line_start: &AtomicBool,
    hangup: &mut tokio::signal::unix::Signal,
) -> TtyEnd {
    let (out, open_line) = tty::stdout_tee();
    let at = tty::Place {
        backend: a.backend,
        sandbox: &a.sandbox,
        session: &a.session,
    };
    let ran = tty::run(rt, at, command, out, hangup).await;
    if matches!(ran, Ok(tty::Ran::HungUp)) {
        return TtyEnd::HungUp;
    }
    let open = open_line.lock().map(|l| l.has_text()).unwrap_or(true);
    let exited = matches!(ran, Ok(tty::Ran::Exited(_)));
    // A message of berth's goes on a line of its own. The prompt follows
    // at once where a full-screen program left the cursor (the loop adds a
    // newline only after a line with text on it).
    if open && !exited {
        println!();
    }
    at_line_start.store(!(open && exited), Ordering::Relaxed);
    match ran {
        Ok(tty::Ran::Exited(code)) => {
            set_status(rt, a, code).await;
            TtyEnd::Status(code)
        }
        Ok(tty::Ran::Detached(id)) => {
            eprintln!(
                "berth: detached; `{command}` goes on as job {id} (`berth attach {id}` returns \
                 to it, `berth job kill {id}` ends it)"
            );
            TtyEnd::Same
        }
        Ok(tty::Ran::HungUp) => TtyEnd::HungUp,
        Err(e) => {
            eprintln!("berth: error: {e:#}");
            TtyEnd::Same
        }
    }
}

/// The `berth job start --pty` line that runs `command` on a terminal in
/// this shell's sandbox and session.
fn job_start_hint(a: &ShellArgs, command: &str) -> String {
    let mut hint = String::from("berth job start --pty");
    if a.backend.as_str() != DEFAULT_BACKEND {
        hint.push_str(&format!(" -b {}", a.backend));
    }
    if a.sandbox != DEFAULT_SANDBOX {
        hint.push_str(&format!(" -s {}", a.sandbox));
    }
    if a.session != MAIN_SESSION {
        hint.push_str(&format!(" --session {}", a.session));
    }
    let plain = command
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " ._/-=+,:@".contains(c));
    if plain {
        format!("{hint} -- {command}")
    } else {
        format!("{hint} -- {}", complete::quote(command))
    }
}

/// Leave the session's `$?` at `code`, the status of a line that ran on a
/// terminal job (the job's launcher left it at 0). The line is berth's own:
/// the gate is not asked.
async fn set_status(rt: &Runtime, a: &ShellArgs, code: i32) {
    let Ok((session, _)) = rt.named_session(a.backend, &a.sandbox, &a.session).await else {
        return;
    };
    let opts = ExecOpts {
        timeout: Some(COMPLETE_TIMEOUT),
        ..Default::default()
    };
    let mut session = session.lock().await;
    if let Err(e) = session.exec(&complete::set_status(code), opts).await {
        tracing::debug!(error = %e, "setting $? after a terminal line");
    }
}

/// `exit` or `exit N` typed at the prompt: leave berth shell (the sandbox's
/// shell stays, as does its state).
fn exit_request(line: &str) -> Option<u8> {
    let mut words = line.split_whitespace();
    if words.next() != Some("exit") {
        return None;
    }
    match (words.next(), words.next()) {
        (None, _) => Some(0),
        (Some(n), None) => n.parse::<i64>().ok().map(|n| (n & 0xff) as u8),
        _ => None,
    }
}

/// Candidates for Tab, from the session's own bash. The policy gate is not
/// asked: the line is berth's own `compgen`, with the typed word quoted.
async fn complete(
    rt: &Runtime,
    a: &ShellArgs,
    line: &str,
    pos: usize,
    last: i32,
) -> Vec<(String, String)> {
    let word = complete::Word::at(line, pos);
    let Ok((session, _)) = rt.named_session(a.backend, &a.sandbox, &a.session).await else {
        return Vec::new();
    };
    let opts = ExecOpts {
        timeout: Some(COMPLETE_TIMEOUT),
        ..Default::default()
    };
    let mut session = session.lock().await;
    match session.exec(&word.script(last), opts).await {
        Ok(r) if !r.timed_out => word.candidates(&r.output.text()),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_shows_as_a_tilde() {
        assert_eq!(home_relative("/workspace", "/workspace"), "~");
        assert_eq!(home_relative("/workspace/src", "/workspace/"), "~/src");
        assert_eq!(home_relative("/workspaces", "/workspace"), "/workspaces");
        assert_eq!(home_relative("/tmp", "/workspace"), "/tmp");
    }

    #[test]
    fn exit_with_or_without_a_status_leaves() {
        assert_eq!(exit_request("exit"), Some(0));
        assert_eq!(exit_request("exit 3"), Some(3));
        assert_eq!(exit_request("exit 256"), Some(0));
        assert_eq!(exit_request("exit; ls"), None);
        assert_eq!(exit_request("exitcode"), None);
    }
}
