//! `berth`: run an AI agent's commands in persistent sandbox sessions.
//!
//! The binary is thin: it parses the command line, opens the store and the
//! runtime, and prints what core returns, as text for people or `--json` for scripts.

mod api_args;
mod api_client;
mod bench;
mod bench_checkpoint;
mod bench_cli;
mod bench_create;
mod bench_egress;
mod bench_jobs;
mod cmd_approvals;
mod cmd_attach;
mod cmd_checkpoint;
mod cmd_events;
mod cmd_exec;
mod cmd_image;
mod cmd_inspect;
mod cmd_job;
mod cmd_mcp;
mod cmd_memory;
mod cmd_policy;
mod cmd_pool;
mod cmd_run;
mod cmd_sandbox;
mod cmd_schedule;
mod cmd_server;
mod cmd_ui;
mod config;
mod context;
mod cp;
mod io;
mod shell;
mod ssh_flags;
mod terminal;

// The server, the dashboard and the schedules live in crates of their own.
use berth_schedules as schedules;
use berth_server as server;
use berth_server::exec_report;
use berth_ui as ui;

use std::process::ExitCode;

use crate::api_args::Served;
use clap::{Parser, Subcommand};

/// Exit code for berth's own failures (as opposed to the command's).
pub const EXIT_BERTH_ERROR: u8 = berth_client::EXIT_BERTH_ERROR;

#[derive(Parser, Debug)]
#[command(
    name = "berth",
    version,
    about = "Run an AI agent's commands in persistent sandbox sessions (local, docker, ssh)",
    long_about = "berth runs commands in sandboxes through one persistent shell per sandbox: \
cwd, exported variables, functions and aliases survive from one command to the next, and \
across restarts of berth itself (the shell snapshots its state inside the sandbox).\n\n\
Examples:\n  berth exec -- uname -a\n  berth exec -- 'cd /tmp && export A=1'\n  berth exec -- 'pwd; echo $A'      # prints /tmp and 1\n  berth sandbox create web --backend local\n  berth exec --sandbox web --timeout 5 --json -- make test\n  berth events --limit 5",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    globals: berth_client::args::Globals,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a command in a sandbox's persistent session.
    Exec(cmd_exec::ExecArgs),
    /// An interactive prompt over a sandbox's persistent session.
    Shell(shell::ShellArgs),
    // Jobs, sandboxes, events and approvals: clients of the typed API
    // (berth.v1), answered by the server when one serves.
    #[command(flatten)]
    Served(Served),
    /// Copy files and directory trees into or out of a sandbox, streamed, of any size.
    Cp(cp::CpArgs),
    /// Connect your terminal to a terminal job (`job start --pty`) until Ctrl-].
    Attach(cmd_attach::AttachArgs),
    /// Serve berth's tools (terminal, process, the file tools, memory) over MCP on stdio.
    Mcp(cmd_mcp::McpArgs),
    /// Measure a persistent session against spawning a process per command.
    Bench(bench::BenchArgs),
    /// Check commands against the policy, and show the policy.
    #[command(subcommand)]
    Policy(cmd_policy::PolicyCmd),
    /// The docker sandbox image.
    #[command(subcommand)]
    Image(cmd_image::ImageCmd),
    /// Run an agent on a task: a model's tool calls through berth, journaled and resumable.
    Run(Box<cmd_run::RunArgs>),
    /// The journal of agent runs: list them, show one step by step.
    #[command(subcommand)]
    Runs(cmd_run::RunsCmd),
    /// Notes that new agent runs start with: list, add, remove.
    #[command(subcommand)]
    Memory(cmd_memory::MemoryCmd),
    /// Hold berth's runtime (warm shells, connections, approvals) for CLI calls, in the foreground.
    Serve(cmd_server::ServeArgs),
    /// The background server: `status`, `stop`.
    #[command(subcommand)]
    Server(cmd_server::ServerCmd),
    /// Agent runs the server starts on a cron expression: add, ls, rm,
    /// pause, resume, run-now.
    #[command(subcommand)]
    Schedule(cmd_schedule::ScheduleCmd),
    /// A web dashboard of sandboxes, jobs, runs and events, with approvals
    /// to answer: served by the berth server; prints its URL.
    Ui(cmd_ui::UiArgs),
}

