//! What berth asks a cluster for: the objects of one sandbox, as JSON.
//!
//! - The pod: berth's defaults a cluster admin would accept (not root,
//!   every capability dropped, `RuntimeDefault` seccomp, no privilege
//!   escalation, no service account token), limits from the spec, the
//!   RuntimeClass from `--opt runtime_class=`.
//! - Two claims that outlive the pod: the workspace and berth's directory.
//! - A NetworkPolicy denying all egress unless the network is on.
//! - Where agent-sandbox is installed, a `Sandbox` holding the pod as its
//!   template and the claims as its `volumeClaimTemplates`.

use std::collections::BTreeMap;

use berth_core::backend::{Network, SandboxSpec};
use berth_core::error::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{
    ANNOTATION_NAME, ANNOTATION_SETTINGS, BERTH_DIR, CONTAINER, LABEL_INSTALLATION, LABEL_MANAGED,
    LABEL_SANDBOX, WORKDIR,
};

/// agent-sandbox's API group.
pub const SANDBOX_GROUP: &str = "agents.x-k8s.io";
/// Its version berth speaks.
pub const SANDBOX_VERSION: &str = "v1alpha1";
/// The claim template (and volume) holding the workspace.
pub const WORKSPACE_VOLUME: &str = "workspace";
/// The claim template (and volume) holding berth's directory.
pub const BERTH_VOLUME: &str = "berth";
/// The uid and gid the sandbox's processes run as (berth's image's user).
pub const SANDBOX_UID: i64 = 1000;
/// The size asked for the workspace claim.
const WORKSPACE_SIZE: &str = "10Gi";
/// The size asked for berth's own claim (snapshots, job logs).
const BERTH_SIZE: &str = "1Gi";

/// The options a k8s sandbox takes (`--opt KEY=VALUE`).
pub const OPTIONS: &[&str] = &["context", "namespace", "runtime_class"];

/// The settings a sandbox is made with, kept on its object: another call
/// that asks for other ones is refused, never silently given these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The image.
    pub image: String,
    /// Whether egress is open (`--network on`); off otherwise.
    pub network: bool,
    /// Memory limit, MiB.
    pub memory_mb: Option<u64>,
    /// CPU limit, thousandths of a core.
    pub milli_cpu: Option<u64>,
    /// The RuntimeClass.
    pub runtime_class: Option<String>,
}

impl Settings {
    /// The settings `spec` asks for, with `image` when it names none.
    pub fn of(spec: &SandboxSpec, default_image: &str) -> Result<Settings> {
        for key in spec.options.keys() {
            if !OPTIONS.contains(&key.as_str()) {
                return Err(Error::InvalidInput(format!(
                    "k8s sandboxes take no option `{key}`; they take: {}",
                    OPTIONS.join(", ")
                )));
            }
        }
        let network = match &spec.network {
            Network::Off => false,
            Network::Open => true,
            Network::Allow(_) => {
                return Err(Error::Unsupported(
                    "`--network allow:` on k8s (berth's egress proxy is not put in a pod yet; use --network on or off)".into(),
                ));
            }
        };
        if spec.limits.pids.is_some() {
            return Err(Error::Unsupported(
                "`--pids` on k8s (Kubernetes bounds processes per node, with the kubelet's podPidsLimit, not per pod; ask the cluster's admin for one, or leave --pids out)".into(),
            ));
        }
        let runtime_class = spec.option("runtime_class").map(str::to_string);
        if let Some(rc) = &runtime_class
            && !dns_label(rc)
        {
            return Err(Error::InvalidInput(format!(
                "runtime_class {rc:?} is not a RuntimeClass name (lowercase letters, digits and '-', at most 63)"
            )));
        }
        Ok(Settings {
            image: spec
                .image
                .clone()
                .unwrap_or_else(|| default_image.to_string()),
            network,
            memory_mb: spec.limits.memory_mb,
            milli_cpu: spec.limits.milli_cpu,
            runtime_class,
        })
    }

