//! Test support: a real OpenSSH server on a loopback port, started and stopped by
//! the test that needs it. Used by berth's own test suites; not for production.
//!
//! [`Sshd::start`] generates a host key and a user key, writes an sshd config
//! (its own pid file, authorized_keys and host key, `StrictModes no`, no PAM, no
//! passwords), runs `/usr/sbin/sshd -D -e -f CONFIG` on a free port and waits
//! until it accepts connections. Dropping the value stops sshd and every
//! per-connection child it forked. Nothing is installed at run time: a missing
//! sshd is an error that names the CI install step.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::SshOptions;

/// Where the tests expect OpenSSH's server.
pub const SSHD: &str = "/usr/sbin/sshd";

/// A test failure in the harness, as text.
pub type HarnessResult<T> = std::result::Result<T, String>;

/// How to start the server.
#[derive(Clone, Debug)]
pub struct SshdConfig {
    /// Offer the SFTP subsystem.
    pub sftp: bool,
    /// Lines put first in the config, so that they win over the harness's
    /// own (sshd keeps a keyword's first value), e.g. `MaxAuthTries 1\n`.
    pub extra: String,
}

impl Default for SshdConfig {
    fn default() -> Self {
        Self {
            sftp: true,
            extra: String::new(),
        }
    }
}

/// A running sshd for one test.
pub struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    cfg: SshdConfig,
    user: String,
}

/// Run a program and fail with its stderr.
pub fn run(program: &str, args: &[&str]) -> HarnessResult<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Generate an ed25519 key pair at `path` (and `path.pub`), with `passphrase`.
pub fn keygen(path: &Path, passphrase: &str) -> HarnessResult<()> {
    let p = path.display().to_string();
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(format!("{p}.pub"));
    run(
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            passphrase,
            "-C",
            "berth-test",
            "-f",
            &p,
        ],
    )
    .map(|_| ())
}

/// A port nothing listens on right now.
pub fn free_port() -> HarnessResult<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

impl Sshd {
    /// Start sshd with SFTP.
    pub fn start() -> HarnessResult<Sshd> {
        Self::start_with(SshdConfig::default())
    }

