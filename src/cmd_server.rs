//! `berth serve` and `berth server status|stop`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::context;
use crate::server::{self, client};

/// Exit code of `berth server status` when no server runs.
const EXIT_NOT_RUNNING: u8 = 3;

#[derive(Args, Debug)]
#[command(
    after_help = "The server holds berth's runtime for one user and state dir: warm shells, backend \
connections, the policy gate and approvals. CLI calls reach it over <state dir>/server.sock (mode \
0600; other uids are refused). With BERTH_SERVER=auto (the default) the CLI starts it on demand; \
BERTH_SERVER=off runs every command in-process."
)]
pub struct ServeArgs {
    /// Exit after SECS seconds with no call running; 0: never (a systemd
    /// unit) [default: BERTH_SERVER_IDLE, else 300].
    #[arg(long, value_name = "SECS")]
    pub idle: Option<u64>,
    /// Report this version in the handshake (tests of a version mismatch).
    #[arg(long, hide = true)]
    pub pretend_version: Option<String>,
    /// Answer as a server from before the quick framing: `exec` over gRPC
    /// only (tests of the client's fallback).
    #[arg(long, hide = true)]
    pub no_quick: bool,
}

#[derive(Subcommand, Debug)]
pub enum ServerCmd {
    /// Is a server running for this state dir? Exits 3 when none is.
    Status(JsonArg),
    /// Start a server for this state dir unless one runs (a program that
    /// speaks the typed API, such as the Python SDK, then connects to the
    /// socket it names), and say how it stands, as `status` does.
    Start(JsonArg),
    /// Stop the server: its running commands are interrupted, its shells closed.
    Stop(JsonArg),
}

#[derive(Args, Debug)]
pub struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn serve(state_dir: Option<PathBuf>, a: ServeArgs) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    server::daemon::check_socket_path(&dir)?;
    let idle = match a.idle {
        Some(s) => s,
        None => server::idle_from_env()?,
    };
    // 0: never idle out (run unattended, stopped by SIGTERM).
    let idle = if idle == 0 { u64::MAX } else { idle };
    let rt = context::runtime(Some(dir.clone()))?;
    let version = a
        .pretend_version
        .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string());
    let opts = server::daemon::Options {
        idle: Duration::from_secs(idle),
        version,
        quick: !a.no_quick,
    };
    // On a worker of the runtime, not on the thread that blocks on it: a
    // connection's task is then spawned onto the worker that accepted it and
    // runs there next, with no other thread woken to take it.
    tokio::spawn(server::daemon::serve(dir, rt, opts))
        .await
        .map_err(|e| anyhow::anyhow!("the server's accept loop failed: {e}"))?
}

