//! The session engine over the docker backend, against the real engine: one
//! persistent bash over one attached exec.

#![cfg(feature = "docker")]

#[path = "common/docker.rs"]
mod common;

use std::time::Duration;

use berth_core::backend::SpawnOpts;
use berth_core::session::{CaptureLimits, ExecOpts, Session, SessionConfig};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cfg(name: &str) -> SessionConfig {
    let mut c = SessionConfig::named(name);
    c.grace = Duration::from_millis(300);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keeps_state_and_exact_exit_codes() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "state").await?;
    let mut s = Session::open(sb.clone(), cfg("state")).await?;
    let info = s.shell_info().cloned().ok_or("no shell")?;
    assert_eq!(
        info.pid, info.sid,
        "the shell must lead its own session (setsid)"
    );
    let r = s
        .exec(
            "cd /tmp && export A=1; f() { echo fn$1; }; alias hi='echo hi'",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(r.exit_code, 0);
    let r = s
        .exec("pwd; echo $A; f x; hi; whoami; exit 3", ExecOpts::default())
        .await?;
    assert_eq!(r.output.text(), "/tmp\n1\nfnx\nhi\nberth\n");
    assert_eq!(r.exit_code, 3);
    for code in [0, 1, 2, 42, 126, 127, 255] {
        let r = s
            .exec(&format!("(exit {code})"), ExecOpts::default())
            .await?;
        assert_eq!(r.exit_code, code);
    }
    let r = s.exec("no-such-command-xyz", ExecOpts::default()).await?;
    assert_eq!(r.exit_code, 127);
    // A new session on the same sandbox restores the snapshot from the volume.
    s.close().await;
    let mut s = Session::open(sb.clone(), cfg("state")).await?;
    let r = s.exec("pwd; echo $A; f y", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "/tmp\n1\nfny\n");
    s.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_tree_and_the_shell_lives_on() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "timeout").await?;
    let mut s = Session::open(sb.clone(), cfg("timeout")).await?;
    s.exec(
        "export KEEP=yes; sleep 300 & echo $! > /tmp/earlier",
        ExecOpts::default(),
    )
    .await?;
    let r = s
        .exec(
            "sleep 150 & (sleep 200 &); sleep 100 | cat; wait",
            ExecOpts {
                timeout: Some(Duration::from_millis(500)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    // No sleep of that command survives; the earlier job does, although it
    // may have started in the same 10 ms clock tick as the command; the shell's
    // state is intact (`wait` blocked on the earlier job, so the shell was
    // replaced and restored).
    let r = s
        .exec(
            "pgrep -x sleep -a | grep -c -E 'sleep (100|150|200)'; kill -0 $(cat /tmp/earlier) && echo earlier-alive; echo $KEEP",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(
        r.output.text(),
        "0\nearlier-alive\nyes\n",
        "{:?}",
        r.notices
    );
    s.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_bounded_binary_safe_and_unicode() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "output").await?;
    let mut s = Session::open(sb.clone(), cfg("output")).await?;
    // 50 MB through the exec stream: bounded capture, exact count.
    let r = s
        .exec(
            "head -c 52428800 /dev/zero | tr '\\0' x",
            ExecOpts {
                limits: CaptureLimits {
                    head: 4096,
                    tail: 4096,
                },
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.output.total_bytes, 52_428_800);
    assert_eq!(r.output.omitted_bytes, 52_428_800 - 8192);
    assert_eq!(r.output.head.len(), 4096);
    // Every byte value, in order.
    let r = s
        .exec(
            "python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256))*4)'",
            ExecOpts::default(),
        )
        .await?;
    let want: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
    assert_eq!(r.output.bytes(), want);
    // A fake end marker in the output cannot end the command.
    let r = s
        .exec(
            "printf '\\036deadbeef:0:/:deadbeef\\036'; echo after",
            ExecOpts::default(),
        )
        .await?;
    assert!(r.output.text().ends_with("after\n"), "{}", r.output.text());
    assert_eq!(r.exit_code, 0);
    // Unicode both ways.
    let r = s
        .exec("echo 'héllo wörld — 日本語 🚀'", ExecOpts::default())
        .await?;
    assert_eq!(r.output.text(), "héllo wörld — 日本語 🚀\n");
    // A 100 KB command text.
    let big = format!("X='{}'; echo ${{#X}}", "a".repeat(100 * 1024));
    let r = s.exec(&big, ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "102400\n");
    // stdin is given to the command when asked.
    let r = s
        .exec(
            "wc -c",
            ExecOpts {
                stdin: Some(b"12345".to_vec()),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(r.output.text().trim(), "5");
    s.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_streams_stdio_env_and_exit_code() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "spawn").await?;
    let argv: Vec<String> = [
        "bash",
        "-c",
        "cat; echo err >&2; echo \"$FOO:$PWD\"; exit 7",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut p = sb
        .spawn(
            &argv,
            SpawnOpts {
                env: vec![("FOO".into(), "bar baz".into())],
                cwd: Some("/tmp".into()),
                tty: false,
            },
        )
        .await?;
    let mut stdin = p.take_stdin().ok_or("no stdin")?;
    let mut stdout = p.take_stdout().ok_or("no stdout")?;
    let mut stderr = p.take_stderr().ok_or("no stderr")?;
    stdin.write_all(b"from-stdin\n").await?;
    stdin.shutdown().await?;
    let mut out = String::new();
    let mut err = String::new();
    stdout.read_to_string(&mut out).await?;
    stderr.read_to_string(&mut err).await?;
    assert_eq!(out, "from-stdin\nbar baz:/tmp\n");
    assert_eq!(err, "err\n");
    assert_eq!(p.wait().await?.code, Some(7));
    // berth's own environment does not leak in.
    let argv: Vec<String> = ["env"].iter().map(|s| s.to_string()).collect();
    let mut p = sb.spawn(&argv, SpawnOpts::default()).await?;
    let mut out = String::new();
    p.take_stdout()
        .ok_or("no stdout")?
        .read_to_string(&mut out)
        .await?;
    p.wait().await?;
    let mut names: Vec<&str> = out.lines().filter_map(|l| l.split('=').next()).collect();
    names.sort();
    assert_eq!(
        names,
        ["BERTH_SANDBOX", "HOME", "HOSTNAME", "LANG", "PATH"],
        "{out}"
    );
    // A missing working directory is a classified spawn error, not a hang.
    let r = sb
        .spawn(
            &argv,
            SpawnOpts {
                cwd: Some("/no/such/dir".into()),
                ..Default::default()
            },
        )
        .await;
    match r {
        Err(berth_core::Error::Spawn { kind, .. }) => {
            assert_eq!(kind, berth_core::error::SpawnFailure::BadCwd)
        }
        Err(e) => return Err(format!("wrong error for a bad cwd: {e}").into()),
        Ok(mut p) => {
            let st = p.wait().await?;
            return Err(format!("a bad cwd spawned a process ({st:?})").into());
        }
    }
    Ok(())
}
