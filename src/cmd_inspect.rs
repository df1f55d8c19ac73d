//! `berth sandbox inspect NAME`: a sandbox's settings and size as the sandbox
//! itself has them, beside the settings on record. On docker the container's
//! config comes from the engine (network mode, memory, CPU and process
//! limits, user, read-only root, capabilities, image, sizes), and any
//! setting in which it differs from the record is named. Elsewhere, the
//! record and the backend's live state.

use anyhow::Result;
use berth_core::backend::BackendKind;
use berth_service::proto;
use berth_service::proto::sandboxes_client::SandboxesClient;
use berth_service::proto::sandboxes_server::Sandboxes;
use serde_json::{Value, json};

use crate::api_args::sandbox::InspectArgs;

use crate::api_client::{Api, call, sandbox_ref};
use crate::context;

/// The record's settings as shown: the environment by name only (values
/// may be secrets).
fn record_json(spec: &proto::SandboxSettings) -> Value {
    let options: std::collections::BTreeMap<_, _> = spec.options.iter().collect();
    json!({
        "image": spec.image,
        "network": spec.network,
        "network_rules": spec.network_rules.as_ref().map(|r| json!({"allow": r.allow, "deny": r.deny})),
        "memory_mb": spec.memory_mb,
        "milli_cpu": spec.milli_cpu,
        "pids": spec.pids,
        "options": options,
        "env": spec.env_names,
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

fn print_record(spec: &proto::SandboxSettings) {
    println!("  on record (what it was made with):");
    println!(
        "    network {}, image {}, memory {}, cpus {}, pids {}",
        match &spec.network_rules {
            Some(r) =>
                format!("allow:{}", r.allow.join(","))
                    + &if r.deny.is_empty() {
                        String::new()
                    } else {
                        format!(" deny:{}", r.deny.join(","))
                    },
            None if spec.network => "on".into(),
            None => "off".into(),
        },
        spec.image.as_deref().unwrap_or("the default"),
        or_default(spec.memory_mb, " MiB"),
        or_default(spec.milli_cpu.map(|m| m as f64 / 1000.0), ""),
        or_default(spec.pids, "")
    );
    if !spec.options.is_empty() {
        let mut o: Vec<String> = spec
            .options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        o.sort();
        println!("    options {}", o.join(" "));
    }
    if !spec.env_names.is_empty() {
        println!("    environment {}", spec.env_names.join(" "));
    }
}

/// `berth sandbox inspect NAME`.
pub async fn run(api: &Api, a: InspectArgs) -> Result<u8> {
    let req = sandbox_ref(a.backend, &a.name)?;
    let d = call!(api, SandboxesClient, Sandboxes, inspect, req)?;
    let mut out = json!({
        "name": a.name,
        "backend": a.backend,
        "record": d.record.as_ref().map(record_json),
    });
    if a.backend == BackendKind::Docker {
        return docker(a, d, out);
    }
    out["state"] = json!(d.state);
    out["id"] = json!(d.id);
    if a.json {
        context::print_json(&out);
        return Ok(0);
    }
    println!("sandbox {} ({})", a.name, a.backend);
    println!(
        "  state {}, id {}",
        d.state.as_deref().unwrap_or("unknown"),
        d.id.as_deref().unwrap_or("none")
    );
    if let Some(r) = &d.record {
        print_record(r);
    }
    Ok(0)
}

/// A container's facts as `--json` shows them.
fn container_json(f: &proto::Container) -> Value {
    let s = f.settings.clone().unwrap_or_default();
    json!({
        "daemon": f.daemon, "container": f.name, "id": f.id, "state": f.state,
        "settings": {
            "network": s.network, "memory_mb": s.memory_mb, "milli_cpu": s.milli_cpu,
            "pids": s.pids, "user": s.user, "read_only": s.read_only,
            "cap_add": s.cap_add, "image": s.image,
        },
        "size_rw": f.size_rw, "size_root_fs": f.size_root_fs,
        "volumes": f.volumes, "workspace_bytes": f.workspace_bytes,
    })
}

fn docker(a: InspectArgs, d: proto::SandboxDetail, mut out: Value) -> Result<u8> {
    out["container"] = d.container.as_ref().map_or(Value::Null, container_json);
    out["differences"] = json!(d.differences);
    if a.json {
        context::print_json(&out);
        return Ok(0);
    }
    println!("sandbox {} (docker)", a.name);
    match &d.container {
        None => println!(
            "  no container: the next command creates one with the settings on record, on the sandbox's volumes"
        ),
        Some(f) => {
            let s = f.settings.clone().unwrap_or_default();
            println!(
                "  container {} ({}), {}, on the daemon at {}",
                f.name,
                f.id.get(..12).unwrap_or(f.id.as_str()),
                f.state,
                f.daemon
            );
            println!("  image {}", s.image);
            println!(
                "  network {}",
                if s.network == "none" {
                    "none (off; `--network` at creation turns it on)".to_string()
                } else {
                    s.network.clone()
                }
            );
            println!(
                "  memory {}, cpus {}, pids {}",
                s.memory_mb
                    .map_or("no limit".into(), |m| format!("{m} MiB")),
                s.milli_cpu
                    .map_or("no limit".into(), |m| format!("{}", m as f64 / 1000.0)),
                s.pids.map_or("no limit".into(), |p| p.to_string())
            );
            println!(
                "  user {}, read-only root {}, capabilities added {}",
                s.user,
                if s.read_only { "yes" } else { "no" },
                if s.cap_add.is_empty() {
                    "none".to_string()
                } else {
                    s.cap_add.join(",")
                }
            );
            println!(
                "  size: workspace {}, written in the container {} (root filesystem {} with the image)",
                size(f.workspace_bytes.map(|b| b as i64)),
                size(f.size_rw),
                size(f.size_root_fs)
            );
            println!("  volumes {}", f.volumes.join(", "));
        }
    }
    match &d.record {
        Some(spec) => print_record(spec),
        None => println!(
            "  not on record: an orphan of this installation; `berth sandbox rm {} -b docker` removes it",
            a.name
        ),
    }
    if !d.differences.is_empty() {
        println!("  the container differs from the record:");
        for x in &d.differences {
            println!("    {x}");
        }
    }
    Ok(0)
}
