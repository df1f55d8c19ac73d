//! The k8s backend on a bad day, against the k8s stand-in (pods run as
//! containers on the real Docker engine): a pod evicted or deleted, a node
//! drained or lost, the API server gone for a while, a job in a pod that is
//! gone; and the pod berth asks for, as the cluster sees it.

use std::sync::Arc;
use std::time::Duration;

use berth_backends::k8s::K8sBackend;
use berth_core::backend::{Backend, Network, RemoveOpts, SandboxSpec};
use berth_core::error::Error;
use berth_core::session::{ExecOpts, Session, SessionConfig};
use berth_standins::k8s::{K8sStandin, resources};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{EvictParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::support::{BoxError, TestResult, k8s_standin};

/// A kube-rs client on the stand-in: the cluster's own API, as `kubectl`
/// or an operator would use it to take a pod away.
async fn client(standin: &K8sStandin) -> Result<kube::Client, BoxError> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(standin.kubeconfig())?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// The pod of berth sandbox `name`, as the stand-in holds it.
fn pod_of(standin: &K8sStandin, name: &str) -> Option<Value> {
    let (pods, _) = standin.state().store.list(resources::pods(), None);
    pods.into_iter()
        .find(|p| p["metadata"]["annotations"]["berth.dev/name"] == name)
}

fn pod_name(p: &Value) -> String {
    p["metadata"]["name"].as_str().unwrap_or("").to_string()
}

fn node_of(p: &Value) -> String {
    p["spec"]["nodeName"].as_str().unwrap_or("").to_string()
}

async fn setup(agent_sandbox: bool) -> Result<(K8sStandin, Arc<K8sBackend>), BoxError> {
    let (standin, backend, _) = k8s_standin(agent_sandbox).await?;
    Ok((standin, Arc::new(backend)))
}

/// A session with a file in the workspace, a variable and a function.
async fn busy_session(b: &K8sBackend, name: &str) -> Result<Session, BoxError> {
    let p = b.provision(&SandboxSpec::named(name)).await?;
    assert!(p.created, "a new sandbox is made, not found");
    let mut s = Session::open(p.sandbox.clone(), SessionConfig::named(name)).await?;
    let r = s
        .exec(
            "echo 'the data' > kept.txt; export KEPT=yes; greet() { echo hi from $1; }",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(r.exit_code, 0, "{}", r.output.text());
    Ok(s)
}

/// After the pod went: the old session says its sandbox is gone, the next
/// provision brings the pod back and says why (`why` in its words), and a
/// new session has the workspace and the session's state.
async fn comes_back(b: &K8sBackend, name: &str, mut old: Session, why: &[&str]) -> TestResult {
    let e = old
        .exec("echo still", ExecOpts::default())
        .await
        .err()
        .ok_or("a command in a sandbox whose pod went reported an exit")?;
    assert!(e.is_sandbox_gone(), "{e}");
    assert!(e.to_string().contains("run the command again"), "{e}");
    let again = b.provision(&SandboxSpec::named(name)).await?;
    assert!(!again.created);
    let said = again.recreated.ok_or("the pod's return was not reported")?;
    for w in why {
        assert!(said.contains(w), "{w:?} not in: {said}");
    }
    let mut s = Session::open(again.sandbox.clone(), SessionConfig::named(name)).await?;
    let r = s
        .exec("cat kept.txt; echo $KEPT; greet k8s", ExecOpts::default())
        .await?;
    assert_eq!(r.output.text(), "the data\nyes\nhi from k8s\n");
    b.remove(name, RemoveOpts { volumes: true }).await?;
    Ok(())
}

/// An evicted pod: agent-sandbox's controller brings a new one on the same
/// claims; berth sees the new uid, says so, and the session comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_comes_back_with_its_workspace_and_session() -> TestResult {
    let (standin, b) = setup(true).await?;
    let s = busy_session(&b, "evicted").await?;
    let pod = pod_of(&standin, "evicted").ok_or("no pod")?;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client(&standin).await?, "default");
    pods.evict(&pod_name(&pod), &EvictParams::default()).await?;
    comes_back(
        &b,
        "evicted",
        s,
        &["evicted or deleted", "same workspace volume"],
    )
    .await
}

/// A deleted plain pod (no agent-sandbox): nothing brings it back but
/// berth, on the next call, on the claims it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_plain_pod_is_made_again_on_its_claims() -> TestResult {
    let (standin, b) = setup(false).await?;
    let s = busy_session(&b, "deleted").await?;
    let pod = pod_of(&standin, "deleted").ok_or("no pod")?;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client(&standin).await?, "default");
    pods.delete(&pod_name(&pod), &Default::default()).await?;
    comes_back(&b, "deleted", s, &["evicted or deleted"]).await
}

