//! `berth sandbox inspect NAME`: a sandbox's settings and size as the sandbox
//! itself has them, beside the settings on record. On docker the container's
//! config comes from the engine (network mode, memory, CPU and process
//! limits, user, read-only root, capabilities, image, sizes), and any
//! setting in which it differs from the record is named. Elsewhere, the
//! record and the backend's live state.

use std::path::Path;

use anyhow::{Result, bail};
use berth_core::backend::SandboxSpec;
use berth_core::runtime::Runtime;
use serde_json::{Value, json};

use berth_client::served::sandbox::InspectArgs;

use crate::context;
use crate::io::outln;

/// The record's spec as shown: the environment by name only (values may be
/// secrets).
fn record_json(spec: &SandboxSpec) -> Value {
    json!({
        "image": spec.image,
        "network": spec.network,
        "memory_mb": spec.limits.memory_mb,
        "milli_cpu": spec.limits.milli_cpu,
        "pids": spec.limits.pids,
        "options": spec.options,
        "env": spec.env.keys().collect::<Vec<_>>(),
    })
}

fn or_default<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map(|x| format!("{x}{unit}"))
        .unwrap_or_else(|| "the backend's default".into())
}

fn size(bytes: Option<i64>) -> String {
    match bytes {
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        Some(b) => format!("{:.1} KiB", b as f64 / 1024.0),
        None => "unknown".into(),
    }
}

fn print_record(spec: &SandboxSpec) {
    outln!("  on record (what it was made with):");
    outln!(
        "    network {}, image {}, memory {}, cpus {}, pids {}",
        if spec.network { "on" } else { "off" },
        spec.image.as_deref().unwrap_or("the default"),
        or_default(spec.limits.memory_mb, " MiB"),
        or_default(spec.limits.milli_cpu.map(|m| m as f64 / 1000.0), ""),
        or_default(spec.limits.pids, "")
    );
    if !spec.options.is_empty() {
        let o: Vec<String> = spec
            .options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        outln!("    options {}", o.join(" "));
    }
    if !spec.env.is_empty() {
        let e: Vec<&str> = spec.env.keys().map(String::as_str).collect();
        outln!("    environment {}", e.join(" "));
    }
}

/// `berth sandbox inspect NAME`.
pub async fn run(rt: &Runtime, dir: &Path, a: InspectArgs) -> Result<u8> {
    let row = rt.store().sandbox(&a.backend, &a.name)?;
    let mut out = json!({
        "name": a.name,
        "backend": a.backend,
        "record": row.as_ref().map(|r| record_json(&r.spec)),
    });
    if a.backend == "docker" {
        return docker(dir, a, row.map(|r| r.spec), out).await;
    }
    let live = rt.list_sandboxes(&a.backend).await?;
    let live = live.into_iter().find(|s| s.name == a.name);
    if row.is_none() && live.is_none() {
        bail!(
            "sandbox `{}` ({}) not found; list sandboxes with `berth sandbox ls -b {}`",
            a.name,
            a.backend,
            a.backend
        );
    }
    out["state"] = json!(live.as_ref().map(|l| l.state.clone()));
    out["id"] = json!(live.as_ref().and_then(|l| l.id.clone()));
    if a.json {
        context::print_json(&out);
        return Ok(0);
    }
    outln!("sandbox {} ({})", a.name, a.backend);
    outln!(
        "  state {}, id {}",
        live.as_ref().map_or("unknown", |l| l.state.as_str()),
        live.as_ref()
            .and_then(|l| l.id.as_deref())
            .unwrap_or("none")
    );
    if let Some(r) = rt.store().sandbox(&a.backend, &a.name)? {
        print_record(&r.spec);
    }
    Ok(0)
}

#[cfg(feature = "docker")]
async fn docker(
    dir: &Path,
    a: InspectArgs,
    spec: Option<SandboxSpec>,
    mut out: Value,
) -> Result<u8> {
    use berth_backends::docker::config::ContainerPlan;
    use berth_backends::docker::inspect::{ContainerSettings, differences};
    let backend = berth_backends::docker::DockerBackend::connect()
        .await?
        .with_installation(&berth_backends::installation_id(dir)?);
    let facts = backend.inspect_sandbox(&a.name).await?;
    if spec.is_none() && facts.is_none() {
        bail!(
            "sandbox `{}` (docker) not found; list sandboxes with `berth sandbox ls -b docker`",
            a.name
        );
    }
    let diff = match (&spec, &facts) {
        (Some(spec), Some(f)) => {
            let plan = ContainerPlan::from_spec(spec)?;
            differences(&ContainerSettings::planned(spec, &plan), &f.settings)
        }
        _ => Vec::new(),
    };
    out["container"] = serde_json::to_value(&facts)?;
    out["differences"] = json!(diff);
    if a.json {
        context::print_json(&out);
        return Ok(0);
    }
    outln!("sandbox {} (docker)", a.name);
    match &facts {
        None => outln!(
            "  no container: the next command creates one with the settings on record, on the sandbox's volumes"
        ),
        Some(f) => {
            let s = &f.settings;
            outln!(
                "  container {} ({}), {}, on the daemon at {}",
                f.container,
                f.id.get(..12).unwrap_or(f.id.as_str()),
                f.state,
                f.daemon
            );
            outln!("  image {}", s.image);
            outln!(
                "  network {}",
                if s.network == "none" {
                    "none (off; `--network` at creation turns it on)".to_string()
                } else {
                    s.network.clone()
                }
            );
            outln!(
                "  memory {}, cpus {}, pids {}",
                s.memory_mb
                    .map_or("no limit".into(), |m| format!("{m} MiB")),
                s.milli_cpu
                    .map_or("no limit".into(), |m| format!("{}", m as f64 / 1000.0)),
                s.pids.map_or("no limit".into(), |p| p.to_string())
            );
            outln!(
                "  user {}, read-only root {}, capabilities added {}",
                s.user,
                if s.read_only { "yes" } else { "no" },
                if s.cap_add.is_empty() {
                    "none".to_string()
                } else {
                    s.cap_add.join(",")
                }
            );
            outln!(
                "  size: workspace {}, written in the container {} (root filesystem {} with the image)",
                size(f.workspace_bytes.map(|b| b as i64)),
                size(f.size_rw),
                size(f.size_root_fs)
            );
            outln!("  volumes {}", f.volumes.join(", "));
        }
    }
    match &spec {
        Some(spec) => print_record(spec),
        None => outln!(
            "  not on record: an orphan of this installation; `berth sandbox rm {} -b docker` removes it",
            a.name
        ),
    }
    if !diff.is_empty() {
        outln!("  the container differs from the record:");
        for d in &diff {
            outln!("    {d}");
        }
    }
    Ok(0)
}

#[cfg(not(feature = "docker"))]
async fn docker(
    _dir: &Path,
    _a: InspectArgs,
    _spec: Option<SandboxSpec>,
    _out: Value,
) -> Result<u8> {
    bail!("this berth was built without the docker backend (cargo feature `docker`)")
}
