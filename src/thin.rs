//! `berth`: the command people and scripts run. A thin client: it makes the
//! call people and agents make most, `exec`, to `berth serve` itself, and
//! hands every other command line to `berth-engine` beside it, unchanged
//! (one exec: same pid, same stdio, same signals). `job`, `sandbox`,
//! `events` and the approvals are clients of the typed API (`berth.v1`),
//! which the engine speaks.
//!
//! Why two binaries: a served call's cost is mostly process start-up, and a
//! position-independent binary's start-up grows with its size (the dynamic
//! loader relocates, and so dirties, every page of pointers in it). The engine
//! links the backends, the store and the TLS stack; this links the protocol,
//! clap and tokio. docs/PERFORMANCE.md has the figures.
//!
//! Anything this parser does not take as its own (help, a usage error, ssh
//! flags of the call's own, `BERTH_SERVER=off`) goes to the engine, whose
//! parser is the full one: both parse `exec` and the global options with the
//! same types ([`berth_client::args`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use berth_client::args::{ExecArgs, Globals};
use berth_client::client::{self, Quick};
use berth_client::{EXIT_BERTH_ERROR, Mode, error_text};
use clap::{Parser, Subcommand};

// A served call's cost is mostly this process's start. build.rs links this
// binary alone as a static PIE where it can, and with DT_RELR. Where it
// links dynamically (no static libc here), loading a shared library is part
// of the start: libgcc_s's constructor alone asks the CPU what it is
// (`cpuid`, which a hypervisor traps) for about 0.1 ms per start on a VM. So
// the unwinder is linked in from libgcc_eh, and `--as-needed` leaves
// libgcc_s out, where build.rs finds libgcc_eh. Only this binary: the
// engine links it as usual.
#[cfg(thin_gcc_eh)]
#[link(name = "gcc_eh", kind = "static", modifiers = "-bundle")]
unsafe extern "C" {}

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
    /// Any other line: the engine parses it (clap fills this in; it is not
    /// read here).
    #[command(external_subcommand)]
    Other(#[allow(dead_code)] Vec<OsString>),
}

/// std's entry: SIGPIPE ignored (a closed pipe is an EPIPE, reported), closed
/// descriptors 0-2 reopened on `/dev/null` (the socket never takes one), and
/// the arguments read by std itself on every libc. Its own entry saved this
/// client about 0.1 ms a start and relied on glibc filling in `args_os`
/// from `.init_array` (under musl it got no arguments); see
/// docs/PERFORMANCE.md.
fn main() -> std::process::ExitCode {
    berth_client::quiet_on_closed_stdout();
    let code = thin();
    let _ = std::io::Write::flush(&mut std::io::stdout());
    code.into()
}

fn thin() -> u8 {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // `berth exec ...`, the served call people make most: connect first, so
    // the server readies itself while this process parses the line.
    let early = argv
        .get(1)
        .filter(|a| *a == "exec")
        .and_then(|_| berth_client::quick::Early::connect());
    let Ok(cli) = Thin::try_parse_from(&argv) else {
        return engine(&argv);
    };
    // An `exec` of its own; `exec --background` starts a job through the
    // typed API, which the engine speaks.
    let (globals, a) = match cli.command {
        ThinCommand::Exec(a) if !a.background => (cli.globals, a),
        ThinCommand::Exec(_) | ThinCommand::Other(_) => return engine(&argv),
    };
    if globals.ssh.own() {
        return engine(&argv);
    }
    berth_client::diag::init(&globals.log);
    let mode = match Mode::from_env() {
        Ok(Mode::Off) | Err(_) => return engine(&argv),
        Ok(m) => m,
    };
    let dir = match berth_client::state_dir(globals.state_dir) {
        Ok(d) => d,
        Err(_) => return engine(&argv),
    };
    // `exec` first tries the quick framing, which needs no async runtime:
    // most calls end here.
    let (call, json) = match client::exec_quick(&dir, &a, early) {
        Ok(Quick::Done(code)) => return code,
        Ok(Quick::Grpc(c)) => (c, a.json),
        Err(e) => {
            eprintln!("berth: error: {}", error_text(&e));
            return EXIT_BERTH_ERROR;
        }
    };
    let rt = match berth_client::cli_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: error: cannot start the async runtime: {e}");
            return EXIT_BERTH_ERROR;
        }
    };
    let result = rt.block_on(client::exec_grpc(dir, mode, call, json));
    rt.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("berth: error: {}", error_text(&e));
            EXIT_BERTH_ERROR
        }
    }
}

/// Hand the whole command line to the engine beside this binary.
fn engine(argv: &[OsString]) -> u8 {
    let path = match berth_client::engine_path() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("berth: error: {}", error_text(&e));
            return EXIT_BERTH_ERROR;
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
    EXIT_BERTH_ERROR
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn line(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn every_other_line_is_the_engines() -> anyhow::Result<()> {
        for args in [
            &["berth", "shell"][..],
            &["berth", "job", "ls"],
            &["berth", "sandbox", "ls", "--json"],
            &["berth", "approve", "3"],
        ] {
            let cli = Thin::try_parse_from(line(args))?;
            assert!(
                matches!(cli.command, ThinCommand::Other(_)),
                "{args:?}: {:?}",
                cli.command
            );
        }
        Ok(())
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
