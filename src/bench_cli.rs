//! `berth bench --cli`: whole CLI processes, as a person or a script pays for
//! them: `berth exec -- echo hi` through the server, the same in-process
//! (`BERTH_SERVER=off`), and `bash -c` as the floor, in one run.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::bench::BenchArgs;
use crate::context;

/// Whole processes cost milliseconds: fewer runs than the in-process series.
const MAX_RUNS: usize = 100;

/// The median of `n` runs of `cmd`, which must succeed each time.
fn median(n: usize, mut cmd: impl FnMut() -> Command) -> Result<Duration> {
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = cmd();
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let start = Instant::now();
        let o = c.output().context("cannot run the measured command")?;
        runs.push(start.elapsed());
        if !o.status.success() {
            bail!(
                "the measured command failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
    runs.sort();
    Ok(runs[runs.len() / 2])
}

pub async fn run(state_dir: Option<PathBuf>, a: &BenchArgs) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    let n = a.count.clamp(1, MAX_RUNS);
    let exe = std::env::current_exe().context("cannot find berth's own executable")?;
    let berth = |mode: &str| {
        let mut c = Command::new(&exe);
        c.args(["exec", "--backend", &a.backend, "--", "echo hi"])
            .env("BERTH_STATE_DIR", &dir)
            .env("BERTH_SERVER", mode);
        c
    };
    // Warm both paths once: the first call starts the server and the sandbox.
    median(1, || berth("auto"))?;
    median(1, || berth("off"))?;
    let served = median(n, || berth("auto"))?;
    let off = median(n, || berth("off"))?;
    let bash = median(n, || {
        let mut c = Command::new("bash");
        c.args(["-c", "echo hi"]);
        c
    })?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64().max(1e-9);
    if a.json {
        context::print_json(&json!({
            "backend": a.backend, "runs": n,
            "server_ms": ms(served), "off_ms": ms(off), "bash_c_ms": ms(bash),
            "off_over_server": ratio(off, served), "server_over_bash_c": ratio(served, bash),
        }));
    } else {
        println!(
            "whole CLI processes, `echo hi`, median of {n} runs ({}):",
            a.backend
        );
        for (label, d) in [
            ("berth exec, server", served),
            ("berth exec, BERTH_SERVER=off", off),
            ("bash -c", bash),
        ] {
            println!("  {label:<30} {:>8.2} ms", ms(d));
        }
        println!(
            "  the server makes a call {:.1}x faster than in-process; a call costs {:.1}x `bash -c`",
            ratio(off, served),
            ratio(served, bash)
        );
    }
    Ok(0)
}
