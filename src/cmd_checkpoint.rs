//! `berth sandbox checkpoint|checkpoints|restore|clone`: a sandbox's files
//! and session saved, listed, brought back, and copied into a new sandbox.

use std::path::Path;

use anyhow::{Result, anyhow};
use berth_core::checkpoint::record::CheckpointRow;
use berth_service::convert;
use berth_service::proto;
use berth_service::proto::sandboxes_client::SandboxesClient;
use berth_service::proto::sandboxes_server::Sandboxes;
use serde_json::json;

use crate::api_client::{Api, call, sandbox_ref};
use crate::context;

use crate::api_args::sandbox::{CheckpointArgs, CheckpointsArgs, CloneArgs, RestoreArgs};

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
pub async fn checkpoint(api: &Api, a: CheckpointArgs) -> Result<u8> {
    let req = proto::TakeCheckpoint {
        sandbox: Some(sandbox_ref(a.backend, &a.name)?),
        label: a.label.clone(),
    };
    let mut info = call!(api, SandboxesClient, Sandboxes, checkpoint, req)?;
    let left_out = info.outside_workspace.take();
    let c = convert::checkpoint_row(info);
    if a.json {
        let mut v = serde_json::to_value(&c)?;
        v["outside_workspace"] = json!(left_out);
        context::print_json(&v);
    } else {
        println!(
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
            println!("left out (special files): {}", c.skipped.join(", "));
        }
        if let Some(n) = left_out {
            println!("left out: {n}");
        }
    }
    Ok(0)
}

/// `berth sandbox checkpoints NAME`.
pub async fn list(api: &Api, a: CheckpointsArgs) -> Result<u8> {
    let req = sandbox_ref(a.backend, &a.name)?;
    let rows: Vec<CheckpointRow> = call!(api, SandboxesClient, Sandboxes, checkpoints, req)?
        .checkpoints
        .into_iter()
        .map(convert::checkpoint_row)
        .collect();
    if a.json {
        context::print_json(&serde_json::to_value(&rows)?);
        return Ok(0);
    }
    if rows.is_empty() {
        println!(
            "sandbox {} has no checkpoints; take one with `berth sandbox checkpoint {}`",
            a.name, a.name
        );
        return Ok(0);
    }
    println!(
        "{:<12} {:<23} {:>7} {:>10} {:>8} {:>10}  FROM",
        "ID", "TAKEN", "FILES", "SIZE", "CHANGED", "STORED"
    );
    for c in rows {
        println!(
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
pub async fn restore(api: &Api, dir: &Path, a: RestoreArgs) -> Result<u8> {
    // In-process, a server may hold the sandbox's shells: they would write
    // their state over the restored one. Tell it to let them go.
    if matches!(api, Api::Here(_)) {
        crate::server::client::forget(dir, a.backend.as_str(), &a.name).await;
    }
    let req = proto::RestoreCheckpoint {
        sandbox: Some(sandbox_ref(a.backend, &a.name)?),
        checkpoint: a.checkpoint.clone(),
        force: a.force,
    };
    let done = call!(api, SandboxesClient, Sandboxes, restore, req)?;
    let r = berth_core::runtime::RestoreReport {
        checkpoint: convert::checkpoint_row(
            done.checkpoint
                .ok_or_else(|| anyhow!("the server's answer named no checkpoint"))?,
        ),
        written: usize::try_from(done.written).unwrap_or(usize::MAX),
        removed: usize::try_from(done.removed).unwrap_or(usize::MAX),
        stopped: done.stopped,
        took_ms: done.took_ms,
    };
    if a.json {
        context::print_json(&serde_json::to_value(&r)?);
    } else {
        for s in &r.stopped {
            println!("stopped: {s}");
        }
        println!(
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
pub async fn clone(api: &Api, a: CloneArgs) -> Result<u8> {
    let to = a.to.unwrap_or(a.backend);
    let req = proto::CloneRequest {
        from: Some(sandbox_ref(a.backend, &a.src)?),
        to: Some(sandbox_ref(to, &a.dst)?),
        at: a.at.clone(),
    };
    let mut info = call!(api, SandboxesClient, Sandboxes, clone_sandbox, req)?
        .checkpoint
        .ok_or_else(|| anyhow!("the server's answer named no checkpoint"))?;
    let left_out = info.outside_workspace.take();
    let c = convert::checkpoint_row(info);
    if a.json {
        context::print_json(&json!({
            "sandbox": a.dst, "backend": to, "from": a.src,
            "checkpoint": c.origin, "first_checkpoint": c.id, "took_ms": c.took_ms,
            "outside_workspace": left_out,
        }));
    } else {
        println!(
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
            println!("not carried over: {n}");
        }
    }
    Ok(0)
}
