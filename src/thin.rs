//! `berth`: the command people and scripts run. A thin client: it makes the
//! calls `berth serve` answers (`exec`, and the served subcommands `job`,
//! `sandbox`, `events`, `approvals`, `approve`, `deny`) itself, and hands
//! every other command line to `berth-engine` beside it, unchanged (one exec:
//! same pid, same stdio, same signals).
//!
//! Why two binaries: a served call's cost is mostly process start-up, and a
//! position-independent binary's start-up grows with its size (the dynamic
//! loader relocates, and so dirties, every page of pointers in it). The engine
//! links the backends, the store and the TLS stack; this links the protocol,
//! clap and tokio. See the README's Speed section for the figures.
//!
//! Anything this parser does not take as its own (help, a usage error, global
//! options after a served subcommand's name, `BERTH_SERVER=off`) goes to the
//! engine, whose parser is the full one: both parse `exec` and the global
//! options with the same types ([`berth_client::args`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use berth_client::args::{ExecArgs, Globals};
use berth_client::client::{self, Quick, Unparsed};
use berth_client::proto::ExecCall;
use berth_client::{EXIT_BERTH_ERROR, Mode, error_text};
use clap::{Parser, Subcommand};

/// The part of berth's command line the thin client reads.
#[derive(Parser, Debug)]
#[command(name = "berth", allow_external_subcommands = true)]
struct Thin {
    #[command(flatten)]
    globals: Globals,
    #[command(subcommand)]
    command: ThinCommand,
}

#[derive(Subcommand, Debug)]
enum ThinCommand {
    Exec(ExecArgs),
    #[command(external_subcommand)]
    Other(Vec<OsString>),
}

/// The subcommands the server runs from a client's command line (`Run`);
/// the engine's `served::Served` (and `exec --background`) is the same set.
const SERVED: &[&str] = &["job", "sandbox", "events", "approvals", "approve", "deny"];

/// Global options: given after an external subcommand's name, clap here does
/// not read them, so such a command line goes to the engine, which does.
const GLOBAL_LONG: &[&str] = &[
    "--state-dir",
    "--log",
    "--host",
    "--accept-new",
    "--ssh-config",
    "--known-hosts",
    "--identity",
    "--jump",
    "--connect-timeout",
];

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let Ok(cli) = Thin::try_parse_from(&argv) else {
        return engine(&argv);
    };
    if cli.globals.ssh.own() {
        return engine(&argv);
    }
    berth_client::diag::init(&cli.globals.log);
    let mode = match Mode::from_env() {
        Ok(Mode::Off) | Err(_) => return engine(&argv),
        Ok(m) => m,
    };
    // An `exec` of its own, or a line for the server to run (`Run`).
    let exec = match cli.command {
        ThinCommand::Exec(a) if a.background => None,
        ThinCommand::Exec(a) => Some(a),
        ThinCommand::Other(rest) if served_line(&rest) => None,
        ThinCommand::Other(_) => return engine(&argv),
    };
    let dir = match berth_client::state_dir(cli.globals.state_dir) {
        Ok(d) => d,
        Err(_) => return engine(&argv),
    };
    // `exec` first tries the quick framing, which needs no async runtime:
    // most served calls end here.
    let call = match exec {
        Some(a) => match client::exec_quick(&dir, &a) {
            Ok(Quick::Done(code)) => return ExitCode::from(code),
            Ok(Quick::Grpc(c)) => Call::Exec(c, a.json),
            Err(e) => {
                eprintln!("berth: error: {}", error_text(&e));
                return ExitCode::from(EXIT_BERTH_ERROR);
            }
        },
        None => Call::Run,
    };
    let rt = match berth_client::cli_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_BERTH_ERROR);
        }
    };
    let result = rt.block_on(async move {
        match call {
            Call::Exec(c, json) => client::exec_grpc(dir, mode, c, json).await,
            Call::Run => client::run(dir, mode).await,
        }
    });
    rt.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        // The server's parser refused the line, or it asked for help: the
        // engine prints that as clap does.
        Err(e) if e.downcast_ref::<Unparsed>().is_some() => engine(&argv),
        Err(e) => {
            eprintln!("berth: error: {}", error_text(&e));
            ExitCode::from(EXIT_BERTH_ERROR)
        }
    }
}

