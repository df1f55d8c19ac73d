//! The docker backend's processes and its session shell, against the real
//! engine: one persistent bash over one attached exec.

#![cfg(feature = "docker")]

#[path = "common/docker.rs"]
mod common;

use std::time::Duration;

use berth_core::backend::SpawnOpts;
use berth_core::session::{ExecOpts, Session, SessionConfig};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cfg(name: &str) -> SessionConfig {
    let mut c = SessionConfig::named(name);
    c.grace = Duration::from_millis(300);
    c
}

// Session behaviour (state, exit codes, timeouts, output) is the conformance
// suite's, which runs on docker too (`tests/all.rs`); this file keeps what is
// docker's own.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_runs_as_the_unprivileged_sandbox_user() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "user").await?;
    let mut s = Session::open(sb.clone(), cfg("user")).await?;
    let r = s.exec("whoami; id -u", ExecOpts::default()).await?;
    assert_eq!(r.exit_code, 0);
    let text = r.output.text();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("berth"));
    assert_ne!(lines.next(), Some("0"), "{text}");
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
                ..Default::default()
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

/// berth's seccomp profile: no socket family outside the allow-list (AF_VSOCK
/// reaches the host's hypervisor sockets), no namespaces, no setuid bits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seccomp_profile_holds_in_the_container() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "seccomp").await?;
    let script = r#"
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
sc = libc.syscall
sc.restype = ctypes.c_long
res = []
for name, fam in [("unix", 1), ("inet", 2), ("netlink", 16), ("vsock", 40), ("alg", 38)]:
    try:
        socket.socket(fam, socket.SOCK_DGRAM, 0).close()
        res.append(name + ":open")
    except OSError as e:
        res.append("%s:%d" % (name, e.errno))
r = sc(56, 0x10000000 | 17, 0, 0, 0, 0)
if r == 0:
    os._exit(0)
res.append("userns:%d" % (ctypes.get_errno() if r < 0 else 0))
r = sc(435, 0, 0)
res.append("clone3:%d" % (ctypes.get_errno() if r < 0 else 0))
open("f", "w").close()
r = sc(452, -100, b"f", 0o4755, 0)
res.append("fchmodat2:%d" % (ctypes.get_errno() if r < 0 else 0))
print(" ".join(res))
"#;
    let argv: Vec<String> = ["bash", "-c", "cd /tmp && python3 -c \"$0\"", script]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let c =
        berth_core::backend::run_to_end(sb.as_ref(), &argv, None, 4096, Duration::from_secs(30))
            .await?;
    let out = String::from_utf8_lossy(&c.stdout);
    assert_eq!(
        out.trim(),
        "unix:open inet:1 netlink:1 vsock:1 alg:1 userns:1 clone3:38 fchmodat2:1",
        "stderr: {}",
        String::from_utf8_lossy(&c.stderr)
    );
    Ok(())
}
