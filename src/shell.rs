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
//! While a command runs the terminal is in its ordinary (cooked) mode, so
//! Ctrl-C reaches berth as SIGINT; berth catches it for the whole shell, so it
//! never ends berth itself. At the prompt the editor reads Ctrl-C as a key.

mod complete;
mod editor;

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

#[derive(Args, Debug)]
#[command(
    after_help = "Each line you type runs in the sandbox's persistent shell; state carries over \
between lines and to later `berth exec` calls.\n\n\
Keys: Up/Down walk the history (kept per sandbox in the state dir), Tab completes commands \
and paths as the sandbox's bash sees them, Ctrl-C stops the running command (its exit code \
is 130) or clears the line, Ctrl-D or `exit` leaves."
)]
pub struct ShellArgs {
    /// Backend to run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
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
fn place(rt: &berth_core::runtime::Runtime, backend: &str, sandbox: &str) -> String {
    if backend == "local" {
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
    // This shell runs in-process. A running `berth serve` holding a warm shell
    // of the same sandbox lets go of it now, and again at the end, so each
    // side starts from the other's last snapshot rather than from a stale
    // live shell. (Plain, unexported variables of the server's shell go.)
    crate::server::client::forget(&dir, &a.backend, &a.sandbox).await;
    let (session, recreated) = rt.named_session(&a.backend, &a.sandbox, &a.session).await?;
    if let Some(why) = recreated {
        eprintln!("berth: the sandbox was brought back: {why}");
    }
    let workdir = session.lock().await.sandbox().layout().workdir.clone();
    drop(session);
    let cwd = rt
        .store()
        .session_cwd(&a.backend, &a.sandbox, &a.session)
        .ok()
        .flatten()
        .unwrap_or_else(|| workdir.clone());
    let mut prompt = Prompt {
        place: place(&rt, &a.backend, &a.sandbox),
        sandbox: if a.session == MAIN_SESSION {
            a.sandbox.clone()
        } else {
            format!("{}/{}", a.sandbox, a.session)
        },
        workdir,
        cwd,
        last: 0,
    };
    let history = dir.join("history").join(&a.backend).join(&a.sandbox);
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
    let code = loop {
        if !at_line_start.swap(true, Ordering::Relaxed) {
            println!();
        }
        if prompts.send(prompt.render()).is_err() {
            break 0;
        }
        let line = loop {
            match inputs.recv().await {
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
        // A Ctrl-C that came while no command ran must not stop this one.
        while sigint.recv().now_or_never().is_some() {}
        let cancel = CancellationToken::new();
        let req = ExecRequest {
            backend: a.backend.clone(),
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
        let outcome = loop {
            tokio::select! {
                r = &mut exec => break r,
                _ = sigint.recv() => cancel.cancel(),
            }
        };
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
    crate::server::client::forget(&dir, &a.backend, &a.sandbox).await;
    Ok(code)
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
    let Ok((session, _)) = rt.named_session(&a.backend, &a.sandbox, &a.session).await else {
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
