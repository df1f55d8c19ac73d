//! Where and as whom to connect: what the user typed (`myalias`,
//! `user@host:port`, a `ProxyJump` chain) resolved into an address, a user,
//! identities and a known_hosts file, honouring `~/.ssh/config`. Dialling it
//! is [`super::connection`]'s work; authenticating as it, [`super::auth`]'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_core::error::{Error, Result};

use super::config::{HostSettings, SshConfig, expand_tilde};
use crate::SshOptions;

/// Default limit on TCP connect + handshake + authentication.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default keepalive interval when the server is silent.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);
/// Default number of unanswered keepalives before the connection is dropped.
pub const DEFAULT_KEEPALIVE_MAX: usize = 3;
/// Where and as whom to connect, fully resolved.
#[derive(Clone, Debug)]
pub struct Target {
    /// What the user typed.
    pub spec: String,
    /// The host to dial.
    pub host: String,
    /// The port to dial.
    pub port: u16,
    /// The remote user.
    pub user: String,
    /// Identity files to offer, in order; missing defaults are skipped quietly.
    pub identity_files: Vec<(PathBuf, bool)>,
    /// Offer only the identity files, not the agent's keys.
    pub identities_only: bool,
    /// The known_hosts file that decides about the host key.
    pub known_hosts: PathBuf,
    /// The name looked up in known_hosts.
    pub host_key_name: String,
    /// Limit on connect + handshake + authentication.
    pub connect_timeout: Duration,
    /// Keepalive interval.
    pub keepalive: Duration,
    /// Unanswered keepalives before the connection is dropped.
    pub keepalive_max: usize,
    /// Jump hosts to go through, outermost first (`ProxyJump`, `-J`). Each is
    /// dialled through the one before it, over a direct-tcpip channel, and its
    /// host key checked against known_hosts like the target's.
    pub jumps: Vec<Target>,
    /// The config's `ProxyJump` for this host, until `resolve` has used it.
    config_jump: Option<String>,
}

impl Target {
    /// Resolve `spec` (`alias`, `host`, `user@host`, `host:port`, `user@[v6]:port`),
    /// with its jump hosts: `opts.proxy_jump` (`-J`), else the config's `ProxyJump`.
    pub fn resolve(opts: &SshOptions, spec: &str) -> Result<Target> {
        let mut t = Self::resolve_one(opts, spec)?;
        let jump = opts.proxy_jump.clone().or(t.config_jump.take());
        if let Some(list) = jump.filter(|j| !j.trim().eq_ignore_ascii_case("none")) {
            for hop in list.split(',').map(str::trim) {
                if hop.is_empty() {
                    return Err(Error::InvalidInput(format!(
                        "ssh: ProxyJump `{list}` has an empty hop; write host1,host2"
                    )));
                }
                if hop.contains("://") {
                    return Err(Error::InvalidInput(format!(
                        "ssh: jump host `{hop}`: ssh:// URIs are not supported; write [user@]host[:port]"
                    )));
                }
                // A hop's own ProxyJump is not followed: the chain is the list.
                let mut h = Self::resolve_one(opts, hop)?;
                h.config_jump = None;
                t.jumps.push(h);
            }
            if t.jumps.len() > 8 {
                return Err(Error::InvalidInput(format!(
                    "ssh: ProxyJump `{list}` has {} hops; berth allows at most 8",
                    t.jumps.len()
                )));
            }
        }
        Ok(t)
    }

