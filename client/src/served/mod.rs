//! The served subcommands as one typed request: `job …`, `sandbox …`,
//! `events`, `approvals`, `approve`, `deny` and `exec --background`.
//!
//! The thin client parses such a command line itself, with these types, into
//! a [`Call`], and sends the call, not its text (`RunCall.call`, one serde
//! type on both sides); `berth serve` decodes it and runs it, and with
//! `BERTH_SERVER=off` the engine, whose command line flattens [`Served`],
//! runs the same value in-process. So a served call is parsed once, where it
//! was typed, and a usage error or `--help` never reaches a server: the thin
//! client hands such a line to the engine, which prints it as clap does.
//!
//! What a served subcommand prints still streams back as bytes for the
//! client's stdout and stderr (`RunEvent`), as it is printed. `job`,
//! `approvals`, `approve`, `deny` and `events` are parsed with these types
//! too, but are clients of the typed API (`berth.v1`) that the engine
//! makes: [`API_CLIENTS`].

pub mod approvals;
pub mod events;
pub mod job;
pub mod sandbox;

use std::ffi::OsString;

use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::args::{ExecArgs, Globals};

/// The served subcommands, as the engine's command line names them (it
/// flattens this enum into its own).
#[derive(Subcommand, Debug, Serialize, Deserialize)]
pub enum Served {
    /// Background jobs: start, list, follow logs, wait, kill, send input, screens.
    #[command(subcommand)]
    Job(job::JobCmd),
    /// Create, list and remove sandboxes.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCmd),
    /// Show the event log: every call with its exit code, duration and output size.
    Events(events::EventsArgs),
    /// List the commands waiting for a person's approval.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCmd),
    /// Approve a waiting command (`--always`: and allow it from now on).
    Approve(approvals::AnswerArgs),
    /// Deny a waiting command.
    Deny(approvals::AnswerArgs),
}

/// One served call: what `RunCall.call` carries.
#[derive(Debug, Serialize, Deserialize)]
pub enum Call {
    Sub(Served),
    /// `exec --background`: a job with the session's cwd and environment.
    Background(ExecArgs),
}

impl Call {
    /// The call as `RunCall.call` carries it.
    pub fn encode(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(self)
    }

    /// A call from `RunCall.call`; an error names what is malformed.
    pub fn decode(bytes: &[u8]) -> serde_json::Result<Call> {
        serde_json::from_slice(bytes)
    }
}

/// A command line that names a served call: the global options (the
/// client's to apply: they choose the server, or keep the call in-process)
/// and the call.
#[derive(Parser, Debug)]
#[command(name = "berth")]
struct Line {
    #[command(flatten)]
    globals: Globals,
    #[command(subcommand)]
    command: LineCommand,
}

#[derive(Subcommand, Debug)]
enum LineCommand {
    Exec(ExecArgs),
    #[command(flatten)]
    Served(Served),
}

/// Parse a whole command line (the program's name first) that names a served
/// call. `None`: it names another command, or `exec` without `--background`.
/// A usage error or `--help` is clap's error, for the engine to print.
pub fn parse(argv: &[OsString]) -> Result<Option<(Globals, Call)>, clap::Error> {
    let line = Line::try_parse_from(argv)?;
    let call = match line.command {
        LineCommand::Served(s) => Call::Sub(s),
        LineCommand::Exec(a) if a.background => Call::Background(a),
        LineCommand::Exec(_) => return Ok(None),
    };
    Ok(Some((line.globals, call)))
}

/// The subcommands of [`Served`] that are clients of the typed API
/// (`berth.v1`), which the engine makes: the thin client hands them on.
pub const API_CLIENTS: &[&str] = &["approvals", "approve", "deny", "events", "job"];

/// Whether a command line's subcommand (its first argument that is not a
/// global option or an option's value) is one of the served ones: the thin
/// client parses such a line with [`parse`], and skips that for every other.
pub fn names_served(rest: &[OsString]) -> bool {
    const SERVED: &[&str] = &["sandbox"];
    rest.first()
        .and_then(|n| n.to_str())
        .is_some_and(|n| SERVED.contains(&n))
}

/// A terminal's size on the command line, `COLSxROWS` (both 1–65535): the
/// engine hands it on as `berth_core::backend::TermSize`, which this crate
/// does not link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermSize {
    pub cols: u16,
    pub rows: u16,
}

