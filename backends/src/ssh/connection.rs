//! One SSH connection per host, shared by every channel berth opens there.
//!
//! Flow at a glance:
//! - [`Target::resolve`] turns what the user typed (`myalias`, `user@host:port`)
//!   into an address, a user, identities and a known_hosts file, honouring
//!   `~/.ssh/config`.
//! - [`Connection::handle`] hands out the live connection, or dials a new one:
//!   TCP, the SSH handshake (host key checked by [`HostKeyCheck`]) and
//!   authentication, all within the connect timeout, so a server that accepts TCP
//!   and then says nothing fails in bounded time.
//! - A dropped connection is noticed by keepalives (or at once, on a reset). The
//!   next caller redials, with backoff between attempts; a host key or
//!   authentication refusal is final and never retried.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::error::{Error, Result};
use russh::client::{Handle, Handler};
use russh::keys::{Algorithm, PublicKey, PublicKeyOrCertificate};
use tracing::{debug, info};

use super::KIND;
use super::auth;
use super::config::{HostSettings, SshConfig, expand_tilde};
use super::known_hosts::{HostKeyStatus, KnownHosts, fingerprint};
use crate::SshOptions;

/// Default limit on TCP connect + handshake + authentication.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default keepalive interval when the server is silent.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);
/// Default number of unanswered keepalives before the connection is dropped.
pub const DEFAULT_KEEPALIVE_MAX: usize = 3;
/// Pauses between reconnect attempts after a connection was lost.
const BACKOFF: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_millis(2000),
];

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

/// What the host key check concluded, kept for the error message: russh only
/// learns yes or no.
#[derive(Clone, Debug)]
enum KeyVerdict {
    Refused(String),
}

/// The russh client handler: it checks the server's host key.
pub struct HostKeyCheck {
    known: KnownHosts,
    name: String,
    port: u16,
    accept_new: bool,
    verdict: Arc<Mutex<Option<KeyVerdict>>>,
}

impl HostKeyCheck {
    fn refuse(&self, why: String) -> bool {
        if let Ok(mut v) = self.verdict.lock() {
            *v = Some(KeyVerdict::Refused(why));
        }
        false
    }

    fn decide(&self, key: &PublicKey) -> bool {
        let field = KnownHosts::host_field(&self.name, self.port);
        let file = self.known.path().display().to_string();
        let fp = fingerprint(key);
        let alg = key.algorithm();
        match self.known.check(&self.name, self.port, key) {
            Ok(HostKeyStatus::Known { line }) => {
                debug!(host = %field, %file, line, "host key verified");
                true
            }
            Ok(HostKeyStatus::Unknown) if self.accept_new => {
                match self.known.record(&self.name, self.port, key) {
                    Ok(()) => {
                        info!(host = %field, %file, fingerprint = %fp, "trusting a new host key on first use and recording it");
                        true
                    }
                    Err(e) => self.refuse(format!(
                        "host `{field}` is unknown and its key ({alg} {fp}) could not be recorded: {e}"
                    )),
                }
            }
            Ok(HostKeyStatus::Unknown) => self.refuse(format!(
                "host `{field}` is not in {file}; it offered the {alg} key {fp}. \
                 Check that fingerprint with the server's owner (on the server: `ssh-keygen -lf /etc/ssh/ssh_host_{}_key.pub`), \
                 then run again with --accept-new to trust it on first use and record it",
                alg_file_name(&alg)
            )),
            Ok(HostKeyStatus::Changed { lines }) => {
                let lines = lines
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                self.refuse(format!(
                    "HOST KEY CHANGED for `{field}`: it offered the {alg} key {fp}, but {file} line {lines} records a different key. \
                     Someone may be intercepting the connection, or the host was reinstalled. berth refuses to connect. \
                     If the change is expected, delete line {lines} of {file} (`ssh-keygen -R '{field}' -f {file}`) and connect with --accept-new"
                ))
            }
            Ok(HostKeyStatus::Revoked { line }) => self.refuse(format!(
                "the {alg} key {fp} offered by `{field}` is marked @revoked in {file} line {line}; berth refuses to connect"
            )),
            Err(e) => self.refuse(format!("cannot check the host key of `{field}`: {e}")),
        }
    }
}

