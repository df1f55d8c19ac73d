//! A local stand-in for a Kubernetes API server, with simulated nodes whose
//! pods really run as containers on the local Docker engine.
//!
//! Flow at a glance:
//! - [`K8sStandin::start`] serves the API over HTTP on loopback, refuses a
//!   wrong bearer token, and writes a kubeconfig any client can use
//!   (`KUBECONFIG`).
//! - [`api`] answers discovery and the verbs on every resource in
//!   [`resources`]: namespaces, nodes, pods (with watch, `exec` over
//!   WebSocket, `eviction`), persistent volume claims, NetworkPolicies,
//!   RuntimeClasses and, unless started without them, the agent-sandbox
//!   resources (`agents.x-k8s.io`, `extensions.agents.x-k8s.io`).
//! - [`store`] keeps every object as JSON with a resourceVersion; watches
//!   read its change log.
//! - [`kubelet`] runs each pod as a Docker container on one of the nodes.
//! - [`controller`] is agent-sandbox's controller for `Sandbox`: a pod (and
//!   claims) per sandbox, recreated when the pod is evicted or deleted.
//! - Faults a test asks for: a node lost ([`K8sStandin::lose_node`]), the
//!   API server gone for a while ([`K8sStandin::outage`]: connections,
//!   watches and exec sessions cut, the port refusing); a drain is
//!   `kubectl drain`, which cordons and evicts through the API.

// Handlers return the error answer itself; its size does not matter here.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod controller;
pub mod exec;
pub mod kubelet;
pub mod resources;
pub mod select;
pub mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use bollard::Docker;
use serde_json::{Value, json};

use resources::Resource;
use store::{ApiError, ApiResult, Store};

/// How a stand-in is started.
#[derive(Clone, Debug)]
pub struct K8sOptions {
    /// The port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Simulated nodes, `standin-node-1` …
    pub nodes: usize,
    /// Whether agent-sandbox's CRDs are installed.
    pub agent_sandbox: bool,
}

impl Default for K8sOptions {
    fn default() -> Self {
        K8sOptions {
            port: 0,
            nodes: 3,
            agent_sandbox: true,
        }
    }
}

/// The server's state.
pub struct K8s {
    pub store: Store,
    pub docker: Docker,
    /// Names this stand-in's containers and volumes apart from another's.
    pub instance: String,
    pub with_crds: bool,
    /// `host:port`, as discovery reports it.
    pub addr: String,
    token: String,
    next_ip: AtomicU32,
    /// emptyDir volumes by pod uid, removed with the pod.
    empty_dirs: Mutex<HashMap<String, Vec<String>>>,
    /// Fires when a test cuts the API server off: every connection, watch
    /// and exec session ends at once.
    pub(crate) cuts: tokio::sync::broadcast::Sender<()>,
    me: Weak<K8s>,
}

impl K8s {
    fn me(&self) -> Weak<K8s> {
        self.me.clone()
    }

    fn next_pod_ip(&self) -> String {
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        format!("10.244.{}.{}", (n >> 8) & 0xff, n & 0xff)
    }

    /// Admission: defaults and checks before an object is stored.
    fn admit(&self, res: &Resource, _ns: &str, obj: &mut Value) -> ApiResult<()> {
        if obj.get("metadata").is_none_or(|m| !m.is_object()) {
            obj["metadata"] = json!({});
        }
        match res.kind {
            "Pod" => self.admit_pod(obj),
            "PersistentVolumeClaim" => {
                obj["status"] = json!({"phase": "Bound", "accessModes": obj["spec"]["accessModes"], "capacity": obj["spec"]["resources"]["requests"]});
                Ok(())
            }
            "Namespace" => {
                obj["status"] = json!({"phase": "Active"});
                Ok(())
            }
            "Sandbox" if obj["spec"]["podTemplate"]["spec"]["containers"].is_null() => {
                Err(ApiError::invalid(
                    "Sandbox is invalid: spec.podTemplate.spec.containers: Required value",
                ))
            }
            _ => Ok(()),
        }
    }

