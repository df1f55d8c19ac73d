//! What a finished `berth exec` prints and exits with, the same whether the
//! call ran in the server or in-process.

use std::io::Write;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::proto::{Report, exec_event};

/// The report as `berth exec --json` prints it. With stderr kept apart (as
/// `--json` asks), `stdout` and `stderr` are each stream, `bytes`,
/// `truncated` and `omitted_bytes` are stdout's, `stderr_*` stderr's, and
/// `output` is all of it, stdout first (how the two interleaved is not
/// kept). Otherwise `output` is both as written, and `stdout`/`stderr` are
/// null.
pub fn json(r: &Report) -> Value {
    let output = match &r.stderr {
        Some(e) => format!("{}{e}", r.output),
        None => r.output.clone(),
    };
    let apart = r.stderr.is_some();
    json!({
        "exit_code": r.exit_code,
        "output": output,
        "stdout": apart.then_some(&r.output),
        "stderr": r.stderr,
        "truncated": r.truncated,
        "bytes": r.bytes,
        "omitted_bytes": r.omitted_bytes,
        "stderr_truncated": r.stderr_truncated,
        "stderr_bytes": r.stderr_bytes,
        "stderr_omitted_bytes": r.stderr_omitted_bytes,
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

/// Exit code when the server was lost mid-command.
pub const EXIT_LOST: u8 = 125;

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
        eprintln!("berth: the sandbox was brought back: {why}");
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
            "berth: command timed out after {}s; it and the processes of its tree were stopped (exit 124). Raise --timeout if it needs longer.",
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

/// Where an `exec` stands after one of its events.
pub enum Step {
    /// The call has this id (name it to interrupt it).
    Started(String),
    /// More to come.
    Next,
    /// The command ended; exit with this.
    Done(u8),
}

/// Print one event of an `exec` as the CLI shows it (`json`: `--json`), over
/// either framing. A failure of berth's own is the error.
pub fn on_exec_event(event: Option<exec_event::Event>, json: bool) -> Result<Step> {
    match event {
        Some(exec_event::Event::Started(id)) => return Ok(Step::Started(id)),
        Some(exec_event::Event::Output(b)) if !json => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&b);
            let _ = out.flush();
        }
        Some(exec_event::Event::Stderr(b)) if !json => {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(&b);
            let _ = err.flush();
        }
        Some(exec_event::Event::Notice(n)) => {
            let n = n.strip_prefix("berth: ").unwrap_or(&n);
            eprintln!("berth: {n}");
        }
        Some(exec_event::Event::Report(r)) => {
            if json {
                println!("{}", self::json(&r));
            } else {
                print_notices(&r);
            }
            return Ok(Step::Done(exit_byte(r.exit_code)));
        }
        Some(exec_event::Event::Failure(f)) => {
            if json {
                print_json(&if f.denied {
                    serde_json::json!({ "error": f.message, "denied": true })
                } else {
                    serde_json::json!({ "error": f.message })
                });
            }
            if f.denied {
                if !json {
                    eprintln!("berth: {}", f.message);
                }
                return Ok(Step::Done(EXIT_DENIED));
            }
            bail!("{}", f.message);
        }
        // Output under --json: the report carries it.
        Some(exec_event::Event::Output(_) | exec_event::Event::Stderr(_)) | None => {}
    }
    Ok(Step::Next)
}

/// Report a command whose server died under it: never a success.
pub fn lost(pid: u32, json: bool, why: &str) -> u8 {
    let msg = format!(
        "lost the berth server (pid {pid}) while the command ran ({why}); its outcome is unknown: it may have run in part or in full. \
The next call starts a new server, which restores the session from its last snapshot (plain variables and the shell's background children are gone)"
    );
    if json {
        print_json(&serde_json::json!({ "error": msg, "lost": true }));
    }
    eprintln!("berth: error: {msg}");
    EXIT_LOST
}

/// One value as one line of JSON on stdout.
pub fn print_json(v: &serde_json::Value) {
    println!("{v}");
}
