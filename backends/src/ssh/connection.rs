//! One SSH connection per host, shared by every channel berth opens there.
//!
//! Flow at a glance:
//! - [`Target::resolve`] ([`super::target`]) turns what the user typed
//!   (`myalias`, `user@host:port`) into an address, a user, identities and a
//!   known_hosts file, honouring `~/.ssh/config`.
//! - [`Connection::handle`] hands out the live connection, or dials a new one:
//!   TCP, the SSH handshake (host key checked by [`HostKeyCheck`]) and
//!   authentication, all within the connect timeout, so a server that accepts TCP
//!   and then says nothing fails in bounded time.
//! - A dropped connection is noticed by keepalives (or at once, on a reset). The
//!   next caller redials, with backoff between attempts; a host key or
//!   authentication refusal is final and never retried.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::error::{BackendFailure, Error, Result};
use russh::client::{Handle, Handler};
use russh::keys::{Algorithm, PublicKey, PublicKeyOrCertificate};
use tracing::{debug, info};

use super::KIND;
use super::auth;
use super::known_hosts::{HostKeyStatus, KnownHosts, fingerprint};
use super::target::Target;
use crate::SshOptions;

/// What to do when a host cannot be reached.
const UNREACHABLE_HINT: &str =
    "check that the host is up and reachable (`ssh HOST true`); berth redials on the next command";

/// How an SSH call failed, from russh's error.
pub(crate) fn russh_failure(e: &russh::Error) -> BackendFailure {
    use russh::Error as E;
    match e {
        E::ConnectionTimeout | E::KeepaliveTimeout | E::InactivityTimeout | E::Elapsed(_) => {
            BackendFailure::Timeout
        }
        E::IO(io) => match BackendFailure::from_io(io) {
            BackendFailure::Timeout => BackendFailure::Timeout,
            _ => BackendFailure::Transport,
        },
        E::Disconnect | E::HUP | E::SendError => BackendFailure::Transport,
        E::NotAuthenticated
        | E::NoAuthMethod
        | E::UnsupportedAuthMethod
        | E::UnknownKey
        | E::WrongServerSig
        | E::KeyChanged { .. } => BackendFailure::Auth,
        E::ChannelOpenFailure(_) | E::RequestDenied => BackendFailure::Rejected,
        _ => BackendFailure::Protocol,
    }
}

/// Pauses between reconnect attempts after a connection was lost.
const BACKOFF: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_millis(2000),
];

/// What the host key check concluded, kept for the error message: russh only
/// learns yes or no.
#[derive(Clone, Debug)]
enum KeyVerdict {
    Refused(String),
}

/// The russh client handler: it checks the server's host key, and keeps
/// the message of a disconnect the server sends (which russh otherwise
/// only logs) for the error that follows.
pub struct HostKeyCheck {
    known: KnownHosts,
    name: String,
    port: u16,
    accept_new: bool,
    verdict: Arc<Mutex<Option<KeyVerdict>>>,
    said: Arc<Mutex<Option<String>>>,
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

