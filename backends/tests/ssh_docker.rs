//! The ssh backend across a real network that can be cut: sshd runs in a
//! container of berth's sandbox image on a private Docker network, and the test
//! pulls the container off the network mid-command with `docker network
//! disconnect`. No RST arrives, so only keepalives can notice.
//!
//! Needs Docker and the image `berth-sandbox:latest` (CI builds it before the
//! tests). Without a Docker daemon the test says so and passes; with Docker but
//! without the image it fails and says how to build it.

#![cfg(feature = "ssh")]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_backends::SshOptions;
use berth_backends::ssh::SshBackend;
use berth_backends::ssh::testing::keygen;
use berth_core::backend::{Backend, SandboxSpec};
use berth_core::error::Error;
use berth_core::session::{ExecOpts, Session, SessionConfig};

const IMAGE: &str = "berth-sandbox:latest";

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run docker: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Removes the container and the network, whatever happened.
struct Cleanup {
    container: String,
    network: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.container]);
        let _ = docker(&["network", "rm", &self.network]);
    }
}

async fn wait_until(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_cut_network_fails_the_command_and_the_session_recovers() -> TestResult {
    // CI always has the engine: a missing daemon is a failure, never a pass.
    if let Err(e) = docker(&["info", "--format", "{{.ServerVersion}}"]) {
        return Err(format!(
            "this test needs a Docker daemon and the image {IMAGE}: {e}; start the daemon (or set DOCKER_HOST)"
        )
        .into());
    }
    if docker(&["image", "inspect", IMAGE]).is_err() {
        return Err(format!(
            "this test needs the image {IMAGE} (with /usr/sbin/sshd): build berth's sandbox image from images/ first"
        )
        .into());
    }
    let tag = format!("berth-ssh-net-{}", std::process::id());
    let guard = Cleanup {
        container: tag.clone(),
        network: tag.clone(),
    };
    let dir = tempfile::Builder::new()
        .prefix("berth-ssh-docker-")
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let host_key = dir.path().join("host_ed25519");
    let user_key = dir.path().join("user_ed25519");
    keygen(&host_key, "")?;
    keygen(&user_key, "")?;
    std::fs::copy(
        user_key.with_extension("pub"),
        dir.path().join("authorized_keys"),
    )?;
    std::fs::set_permissions(
        dir.path().join("authorized_keys"),
        std::fs::Permissions::from_mode(0o644),
    )?;
    std::fs::write(
        dir.path().join("sshd_config"),
        "Port 22\nHostKey /berth-ssh/host_ed25519\nAuthorizedKeysFile /berth-ssh/authorized_keys\n\
         StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         PubkeyAuthentication yes\nSubsystem sftp internal-sftp\nLogLevel VERBOSE\n",
    )?;
    // A subnet of our own, so the container can rejoin with the same address.
    let mut created = Err(String::new());
    for i in 0..8u32 {
        let n = (std::process::id().wrapping_mul(31).wrapping_add(i * 97)) % 250;
        let subnet = format!("10.231.{n}.0/24");
        created = docker(&["network", "create", "--subnet", &subnet, &tag]);
        if created.is_ok() {
            break;
        }
    }
    created?;
    let mount = format!("{}:/berth-ssh:ro", dir.path().display());
    docker(&[
        "run",
        "-d",
        "--name",
        &tag,
        "--network",
        &tag,
        "--user",
        "root",
        "-v",
        &mount,
        IMAGE,
        "sh",
        "-c", // The image's user has a locked password ("!"), which sshd refuses even for
        // key logins without PAM; "*" means no password, yet not locked.
        "sed -i 's/^berth:!/berth:*/' /etc/shadow && mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e -f /berth-ssh/sshd_config",
    ])?;
    let ip = docker(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{tag}\").IPAddress}}}}"),
        &tag,
    ])?;
    let pubkey = std::fs::read_to_string(host_key.with_extension("pub"))?;
    let mut fields = pubkey.split_whitespace();
    let known = dir.path().join("known_hosts");
    std::fs::write(
        &known,
        format!(
            "{ip} {} {}\n",
            fields.next().ok_or("host key")?,
            fields.next().ok_or("host key")?
        ),
    )?;
    wait_until("sshd in the container", Duration::from_secs(30), || {
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::new(ip.parse().unwrap_or([0, 0, 0, 0].into()), 22),
            Duration::from_millis(500),
        )
        .is_ok()
    })
    .await?;

    let opts = SshOptions {
        host: Some(format!("berth@{ip}")),
        home: Some(dir.path().to_path_buf()),
        local_user: Some("berth".into()),
        config_path: Some(dir.path().join("no-config")),
        known_hosts: Some(known),
        identity_files: vec![user_key],
        connect_timeout: Some(Duration::from_secs(5)),
        keepalive_interval: Some(Duration::from_secs(1)),
        keepalive_max: Some(2),
        ..SshOptions::default()
    };
    let backend = SshBackend::new(opts);
    let sb = backend.provision(&SandboxSpec::named("net")).await?.sandbox;
    let mut s = Session::open(sb, SessionConfig::named("net")).await?;
    s.exec("cd /tmp && export KEEP=net", ExecOpts::default())
        .await?;

    let cut = async {
        wait_until("the command to run", Duration::from_secs(20), || {
            docker(&["exec", &tag, "pgrep", "-f", "sleep 61"]).is_ok()
        })
        .await?;
        docker(&["network", "disconnect", &tag, &tag])
    };
    let (r, cut) = tokio::join!(s.exec("sleep 61; echo done", ExecOpts::default()), cut);
    cut?;
    match r {
        Err(Error::Unreachable { detail, .. }) => {
            assert!(detail.contains("connection was lost"), "{detail}")
        }
        Err(e) => panic!("expected a lost-connection error, got {e}"),
        Ok(r) => panic!("a command whose link was cut was reported as {r:?}"),
    }

    // While the link is down the host is unreachable, which is not a missing sandbox.
    match s.exec("true", ExecOpts::default()).await {
        Err(Error::Unreachable { .. }) => {}
        other => panic!("expected Unreachable while the link is down, got {other:?}"),
    }

    docker(&["network", "connect", "--ip", &ip, &tag, &tag])?;
    let r = s.exec("pwd; echo $KEEP", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "/tmp\nnet\n", "{:?}", r.notices);
    drop(guard);
    Ok(())
}