/// `kubectl drain` as it works: cordon the node, evict its pods. The pod
/// comes back on another node and berth names the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_is_named_and_the_session_moves() -> TestResult {
    let (standin, b) = setup(false).await?;
    let s = busy_session(&b, "drained").await?;
    let pod = pod_of(&standin, "drained").ok_or("no pod")?;
    let node = node_of(&pod);
    let c = client(&standin).await?;
    let nodes: kube::Api<Node> = kube::Api::all(c.clone());
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    let pods: kube::Api<Pod> = kube::Api::namespaced(c, "default");
    pods.evict(&pod_name(&pod), &EvictParams::default()).await?;
    let drained = format!("its node {node} was drained");
    comes_back(&b, "drained", s, &[&drained]).await?;
    Ok(())
}

/// A node lost: NotReady, its pods deleted. berth names the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_is_named_and_the_session_moves() -> TestResult {
    let (standin, b) = setup(true).await?;
    let s = busy_session(&b, "lost-node").await?;
    let node = node_of(&pod_of(&standin, "lost-node").ok_or("no pod")?);
    assert_eq!(standin.lose_node(&node).await?, 1);
    let lost = format!("its node {node} was lost");
    comes_back(&b, "lost-node", s, &[&lost]).await
}

/// The API server away for a while: the command in flight fails saying
/// the connection was lost (never an exit it did not see), and once the
/// server is back the session is restored in the same pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_api_connection_is_said_and_the_session_comes_back() -> TestResult {
    let (standin, b) = setup(true).await?;
    let mut s = busy_session(&b, "outage").await?;
    let uid = pod_of(&standin, "outage").ok_or("no pod")?["metadata"]["uid"].clone();
    let standin = Arc::new(standin);
    let cut = standin.clone();
    let cutter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cut.outage(Duration::from_secs(3)).await
    });
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        s.exec("sleep 20; echo finished", ExecOpts::default()),
    )
    .await
    .map_err(|_| "the cut went unnoticed: the command did not end")?;
    cutter.await??;
    let e = r
        .err()
        .ok_or("a command whose connection was cut reported an exit")?;
    let text = e.full_text();
    assert!(
        text.contains("the connection was lost while the command ran")
            && text.contains("Connection refused"),
        "{text}"
    );
    // Back: the same pod, the session restored.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let again = b.provision(&SandboxSpec::named("outage")).await?;
    assert!(again.recreated.is_none(), "{:?}", again.recreated);
    assert_eq!(
        pod_of(&standin, "outage").ok_or("no pod")?["metadata"]["uid"],
        uid
    );
    let mut s = Session::open(again.sandbox.clone(), SessionConfig::named("outage")).await?;
    let r = s
        .exec("cat kept.txt; echo $KEPT", ExecOpts::default())
        .await?;
    assert_eq!(r.output.text(), "the data\nyes\n");
    b.remove("outage", RemoveOpts { volumes: true }).await?;
    Ok(())
}

/// A job in a pod that is deleted is `lost` once berth has looked, never
/// `running`; the sandbox works again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_a_deleted_pod_is_lost() -> TestResult {
    let h = crate::support::k8s_pods_harness().await?;
    let standin = h
        ._keep
        .first()
        .and_then(|k| k.downcast_ref::<K8sStandin>())
        .ok_or("the harness keeps its stand-in first")?;
    let kubeconfig = standin.kubeconfig();
    let pods_of = |name: String| {
        let kubeconfig = kubeconfig.clone();
        let pod = pod_of(standin, &name).map(|p| pod_name(&p));
        async move {
            let config = kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(kubeconfig)?,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            let pods: kube::Api<Pod> =
                kube::Api::namespaced(kube::Client::try_from(config)?, "default");
            pods.delete(&pod.ok_or("no pod")?, &Default::default())
                .await?;
            Ok(())
        }
    };
    crate::jobs::a_job_whose_sandbox_was_replaced_is_lost(&h, pods_of).await
}