impl std::str::FromStr for TermSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let cells = |t: &str| t.trim().parse::<u16>().ok().filter(|n| *n > 0);
        s.split_once(['x', 'X'])
            .and_then(|(c, r)| {
                Some(TermSize {
                    cols: cells(c)?,
                    rows: cells(r)?,
                })
            })
            .ok_or_else(|| {
                format!("{s:?} is not COLSxROWS with both between 1 and 65535, e.g. 120x40")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Vec<OsString> {
        std::iter::once("berth")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn call(args: &[&str]) -> Result<Call, String> {
        match parse(&line(args)) {
            Ok(Some((_, c))) => Ok(c),
            Ok(None) => Err("not a served call".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn served_lines_parse_with_their_global_options_anywhere() -> Result<(), String> {
        let (g, c) = parse(&line(&["job", "ls", "--state-dir", "/s", "--json"]))
            .map_err(|e| e.to_string())?
            .ok_or("not served")?;
        assert_eq!(g.state_dir.as_deref(), Some(std::path::Path::new("/s")));
        assert!(
            matches!(c, Call::Sub(Served::Job(job::JobCmd::Ls(ref a))) if a.json),
            "{c:?}"
        );
        let c = call(&["exec", "--background", "--", "sleep", "1"])?;
        assert!(
            matches!(c, Call::Background(ref a) if a.command == ["sleep", "1"]),
            "{c:?}"
        );
        let c = call(&["approve", "7", "--always"])?;
        assert!(
            matches!(c, Call::Sub(Served::Approve(ref a)) if a.id == 7 && a.always),
            "{c:?}"
        );
        Ok(())
    }

    #[test]
    fn a_line_that_is_not_a_served_call_is_told_apart() {
        assert!(matches!(parse(&line(&["exec", "--", "true"])), Ok(None)));
        for args in [
            &["shell"][..],
            &["job", "--help"],
            &["job", "frobnicate"],
            &["approve", "x"],
        ] {
            assert!(parse(&line(args)).is_err(), "{args:?}");
        }
        assert!(names_served(&line(&["sandbox", "ls"])[1..]));
        assert!(!names_served(&line(&["job", "ls"])[1..]));
        assert!(!names_served(&line(&["run", "task"])[1..]));
    }

    /// Every call survives its encoding whole, arguments that need quoting
    /// in a shell included; bytes that are not a call are an error that
    /// says what is wrong.
    #[test]
    fn a_call_crosses_the_wire_unchanged() -> Result<(), String> {
        for args in [
            &[
                "job",
                "start",
                "--pty",
                "--size",
                "120x40",
                "--name",
                "py",
                "--",
                "python3",
                "-c",
                "print('a b')",
            ][..],
            &[
                "job", "kill", "build", "--signal", "INT", "--grace", "0.5", "--json",
            ],
            &["sandbox", "gc", "--older-than", "2h", "--workspaces"],
            &[
                "sandbox",
                "create",
                "web",
                "-e",
                "A=1 2",
                "-o",
                "host=me@h:22",
                "--cpus",
                "0.5",
            ],
            &["sandbox", "clone", "a", "b", "--at", "c1", "--to", "docker"],
            &["events", "-n", "3", "--kind", "job", "--follow"],
            &["deny", "4", "--json"],
            &[
                "exec",
                "--background",
                "-s",
                "x",
                "--session",
                "s2",
                "--",
                "echo \"$HOME\"",
            ],
        ] {
            let c = call(args)?;
            let bytes = c.encode().map_err(|e| e.to_string())?;
            let back = Call::decode(&bytes).map_err(|e| e.to_string())?;
            assert_eq!(format!("{back:?}"), format!("{c:?}"), "{args:?}");
        }
        let e = Call::decode(br#"{"Sub":{"Job":{"Frobnicate":{}}}}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("Frobnicate"), "{e}");
        Ok(())
    }

    /// The names [`names_served`] knows are the subcommands [`Served`] has:
    /// one added to the enum and not to the list would still work, but
    /// through the engine, a process and a parse more.
    #[test]
    fn the_served_names_are_the_enums_subcommands() {
        use clap::Subcommand;
        let enum_names: Vec<String> = Served::augment_subcommands(clap::Command::new("berth"))
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        assert!(!enum_names.is_empty());
        for name in &enum_names {
            let api = API_CLIENTS.contains(&name.as_str());
            assert_eq!(
                names_served(&[OsString::from(name)]),
                !api,
                "{name}: served as a subcommand or a client of the typed API, one of the two"
            );
        }
        for name in API_CLIENTS {
            assert!(enum_names.iter().any(|n| n == name), "{name}");
        }
        for name in ["exec", "shell", "run", "mcp", "serve"] {
            assert!(!names_served(&[OsString::from(name)]), "{name}");
        }
    }

    #[test]
    fn a_terminal_size_is_cols_by_rows() {
        assert_eq!(
            "120x40".parse(),
            Ok(TermSize {
                cols: 120,
                rows: 40
            })
        );
        assert_eq!(" 80 X 24 ".parse(), Ok(TermSize { cols: 80, rows: 24 }));
        for bad in ["0x10", "10x", "x", "100000x2", "abc"] {
            let e = bad.parse::<TermSize>().err().unwrap_or_default();
            assert!(e.contains("COLSxROWS"), "{bad}: {e}");
        }
    }
}
