//! The resources the stand-in serves, and the discovery documents that name
//! them (`/api`, `/apis`, `/api/v1`, `/apis/GROUP/VERSION`): the legacy,
//! unaggregated form every client falls back to.

use serde_json::{Value, json};

/// One resource the server serves.
#[derive(Debug)]
pub struct Resource {
    /// The store's key: the plural, with the group after a dot.
    pub id: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short: &'static [&'static str],
    /// Subresources served (`status`, `exec`, `eviction`).
    pub subresources: &'static [(&'static str, &'static str)],
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The list's kind: `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The agent-sandbox groups (kubernetes-sigs/agent-sandbox).
pub const AGENTS: &str = "agents.x-k8s.io";
pub const EXTENSIONS: &str = "extensions.agents.x-k8s.io";

pub static RESOURCES: &[Resource] = &[
    Resource {
        id: "namespaces",
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
        subresources: &[("status", "Namespace")],
    },
    Resource {
        id: "nodes",
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short: &["no"],
        subresources: &[("status", "Node")],
    },
    Resource {
        id: "pods",
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short: &["po"],
        subresources: &[
            ("status", "Pod"),
            ("exec", "PodExecOptions"),
            ("eviction", "Eviction"),
        ],
    },
    Resource {
        id: "persistentvolumeclaims",
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        short: &["pvc"],
        subresources: &[("status", "PersistentVolumeClaim")],
    },
    Resource {
        id: "networkpolicies.networking.k8s.io",
        group: "networking.k8s.io",
        version: "v1",
        plural: "networkpolicies",
        singular: "networkpolicy",
        kind: "NetworkPolicy",
        namespaced: true,
        short: &["netpol"],
        subresources: &[],
    },
    Resource {
        id: "sandboxes.agents.x-k8s.io",
        group: AGENTS,
        version: "v1alpha1",
        plural: "sandboxes",
        singular: "sandbox",
        kind: "Sandbox",
        namespaced: true,
        short: &[],
        subresources: &[("status", "Sandbox")],
    },
    Resource {
        id: "sandboxtemplates.extensions.agents.x-k8s.io",
        group: EXTENSIONS,
        version: "v1alpha1",
        plural: "sandboxtemplates",
        singular: "sandboxtemplate",
        kind: "SandboxTemplate",
        namespaced: true,
        short: &[],
        subresources: &[],
    },
    Resource {
        id: "sandboxclaims.extensions.agents.x-k8s.io",
        group: EXTENSIONS,
        version: "v1alpha1",
        plural: "sandboxclaims",
        singular: "sandboxclaim",
        kind: "SandboxClaim",
        namespaced: true,
        short: &[],
        subresources: &[("status", "SandboxClaim")],
    },
    Resource {
        id: "sandboxwarmpools.extensions.agents.x-k8s.io",
        group: EXTENSIONS,
        version: "v1alpha1",
        plural: "sandboxwarmpools",
        singular: "sandboxwarmpool",
        kind: "SandboxWarmPool",
        namespaced: true,
        short: &[],
        subresources: &[("status", "SandboxWarmPool")],
    },
    Resource {
        id: "runtimeclasses.node.k8s.io",
        group: "node.k8s.io",
        version: "v1",
        plural: "runtimeclasses",
        singular: "runtimeclass",
        kind: "RuntimeClass",
        namespaced: false,
        short: &[],
        subresources: &[],
    },
];

/// The resource `plural` of `group`/`version`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of a kind, by its store id.
pub fn by_id(id: &str) -> Option<&'static Resource> {
    RESOURCES.iter().find(|r| r.id == id)
}

pub fn pods() -> &'static Resource {
    &RESOURCES[2]
}

pub fn namespaces() -> &'static Resource {
    &RESOURCES[0]
}

pub fn nodes() -> &'static Resource {
    &RESOURCES[1]
}

pub fn pvcs() -> &'static Resource {
    &RESOURCES[3]
}

pub fn network_policies() -> &'static Resource {
    &RESOURCES[4]
}

pub fn sandboxes() -> &'static Resource {
    &RESOURCES[5]
}

pub fn sandbox_templates() -> &'static Resource {
    &RESOURCES[6]
}

pub fn sandbox_claims() -> &'static Resource {
    &RESOURCES[7]
}

pub fn warm_pools() -> &'static Resource {
    &RESOURCES[8]
}

/// `(group, version)` pairs served, core first.
fn group_versions(with_crds: bool) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !with_crds && (r.group == AGENTS || r.group == EXTENSIONS) {
            continue;
        }
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// Whether `group`/`version` is served.
pub fn serves(group: &str, version: &str, with_crds: bool) -> bool {
    group_versions(with_crds).contains(&(group, version))
}

/// `GET /api`.
pub fn core_versions(addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `GET /apis`.
pub fn group_list(with_crds: bool) -> Value {
    let groups: Vec<Value> = group_versions(with_crds)
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, v)| group_doc(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/GROUP`.
pub fn group(group: &str, with_crds: bool) -> Option<Value> {
    let (g, v) = group_versions(with_crds)
        .into_iter()
        .find(|(g, _)| *g == group && !g.is_empty())?;
    let mut doc = group_doc(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `GET /api/v1` or `GET /apis/GROUP/VERSION`.
pub fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
            "shortNames": r.short,
            "categories": if r.kind == "Pod" { json!(["all"]) } else { json!([]) },
        }));
        for (sub, kind) in r.subresources {
            let (verbs, extra): (&[&str], Value) = match *sub {
                "exec" => (&["create", "get"], json!({})),
                "eviction" => (&["create"], json!({"group": "policy", "version": "v1"})),
                _ => (&["get", "patch", "update"], json!({})),
            };
            let mut doc = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
                d.extend(e.clone());
            }
            resources.push(doc);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// `GET /openapi/v3`: where each group version's document is. kubectl reads
/// it to learn whether the server validates fields itself
/// (`fieldValidation`), before it sends an object.
pub fn openapi_root(with_crds: bool) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in group_versions(with_crds) {
        let key = if g.is_empty() {
            format!("api/{v}")
        } else {
            format!("apis/{g}/{v}")
        };
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=berth-standin-1")}),
        );
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/api/v1` or `/openapi/v3/apis/G/V`: each resource's
/// object path with its PATCH operation, tagged with its kind and taking
/// `fieldValidation`, which is what kubectl looks for. Schemas are not
/// served (`kubectl explain` has nothing to read).
pub fn openapi_group_version(group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": r.kind});
        let op = json!({
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            ],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"patch": op, "put": op}));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", crate::k8s::api::VERSION.0, crate::k8s::api::VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}},
    })
}
