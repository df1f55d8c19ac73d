//! `berth bench --backend ssh`: the persistent session's round trip against a
//! fresh `ssh host cmd` per command, measured in the same run.
//!
//! The floor is OpenSSH's own client multiplexed over a ControlMaster that is
//! established before timing starts, so each fresh command pays only for a new
//! client process, a mux session and a remote shell, never for a handshake.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_core::backend::{Backend, SandboxSpec};
use berth_core::error::{Error, Result};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use serde::Serialize;

use super::{KIND, SshBackend, Target};
use crate::SshOptions;

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

    let floor = openssh_floor(&opts, &target, n).await?;
    let session_per = session_total / n as u32;
    let ssh_per = floor / n as u32;
    Ok(BenchReport {
        host: target.label(),
        commands: n,
        session_per_command: session_per,
        openssh_per_command: ssh_per,
        speedup: ssh_per.as_secs_f64() / session_per.as_secs_f64().max(1e-9),
    })
}

fn bench_error(detail: String) -> Error {
    Error::Backend {
        backend: KIND,
        detail: format!("bench: {detail}"),
    }
}

/// Time `n` runs of `ssh ... host true` over a ControlMaster set up beforehand.
async fn openssh_floor(opts: &SshOptions, t: &Target, n: usize) -> Result<Duration> {
    let dir = std::env::temp_dir().join(format!("berth-bench-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let control = dir.join("cm");
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
        format!("ControlPath={}", control.display()),
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
    let run = |extra: &[&str]| {
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
    };
    let host = t.host.as_str();
    let out = run(&[host, "true"]).output().await.map_err(|e| {
        bench_error(format!(
            "cannot run OpenSSH's `ssh` client: {e}; install openssh-client"
        ))
    })?;
    if !out.status.success() {
        cleanup(&dir);
        return Err(bench_error(format!(
            "OpenSSH could not reach {}: {}",
            t.label(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let started = Instant::now();
    for _ in 0..n {
        let st = run(&[host, "true"])
            .status()
            .await
            .map_err(|e| bench_error(format!("ssh: {e}")))?;
        if !st.success() {
            cleanup(&dir);
            return Err(bench_error(format!("`ssh {host} true` failed: {st}")));
        }
    }
    let total = started.elapsed();
    let _ = run(&["-O", "exit", host]).output().await;
    cleanup(&dir);
    Ok(total)
}

fn cleanup(dir: &PathBuf) {
    let _ = std::fs::remove_dir_all(dir);
}