    /// What follows a create: pods start.
    fn created(self: &Arc<Self>, res: &Resource, _ns: &str, obj: &Value) {
        if res.kind == "Pod" {
            self.run_pod(obj);
        }
    }

    /// What follows an update. The controller reads the change log itself.
    fn changed(self: &Arc<Self>, _res: &Resource, _ns: &str, _obj: &Value) {}

    /// Delete an object with what goes with it: a pod's container, a
    /// claim's volume, everything in a namespace.
    pub async fn delete(
        self: &Arc<Self>,
        res: &Resource,
        ns: &str,
        name: &str,
    ) -> ApiResult<Value> {
        match res.kind {
            "Pod" => {
                let pod = self.store.get(res, ns, name)?;
                self.stop_pod(&pod).await;
                self.store.delete(res, ns, name)
            }
            "PersistentVolumeClaim" => {
                let gone = self.store.delete(res, ns, name)?;
                self.drop_claim_volume(ns, name).await;
                Ok(gone)
            }
            "Namespace" => {
                let gone = self.store.delete(res, ns, name)?;
                for r in resources::RESOURCES.iter().filter(|r| r.namespaced) {
                    let (items, _) = self.store.list(r, Some(name));
                    for o in items {
                        let n = o["metadata"]["name"].as_str().unwrap_or("");
                        let _ = Box::pin(self.delete(r, name, n)).await;
                    }
                }
                Ok(gone)
            }
            _ => self.store.delete(res, ns, name),
        }
    }

