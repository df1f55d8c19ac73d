//! The official Modal Python SDK (`modal` from PyPI), unchanged, against the
//! Modal stand-in: it must look up an app, create a sandbox from an image, exec
//! a command, read its output and exit code, and terminate the sandbox. Where
//! the SDK and berth's client disagree about the protocol, the SDK is right,
//! so this keeps the stand-in honest. `scripts/test` installs the SDK.

use std::time::Duration;

use berth_standins::modal::ModalStandin;

use crate::support::TestResult;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/standins/sdk/modal_sdk_flow.py"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_runs_a_sandbox_on_the_standin() -> TestResult {
    let s = ModalStandin::start(0).await?;
    let home = tempfile::tempdir()?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(SCRIPT)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // No ~/.modal.toml of the machine's user may interfere.
        .env("HOME", home.path())
        .envs(s.env())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .map_err(|_| "the SDK flow did not finish within 120s")?
        .map_err(|e| {
            format!(
                "cannot run {python}: {e}; scripts/test installs python3 and the `modal` package"
            )
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK flow failed ({}); if `modal` is missing, `pip install modal` (scripts/test does):\n{stderr}",
        out.status
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("the SDK flow printed no JSON ({e}): {line}\n{stderr}"))?;
    assert_eq!(v["stdout"], "hello from the sdk\n", "{v}");
    assert_eq!(v["stderr"], "to-stderr\n", "{v}");
    assert_eq!(v["exit_code"], 7, "{v}");
    assert_eq!(v["returncode"], 7, "{v}");
    assert!(
        v["sandbox_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("sb-")),
        "{v}"
    );
    // The SDK really made its calls here, and the sandbox is gone.
    let calls = &s.state().calls;
    for rpc in ["AppGetOrCreate", "ImageGetOrCreate"] {
        assert!(calls.count(rpc) >= 1, "the SDK never called {rpc}");
    }
    // The SDK creates V2 sandboxes by default; V1 is the same flow under older names.
    for rpc in ["SandboxCreate", "SandboxTerminate"] {
        let v2 = format!("{rpc}V2");
        assert!(
            calls.count(rpc) + calls.count(&v2) >= 1,
            "the SDK never called {rpc} or {v2}"
        );
    }
    assert!(calls.count("TaskExecStart") >= 1 && calls.count("TaskExecWait") >= 1);
    assert!(s.running().is_empty(), "the SDK's sandbox was terminated");
    Ok(())
}
