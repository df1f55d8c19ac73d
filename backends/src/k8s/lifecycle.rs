//! Making, finding, listing and removing sandboxes on a cluster.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::backend::{
    Backend, BackendKind, Layout, Provisioned, RemoveOpts, SandboxInfo, SandboxSpec,
    check_sandbox_name,
};
use berth_core::error::{BackendFailure, Error, Result};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tracing::info;

use super::cluster::{self, Cluster, api_error};
use super::manifest::{self, BERTH_VOLUME, Settings, WORKSPACE_VOLUME, claim_name};
use super::{
    ANNOTATION_LAST_POD, ANNOTATION_NAME, ANNOTATION_SETTINGS, BERTH_DIR, DEFAULT_IMAGE,
    K8sSandbox, KIND, LABEL_INSTALLATION, PodRef, WORKDIR, local,
};
use crate::K8sSettings;

/// How long a pod may take to run (an image pull, a volume to attach).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a deleted pod may take to go.
const GONE_TIMEOUT: Duration = Duration::from_secs(90);
/// A container's waiting reasons that no wait will cure.
const FATAL_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// The k8s backend.
pub struct K8sBackend {
    settings: K8sSettings,
    installation: String,
    clusters: Mutex<HashMap<String, Arc<Cluster>>>,
}

/// Where a sandbox lives and the APIs that reach it there.
struct Place {
    cluster: Arc<Cluster>,
    namespace: String,
    object: String,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
}

impl Place {
    fn err(&self, doing: &str, e: kube::Error) -> Error {
        api_error(&self.cluster.context, &self.namespace, doing, e)
    }

    fn sandboxes(&self) -> Api<DynamicObject> {
        sandboxes(&self.cluster.client, &self.namespace)
    }

    fn policies(&self) -> Api<NetworkPolicy> {
        Api::namespaced(self.cluster.client.clone(), &self.namespace)
    }
}

fn sandboxes(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(
        manifest::SANDBOX_GROUP,
        manifest::SANDBOX_VERSION,
        "Sandbox",
    );
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, "sandboxes"),
    )
}

/// A pod's phase (`Pending` when it has none yet).
pub(crate) fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| local(format!("building a manifest: {e}")))
}

/// `Ok` for a create that found the object already there.
fn created_or_there<T>(
    r: std::result::Result<T, kube::Error>,
) -> std::result::Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether a delete found the object (`false`: it was not there).
fn deleted<T>(r: std::result::Result<T, kube::Error>) -> std::result::Result<bool, kube::Error> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

impl K8sBackend {
    /// A backend with `settings`, for the installation `installation` (its
    /// label on every object).
    pub fn new(settings: K8sSettings, installation: &str) -> Self {
        Self {
            settings,
            installation: installation.to_string(),
            clusters: Mutex::new(HashMap::new()),
        }
    }

    /// The context and namespace `spec` names, else the defaults.
    fn target(&self, spec: &SandboxSpec) -> (String, String) {
        let (ctx, ns) = cluster::defaults(&self.settings, spec.option("context"));
        (
            spec.option("context").map_or(ctx, str::to_string),
            spec.option("namespace").map_or(ns, str::to_string),
        )
    }

    /// The client for `context`, made once.
    pub async fn cluster(&self, context: &str) -> Result<Arc<Cluster>> {
        let mut clusters = self.clusters.lock().await;
        if let Some(c) = clusters.get(context) {
            return Ok(c.clone());
        }
        let c = cluster::connect(&self.settings, context).await?;
        clusters.insert(context.to_string(), c.clone());
        Ok(c)
    }

    async fn place(&self, spec: &SandboxSpec) -> Result<Place> {
        check_sandbox_name(&spec.name)?;
        let (context, namespace) = self.target(spec);
        let cluster = self.cluster(&context).await?;
        let client = cluster.client.clone();
        Ok(Place {
            object: manifest::object_name(&self.installation, &spec.name),
            pods: Api::namespaced(client.clone(), &namespace),
            claims: Api::namespaced(client, &namespace),
            cluster,
            namespace,
        })
    }

    fn default_image(&self) -> &str {
        self.settings.image.as_deref().unwrap_or(DEFAULT_IMAGE)
    }

