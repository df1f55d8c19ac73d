//! Faults on the docker backend, each against the real engine: the container
//! killed or stopped from outside, the daemon unreachable, the image missing,
//! the exec stream cut.

#![cfg(feature = "docker")]

#[path = "common/docker.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_backends::docker::{BuildProgress, DockerBackend, ImageRecipe, default_host};
use berth_core::Error;
use berth_core::backend::{Backend, Sandbox, SandboxSpec, SpawnOpts};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use common::*;
use tokio::io::AsyncReadExt;

fn cfg(name: &str) -> SessionConfig {
    let mut c = SessionConfig::named(name);
    c.grace = Duration::from_millis(300);
    c
}

/// True once a process whose command line is exactly `cmdline` runs in the sandbox.
async fn running(sb: &dyn Sandbox, cmdline: &str) -> bool {
    let argv: Vec<String> = ["pgrep", "-x", "-f", cmdline]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let Ok(mut p) = sb.spawn(&argv, SpawnOpts::default()).await else {
        return false;
    };
    let mut out = String::new();
    if let Some(mut o) = p.take_stdout() {
        let _ = o.read_to_string(&mut out).await;
    }
    matches!(p.wait().await, Ok(st) if st.code == Some(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_killed_during_a_command_then_restored() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "kill").await?;
    let spec = SandboxSpec::named(sb.name());
    let mut s = Session::open(sb.clone(), cfg("kill")).await?;
    s.exec(
        "cd /workspace && mkdir -p proj && cd proj && export STATE=kept",
        ExecOpts::default(),
    )
    .await?;
    // The session's future is not Send, so the killer runs beside it in this task.
    let killer = async {
        let started = wait_for(Duration::from_secs(10), || running(&*sb, "sleep 41")).await;
        let killed = b
            .client()
            .kill_container(
                &b.names().container(sb.name()),
                None::<bollard::query_parameters::KillContainerOptions>,
            )
            .await;
        (started, killed)
    };
    let (r, (started, killed)) = tokio::join!(s.exec("sleep 41", ExecOpts::default()), killer);
    assert!(started, "the command never started");
    killed?;
    match r {
        Err(e @ Error::SandboxGone { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(sb.name()) && msg.contains("run the command again"),
                "{msg}"
            );
        }
        other => return Err(format!("a killed container gave {other:?}").into()),
    }
    let p = b.provision(&spec).await?;
    assert!(p.recreated.is_some(), "the restart must be reported");
    let r = s.exec("pwd; echo $STATE", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "/workspace/proj\nkept\n");
    assert!(r.restored_from.is_some(), "{:?}", r.notices);
    s.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_stopped_from_outside_then_restored() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "stop").await?;
    let spec = SandboxSpec::named(sb.name());
    let mut s = Session::open(sb.clone(), cfg("stop")).await?;
    s.exec("export STOPPED=1; cd /tmp", ExecOpts::default())
        .await?;
    b.client()
        .stop_container(&b.names().container(sb.name()), None)
        .await?;
    match s.exec("echo hi", ExecOpts::default()).await {
        Err(e) if e.is_sandbox_gone() => {}
        other => return Err(format!("a stopped container gave {other:?}").into()),
    }
    let p = b.provision(&spec).await?;
    let why = p.recreated.ok_or("restart not reported")?;
    assert!(why.contains("started again"), "{why}");
    let r = s.exec("echo $STOPPED; pwd", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "1\n/tmp\n");
    s.close().await;
    Ok(())
}

