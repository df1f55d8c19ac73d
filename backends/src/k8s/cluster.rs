//! Reaching a cluster: the kubeconfig's context (or the in-cluster service
//! account), one client per context, the namespace a sandbox lives in, and
//! berth's errors for what the API answers.

use std::sync::Arc;
use std::time::Duration;

use berth_core::error::{BackendFailure, Error, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::OnceCell;

use super::KIND;
use crate::K8sSettings;

/// How long berth waits for the API server to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The in-cluster service account's namespace file.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The name berth records for the in-cluster service account's "context".
pub const IN_CLUSTER: &str = "in-cluster";

/// One cluster, as one kubeconfig context reaches it.
pub struct Cluster {
    /// The context's name ([`IN_CLUSTER`] for the service account).
    pub context: String,
    /// The API client.
    pub client: Client,
    agent_sandbox: OnceCell<bool>,
}

impl Cluster {
    /// Whether agent-sandbox's CRDs (`agents.x-k8s.io/v1alpha1` with its
    /// `Sandbox`) are installed: asked once, from `/apis`.
    pub async fn agent_sandbox(&self, namespace: &str) -> Result<bool> {
        self.agent_sandbox
            .get_or_try_init(|| async {
                let groups = self.client.list_api_groups().await.map_err(|e| {
                    api_error(&self.context, namespace, "listing the API groups", e)
                })?;
                Ok(groups.groups.iter().any(|g| {
                    g.name == super::manifest::SANDBOX_GROUP
                        && g.versions
                            .iter()
                            .any(|v| v.version == super::manifest::SANDBOX_VERSION)
                }))
            })
            .await
            .copied()
    }
}

/// The context and namespace a new sandbox gets when its spec names none:
/// the settings', else the kubeconfig's current context and that context's
/// namespace, else `default` (in a cluster: the service account's).
pub(crate) fn defaults(settings: &K8sSettings, context: Option<&str>) -> (String, String) {
    let kubeconfig = settings
        .kubeconfig
        .as_ref()
        .and_then(|p| Kubeconfig::read_from(p).ok());
    let Some(kc) = kubeconfig else {
        let ns = settings.namespace.clone().unwrap_or_else(|| {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .map(|s| s.trim().to_string())
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into())
        });
        return (
            context
                .map(str::to_string)
                .or_else(|| settings.context.clone())
                .unwrap_or_else(|| IN_CLUSTER.into()),
            ns,
        );
    };
    let ctx = context
        .map(str::to_string)
        .or_else(|| settings.context.clone())
        .or_else(|| kc.current_context.clone())
        .unwrap_or_default();
    let ns = settings.namespace.clone().unwrap_or_else(|| {
        kc.contexts
            .iter()
            .find(|c| c.name == ctx)
            .and_then(|c| c.context.as_ref())
            .and_then(|c| c.namespace.clone())
            .unwrap_or_else(|| "default".into())
    });
    (ctx, ns)
}

/// A client for `context`.
pub(crate) async fn connect(settings: &K8sSettings, context: &str) -> Result<Arc<Cluster>> {
    let mut config = match &settings.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| {
                Error::InvalidInput(format!(
                    "k8s: cannot read the kubeconfig {}: {e}; fix it, or point KUBECONFIG at a good one",
                    path.display()
                ))
            })?;
            let opts = KubeConfigOptions {
                context: (!context.is_empty()).then(|| context.to_string()),
                ..KubeConfigOptions::default()
            };
            Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| {
                    Error::InvalidInput(format!(
                        "k8s: the kubeconfig {} gives no usable context `{context}`: {e}; `kubectl config get-contexts` lists them",
                        path.display()
                    ))
                })?
        }
        None if context == IN_CLUSTER => Config::incluster().map_err(|e| {
            Error::InvalidInput(format!(
                "k8s: no kubeconfig (KUBECONFIG, ~/.kube/config) and not inside a cluster ({e}); set KUBECONFIG to your cluster's kubeconfig"
            ))
        })?,
        None => {
            return Err(Error::InvalidInput(format!(
                "k8s: the sandbox lives in context `{context}`, but no kubeconfig is found (KUBECONFIG, ~/.kube/config); set KUBECONFIG to the file that has it"
            )));
        }
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    let client = Client::try_from(config).map_err(|e| {
        Error::backend_call(
            KIND,
            BackendFailure::Local,
            format!("making a client for context `{context}`"),
            e,
        )
    })?;
    Ok(Arc::new(Cluster {
        context: context.to_string(),
        client,
        agent_sandbox: OnceCell::new(),
    }))
}

/// berth's error for a failed API call made while `doing`.
pub(crate) fn api_error(context: &str, namespace: &str, doing: &str, e: kube::Error) -> Error {
    let rights = format!(
        "berth needs get, list, create, patch and delete on pods, pods/exec, persistentvolumeclaims and networkpolicies (and sandboxes.agents.x-k8s.io where installed) in namespace `{namespace}`; `kubectl --context {context} auth can-i create pods/exec -n {namespace}` checks one"
    );
    match e {
        kube::Error::Api(s) => {
            let kind = BackendFailure::from_http_status(s.code);
            let detail = format!(
                "{doing} in namespace `{namespace}` (context `{context}`): the API server answered {} {}: {}",
                s.code, s.reason, s.message
            );
            match kind {
                BackendFailure::Auth => Error::unreachable(KIND, kind, detail, rights),
                BackendFailure::Transport | BackendFailure::Timeout => Error::unreachable(
                    KIND,
                    kind,
                    detail,
                    "the API server is failing or overloaded; try again in a moment",
                ),
                _ => Error::backend(KIND, kind, detail),
            }
        }
        kube::Error::Auth(a) => Error::unreachable(
            KIND,
            BackendFailure::Auth,
            format!("{doing}: the kubeconfig's credentials for context `{context}` failed: {a}"),
            "refresh them (log in to the cluster again), then retry",
        ),
        e @ (kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::UpgradeConnection(_)) => Error::unreachable(
            KIND,
            BackendFailure::Transport,
            format!("{doing}: the API server of context `{context}` could not be reached: {e}"),
            format!(
                "check that the cluster is up: `kubectl --context {context} get ns {namespace}`"
            ),
        )
        .caused_by(e),
        e => Error::backend_call(KIND, BackendFailure::Protocol, doing.to_string(), e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_come_from_the_settings_then_the_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: two\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: one\n  context:\n    cluster: c\n    user: u\n- name: two\n  context:\n    cluster: c\n    user: u\n    namespace: team\nusers:\n- name: u\n  user: {}\n",
        )
        .unwrap();
        let mut s = K8sSettings {
            kubeconfig: Some(path),
            ..K8sSettings::default()
        };
        assert_eq!(defaults(&s, None), ("two".into(), "team".into()));
        assert_eq!(defaults(&s, Some("one")), ("one".into(), "default".into()));
        s.namespace = Some("mine".into());
        s.context = Some("one".into());
        assert_eq!(defaults(&s, None), ("one".into(), "mine".into()));
    }
}
