//! agent-sandbox's controller for `Sandbox` (agents.x-k8s.io/v1alpha1), as
//! its API reference describes it:
//! - one pod per sandbox, named as the sandbox, from `spec.podTemplate`,
//!   owned by the sandbox and labelled `agents.x-k8s.io/sandbox-name-hash`;
//! - a claim per `spec.volumeClaimTemplates` entry, named
//!   `TEMPLATE-SANDBOX`, mounted as the volume `TEMPLATE`, and kept while
//!   the sandbox lives (a pod that goes and comes back finds its data);
//! - `spec.replicas: 0` removes the pod and keeps the claims (suspend), 1
//!   brings it back (resume);
//! - a pod evicted, deleted or lost with its node is recreated;
//! - `status`: `replicas`, `selector`, `podIPs`, and a `Ready` condition
//!   that follows the pod's.
//!
//! And its extensions (extensions.agents.x-k8s.io/v1alpha1):
//! - `SandboxWarmPool` keeps `spec.replicas` sandboxes made from its
//!   `sandboxTemplateRef`, owned by the pool, named `POOL-xxxxx`;
//! - `SandboxClaim` adopts a ready sandbox of a pool made from its template
//!   (its `warmpool` policy: `default` any such pool, `none` never, or one
//!   pool by name): the sandbox's owner becomes the claim and the pool
//!   makes a replacement. With none to adopt it makes a sandbox named as
//!   the claim. `status.sandbox.name` names the sandbox either way.
//!
//! It runs as a real controller does: it reads the change log and
//! reconciles what each change concerns.

use std::sync::{Arc, Weak};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::K8s;
use super::resources::{self, AGENTS};
use super::store::Change;

/// The label that selects a sandbox's pod.
pub const NAME_HASH: &str = "agents.x-k8s.io/sandbox-name-hash";

/// FNV-1a of the name, as hex: a label value for any name length.
pub fn name_hash(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// The sandbox a pod belongs to, if any.
fn owner_sandbox(pod: &Value) -> Option<String> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["kind"] == "Sandbox" && o["controller"] == json!(true))
        .and_then(|o| o["name"].as_str().map(str::to_string))
}

pub async fn run(k: Weak<K8s>, mut changes: broadcast::Receiver<Change>) {
    loop {
        let change = match changes.recv().await {
            Ok(c) => Some(c),
            // Too far behind: reconcile everything.
            Err(broadcast::error::RecvError::Lagged(_)) => None,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let Some(k) = k.upgrade() else { return };
        if !k.with_crds {
            continue;
        }
        match change {
            Some(c) => handle(&k, &c).await,
            None => {
                let (all, _) = k.store.list(resources::sandboxes(), None);
                for sb in all {
                    let ns = sb["metadata"]["namespace"].as_str().unwrap_or("");
                    let name = sb["metadata"]["name"].as_str().unwrap_or("");
                    reconcile(&k, ns, name).await;
                }
            }
        }
    }
}

async fn handle(k: &Arc<K8s>, c: &Change) {
    let name = c.object["metadata"]["name"].as_str().unwrap_or("");
    let extension = [
        resources::warm_pools().id,
        resources::sandbox_claims().id,
        resources::sandbox_templates().id,
    ]
    .contains(&c.resource);
    if c.kind == "DELETED" && extension {
        let uid = c.object["metadata"]["uid"].as_str().unwrap_or("");
        collect_owned(k, &c.namespace, uid).await;
    }
    if extension || c.resource == resources::sandboxes().id {
        reconcile_extensions(k, &c.namespace).await;
    }
    if c.resource == resources::sandboxes().id {
        if c.kind == "DELETED" {
            let uid = c.object["metadata"]["uid"].as_str().unwrap_or("");
            collect_owned(k, &c.namespace, uid).await;
        } else {
            reconcile(k, &c.namespace, name).await;
        }
    } else if c.resource == resources::pods().id
        && let Some(owner) = owner_sandbox(&c.object)
    {
        reconcile(k, &c.namespace, &owner).await;
    }
}

/// Delete what a deleted sandbox owned: its pod and its claims.
async fn collect_owned(k: &Arc<K8s>, ns: &str, uid: &str) {
    for r in [resources::sandboxes(), resources::pods(), resources::pvcs()] {
        let (items, _) = k.store.list(r, Some(ns));
        for o in items {
            let owned = o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|x| x["uid"] == uid));
            if owned {
                let name = o["metadata"]["name"].as_str().unwrap_or("");
                let _ = k.delete(r, ns, name).await;
            }
        }
    }
}