enum Call {
    /// An `exec` the quick framing stepped aside from (`--json` or not).
    Exec(ExecCall, bool),
    Run,
}

/// Whether a subcommand's line is one to send to the server as it is: a
/// served subcommand, with no global option after its name (those are this
/// process's to apply) before a `--`.
fn served_line(rest: &[OsString]) -> bool {
    let Some(name) = rest.first().and_then(|n| n.to_str()) else {
        return false;
    };
    if !SERVED.contains(&name) {
        return false;
    }
    !rest[1..]
        .iter()
        .map(|a| a.as_encoded_bytes())
        .take_while(|a| *a != b"--")
        .any(|a| {
            GLOBAL_LONG.iter().any(|g| {
                a.strip_prefix(g.as_bytes())
                    .is_some_and(|r| r.is_empty() || r[0] == b'=')
            }) || (a.len() >= 2
                && a[0] == b'-'
                && a[1] != b'-'
                && (a[1..].contains(&b'i') || a[1..].contains(&b'J')))
        })
}

/// Hand the whole command line to the engine beside this binary.
fn engine(argv: &[OsString]) -> ExitCode {
    let path = match berth_client::engine_path() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("berth: error: {}", error_text(&e));
            return ExitCode::from(EXIT_BERTH_ERROR);
        }
    };
    let mut cmd = std::process::Command::new(&path);
    if let Some(zero) = argv.first() {
        cmd.arg0(zero);
    }
    let err = cmd.args(argv.iter().skip(1)).exec();
    eprintln!(
        "berth: error: cannot run {}: {err}. berth hands this command to {} beside it; \
         `cargo build --release` builds both (`cargo install --path .` installs both)",
        path.display(),
        berth_client::ENGINE
    );
    ExitCode::from(EXIT_BERTH_ERROR)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn line(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_served_line_goes_to_the_server_as_it_is() {
        assert!(served_line(&line(&["job", "ls", "--json"])));
        assert!(served_line(&line(&["events", "--limit", "5"])));
        // After `--` the words are the command's, not berth's options.
        assert!(served_line(&line(&[
            "job", "start", "--", "ssh", "--host", "x", "-i", "k"
        ])));
    }

    #[test]
    fn a_global_option_after_the_name_sends_the_line_to_the_engine() {
        for args in [
            &["job", "ls", "--state-dir", "/tmp/x"][..],
            &["job", "ls", "--state-dir=/tmp/x"],
            &["sandbox", "ls", "--host", "h"],
            &["sandbox", "create", "w", "-i", "key"],
            &["sandbox", "create", "w", "-Jbastion"],
            &["events", "--log", "debug"],
        ] {
            assert!(!served_line(&line(args)), "{args:?}");
        }
        // A longer flag that merely starts like a global one is not one.
        assert!(served_line(&line(&["job", "ls", "--hostile"])));
    }

    #[test]
    fn other_subcommands_are_the_engines() {
        for args in [
            &["shell"][..],
            &["mcp"],
            &["serve", "--idle", "5"],
            &["server", "status"],
            &["__sandbox-exec"],
        ] {
            assert!(!served_line(&line(args)), "{args:?}");
        }
    }

    #[test]
    fn the_thin_parser_reads_exec_as_the_engine_does() -> anyhow::Result<()> {
        let cli = Thin::try_parse_from([
            "berth",
            "--state-dir",
            "/s",
            "exec",
            "-s",
            "web",
            "--timeout",
            "5",
            "--json",
            "--",
            "echo",
            "hi",
        ])?;
        let ThinCommand::Exec(a) = cli.command else {
            anyhow::bail!("not parsed as exec: {:?}", cli.command);
        };
        assert_eq!(cli.globals.state_dir, Some(PathBuf::from("/s")));
        assert_eq!(
            (a.sandbox.as_str(), a.timeout, a.json),
            ("web", Some(5.0), true)
        );
        assert_eq!(a.command, ["echo", "hi"]);
        assert_eq!(a.backend, berth_client::DEFAULT_BACKEND);
        // Help and usage errors are not the thin parser's to print.
        assert!(Thin::try_parse_from(["berth", "exec", "--help"]).is_err());
        assert!(Thin::try_parse_from(["berth", "exec", "--timeout", "soon", "--", "x"]).is_err());
        Ok(())
    }
}
