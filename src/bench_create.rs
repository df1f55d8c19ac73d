//! `berth bench --create`: what a new sandbox costs until its first command
//! has answered, made cold and taken from a warm pool, on each backend,
//! against `docker run --rm` of the same image measured in the same run.
//!
//! The runs go through the runtime in this process (no server, no policy
//! gate): what is measured is the backend and the session, not a CLI
//! process. Nothing here asserts a time; the ratios are printed.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use berth_core::backend::{BackendKind, SandboxSpec};
use berth_core::runtime::Runtime;
use berth_core::session::ExecOpts;
use serde_json::json;

use crate::bench::BenchArgs;
use crate::context;

/// The image docker and k8s sandboxes are made from by default, and the
/// floor runs.
const IMAGE: &str = "berth-sandbox:latest";
/// The first command.
const PROBE: &str = "echo hi";
/// Runs per series, at most.
const MAX_RUNS: usize = 10;
/// The pool the warm series takes from.
const POOL: &str = "berth-bench-create";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

/// One backend's three series.
struct Measured {
    backend: BackendKind,
    cold: Duration,
    warm: Duration,
    /// Takes that found no ready member (made cold instead): 0 unless the
    /// pool could not keep up.
    warm_misses: usize,
}

/// The backends `-b` names for --create: docker and k8s (the default,
/// local, means docker).
fn backends(text: &str) -> Result<Vec<BackendKind>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let b = crate::api_client::backend_kind(part)?;
        let b = if b == BackendKind::Local {
            BackendKind::Docker
        } else {
            b
        };
        if !berth_core::pools::POOL_BACKENDS.contains(&b) {
            bail!(
                "--create measures docker and k8s (their pools); `{part}` has none. Use -b docker, -b k8s or -b docker,k8s"
            );
        }
        if !out.contains(&b) {
            out.push(b);
        }
    }
    Ok(out)
}

pub async fn run(state_dir: Option<PathBuf>, a: BenchArgs) -> Result<u8> {
    a.check()?;
    let backends = backends(&a.backend)?;
    let n = a.count.min(MAX_RUNS);
    let rt = Arc::new(context::runtime(state_dir)?);
    let floor = docker_run_floor(n).await?;
    let mut measured = Vec::new();
    for b in &backends {
        let r = measure(&rt, *b, n).await;
        // Whatever was measured, the pool goes.
        if let Err(e) = rt.remove_pool(POOL).await
            && !matches!(e, berth_core::error::Error::NotFound { .. })
        {
            eprintln!("warning: removing the bench pool: {}", e.full_text());
        }
        measured.push(r.with_context(|| format!("measuring create on {b}"))?);
    }
    rt.shutdown().await;
    let ratio = |d: Duration| floor.as_secs_f64() / d.as_secs_f64().max(1e-9);
    if a.json {
        let rows: Vec<_> = measured
            .iter()
            .map(|m| {
                json!({
                    "backend": m.backend,
                    "cold_ms": ms(m.cold),
                    "warm_ms": ms(m.warm),
                    "warm_misses": m.warm_misses,
                    "cold_vs_floor": ratio(m.cold),
                    "warm_vs_floor": ratio(m.warm),
                })
            })
            .collect();
        context::print_json(&json!({
            "runs": n,
            "probe": PROBE,
            "floor": format!("docker run --rm {IMAGE} {PROBE}"),
            "floor_ms": ms(floor),
            "backends": rows,
        }));
        return Ok(0);
    }
    println!("create a sandbox and run its first command (`{PROBE}`), median of {n}:");
    println!(
        "  floor: `docker run --rm {IMAGE} {PROBE}`  {:>9.1} ms",
        ms(floor)
    );
    // How a series compares with the floor, in words that read either way.
    let against = |d: Duration| {
        let r = ratio(d);
        if r >= 1.0 {
            format!("{r:.1}x faster than the floor")
        } else {
            format!("{:.1}x the floor's time", 1.0 / r)
        }
    };
    for m in &measured {
        println!(
            "  {:<6} cold (made now)              {:>9.1} ms  ({})",
            m.backend,
            ms(m.cold),
            against(m.cold)
        );
        println!(
            "  {:<6} warm (from a pool)           {:>9.1} ms  ({}){}",
            m.backend,
            ms(m.warm),
            against(m.warm),
            if m.warm_misses > 0 {
                format!("; {} take(s) found the pool empty", m.warm_misses)
            } else {
                String::new()
            }
        );
    }
    Ok(0)
}

/// `docker run --rm IMAGE echo hi`, n times: a new container per command,
/// the way without berth.
async fn docker_run_floor(n: usize) -> Result<Duration> {
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let o = tokio::process::Command::new("docker")
            .args(["run", "--rm", "--network", "none", IMAGE, "sh", "-c", PROBE])
            .stdin(Stdio::null())
            .output()
            .await
            .context("running `docker run` for the floor (is the docker CLI installed?)")?;
        runs.push(t.elapsed());
        if !o.status.success() || o.stdout != b"hi\n" {
            bail!(
                "`docker run --rm {IMAGE}` failed ({}): {}; build the image with `berth image build`",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
    Ok(median(runs))
}

/// The first command of a sandbox just made or taken.
async fn first_command(rt: &Runtime, backend: BackendKind, name: &str) -> Result<()> {
    let (s, _) = rt.session(backend, name).await?;
    let r = s.lock().await.exec(PROBE, ExecOpts::default()).await?;
    if r.exit_code != 0 || r.output.text() != "hi\n" {
        bail!(
            "the first command printed {:?} (exit {})",
            r.output.text(),
            r.exit_code
        );
    }
    Ok(())
}

async fn measure(rt: &Arc<Runtime>, backend: BackendKind, n: usize) -> Result<Measured> {
    let name = |kind: &str, i: usize| format!("berth-bench-{kind}-{i}");
    // Leftovers of an interrupted run.
    for i in 0..n {
        for kind in ["cold", "warm"] {
            let _ = rt.remove_sandbox(backend, &name(kind, i), true).await;
        }
    }
    let _ = rt.remove_pool(POOL).await;
    let mut cold = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        rt.create_sandbox(backend, SandboxSpec::named(name("cold", i)))
            .await?;
        first_command(rt, backend, &name("cold", i)).await?;
        cold.push(t.elapsed());
        rt.remove_sandbox(backend, &name("cold", i), true).await?;
    }
    rt.create_pool(POOL, backend, 2, SandboxSpec::default())
        .await?;
    rt.fill_pool(POOL).await?;
    let mut warm = Vec::with_capacity(n);
    let mut misses = 0;
    for i in 0..n {
        let t = Instant::now();
        let got = rt
            .take_from_pool(POOL, Some(backend), &SandboxSpec::named(name("warm", i)))
            .await?;
        first_command(rt, backend, &name("warm", i)).await?;
        warm.push(t.elapsed());
        if got.instance.is_none() {
            misses += 1;
        }
        // Not measured: the refill a server does behind each take, and the
        // removal.
        rt.remove_sandbox(backend, &name("warm", i), true).await?;
        rt.fill_pool(POOL).await?;
    }
    Ok(Measured {
        backend,
        cold: median(cold),
        warm: median(warm),
        warm_misses: misses,
    })
}
