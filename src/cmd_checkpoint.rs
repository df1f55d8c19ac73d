//! `berth sandbox checkpoint|checkpoints|restore|clone`: a sandbox's files
//! and session saved, listed, brought back, and copied into a new sandbox.

use std::path::Path;

use anyhow::Result;
use berth_core::checkpoint::record::CheckpointRow;
use berth_core::runtime::Runtime;
use serde_json::json;

use crate::context;
use crate::io::outln;

use berth_client::served::sandbox::{CheckpointArgs, CheckpointsArgs, CloneArgs, RestoreArgs};

fn mib(bytes: i64) -> String {
    if bytes < 1 << 20 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    }
}

fn when(ms: i64) -> String {
    crate::cmd_schedule::when(Some(ms))
}

fn source(c: &CheckpointRow) -> String {
    match (&c.run_id, c.step, &c.label) {
        (Some(r), Some(s), _) => format!("run {r} step {s}"),
        (_, _, Some(l)) => l.clone(),
        _ => String::new(),
    }
}

/// What a checkpoint of a sandbox leaves out beside its workspace: files
/// under `~/.local` (where `pip install --user` puts packages) when the home
/// lies outside the workspace. A checkpoint and a clone carry the workspace
/// only; this says so instead of dropping them without a word. `None` when
/// there are none, or the sandbox could not be asked (then nothing is
/// claimed).
async fn home_left_out(rt: &Runtime, backend: &str, name: &str) -> Option<String> {
    const PROBE: &str = r#"W=$1 h=${HOME:-}
[ -n "$h" ] || exit 0
d=${h%/}/.local
case "$d/" in "${W%/}"/*) exit 0;; esac
[ -d "$d" ] || exit 0
n=$(find "$d" -type f 2>/dev/null | head -n 100000 | wc -l)
[ "$n" -gt 0 ] && printf '%s\t%s' "$n" "$d"
exit 0"#;
    let sb = rt.attach(backend, name).await.ok()?;
    let workdir = sb.layout().workdir.clone();
    let argv = [
        "bash".to_string(),
        "-c".into(),
        PROBE.into(),
        "berth-probe".into(),
        workdir.clone(),
    ];
    let c = berth_core::backend::run_to_end(
        &*sb,
        &argv,
        None,
        4096,
        std::time::Duration::from_secs(20),
    )
    .await
    .ok()?;
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    let (n, dir) = out.trim().split_once('\t')?;
    Some(format!(
        "{n} files under {dir} (where `pip install --user` puts packages) are outside the workspace {workdir}, so checkpoints and clones do not carry them; install into a venv in the workspace instead (`python3 -m venv .venv`), which they do"
    ))
}

/// `berth sandbox checkpoint NAME`.
pub async fn checkpoint(rt: &Runtime, a: CheckpointArgs) -> Result<u8> {
    let c = rt
        .checkpoint(&a.backend, &a.name, a.label.as_deref(), None)
        .await?;
    let left_out = home_left_out(rt, &a.backend, &a.name).await;
    if a.json {
        let mut v = serde_json::to_value(&c)?;
        v["outside_workspace"] = json!(left_out);
        context::print_json(&v);
    } else {
        outln!(
            "checkpoint {} of sandbox {}: {} files, {}; stored {} changed ({}) in {} ms",
            c.id,
            c.sandbox,
            c.files,
            mib(c.bytes),
            c.changed,
            mib(c.new_bytes),
            c.took_ms
        );
        if !c.skipped.is_empty() {
            outln!("left out (special files): {}", c.skipped.join(", "));
        }
        if let Some(n) = left_out {
            outln!("left out: {n}");
        }
    }
    Ok(0)
}

/// `berth sandbox checkpoints NAME`.
pub fn list(rt: &Runtime, a: CheckpointsArgs) -> Result<u8> {
    let rows = rt.checkpoints(&a.backend, &a.name)?;
    if a.json {
        context::print_json(&serde_json::to_value(&rows)?);
        return Ok(0);
    }
    if rows.is_empty() {
        outln!(
            "sandbox {} has no checkpoints; take one with `berth sandbox checkpoint {}`",
            a.name,
            a.name
        );
        return Ok(0);
    }
    outln!(
        "{:<12} {:<23} {:>7} {:>10} {:>8} {:>10}  FROM",
        "ID",
        "TAKEN",
        "FILES",
        "SIZE",
        "CHANGED",
        "STORED"
    );
    for c in rows {
        outln!(
            "{:<12} {:<23} {:>7} {:>10} {:>8} {:>10}  {}",
            c.id,
            when(c.created_ms),
            c.files,
            mib(c.bytes),
            c.changed,
            mib(c.new_bytes),
            source(&c)
        );
    }
    Ok(0)
}

/// `berth sandbox restore NAME CHECKPOINT`.
pub async fn restore(rt: &Runtime, dir: &Path, a: RestoreArgs) -> Result<u8> {
    // In-process, a server may hold the sandbox's shells: they would write
    // their state over the restored one. Tell it to let them go.
    if !crate::io::remote() {
        crate::server::client::forget(dir, &a.backend, &a.name).await;
    }
    let r = rt
        .restore_checkpoint(&a.backend, &a.name, &a.checkpoint, a.force)
        .await?;
    if a.json {
        context::print_json(&serde_json::to_value(&r)?);
    } else {
        for s in &r.stopped {
            outln!("stopped: {s}");
        }
        outln!(
            "restored sandbox {} to checkpoint {} ({}): {} written back, {} removed, in {} ms; the next command's shell has the session as it was",
            a.name,
            r.checkpoint.id,
            when(r.checkpoint.created_ms),
            r.written,
            r.removed,
            r.took_ms
        );
    }
    Ok(0)
}

/// `berth sandbox clone SRC DST`.
pub async fn clone(rt: &Runtime, a: CloneArgs) -> Result<u8> {
    let to = a.to.clone().unwrap_or_else(|| a.backend.clone());
    let c = rt
        .clone_sandbox(&a.backend, &a.src, &to, &a.dst, a.at.as_deref())
        .await?;
    let left_out = home_left_out(rt, &a.backend, &a.src).await;
    if a.json {
        context::print_json(&json!({
            "sandbox": a.dst, "backend": to, "from": a.src,
            "checkpoint": c.origin, "first_checkpoint": c.id, "took_ms": c.took_ms,
            "outside_workspace": left_out,
        }));
    } else {
        outln!(
            "cloned sandbox {} ({}) at checkpoint {} into {} ({}): {} files, {}, in {} ms",
            a.src,
            a.backend,
            c.origin.as_deref().unwrap_or("?"),
            a.dst,
            to,
            c.files,
            mib(c.bytes),
            c.took_ms
        );
        if let Some(n) = left_out {
            outln!("not carried over: {n}");
        }
    }
    Ok(0)
}
