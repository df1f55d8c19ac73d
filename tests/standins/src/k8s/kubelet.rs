//! The simulated nodes' kubelet: each pod really runs, as a container on the
//! local Docker engine.
//!
//! - Scheduling picks a Ready, schedulable node with the fewest pods (or the
//!   pod's own `spec.nodeName`).
//! - The pod's first container becomes the Docker container: `command` the
//!   entrypoint, `args` the command, `env`, `workingDir`, the security
//!   context (`runAsUser`/`runAsGroup`, `runAsNonRoot` checked against the
//!   image's user as the kubelet checks it, capabilities, `privileged`,
//!   `readOnlyRootFilesystem`, seccomp `Unconfined`), memory and CPU limits,
//!   and its volumes: `emptyDir` (gone with the pod) and
//!   `persistentVolumeClaim` (a Docker volume that outlives every pod).
//! - A NetworkPolicy that selects the pod and names `Egress` with no egress
//!   rule denies all egress: the container gets no network. Egress rules
//!   that allow something leave the network open (they are not filtered).
//! - The pod's status follows the container: Running with its IP, restarts
//!   under `restartPolicy`, Succeeded or Failed when it ends for good.

use std::collections::HashMap;
use std::sync::Arc;

use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, RemoveContainerOptions, RemoveVolumeOptions, WaitContainerOptions,
};
use futures::StreamExt;
use serde_json::{Value, json};
use tracing::debug;

use super::K8s;
use super::resources;
use super::select::label_selector_selects;
use super::store::{ApiError, ApiResult};

/// The label every container and volume of one stand-in carries.
pub const LABEL: &str = "io.berth.k8s-standin";

fn now() -> String {
    crate::e2b::rfc3339(crate::e2b::sandbox::now_unix())
}

/// A quantity in bytes: `512Mi`, `1Gi`, `500M`, `1e9`, `1048576`.
pub fn bytes_of(q: &str) -> Option<i64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e')
        .unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return None,
    };
    Some((n * mult) as i64)
}

/// A CPU quantity in nano-CPUs: `500m`, `2`, `0.5`.
pub fn nano_cpus_of(q: &str) -> Option<i64> {
    let q = q.trim();
    match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok().map(|m| (m * 1e6) as i64),
        None => q.parse::<f64>().ok().map(|c| (c * 1e9) as i64),
    }
}

/// The container of a pod as the stand-in's Docker sees it.
pub fn container_id(pod: &Value) -> Option<String> {
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("docker://"))
        .map(str::to_string)
}

impl K8s {
    /// Docker's name for a volume of this stand-in.
    fn volume_name(&self, what: &str) -> String {
        format!("k8s-standin-{}-{what}", self.instance)
    }

    /// Docker's volume for claim `claim` in `ns`.
    pub fn claim_volume(&self, ns: &str, claim: &str) -> String {
        self.volume_name(&format!("pvc-{ns}-{claim}"))
    }

