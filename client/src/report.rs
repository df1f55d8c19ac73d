//! What a finished `berth exec` prints and exits with, the same whether the
//! call ran in the server or in-process.

use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::proto::Report;

/// The report as `berth exec --json` prints it.
pub fn json(r: &Report) -> Value {
    json!({
        "exit_code": r.exit_code,
        "output": r.output,
        "truncated": r.truncated,
        "bytes": r.bytes,
        "omitted_bytes": r.omitted_bytes,
        "duration_ms": r.duration_ms,
        "cwd": r.cwd,
        "timed_out": r.timed_out,
        "interrupted": r.interrupted,
        "notices": r.notices,
        "restored_from": r.restored_from,
        "recreated": r.recreated,
        "call_id": r.call_id,
        "spool": r.spool,
        "spool_omitted_bytes": r.spool_omitted_bytes,
        "backend": r.backend,
        "sandbox": r.sandbox,
    })
}

/// The lines on stderr after a reported command.
pub fn print_notices(r: &Report) {
    print_notice_lines(
        r.recreated.as_deref(),
        &r.notices,
        r.timed_out,
        r.interrupted,
        Duration::from_secs_f64(r.timeout_secs.max(0.0)),
    );
}

/// Exit code when a policy refused the command.
pub const EXIT_DENIED: u8 = 126;

/// Check a timeout given in seconds.
pub fn timeout_from_secs(secs: f64) -> Result<Duration> {
    if !secs.is_finite() || secs <= 0.0 {
        bail!("--timeout must be a positive number of seconds, got {secs}; e.g. --timeout 30");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// See `berth_core::session::SURVIVED`.
pub const SURVIVED: &str = "still run after KILL";

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
    // Claim the stop only when berth saw it through (the engine's notice
    // carries `berth_core::session::SURVIVED`; the two are checked equal in
    // tests/conformance.rs).
    let survivors = notices.iter().any(|n| n.contains(SURVIVED));
    if timed_out && survivors {
        eprintln!(
            "berth: command timed out after {}s (exit 124); see above for what is still running.",
            timeout.as_secs_f64()
        );
    } else if timed_out {
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