    /// As kept in [`ANNOTATION_SETTINGS`].
    pub fn annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// What differs between these (asked) and `made`, for a person.
    pub fn differences(&self, made: &Settings) -> Vec<String> {
        let mut out = Vec::new();
        let mut diff = |what: &str, has: String, asked: String| {
            if has != asked {
                out.push(format!("{what}: the sandbox has {has}, asked {asked}"));
            }
        };
        diff("image", made.image.clone(), self.image.clone());
        let net = |on: bool| if on { "on" } else { "off" }.to_string();
        diff("network", net(made.network), net(self.network));
        let mb = |m: Option<u64>| m.map_or("no limit".into(), |m| format!("{m} MiB"));
        diff("memory", mb(made.memory_mb), mb(self.memory_mb));
        let cpu = |m: Option<u64>| m.map_or("no limit".into(), |m| format!("{m}m"));
        diff("cpus", cpu(made.milli_cpu), cpu(self.milli_cpu));
        let rc = |r: &Option<String>| r.clone().unwrap_or_else(|| "the default".into());
        diff(
            "runtime_class",
            rc(&made.runtime_class),
            rc(&self.runtime_class),
        );
        out
    }
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The object name of sandbox `name` of `installation`:
/// `berth-INSTALLATION-NAME`, a DNS label. A name Kubernetes would not take
/// as it is (capitals, `_`, `.`, too long) is folded to one it takes, with
/// a hash of the original so two names never fold into one.
pub fn object_name(installation: &str, name: &str) -> String {
    const MAX_SLUG: usize = 63 - "berth-".len() - 10 - 1;
    let folded: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let slug = if folded == name && folded.len() <= MAX_SLUG && !folded.ends_with('-') {
        folded
    } else {
        let hash: String = Sha256::digest(name.as_bytes())
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect();
        let keep = folded
            .chars()
            .take(MAX_SLUG - hash.len() - 1)
            .collect::<String>();
        format!("{}-{hash}", keep.trim_end_matches('-'))
    };
    format!("berth-{installation}-{}", slug.trim_start_matches('-'))
}

/// The claim of `volume` ([`WORKSPACE_VOLUME`], [`BERTH_VOLUME`]) of the
/// sandbox whose object is `object`: `VOLUME-OBJECT`, as agent-sandbox
/// names the claims of a `Sandbox`'s templates.
pub fn claim_name(volume: &str, object: &str) -> String {
    format!("{volume}-{object}")
}

/// The labels of every object of the sandbox.
pub fn labels(installation: &str, object: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_INSTALLATION.to_string(), installation.to_string()),
        (LABEL_SANDBOX.to_string(), object.to_string()),
    ])
}

/// The annotations of the sandbox's main object (pod or `Sandbox`).
pub fn annotations(name: &str, settings: &Settings) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANNOTATION_NAME.to_string(), name.to_string()),
        (ANNOTATION_SETTINGS.to_string(), settings.annotation()),
    ])
}

/// The pod's spec. `claims`: mount the claims berth made (a plain pod);
/// a `Sandbox`'s controller adds its templates' volumes itself.
pub fn pod_spec(settings: &Settings, object: &str, claims: bool) -> Value {
    let mut limits = serde_json::Map::new();
    if let Some(mb) = settings.memory_mb {
        limits.insert("memory".into(), json!(format!("{mb}Mi")));
    }
    if let Some(m) = settings.milli_cpu {
        limits.insert("cpu".into(), json!(format!("{m}m")));
    }
    let mut spec = json!({
        "restartPolicy": "Always",
        // The sandbox has no business with the cluster's API.
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "fsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": CONTAINER,
            "image": settings.image,
            "imagePullPolicy": "IfNotPresent",
            // Waits for execs; tini (berth's image has it) reaps what they
            // leave behind.
            "command": ["sh", "-c", "if [ -x /usr/bin/tini ]; then exec /usr/bin/tini -- sleep infinity; fi; exec sleep infinity"],
            "workingDir": WORKDIR,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "privileged": false,
                "capabilities": {"drop": ["ALL"]},
            },
            "resources": {"limits": limits.clone(), "requests": limits},
            "volumeMounts": [
                {"name": WORKSPACE_VOLUME, "mountPath": WORKDIR},
                {"name": BERTH_VOLUME, "mountPath": BERTH_DIR},
            ],
        }],
    });
    if let Some(rc) = &settings.runtime_class {
        spec["runtimeClassName"] = json!(rc);
    }
    if claims {
        let volumes: Vec<Value> = [WORKSPACE_VOLUME, BERTH_VOLUME]
            .iter()
            .map(|v| json!({"name": v, "persistentVolumeClaim": {"claimName": claim_name(v, object)}}))
            .collect();
        spec["volumes"] = json!(volumes);
    }
    spec
}

