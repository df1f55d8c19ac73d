//! The docker backend's lifecycle, hardening and files, against the real engine.

#![cfg(feature = "docker")]

#[path = "common/docker.rs"]
mod common;

use std::time::Duration;

use berth_backends::docker::{LABEL_MANAGED, LABEL_SANDBOX};
use berth_core::Error;
use berth_core::backend::{Backend, RemoveOpts, Sandbox, SandboxSpec, SpawnOpts};
use common::*;
use tokio::io::AsyncReadExt;

/// Run a bash snippet through a fresh spawn; return (stdout, exit code).
async fn sh(sb: &dyn Sandbox, script: &str) -> TestResult<(String, i32)> {
    let argv: Vec<String> = ["bash", "-c", script]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut p = sb.spawn(&argv, SpawnOpts::default()).await?;
    drop(p.take_stdin());
    let mut out = String::new();
    p.take_stdout()
        .ok_or("no stdout")?
        .read_to_string(&mut out)
        .await?;
    let st = p.wait().await?;
    Ok((out, st.code.unwrap_or(-1)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_sandbox_is_hardened() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "hard").await?;
    let c = b
        .client()
        .inspect_container(&b.names().container(sb.name()), None)
        .await?;
    let hc = c.host_config.clone().ok_or("no host config")?;
    let config = c.config.clone().ok_or("no config")?;
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(
        hc.cap_add.unwrap_or_default().is_empty(),
        "no capability is added back by default"
    );
    assert!(
        hc.security_opt
            .unwrap_or_default()
            .iter()
            .any(|o| o.starts_with("no-new-privileges")),
        "no-new-privileges"
    );
    assert!(hc.pids_limit.unwrap_or(0) > 0, "pids limit");
    assert!(hc.memory.unwrap_or(0) > 0, "memory limit");
    assert!(hc.nano_cpus.unwrap_or(0) > 0, "cpu quota");
    assert_eq!(hc.network_mode.as_deref(), Some("none"));
    assert_eq!(hc.privileged, Some(false));
    let user = config.user.unwrap_or_default();
    assert!(
        !user.is_empty() && !user.starts_with("0") && !user.starts_with("root"),
        "user {user:?}"
    );
    let labels = config.labels.unwrap_or_default();
    assert_eq!(labels.get(LABEL_MANAGED).map(String::as_str), Some("1"));
    assert_eq!(
        labels.get(LABEL_SANDBOX).map(String::as_str),
        Some(sb.name())
    );
    // And from inside: not root, no capabilities, no_new_privs, tini as PID 1, no network.
    let (out, code) = sh(
        &*sb,
        "id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status | tr -s '\\t ' ' '; cat /proc/1/comm; ls /sys/class/net",
    )
    .await?;
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "1000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nNoNewPrivs: 1\ntini\nlo\n"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_root_keeps_tmp_and_workspace_writable() -> TestResult {
    let b = backend().await?;
    let name = unique("ro");
    let _g = Cleanup::of(&b, name.clone());
    let mut spec = SandboxSpec::named(&name);
    spec.options.insert("read_only".into(), "true".into());
    let sb = b.provision(&spec).await?.sandbox;
    let (out, _) = sh(
        &*sb,
        "touch /etc/x 2>/dev/null && echo etc-writable; touch /tmp/x && echo tmp-ok; touch /workspace/x && echo ws-ok",
    )
    .await?;
    assert_eq!(out, "tmp-ok\nws-ok\n");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_through_the_archive_api() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "files").await?;
    let data: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024 + 7).collect();
    sb.write_file("deep/er/blob.bin", &data, 0o640).await?;
    assert_eq!(
        sb.read_file("/workspace/deep/er/blob.bin", u64::MAX)
            .await?,
        data
    );
    assert_eq!(sb.read_file("deep/er/blob.bin", 10).await?, &data[..10]);
    let (out, _) = sh(
        &*sb,
        "stat -c '%a %U %G' /workspace/deep/er/blob.bin /workspace/deep/er",
    )
    .await?;
    assert_eq!(out, "640 berth berth\n755 berth berth\n");
    // Replacing a file, and an empty file.
    sb.write_file("/tmp/a.txt", b"one", 0o600).await?;
    sb.write_file("/tmp/a.txt", b"", 0o644).await?;
    assert_eq!(sb.read_file("/tmp/a.txt", 100).await?, b"");
    match sb.read_file("no/such/file", 10).await {
        Err(Error::NotFound { what: "file", .. }) => {}
        other => return Err(format!("missing file gave {other:?}").into()),
    }
    match sb.read_file("/workspace", 10).await {
        Err(Error::InvalidInput(msg)) => assert!(msg.contains("directory"), "{msg}"),
        other => return Err(format!("a directory read gave {other:?}").into()),
    }
    // Symlinks are followed, relative and absolute.
    let os = sb.read_file("/etc/os-release", 4096).await?;
    assert!(String::from_utf8_lossy(&os).contains("bookworm"));
    sh(
        &*sb,
        "ln -s deep/er/blob.bin /workspace/link; ln -s /workspace/link /tmp/link2",
    )
    .await?;
    assert_eq!(sb.read_file("/tmp/link2", 10).await?, &data[..10]);
    // The sandbox user cannot write where it has no permission.
    assert!(
        sb.write_file("/etc/forbidden/x", b"x", 0o644)
            .await
            .is_err()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_restarts_recreates_and_remove_cleans_up() -> TestResult {
    let b = backend().await?;
    let (sb, _g) = sandbox(&b, "life").await?;
    let name = sb.name().to_string();
    let spec = SandboxSpec::named(&name);
    sb.write_file("keep.txt", b"kept", 0o644).await?;
    assert!(
        b.list()
            .await?
            .iter()
            .any(|i| i.name == name && i.state == "running")
    );

    // Stopped from outside: provision starts it again and says so.
    b.client()
        .stop_container(&b.names().container(&name), None)
        .await?;
    assert!(!sb.alive().await?);
    let p = b.provision(&spec).await?;
    assert!(!p.created);
    let why = p.recreated.ok_or("a restart must be reported")?;
    assert!(why.contains("started again"), "{why}");
    assert!(
        sb.alive().await?,
        "the old handle follows the container by name"
    );

    // Paused from outside: not alive; provision unpauses it.
    b.client()
        .pause_container(&b.names().container(&name))
        .await?;
    assert!(!sb.alive().await?);
    let why = b
        .provision(&spec)
        .await?
        .recreated
        .ok_or("unpause not reported")?;
    assert!(why.contains("unpaused"), "{why}");
    assert!(sb.alive().await?);

    // Removed from outside: provision recreates it on the volumes.
    b.client()
        .remove_container(
            &b.names().container(&name),
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await?;
    assert!(!sb.alive().await?);
    let p = b.provision(&spec).await?;
    assert!(!p.created);
    let why = p.recreated.ok_or("a recreation must be reported")?;
    assert!(why.contains("gone"), "{why}");
    assert_eq!(p.sandbox.read_file("keep.txt", 100).await?, b"kept");

    // remove without volumes keeps the workspace but not berth's state: the
    // next sandbox of the name starts with the files and a fresh state volume.
    sb.write_file("/var/lib/berth/marker", b"old state", 0o644)
        .await?;
    b.remove(&name, RemoveOpts { volumes: false }).await?;
    assert!(volume_exists(&b, &b.names().workspace_volume(&name)).await?);
    assert!(!volume_exists(&b, &b.names().state_volume(&name)).await?);
    let p = b.provision(&spec).await?;
    assert!(p.recreated.is_some());
    assert_eq!(p.sandbox.read_file("keep.txt", 100).await?, b"kept");
    assert!(matches!(
        p.sandbox.read_file("/var/lib/berth/marker", 100).await,
        Err(Error::NotFound { .. })
    ));
    b.remove(&name, RemoveOpts { volumes: true }).await?;
    assert!(!b.list().await?.iter().any(|i| i.name == name));
    match b.remove(&name, RemoveOpts { volumes: true }).await {
        Err(Error::NotFound {
            what: "sandbox", ..
        }) => {}
        other => return Err(format!("removing twice gave {other:?}").into()),
    }
    let p = b.provision(&spec).await?;
    assert!(p.created);
    assert!(matches!(
        p.sandbox.read_file("keep.txt", 100).await,
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_exited_containers_only() -> TestResult {
    let b = backend().await?;
    let (running, _g1) = sandbox(&b, "gc-run").await?;
    let (stopped, _g2) = sandbox(&b, "gc-stop").await?;
    b.client()
        .stop_container(&b.names().container(stopped.name()), None)
        .await?;
    // Only this test's sandboxes: other tests stop and restart theirs meanwhile.
    let mine = [running.name().to_string(), stopped.name().to_string()];
    let select = |n: &str| mine.iter().any(|m| m == n);
    // A long threshold keeps the freshly stopped one.
    let r = b.gc_where(Duration::from_secs(3600), select).await?;
    assert!(!r.removed.iter().any(|n| n == stopped.name()));
    assert_eq!(r.kept, 2);
    let r = b.gc_where(Duration::ZERO, select).await?;
    assert!(r.removed.iter().any(|n| n == stopped.name()), "{r:?}");
    assert!(!r.removed.iter().any(|n| n == running.name()), "{r:?}");
    assert!(running.alive().await?);
    let names: Vec<String> = b.list().await?.into_iter().map(|i| i.name).collect();
    assert!(!names.iter().any(|n| n == stopped.name()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_are_refused_clearly() -> TestResult {
    let b = backend().await?;
    let mut spec = SandboxSpec::named(unique("bad"));
    spec.options.insert("privileged".into(), "true".into());
    let e = b
        .provision(&spec)
        .await
        .err()
        .ok_or("unknown option accepted")?;
    assert!(
        e.to_string().contains("unknown docker option `privileged`"),
        "{e}"
    );
    let e = b
        .provision(&SandboxSpec::named("bad/name"))
        .await
        .err()
        .ok_or("bad name accepted")?;
    assert!(e.to_string().contains("invalid sandbox name"), "{e}");
    let mut spec = SandboxSpec::named(unique("noimg"));
    spec.image = Some("no-such-image-berth:1".into());
    let _g = Cleanup::of(&b, spec.name.clone());
    match b.provision(&spec).await {
        Err(Error::NotFound {
            what: "image",
            hint,
            ..
        }) => assert!(hint.contains("does not pull")),
        Err(e) => return Err(format!("missing custom image gave {e}").into()),
        Ok(_) => return Err("a missing custom image was provisioned".into()),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_network_follow_the_spec() -> TestResult {
    let b = backend().await?;
    let name = unique("limits");
    let _g = Cleanup::of(&b, name.clone());
    let mut spec = SandboxSpec::named(&name);
    spec.network = berth_core::backend::Network::Open;
    spec.limits.memory_mb = Some(256);
    spec.limits.pids = Some(64);
    spec.limits.milli_cpu = Some(500);
    spec.options.insert("cap_add".into(), "CHOWN".into());
    let sb = b.provision(&spec).await?.sandbox;
    let c = b
        .client()
        .inspect_container(&b.names().container(&name), None)
        .await?;
    let hc = c.host_config.ok_or("no host config")?;
    assert_eq!(hc.memory, Some(256 * 1024 * 1024));
    assert_eq!(hc.pids_limit, Some(64));
    assert_eq!(hc.nano_cpus, Some(500_000_000));
    assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
    assert_eq!(hc.cap_add, Some(vec!["CHOWN".to_string()]));
    let (out, _) = sh(&*sb, "ls /sys/class/net | sort | tr '\\n' ' '").await?;
    assert!(out.contains("eth0"), "{out}");
    // The pids limit holds inside: a fork loop stops well short of 200.
    let forks = "import os, signal, time\nkids = []\ntry:\n    while len(kids) < 200:\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n        kids.append(pid)\nexcept OSError:\n    pass\nprint(len(kids))\nfor k in kids:\n    os.kill(k, signal.SIGKILL)\n";
    sb.write_file("/tmp/forks.py", forks.as_bytes(), 0o644)
        .await?;
    let (out, code) = sh(&*sb, "python3 /tmp/forks.py").await?;
    assert_eq!(code, 0, "{out}");
    let forked: u32 = out.trim().parse()?;
    assert!(
        forked < 64,
        "{forked} processes forked under a pids limit of 64"
    );
    Ok(())
}

async fn volume_exists(b: &berth_backends::docker::DockerBackend, v: &str) -> TestResult<bool> {
    match b.client().inspect_volume(v).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Two installations (two state dirs, or two users) on one daemon: the same
/// sandbox name gives each its own container and volumes, and neither lists,
/// attaches to or collects the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installations_never_share_sandboxes() -> TestResult {
    let a = backend().await?;
    let b = backend().await?;
    assert_ne!(a.names().installation(), b.names().installation());
    let name = unique("owner");
    let _ga = Cleanup::of(&a, name.clone());
    let _gb = Cleanup::of(&b, name.clone());
    let sa = a.provision(&SandboxSpec::named(&name)).await?.sandbox;
    sa.write_file("mine.txt", b"a's", 0o644).await?;
    sa.write_file("/var/lib/berth/marker", b"a's state", 0o644)
        .await?;
    let pb = b.provision(&SandboxSpec::named(&name)).await?;
    assert!(pb.created, "b attached to a's sandbox: {:?}", pb.recreated);
    assert!(matches!(
        pb.sandbox.read_file("mine.txt", 100).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        pb.sandbox.read_file("/var/lib/berth/marker", 100).await,
        Err(Error::NotFound { .. })
    ));
    let c = a
        .client()
        .inspect_container(&a.names().container(&name), None)
        .await?;
    let labels = c.config.and_then(|c| c.labels).unwrap_or_default();
    assert_eq!(
        labels.get(berth_backends::docker::LABEL_INSTALLATION),
        Some(&a.names().installation().to_string())
    );
    // Removing b's sandbox leaves a's whole.
    b.remove(&name, RemoveOpts { volumes: true }).await?;
    assert!(!b.list().await?.iter().any(|i| i.name == name));
    assert!(a.list().await?.iter().any(|i| i.name == name));
    assert_eq!(sa.read_file("mine.txt", 100).await?, b"a's");
    // A volume of the same name but another owner is refused, never mounted.
    let intruder = a.names().workspace_volume(&unique("squat"));
    let squat = intruder
        .trim_start_matches(&format!("berth-{}-", a.names().installation()))
        .trim_end_matches("-workspace")
        .to_string();
    let _gs = Cleanup::of(&a, squat.clone());
    a.client()
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(intruder.clone()),
            ..Default::default()
        })
        .await?;
    match a.provision(&SandboxSpec::named(&squat)).await {
        Err(e) => assert!(e.to_string().contains("did not create it"), "{e}"),
        Ok(_) => return Err("a foreign volume was mounted".into()),
    }
    a.client()
        .remove_volume(
            &intruder,
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await?;
    Ok(())
}

/// `gc_volumes` collects this installation's orphaned state volumes (no
/// container, not on record), workspaces only when asked, and nothing of
/// another installation's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_collects_orphaned_volumes_of_its_own_installation() -> TestResult {
    let a = backend().await?;
    let other = backend().await?;
    let (orphan, _g1) = sandbox(&a, "orph").await?;
    let (kept, _g2) = sandbox(&a, "onrec").await?;
    let (foreign, _g3) = sandbox(&other, "foreign").await?;
    for (b, sb) in [(&a, &orphan), (&a, &kept), (&other, &foreign)] {
        b.client()
            .remove_container(
                &b.names().container(sb.name()),
                Some(bollard::query_parameters::RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await?;
    }
    let on_record = kept.name().to_string();
    let removed = a.gc_volumes(|n| n == on_record, false).await?;
    assert_eq!(removed, vec![a.names().state_volume(orphan.name())]);
    assert!(volume_exists(&a, &a.names().workspace_volume(orphan.name())).await?);
    assert!(volume_exists(&a, &a.names().state_volume(kept.name())).await?);
    let removed = a.gc_volumes(|n| n == on_record, true).await?;
    assert_eq!(removed, vec![a.names().workspace_volume(orphan.name())]);
    assert!(volume_exists(&other, &other.names().state_volume(foreign.name())).await?);
    assert!(volume_exists(&other, &other.names().workspace_volume(foreign.name())).await?);
    Ok(())
}

/// A container is used only with its spec's settings: provisioning an
/// existing sandbox with any one setting other than its container's is
/// refused, names that setting, and leaves the container as it was; a
/// stopped one is not started with other settings either (issue 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_is_never_used_with_other_settings() -> TestResult {
    let b = backend().await?;
    let name = unique("settings");
    let _g = Cleanup::of(&b, name.clone());
    let made = SandboxSpec::named(&name);
    b.provision(&made).await?;
    type Change = Box<dyn Fn(&mut SandboxSpec)>;
    let variants: Vec<(&str, Change)> = vec![
        (
            "network",
            Box::new(|s| s.network = berth_core::backend::Network::Open),
        ),
        ("memory", Box::new(|s| s.limits.memory_mb = Some(300))),
        ("cpus", Box::new(|s| s.limits.milli_cpu = Some(500))),
        ("pids", Box::new(|s| s.limits.pids = Some(64))),
        (
            "user",
            Box::new(|s| {
                s.options.insert("user".into(), "root".into());
            }),
        ),
        (
            "read_only",
            Box::new(|s| {
                s.options.insert("read_only".into(), "true".into());
            }),
        ),
        (
            "cap_add",
            Box::new(|s| {
                s.options.insert("cap_add".into(), "CHOWN".into());
            }),
        ),
        (
            "image",
            Box::new(|s| s.image = Some("berth-sandbox:latest".into())),
        ),
    ];
    for stopped in [false, true] {
        if stopped {
            b.client()
                .stop_container(&b.names().container(&name), None)
                .await?;
        }
        for (setting, change) in &variants {
            let mut other = made.clone();
            change(&mut other);
            match b.provision(&other).await {
                Ok(_) => return Err(format!("{setting} (stopped: {stopped}): accepted").into()),
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        text.contains(&format!("  {setting}")) && text.contains("--keep-workspace"),
                        "{setting}: {text}"
                    );
                }
            }
        }
        let c = b
            .client()
            .inspect_container(&b.names().container(&name), None)
            .await?;
        let running = c.state.and_then(|s| s.running) == Some(true);
        assert_eq!(running, !stopped, "the container was left as it was");
        let hc = c.host_config.ok_or("no host config")?;
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
    }
    // Its own settings: started again.
    assert!(b.provision(&made).await?.recreated.is_some());
    Ok(())
}
