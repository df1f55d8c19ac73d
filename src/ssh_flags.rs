//! The ssh backend's command-line flags, global so `berth exec --backend ssh
//! --host myalias -- uptime` reads like `ssh myalias uptime`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use berth_backends::SshOptions;
use clap::Args;

#[derive(Args, Debug, Default, Clone)]
pub struct SshFlags {
    /// ssh backend: the host, an ~/.ssh/config alias or user@host[:port].
    #[arg(long, global = true, env = "BERTH_SSH_HOST", value_name = "HOST")]
    pub host: Option<String>,
    /// ssh backend: trust an unknown host key on first use and record it in
    /// known_hosts. A changed key is refused regardless.
    #[arg(long, global = true)]
    pub accept_new: bool,
    /// ssh backend: the ssh client config [default: ~/.ssh/config].
    #[arg(long, global = true, value_name = "FILE")]
    pub ssh_config: Option<PathBuf>,
    /// ssh backend: the known_hosts file [default: the config's
    /// UserKnownHostsFile, else ~/.ssh/known_hosts].
    #[arg(long, global = true, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// ssh backend: a private key to try first (repeatable). An encrypted key's
    /// passphrase comes from BERTH_SSH_PASSPHRASE, never from the command line.
    #[arg(long = "identity", short = 'i', global = true, value_name = "FILE")]
    pub identity: Vec<PathBuf>,
    /// ssh backend: jump hosts, `[user@]host[:port]` or aliases, comma-separated,
    /// outermost first (like `ssh -J`); overrides the config's ProxyJump, `none`
    /// disables it. Each hop's host key is checked like the target's.
    #[arg(long = "jump", short = 'J', global = true, value_name = "HOSTS")]
    pub jump: Option<String>,
    /// ssh backend: seconds allowed for TCP connect, handshake and authentication.
    #[arg(long, global = true, value_name = "SECS")]
    pub connect_timeout: Option<f64>,
}

impl SshFlags {
    /// The backend's options: these flags over the environment (`HOME`,
    /// `SSH_AUTH_SOCK`, `BERTH_SSH_PASSPHRASE`), read once here.
    pub fn options(&self) -> Result<SshOptions> {
        let mut o = SshOptions::from_env();
        o.host = self.host.clone();
        o.accept_new = self.accept_new;
        o.config_path = self.ssh_config.clone();
        o.known_hosts = self.known_hosts.clone();
        o.identity_files = self.identity.clone();
        o.proxy_jump = self.jump.clone();
        if let Some(secs) = self.connect_timeout {
            if !secs.is_finite() || secs <= 0.0 {
                bail!("--connect-timeout must be a positive number of seconds, got {secs}");
            }
            o.connect_timeout = Some(Duration::from_secs_f64(secs));
        }
        Ok(o)
    }
}