    async fn disconnected(
        &mut self,
        reason: russh::client::DisconnectReason<Self::Error>,
    ) -> std::result::Result<(), Self::Error> {
        match reason {
            russh::client::DisconnectReason::ReceivedDisconnect(info) => {
                debug!(code = ?info.reason_code, message = %info.message, "the server disconnected");
                if let Ok(mut s) = self.said.lock() {
                    *s = Some(info.message);
                }
                Ok(())
            }
            russh::client::DisconnectReason::Error(e) => Err(e),
        }
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
        Err(last.unwrap_or_else(|| {
            self.unreachable(BackendFailure::Transport, "could not connect".into())
        }))
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
                    return Err(Error::backend_call(
                        KIND,
                        russh_failure(&e),
                        format!(
                            "{}: the server refused a new channel; check its MaxSessions setting",
                            self.target.label()
                        ),
                        e,
                    ));
                }
                Err(_) => {
                    self.mark_dead(generation).await;
                    if round == 1 {
                        return Err(self.unreachable(
                            BackendFailure::Timeout,
                            format!(
                                "the server did not open a channel within {:?}",
                                self.target.connect_timeout
                            ),
                        ));
                    }
                }
            }
        }
        Err(self.unreachable(BackendFailure::Transport, "could not open a channel".into()))
    }

    /// An `Unreachable` error about this host, of class `kind`.
    pub fn unreachable(&self, kind: BackendFailure, detail: String) -> Error {
        Error::unreachable(
            KIND,
            kind,
            format!("{}: {detail}", self.target.label()),
            UNREACHABLE_HINT,
        )
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
                                    russh_failure(&e),
                                    format!("the jump host {via} could not open a tunnel to it (does its sshd allow TCP forwarding?)"),
                                ).caused_by(e))
                            })?;
                        self.handshake(hop, ch.into_stream()).await?
                    }
                };
                handles.push(handle);
            }
            match handles.pop() {
                Some(target) => Ok((target, handles)),
                None => Err(Attempt::Final(
                    self.unreachable(BackendFailure::Local, "nothing to dial".into()),
                )),
            }
        };
        match tokio::time::timeout(t.connect_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Attempt::TimedOut(self.unreachable(BackendFailure::Timeout, format!(
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
        let said = Arc::new(Mutex::new(None));
        let handler = HostKeyCheck {
            known: known.clone(),
            name: hop.host_key_name.clone(),
            port: hop.port,
            accept_new: self.opts.accept_new,
            verdict: verdict.clone(),
            said: said.clone(),
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
                        Some(KeyVerdict::Refused(why)) => Attempt::Final(Error::backend(
                            KIND,
                            BackendFailure::Auth,
                            self.at(hop, why),
                        )),
                        None => Attempt::Retry(
                            self.unreachable_at(
                                hop,
                                russh_failure(&e),
                                "the SSH handshake failed".into(),
                            )
                            .caused_by(e),
                        ),
                    });
                }
            };
        match auth::authenticate(&mut handle, hop, &self.opts, &said).await {
            Ok(()) => Ok(handle),
            Err(auth::AuthFailed::Refused(e)) => Err(Attempt::Final(e)),
            // Not the credentials' fault: dial again, as for a failed handshake.
            Err(auth::AuthFailed::Lost { during, cause }) => {
                let kind = match &cause {
                    Some(e) if russh_failure(e) == BackendFailure::Timeout => {
                        BackendFailure::Timeout
                    }
                    _ => BackendFailure::Transport,
                };
                let e = self.unreachable_at(
                    hop,
                    kind,
                    format!("the connection closed during authentication (while trying {during})"),
                );
                Err(Attempt::Retry(match cause {
                    Some(c) => e.caused_by(c),
                    None => e,
                }))
            }
        }
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
    fn unreachable_at(&self, hop: &Target, kind: BackendFailure, detail: String) -> Error {
        Error::unreachable(KIND, kind, self.at(hop, detail), UNREACHABLE_HINT)
    }

    fn tcp_error(&self, hop: &Target, e: std::io::Error) -> Attempt {
        let what = match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused: nothing listens on that port (is sshd running? is the port right?)".to_string()
            }
            _ => "cannot connect".to_string(),
        };
        // Whatever stopped the TCP connect (a refusal, no route, a failed
        // name lookup) is the link's failure, unless it was a timeout.
        let kind = match BackendFailure::from_io(&e) {
            BackendFailure::Timeout => BackendFailure::Timeout,
            _ => BackendFailure::Transport,
        };
        Attempt::Retry(self.unreachable_at(hop, kind, what).caused_by(e))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn russh_errors_classify() {
        let io = |k| russh::Error::IO(std::io::Error::from(k));
        assert_eq!(
            russh_failure(&io(std::io::ErrorKind::ConnectionReset)),
            BackendFailure::Transport
        );
        assert_eq!(
            russh_failure(&io(std::io::ErrorKind::TimedOut)),
            BackendFailure::Timeout
        );
        assert_eq!(russh_failure(&russh::Error::HUP), BackendFailure::Transport);
        assert_eq!(
            russh_failure(&russh::Error::KeepaliveTimeout),
            BackendFailure::Timeout
        );
        assert_eq!(
            russh_failure(&russh::Error::NotAuthenticated),
            BackendFailure::Auth
        );
        assert_eq!(
            russh_failure(&russh::Error::KeyChanged { line: 3 }),
            BackendFailure::Auth
        );
        assert_eq!(
            russh_failure(&russh::Error::RequestDenied),
            BackendFailure::Rejected
        );
        assert_eq!(russh_failure(&russh::Error::Kex), BackendFailure::Protocol);
    }
}