async fn reconcile(k: &Arc<K8s>, ns: &str, name: &str) {
    let Ok(sb) = k.store.get(resources::sandboxes(), ns, name) else {
        return;
    };
    let uid = sb["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let owner = json!([{
        "apiVersion": format!("{AGENTS}/v1alpha1"), "kind": "Sandbox", "name": name,
        "uid": uid, "controller": true, "blockOwnerDeletion": true,
    }]);
    let replicas = sb["spec"]["replicas"].as_i64().unwrap_or(1);
    let templates = sb["spec"]["volumeClaimTemplates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut claim_volumes = Vec::new();
    for t in &templates {
        let tname = t["metadata"]["name"].as_str().unwrap_or("data");
        let claim = format!("{tname}-{name}");
        if k.store.get(resources::pvcs(), ns, &claim).is_err() {
            let mut pvc = json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "labels": t["metadata"]["labels"], "ownerReferences": owner},
                "spec": t["spec"],
            });
            if k.admit(resources::pvcs(), ns, &mut pvc).is_ok() {
                let _ = k.store.create(resources::pvcs(), ns, pvc);
            }
        }
        claim_volumes.push(json!({"name": tname, "persistentVolumeClaim": {"claimName": claim}}));
    }
    let hash = name_hash(name);
    let pod = k.store.get(resources::pods(), ns, name).ok();
    let pod = match (replicas, pod) {
        (0, Some(_)) => {
            let _ = k.delete(resources::pods(), ns, name).await;
            None
        }
        (0, None) => None,
        (_, Some(p)) => Some(p),
        (_, None) => {
            let template = &sb["spec"]["podTemplate"];
            let mut labels = template["metadata"]["labels"].clone();
            if !labels.is_object() {
                labels = json!({});
            }
            labels[NAME_HASH] = json!(hash);
            let mut spec = template["spec"].clone();
            let mut volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
            for v in &claim_volumes {
                if !volumes.iter().any(|x| x["name"] == v["name"]) {
                    volumes.push(v.clone());
                }
            }
            spec["volumes"] = json!(volumes);
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "labels": labels,
                    "annotations": template["metadata"]["annotations"],
                    "ownerReferences": owner,
                },
                "spec": spec,
            });
            if k.admit(resources::pods(), ns, &mut pod).is_err() {
                return;
            }
            match k.store.create(resources::pods(), ns, pod) {
                Ok(made) => {
                    k.run_pod(&made);
                    Some(made)
                }
                Err(_) => None,
            }
        }
    };
    let ready = pod.as_ref().is_some_and(|p| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    });
    let ips: Vec<Value> = pod
        .as_ref()
        .and_then(|p| p["status"]["podIP"].as_str().map(|ip| json!(ip)))
        .into_iter()
        .collect();
    let _ = k.store.update(resources::sandboxes(), ns, name, |s| {
        let cond_was = s["status"]["conditions"][0].clone();
        let status_now = if ready { "True" } else { "False" };
        let cond = if cond_was["status"] == status_now {
            cond_was
        } else {
            json!({
                "type": "Ready", "status": status_now,
                "reason": if ready { "DependenciesReady" } else if replicas == 0 { "Suspended" } else { "DependenciesNotReady" },
                "message": if ready { "Pod is Ready" } else if replicas == 0 { "replicas is 0" } else { "Pod is not Ready" },
                "lastTransitionTime": crate::e2b::rfc3339(crate::e2b::sandbox::now_unix()),
                "observedGeneration": s["metadata"]["generation"],
            })
        };
        s["status"] = json!({
            "replicas": if pod.is_some() { 1 } else { 0 },
            "selector": format!("{NAME_HASH}={hash}"),
            "podIPs": ips,
            "conditions": [cond],
        });
        Ok(())
    });
}

