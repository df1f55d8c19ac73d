//! The Python SDK (`sdk/python`) over berth's typed API (`berth.v1`): its
//! pytest suite against a real `berth serve`, on the local and docker
//! backends. It fails, naming what to install, without python3, grpcio,
//! grpcio-tools or pytest (scripts/test installs them).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::support::{TestResult, text};

#[test]
fn the_python_sdks_suite_passes_against_a_real_server() -> TestResult {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let sdk = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk/python");
    let o = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests"])
        .current_dir(&sdk)
        .env("BERTH_BIN", env!("CARGO_BIN_EXE_berth"))
        .env_remove("BERTH_STATE_DIR")
        .env_remove("BERTH_POLICY")
        .env_remove("BERTH_SERVER")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!("cannot run {python}: {e}; scripts/test installs python3, grpcio, grpcio-tools and pytest")
        })?;
    let out = text(&o);
    assert!(
        o.status.success(),
        "the SDK's pytest suite failed (pip install grpcio grpcio-tools pytest, if it could not start):\n{out}"
    );
    // Every case ran, on both backends: none skipped, none left out.
    for case in [
        "test_exec_keeps_the_sessions_state[local]",
        "test_exec_keeps_the_sessions_state[docker]",
        "test_a_jobs_logs_are_followed_to_the_end[docker]",
        "test_a_file_makes_the_round_trip[docker]",
        "test_a_checkpoint_is_restored[docker]",
        "test_an_ask_is_answered_through_the_sdk[local]",
        "test_an_ask_is_answered_through_the_sdk[docker]",
        "test_the_event_log_is_queried_and_followed",
        "test_a_terminal_job_is_typed_into_read_and_killed",
    ] {
        assert!(
            out.contains(&format!("PASSED tests/test_sdk.py::{case}")),
            "{case} did not pass:\n{out}"
        );
    }
    assert!(!out.contains("SKIPPED"), "{out}");
    Ok(())
}