fn main() -> ExitCode {
    // The local exec wrapper runs before anything else exists in the process.
    if let Some(code) = berth_sandbox::dispatch() {
        return code;
    }
    berth_client::quiet_on_closed_stdout();
    let cli = Cli::parse();
    init_logging(&cli.globals.log);
    let rt = match &cli.command {
        Command::Serve(_) => berth_client::server_runtime(),
        _ => berth_client::cli_runtime(),
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_BERTH_ERROR);
        }
    };
    let berth_client::args::Globals { state_dir, ssh, .. } = cli.globals;
    if ssh.any()
        && let Err(e) = ssh_flags::options(&ssh).map(context::set_ssh_options)
    {
        eprintln!("berth: error: {}", error_text(&e));
        return ExitCode::from(EXIT_BERTH_ERROR);
    }
    // ssh flags on the command line are this call's own: a shared server
    // cannot take them, so such a call runs in-process.
    let ssh_flags = ssh.own();
    let result = rt.block_on(async move {
        match cli.command {
            // Clients of the typed API: through the server, or on the same
            // service in-process.
            Command::Served(c) => {
                let dir = context::state_dir(state_dir)?;
                let mode = server_mode(ssh_flags)?;
                match c {
                    c @ (Served::Approvals(_) | Served::Approve(_) | Served::Deny(_)) => {
                        cmd_approvals::run(&dir, mode, c).await
                    }
                    Served::Events(a) => cmd_events::run(&dir, mode, a).await,
                    Served::Job(c) => cmd_job::run(&dir, mode, c).await,
                    Served::Sandbox(c) => cmd_sandbox::run(&dir, mode, c).await,
                    Served::Pool(c) => cmd_pool::run(&dir, mode, c).await,
                }
            }
            Command::Exec(a) if a.background => {
                let dir = context::state_dir(state_dir)?;
                cmd_exec::background(&dir, server_mode(ssh_flags)?, a).await
            }
            Command::Exec(a) => match server_mode(ssh_flags) {
                Ok(server::Mode::Off) => cmd_exec::run(state_dir, a).await,
                Ok(mode) => match context::state_dir(state_dir) {
                    Ok(dir) => server::client::exec(dir, mode, a).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Command::Shell(a) => shell::run(state_dir, a).await,
            Command::Attach(a) => cmd_attach::run(state_dir, a).await,
            Command::Cp(a) => cp::run(state_dir, a).await,
            Command::Bench(a) if a.cli => bench_cli::run(state_dir, &a).await,
            Command::Bench(a) if a.checkpoint => bench_checkpoint::run(state_dir, a).await,
            Command::Bench(a) if a.egress => bench_egress::run(a).await,
            Command::Bench(a) if a.create => bench_create::run(state_dir, a).await,
            Command::Bench(a) => bench::run(state_dir, a).await,
            Command::Policy(c) => cmd_policy::run(c),
            Command::Image(c) => cmd_image::run(c).await,
            Command::Mcp(a) => cmd_mcp::run(state_dir, a).await,
            Command::Run(a) => cmd_run::run(state_dir, *a).await,
            Command::Runs(c) => cmd_run::runs(state_dir, c).await,
            Command::Memory(c) => cmd_memory::run(state_dir, c),
            Command::Serve(a) => cmd_server::serve(state_dir, a).await,
            Command::Server(c) => cmd_server::run(state_dir, c).await,
            Command::Schedule(c) => cmd_schedule::run(state_dir, c),
            Command::Ui(a) => cmd_ui::run(state_dir, a).await,
        }
    });
    // Don't wait for detached readers of dead processes.
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("berth: error: {}", error_text(&e));
            ExitCode::from(EXIT_BERTH_ERROR)
        }
    }
}

pub(crate) use berth_client::error_text;

/// Whether this call goes through the server: `BERTH_SERVER`, except for a
/// call with ssh flags of its own, which runs in-process.
fn server_mode(ssh_flags: bool) -> anyhow::Result<server::Mode> {
    if ssh_flags {
        return Ok(server::Mode::Off);
    }
    server::Mode::from_env()
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