fn alg_file_name(alg: &Algorithm) -> &'static str {
    match alg {
        Algorithm::Ed25519 => "ed25519",
        Algorithm::Ecdsa { .. } => "ecdsa",
        Algorithm::Rsa { .. } => "rsa",
        _ => "*",
    }
}

impl Handler for HostKeyCheck {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> std::result::Result<bool, Self::Error> {
        Ok(match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => self.decide(key),
            PublicKeyOrCertificate::Certificate(_) => self.refuse(
                "the server presented a host certificate, which berth does not verify; configure it to offer a plain host key".into(),
            ),
        })
    }
}

/// A live SSH connection handle.
pub type SshHandle = Handle<HostKeyCheck>;

/// Whether a failed attempt may be retried.
enum Attempt {
    /// Refused or reset: the server may be restarting; try again after a pause.
    Retry(Error),
    /// No answer within the connect timeout: the host is unreachable now, and
    /// more attempts would only multiply the wait. The next call tries again.
    TimedOut(Error),
    /// Host key or authentication refused: never retried.
    Final(Error),
}

struct State {
    handle: Option<Arc<SshHandle>>,
    /// The jump hosts' connections the handle runs through, outermost first.
    hops: Vec<SshHandle>,
    /// Bumped on every new connection; channels and the SFTP session remember it.
    generation: u64,
    /// Ever connected: the first dial is not retried, a redial is.
    connected_once: bool,
}

/// One host's connection, redialled on demand.
pub struct Connection {
    target: Target,
    opts: Arc<SshOptions>,
    state: tokio::sync::Mutex<State>,
}

impl Connection {
    /// A connection to `target`, not yet dialled.
    pub fn new(target: Target, opts: Arc<SshOptions>) -> Self {
        Self {
            target,
            opts,
            state: tokio::sync::Mutex::new(State {
                handle: None,
                hops: Vec::new(),
                generation: 0,
                connected_once: false,
            }),
        }
    }

