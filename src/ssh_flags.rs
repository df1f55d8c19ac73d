//! The ssh backend's command-line flags (`SshFlags`, in `berth-client`, which
//! the thin client parses too) turned into the backend's options.

use std::time::Duration;

use anyhow::{Result, bail};
use berth_backends::SshOptions;

pub use berth_client::args::SshFlags;

/// The backend's options: `f` over the environment (`HOME`, `SSH_AUTH_SOCK`,
/// `BERTH_SSH_PASSPHRASE`), read once here.
pub fn options(f: &SshFlags) -> Result<SshOptions> {
    let mut o = SshOptions::from_env();
    o.host = f.host.clone();
    // From the environment, the host is the server's default, not this call's.
    o.host_is_default = o.host.is_some()
        && o.host
            == std::env::var("BERTH_SSH_HOST")
                .ok()
                .filter(|h| !h.is_empty());
    o.accept_new = f.accept_new;
    o.config_path = f.ssh_config.clone();
    o.known_hosts = f.known_hosts.clone();
    o.identity_files = f.identity.clone();
    o.proxy_jump = f.jump.clone();
    if let Some(secs) = f.connect_timeout {
        if !secs.is_finite() || secs <= 0.0 {
            bail!("--connect-timeout must be a positive number of seconds, got {secs}");
        }
        o.connect_timeout = Some(Duration::from_secs_f64(secs));
    }
    Ok(o)
}