    /// Check a pod before it is stored, as admission does.
    pub(super) fn admit_pod(&self, pod: &mut Value) -> ApiResult<()> {
        let containers = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
        if containers == 0 {
            return Err(ApiError::invalid(
                "Pod is invalid: spec.containers: Required value",
            ));
        }
        if let Some(rc) = pod["spec"]["runtimeClassName"].as_str() {
            let classes = resources::by_id("runtimeclasses.node.k8s.io")
                .map(|r| self.store.get(r, "", rc).is_ok())
                .unwrap_or(false);
            if !classes {
                let name = pod["metadata"]["name"].as_str().unwrap_or("");
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "pods \"{name}\" is forbidden: pod rejected: RuntimeClass \"{rc}\" not found"
                    ),
                ));
            }
        }
        pod["status"] = json!({"phase": "Pending", "qosClass": "Burstable"});
        Ok(())
    }

    /// Start running a stored pod, in the background.
    pub(super) fn run_pod(self: &Arc<Self>, pod: &Value) {
        let k = self.clone();
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
        tokio::spawn(async move {
            if let Err(why) = k.start_pod(&ns, &name, &uid).await {
                debug!(%ns, %name, %why, "pod did not start");
            }
        });
    }

    /// Change the status of pod `ns/name` if it is still the one of `uid`.
    fn pod_status(&self, ns: &str, name: &str, uid: &str, f: impl FnOnce(&mut Value)) -> bool {
        self.store
            .update(resources::pods(), ns, name, |p| {
                if p["metadata"]["uid"].as_str() != Some(uid) {
                    return Err(ApiError::new(409, "Conflict", "replaced"));
                }
                f(p);
                Ok(())
            })
            .is_ok()
    }

    fn schedule(&self, pod: &Value) -> Option<String> {
        if let Some(n) = pod["spec"]["nodeName"].as_str() {
            return Some(n.to_string());
        }
        let (nodes, _) = self.store.list(resources::nodes(), None);
        let (pods, _) = self.store.list(resources::pods(), None);
        let mut load: HashMap<String, usize> = HashMap::new();
        for p in &pods {
            if let Some(n) = p["spec"]["nodeName"].as_str() {
                *load.entry(n.to_string()).or_default() += 1;
            }
        }
        nodes
            .iter()
            .filter(|n| n["spec"]["unschedulable"] != json!(true) && node_ready(n))
            .filter_map(|n| n["metadata"]["name"].as_str())
            .min_by_key(|n| (load.get(*n).copied().unwrap_or(0), n.to_string()))
            .map(str::to_string)
    }

    /// Whether a NetworkPolicy in `ns` denies this pod all egress.
    fn egress_denied(&self, ns: &str, pod: &Value) -> bool {
        let (policies, _) = self.store.list(resources::network_policies(), Some(ns));
        policies.iter().any(|p| {
            let spec = &p["spec"];
            let egress_type = spec["policyTypes"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == "Egress"));
            let no_rule = spec["egress"].as_array().is_none_or(Vec::is_empty);
            egress_type && no_rule && label_selector_selects(&spec["podSelector"], pod)
        })
    }

    async fn start_pod(&self, ns: &str, name: &str, uid: &str) -> Result<(), String> {
        let pod = self
            .store
            .get(resources::pods(), ns, name)
            .map_err(|e| e.message)?;
        let Some(node) = self.schedule(&pod) else {
            self.pod_status(ns, name, uid, |p| {
                p["status"]["conditions"] = json!([{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available: no node is ready and schedulable.",
                    "lastTransitionTime": now(),
                }]);
            });
            return Err("no node".into());
        };
        let ip = self.next_pod_ip();
        let host_ip = node_ip(&self.store, &node);
        self.pod_status(ns, name, uid, |p| {
            p["spec"]["nodeName"] = json!(node);
            p["status"]["conditions"] = json!([
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
            ]);
            p["status"]["hostIP"] = json!(host_ip);
        });
        match self.create_container(ns, &pod).await {
            Ok(id) => {
                let c = &pod["spec"]["containers"][0];
                self.pod_status(ns, name, uid, |p| {
                    p["status"]["phase"] = json!("Running");
                    p["status"]["podIP"] = json!(ip);
                    p["status"]["podIPs"] = json!([{"ip": ip}]);
                    p["status"]["startTime"] = json!(now());
                    p["status"]["conditions"] = json!([
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now()},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now()},
                        {"type": "Ready", "status": "True", "lastTransitionTime": now()},
                    ]);
                    p["status"]["containerStatuses"] = json!([{
                        "name": c["name"], "image": c["image"], "imageID": "",
                        "containerID": format!("docker://{id}"),
                        "ready": true, "started": true, "restartCount": 0,
                        "state": {"running": {"startedAt": now()}},
                    }]);
                });
                self.follow(ns.to_string(), name.to_string(), uid.to_string(), id);
                Ok(())
            }
            Err((reason, message)) => {
                self.pod_status(ns, name, uid, |p| {
                    p["status"]["containerStatuses"] = json!([{
                        "name": pod["spec"]["containers"][0]["name"],
                        "image": pod["spec"]["containers"][0]["image"],
                        "ready": false, "started": false, "restartCount": 0,
                        "state": {"waiting": {"reason": reason, "message": message}},
                    }]);
                });
                Err(message)
            }
        }
    }

    /// Create and start the pod's container; a refusal is (reason, message)
    /// as the kubelet reports it in the container's waiting state.
    async fn create_container(
        &self,
        ns: &str,
        pod: &Value,
    ) -> Result<String, (&'static str, String)> {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
        let c = &pod["spec"]["containers"][0];
        let image = c["image"].as_str().unwrap_or("");
        let cname = c["name"].as_str().unwrap_or("");
        let image_info = self.docker.inspect_image(image).await.map_err(|e| {
            (
                "ErrImageNeverPull",
                format!("image {image:?} is not present on the stand-in's Docker engine and nothing can be pulled: {e}"),
            )
        })?;
        let psc = &pod["spec"]["securityContext"];
        let csc = &c["securityContext"];
        let pick = |field: &str| {
            if csc[field].is_null() {
                psc[field].clone()
            } else {
                csc[field].clone()
            }
        };
        let uid_num = pick("runAsUser").as_i64();
        let gid_num = pick("runAsGroup").as_i64();
        if pick("runAsNonRoot") == json!(true) {
            let image_user = image_info
                .config
                .as_ref()
                .and_then(|c| c.user.clone())
                .unwrap_or_default();
            let root = match uid_num {
                Some(u) => u == 0,
                None => matches!(image_user.split(':').next(), None | Some("" | "root" | "0")),
            };
            if root {
                return Err((
                    "CreateContainerConfigError",
                    format!(
                        "container has runAsNonRoot and image will run as root (pod: \"{name}_{ns}({uid})\", container: {cname})"
                    ),
                ));
            }
        }
        let user = match (uid_num, gid_num) {
            (Some(u), Some(g)) => Some(format!("{u}:{g}")),
            (Some(u), None) => Some(u.to_string()),
            _ => None,
        };
        let strings = |v: &Value| -> Option<Vec<String>> {
            v.as_array().map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
        };
        let mut binds = Vec::new();
        let mut doomed = Vec::new();
        let volumes = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
            let vname = m["name"].as_str().unwrap_or("");
            let Some(v) = volumes.iter().find(|v| v["name"] == vname) else {
                return Err((
                    "CreateContainerConfigError",
                    format!("the volume mount {vname:?} names no volume of the pod"),
                ));
            };
            let docker_volume = if let Some(claim) =
                v["persistentVolumeClaim"]["claimName"].as_str()
            {
                if self.store.get(resources::pvcs(), ns, claim).is_err() {
                    return Err((
                        "CreateContainerConfigError",
                        format!("persistentvolumeclaim \"{claim}\" not found"),
                    ));
                }
                self.claim_volume(ns, claim)
            } else if !v["emptyDir"].is_null() {
                let vol = self.volume_name(&format!("{uid}-{vname}"));
                doomed.push(vol.clone());
                vol
            } else {
                return Err((
                    "CreateContainerConfigError",
                    format!(
                        "volume {vname:?}: the stand-in mounts emptyDir and persistentVolumeClaim volumes only"
                    ),
                ));
            };
            let fs_group = psc["fsGroup"].as_i64();
            self.ensure_volume(&docker_volume, fs_group, image)
                .await
                .map_err(|e| ("CreateContainerConfigError", e))?;
            let path = m["mountPath"].as_str().unwrap_or("/");
            let ro = if m["readOnly"] == json!(true) {
                ":ro"
            } else {
                ""
            };
            binds.push(format!("{docker_volume}:{path}{ro}"));
        }
        let limits = &c["resources"]["limits"];
        let mut security_opt = Vec::new();
        if pick("seccompProfile")["type"] == json!("Unconfined") {
            security_opt.push("seccomp=unconfined".to_string());
        }
        if csc["allowPrivilegeEscalation"] == json!(false) {
            security_opt.push("no-new-privileges".to_string());
        }
        let runtime = match pod["spec"]["runtimeClassName"].as_str() {
            Some(rc) => resources::by_id("runtimeclasses.node.k8s.io")
                .and_then(|r| self.store.get(r, "", rc).ok())
                .and_then(|o| o["handler"].as_str().map(str::to_string)),
            None => None,
        };
        let env: Vec<String> = c["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        Some(format!(
                            "{}={}",
                            e["name"].as_str()?,
                            e["value"].as_str().unwrap_or("")
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut labels = HashMap::new();
        labels.insert(LABEL.to_string(), self.instance.clone());
        labels.insert(format!("{LABEL}.pod"), format!("{ns}/{name}"));
        labels.insert(format!("{LABEL}.uid"), uid.to_string());
        let host_config = HostConfig {
            binds: Some(binds),
            cap_drop: strings(&csc["capabilities"]["drop"]),
            cap_add: strings(&csc["capabilities"]["add"]),
            privileged: csc["privileged"].as_bool(),
            readonly_rootfs: csc["readOnlyRootFilesystem"].as_bool(),
            security_opt: (!security_opt.is_empty()).then_some(security_opt),
            memory: limits["memory"].as_str().and_then(bytes_of),
            nano_cpus: limits["cpu"].as_str().and_then(nano_cpus_of),
            network_mode: Some(
                if self.egress_denied(ns, pod) {
                    "none"
                } else {
                    "bridge"
                }
                .to_string(),
            ),
            runtime,
            init: Some(false),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            entrypoint: strings(&c["command"]),
            cmd: strings(&c["args"]),
            env: Some(env),
            working_dir: c["workingDir"].as_str().map(str::to_string),
            user,
            hostname: Some(name.chars().take(63).collect()),
            labels: Some(labels),
            tty: c["tty"].as_bool(),
            open_stdin: c["stdin"].as_bool(),
            host_config: Some(host_config),
            ..Default::default()
        };
        let short: String = uid.chars().take(8).collect();
        let opts = CreateContainerOptions {
            name: Some(format!("k8s-standin-{}-{ns}-{name}-{short}", self.instance)),
            ..Default::default()
        };
        let made = self
            .docker
            .create_container(Some(opts), body)
            .await
            .map_err(|e| ("CreateContainerError", e.to_string()))?;
        self.docker
            .start_container(&made.id, None)
            .await
            .map_err(|e| ("RunContainerError", e.to_string()))?;
        if !doomed.is_empty() {
            crate::e2b::sandbox::lock(&self.empty_dirs).insert(uid.to_string(), doomed);
        }
        Ok(made.id)
    }

    /// Make volume `name` unless it exists. A new one with an `fsGroup` is
    /// given to that group, setgid and group-writable, as the kubelet
    /// prepares a volume for a pod's `fsGroup` (here by a short-lived
    /// container of the pod's image, as root).
    async fn ensure_volume(
        &self,
        name: &str,
        fs_group: Option<i64>,
        image: &str,
    ) -> Result<(), String> {
        if self.docker.inspect_volume(name).await.is_ok() {
            return Ok(());
        }
        self.create_volume(name).await?;
        let Some(group) = fs_group else {
            return Ok(());
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            entrypoint: Some(vec!["sh".into(), "-c".into()]),
            cmd: Some(vec![format!("chgrp {group} /v && chmod 2775 /v")]),
            user: Some("0".into()),
            labels: Some(HashMap::from([(LABEL.to_string(), self.instance.clone())])),
            host_config: Some(HostConfig {
                binds: Some(vec![format!("{name}:/v")]),
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let made = self
            .docker
            .create_container(None::<CreateContainerOptions>, body)
            .await
            .map_err(|e| format!("preparing volume {name} for fsGroup {group}: {e}"))?;
        let started = self.docker.start_container(&made.id, None).await;
        let code = match started {
            Ok(()) => match self
                .docker
                .wait_container(&made.id, None::<WaitContainerOptions>)
                .next()
                .await
            {
                Some(Ok(r)) => r.status_code,
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
                _ => -1,
            },
            Err(_) => -1,
        };
        let _ = self
            .docker
            .remove_container(
                &made.id,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        if code != 0 {
            return Err(format!(
                "preparing volume {name} for fsGroup {group} failed (exit {code})"
            ));
        }
        Ok(())
    }

    async fn create_volume(&self, name: &str) -> Result<(), String> {
        let mut labels = HashMap::new();
        labels.insert(LABEL.to_string(), self.instance.clone());
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.to_string()),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| format!("creating volume {name}: {e}"))
    }

    /// Watch the pod's container; restart it or end the pod as its
    /// `restartPolicy` says when it exits.
    fn follow(&self, ns: String, name: String, uid: String, id: String) {
        let docker = self.docker.clone();
        let k = self.me();
        tokio::spawn(async move {
            loop {
                let mut wait = docker.wait_container(&id, None::<WaitContainerOptions>);
                let code = match wait.next().await {
                    Some(Ok(r)) => r.status_code,
                    Some(Err(bollard::errors::Error::DockerContainerWaitError {
                        code, ..
                    })) => code,
                    // The container is gone: the pod was deleted.
                    _ => return,
                };
                let Some(k) = k.upgrade() else { return };
                let Ok(pod) = k.store.get(resources::pods(), &ns, &name) else {
                    return;
                };
                if pod["metadata"]["uid"].as_str() != Some(uid.as_str()) {
                    return;
                }
                let policy = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always");
                let restart = policy == "Always" || (policy == "OnFailure" && code != 0);
                if restart && docker.start_container(&id, None).await.is_ok() {
                    k.pod_status(&ns, &name, &uid, |p| {
                        let s = &mut p["status"]["containerStatuses"][0];
                        s["restartCount"] = json!(s["restartCount"].as_i64().unwrap_or(0) + 1);
                        s["lastState"] =
                            json!({"terminated": {"exitCode": code, "finishedAt": now()}});
                        s["state"] = json!({"running": {"startedAt": now()}});
                    });
                    continue;
                }
                k.pod_status(&ns, &name, &uid, |p| {
                    p["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
                    let s = &mut p["status"]["containerStatuses"][0];
                    s["ready"] = json!(false);
                    s["state"] = json!({"terminated": {
                        "exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                        "finishedAt": now(),
                    }});
                    if let Some(conds) = p["status"]["conditions"].as_array_mut() {
                        for c in conds.iter_mut() {
                            if c["type"] == "Ready" || c["type"] == "ContainersReady" {
                                c["status"] = json!("False");
                            }
                        }
                    }
                });
                return;
            }
        });
    }

    /// Stop a pod's container and drop its emptyDir volumes.
    pub(super) async fn stop_pod(&self, pod: &Value) {
        if let Some(id) = container_id(pod) {
            let _ = self
                .docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptions {
                        force: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
        let doomed = crate::e2b::sandbox::lock(&self.empty_dirs).remove(uid);
        for v in doomed.unwrap_or_default() {
            let _ = self
                .docker
                .remove_volume(&v, None::<RemoveVolumeOptions>)
                .await;
        }
    }

    /// Remove claim `claim`'s volume (its PVC was deleted).
    pub(super) async fn drop_claim_volume(&self, ns: &str, claim: &str) {
        let _ = self
            .docker
            .remove_volume(&self.claim_volume(ns, claim), None::<RemoveVolumeOptions>)
            .await;
    }
}

pub fn node_ready(n: &Value) -> bool {
    n["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn node_ip(store: &super::store::Store, node: &str) -> String {
    store
        .get(resources::nodes(), "", node)
        .ok()
        .and_then(|n| {
            n["status"]["addresses"][0]["address"]
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_default()
}
