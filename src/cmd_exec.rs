//! `berth exec`: one command in a sandbox's persistent session.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use berth_core::runtime::ExecRequest;
use berth_core::session::Tee;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{context, exec_report};

pub use berth_client::report::{EXIT_DENIED, exit_byte, timeout_from_secs};

pub use berth_client::args::ExecArgs;

/// `exec --background`: start the command as a job with the session's cwd
/// and environment, and print its id. A client of the typed API
/// (`Jobs.Start`), through the server or with `BERTH_SERVER=off` on the
/// same service in this process; a start that waits for an approval says
/// so, as `job start` does.
pub async fn background(dir: &Path, mode: crate::server::Mode, a: ExecArgs) -> Result<u8> {
    use crate::api_client::{self, Api};
    use berth_service::proto;
    let command = a.command_line()?;
    berth_core::runtime::check_session_name(&a.session)?;
    let backend = api_client::backend_kind(&a.backend)?;
    let api = Api::open(dir, mode).await?;
    let started = match &api {
        Api::Served(ch) => crate::cmd_job::served_start(
            ch,
            backend,
            &a.sandbox,
            proto::StartJob {
                sandbox: Some(api_client::sandbox_ref(backend, &a.sandbox)?),
                command,
                session: a.session.clone(),
                ..Default::default()
            },
        )
        .await
        .map(berth_service::convert::job_row),
        Api::Here(svc) => {
            let opts = berth_core::jobs::JobOptions {
                session: Some(a.session.clone()),
                ..Default::default()
            };
            svc.start_job(backend, &a.sandbox, &command, opts)
                .await
                .map_err(Into::into)
        }
    };
    api.close().await;
    let job = started?;
    if a.json {
        context::print_json(&json!({ "job": job.id, "state": job.state.as_str(), "pid": job.pid }));
    } else {
        println!("{}", job.id);
    }
    Ok(0)
}

pub async fn run(state_dir: Option<PathBuf>, a: ExecArgs) -> Result<u8> {
    let command = a.command_line()?;
    let timeout = a.timeout.map(timeout_from_secs).transpose()?;
    berth_core::runtime::check_session_name(&a.session)?;
    let backend = crate::api_client::backend_kind(&a.backend)?;
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
    let stderr_tee: Option<Tee> = if a.json {
        None
    } else {
        Some(Arc::new(|b: &[u8]| {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(b);
            let _ = err.flush();
        }))
    };
    let req = ExecRequest {
        backend,
        sandbox: a.sandbox.clone(),
        command,
        timeout,
        stdin,
        cancel: Some(cancel),
        tee,
        session: Some(a.session.clone()),
        split_stderr: true,
        stderr_tee,
        ..Default::default()
    };
    let timeout = exec_report::effective_timeout(timeout, rt.gate(), &a.sandbox);
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
            context::print_json(&json!({ "error": e.full_text() }));
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    let report = exec_report::to_proto(&report, backend, &a.sandbox, timeout);
    if a.json {
        context::print_json(&berth_client::report::json(&report));
    } else {
        berth_client::report::print_notices(&report);
    }
    Ok(exit_byte(report.exit_code))
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
