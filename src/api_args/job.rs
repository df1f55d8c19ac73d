//! `berth job …`: the arguments of the job subcommands.

use berth_core::backend::BackendKind;
use clap::{Args, Subcommand, ValueEnum};

use super::TermSize;
use berth_client::{DEFAULT_BACKEND, DEFAULT_SANDBOX, MAIN_SESSION};

#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Start a command detached inside the sandbox; prints the job id.
    Start(StartArgs),
    /// List jobs with their state, exit code, runtime and output size.
    Ls(LsArgs),
    /// Print a job's output (bounded memory, resumable by byte offset).
    Logs(LogsArgs),
    /// Wait for a job to end; exits with its exit code, or 124 if the wait timed out.
    Wait(WaitArgs),
    /// End a job's whole process group: the signal, then SIGKILL after a grace period.
    ///
    /// Exits 0 once the job is gone (killed now, or it had already ended: the
    /// message says which, and the job's own exit code); non-zero only when
    /// berth could not stop it.
    Kill(KillArgs),
    /// Write to a job's stdin: text, or keys by name (`--keys C-c Enter`).
    Send(SendArgs),
    /// Print a terminal job's screen as a terminal would show it now.
    Screen(ScreenArgs),
    /// Change a terminal job's size (its program gets SIGWINCH).
    Resize(ResizeArgs),
    /// Forget jobs that have ended, and their output in the sandbox; running
    /// jobs stay. Takes `job ls`'s filters.
    Prune(LsArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = "The job runs in its own session and process group inside the sandbox, with the \
sandbox session's cwd and exported environment. It does not depend on berth: it keeps running \
after berth exits, and `berth job ls` finds it again.\n\n\
With --pty the command runs on a terminal of its own (`script` from util-linux holds it in \
the sandbox): it sees a tty, `job screen` renders what the terminal shows, `job send --keys` \
types control keys, and `berth attach` connects your terminal to it.\n\n\
Examples:\n  berth job start --name build --watch 'error|FAILED' -- make -j2\n  berth job logs build --follow\n  \
berth job start --pty --name py -- python3 -i\n  berth job send py '6*7' --keys Enter\n  berth job screen py"
)]
pub struct StartArgs {
    /// Backend to run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Sandbox to run in.
    #[arg(long, short = 's', default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// The session to start it from: it inherits that session's cwd and environment.
    #[arg(long, value_name = "NAME", default_value = MAIN_SESSION)]
    pub session: String,
    /// A name to refer to the job by, besides its id.
    #[arg(long)]
    pub name: Option<String>,
    /// A regex; each new output line that matches is recorded as an event (repeatable).
    #[arg(long)]
    pub watch: Vec<String>,
    /// Run it on a terminal (a PTY) of its own.
    #[arg(long)]
    pub pty: bool,
    /// The terminal's size, COLSxROWS (with --pty; default 80x24).
    #[arg(long, value_name = "COLSxROWS", requires = "pty")]
    pub size: Option<TermSize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The command.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The screen is the job's output so far run through a VT100/xterm \
emulator at the terminal's size, resizes included: what a terminal attached all along shows. \
The text goes to stdout, blank rows at the bottom left out; the size and cursor to stderr."
)]
pub struct ScreenArgs {
    /// Job id or name.
    pub id: String,
    /// Print JSON: size, every row, the cursor, and whether a full-screen program is showing.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ResizeArgs {
    /// Job id or name.
    pub id: String,
    /// The new size, COLSxROWS, e.g. 120x40.
    #[arg(value_name = "COLSxROWS")]
    pub size: TermSize,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Only the jobs on this backend.
    #[arg(long, short = 'b', value_parser = crate::api_client::parse_backend)]
    pub backend: Option<BackendKind>,
    /// Only the jobs in this sandbox.
    #[arg(long, short = 's')]
    pub sandbox: Option<String>,
    /// Only the jobs in these states (repeatable, or comma-separated):
    /// starting, running, exited, killed, failed, lost; `done` names the
    /// four that have ended.
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    pub state: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Clone, Debug)]
#[command(
    after_help = "A follow carries on through a restart of the berth server: it reconnects and \
resumes at the offset it reached, printing nothing twice. Ctrl-C prints the offset to resume at \
with --offset."
)]
pub struct LogsArgs {
    /// Job id or name.
    pub id: String,
    /// The job's backend, as given to `job start` (a job's id names it alone;
    /// a job on another backend is an error).
    #[arg(long, short = 'b', value_parser = crate::api_client::parse_backend)]
    pub backend: Option<BackendKind>,
    /// Keep printing new output until the job ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Start at this byte offset (the offset berth printed last time resumes exactly).
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    /// Print only the last N lines (then, with --follow, what comes after them).
    #[arg(long, value_name = "LINES", conflicts_with = "offset")]
    pub tail: Option<u64>,
}

#[derive(Args, Clone, Debug)]
pub struct WaitArgs {
    /// Job id or name.
    pub id: String,
    /// Give up after SECS seconds (exit 124).
    #[arg(long, short = 't', value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SignalArg {
    Term,
    Kill,
    Int,
}

#[derive(Args, Debug)]
pub struct KillArgs {
    /// Job id or name.
    pub id: String,
    /// Signal to send to the job's process group (KILL: no grace).
    #[arg(long, value_enum, default_value = "term", ignore_case = true)]
    pub signal: SignalArg,
    /// Seconds to let the group outlive the signal before SIGKILL.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub grace: f64,
    /// Print JSON: the job as it ended, and `kill`: `signalled` (ended by
    /// this kill) or `already_ended`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SendArgs {
    /// Job id or name.
    pub id: String,
    /// Text to write (a newline is not added).
    pub data: Option<String>,
    /// Keys to press after the text, by name: Enter, Tab, Escape, BSpace, Up, Down, Left,
    /// Right, Home, End, PageUp, PageDown, Delete, F1..F12, C-x (control), M-x (meta).
    #[arg(long, num_args = 1.., value_name = "KEY")]
    pub keys: Vec<String>,
    /// Close the job's stdin after writing.
    #[arg(long)]
    pub eof: bool,
}