    /// Start sshd with `cfg`.
    pub fn start_with(cfg: SshdConfig) -> HarnessResult<Sshd> {
        if !Path::new(SSHD).exists() {
            return Err(format!(
                "{SSHD} not found: the ssh tests need a real OpenSSH server. Install it first \
                 (CI step: `apt-get update && apt-get install -y openssh-server openssh-client`)"
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("berth-sshd-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let user = run("id", &["-un"])?.trim().to_string();
        let mut s = Sshd {
            port: free_port()?,
            dir,
            child: None,
            cfg,
            user,
        };
        std::fs::create_dir_all(s.home().join(".ssh")).map_err(|e| format!("mkdir: {e}"))?;
        std::fs::create_dir_all(s.remote_root()).map_err(|e| format!("mkdir: {e}"))?;
        keygen(&s.host_key(), "")?;
        keygen(&s.user_key(), "")?;
        let pubkey = std::fs::read_to_string(s.user_key().with_extension("pub"))
            .map_err(|e| format!("read user key: {e}"))?;
        std::fs::write(s.path("authorized_keys"), pubkey)
            .map_err(|e| format!("write authorized_keys: {e}"))?;
        s.trust_host_key()?;
        s.launch()?;
        Ok(s)
    }

    /// A path inside the harness directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The fake local home for berth (holds `.ssh/config`).
    pub fn home(&self) -> PathBuf {
        self.path("home")
    }

    /// The remote sandbox root the options point at.
    pub fn remote_root(&self) -> PathBuf {
        self.path("remote")
    }

    /// The server's host key (private; `.pub` beside it).
    pub fn host_key(&self) -> PathBuf {
        self.path("host_ed25519")
    }

    /// The user's private key, listed in authorized_keys.
    pub fn user_key(&self) -> PathBuf {
        self.path("user_ed25519")
    }

    /// The known_hosts file the options use.
    pub fn known_hosts(&self) -> PathBuf {
        self.path("known_hosts")
    }

    /// The port sshd listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The user sshd accepts (whoever runs the tests).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// `user@127.0.0.1:port`.
    pub fn host(&self) -> String {
        format!("{}@127.0.0.1:{}", self.user, self.port)
    }

    /// Write the current host key into known_hosts (replacing its contents).
    pub fn trust_host_key(&self) -> HarnessResult<()> {
        let pubkey = std::fs::read_to_string(self.host_key().with_extension("pub"))
            .map_err(|e| format!("read host key: {e}"))?;
        let mut fields = pubkey.split_whitespace();
        let (Some(alg), Some(b64)) = (fields.next(), fields.next()) else {
            return Err("bad host key file".into());
        };
        std::fs::write(
            self.known_hosts(),
            format!("[127.0.0.1]:{} {alg} {b64}\n", self.port),
        )
        .map_err(|e| format!("write known_hosts: {e}"))
    }

    /// Options that reach this server with the generated key and known_hosts.
    pub fn options(&self) -> SshOptions {
        SshOptions {
            host: Some(self.host()),
            home: Some(self.home()),
            local_user: Some(self.user.clone()),
            config_path: Some(self.home().join(".ssh/config")),
            known_hosts: Some(self.known_hosts()),
            identity_files: vec![self.user_key()],
            connect_timeout: Some(Duration::from_secs(10)),
            keepalive_interval: Some(Duration::from_secs(1)),
            keepalive_max: Some(3),
            sandbox_root: Some(self.remote_root().display().to_string()),
            ..SshOptions::default()
        }
    }

    /// `SetEnv SHLVL=1` stops bash from sourcing the user's `~/.bashrc` for each
    /// command sshd runs (bash does that for a top-level shell started by sshd), so
    /// the tests and the benchmark floor do not depend on this machine's rc files.
    fn write_config(&self) -> HarnessResult<PathBuf> {
        let sftp = if self.cfg.sftp {
            "Subsystem sftp internal-sftp\n"
        } else {
            ""
        };
        let text = format!(
            "{extra}Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\nAuthorizedKeysFile {ak}\n\
             StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nMaxSessions 200\nMaxStartups 100\n\
             MaxAuthTries 20\nLogLevel VERBOSE\nSetEnv SHLVL=1\n{sftp}",
            extra = self.cfg.extra,
            port = self.port,
            hk = self.host_key().display(),
            pid = self.path("sshd.pid").display(),
            ak = self.path("authorized_keys").display(),
        );
        let path = self.path("sshd_config");
        std::fs::write(&path, text).map_err(|e| format!("write sshd_config: {e}"))?;
        Ok(path)
    }

    fn launch(&mut self) -> HarnessResult<()> {
        let config = self.write_config()?;
        // sshd running as root insists on its privilege-separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("sshd.log"))
            .map_err(|e| format!("open sshd.log: {e}"))?;
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {SSHD}: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                return Err(format!("sshd exited ({st}) at start: {}", self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("sshd did not listen within 20s: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// sshd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("sshd.log")).unwrap_or_default()
    }

    /// The master sshd's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Pids of the per-connection sshd processes (descendants of the master named sshd).
    pub fn connection_pids(&self) -> Vec<u32> {
        let Some(master) = self.pid() else {
            return Vec::new();
        };
        let procs = proc_table();
        let mut out = Vec::new();
        for (&pid, (ppid, comm)) in &procs {
            if comm != "sshd" || pid == master {
                continue;
            }
            let mut p = *ppid;
            let mut hops = 0;
            while p > 1 && hops < 64 {
                if p == master {
                    out.push(pid);
                    break;
                }
                p = procs.get(&p).map(|(pp, _)| *pp).unwrap_or(0);
                hops += 1;
            }
        }
        out
    }

    /// SIGKILL every per-connection sshd process: each client's link drops at once.
    /// Returns how many were killed.
    pub fn kill_connections(&self) -> HarnessResult<usize> {
        let pids = self.connection_pids();
        if pids.is_empty() {
            return Ok(0);
        }
        let args: Vec<String> = std::iter::once("-KILL".to_string())
            .chain(pids.iter().map(|p| p.to_string()))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _ = run("kill", &args);
        Ok(pids.len())
    }

    /// Stop sshd and its connections.
    pub fn stop(&mut self) {
        let _ = self.kill_connections();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restart on the same port with a freshly generated host key (known_hosts
    /// keeps the old one).
    pub fn restart_with_new_host_key(&mut self) -> HarnessResult<()> {
        self.stop();
        keygen(&self.host_key(), "")?;
        self.launch()
    }

    /// Restart on the same port with the same keys.
    pub fn restart(&mut self) -> HarnessResult<()> {
        self.stop();
        self.launch()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// pid -> (ppid, comm) for every process.
fn proc_table() -> HashMap<u32, (u32, String)> {
    let mut out = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        out.insert(pid, (ppid, comm));
    }
    out
}
