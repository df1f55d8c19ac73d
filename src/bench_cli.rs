//! `berth bench --cli`: whole CLI processes, as a person or a script pays for
//! them: `berth exec -- echo hi` through the server, the same in-process
//! (`BERTH_SERVER=off`), and in the same run the backend's own fastest way
//! without berth: `bash -c` (local), `docker exec` (docker), `ssh` over a
//! ControlMaster (ssh, `--opt host=HOST`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use berth_core::backend::BackendKind;

use crate::bench::BenchArgs;
use crate::context;

/// Whole processes cost milliseconds: fewer runs than the in-process series.
const MAX_RUNS: usize = 100;

/// The median of `n` runs of `cmd`, which must succeed each time.
fn median(n: usize, mut cmd: impl FnMut() -> Command) -> Result<Duration> {
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = cmd();
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let start = Instant::now();
        let o = c.output().context("cannot run the measured command")?;
        runs.push(start.elapsed());
        if !o.status.success() {
            bail!(
                "the measured command failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
    runs.sort();
    Ok(runs[runs.len() / 2])
}

/// The bench's own sandbox, made and removed through the CLI.
const SANDBOX: &str = "berth-bench-cli";

/// The fastest way to run `echo hi` on this backend without berth: the
/// floor a served call is compared with.
enum Floor {
    /// `bash -c` (local).
    Bash,
    /// `docker exec` in the bench sandbox's container.
    DockerExec(String),
    /// OpenSSH with a ControlMaster kept up for the run (`ssh -o
    /// ControlPath=…`): a new channel on one connection per call.
    SshControlMaster {
        host: String,
        port: Option<String>,
        config: Option<PathBuf>,
        control: PathBuf,
    },
}

impl Floor {
    fn label(&self) -> &'static str {
        match self {
            Floor::Bash => "bash -c",
            Floor::DockerExec(_) => "docker exec",
            Floor::SshControlMaster { .. } => "ssh, ControlMaster",
        }
    }

    fn command(&self) -> Command {
        match self {
            Floor::Bash => {
                let mut c = Command::new("bash");
                c.args(["-c", "echo hi"]);
                c
            }
            Floor::DockerExec(id) => {
                let mut c = Command::new("docker");
                c.args(["exec", id, "echo", "hi"]);
                c
            }
            Floor::SshControlMaster {
                host,
                port,
                config,
                control,
            } => {
                let mut c = Command::new("ssh");
                if let Some(f) = config {
                    c.arg("-F").arg(f);
                }
                if let Some(p) = port {
                    c.args(["-p", p]);
                }
                c.args(["-o", "BatchMode=yes", "-o", "ControlMaster=auto"])
                    .arg("-o")
                    .arg(format!("ControlPath={}", control.display()))
                    .args(["-o", "ControlPersist=120", host, "echo", "hi"]);
                c
            }
        }
    }

    /// Close the ControlMaster the floor kept up.
    fn close(&self) {
        if let Floor::SshControlMaster { host, control, .. } = self {
            let _ = Command::new("ssh")
                .arg("-o")
                .arg(format!("ControlPath={}", control.display()))
                .args(["-O", "exit", host])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `user@host:port` or an alias, split for OpenSSH's `ssh`.
fn ssh_target(host: &str) -> (String, Option<String>) {
    match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h.to_string(), Some(p.to_string()))
        }
        _ => (host.to_string(), None),
    }
}

/// One backend's figures.
struct Figures {
    backend: String,
    runs: usize,
    served: Duration,
    off: Duration,
    floor: &'static str,
    floor_d: Duration,
    bash: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(x: Duration, y: Duration) -> f64 {
    x.as_secs_f64() / y.as_secs_f64().max(1e-9)
}

impl Figures {
    fn json(&self) -> serde_json::Value {
        json!({
            "backend": self.backend, "runs": self.runs,
            "server_ms": ms(self.served), "off_ms": ms(self.off), "bash_c_ms": ms(self.bash),
            "floor": self.floor, "floor_ms": ms(self.floor_d),
            "off_over_server": ratio(self.off, self.served),
            "server_over_bash_c": ratio(self.served, self.bash),
            "server_over_floor": ratio(self.served, self.floor_d),
        })
    }

    fn print(&self) {
        println!(
            "whole CLI processes, `echo hi`, median of {} runs ({}):",
            self.runs, self.backend
        );
        let mut rows = vec![
            ("berth exec, server", self.served),
            ("berth exec, BERTH_SERVER=off", self.off),
        ];
        if self.floor != "bash -c" {
            rows.push((self.floor, self.floor_d));
        }
        rows.push(("bash -c (local)", self.bash));
        for (label, d) in rows {
            println!("  {label:<30} {:>8.2} ms", ms(d));
        }
        println!(
            "  the server makes a call {:.1}x faster than in-process; a call costs {:.2}x {}{}",
            ratio(self.off, self.served),
            ratio(self.served, self.floor_d),
            self.floor,
            if self.floor == "bash -c" {
                String::new()
            } else {
                format!(" and {:.2}x bash -c", ratio(self.served, self.bash))
            }
        );
    }
}

/// The backends to measure: `-b local,docker,ssh`, each named once.
fn backends(list: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for b in list.split(',').map(str::trim).filter(|b| !b.is_empty()) {
        if !out.iter().any(|x| x == b) {
            out.push(b.to_string());
        }
    }
    if out.is_empty() {
        bail!("name a backend to measure: -b local, or several: -b local,docker,ssh");
    }
    Ok(out)
}

/// The options for `backend`: plain ones, and those written `BACKEND:KEY=VALUE`
/// for it.
fn options_for(backend: &str, options: &[String]) -> Vec<String> {
    options
        .iter()
        .filter_map(|o| match o.split_once(':') {
            Some((b, rest)) if !b.contains('=') => (b == backend).then(|| rest.to_string()),
            _ => Some(o.clone()),
        })
        .collect()
}

pub async fn run(state_dir: Option<PathBuf>, a: &BenchArgs) -> Result<u8> {
    a.check()?;
    let list = backends(&a.backend)?;
    let mut all = Vec::new();
    for b in &list {
        let one = BenchArgs {
            backend: b.clone(),
            options: options_for(b, &a.options),
            ..a.clone()
        };
        let f = run_one(state_dir.clone(), &one)
            .await
            .with_context(|| format!("the {b} bench"))?;
        if a.json {
            // One object for one backend; one per line for several.
            println!("{}", f.json());
        } else {
            f.print();
        }
        all.push(f);
    }
    if !a.json && all.len() > 1 {
        println!("\nserved `berth exec`, median ms and ratios, all measured in this run:");
        println!(
            "  {:<8} {:>9} {:>22} {:>9} {:>11}",
            "backend", "served", "floor", "/floor", "/bash -c"
        );
        for f in &all {
            println!(
                "  {:<8} {:>9.2} {:>22} {:>9.2} {:>11.2}",
                f.backend,
                ms(f.served),
                format!("{} {:.2}", f.floor, ms(f.floor_d)),
                ratio(f.served, f.floor_d),
                ratio(f.served, f.bash)
            );
        }
    }
    Ok(0)
}

async fn run_one(state_dir: Option<PathBuf>, a: &BenchArgs) -> Result<Figures> {
    let dir = context::state_dir(state_dir)?;
    let n = a.count.clamp(1, MAX_RUNS);
    // The thin client, as a person runs it: `berth` beside this engine.
    let exe = berth_client::engine_path()?.with_file_name(berth_client::CLIENT);
    if !exe.is_file() {
        anyhow::bail!(
            "the berth client is not at {}; build both binaries with `cargo build --release`",
            exe.display()
        );
    }
    let berth_cmd = |args: &[&str], mode: &str| {
        let mut c = Command::new(&exe);
        c.args(args)
            .env("BERTH_STATE_DIR", &dir)
            .env("BERTH_SERVER", mode);
        c
    };
    // The bench sandbox, with the options given (`host=` for ssh).
    let mut create = vec!["sandbox", "create", SANDBOX, "--backend", &a.backend];
    for o in &a.options {
        create.extend(["--opt", o.as_str()]);
    }
    let o = berth_cmd(&create, "auto")
        .stdin(Stdio::null())
        .output()
        .context("cannot run `berth sandbox create`")?;
    if !o.status.success() {
        bail!(
            "cannot create the bench sandbox: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let result = measure(a, n, &dir, &berth_cmd).await;
    let _ = berth_cmd(&["sandbox", "rm", SANDBOX, "--backend", &a.backend], "auto")
        .stdin(Stdio::null())
        .output();
    result
}

async fn measure(
    a: &BenchArgs,
    n: usize,
    dir: &std::path::Path,
    berth_cmd: &dyn Fn(&[&str], &str) -> Command,
) -> Result<Figures> {
    let floor = match BackendKind::parse(&a.backend) {
        Some(BackendKind::Local) => Floor::Bash,
        Some(BackendKind::Docker) => {
            let o = berth_cmd(&["sandbox", "ls", "--backend", "docker", "--json"], "auto")
                .stdin(Stdio::null())
                .output()?;
            let list: serde_json::Value = serde_json::from_slice(&o.stdout)
                .context("`berth sandbox ls --json` did not print JSON")?;
            let id = list
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["name"] == SANDBOX)
                .and_then(|s| s["id"].as_str())
                .context("the bench sandbox has no container id")?;
            Floor::DockerExec(id.to_string())
        }
        Some(BackendKind::Ssh) => {
            let host = a
                .options
                .iter()
                .find_map(|o| o.strip_prefix("host="))
                .context("the ssh bench needs its host: --opt host=HOST (an ~/.ssh/config alias or user@host[:port])")?;
            let (host, port) = ssh_target(host);
            // berth reads $HOME/.ssh/config; OpenSSH the passwd entry's: give it the same file.
            let config = std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".ssh/config"))
                .filter(|p| p.is_file());
            Floor::SshControlMaster {
                host,
                port,
                config,
                control: dir.join(format!("bench-cm-{}", std::process::id())),
            }
        }
        // e2b and modal have no client of their own to compare with here.
        _ => Floor::Bash,
    };
    let exec = [
        "exec",
        "--backend",
        &a.backend,
        "--sandbox",
        SANDBOX,
        "--",
        "echo hi",
    ];
    // Warm each path once: the first call starts the server, the shell, the
    // ControlMaster.
    let r = (|| -> Result<(Duration, Duration, Duration, Duration)> {
        median(1, || berth_cmd(&exec, "auto"))?;
        median(1, || berth_cmd(&exec, "off"))?;
        median(1, || floor.command())?;
        let served = median(n, || berth_cmd(&exec, "auto"))?;
        let off = median(n, || berth_cmd(&exec, "off"))?;
        let floor_d = median(n, || floor.command())?;
        // Locally the floor is `bash -c` itself: one series, printed and
        // compared with (two would print one figure and divide by another).
        let bash = if matches!(floor, Floor::Bash) {
            floor_d
        } else {
            median(n, || Floor::Bash.command())?
        };
        Ok((served, off, floor_d, bash))
    })();
    floor.close();
    let (served, off, floor_d, bash) = r?;
    Ok(Figures {
        backend: a.backend.clone(),
        runs: n,
        served,
        off,
        floor: floor.label(),
        floor_d,
        bash,
    })
}