    /// The sandbox's objects, made where missing; a note when something
    /// of it had to be brought back.
    async fn ensure_objects(
        &self,
        spec: &SandboxSpec,
        p: &Place,
        settings: &Settings,
        agent: bool,
    ) -> Result<Option<String>> {
        let labels = manifest::labels(&self.installation, &p.object);
        let annotations = manifest::annotations(&spec.name, settings);
        // The egress policy first, so the pod never runs a moment without it.
        if !settings.network {
            let np: NetworkPolicy = typed(manifest::deny_egress(&p.object, &labels))?;
            created_or_there(p.policies().create(&PostParams::default(), &np).await)
                .map_err(|e| p.err("creating its deny-egress NetworkPolicy", e))?;
        }
        if agent {
            let api = p.sandboxes();
            match api
                .get_opt(&p.object)
                .await
                .map_err(|e| p.err("reading its Sandbox", e))?
            {
                None => {
                    let sb: DynamicObject = typed(manifest::sandbox(
                        &p.object,
                        &labels,
                        &annotations,
                        settings,
                    ))?;
                    created_or_there(api.create(&PostParams::default(), &sb).await)
                        .map_err(|e| p.err("creating its Sandbox", e))?;
                    Ok(None)
                }
                Some(sb) => {
                    check_settings(&spec.name, settings, &sb.metadata.annotations)?;
                    if sb.data["spec"]["replicas"].as_i64() == Some(0) {
                        api.patch(
                            &p.object,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"replicas": 1}})),
                        )
                        .await
                        .map_err(|e| p.err("resuming its Sandbox", e))?;
                        return Ok(Some(
                            "its Sandbox was suspended (replicas 0); berth resumed it".into(),
                        ));
                    }
                    Ok(None)
                }
            }
        } else {
            for volume in [WORKSPACE_VOLUME, BERTH_VOLUME] {
                let c: PersistentVolumeClaim =
                    typed(manifest::claim(volume, &p.object, &labels, &spec.name))?;
                created_or_there(p.claims.create(&PostParams::default(), &c).await)
                    .map_err(|e| p.err("creating its volume claims", e))?;
            }
            let existing = p
                .pods
                .get_opt(&p.object)
                .await
                .map_err(|e| p.err("reading its pod", e))?;
            let mut note = None;
            if let Some(pod) = existing {
                check_settings(&spec.name, settings, &pod.metadata.annotations)?;
                let ended = matches!(phase(&pod), "Failed" | "Succeeded");
                if pod.metadata.deletion_timestamp.is_none() && !ended {
                    return Ok(None);
                }
                if ended {
                    note = Some(format!(
                        "its pod had ended ({}); berth made it again",
                        phase(&pod)
                    ));
                    deleted(
                        p.pods
                            .delete(&p.object, &DeleteParams::default().grace_period(0))
                            .await,
                    )
                    .map_err(|e| p.err("deleting its ended pod", e))?;
                }
                self.wait_gone(p).await?;
            }
            let pod: Pod = typed(manifest::pod(&p.object, &labels, &annotations, settings))?;
            p.pods
                .create(&PostParams::default(), &pod)
                .await
                .map_err(|e| p.err("creating its pod", e))?;
            Ok(note)
        }
    }

    /// Wait until the pod is gone.
    async fn wait_gone(&self, p: &Place) -> Result<()> {
        until(
            p,
            GONE_TIMEOUT,
            "was not gone after berth deleted it",
            |pod| {
                Ok(match pod {
                    None => Step::Ready(()),
                    Some(_) => Step::Waiting("still there".into()),
                })
            },
        )
        .await
    }

    /// Wait until the pod runs, or say why it will not.
    async fn wait_running(&self, p: &Place) -> Result<Pod> {
        until(p, START_TIMEOUT, "did not start", |pod| {
            let Some(pod) = pod else {
                return Ok(Step::Waiting("no pod yet".into()));
            };
            let status = pod.status.clone().unwrap_or_default();
            let first = status.container_statuses.as_ref().and_then(|c| c.first());
            let waiting = first
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.clone());
            if let Some(w) = &waiting
                && let Some(reason) = w.reason.as_deref()
                && FATAL_WAITING.contains(&reason)
            {
                return Err(Error::backend(
                    KIND,
                    BackendFailure::Rejected,
                    format!(
                        "pod {}/{} cannot start: {reason}: {}; check the image (`--image`, BERTH_K8S_IMAGE) and the pod's settings, then `berth sandbox rm` it and try again",
                        p.namespace,
                        p.object,
                        w.message.as_deref().unwrap_or("")
                    ),
                ));
            }
            let started =
                first.is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
            if pod.metadata.deletion_timestamp.is_none() && phase(&pod) == "Running" && started {
                return Ok(Step::Ready(pod));
            }
            let mut last = phase(&pod).to_string();
            if let Some(c) = status
                .conditions
                .as_ref()
                .and_then(|cs| cs.iter().find(|c| c.status == "False" && c.message.is_some()))
            {
                last.push_str(&format!(
                    " ({}: {})",
                    c.reason.as_deref().unwrap_or(&c.type_),
                    c.message.as_deref().unwrap_or("")
                ));
            }
            Ok(Step::Waiting(last))
        })
        .await
    }

    /// If the pod is not the one berth last used, why (from the node the
    /// old one ran on); then remember this one on the workspace claim.
    async fn note_pod(&self, p: &Place, pod: &Pod) -> Result<Option<String>> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let claim = claim_name(WORKSPACE_VOLUME, &p.object);
        let last = p
            .claims
            .get_opt(&claim)
            .await
            .map_err(|e| p.err("reading its workspace claim", e))?
            .and_then(|c| c.metadata.annotations)
            .and_then(|a| a.get(ANNOTATION_LAST_POD).cloned());
        let seen = format!("{uid} {node}");
        if last.as_deref() == Some(seen.as_str()) {
            return Ok(None);
        }
        p.claims
            .patch(
                &claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_LAST_POD: seen}}})),
            )
            .await
            .map_err(|e| p.err("noting its pod on the workspace claim", e))?;
        let Some(last) = last else { return Ok(None) };
        let (_, old_node) = last.split_once(' ').unwrap_or((last.as_str(), ""));
        let why = self.why_replaced(p, old_node).await;
        Ok(Some(format!(
            "its pod was replaced: {why}; a new pod runs on node {node} with the same workspace volume"
        )))
    }

    /// Why a pod that ran on `node` went, as far as the node tells.
    async fn why_replaced(&self, p: &Place, node: &str) -> String {
        let nodes: Api<Node> = Api::all(p.cluster.client.clone());
        match nodes.get_opt(node).await {
            Ok(None) => format!("its node {node} is gone from the cluster"),
            Ok(Some(n)) => {
                let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                    .is_some_and(|c| c.status == "True");
                if !ready {
                    format!("its node {node} was lost (NotReady)")
                } else if cordoned {
                    // Cordoned, and the pod gone from it: what a drain does.
                    // Whether its other pods were evicted berth did not see.
                    format!("its node {node} was drained (it is cordoned, and the old pod is gone)")
                } else {
                    format!("the old pod on node {node} was evicted or deleted")
                }
            }
            // A namespaced identity may not read nodes.
            Err(_) => {
                format!("the old pod on node {node} was evicted, deleted or lost with its node")
            }
        }
    }

    async fn list_in(&self, context: &str, namespace: &str) -> Result<Vec<SandboxInfo>> {
        let cluster = self.cluster(context).await?;
        let selector = format!("{LABEL_INSTALLATION}={}", self.installation);
        let lp = ListParams::default().labels(&selector);
        let err = |doing: &str, e| api_error(context, namespace, doing, e);
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
        let mut state: HashMap<String, (String, String)> = HashMap::new();
        for p in pods
            .list(&lp)
            .await
            .map_err(|e| err("listing pods", e))?
            .items
        {
            let name = p.metadata.name.clone().unwrap_or_default();
            state.insert(
                name,
                (
                    phase(&p).to_lowercase(),
                    p.metadata.uid.clone().unwrap_or_default(),
                ),
            );
        }
        // The sandbox's main object: its Sandbox, or (plain pods) its
        // workspace claim, which outlives its pod.
        let mut mains: Vec<(String, BTreeMap<String, String>, Option<i64>)> = Vec::new();
        if cluster.agent_sandbox(namespace).await? {
            for s in sandboxes(&cluster.client, namespace)
                .list(&lp)
                .await
                .map_err(|e| err("listing Sandboxes", e))?
                .items
            {
                mains.push((
                    s.metadata.name.clone().unwrap_or_default(),
                    s.metadata.annotations.clone().unwrap_or_default(),
                    created(&s.metadata),
                ));
            }
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), namespace);
        for c in claims
            .list(&lp)
            .await
            .map_err(|e| err("listing volume claims", e))?
            .items
        {
            let object = c
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(super::LABEL_SANDBOX))
                .cloned()
                .unwrap_or_default();
            if c.metadata.name.as_deref() == Some(&claim_name(WORKSPACE_VOLUME, &object))
                && !mains.iter().any(|m| m.0 == object)
            {
                let a = c.metadata.annotations.clone().unwrap_or_default();
                mains.push((object, a, created(&c.metadata)));
            }
        }
        let mut out: Vec<SandboxInfo> = mains
            .into_iter()
            .map(|(object, annotations, created_unix)| {
                let (st, uid) = state
                    .get(&object)
                    .cloned()
                    .unwrap_or_else(|| ("missing".into(), String::new()));
                SandboxInfo {
                    name: annotations.get(ANNOTATION_NAME).cloned().unwrap_or(object),
                    id: if uid.is_empty() {
                        format!("{namespace}/-")
                    } else {
                        format!("{namespace}/{uid}")
                    },
                    state: st,
                    created_unix,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// What [`until`]'s judge makes of the pod.
enum Step<T> {
    /// Done, with this.
    Ready(T),
    /// Not yet: what was seen, for the timeout's message.
    Waiting(String),
}

/// Read the pod (20 ms, doubling to 500 ms) until `judge` settles it, or
/// `limit` passes: then a timeout error saying it `what`, what was last
/// seen, and where to look.
async fn until<T>(
    p: &Place,
    limit: Duration,
    what: &str,
    mut judge: impl FnMut(Option<Pod>) -> Result<Step<T>>,
) -> Result<T> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = Duration::from_millis(20);
    loop {
        let pod = p
            .pods
            .get_opt(&p.object)
            .await
            .map_err(|e| p.err("reading its pod", e))?;
        let last = match judge(pod)? {
            Step::Ready(t) => return Ok(t),
            Step::Waiting(last) => last,
        };
        if tokio::time::Instant::now() > deadline {
            return Err(Error::backend(
                KIND,
                BackendFailure::Timeout,
                format!(
                    "pod {ns}/{obj} {what} within {}s; last seen: {last}; see `kubectl -n {ns} describe pod {obj}`",
                    limit.as_secs(),
                    ns = p.namespace,
                    obj = p.object,
                ),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

fn created(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<i64> {
    m.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

/// Refuse to use a sandbox made with other settings than those asked.
fn check_settings(
    name: &str,
    asked: &Settings,
    annotations: &Option<BTreeMap<String, String>>,
) -> Result<()> {
    let made: Option<Settings> = annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SETTINGS))
        .and_then(|s| serde_json::from_str(s).ok());
    let Some(made) = made else { return Ok(()) };
    let diff = asked.differences(&made);
    if diff.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidInput(format!(
        "sandbox `{name}` was made with other settings ({}); a sandbox keeps its settings: ask for the same ones, or `berth sandbox rm {name}` and make it again",
        diff.join("; ")
    )))
}

#[async_trait]
impl Backend for K8sBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::K8s
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        let settings = Settings::of(spec, self.default_image())?;
        let p = self.place(spec).await?;
        let agent = p.cluster.agent_sandbox(&p.namespace).await?;
        let had_volume = p
            .claims
            .get_opt(&claim_name(WORKSPACE_VOLUME, &p.object))
            .await
            .map_err(|e| p.err("reading its workspace claim", e))?
            .is_some();
        let note = self.ensure_objects(spec, &p, &settings, agent).await?;
        let pod = self.wait_running(&p).await?;
        let replaced = self.note_pod(&p, &pod).await?;
        let recreated = match (note, replaced) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        if let Some(r) = &recreated {
            info!(sandbox = %spec.name, reason = %r, "k8s sandbox brought back");
        }
        Ok(Provisioned {
            sandbox: Arc::new(K8sSandbox {
                pod: Arc::new(PodRef {
                    name: spec.name.clone(),
                    object: p.object.clone(),
                    namespace: p.namespace.clone(),
                    context: p.cluster.context.clone(),
                    uid: pod.metadata.uid.clone().unwrap_or_default(),
                    pods: p.pods.clone(),
                }),
                layout: Layout {
                    workdir: WORKDIR.into(),
                    berth_dir: BERTH_DIR.into(),
                },
                env: spec.env.clone(),
            }),
            created: !had_volume,
            recreated: if had_volume { recreated } else { None },
        })
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let (ctx, ns) = cluster::defaults(&self.settings, None);
        self.list_in(&ctx, &ns).await
    }

    async fn list_specs(&self, specs: &[SandboxSpec]) -> Result<Vec<SandboxInfo>> {
        let mut places: Vec<(String, String)> = vec![cluster::defaults(&self.settings, None)];
        for s in specs {
            let t = self.target(s);
            if !places.contains(&t) {
                places.push(t);
            }
        }
        let mut out = Vec::new();
        for (ctx, ns) in places {
            for info in self.list_in(&ctx, &ns).await? {
                if !out.iter().any(|o: &SandboxInfo| o.name == info.name) {
                    out.push(info);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn remove(&self, name: &str, opts: RemoveOpts) -> Result<()> {
        self.remove_spec(&SandboxSpec::named(name), opts).await
    }

    async fn remove_spec(&self, spec: &SandboxSpec, opts: RemoveOpts) -> Result<()> {
        let p = self.place(spec).await?;
        let mut found = false;
        if p.cluster.agent_sandbox(&p.namespace).await? {
            // Its claims are the Sandbox's (volumeClaimTemplates), so the
            // garbage collector would take them with it: to keep them, its
            // dependents are orphaned, and its pod deleted below.
            let how = if opts.volumes {
                DeleteParams::default()
            } else {
                DeleteParams::orphan()
            };
            found |= deleted(p.sandboxes().delete(&p.object, &how).await)
                .map_err(|e| p.err("deleting its Sandbox", e))?;
        }
        found |= deleted(
            p.pods
                .delete(&p.object, &DeleteParams::default().grace_period(0))
                .await,
        )
        .map_err(|e| p.err("deleting its pod", e))?;
        deleted(
            p.policies()
                .delete(
                    &manifest::deny_egress_name(&p.object),
                    &DeleteParams::default(),
                )
                .await,
        )
        .map_err(|e| p.err("deleting its NetworkPolicy", e))?;
        // Removed means berth saw the pod go, with every process in it.
        self.wait_gone(&p).await?;
        for volume in [WORKSPACE_VOLUME, BERTH_VOLUME] {
            let claim = claim_name(volume, &p.object);
            // As on docker, berth's own state goes regardless; only the
            // workspace may be kept.
            if opts.volumes || volume == BERTH_VOLUME {
                found |= deleted(p.claims.delete(&claim, &DeleteParams::default()).await)
                    .map_err(|e| p.err("deleting its volume claims", e))?;
            } else {
                found |= p
                    .claims
                    .get_opt(&claim)
                    .await
                    .map_err(|e| p.err("reading its volume claims", e))?
                    .is_some();
            }
        }
        if found {
            Ok(())
        } else {
            Err(Error::NotFound {
                what: "sandbox",
                name: spec.name.clone(),
                hint: format!(
                    "nothing of it is in namespace `{}` (context `{}`); `berth sandbox ls --backend k8s` lists berth's sandboxes there",
                    p.namespace, p.cluster.context
                ),
            })
        }
    }

    fn settle_spec(&self, spec: &mut SandboxSpec, stored: Option<&SandboxSpec>) -> Result<bool> {
        let mut changed = false;
        let (ctx, ns) = cluster::defaults(
            &self.settings,
            spec.option("context")
                .or_else(|| stored.and_then(|s| s.option("context"))),
        );
        for (key, default) in [("context", ctx), ("namespace", ns)] {
            let kept = stored.and_then(|s| s.option(key)).map(str::to_string);
            match (spec.option(key).map(str::to_string), kept) {
                (Some(asked), Some(kept)) if asked != kept => {
                    return Err(Error::InvalidInput(format!(
                        "sandbox `{}` lives in {key} `{kept}`; this call names `{asked}`. A sandbox stays where it was made: leave the {key} out, or make a new sandbox",
                        spec.name
                    )));
                }
                (Some(_), _) => {}
                (None, Some(kept)) => {
                    spec.options.insert(key.into(), kept);
                    changed = true;
                }
                (None, None) => {
                    spec.options.insert(key.into(), default);
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}