    /// Take the owner reference to `name` off everything in `ns` it owns,
    /// before it is deleted with `propagationPolicy: Orphan`.
    pub fn orphan_dependents(&self, res: &Resource, ns: &str, name: &str) -> ApiResult<()> {
        let owner = self.store.get(res, ns, name)?;
        let Some(uid) = owner["metadata"]["uid"].as_str() else {
            return Ok(());
        };
        for r in resources::RESOURCES.iter().filter(|r| r.namespaced) {
            let (items, _) = self.store.list(r, Some(ns));
            for o in items {
                let owned = o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|x| x["uid"] == uid));
                if !owned {
                    continue;
                }
                let n = o["metadata"]["name"].as_str().unwrap_or("");
                self.store.update(r, ns, n, |o| {
                    if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                        refs.retain(|x| x["uid"] != uid);
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// `pods/eviction`: the pod goes as a deleted one does; a controller
    /// brings its replacement.
    async fn evict(self: &Arc<Self>, ns: &str, name: &str) -> ApiResult<()> {
        self.delete(resources::pods(), ns, name).await.map(|_| ())
    }

    /// As an API server with anonymous requests allowed: no credentials
    /// is the anonymous user, who may do anything here (there is no RBAC);
    /// a credential that is not the token is refused. (client-go sends no
    /// bearer token over plain HTTP, so kubectl comes anonymous.)
    fn authorized(&self, req: &Request) -> bool {
        match req.headers().get(header::AUTHORIZATION) {
            None => true,
            Some(v) => {
                v.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")) == Some(self.token.as_str())
            }
        }
    }
}

async fn auth(
    axum::extract::State(k): axum::extract::State<Arc<K8s>>,
    req: Request,
    next: Next,
) -> Response {
    if k.authorized(&req) {
        return next.run(req).await;
    }
    api::reply(
        StatusCode::UNAUTHORIZED,
        &ApiError::new(401, "Unauthorized", "Unauthorized").status(),
    )
}

/// Unix seconds of an RFC 3339 UTC timestamp (`2026-12-01T10:00:00Z`).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// A running stand-in. Dropping it stops the server and removes every
/// container and volume it made.
pub struct K8sStandin {
    addr: SocketAddr,
    outages: tokio::sync::mpsc::Sender<std::time::Duration>,
    k: Arc<K8s>,
    server: tokio::task::JoinHandle<()>,
    controller: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl K8sStandin {
    /// Serve with the default options: three nodes, agent-sandbox installed.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(K8sOptions::default()).await
    }

    pub async fn start_with(opts: K8sOptions) -> std::io::Result<Self> {
        let docker = Docker::connect_with_local_defaults().map_err(std::io::Error::other)?;
        docker.ping().await.map_err(|e| {
            std::io::Error::other(format!(
                "the k8s stand-in runs pods on the local Docker engine, which does not answer: {e}"
            ))
        })?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
        let addr = listener.local_addr()?;
        let instance = crate::e2b::random_hex(4);
        let k = Arc::new_cyclic(|me| K8s {
            store: Store::default(),
            docker,
            instance,
            with_crds: opts.agent_sandbox,
            addr: addr.to_string(),
            token: crate::e2b::random_hex(16),
            next_ip: AtomicU32::new(2),
            empty_dirs: Mutex::new(HashMap::new()),
            cuts: tokio::sync::broadcast::channel(4).0,
            me: me.clone(),
        });
        seed(&k, opts.nodes).map_err(|e| std::io::Error::other(e.message))?;
        let app = Router::new()
            .fallback(api::handle)
            .layer(middleware::from_fn_with_state(k.clone(), auth))
            .with_state(k.clone());
        let (outage_tx, outage_rx) = tokio::sync::mpsc::channel(4);
        let server = tokio::spawn(serve(listener, app, k.clone(), outage_rx));
        let controller = tokio::spawn(controller::run(Arc::downgrade(&k), k.store.changes()));
        let dir = tempfile::tempdir()?;
        let standin = K8sStandin {
            addr,
            outages: outage_tx,
            k,
            server,
            controller,
            dir,
        };
        std::fs::write(standin.kubeconfig(), standin.kubeconfig_text())?;
        Ok(standin)
    }

    /// The API server's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bearer token it accepts.
    pub fn token(&self) -> &str {
        &self.k.token
    }

    /// The kubeconfig file naming this server, its token and the `default`
    /// namespace (context `berth-standin`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// A directory beside the kubeconfig, for a client's caches.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn kubeconfig_text(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: berth-standin\n  cluster:\n    server: {url}\ncontexts:\n- name: berth-standin\n  context:\n    cluster: berth-standin\n    user: berth-standin\n    namespace: default\ncurrent-context: berth-standin\nusers:\n- name: berth-standin\n  user:\n    token: {token}\n",
            url = self.url(),
            token = self.k.token,
        )
    }

    /// The settings a client needs, as `KEY=VALUE` pairs.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![(
            "KUBECONFIG".into(),
            self.kubeconfig().to_string_lossy().into_owned(),
        )]
    }

    /// The server's state, for a test to read.
    pub fn state(&self) -> &Arc<K8s> {
        &self.k
    }

    /// An object as the server holds it.
    pub fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let r = resources::by_id(resource)?;
        self.k.store.get(r, ns, name).ok()
    }

    /// The API server goes away for `how_long`: every open connection,
    /// watch and exec session is cut at once and the port refuses
    /// connections, then it listens again on the same port with the same
    /// state. Returns once the outage has begun.
    pub async fn outage(&self, how_long: std::time::Duration) -> Result<(), String> {
        self.outages
            .send(how_long)
            .await
            .map_err(|_| "the stand-in's server has stopped".to_string())?;
        // The server answers by cutting; wait until the port refuses.
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(self.addr).await.is_err() {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Err("the port still answers".into())
    }

    /// Node `name` stops answering: it turns NotReady and its pods are
    /// deleted, as the node lifecycle controller evicts them once the node
    /// is given up on (here at once). Controllers bring replacements on the
    /// nodes that are left.
    pub async fn lose_node(&self, name: &str) -> Result<usize, String> {
        self.k
            .store
            .update(resources::nodes(), "", name, |n| {
                n["status"]["conditions"] = json!([{
                    "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                }]);
                n["spec"]["taints"] =
                    json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]);
                Ok(())
            })
            .map_err(|e| e.message)?;
        let sel = select::Selector::parse(None, Some(&format!("spec.nodeName={name}")))
            .map_err(|e| e.message)?;
        let (pods, _) = self.k.store.list(resources::pods(), None);
        let mut gone = 0;
        for p in pods.iter().filter(|p| sel.matches(p)) {
            let ns = p["metadata"]["namespace"].as_str().unwrap_or("");
            let n = p["metadata"]["name"].as_str().unwrap_or("");
            if self.k.delete(resources::pods(), ns, n).await.is_ok() {
                gone += 1;
            }
        }
        Ok(gone)
    }
}

/// Accept and serve connections (HTTP/1.1 with upgrades, for exec) until
/// an outage is asked for: then close the port, cut every connection and
/// session, wait, and listen again on the same address.
async fn serve(
    mut listener: tokio::net::TcpListener,
    app: Router,
    k: Arc<K8s>,
    mut outages: tokio::sync::mpsc::Receiver<std::time::Duration>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((sock, _)) = accepted else { continue };
                let svc = TowerToHyperService::new(app.clone());
                let mut cut = k.cuts.subscribe();
                tokio::spawn(async move {
                    let builder = Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(sock), svc);
                    tokio::select! {
                        _ = conn => {}
                        _ = cut.recv() => {}
                    }
                });
            }
            outage = outages.recv() => {
                let Some(how_long) = outage else { return };
                let Ok(addr) = listener.local_addr() else { return };
                drop(listener);
                let _ = k.cuts.send(());
                tokio::time::sleep(how_long).await;
                listener = loop {
                    match tokio::net::TcpListener::bind(addr).await {
                        Ok(l) => break l,
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                    }
                };
            }
        }
    }
}

