//! The command line the thin client reads itself: the global options and
//! `berth exec`. The engine's full command line embeds these same types, so
//! both parse one syntax.

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

#[derive(Args, Debug, Serialize, Deserialize)]
#[command(
    after_help = "The command's output goes to stdout and berth exits with the command's exit code: \
124 after a timeout, 130 after Ctrl-C, 125 when berth itself fails, 126 when a policy refused it.\n\n\
Examples:\n  berth exec -- ls -la\n  berth exec -- 'cd /srv && export ENV=prod'\n  berth exec --timeout 5 -- sleep 60     # exits 124\n  echo hi | berth exec --stdin -- cat\n  berth exec --json -- make test | jq .exit_code"
)]
pub struct ExecArgs {
    /// Backend to run on.
    #[arg(long, short = 'b', default_value = crate::DEFAULT_BACKEND)]
    pub backend: String,
    /// Sandbox to run in; `default` is created on first use.
    #[arg(long, short = 's', default_value = crate::DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// The sandbox's session to run in: each named session is a shell of its own
    /// (cwd, environment, snapshot) beside the others, sharing the sandbox's files.
    #[arg(long, value_name = "NAME", default_value = crate::MAIN_SESSION)]
    pub session: String,
    /// Stop the command (and its process tree) after SECS seconds
    /// [default: the policy's `default_timeout_secs`, 600].
    #[arg(long, short = 't', value_name = "SECS", allow_negative_numbers = true)]
    pub timeout: Option<f64>,
    /// Print one JSON object instead of the raw output.
    #[arg(long)]
    pub json: bool,
    /// Feed berth's stdin to the command, up to 32 MiB (otherwise its stdin
    /// is /dev/null); `berth cp` moves larger files.
    #[arg(long, conflicts_with = "background")]
    pub stdin: bool,
    /// Run it as a background job with the session's cwd and environment, and
    /// print the job id (see `berth job --help`).
    #[arg(long)]
    pub background: bool,
    /// The command, run by bash in the session. Several words are joined with spaces.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The options every berth command line takes, before or after the
/// subcommand's name. The engine's parser, the thin client's and the
/// server's parser of served command lines all flatten this one type.
#[derive(Args, Debug)]
pub struct Globals {
    /// Where berth keeps its state (database, local sandboxes, spooled output).
    /// Defaults to $XDG_STATE_HOME/berth, i.e. ~/.local/state/berth.
    #[arg(long, global = true, env = "BERTH_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Log filter for berth's own diagnostics on stderr (e.g. `debug`, `berth_core=trace`).
    #[arg(
        long,
        global = true,
        env = "BERTH_LOG",
        default_value = "warn",
        value_name = "FILTER"
    )]
    pub log: String,

    #[command(flatten)]
    pub ssh: SshFlags,
}

/// The ssh backend's command-line flags, global so `berth exec --backend ssh
/// --host myalias -- uptime` reads like `ssh myalias uptime`.
#[derive(Args, Debug, Default, Clone, PartialEq)]
pub struct SshFlags {
    /// ssh backend: the host, an ~/.ssh/config alias or user@host[:port].
    #[arg(long, global = true, env = "BERTH_SSH_HOST", value_name = "HOST")]
    pub host: Option<String>,
    /// ssh backend: trust an unknown host key on first use and record it in
    /// known_hosts. A changed key is refused regardless.
    #[arg(long, global = true)]
    pub accept_new: bool,
    /// ssh backend: the ssh client config [default: ~/.ssh/config].
    #[arg(long, global = true, value_name = "FILE")]
    pub ssh_config: Option<PathBuf>,
    /// ssh backend: the known_hosts file [default: the config's
    /// UserKnownHostsFile, else ~/.ssh/known_hosts].
    #[arg(long, global = true, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// ssh backend: a private key to try first (repeatable). An encrypted key's
    /// passphrase comes from BERTH_SSH_PASSPHRASE, never from the command line.
    #[arg(long = "identity", short = 'i', global = true, value_name = "FILE")]
    pub identity: Vec<PathBuf>,
    /// ssh backend: jump hosts, `[user@]host[:port]` or aliases, comma-separated,
    /// outermost first (like `ssh -J`); overrides the config's ProxyJump, `none`
    /// disables it. Each hop's host key is checked like the target's.
    #[arg(long = "jump", short = 'J', global = true, value_name = "HOSTS")]
    pub jump: Option<String>,
    /// ssh backend: seconds allowed for TCP connect, handshake and authentication.
    #[arg(long, global = true, value_name = "SECS")]
    pub connect_timeout: Option<f64>,
}

impl SshFlags {
    /// Whether any flag is set, from the command line or `BERTH_SSH_HOST`.
    pub fn any(&self) -> bool {
        *self != SshFlags::default()
    }

    /// Whether this command line gives ssh flags of its own. A shared server
    /// cannot take those, so such a call runs in-process. `BERTH_SSH_HOST` is
    /// part of the environment a server is started with (its configuration
    /// key), so a host from there does not count.
    pub fn own(&self) -> bool {
        let mut own = self.clone();
        if own.host.is_some() && own.host == std::env::var("BERTH_SSH_HOST").ok() {
            own.host = None;
        }
        own.any()
    }
}

impl ExecArgs {
    /// The command as bash gets it: the words after `--`, joined with spaces.
    pub fn command_line(&self) -> anyhow::Result<String> {
        let command = self.command.join(" ");
        if command.trim().is_empty() {
            anyhow::bail!("empty command: put it after `--`, e.g. `berth exec -- ls -la`");
        }
        Ok(command)
    }

    /// berth's stdin for the command with `--stdin`, else none (/dev/null).
    pub fn read_stdin(&self) -> anyhow::Result<Option<Vec<u8>>> {
        if !self.stdin {
            return Ok(None);
        }
        read_limited(&mut std::io::stdin().lock(), MAX_STDIN).map(Some)
    }
}

/// The most `--stdin` carries to a command. The input travels whole in the
/// call (it is held in memory on both sides and crosses as one message), so
/// it has a bound, the same with or without a server, well inside the
/// largest message either framing takes.
pub const MAX_STDIN: usize = 32 << 20;

/// All of `r`, or an error saying what to do when it holds more than `max`
/// bytes (read no further than that).
fn read_limited(r: &mut impl std::io::Read, max: usize) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(r, max as u64 + 1), &mut buf)
        .map_err(|e| anyhow::anyhow!("cannot read berth's stdin for --stdin: {e}"))?;
    if buf.len() > max {
        anyhow::bail!(
            "--stdin carries at most {} MiB to a command, and more came; nothing ran. \
             Copy a larger input into the sandbox with `berth cp FILE :PATH` (streamed, of any size), \
             then run the command on the file",
            max >> 20
        );
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::read_limited;

    #[test]
    fn stdin_up_to_the_limit_is_read_and_past_it_is_refused_with_what_to_do() -> anyhow::Result<()>
    {
        assert_eq!(read_limited(&mut &b"four"[..], 4)?, b"four");
        let e = read_limited(&mut &b"fives"[..], 4)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("at most 0 MiB") && e.contains("berth cp"), "{e}");
        Ok(())
    }
}
