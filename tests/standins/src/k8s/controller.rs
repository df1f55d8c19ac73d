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
//! It runs as a real controller does: it reads the change log and
//! reconciles the sandbox each change concerns.

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
    for r in [resources::pods(), resources::pvcs()] {
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
