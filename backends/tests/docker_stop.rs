//! Stopping a command on the docker backend leaves nothing of it, or of a
//! shell it replaced, in the container (#49 items 19 and 20).

#![cfg(feature = "docker")]

#[path = "common/docker.rs"]
mod common;

use std::time::Duration;

use berth_core::backend::Sandbox;
use berth_core::session::{ExecOpts, Session, SessionConfig};
use common::*;

fn cfg(name: &str) -> SessionConfig {
    let mut c = SessionConfig::named(name);
    c.grace = Duration::from_millis(300);
    c
}

/// The command lines of every process in the container, seen by a helper
/// of its own (`ps` would count itself).
async fn processes(sb: &dyn Sandbox) -> TestResult<Vec<String>> {
    let argv: Vec<String> = [
        "sh",
        "-c",
        "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c =
        berth_core::backend::run_to_end(sb, &argv, None, 1 << 20, Duration::from_secs(20)).await?;
    Ok(String::from_utf8_lossy(&c.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

fn timeout(ms: u64) -> ExecOpts {
    ExecOpts {
        timeout: Some(Duration::from_millis(ms)),
        ..Default::default()
    }
}

/// A timeout that replaces the shell (a command that ignores the signal
/// that abandons it) leaves no process of the old shell in the container
/// (#49 item 20, where the red team saw the old `setsid -w bash` pair
/// stay). Control: the new shell is there, and works. This passed on the
/// code before this change too: the leftover did not show here, so the test
/// guards the behaviour without proving a fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_shell_leaves_nothing_behind() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "replace").await?;
    let mut s = Session::open(sb.clone(), cfg("replace")).await?;
    let before = processes(&*sb).await?;
    let shells = |ps: &[String]| {
        ps.iter()
            .filter(|l| l.contains("bash --noprofile --norc"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(!shells(&before).is_empty(), "no shell found: {before:#?}");
    for cmd in ["trap '' USR1; while :; do :; done", "sleep 7779 & wait"] {
        let r = s.exec(cmd, timeout(300)).await?;
        assert!(r.timed_out, "{cmd}");
        assert_eq!(
            s.exec("echo alive", ExecOpts::default())
                .await?
                .output
                .text(),
            "alive\n",
            "{cmd}"
        );
    }
    let after = processes(&*sb).await?;
    assert_eq!(
        shells(&after).len(),
        shells(&before).len(),
        "a replaced shell stayed:\nbefore {before:#?}\nafter {after:#?}"
    );
    s.close().await;
    Ok(())
}

/// Whether a process whose command line starts with `prefix` runs in the
/// container.
async fn running(sb: &dyn Sandbox, prefix: &str) -> TestResult<bool> {
    Ok(processes(sb).await?.iter().any(|l| l.starts_with(prefix)))
}

/// #49 item 19 on docker: `(setsid sleep 7777 &)` leaves a process in a
/// session of its own whose parent exits at once, so it is neither in the
/// shell's session nor below the shell; a timeout must stop it all the
/// same. An orphan an earlier command left the same way (`sleep 8888`) is
/// not this command's, and is spared. Failed before the shell ran under a
/// `tini -s` of its own: the orphan went to the container's PID 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_a_command_detached_with_setsid_is_stopped_on_timeout() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "detach").await?;
    let mut s = Session::open(sb.clone(), cfg("detach")).await?;
    let r = s.exec("(setsid sleep 8888 &)", ExecOpts::default()).await?;
    assert_eq!(r.exit_code, 0, "{}", r.output.text());
    assert!(running(&*sb, "sleep 8888").await?, "the control never ran");
    let r = s
        .exec("(setsid sleep 7777 &); sleep 60", timeout(1500))
        .await?;
    assert!(r.timed_out, "{}", r.output.text());
    // The stop has signalled it; its end is the kernel's, and tini reaps it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while running(&*sb, "sleep 7777").await? {
        assert!(
            std::time::Instant::now() < deadline,
            "the detached process outlived the timeout: {:#?}",
            processes(&*sb).await?
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        running(&*sb, "sleep 8888").await?,
        "an earlier command's orphan was killed with this one"
    );
    assert_eq!(
        s.exec("echo alive", ExecOpts::default())
            .await?
            .output
            .text(),
        "alive\n"
    );
    s.close().await;
    Ok(())
}