fn owner_ref(obj: &Value, kind: &str) -> Value {
    json!([{
        "apiVersion": obj["apiVersion"], "kind": kind,
        "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    }])
}

/// The uid of the controller that owns `obj`, if it is of `kind`.
fn owner_uid<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["kind"] == kind && o["controller"] == json!(true))
        .and_then(|o| o["uid"].as_str())
}

fn is_ready(sandbox: &Value) -> bool {
    sandbox["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A new sandbox from `template`, owned by `owner`.
fn sandbox_from(template: &Value, name: Value, owner: Value) -> Value {
    let mut meta = json!({"ownerReferences": owner});
    match name {
        Value::String(n) if n.ends_with('-') => meta["generateName"] = json!(n),
        n => meta["name"] = n,
    }
    json!({
        "apiVersion": format!("{AGENTS}/v1alpha1"), "kind": "Sandbox",
        "metadata": meta,
        "spec": {
            "podTemplate": template["spec"]["podTemplate"],
            "volumeClaimTemplates": template["spec"]["volumeClaimTemplates"],
        },
    })
}

/// Every warm pool and claim of namespace `ns`, brought to its spec.
async fn reconcile_extensions(k: &Arc<K8s>, ns: &str) {
    let (pools, _) = k.store.list(resources::warm_pools(), Some(ns));
    let (claims, _) = k.store.list(resources::sandbox_claims(), Some(ns));
    for claim in &claims {
        reconcile_claim(k, ns, claim, &pools);
    }
    for pool in &pools {
        reconcile_pool(k, ns, pool).await;
    }
}

async fn reconcile_pool(k: &Arc<K8s>, ns: &str, pool: &Value) {
    let name = pool["metadata"]["name"].as_str().unwrap_or("");
    let uid = pool["metadata"]["uid"].as_str().unwrap_or("");
    let want = pool["spec"]["replicas"].as_u64().unwrap_or(0) as usize;
    let (all, _) = k.store.list(resources::sandboxes(), Some(ns));
    let mut members: Vec<&Value> = all
        .iter()
        .filter(|s| owner_uid(s, "SandboxWarmPool") == Some(uid))
        .collect();
    let template_name = pool["spec"]["sandboxTemplateRef"]["name"]
        .as_str()
        .unwrap_or("");
    if members.len() < want
        && let Ok(template) = k
            .store
            .get(resources::sandbox_templates(), ns, template_name)
    {
        for _ in members.len()..want {
            let mut sb = sandbox_from(
                &template,
                json!(format!("{name}-")),
                owner_ref(pool, "SandboxWarmPool"),
            );
            if k.admit(resources::sandboxes(), ns, &mut sb).is_ok() {
                let _ = k.store.create(resources::sandboxes(), ns, sb);
            }
        }
    }
    // Too many: the newest go first.
    members.sort_by_key(|s| {
        std::cmp::Reverse(
            s["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    });
    for extra in members.iter().take(members.len().saturating_sub(want)) {
        let n = extra["metadata"]["name"].as_str().unwrap_or("");
        let _ = k.delete(resources::sandboxes(), ns, n).await;
    }
    let (all, _) = k.store.list(resources::sandboxes(), Some(ns));
    let members: Vec<&Value> = all
        .iter()
        .filter(|s| owner_uid(s, "SandboxWarmPool") == Some(uid))
        .collect();
    let ready = members.iter().filter(|s| is_ready(s)).count();
    let _ = k.store.update(resources::warm_pools(), ns, name, |p| {
        p["status"] = json!({"replicas": members.len(), "readyReplicas": ready});
        Ok(())
    });
}

fn reconcile_claim(k: &Arc<K8s>, ns: &str, claim: &Value, pools: &[Value]) {
    let name = claim["metadata"]["name"].as_str().unwrap_or("");
    let uid = claim["metadata"]["uid"].as_str().unwrap_or("");
    let (all, _) = k.store.list(resources::sandboxes(), Some(ns));
    let mine = all
        .iter()
        .find(|s| owner_uid(s, "SandboxClaim") == Some(uid));
    let sandbox = match mine {
        Some(s) => Some(s.clone()),
        None => {
            let template_name = claim["spec"]["sandboxTemplateRef"]["name"]
                .as_str()
                .unwrap_or("");
            let policy = claim["spec"]["warmpool"].as_str().unwrap_or("default");
            let from_pools: Vec<&str> = pools
                .iter()
                .filter(|p| p["spec"]["sandboxTemplateRef"]["name"] == template_name)
                .filter(|p| policy == "default" || p["metadata"]["name"] == policy)
                .filter_map(|p| p["metadata"]["uid"].as_str())
                .collect();
            let mut candidates: Vec<&Value> = if policy == "none" {
                Vec::new()
            } else {
                all.iter()
                    .filter(|s| {
                        owner_uid(s, "SandboxWarmPool").is_some_and(|u| from_pools.contains(&u))
                    })
                    .collect()
            };
            // Ready first, then the oldest.
            candidates.sort_by_key(|s| {
                (
                    !is_ready(s),
                    s["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            });
            match candidates.first() {
                Some(s) => {
                    let sname = s["metadata"]["name"].as_str().unwrap_or("");
                    k.store
                        .update(resources::sandboxes(), ns, sname, |sb| {
                            sb["metadata"]["ownerReferences"] = owner_ref(claim, "SandboxClaim");
                            Ok(())
                        })
                        .ok()
                }
                None => match k
                    .store
                    .get(resources::sandbox_templates(), ns, template_name)
                {
                    Ok(template) => {
                        let mut sb =
                            sandbox_from(&template, json!(name), owner_ref(claim, "SandboxClaim"));
                        if k.admit(resources::sandboxes(), ns, &mut sb).is_ok() {
                            k.store.create(resources::sandboxes(), ns, sb).ok()
                        } else {
                            None
                        }
                    }
                    Err(_) => None,
                },
            }
        }
    };
    let _ = k.store.update(resources::sandbox_claims(), ns, name, |c| {
        c["status"] = match &sandbox {
            Some(s) => json!({
                "sandbox": {"name": s["metadata"]["name"], "podIPs": s["status"]["podIPs"]},
                "conditions": [{
                    "type": "Ready",
                    "status": if is_ready(s) { "True" } else { "False" },
                    "reason": if is_ready(s) { "SandboxReady" } else { "SandboxNotReady" },
                    "message": "",
                }],
            }),
            None => json!({"conditions": [{
                "type": "Ready", "status": "False", "reason": "TemplateNotFound",
                "message": format!("SandboxTemplate {:?} not found", claim["spec"]["sandboxTemplateRef"]["name"]),
            }]}),
        };
        Ok(())
    });
}
