//! Processes on a terminal (`SpawnOpts::tty`), the same assertions on every
//! backend: local (openpty), docker (exec with Tty), ssh (pty-req), e2b
//! (envd's `pty`), modal (`pty_info`; resized by `stty` from a helper exec).

use std::time::{Duration, Instant};

use berth_core::backend::{BoxRead, Process, SpawnOpts, TermSize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{BoxError, Harness, TestResult};

/// Expand the terminal cases for one backend.
#[macro_export]
macro_rules! terminal_suite {
    ($name:ident, $harness:path) => {
        mod $name {
            use $crate::support::TestResult;
            use $crate::terminal as t;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_terminal_process_sees_a_tty_of_its_size_and_follows_a_resize() -> TestResult
            {
                let h = $harness().await?;
                t::a_terminal_process_sees_a_tty_of_its_size_and_follows_a_resize(&h).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ctrl_c_typed_into_the_terminal_interrupts_its_program() -> TestResult {
                let h = $harness().await?;
                t::ctrl_c_typed_into_the_terminal_interrupts_its_program(&h).await
            }
        }
    };
}

const DEADLINE: Duration = Duration::from_secs(60);

/// Read from `out` into `seen` until it contains `needle`.
async fn read_until(out: &mut BoxRead, seen: &mut String, needle: &str) -> TestResult {
    let start = Instant::now();
    let mut buf = vec![0u8; 4096];
    while !seen.contains(needle) {
        let left = DEADLINE.saturating_sub(start.elapsed());
        let n = match tokio::time::timeout(left, out.read(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(
                    format!("the terminal never showed {needle:?}; it showed {seen:?}").into(),
                );
            }
        };
        if n == 0 {
            return Err(
                format!("the terminal closed before {needle:?}; it showed {seen:?}").into(),
            );
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok(())
}

async fn spawn_tty(h: &Harness, test: &str, script: &str) -> Result<Spawned, BoxError> {
    let f = h.sandbox(test).await?;
    let opts = SpawnOpts {
        tty: true,
        tty_size: Some(TermSize {
            cols: 100,
            rows: 30,
        }),
        ..SpawnOpts::default()
    };
    let argv = ["bash", "--noprofile", "--norc", "-c", script].map(String::from);
    let mut p = f.sandbox.spawn(&argv, opts).await?;
    let out = p.take_stdout().ok_or("a terminal process has no output")?;
    Ok(Spawned { f, p, out })
}

struct Spawned {
    f: crate::support::Fixture,
    p: Box<dyn Process>,
    out: BoxRead,
}

pub async fn a_terminal_process_sees_a_tty_of_its_size_and_follows_a_resize(
    h: &Harness,
) -> TestResult {
    let script = "if [ -t 0 ] && [ -t 1 ]; then echo tty-yes; else echo tty-no; fi; \
        echo \"size=$(stty size)\" term=$TERM; \
        read -r line; echo \"read=$line\"; echo \"size=$(stty size) cols=$(tput cols 2>/dev/null || echo none)\"";
    let Spawned { f, mut p, mut out } = spawn_tty(h, "tty-size", script).await?;
    let mut seen = String::new();
    read_until(&mut out, &mut seen, "term=").await?;
    assert!(
        seen.contains("tty-yes"),
        "stdin and stdout are not a terminal: {seen:?}"
    );
    assert!(seen.contains("size=30 100"), "{seen:?}");
    assert!(seen.contains("term=xterm-256color"), "{seen:?}");
    p.resize(TermSize {
        cols: 120,
        rows: 40,
    })
    .await?;
    // The resize is in effect before the typed line (in order on every transport).
    let mut input = p.take_stdin().ok_or("a terminal process has no input")?;
    // Enter on a terminal is a carriage return; the line discipline makes it a newline.
    input.write_all(b"typed text\r").await?;
    input.flush().await?;
    read_until(&mut out, &mut seen, "cols=").await?;
    read_until(&mut out, &mut seen, "\n").await?;
    assert!(seen.contains("read=typed text"), "{seen:?}");
    assert!(seen.contains("size=40 120"), "{seen:?}");
    // The terminal echoes what was typed, as a terminal does.
    assert!(seen.contains("typed text\r\n"), "{seen:?}");
    let st = p.wait().await?;
    assert_eq!(st.shell_code(), 0);
    f.remove().await
}

pub async fn ctrl_c_typed_into_the_terminal_interrupts_its_program(h: &Harness) -> TestResult {
    // The program waits in a builtin, not on a child: a `sleep` that ends
    // on its own just as the INT comes makes bash take the INT as handled by
    // its child and skip the trap (the race that made this test flaky).
    let script = "trap 'echo caught-int; exit 7' INT; echo ready; while :; do read -r -t 1 _; done";
    let Spawned { f, mut p, mut out } = spawn_tty(h, "tty-int", script).await?;
    let mut seen = String::new();
    read_until(&mut out, &mut seen, "ready").await?;
    let mut input = p.take_stdin().ok_or("a terminal process has no input")?;
    input.write_all(&[0x03]).await?;
    input.flush().await?;
    read_until(&mut out, &mut seen, "caught-int").await?;
    let st = tokio::time::timeout(DEADLINE, p.wait()).await??;
    assert_eq!(st.shell_code(), 7, "{seen:?}");
    f.remove().await
}