#[tokio::test]
async fn unreachable_daemon_names_docker_host() -> TestResult {
    let dir = tempfile::tempdir()?;
    let host = format!("unix://{}/no-daemon.sock", dir.path().display());
    match DockerBackend::connect_to(&host).await {
        Err(e @ Error::Unreachable { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("DOCKER_HOST"), "{msg}");
            assert!(msg.contains(&host), "{msg}");
        }
        Err(e) => return Err(format!("wrong error: {e}").into()),
        Ok(_) => return Err("connected to a daemon that does not exist".into()),
    }
    // A socket that exists but has nobody behind it is unreachable too.
    let path = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&path)?);
    let host = format!("unix://{}", path.display());
    match DockerBackend::connect_to(&host).await {
        Err(e @ Error::Unreachable { .. }) => assert!(e.to_string().contains("DOCKER_HOST")),
        Err(e) => return Err(format!("wrong error: {e}").into()),
        Ok(_) => return Err("connected to a dead socket".into()),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_built_on_provision() -> TestResult {
    // Make sure the shared image (and so the cached root filesystem) exists,
    // then point a backend at a repository that has no image yet.
    backend().await?;
    let mut recipe = ImageRecipe::builtin();
    recipe.repo = format!("berth-test-{}", unique("img").to_ascii_lowercase());
    let reference = recipe.reference();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let b = DockerBackend::connect()
        .await?
        .with_recipe(recipe.clone())
        .with_progress(Arc::new(move |p: BuildProgress| {
            print_progress(p.clone());
            if let Ok(mut v) = seen.lock() {
                v.push(p);
            }
        }));
    let name = unique("img");
    let _g = Cleanup::of(&b, name.clone());
    let result = b.provision(&SandboxSpec::named(&name)).await;
    let events = events.lock().map(|v| v.clone()).unwrap_or_default();
    let inspect = b
        .client()
        .inspect_container(&b.names().container(&name), None)
        .await;
    // Clean the test image up before judging.
    let _ = b
        .remove(&name, berth_core::backend::RemoveOpts { volumes: true })
        .await;
    for r in [reference.clone(), format!("{}:latest", recipe.repo)] {
        let _ = b
            .client()
            .remove_image(
                &r,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
    assert!(result?.created);
    assert_eq!(
        inspect?.config.and_then(|c| c.image),
        Some(reference.clone())
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, BuildProgress::Import { .. })),
        "{events:?}"
    );
    assert!(
        events.iter().any(
            |e| matches!(e, BuildProgress::Done { reused: false, reference: r } if *r == reference)
        ),
        "{events:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_exec_stream_is_reported_and_the_session_recovers() -> TestResult {
    backend().await?;
    // The proxy speaks to the daemon over a unix socket; a tcp DOCKER_HOST is
    // a setup this test cannot cover, and says so by failing, never by passing.
    let host = default_host();
    let upstream = host.strip_prefix("unix://").map(String::from).ok_or_else(|| {
        format!(
            "DOCKER_HOST is {host}: this test puts a cutting proxy in front of the daemon and needs a unix:// socket; run it with DOCKER_HOST unset or unix://"
        )
    })?;
    let dir = tempfile::tempdir()?;
    let proxy = Proxy::start(dir.path().join("proxy.sock"), upstream.into())?;
    let b = DockerBackend::connect_to(&format!("unix://{}", proxy.path.display())).await?;
    let (sb, _g) = sandbox(&b, "cut").await?;
    let mut s = Session::open(sb.clone(), cfg("cut")).await?;
    s.exec("export CUT=survived; cd /tmp", ExecOpts::default())
        .await?;
    let cutter = async {
        let started = wait_for(Duration::from_secs(10), || running(&*sb, "sleep 1.5")).await;
        proxy.cut();
        started
    };
    let (r, started) = tokio::join!(
        s.exec("sleep 1.5; echo finished", ExecOpts::default()),
        cutter
    );
    assert!(started, "the command never started");
    let r = r?;
    assert!(
        r.cwd.is_none(),
        "a cut stream cannot deliver the end marker"
    );
    assert!(!r.output.text().contains("finished"));
    assert_eq!(r.exit_code, -1, "a cut command has no exit code");
    assert!(
        r.notices
            .iter()
            .any(|n| n.contains("new shell restored") && n.contains("was cut")),
        "{:?}",
        r.notices
    );
    let r = s.exec("echo $CUT; pwd", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "survived\n/tmp\n");
    assert!(r.restored_from.is_some());
    s.close().await;
    Ok(())
}

/// A unix-socket proxy in front of the daemon whose open connections can be cut.
struct Proxy {
    path: std::path::PathBuf,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    fn start(path: std::path::PathBuf, upstream: std::path::PathBuf) -> std::io::Result<Self> {
        let listener = tokio::net::UnixListener::bind(&path)?;
        let (cut, rx) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let mut rx = rx.clone();
                rx.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::UnixStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = rx.changed() => {}
                    }
                });
            }
        });
        Ok(Self { path, cut, task })
    }

    /// Drop every connection open now; later ones go through.
    fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