    /// The resolved target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The live handle and its generation, dialling (with backoff after a drop) if
    /// there is none.
    pub async fn handle(&self) -> Result<(Arc<SshHandle>, u64)> {
        let mut st = self.state.lock().await;
        if let Some(h) = &st.handle {
            if !h.is_closed() {
                return Ok((h.clone(), st.generation));
            }
            debug!(host = %self.target.label(), "connection closed; redialling");
            st.handle = None;
        }
        let attempts = if st.connected_once {
            BACKOFF.len() + 1
        } else {
            1
        };
        let mut last = None;
        for i in 0..attempts {
            if i > 0 {
                tokio::time::sleep(BACKOFF[i - 1]).await;
            }
            match self.dial().await {
                Ok((h, hops)) => {
                    let h = Arc::new(h);
                    st.handle = Some(h.clone());
                    st.hops = hops;
                    st.generation += 1;
                    st.connected_once = true;
                    return Ok((h, st.generation));
                }
                Err(Attempt::Final(e)) | Err(Attempt::TimedOut(e)) => return Err(e),
                Err(Attempt::Retry(e)) => {
                    debug!(host = %self.target.label(), attempt = i + 1, error = %e, "connect failed");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| self.unreachable("could not connect".into())))
    }

    /// Forget the handle if it is the given generation (after a channel found it dead).
    pub async fn mark_dead(&self, generation: u64) {
        let mut st = self.state.lock().await;
        if st.generation == generation
            && let Some(h) = st.handle.take()
        {
            let _ = h
                .disconnect(russh::Disconnect::ByApplication, "", "en")
                .await;
            for hop in std::mem::take(&mut st.hops).into_iter().rev() {
                let _ = hop
                    .disconnect(russh::Disconnect::ByApplication, "", "en")
                    .await;
            }
        }
    }

    /// Close the connection politely.
    pub async fn close(&self) {
        let mut st = self.state.lock().await;
        if let Some(h) = st.handle.take() {
            let _ = h
                .disconnect(russh::Disconnect::ByApplication, "berth is done", "en")
                .await;
        }
        for hop in std::mem::take(&mut st.hops).into_iter().rev() {
            let _ = hop
                .disconnect(russh::Disconnect::ByApplication, "berth is done", "en")
                .await;
        }
    }

    /// Open a session channel, redialling once if the connection turns out dead.
    pub async fn open_session(&self) -> Result<(russh::Channel<russh::client::Msg>, u64)> {
        for round in 0..2 {
            let (h, generation) = self.handle().await?;
            match tokio::time::timeout(self.target.connect_timeout, h.channel_open_session()).await
            {
                Ok(Ok(ch)) => return Ok((ch, generation)),
                Ok(Err(e)) if round == 0 && h.is_closed() => {
                    debug!(host = %self.target.label(), error = %e, "channel open on a dead connection");
                    self.mark_dead(generation).await;
                }
                Ok(Err(e)) => {
                    return Err(Error::Backend {
                        backend: KIND,
                        detail: format!(
                            "{}: the server refused a new channel: {e}; check its MaxSessions setting",
                            self.target.label()
                        ),
                    });
                }
                Err(_) => {
                    self.mark_dead(generation).await;
                    if round == 1 {
                        return Err(self.unreachable(format!(
                            "the server did not open a channel within {:?}",
                            self.target.connect_timeout
                        )));
                    }
                }
            }
        }
        Err(self.unreachable("could not open a channel".into()))
    }

    /// An `Unreachable` error about this host.
    pub fn unreachable(&self, detail: String) -> Error {
        Error::Unreachable {
            backend: KIND,
            detail: format!("{}: {detail}", self.target.label()),
            hint: "check that the host is up and reachable (`ssh HOST true`); berth redials on the next command".into(),
        }
    }

    /// Dial the target, through its jump hosts if it has any. Returns the
    /// target's handle and the jump hosts' handles, which must live as long as it.
    async fn dial(&self) -> std::result::Result<(SshHandle, Vec<SshHandle>), Attempt> {
        let t = &self.target;
        let fut = async {
            let chain: Vec<&Target> = t.jumps.iter().chain(std::iter::once(t)).collect();
            let mut handles: Vec<SshHandle> = Vec::with_capacity(chain.len());
            for (i, hop) in chain.iter().enumerate() {
                let handle = match handles.last() {
                    None => {
                        let tcp = tokio::net::TcpStream::connect((hop.host.as_str(), hop.port))
                            .await
                            .map_err(|e| self.tcp_error(hop, e))?;
                        let _ = tcp.set_nodelay(true);
                        self.handshake(hop, tcp).await?
                    }
                    Some(prev) => {
                        let via = chain[i - 1].label();
                        let ch = prev
                            .channel_open_direct_tcpip(hop.host.clone(), u32::from(hop.port), "127.0.0.1", 0)
                            .await
                            .map_err(|e| {
                                Attempt::Retry(self.unreachable_at(
                                    hop,
                                    format!("the jump host {via} could not open a tunnel to it: {e} (does its sshd allow TCP forwarding?)"),
                                ))
                            })?;
                        self.handshake(hop, ch.into_stream()).await?
                    }
                };
                handles.push(handle);
            }
            match handles.pop() {
                Some(target) => Ok((target, handles)),
                None => Err(Attempt::Final(self.unreachable("nothing to dial".into()))),
            }
        };
        match tokio::time::timeout(t.connect_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Attempt::TimedOut(self.unreachable(format!(
                "no complete SSH handshake within the connect timeout of {:?} (the server accepted nothing, or said nothing)",
                t.connect_timeout
            )))),
        }
    }

