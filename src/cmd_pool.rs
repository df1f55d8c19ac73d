//! `berth pool create|ls|fill|rm`: warm pools, a client of the typed API's
//! `Sandboxes` service (`CreatePool`, `Pools`, `FillPool`, `RemovePool`).

use std::path::Path;

use anyhow::Result;
use berth_service::convert;
use berth_service::proto;
use berth_service::proto::sandboxes_client::SandboxesClient;
use berth_service::proto::sandboxes_server::Sandboxes;
use serde_json::{Value, json};

use crate::api_args::pool::{PoolCmd, PoolCreateArgs};
use crate::api_client::{Api, call};
use crate::{context, server};

/// Run a pool subcommand against the state dir `dir`.
pub async fn run(dir: &Path, mode: server::Mode, cmd: PoolCmd) -> Result<u8> {
    let api = Api::open(dir, mode).await?;
    let r = run_with(&api, cmd).await;
    api.close().await;
    r
}

async fn run_with(api: &Api, cmd: PoolCmd) -> Result<u8> {
    match cmd {
        PoolCmd::Create(a) => create(api, *a).await,
        PoolCmd::Ls(a) => {
            let got = call!(api, SandboxesClient, Sandboxes, pools, proto::ListPools {})?;
            if a.json {
                let v: Vec<Value> = got.pools.iter().map(pool_json).collect();
                context::print_json(&json!(v));
                return Ok(0);
            }
            if got.pools.is_empty() {
                println!(
                    "no pools; make one with `berth pool create NAME --backend docker --size 2`"
                );
                return Ok(0);
            }
            println!(
                "{:<20} {:<8} {:>5} {:>5} {:>6}  SETTINGS",
                "NAME", "BACKEND", "SIZE", "READY", "MAKING"
            );
            for p in &got.pools {
                println!(
                    "{:<20} {:<8} {:>5} {:>5} {:>6}  {}",
                    p.name,
                    backend_of(p),
                    p.size,
                    p.ready,
                    p.making,
                    settings_text(p)
                );
            }
            Ok(0)
        }
        PoolCmd::Fill(a) => {
            let req = proto::PoolRef {
                name: a.name.clone(),
            };
            let p = call!(api, SandboxesClient, Sandboxes, fill_pool, req)?;
            if a.json {
                context::print_json(&pool_json(&p));
            } else {
                println!("pool {}: {} of {} ready", p.name, p.ready, p.size);
            }
            Ok(0)
        }
        PoolCmd::Rm(a) => {
            let req = proto::PoolRef {
                name: a.name.clone(),
            };
            let got = call!(api, SandboxesClient, Sandboxes, remove_pool, req)?;
            if a.json {
                context::print_json(&json!({ "removed": a.name, "members": got.members }));
            } else {
                println!(
                    "removed pool {} and {} sandbox{} not yet taken",
                    a.name,
                    got.members.len(),
                    if got.members.len() == 1 { "" } else { "es" }
                );
            }
            Ok(0)
        }
    }
}

async fn create(api: &Api, a: PoolCreateArgs) -> Result<u8> {
    let settings = crate::cmd_sandbox::settings_request(a.backend, &a.settings)?;
    if !a.no_wait && !a.json {
        eprintln!(
            "making {} sandbox{} on {} for pool {}…",
            a.size,
            if a.size == 1 { "" } else { "es" },
            a.backend,
            a.name
        );
    }
    let req = proto::CreatePoolRequest {
        name: a.name.clone(),
        size: a.size,
        settings: Some(settings),
        wait: !a.no_wait || matches!(api, Api::Here(_)),
    };
    let p = call!(api, SandboxesClient, Sandboxes, create_pool, req)?;
    if a.json {
        context::print_json(&pool_json(&p));
    } else {
        println!(
            "pool {} ({}): {} of {} ready; take one with `berth sandbox create NAME --from-pool {}`",
            p.name,
            backend_of(&p),
            p.ready,
            p.size,
            p.name
        );
    }
    Ok(0)
}

fn backend_of(p: &proto::Pool) -> berth_core::backend::BackendKind {
    convert::place(Some(proto::SandboxRef {
        backend: p.backend,
        name: String::new(),
    }))
    .0
}

/// The settings a pool makes its sandboxes with, in a few words.
fn settings_text(p: &proto::Pool) -> String {
    let mut out = vec![format!("network {}", if p.network { "on" } else { "off" })];
    if let Some(i) = &p.image {
        out.push(format!("image {i}"));
    }
    if let Some(m) = p.memory_mb {
        out.push(format!("{m} MiB"));
    }
    if let Some(c) = p.milli_cpu {
        out.push(format!("{} cpus", c as f64 / 1000.0));
    }
    if let Some(n) = p.pids {
        out.push(format!("{n} pids"));
    }
    let mut opts: Vec<_> = p.options.iter().collect();
    opts.sort();
    out.extend(opts.into_iter().map(|(k, v)| format!("{k}={v}")));
    out.join(", ")
}

fn pool_json(p: &proto::Pool) -> Value {
    json!({
        "name": p.name,
        "backend": backend_of(p),
        "size": p.size,
        "ready": p.ready,
        "making": p.making,
        "image": p.image,
        "network": p.network,
        "memory_mb": p.memory_mb,
        "milli_cpu": p.milli_cpu,
        "pids": p.pids,
        "options": p.options,
        "created_at_ms": p.created_at_ms,
    })
}
