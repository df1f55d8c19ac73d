//! What an exec call needs on both of its paths, in the server and
//! in-process (`BERTH_SERVER=off`): the timeout that applies, the report as
//! the one typed message both print from, and the words for a person when a
//! command waits for approval. Below both `cmd_exec` and the server, so
//! neither imports the other.

use std::sync::Arc;
use std::time::Duration;

use berth_client::proto::Report;
use berth_core::runtime::ExecReport;

/// Default timeout: generous, but a hung command does not hang berth forever.
const DEFAULT_TIMEOUT_SECS: f64 = 600.0;

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

/// A finished command as the report message (`berth_client::report::json`
/// prints it for `--json`, `print_notices` for people).
pub fn to_proto(
    r: &ExecReport,
    backend: berth_core::backend::BackendKind,
    sandbox: &str,
    timeout: Duration,
) -> Report {
    let res = &r.result;
    Report {
        exit_code: res.exit_code,
        timeout_secs: timeout.as_secs_f64(),
        output: res.output.text(),
        truncated: res.output.truncated(),
        bytes: res.output.total_bytes,
        omitted_bytes: res.output.omitted_bytes,
        duration_ms: res.duration.as_millis() as u64,
        cwd: res.cwd.clone(),
        timed_out: res.timed_out,
        interrupted: res.interrupted,
        notices: res.notices.clone(),
        restored_from: res.restored_from,
        recreated: r.recreated.clone(),
        call_id: r.call_id.clone(),
        spool: res.output.spool.as_ref().map(|p| p.display().to_string()),
        spool_omitted_bytes: res.output.spool_omitted,
        backend: backend.as_str().into(),
        sandbox: sandbox.into(),
        stderr: res.stderr.as_ref().map(|e| e.text()),
        stderr_truncated: res.stderr.as_ref().is_some_and(|e| e.truncated()),
        stderr_bytes: res.stderr.as_ref().map_or(0, |e| e.total_bytes),
        stderr_omitted_bytes: res.stderr.as_ref().map_or(0, |e| e.omitted_bytes),
    }
}

/// What a person is told when a command waits for their approval.
pub fn approval_notice_text(ap: &berth_core::approvals::Approval) -> String {
    approval_notice_words(ap.id, &ap.part, &ap.reason)
}

/// The same words, for approval `id` whose `part` asked because of `reason`.
pub fn approval_notice_words(id: i64, part: &str, reason: &str) -> String {
    format!(
        "berth: waiting for approval #{id}: `{part}` needs a person's yes ({reason}).\n\
         berth: answer from another terminal: `berth approve {id}` (add --always to allow it from now on) or `berth deny {id}`",
        part = berth_policies::shell::printable(part),
        reason = berth_policies::shell::printable(reason)
    )
}
