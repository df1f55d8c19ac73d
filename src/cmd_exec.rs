//! `berth exec`: one command in a sandbox's persistent session.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use berth_core::runtime::{ExecReport, ExecRequest};
use berth_core::session::Tee;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context;

pub use berth_client::report::{EXIT_DENIED, exit_byte, print_notice_lines, timeout_from_secs};

/// Default timeout: generous, but a hung command does not hang berth forever.
const DEFAULT_TIMEOUT_SECS: f64 = 600.0;

pub use berth_client::args::ExecArgs;

/// `exec --background` on `rt` (in-process, or in the server for a client):
/// start the command as a job and print its id.
pub async fn background_on(rt: &berth_core::runtime::Runtime, a: ExecArgs) -> Result<u8> {
    let command = a.command_line()?;
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

pub async fn run(state_dir: Option<PathBuf>, a: ExecArgs) -> Result<u8> {
    let command = a.command_line()?;
    let timeout = a.timeout.map(timeout_from_secs).transpose()?;
    berth_core::runtime::check_session_name(&a.session)?;
    // `--background` is a served subcommand: main runs it with `background_on`.
    debug_assert!(!a.background);
    let stdin = a.read_stdin()?;
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

#[cfg(test)]
mod tests {
    /// The thin client's defaults (it links no core code) are core's.
    #[test]
    fn the_clients_defaults_are_the_runtimes() {
        assert_eq!(
            berth_client::DEFAULT_SANDBOX,
            berth_core::runtime::DEFAULT_SANDBOX
        );
        assert_eq!(
            berth_client::MAIN_SESSION,
            berth_core::runtime::MAIN_SESSION
        );
    }
}
