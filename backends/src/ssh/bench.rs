//! `berth bench --backend ssh`: the persistent session's round trip against a
//! fresh `ssh host cmd` per command, measured in the same run.
//!
//! The floor is OpenSSH's own client multiplexed over a ControlMaster that is
//! established before timing starts, so each fresh command pays only for a new
//! client process, a mux session and a remote shell, never for a handshake.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
use berth_core::backend::{Backend, SandboxSpec};
use berth_core::error::{BackendFailure, Error, Result};
#[cfg(feature = "testing")]
use berth_core::session::{ExecOpts, Session, SessionConfig};
#[cfg(feature = "testing")]
use serde::Serialize;

#[cfg(feature = "testing")]
use super::SshBackend;
use super::{KIND, Target};
use crate::SshOptions;

#[cfg(feature = "testing")]
/// What one benchmark run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The host, as resolved (`user@host:port`).
    pub host: String,
    /// Commands timed per side.
    pub commands: usize,
    /// Mean wall time per command through berth's persistent session.
    pub session_per_command: Duration,
    /// Mean wall time per fresh `ssh host true` over a warm ControlMaster.
    pub openssh_per_command: Duration,
    /// `openssh_per_command / session_per_command`.
    pub speedup: f64,
}

#[cfg(feature = "testing")]
impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ssh {}: {} commands each\n  berth persistent session: {:>9.3} ms/command\n  ssh host cmd (ControlMaster): {:>9.3} ms/command\n  speedup: {:.1}x",
            self.host,
            self.commands,
            self.session_per_command.as_secs_f64() * 1e3,
            self.openssh_per_command.as_secs_f64() * 1e3,
            self.speedup
        )
    }
}

#[cfg(feature = "testing")]
/// Run `n` round trips of `true` each way against `host`.
pub async fn run(opts: SshOptions, host: &str, n: usize) -> Result<BenchReport> {
    let n = n.max(1);
    let target = Target::resolve(&opts, host)?;
    let backend = SshBackend::new(opts.clone());
    let mut spec = SandboxSpec::named("berth-bench");
    spec.options.insert("host".into(), host.to_string());
    let sandbox = backend.provision(&spec).await?.sandbox;
    let mut session = Session::open(sandbox, SessionConfig::named("bench")).await?;
    for _ in 0..3 {
        session.exec("true", ExecOpts::default()).await?;
    }
    let started = Instant::now();
    for _ in 0..n {
        let r = session.exec("true", ExecOpts::default()).await?;
        if r.exit_code != 0 {
            return Err(bench_error(format!(
                "`true` exited {} in the session",
                r.exit_code
            )));
        }
    }
    let session_total = started.elapsed();
    session.close().await;
    backend.close().await;

    let ssh_per = openssh_floor(&opts, &target, n, "true", b"").await?;
    let session_per = session_total / n as u32;
    Ok(BenchReport {
        host: target.label(),
        commands: n,
        session_per_command: session_per,
        openssh_per_command: ssh_per,
        speedup: ssh_per.as_secs_f64() / session_per.as_secs_f64().max(1e-9),
    })
}

fn bench_error(detail: String) -> Error {
    Error::backend(KIND, BackendFailure::Rejected, format!("bench: {detail}"))
}

/// The floor for `berth bench --backend ssh`: the mean time of one fresh
/// `ssh host PROBE` (OpenSSH's client over a ControlMaster established before
/// timing), after checking that the probe prints `expect`. `host` is resolved
/// the way the backend resolves it (config aliases, identities, known_hosts).
pub async fn openssh_per_command(
    opts: &SshOptions,
    host: &str,
    n: usize,
    probe: &str,
    expect: &[u8],
) -> Result<Duration> {
    let target = Target::resolve(opts, host)?;
    openssh_floor(opts, &target, n.max(1), probe, expect).await
}

/// `ssh` with berth's view of the target (port, user, identities, known_hosts)
/// and a ControlMaster socket in `dir`.
fn openssh_command(
    opts: &SshOptions,
    t: &Target,
    dir: &Path,
    extra: &[&str],
) -> tokio::process::Command {
    let mut args: Vec<String> = vec![
        "-F".into(),
        "/dev/null".into(),
        "-o".into(),
        "BatchMode=yes".into(),
        "-o".into(),
        "StrictHostKeyChecking=yes".into(),
        "-o".into(),
        format!("UserKnownHostsFile={}", t.known_hosts.display()),
        "-o".into(),
        "ControlMaster=auto".into(),
        "-o".into(),
        format!("ControlPath={}", dir.join("cm").display()),
        "-o".into(),
        "ControlPersist=120".into(),
        "-p".into(),
        t.port.to_string(),
        "-l".into(),
        t.user.clone(),
    ];
    if t.host_key_name != t.host {
        args.push("-o".into());
        args.push(format!("HostKeyAlias={}", t.host_key_name));
    }
    for (p, _) in t.identity_files.iter().filter(|(p, _)| p.exists()) {
        args.push("-i".into());
        args.push(p.display().to_string());
    }
    let mut c = tokio::process::Command::new("ssh");
    c.args(&args)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(sock) = &opts.agent_socket {
        c.env("SSH_AUTH_SOCK", sock);
    }
    c
}

/// The mean time of `n` runs of `ssh ... host PROBE`; the first, untimed run
/// starts the ControlMaster and checks the probe's output.
async fn openssh_floor(
    opts: &SshOptions,
    t: &Target,
    n: usize,
    probe: &str,
    expect: &[u8],
) -> Result<Duration> {
    // Short: a unix socket path is limited to about 100 bytes.
    let dir = std::env::temp_dir().join(format!("berth-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let host = t.host.as_str();
    let result = async {
        let out = openssh_command(opts, t, &dir, &[host, probe])
            .stdout(Stdio::piped())
            .output()
            .await
            .map_err(|e| {
                bench_error(format!(
                    "cannot run OpenSSH's `ssh` client: {e}; install openssh-client"
                ))
            })?;
        if !out.status.success() {
            return Err(bench_error(format!(
                "OpenSSH could not reach {}: {}",
                t.label(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        if out.stdout != expect {
            return Err(bench_error(format!(
                "`ssh {host} {probe}` printed {:?}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let started = Instant::now();
        for _ in 0..n {
            let st = openssh_command(opts, t, &dir, &[host, probe])
                .status()
                .await
                .map_err(|e| bench_error(format!("ssh: {e}")))?;
            if !st.success() {
                return Err(bench_error(format!("`ssh {host} {probe}` failed: {st}")));
            }
        }
        Ok(started.elapsed() / n as u32)
    }
    .await;
    let _ = openssh_command(opts, t, &dir, &["-O", "exit", host])
        .output()
        .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