fn claim_spec(volume: &str) -> Value {
    let size = if volume == WORKSPACE_VOLUME {
        WORKSPACE_SIZE
    } else {
        BERTH_SIZE
    };
    json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    })
}

/// A plain pod (no agent-sandbox).
pub fn pod(
    object: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    settings: &Settings,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": object, "labels": labels, "annotations": annotations},
        "spec": pod_spec(settings, object, true),
    })
}

/// One of the plain pod's claims, of sandbox `name`.
pub fn claim(volume: &str, object: &str, labels: &BTreeMap<String, String>, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(volume, object),
            "labels": labels,
            "annotations": {ANNOTATION_NAME: name},
        },
        "spec": claim_spec(volume),
    })
}

/// An agent-sandbox `Sandbox`: the pod as its template, the claims as its
/// `volumeClaimTemplates`.
pub fn sandbox(
    object: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    settings: &Settings,
) -> Value {
    let templates: Vec<Value> = [WORKSPACE_VOLUME, BERTH_VOLUME]
        .iter()
        .map(|v| json!({"metadata": {"name": v, "labels": labels}, "spec": claim_spec(v)}))
        .collect();
    json!({
        "apiVersion": format!("{SANDBOX_GROUP}/{SANDBOX_VERSION}"),
        "kind": "Sandbox",
        "metadata": {"name": object, "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "podTemplate": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec(settings, object, false),
            },
            "volumeClaimTemplates": templates,
        },
    })
}

/// The NetworkPolicy that leaves the sandbox's pod no egress at all (DNS
/// included).
pub fn deny_egress(object: &str, labels: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": deny_egress_name(object), "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SANDBOX: object}},
            "policyTypes": ["Egress"],
        },
    })
}

/// The deny-egress policy's name.
pub fn deny_egress_name(object: &str) -> String {
    format!("{object}-deny-egress")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_fold_into_dns_labels_without_colliding() {
        assert_eq!(object_name("0123456789", "web"), "berth-0123456789-web");
        let a = object_name("0123456789", "My_Box");
        let b = object_name("0123456789", "my-box");
        assert_ne!(a, b);
        assert!(a.starts_with("berth-0123456789-my-box-"), "{a}");
        let long = object_name("0123456789", &"x".repeat(63));
        assert!(long.len() <= 63, "{long}");
        for n in [
            a,
            long,
            object_name("0123456789", "a.b."),
            object_name("0123456789", "_x"),
        ] {
            assert!(dns_label(&n), "{n}");
        }
    }

    #[test]
    fn the_pod_runs_as_a_cluster_admin_would_accept() {
        let mut spec = SandboxSpec::named("s");
        spec.limits.memory_mb = Some(512);
        spec.limits.milli_cpu = Some(1500);
        spec.options.insert("runtime_class".into(), "gvisor".into());
        let s = Settings::of(&spec, "img").unwrap();
        let p = pod_spec(&s, "obj", true);
        assert_eq!(p["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            p["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(p["automountServiceAccountToken"], false);
        assert_eq!(p["runtimeClassName"], "gvisor");
        let c = &p["containers"][0];
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(
            c["resources"]["limits"],
            json!({"memory": "512Mi", "cpu": "1500m"})
        );
        assert_eq!(
            p["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "workspace-obj"
        );

        spec.limits.pids = Some(10);
        assert!(Settings::of(&spec, "img").is_err());
        spec.limits.pids = None;
        spec.options
            .insert("runtime_class".into(), "Bad_Name".into());
        assert!(Settings::of(&spec, "img").is_err());
        spec.options.clear();
        spec.options.insert("read_only".into(), "1".into());
        let e = Settings::of(&spec, "img").unwrap_err().to_string();
        assert!(e.contains("runtime_class"), "{e}");
    }
}