    /// The SSH handshake and authentication with `hop` over `stream`; its host
    /// key is checked against its known_hosts exactly as the target's is.
    async fn handshake<S>(&self, hop: &Target, stream: S) -> std::result::Result<SshHandle, Attempt>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let known = KnownHosts::new(&hop.known_hosts);
        let verdict = Arc::new(Mutex::new(None));
        let handler = HostKeyCheck {
            known: known.clone(),
            name: hop.host_key_name.clone(),
            port: hop.port,
            accept_new: self.opts.accept_new,
            verdict: verdict.clone(),
        };
        let mut config = russh::client::Config {
            keepalive_interval: Some(hop.keepalive),
            keepalive_max: hop.keepalive_max,
            nodelay: true,
            ..Default::default()
        };
        // AES-GCM first: ring runs it on the CPU's AES instructions, the cheapest
        // cipher per round trip; ChaCha20 stays next for hosts without them.
        config.preferred.cipher = std::borrow::Cow::Owned(
            [
                russh::cipher::AES_256_GCM,
                russh::cipher::CHACHA20_POLY1305,
                russh::cipher::AES_256_CTR,
                russh::cipher::AES_192_CTR,
                russh::cipher::AES_128_CTR,
            ]
            .to_vec(),
        );
        prefer_known_algorithms(
            &mut config.preferred,
            &known.known_algorithms(&hop.host_key_name, hop.port),
        );
        let mut handle =
            match russh::client::connect_stream(Arc::new(config), stream, handler).await {
                Ok(h) => h,
                Err(e) => {
                    let refused = verdict.lock().ok().and_then(|v| v.clone());
                    return Err(match refused {
                        Some(KeyVerdict::Refused(why)) => Attempt::Final(Error::Backend {
                            backend: KIND,
                            detail: self.at(hop, why),
                        }),
                        None => Attempt::Retry(
                            self.unreachable_at(hop, format!("the SSH handshake failed: {e}")),
                        ),
                    });
                }
            };
        auth::authenticate(&mut handle, hop, &self.opts)
            .await
            .map_err(Attempt::Final)?;
        Ok(handle)
    }

    /// `detail` about `hop`, named as a jump host when it is one.
    fn at(&self, hop: &Target, detail: String) -> String {
        if std::ptr::eq(hop, &self.target) {
            format!("{}: {detail}", self.target.label())
        } else {
            format!(
                "{} (via jump host {}): jump host {}: {detail}",
                self.target.label(),
                hop.label(),
                hop.label()
            )
        }
    }

    /// An `Unreachable` error about `hop` on the way to the target.
    fn unreachable_at(&self, hop: &Target, detail: String) -> Error {
        Error::Unreachable {
            backend: KIND,
            detail: self.at(hop, detail),
            hint: "check that the host is up and reachable (`ssh HOST true`); berth redials on the next command".into(),
        }
    }

    fn tcp_error(&self, hop: &Target, e: std::io::Error) -> Attempt {
        let what = match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused: nothing listens on that port (is sshd running? is the port right?)".to_string()
            }
            _ => format!("cannot connect: {e}"),
        };
        Attempt::Retry(self.unreachable_at(hop, what))
    }
}

fn prefer_known_algorithms(preferred: &mut russh::Preferred, known: &[Algorithm]) {
    if known.is_empty() {
        return;
    }
    let is_known = |a: &Algorithm| {
        known.iter().any(|k| {
            k == a || (matches!(k, Algorithm::Rsa { .. }) && matches!(a, Algorithm::Rsa { .. }))
        })
    };
    let mut keys: Vec<Algorithm> = preferred
        .key
        .iter()
        .filter(|a| is_known(a))
        .cloned()
        .collect();
    keys.extend(preferred.key.iter().filter(|a| !is_known(a)).cloned());
    preferred.key = keys.into();
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