    fn resolve_one(opts: &SshOptions, spec: &str) -> Result<Target> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(Error::InvalidInput(
                "ssh: empty host; pass --host HOST (an ~/.ssh/config alias or user@host[:port])"
                    .into(),
            ));
        }
        let (user, rest) = match spec.rsplit_once('@') {
            Some((u, r)) => (Some(u.to_string()), r),
            None => (None, spec),
        };
        let (alias, port) = split_port(rest).map_err(|m| {
            Error::InvalidInput(format!("ssh: host `{spec}`: {m}; use user@host:port"))
        })?;
        let home = opts.home.clone().unwrap_or_else(|| PathBuf::from("/"));
        let local_user = opts.local_user.clone().unwrap_or_else(|| "root".into());
        let config_path = opts
            .config_path
            .clone()
            .unwrap_or_else(|| home.join(".ssh/config"));
        let config = SshConfig::load(&config_path)?;
        let hs: HostSettings = config.resolve(&alias, &home, &local_user)?;
        let user = user.or(hs.user.clone()).unwrap_or(local_user);
        let port = port.or(hs.port).unwrap_or(22);
        let mut identity_files: Vec<(PathBuf, bool)> = opts
            .identity_files
            .iter()
            .map(|p| (expand_tilde(&p.display().to_string(), &home), true))
            .collect();
        identity_files.extend(hs.identity_files.iter().map(|p| (p.clone(), true)));
        if hs.identity_files.is_empty() {
            for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
                identity_files.push((home.join(".ssh").join(name), false));
            }
        }
        let known_hosts = opts
            .known_hosts
            .clone()
            .or(hs.known_hosts.clone())
            .unwrap_or_else(|| home.join(".ssh/known_hosts"));
        Ok(Target {
            jumps: Vec::new(),
            config_jump: hs.proxy_jump.clone(),
            spec: spec.to_string(),
            host_key_name: hs.host_key_alias.clone().unwrap_or(hs.hostname.clone()),
            host: hs.hostname,
            port,
            user,
            identity_files,
            identities_only: hs.identities_only,
            known_hosts,
            connect_timeout: opts
                .connect_timeout
                .or(hs.connect_timeout)
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            keepalive: opts
                .keepalive_interval
                .or(hs.alive_interval)
                .unwrap_or(DEFAULT_KEEPALIVE),
            keepalive_max: opts
                .keepalive_max
                .or(hs.alive_count_max)
                .unwrap_or(DEFAULT_KEEPALIVE_MAX),
        })
    }

    /// `user@host:port`, the pool key and the name used in messages.
    pub fn label(&self) -> String {
        if self.host.contains(':') {
            format!("{}@[{}]:{}", self.user, self.host, self.port)
        } else {
            format!("{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

fn split_port(rest: &str) -> std::result::Result<(String, Option<u16>), String> {
    let parse = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("`{p}` is not a port number"))
    };
    if let Some(inner) = rest.strip_prefix('[') {
        let Some((host, after)) = inner.split_once(']') else {
            return Err("unclosed `[`".into());
        };
        let port = match after.strip_prefix(':') {
            Some(p) => Some(parse(p)?),
            None if after.is_empty() => None,
            None => return Err(format!("unexpected `{after}` after `]`")),
        };
        return Ok((host.to_string(), port));
    }
    match rest.matches(':').count() {
        0 => Ok((rest.to_string(), None)),
        1 => {
            let (h, p) = rest.split_once(':').unwrap_or((rest, ""));
            Ok((h.to_string(), Some(parse(p)?)))
        }
        // A bare IPv6 address.
        _ => Ok((rest.to_string(), None)),
    }
}
/// The local path an identity file resolves to, for messages.
pub fn show_path(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_spec_forms() {
        assert_eq!(split_port("h"), Ok(("h".into(), None)));
        assert_eq!(split_port("h:2222"), Ok(("h".into(), Some(2222))));
        assert_eq!(split_port("[::1]:22"), Ok(("::1".into(), Some(22))));
        assert_eq!(split_port("::1"), Ok(("::1".into(), None)));
        assert!(split_port("h:x").is_err());
    }

    #[test]
    fn alias_resolution_uses_config() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "Host box\n  HostName 127.0.0.1\n  Port 2200\n  User bob\n  IdentityFile ~/k\n",
        )
        .map_err(|e| Error::io("write", &cfg, e))?;
        let opts = SshOptions {
            home: Some(dir.path().to_path_buf()),
            config_path: Some(cfg),
            ..SshOptions::default()
        };
        let t = Target::resolve(&opts, "box")?;
        assert_eq!(
            (t.host.as_str(), t.port, t.user.as_str()),
            ("127.0.0.1", 2200, "bob")
        );
        assert_eq!(t.identity_files, vec![(dir.path().join("k"), true)]);
        assert_eq!(t.known_hosts, dir.path().join(".ssh/known_hosts"));
        let t = Target::resolve(&opts, "eve@box:23")?;
        assert_eq!((t.port, t.user.as_str()), (23, "eve"));
        Ok(())
    }
}
