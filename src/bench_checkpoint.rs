//! `berth bench --checkpoint`: what a checkpoint costs against copying the
//! workspace, measured side by side in one run and in the same sandbox.
//!
//! A workspace of `--size-mb` of random data in 512 KiB files, beside 1000
//! small source files, is made, then:
//! `cp -a` and `tar -cf` of it (the floors), the first (full) checkpoint, one
//! after 10 small changes, one after none, and a restore of 10 changed files.
//! Where the sandbox has git, a shadow git repository (the peers' way: its
//! own `GIT_DIR`, `add -A` and `commit`) is measured the same two ways.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use berth_core::backend::{Sandbox, SandboxSpec, run_to_end};
use berth_core::runtime::Runtime;
use serde_json::json;

use crate::bench::BenchArgs;
use crate::context;
use crate::io::outln;

const SANDBOX: &str = "berth-bench-checkpoint";
/// The workspace's size when --size-mb is not given.
const DEFAULT_MB: u64 = 1024;
/// Bytes per file of the generated workspace.
const FILE: u64 = 512 * 1024;
/// Small files beside the data: a project's sources, 4 KiB each.
const SOURCES: u64 = 1000;

/// Run `script` in the sandbox's workspace with bash; how long it took.
async fn timed(sb: &dyn Sandbox, script: &str) -> Result<Duration> {
    let argv = [
        "bash".to_string(),
        "-c".into(),
        format!("cd -- \"$1\" && {script}"),
        "berth-bench".into(),
        sb.layout().workdir.clone(),
    ];
    let t0 = Instant::now();
    let c = run_to_end(sb, &argv, None, 1 << 16, Duration::from_secs(3600)).await?;
    let took = t0.elapsed();
    if c.status.code != Some(0) {
        bail!(
            "`{script}` failed in the bench sandbox: {}",
            String::from_utf8_lossy(&c.stderr).trim()
        );
    }
    Ok(took)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `berth bench --checkpoint`.
pub async fn run(state_dir: Option<PathBuf>, mut a: BenchArgs) -> Result<u8> {
    let size_mb = *a.size_mb.get_or_insert(DEFAULT_MB);
    if size_mb == 0 {
        bail!("--size-mb must be at least 1");
    }
    let backend = crate::api_client::backend_kind(&a.backend)?;
    let rt = Arc::new(context::runtime(state_dir)?);
    let mut spec = SandboxSpec::named(SANDBOX);
    for o in &a.options {
        let Some((k, v)) = o.split_once('=') else {
            bail!("--opt takes KEY=VALUE, got {o:?}");
        };
        spec.options.insert(k.into(), v.into());
    }
    let _ = rt.remove_sandbox(backend, SANDBOX, true).await;
    let (sb, _, _) = rt
        .create_sandbox(backend, spec)
        .await
        .with_context(|| format!("creating the bench sandbox on {}", a.backend))?;
    let result = measure(&rt, &*sb, &a).await;
    let removed = rt.remove_sandbox(backend, SANDBOX, true).await;
    let out = result?;
    removed?;
    if a.json {
        context::print_json(&out);
    } else {
        let cp = out["cp_a_ms"].as_f64().unwrap_or(1.0);
        outln!(
            "checkpoint cost on {} ({} MiB in {} files; ratios against `cp -a` of the same tree, this run):",
            a.backend,
            size_mb,
            out["files"]
        );
        let row = |label: &str, key: &str| {
            if let Some(v) = out[key].as_f64() {
                outln!(
                    "  {label:<44} {v:>10.1} ms  {:>7.2}% of cp -a",
                    v / cp * 100.0
                );
            }
        };
        row("one helper process in the sandbox (`true`)", "spawn_ms");
        row("cp -a (floor)", "cp_a_ms");
        row("tar -cf (floor)", "tar_ms");
        row("checkpoint, first (full)", "full_ms");
        row("checkpoint, after 10 small changes", "incremental_ms");
        row("checkpoint, no change", "unchanged_ms");
        row("restore of 10 changed files", "restore_ms");
        row("shadow git: add -A + commit, first", "git_full_ms");
        row("shadow git: after 10 small changes", "git_incremental_ms");
        outln!(
            "  incremental checkpoint stored {} bytes; {:.2}% of cp -a",
            out["incremental_bytes"],
            out["incremental_ms"].as_f64().unwrap_or(0.0) / cp * 100.0
        );
    }
    Ok(0)
}

async fn measure(rt: &Runtime, sb: &dyn Sandbox, a: &BenchArgs) -> Result<serde_json::Value> {
    let backend = crate::api_client::backend_kind(&a.backend)?;
    let files = (a.size_mb.unwrap_or(DEFAULT_MB) * 1024 * 1024).div_ceil(FILE);
    let dirs = files.div_ceil(64);
    eprintln!(
        "berth: bench: writing {} MiB of random data in {files} files…",
        a.size_mb.unwrap_or(DEFAULT_MB)
    );
    // Data in 512 KiB files, and a source tree of small files beside it.
    timed(
        sb,
        &format!(
            "mkdir -p tree && cd tree && n=0; for d in $(seq {dirs}); do mkdir -p d$d; for f in $(seq 64); do [ $n -ge {files} ] && break 2; head -c {FILE} /dev/urandom > d$d/f$f; n=$((n+1)); done; done; \
             mkdir -p src && for i in $(seq {SOURCES}); do head -c 3000 /dev/urandom | base64 > src/m$i.py; done"
        ),
    )
    .await?;
    let scratch = format!("{}/bench-scratch", sb.layout().berth_dir);
    let spawn = timed(sb, "true").await?;
    let cp_a = timed(
        sb,
        &format!("mkdir -p '{scratch}' && cp -a tree '{scratch}/copy'"),
    )
    .await?;
    timed(sb, &format!("rm -rf '{scratch}/copy'")).await?;
    let tar = timed(sb, &format!("tar -cf '{scratch}/copy.tar' tree")).await?;
    timed(sb, &format!("rm -rf '{scratch}'")).await?;
    // Ten small changes: a line added to ten source files.
    let change = "for i in $(seq 10); do echo \"x = $RANDOM\" >> tree/src/m$i.py; done";

    eprintln!("berth: bench: checkpoints…");
    let full = rt.checkpoint(backend, SANDBOX, None, None).await?;
    timed(sb, change).await?;
    let incremental = rt.checkpoint(backend, SANDBOX, None, None).await?;
    let unchanged = rt.checkpoint(backend, SANDBOX, None, None).await?;
    timed(sb, change).await?;
    let t0 = Instant::now();
    let restored = rt
        .restore_checkpoint(backend, SANDBOX, &incremental.id, false)
        .await?;
    let restore = t0.elapsed();

    // The peers' way, where the sandbox has git.
    let git = format!(
        "git --git-dir='{scratch}-git' --work-tree=\"$PWD\" -c user.email=b@b -c user.name=b"
    );
    let (git_full, git_incremental) = if timed(sb, "command -v git >/dev/null").await.is_ok() {
        eprintln!("berth: bench: shadow git…");
        timed(sb, &format!("{git} init -q")).await?;
        let f = timed(sb, &format!("{git} add -A && {git} commit -qm full")).await?;
        timed(sb, change).await?;
        let i = timed(sb, &format!("{git} add -A && {git} commit -qm inc")).await?;
        timed(sb, &format!("rm -rf '{scratch}-git'")).await?;
        (Some(ms(f)), Some(ms(i)))
    } else {
        (None, None)
    };
    Ok(json!({
        "backend": a.backend,
        "size_mb": a.size_mb.unwrap_or(DEFAULT_MB),
        "files": files + SOURCES,
        "spawn_ms": ms(spawn),
        "cp_a_ms": ms(cp_a),
        "tar_ms": ms(tar),
        "full_ms": full.took_ms,
        "full_bytes": full.new_bytes,
        "incremental_ms": incremental.took_ms,
        "incremental_bytes": incremental.new_bytes,
        "incremental_changed": incremental.changed,
        "unchanged_ms": unchanged.took_ms,
        "unchanged_bytes": unchanged.new_bytes,
        "restore_ms": ms(restore),
        "restore_written": restored.written,
        "git_full_ms": git_full,
        "git_incremental_ms": git_incremental,
        "incremental_share_of_cp_a": incremental.took_ms as f64 / ms(cp_a),
    }))
}
