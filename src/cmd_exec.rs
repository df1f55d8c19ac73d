//! `berth exec`: one command in a sandbox's persistent session.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use berth_core::runtime::{DEFAULT_SANDBOX, ExecReport, ExecRequest, MAIN_SESSION};
use berth_core::session::Tee;
use clap::Args;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context::{self, DEFAULT_BACKEND};

/// Exit code when a policy refused the command.
pub const EXIT_DENIED: u8 = 126;

/// Default timeout: generous, but a hung command does not hang berth forever.
const DEFAULT_TIMEOUT_SECS: f64 = 600.0;

#[derive(Args, Debug)]
#[command(
    after_help = "The command's output goes to stdout and berth exits with the command's exit code: \
124 after a timeout, 130 after Ctrl-C, 125 when berth itself fails, 126 when a policy refused it.\n\n\
Examples:\n  berth exec -- ls -la\n  berth exec -- 'cd /srv && export ENV=prod'\n  berth exec --timeout 5 -- sleep 60     # exits 124\n  echo hi | berth exec --stdin -- cat\n  berth exec --json -- make test | jq .exit_code"
)]
pub struct ExecArgs {
    /// Backend to run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// Sandbox to run in; `default` is created on first use.
    #[arg(long, short = 's', default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// The sandbox's session to run in: each named session is a shell of its own
    /// (cwd, environment, snapshot) beside the others, sharing the sandbox's files.
    #[arg(long, value_name = "NAME", default_value = MAIN_SESSION)]
    pub session: String,
    /// Stop the command (and every process it started) after SECS seconds
    /// [default: the policy's `default_timeout_secs`, 600].
    #[arg(long, short = 't', value_name = "SECS", allow_negative_numbers = true)]
    pub timeout: Option<f64>,
    /// Print one JSON object instead of the raw output.
    #[arg(long)]
    pub json: bool,
    /// Feed berth's stdin to the command (otherwise its stdin is /dev/null).
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

/// `exec --background` on `rt` (in-process, or in the server for a client):
/// start the command as a job and print its id.
pub async fn background_on(rt: &berth_core::runtime::Runtime, a: ExecArgs) -> Result<u8> {
    let command = a.command.join(" ");
    if command.trim().is_empty() {
        bail!("empty command: put it after `--`, e.g. `berth exec -- ls -la`");
    }
    berth_core::runtime::check_session_name(&a.session)?;
    let opts = berth_core::jobs::JobOptions {
        session: Some(a.session.clone()),
        ..Default::default()
    };
    let job = rt
        .start_job_with(&a.backend, &a.sandbox, &command, opts)
        .await?;
    if a.json {
        context::print_json(&json!({ "job": job.id, "state": job.state.as_str(), "pid": job.pid }));
    } else {
        crate::io::outln!("{}", job.id);
    }
    Ok(0)
}

/// Check a timeout given in seconds.
pub fn timeout_from_secs(secs: f64) -> Result<Duration> {
    if !secs.is_finite() || secs <= 0.0 {
        bail!("--timeout must be a positive number of seconds, got {secs}; e.g. --timeout 30");
    }
    Ok(Duration::from_secs_f64(secs))
}

pub async fn run(state_dir: Option<PathBuf>, a: ExecArgs) -> Result<u8> {
    let command = a.command.join(" ");
    if command.trim().is_empty() {
        bail!("empty command: put it after `--`, e.g. `berth exec -- ls -la`");
    }
    let timeout = a.timeout.map(timeout_from_secs).transpose()?;
    berth_core::runtime::check_session_name(&a.session)?;
    if a.background {
        let rt = context::runtime(state_dir)?;
        let r = background_on(&rt, a).await;
        rt.shutdown().await;
        return r;
    }
    let stdin = if a.stdin {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
        Some(buf)
    } else {
        None
    };
    let rt = context::runtime(state_dir)?;
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    let tee: Option<Tee> = if a.json {
        None
    } else {
        Some(Arc::new(|b: &[u8]| {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(b);
            let _ = out.flush();
        }))
    };
    let req = ExecRequest {
        backend: a.backend.clone(),
        sandbox: a.sandbox.clone(),
        command,
        timeout,
        stdin,
        cancel: Some(cancel),
        tee,
        session: Some(a.session.clone()),
        ..Default::default()
    };
    let timeout = effective_timeout(timeout, rt.gate(), &a.sandbox);
    let outcome = rt.exec(req).await;
    rt.shutdown().await;
    let report = match outcome {
        Ok(r) => r,
        Err(e @ berth_core::Error::Denied { .. }) => {
            if a.json {
                context::print_json(&json!({ "error": e.to_string(), "denied": true }));
            } else {
                eprintln!("berth: {e}");
            }
            return Ok(EXIT_DENIED);
        }
        Err(e) if a.json => {
            context::print_json(&json!({ "error": e.to_string() }));
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if a.json {
        context::print_json(&report_json(&report, &a.backend, &a.sandbox));
    } else {
        print_notices(&report, timeout);
    }
    Ok(exit_byte(report.result.exit_code))
}

/// The timeout that applies: the caller's, else the policy's default.
pub fn effective_timeout(
    asked: Option<Duration>,
    gate: Option<&Arc<berth_core::gate::Gate>>,
    sandbox: &str,
) -> Duration {
    match (asked, gate) {
        (Some(t), _) => t,
        (None, Some(g)) => Duration::from_secs(g.limits(sandbox).default_timeout_secs),
        (None, None) => Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS),
    }
}

/// The JSON shape of an exec result.
pub fn report_json(r: &ExecReport, backend: &str, sandbox: &str) -> serde_json::Value {
    let res = &r.result;
    json!({
        "exit_code": res.exit_code,
        "output": res.output.text(),
        "truncated": res.output.truncated(),
        "bytes": res.output.total_bytes,
        "omitted_bytes": res.output.omitted_bytes,
        "duration_ms": res.duration.as_millis() as u64,
        "cwd": res.cwd,
        "timed_out": res.timed_out,
        "interrupted": res.interrupted,
        "notices": res.notices,
        "restored_from": res.restored_from,
        "recreated": r.recreated,
        "call_id": r.call_id,
        "spool": res.output.spool,
        "spool_omitted_bytes": res.output.spool_omitted,
        "backend": backend,
        "sandbox": sandbox,
    })
}

fn print_notices(r: &ExecReport, timeout: Duration) {
    print_notice_lines(
        r.recreated.as_deref(),
        &r.result.notices,
        r.result.timed_out,
        r.result.interrupted,
        timeout,
    );
}

/// The lines on stderr after a command: recreation, notices, timeout, interrupt.
pub fn print_notice_lines(
    recreated: Option<&str>,
    notices: &[String],
    timed_out: bool,
    interrupted: bool,
    timeout: Duration,
) {
    if let Some(why) = recreated {
        eprintln!("berth: the sandbox was recreated: {why}");
    }
    for n in notices {
        eprintln!("berth: {n}");
    }
    if timed_out {
        eprintln!(
            "berth: command timed out after {}s; it and every process it started were stopped (exit 124). Raise --timeout if it needs longer.",
            timeout.as_secs_f64()
        );
    }
    if interrupted {
        eprintln!(
            "berth: interrupted; the command's processes were stopped, the session is intact"
        );
    }
}

/// A process exit status byte for a shell exit code.
pub fn exit_byte(code: i32) -> u8 {
    if (0..=255).contains(&code) {
        code as u8
    } else {
        // Unknown (-1): the shell died without a code.
        crate::EXIT_BERTH_ERROR
    }
}
