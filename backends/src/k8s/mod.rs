//! The k8s backend: one pod per berth sandbox on a Kubernetes cluster,
//! driven with kube-rs.
//!
//! Flow at a glance:
//! - [`K8sBackend::new`] takes the kubeconfig and defaults ([`K8sSettings`]);
//!   a client per context is made on first use ([`cluster`]), and whether
//!   agent-sandbox's CRDs are installed is asked once (`/apis`).
//! - `provision` ([`lifecycle`]) makes the sandbox, or finds it: an
//!   agent-sandbox `Sandbox` (its controller makes the pod and the claims
//!   of its `volumeClaimTemplates`) where the CRDs are installed, else two
//!   PersistentVolumeClaims and a Pod berth makes itself ([`manifest`]).
//!   Either way the pod is named as the object, its workspace and berth's
//!   directory live on claims that outlive it, a NetworkPolicy denies its
//!   egress unless `--network on`, and berth waits for it to run. A pod
//!   that was replaced (evicted, deleted, its node drained or lost) is
//!   noticed through the node berth last saw it on, kept on the workspace
//!   claim, and said.
//! - [`K8sSandbox::spawn`] is one `pods/exec` WebSocket per process
//!   ([`process`]): a launcher reads the environment from stdin (never in
//!   the request, which audit logs keep), changes directory, and `exec`s the
//!   program. The session engine runs one bash over one exec for the
//!   sandbox's whole life.
//! - Files move through short execs (`head -c`, `cat >`), `crate::exec_files`.
//! - `list` finds berth's sandboxes by their labels, `remove` deletes them.

mod cluster;
mod lifecycle;
pub mod manifest;
mod process;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::backend::{BackendKind, Layout, Process, Sandbox, SpawnOpts};
use berth_core::error::{BackendFailure, Error, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

pub use cluster::Cluster;
pub use lifecycle::K8sBackend;

/// The backend's short name.
pub const KIND: &str = BackendKind::K8s.as_str();
/// The label every object berth makes carries (`true`).
pub const LABEL_MANAGED: &str = "berth.dev/managed";
/// The label naming the berth installation (state dir) that made it: two
/// people in one namespace never share a sandbox.
pub const LABEL_INSTALLATION: &str = "berth.dev/installation";
/// The label naming the sandbox's object (pod, Sandbox, claims, policy).
pub const LABEL_SANDBOX: &str = "berth.dev/sandbox";
/// The annotation holding the sandbox's berth name (names allow more than
/// Kubernetes does).
pub const ANNOTATION_NAME: &str = "berth.dev/name";
/// The annotation holding the settings the sandbox was made with.
pub const ANNOTATION_SETTINGS: &str = "berth.dev/settings";
/// The annotation on the workspace claim naming the pod berth last used
/// and its node (`UID NODE`), so a replaced pod is told and explained.
pub const ANNOTATION_LAST_POD: &str = "berth.dev/last-pod";
/// The pod's one container.
pub const CONTAINER: &str = "sandbox";
/// The workspace, on its own claim.
pub const WORKDIR: &str = "/workspace";
/// berth's private directory, on its own claim.
pub const BERTH_DIR: &str = "/var/lib/berth";
/// The image a sandbox runs when neither the spec nor `BERTH_K8S_IMAGE`
/// names one: berth's, as `images/` builds it; a cluster must be able to
/// pull it.
pub const DEFAULT_IMAGE: &str = "berth-sandbox:latest";

/// The pod a sandbox is, as its processes reach it.
pub(crate) struct PodRef {
    pub(crate) name: String,
    pub(crate) object: String,
    pub(crate) namespace: String,
    pub(crate) context: String,
    /// The pod's uid when berth provisioned it: another uid under the same
    /// name is a replacement, and this sandbox handle is stale.
    pub(crate) uid: String,
    pub(crate) pods: Api<Pod>,
}

impl PodRef {
    /// Where the pod is, for messages: `pod NS/NAME (context C)`.
    pub(crate) fn place(&self) -> String {
        format!(
            "pod {}/{} (context `{}`)",
            self.namespace, self.object, self.context
        )
    }

    /// Why the pod berth provisioned is no longer there to use, if it is not.
    pub(crate) async fn gone_reason(&self) -> Result<Option<String>> {
        let pod = self.pods.get_opt(&self.object).await.map_err(|e| {
            cluster::api_error(&self.context, &self.namespace, "reading its pod", e)
        })?;
        Ok(match pod {
            None => Some(format!("its {} was deleted or evicted", self.place())),
            Some(p) if p.metadata.uid.as_deref() != Some(self.uid.as_str()) => Some(format!(
                "its {} was replaced by a new pod (the old one was evicted, deleted or lost with its node)",
                self.place()
            )),
            Some(p) if p.metadata.deletion_timestamp.is_some() => {
                Some(format!("its {} is being deleted", self.place()))
            }
            Some(p) => match lifecycle::phase(&p) {
                "Running" => None,
                phase => Some(format!("its {} is {phase}", self.place())),
            },
        })
    }

    /// berth's error for the pod being gone, with `reason`.
    pub(crate) fn gone(&self, reason: &str) -> Error {
        gone(&self.name, reason)
    }
}

/// The sandbox is gone: the next provision makes its pod again on the same
/// workspace claim.
pub(crate) fn gone(name: &str, reason: &str) -> Error {
    Error::sandbox_gone(
        KIND,
        name,
        reason,
        format!(
            "run the command again: berth makes the pod again on the sandbox's workspace volume and restores the session; or `berth sandbox rm {name}`"
        ),
    )
}

/// A live sandbox: its pod.
pub struct K8sSandbox {
    pub(crate) pod: Arc<PodRef>,
    pub(crate) layout: Layout,
    /// The sandbox's environment (already filtered by policy), given to
    /// every exec through the launcher, never put in the pod's spec.
    pub(crate) env: BTreeMap<String, String>,
}

impl K8sSandbox {
    /// The pod's name.
    pub fn pod_name(&self) -> &str {
        &self.pod.object
    }

    /// The pod's namespace.
    pub fn namespace(&self) -> &str {
        &self.pod.namespace
    }

    /// The pod's uid when berth provisioned it.
    pub fn pod_uid(&self) -> &str {
        &self.pod.uid
    }
}

#[async_trait]
impl Sandbox for K8sSandbox {
    fn name(&self) -> &str {
        &self.pod.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::K8s
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        process::spawn(self, argv, opts).await
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        crate::exec_files::read_file(self, KIND, path, limit).await
    }

    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        crate::exec_files::write_file(self, KIND, path, data, mode).await
    }

    async fn alive(&self) -> Result<bool> {
        Ok(self.pod.gone_reason().await?.is_none())
    }

    async fn destroy(&self) -> Result<()> {
        self.pod
            .pods
            .delete(&self.pod.object, &kube::api::DeleteParams::default())
            .await
            .map(|_| ())
            .or_else(|e| match e {
                kube::Error::Api(s) if s.is_not_found() => Ok(()),
                e => Err(cluster::api_error(
                    &self.pod.context,
                    &self.pod.namespace,
                    "deleting its pod",
                    e,
                )),
            })
    }
}

/// A failure berth met on its own side of the call.
pub(crate) fn local(detail: impl Into<String>) -> Error {
    Error::backend(KIND, BackendFailure::Local, detail)
}