/// The namespaces and nodes a fresh cluster has.
fn seed(k: &Arc<K8s>, nodes: usize) -> ApiResult<()> {
    for ns in ["default", "kube-system", "kube-public"] {
        let mut obj = json!({"metadata": {"name": ns}});
        k.admit(resources::namespaces(), "", &mut obj)?;
        k.store.create(resources::namespaces(), "", obj)?;
    }
    for i in 1..=nodes.max(1) {
        let name = format!("standin-node-{i}");
        let obj = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "spec": {},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
                "addresses": [{"type": "InternalIP", "address": format!("172.30.0.{}", 10 + i)}, {"type": "Hostname", "address": name}],
                "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                "nodeInfo": {"kubeletVersion": format!("v{}.{}.0", api::VERSION.0, api::VERSION.1), "containerRuntimeVersion": "docker://standin", "operatingSystem": "linux", "architecture": "amd64"},
            },
        });
        k.store.create(resources::nodes(), "", obj)?;
    }
    Ok(())
}

impl Drop for K8sStandin {
    fn drop(&mut self) {
        self.server.abort();
        self.controller.abort();
        // Containers and volumes by label, through the CLI: Drop cannot await.
        // A second pass takes what a kubelet task still running made after
        // the first one listed.
        let filter = format!("label={}={}", kubelet::LABEL, self.k.instance);
        for pass in 0..2 {
            if pass > 0 {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            docker_remove_listed(&["ps", "-aq", "--filter", &filter], &["rm", "-f", "-v"]);
            docker_remove_listed(
                &["volume", "ls", "-q", "--filter", &filter],
                &["volume", "rm", "-f"],
            );
        }
    }
}

/// Run `docker LIST…`, then `docker REMOVE… ID…` on what it printed, if
/// anything. Best effort: this is cleanup on drop.
fn docker_remove_listed(list: &[&str], remove: &[&str]) {
    let Ok(out) = std::process::Command::new("docker").args(list).output() else {
        return;
    };
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if !listed.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(remove)
            .args(&listed)
            .output();
    }
}
