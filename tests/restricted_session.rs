//! The persistent session engine over the local backend with every process
//! run through `berth __sandbox-exec`: state persists, timeouts kill the tree,
//! a new session restores from the snapshot, and the restrictions hold.
//! Kernel-dependent like `sandbox_escape.rs`: on a kernel that cannot enforce
//! the profile the wrapper refuses and this test fails with its message.
#![allow(clippy::expect_used, clippy::unwrap_used)] // in tests a panic is the failure report

use std::time::Duration;

use berth_backends::local::{LocalBackend, WRAPPER_SANDBOX, WRAPPER_SANDBOX_DIR};
use berth_core::backend::{Backend, SandboxSpec};
use berth_core::session::{ExecOpts, Session, SessionConfig};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

fn wrapped(state: &std::path::Path) -> LocalBackend {
    let wrapper = [
        BERTH,
        "__sandbox-exec",
        "--policy",
        r#"{"rlimits":{"pids":256}}"#,
        "--sandbox-dir",
        WRAPPER_SANDBOX_DIR,
        "--name",
        WRAPPER_SANDBOX,
        "--",
    ];
    LocalBackend::new(state).with_wrapper(wrapper.iter().map(|s| s.to_string()).collect())
}

/// Processes still running this test's marker sleep.
fn sleepers() -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .map(|c| c == b"sleep\x00101.17\x00")
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_restricted_session_keeps_its_state_and_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("rs{}", std::process::id());
    let _guard = CgroupGuard(
        dir.path().join("sandboxes").join("local").join(&name),
        name.clone(),
    );
    let backend = wrapped(dir.path());
    let sb = backend
        .provision(&SandboxSpec::named(&name))
        .await
        .unwrap()
        .sandbox;
    let mut s = Session::open(sb.clone(), SessionConfig::named("t"))
        .await
        .unwrap();
    let r = s
        .exec(
            "mkdir -p sub && cd sub && export A=1; echo hi > f",
            ExecOpts::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.output.text());
    let r = s
        .exec("pwd; echo $A; cat f", ExecOpts::default())
        .await
        .unwrap();
    assert!(
        r.output.text().ends_with("/work/sub\n1\nhi\n"),
        "{}",
        r.output.text()
    );
    let r = s
        .exec(
            &format!("echo x > /tmp/berth-session-escape-{name}; echo rc=$?"),
            ExecOpts::default(),
        )
        .await
        .unwrap();
    assert!(
        r.output.text().contains("Permission denied"),
        "{}",
        r.output.text()
    );
    assert!(!std::path::Path::new(&format!("/tmp/berth-session-escape-{name}")).exists());
    let r = s
        .exec(
            "sleep 101.17 | sleep 101.17",
            ExecOpts {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.timed_out);
    // The whole tree dies, though the killer is a separate confined spawn.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sleepers() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the timed-out command's tree survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = s.exec("echo still $A", ExecOpts::default()).await.unwrap();
    assert_eq!(r.output.text(), "still 1\n");
    drop(s);
    // A new session (as after a berth restart) restores cwd and env, still confined.
    let mut s = Session::open(sb.clone(), SessionConfig::named("t"))
        .await
        .unwrap();
    let r = s
        .exec(
            "pwd; echo $A; grep -c . /proc/self/status >/dev/null; grep Seccomp: /proc/self/status",
            ExecOpts::default(),
        )
        .await
        .unwrap();
    let out = r.output.text();
    assert!(out.contains("/work/sub\n1\n"), "{out} {:?}", r.notices);
    assert!(out.contains("Seccomp:\t2"), "{out}");
}

/// Removes the sandbox (and so its pids cgroup) even when the test fails.
struct CgroupGuard(std::path::PathBuf, String);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Some(cg) = berth_backends::local_cgroup::dir_for(&self.1, &self.0) {
            let _ = berth_backends::local_cgroup::remove(&cg);
        }
    }
}

#[tokio::test]
async fn a_refusing_wrapper_is_reported_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    // Stands in for a kernel without Landlock: the wrapper refuses, as
    // `berth __sandbox-exec` does, with exit 125 and a reason on stderr.
    let wrapper = vec![
        "bash".to_string(),
        "-c".into(),
        "echo 'berth: refusing to run: Landlock is not available' >&2; exit 125".into(),
        "wrapper".into(),
    ];
    let backend = LocalBackend::new(dir.path()).with_wrapper(wrapper);
    let sb = backend
        .provision(&SandboxSpec::named("r"))
        .await
        .unwrap()
        .sandbox;
    let err = match Session::open(sb, SessionConfig::named("t")).await {
        Ok(mut s) => s.exec("echo hi", ExecOpts::default()).await.err(),
        Err(e) => Some(e),
    };
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        msg.contains("Landlock is not available"),
        "the refusal was not reported: {msg:?}"
    );
}
