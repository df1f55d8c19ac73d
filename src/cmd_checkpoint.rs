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

/// `berth sandbox checkpoint NAME`.
pub async fn checkpoint(rt: &Runtime, a: CheckpointArgs) -> Result<u8> {
    let c = rt
        .checkpoint(&a.backend, &a.name, a.label.as_deref(), None)
        .await?;
    if a.json {
        context::print_json(&serde_json::to_value(&c)?);
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
    if a.json {
        context::print_json(&json!({
            "sandbox": a.dst, "backend": to, "from": a.src,
            "checkpoint": c.origin, "first_checkpoint": c.id, "took_ms": c.took_ms,
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
    }
    Ok(0)
}