/// The pod as the cluster sees it: not root, no capabilities, the
/// RuntimeDefault seccomp profile, no service account token, the limits
/// asked, egress denied by a NetworkPolicy; and the same inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_is_one_a_cluster_admin_would_accept() -> TestResult {
    let (standin, b) = setup(true).await?;
    let mut spec = SandboxSpec::named("strict");
    spec.limits.memory_mb = Some(256);
    let p = b.provision(&spec).await?;
    let pod = pod_of(&standin, "strict").ok_or("no pod")?;
    let podspec = &pod["spec"];
    assert_eq!(podspec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        podspec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(podspec["automountServiceAccountToken"], false);
    let c = &podspec["containers"][0];
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
    let object = pod_name(&pod);
    let policy = standin
        .object(
            "networkpolicies.networking.k8s.io",
            "default",
            &format!("{object}-deny-egress"),
        )
        .ok_or("no deny-egress NetworkPolicy")?;
    assert_eq!(policy["spec"]["policyTypes"], json!(["Egress"]));
    assert!(policy["spec"]["egress"].is_null());
    assert_eq!(
        pod["metadata"]["labels"]["berth.dev/installation"]
            .as_str()
            .map(str::len),
        Some(10)
    );
    // Inside: uid 1000, no effective capabilities, no network.
    let mut s = Session::open(p.sandbox.clone(), SessionConfig::named("strict")).await?;
    let r = s
        .exec(
            "id -u; grep CapEff /proc/self/status | tr -d '\\t'; curl -sS --max-time 3 http://1.1.1.1/ >/dev/null 2>&1 && echo reached || echo no-network",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(
        r.output.text(),
        "1000\nCapEff:0000000000000000\nno-network\n"
    );
    // The settings are the sandbox's: other ones are refused, naming them.
    spec.limits.memory_mb = Some(512);
    let e = b
        .provision(&spec)
        .await
        .err()
        .ok_or("a sandbox was used with other settings")?;
    assert!(
        e.to_string()
            .contains("memory: the sandbox has 256 MiB, asked 512 MiB"),
        "{e}"
    );
    // With the network on there is no policy.
    let mut open = SandboxSpec::named("open");
    open.network = Network::Open;
    let o = b.provision(&open).await?;
    let obj = pod_name(&pod_of(&standin, "open").ok_or("no pod")?);
    assert!(
        standin
            .object(
                "networkpolicies.networking.k8s.io",
                "default",
                &format!("{obj}-deny-egress")
            )
            .is_none()
    );
    drop(o);
    // Listed, then removed with its claims: berth saw the pods go.
    let listed = b.list().await?;
    let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["open", "strict"], "{listed:?}");
    assert!(listed.iter().all(|i| i.state == "running"), "{listed:?}");
    b.remove("strict", RemoveOpts { volumes: true }).await?;
    b.remove("open", RemoveOpts { volumes: true }).await?;
    assert!(pod_of(&standin, "strict").is_none());
    let (claims, _) = standin.state().store.list(resources::pvcs(), None);
    assert!(claims.is_empty(), "{claims:?}");
    let e = b
        .remove("strict", RemoveOpts { volumes: true })
        .await
        .err()
        .ok_or("removing a sandbox that is not there succeeded")?;
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    Ok(())
}

/// No kubeconfig and no cluster around: the error says what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_kubeconfig_the_error_says_what_to_set() -> TestResult {
    let b = K8sBackend::new(berth_backends::K8sSettings::default(), "0123456789");
    let e = b
        .provision(&SandboxSpec::named("nowhere"))
        .await
        .err()
        .ok_or("a sandbox was made with no cluster")?;
    assert!(e.to_string().contains("KUBECONFIG"), "{e}");
    Ok(())
}

/// `sandbox rm --keep-workspace` on a `Sandbox`: its claims are its own
/// (volumeClaimTemplates), so berth deletes it with `propagationPolicy:
/// Orphan`; the claims stay, and a sandbox of the same name made later
/// mounts them. On plain pods the claims are berth's, and stay as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_that_keeps_the_workspace_keeps_it() -> TestResult {
    for agent_sandbox in [true, false] {
        let (standin, b) = setup(agent_sandbox).await?;
        let s = busy_session(&b, "kept").await?;
        s.close().await;
        b.remove("kept", RemoveOpts { volumes: false }).await?;
        let again = b.provision(&SandboxSpec::named("kept")).await?;
        let mut s = Session::open(again.sandbox.clone(), SessionConfig::named("kept")).await?;
        let r = s.exec("cat kept.txt", ExecOpts::default()).await?;
        assert_eq!(
            r.output.text(),
            "the data\n",
            "agent-sandbox {agent_sandbox}: the workspace did not survive"
        );
        s.close().await;
        b.remove("kept", RemoveOpts { volumes: true }).await?;
        // Removed with its volumes: no claim of it is left.
        let (claims, _) = standin.state().store.list(resources::pvcs(), None);
        assert!(
            claims.is_empty(),
            "agent-sandbox {agent_sandbox}: claims left: {claims:?}"
        );
    }
    Ok(())
}
