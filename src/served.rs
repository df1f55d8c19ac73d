//! The served subcommands: `job …`, `sandbox …`, `events`, `approvals`,
//! `approve`, `deny` and `exec --background`. `berth serve` runs them for a
//! client on its warm runtime; with `BERTH_SERVER=off` the CLI runs them
//! in-process. Both go through [`run_on`] here, below both: the server does
//! not reach up into the CLI's `main`.
//!
//! Why such a call crosses as its command line (`Run`), not as a message per
//! subcommand: the command line is already a typed request, parsed by the
//! same clap types on whichever side runs it ([`parse`] knows only the served
//! subcommands and the global options), it carries arguments that are not
//! UTF-8, and what the subcommand prints streams back as it is printed
//! (`job logs --follow`, `events --follow`) through [`crate::io`]. `exec`,
//! which is called far more often and whose report scripts read field by
//! field, has typed calls of its own (`Exec`, and the quick framing).

use std::ffi::OsString;
use std::path::Path;

use anyhow::Result;
use berth_client::args::{ExecArgs, Globals};
use berth_core::runtime::Runtime;
use clap::{Parser, Subcommand};

use crate::{cmd_approvals, cmd_events, cmd_exec, cmd_job, cmd_sandbox};

/// The served subcommands, as the engine's command line names them (it
/// flattens this enum into its own).
#[derive(Subcommand, Debug)]
pub enum Served {
    /// Background jobs: start, list, follow logs, wait, kill, send input, screens.
    #[command(subcommand)]
    Job(cmd_job::JobCmd),
    /// Create, list and remove sandboxes.
    #[command(subcommand)]
    Sandbox(cmd_sandbox::SandboxCmd),
    /// Show the event log: every call with its exit code, duration and output size.
    Events(cmd_events::EventsArgs),
    /// List the commands waiting for a person's approval.
    #[command(subcommand)]
    Approvals(cmd_approvals::ApprovalsCmd),
    /// Approve a waiting command (`--always`: and allow it from now on).
    Approve(cmd_approvals::AnswerArgs),
    /// Deny a waiting command.
    Deny(cmd_approvals::AnswerArgs),
}

/// One served call.
#[derive(Debug)]
pub enum Call {
    Sub(Served),
    /// `exec --background`: a job with the session's cwd and environment.
    Background(ExecArgs),
}

/// A client's command line, as the server reads it: the global options (the
/// client's to apply: they chose this server, or kept the call in-process)
/// and a served subcommand.
#[derive(Parser, Debug)]
#[command(name = "berth")]
struct Line {
    #[command(flatten)]
    _globals: Globals,
    #[command(subcommand)]
    command: LineCommand,
}

#[derive(Subcommand, Debug)]
enum LineCommand {
    Exec(ExecArgs),
    #[command(flatten)]
    Served(Served),
}

/// Parse a client's command line (its arguments after the program's name)
/// into the served call it names. A usage error or `--help` is an error with
/// clap's text; the thin client then hands the line to the engine, which
/// prints it as clap does.
pub fn parse(args: Vec<OsString>) -> Result<Call> {
    let rendered = |e: clap::Error| anyhow::anyhow!("{}", e.render().to_string().trim_end());
    let line = Line::try_parse_from(std::iter::once(OsString::from("berth")).chain(args))
        .map_err(rendered)?;
    match line.command {
        LineCommand::Served(s) => Ok(Call::Sub(s)),
        LineCommand::Exec(a) if a.background => Ok(Call::Background(a)),
        LineCommand::Exec(_) => {
            anyhow::bail!("`exec` without --background is its own call, not a served command line")
        }
    }
}

/// Run a served call on `rt`, whose state dir is `dir`.
pub async fn run_on(rt: &Runtime, dir: &Path, call: Call) -> Result<u8> {
    let gate = || -> Result<std::sync::Arc<berth_core::gate::Gate>> {
        rt.gate()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("this runtime has no policy gate"))
    };
    match call {
        Call::Sub(Served::Job(c)) => cmd_job::run_on(rt, c).await,
        Call::Sub(Served::Sandbox(c)) => cmd_sandbox::run_on(rt, dir, c).await,
        Call::Sub(Served::Events(a)) => cmd_events::run_on(rt, a).await,
        Call::Sub(Served::Approvals(c)) => cmd_approvals::ls(rt.store(), &*gate()?, c),
        Call::Sub(Served::Approve(a)) => cmd_approvals::answer(rt.store(), &*gate()?, a, true),
        Call::Sub(Served::Deny(a)) => cmd_approvals::answer(rt.store(), &*gate()?, a, false),
        Call::Background(a) => cmd_exec::background_on(rt, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_server_reads_served_lines_with_their_global_options() -> Result<()> {
        let c = parse(line(&["--state-dir", "/s", "job", "ls", "--json"]))?;
        assert!(matches!(c, Call::Sub(Served::Job(_))), "{c:?}");
        let c = parse(line(&["exec", "--background", "--", "sleep", "1"]))?;
        assert!(matches!(c, Call::Background(_)), "{c:?}");
        let c = parse(line(&["approve", "7"]))?;
        assert!(matches!(c, Call::Sub(Served::Approve(_))), "{c:?}");
        Ok(())
    }

    #[test]
    fn a_line_the_server_does_not_serve_is_refused_with_a_reason() {
        for args in [
            &["exec", "--", "true"][..],
            &["shell"],
            &["run", "task"],
            &["job", "--help"],
            &["job", "frobnicate"],
        ] {
            assert!(parse(line(args)).is_err(), "{args:?}");
        }
        let e = parse(line(&["shell"]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("unrecognized subcommand"), "{e}");
    }
}