pub async fn run(state_dir: Option<PathBuf>, cmd: ServerCmd) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    match cmd {
        ServerCmd::Start(a) => {
            if matches!(server::Mode::from_env()?, server::Mode::Off) {
                anyhow::bail!(
                    "BERTH_SERVER=off: berth runs every command in-process here, so it starts no server; unset BERTH_SERVER to start one"
                );
            }
            client::connect(&dir, server::Mode::Auto).await?;
            Box::pin(run(Some(dir), ServerCmd::Status(a))).await
        }
        ServerCmd::Status(a) => match client::running(&dir).await? {
            None => {
                let waits = waiting(&dir);
                if a.json {
                    context::print_json(&json!({
                        "running": false, "state_dir": dir, "waits": waits,
                        "schedules": scheduled(&dir),
                    }));
                } else {
                    println!("no berth server runs for {}", dir.display());
                    print_waits(&waits, false);
                    print_schedules(&scheduled(&dir));
                }
                Ok(EXIT_NOT_RUNNING)
            }
            Some(s) => {
                let h = &s.hello;
                if a.json {
                    context::print_json(&json!({
                        "running": true, "pid": h.pid, "version": h.version,
                        "protocol": h.protocol, "uptime_ms": h.uptime_ms,
                        "active_calls": h.active_calls, "sessions": h.sessions,
                        "idle_secs": h.idle_secs, "state_dir": h.state_dir,
                        "watched_jobs": h.watched_jobs,
                        "quick_calls": h.quick_calls, "api_calls": h.api_calls,
                        "socket": server::socket_path(&dir),
                        "waits": waiting(&dir),
                        "schedules": scheduled(&dir),
                    }));
                } else {
                    println!(
                        "berth server pid {} (version {}), up {}s, {} call(s) running, {} open session(s), {} job(s) watched, {}\nsocket: {}",
                        h.pid,
                        h.version,
                        h.uptime_ms / 1000,
                        h.active_calls,
                        h.sessions,
                        h.watched_jobs,
                        if h.idle_secs == u64::MAX {
                            "never exits when idle".to_string()
                        } else {
                            format!("exits after {}s idle", h.idle_secs)
                        },
                        server::socket_path(&dir).display()
                    );
                    print_waits(&waiting(&dir), true);
                    print_schedules(&scheduled(&dir));
                }
                Ok(0)
            }
        },
        ServerCmd::Stop(a) => {
            let Some(mut s) = client::running(&dir).await? else {
                if a.json {
                    context::print_json(&json!({ "stopped": false, "running": false }));
                } else {
                    println!("no berth server runs for {}", dir.display());
                }
                return Ok(0);
            };
            let pid = s.shutdown(true).await?;
            let gone = wait_gone(pid, Duration::from_secs(20)).await;
            if a.json {
                context::print_json(&json!({ "stopped": gone, "pid": pid }));
            } else if gone {
                println!("stopped the berth server (pid {pid})");
            } else {
                eprintln!(
                    "berth: the server (pid {pid}) gave up its socket but is still finishing; it exits once its commands end"
                );
            }
            Ok(0)
        }
    }
}

/// Wait for process `pid` to exit.
async fn wait_gone(pid: u32, deadline: Duration) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        if !alive {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// The runs that wait for an event (`wait_for`, `berth run --on`), from the store.
fn waiting(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let Ok(store) = berth_core::store::Store::open(dir) else {
        return Vec::new();
    };
    berth_agent::waits::open(&store)
        .unwrap_or_default()
        .into_iter()
        .map(|w| {
            json!({
                "run": w.run_id, "job": w.job, "pattern": w.pattern, "approval": w.approval,
                "deadline_ms": w.deadline_ms, "since_ms": w.created_ms,
                "fired": w.outcome.is_some(),
            })
        })
        .collect()
}

fn print_waits(waits: &[serde_json::Value], running: bool) {
    if waits.is_empty() {
        return;
    }
    println!("{} run(s) waiting:", waits.len());
    for w in waits {
        let mut on = Vec::new();
        if let Some(j) = w["job"].as_str() {
            on.push(match w["pattern"].as_str() {
                Some(p) => format!("job {j} to end or match `{p}`"),
                None => format!("job {j} to end"),
            });
        }
        if let Some(a) = w["approval"].as_i64() {
            on.push(format!("approval #{a}"));
        }
        if let Some(d) = w["deadline_ms"].as_i64() {
            let left = (d - berth_core::store::now_ms()).max(0) / 1000;
            on.push(format!("at most {left} s more"));
        }
        println!("  {}  {}", w["run"].as_str().unwrap_or("?"), on.join(", "));
    }
    if !running {
        println!("start a server to carry them on: berth serve (or any berth command)");
    }
}

/// The schedules the server starts runs for (`berth schedule`).
fn scheduled(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let Ok(store) = berth_core::store::Store::open(dir) else {
        return Vec::new();
    };
    crate::schedules::list(&store)
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            json!({ "name": s.name, "cron": s.cron, "tz": s.tz, "paused": s.paused, "next_ms": s.next_ms })
        })
        .collect()
}

fn print_schedules(list: &[serde_json::Value]) {
    if list.is_empty() {
        return;
    }
    println!("{} schedule(s) (`berth schedule ls`):", list.len());
    for s in list {
        let next = s["next_ms"]
            .as_i64()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_else(|| "-".into());
        println!(
            "  {:<16} {:<18} next {next}{}",
            s["name"].as_str().unwrap_or("?"),
            s["cron"].as_str().unwrap_or("?"),
            if s["paused"] == true { " (paused)" } else { "" }
        );
    }
}
