//! berth's egress proxy: a sandbox's one door out.
//!
//! The sandbox has no route of its own (see `wip/egress.md`); a relay in it
//! hands each connection to this proxy over a unix socket. The proxy reads
//! an HTTP/1 `CONNECT host:port`, resolves the name itself, judges every
//! address with [`berth_policies::egress::Egress::judge`] and connects only
//! to an address that was judged: the address judged is the address
//! connected to, so a second lookup cannot lead elsewhere. A refusal is a
//! `403` whose body names the rule and why. Every connection, let through
//! or not, is reported once it ends ([`Record`]), with the bytes it moved.
//!
//! Two kinds of request come through: `CONNECT host:port` (HTTPS, and
//! anything a client tunnels), passed through uninspected once the address
//! is judged, and a plain-HTTP request with an absolute URI
//! (`GET http://host/path`), forwarded to the judged address with the
//! proxy's own headers taken off. The proxy follows no redirect itself:
//! the client's next request is judged like the first.
//!
//! One exception to "uninspected": a `CONNECT` to a host that carries a
//! credential ([`Credentials`]). There the proxy ends the sandbox's TLS
//! with a certificate the sandbox's own CA signs ([`tls::Ca`]), opens its
//! own TLS to the host (checked against this machine's roots), and sets the
//! credential's header on each request, which the sandbox never holds.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub mod tls;
/// The TLS crates the proxy speaks, for callers that hold its setups.
pub use rustls;
pub use tokio_rustls;

use berth_policies::egress::{Action, Credential, Egress, Target, Verdict};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixListener};

/// The most an HTTP head read by [`read_head`] may hold.
pub const HEAD_LIMIT: usize = 16 * 1024;

/// Read an HTTP head byte by byte, so nothing past it is consumed: up to
/// and including the blank line, or what came before the stream ended (the
/// caller checks for the blank line). A head past [`HEAD_LIMIT`] is an error.
pub async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            break;
        }
        head.push(byte[0]);
        if head.len() > HEAD_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an HTTP head of more than {HEAD_LIMIT} bytes"),
            ));
        }
    }
    Ok(head)
}

/// A future the proxy's hooks return.
pub type Hook<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Turns a host name into addresses. The proxy resolves names itself: the
/// sandbox has no resolver, so a name is only ever looked up here.
pub trait Resolve: Send + Sync {
    /// The addresses `host` has, with `port`.
    fn resolve(&self, host: String, port: u16) -> Hook<io::Result<Vec<SocketAddr>>>;
}

/// The system's resolver (tokio's `lookup_host`).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: String, port: u16) -> Hook<io::Result<Vec<SocketAddr>>> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// A fixed table of names, and nothing else: `name=addr,name=addr`. For
/// tests that must not look anything up outside the machine
/// (`BERTH_EGRESS_HOSTS`); a name not in the table has no address.
pub struct TableResolver(Vec<(String, IpAddr)>);

impl TableResolver {
    /// Read `name=addr,name=addr`.
    pub fn parse(text: &str) -> Result<TableResolver, String> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, addr) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: write NAME=ADDRESS"))?;
            let addr = addr
                .parse()
                .map_err(|_| format!("`{part}`: `{addr}` is not an address"))?;
            out.push((name.trim().to_ascii_lowercase(), addr));
        }
        Ok(TableResolver(out))
    }
}

impl Resolve for TableResolver {
    fn resolve(&self, host: String, port: u16) -> Hook<io::Result<Vec<SocketAddr>>> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let found: Vec<SocketAddr> = self
            .0
            .iter()
            .filter(|(n, _)| *n == host)
            .map(|(_, a)| SocketAddr::new(*a, port))
            .collect();
        Box::pin(async move { Ok(found) })
    }
}

/// Decides an *ask* verdict: a person (an approval) lets the connection
/// through or not. Without one, an ask is a refusal that says so.
pub trait Ask: Send + Sync {
    /// Whether to let `host:port` through: `Ok(())`, or `Err(why not)`. A
    /// name is asked about before it is looked up (`addr` is `None`); an
    /// address the client named, with it.
    fn ask(
        &self,
        host: String,
        port: u16,
        addr: Option<SocketAddr>,
        verdict: Verdict,
    ) -> Hook<Result<(), String>>;
}

/// One connection the proxy saw, reported when it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The host the client asked for (a name or an address's text).
    pub host: String,
    /// The port it asked for.
    pub port: u16,
    /// The address connected to, or the one refused (none when the name
    /// did not resolve).
    pub addr: Option<SocketAddr>,
    /// The decision, with its rule and reason.
    pub verdict: Verdict,
    /// Bytes from the sandbox to the host.
    pub bytes_up: u64,
    /// Bytes from the host to the sandbox.
    pub bytes_down: u64,
    /// Why a connection that was let through failed, if it did.
    pub error: Option<String>,
    /// The header of the credential the proxy put on its requests, when
    /// it carried one (the value is never recorded).
    pub credential: Option<String>,
}

/// Reads a credential's value by its variable's name.
pub type Secrets = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The keys the proxy puts on requests, and what it needs to: the
/// sandbox's CA, its own TLS client, and where values are read.
pub struct Credentials {
    /// The credentials, each for its host.
    pub list: Vec<Credential>,
    /// The sandbox's CA, which signs the certificates the sandbox is shown.
    pub ca: Arc<tls::Ca>,
    /// The proxy's TLS to the real hosts.
    pub client: Arc<rustls::ClientConfig>,
    /// A credential's value by its variable's name (berth's environment).
    pub secret: Secrets,
}

/// The proxy for one sandbox: its policy (which may change while it runs)
/// and where its records go.
pub struct Proxy {
    policy: RwLock<Egress>,
    source: Option<Arc<dyn Fn() -> Option<Egress> + Send + Sync>>,
    resolver: Arc<dyn Resolve>,
    asker: Option<Arc<dyn Ask>>,
    credentials: Option<Arc<Credentials>>,
    report: Arc<dyn Fn(Record) + Send + Sync>,
}

impl Proxy {
    /// A proxy judging by `policy`, resolving through the system.
    pub fn new(policy: Egress, report: Arc<dyn Fn(Record) + Send + Sync>) -> Proxy {
        Proxy {
            policy: RwLock::new(policy),
            source: None,
            resolver: Arc::new(SystemResolver),
            asker: None,
            credentials: None,
            report,
        }
    }

    /// Put these credentials on requests to their hosts.
    pub fn with_credentials(mut self, c: Credentials) -> Proxy {
        self.credentials = Some(Arc::new(c));
        self
    }

    /// Resolve names through `r` instead of the system.
    pub fn with_resolver(mut self, r: Arc<dyn Resolve>) -> Proxy {
        self.resolver = r;
        self
    }

    /// Put *ask* verdicts to `a`.
    pub fn with_asker(mut self, a: Arc<dyn Ask>) -> Proxy {
        self.asker = Some(a);
        self
    }

    /// Read the policy from `f` for each connection (the sandbox's stored
    /// row, which another berth process may have changed). `None` from it
    /// keeps the last policy read.
    pub fn with_source(mut self, f: Arc<dyn Fn() -> Option<Egress> + Send + Sync>) -> Proxy {
        self.source = Some(f);
        self
    }

    /// Replace the policy; connections from now on are judged by it.
    pub fn set_policy(&self, policy: Egress) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    fn policy(&self) -> Egress {
        if let Some(p) = self.source.as_ref().and_then(|f| f()) {
            self.set_policy(p);
        }
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Serve every connection `listener` accepts, until it fails.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) -> io::Result<()> {
        loop {
            let (stream, _) = listener.accept().await?;
            let me = self.clone();
            tokio::spawn(async move { me.serve_one(stream).await });
        }
    }

    /// Serve one client connection (HTTP/1, with upgrades for `CONNECT`).
    pub async fn serve_one<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let me = self.clone();
        let svc = service_fn(move |req| {
            let me = me.clone();
            async move { Ok::<_, std::convert::Infallible>(me.handle(req).await) }
        });
        if let Err(e) = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), svc)
            .with_upgrades()
            .await
        {
            tracing::debug!(error = %e, "egress client connection ended with an error");
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() != Method::CONNECT {
            return self.forward(req).await;
        }
        let Some((host, port)) = req
            .uri()
            .authority()
            .and_then(|a| Some((a.host().to_string(), a.port_u16()?)))
        else {
            return reply(
                StatusCode::BAD_REQUEST,
                None,
                "berth: CONNECT needs HOST:PORT\n",
            );
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let (addr, verdict) = match self.choose(&host, port).await {
            Ok(chosen) => chosen,
            Err(record) => return self.refuse(record),
        };
        let upstream = match connect(addr).await {
            Ok(s) => s,
            Err(e) => {
                let text = format!("berth: could not reach {host}:{port} at {addr}: {e}\n");
                (self.report)(Record {
                    host,
                    port,
                    addr: Some(addr),
                    verdict,
                    bytes_up: 0,
                    bytes_down: 0,
                    error: Some(e.to_string()),
                    credential: None,
                });
                return reply(StatusCode::BAD_GATEWAY, None, &text);
            }
        };
        let credential = self.credentials.as_ref().and_then(|c| {
            c.list
                .iter()
                .find(|k| k.is_for(&host, port))
                .map(|k| (c.clone(), k.clone()))
        });
        let me = self.clone();
        tokio::spawn(async move {
            let header = credential.as_ref().map(|(_, k)| k.header.clone());
            let (up, down, error) = match hyper::upgrade::on(req).await {
                Ok(upgraded) if credential.is_some() => {
                    let Some((c, k)) = credential else {
                        return;
                    };
                    intercept(upgraded, upstream, &host, port, c, k).await
                }
                Ok(upgraded) => {
                    let mut client = TokioIo::new(upgraded);
                    let mut upstream = upstream;
                    // 64 KiB each way: the default 8 KiB halves a download's speed.
                    match tokio::io::copy_bidirectional_with_sizes(
                        &mut client,
                        &mut upstream,
                        64 << 10,
                        64 << 10,
                    )
                    .await
                    {
                        Ok((up, down)) => (up, down, None),
                        Err(e) => (0, 0, Some(e.to_string())),
                    }
                }
                Err(e) => (0, 0, Some(format!("the client never took the tunnel: {e}"))),
            };
            (me.report)(Record {
                host,
                port,
                addr: Some(addr),
                verdict,
                bytes_up: up,
                bytes_down: down,
                error,
                credential: header,
            });
        });
        reply(StatusCode::OK, None, "")
    }

    /// A plain-HTTP request with an absolute URI: judged like a tunnel,
    /// then sent on to the judged address, its answer streamed back.
    async fn forward(self: Arc<Self>, mut req: Request<Incoming>) -> Response<Body> {
        let uri = req.uri().clone();
        if uri.scheme_str() != Some("http") {
            return reply(
                StatusCode::BAD_REQUEST,
                None,
                "berth: a request through berth's egress proxy needs an absolute http:// \
                 address; https goes through CONNECT\n",
            );
        }
        let Some(host) = uri.host().map(|h| h.trim_matches(['[', ']']).to_string()) else {
            return reply(
                StatusCode::BAD_REQUEST,
                None,
                "berth: the address names no host\n",
            );
        };
        let port = uri.port_u16().unwrap_or(80);
        let (addr, verdict) = match self.choose(&host, port).await {
            Ok(chosen) => chosen,
            Err(record) => return self.refuse(record),
        };
        let tally = Arc::new(Tally {
            proxy: self.clone(),
            record: std::sync::Mutex::new(Some(Record {
                host: host.clone(),
                port,
                addr: Some(addr),
                verdict,
                bytes_up: 0,
                bytes_down: 0,
                error: None,
                credential: None,
            })),
            down: AtomicU64::new(0),
        });
        let fail = |tally: &Tally, e: String| {
            let text = format!("berth: could not reach {host}:{port} at {addr}: {e}\n");
            tally.fail(e);
            reply(StatusCode::BAD_GATEWAY, None, &text)
        };
        let upstream = match connect(addr).await {
            Ok(s) => s,
            Err(e) => return fail(&tally, e.to_string()),
        };
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
                Ok(pair) => pair,
                Err(e) => return fail(&tally, e.to_string()),
            };
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "egress upstream connection ended with an error");
            }
        });
        // The origin sees the path only, and none of the proxy's own headers.
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        *req.uri_mut() = match path.parse() {
            Ok(u) => u,
            Err(e) => return fail(&tally, e.to_string()),
        };
        for h in ["proxy-connection", "proxy-authorization", "keep-alive"] {
            req.headers_mut().remove(h);
        }
        // The host judged is the host asked: a `Host` header naming another
        // site on the same address (domain fronting through a CDN an allowed
        // name lives on) is replaced by the address's own authority.
        if let Some(a) = uri.authority().and_then(|a| a.as_str().parse().ok()) {
            req.headers_mut().insert(hyper::header::HOST, a);
        }
        let up = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        if let Ok(mut r) = tally.record.lock()
            && let Some(r) = r.as_mut()
        {
            r.bytes_up = up;
        }
        let resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => return fail(&tally, e.to_string()),
        };
        // The record goes out when the answer's body is done (or dropped).
        let counter = tally.clone();
        resp.map(move |body| {
            body.map_frame(move |f| {
                if let Some(d) = f.data_ref() {
                    counter.down.fetch_add(d.len() as u64, Ordering::Relaxed);
                }
                f
            })
            .boxed()
        })
    }

    /// Report a refusal and answer it: a `403` naming the rule.
    fn refuse(&self, record: Record) -> Response<Body> {
        let body = refusal_text(&record);
        let rule = record.verdict.rule.clone();
        (self.report)(record);
        reply(StatusCode::FORBIDDEN, Some(&rule), &body)
    }

    /// The address to connect to and the verdict that allowed it, or the
    /// record of the refusal. Every address the name has is judged; the
    /// first one allowed is used.
    async fn choose(&self, host: &str, port: u16) -> Result<(SocketAddr, Verdict), Record> {
        let policy = self.policy();
        let refused = |addr, verdict, error| Record {
            host: host.to_string(),
            port,
            addr,
            verdict,
            bytes_up: 0,
            bytes_down: 0,
            error,
            credential: None,
        };
        let no_address = || {
            let v = Verdict {
                action: Action::Deny,
                rule: "resolve".into(),
                reason: format!("{host} has no address"),
            };
            refused(None, v, None)
        };
        let mut policy = policy;
        let mut approved = false;
        let addrs = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => {
                // A name no rule could let through is refused before it is
                // looked up: a lookup is itself a message out (DNS
                // exfiltration through the proxy's own resolver). Under
                // `ask`, a person decides first.
                if let Some(v) = policy.before_lookup(host, port) {
                    if v.action != Action::Ask {
                        return Err(refused(None, v, None));
                    }
                    if let Err(v) = self.put_to_person(host, port, None, v).await {
                        return Err(refused(None, v, None));
                    }
                    // Let through by name, for this connection: the
                    // addresses it has are judged as for any allowed name.
                    if let Ok(rule) = berth_policies::egress::Rule::parse(&format!("{host}:{port}"))
                    {
                        policy.allow.push(rule);
                    }
                    approved = true;
                }
                match self.resolver.resolve(host.to_string(), port).await {
                    Ok(a) if !a.is_empty() => a,
                    Ok(_) | Err(_) => return Err(no_address()),
                }
            }
        };
        let mut first_refusal = None;
        for addr in addrs {
            let v = policy.judge(Target {
                host,
                addr: addr.ip(),
                port,
            });
            match v.action {
                Action::Allow if approved => return Ok((addr, approval(host, port))),
                Action::Allow => return Ok((addr, v)),
                Action::Ask => match self.put_to_person(host, port, Some(addr), v).await {
                    Ok(v) => return Ok((addr, v)),
                    Err(v) => {
                        first_refusal.get_or_insert((addr, v));
                    }
                },
                Action::Deny => {
                    first_refusal.get_or_insert((addr, v));
                }
            }
        }
        let (addr, v) = first_refusal.ok_or_else(no_address)?;
        Err(refused(Some(addr), v, None))
    }

    /// An *ask* verdict put to the asker: the verdict that lets the
    /// connection through, or the refusal (saying who refused, or that no
    /// one can be asked).
    async fn put_to_person(
        &self,
        host: &str,
        port: u16,
        addr: Option<SocketAddr>,
        v: Verdict,
    ) -> Result<Verdict, Verdict> {
        let Some(a) = &self.asker else {
            return Err(Verdict {
                action: Action::Deny,
                reason: format!("{}, but no one can be asked here", v.reason),
                ..v
            });
        };
        match a.ask(host.to_string(), port, addr, v.clone()).await {
            Ok(()) => Ok(approval(host, port)),
            Err(why) => Err(Verdict {
                action: Action::Deny,
                reason: format!("{}: {why}", v.reason),
                ..v
            }),
        }
    }
}

/// The verdict of a connection a person let through.
fn approval(host: &str, port: u16) -> Verdict {
    Verdict {
        action: Action::Allow,
        rule: "approved".into(),
        reason: format!("a person let {host}:{port} through"),
    }
}

/// A tunnel to a host carrying a credential: the sandbox's TLS ended here
/// with a certificate its CA signed, the proxy's own TLS to the host, and
/// each request sent on with the credential's header set. Returns the
/// bytes each way (as they crossed the wire to the host) and what failed.
async fn intercept(
    upgraded: hyper::upgrade::Upgraded,
    upstream: TcpStream,
    host: &str,
    port: u16,
    creds: Arc<Credentials>,
    cred: Credential,
) -> (u64, u64, Option<String>) {
    let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let done = |e: Option<String>| {
        (
            counts.0.load(Ordering::Relaxed),
            counts.1.load(Ordering::Relaxed),
            e,
        )
    };
    let server = match creds.ca.server_for(host) {
        Ok(s) => s,
        Err(e) => return done(Some(format!("no certificate for {host}: {e}"))),
    };
    let client = match tokio_rustls::TlsAcceptor::from(server)
        .accept(TokioIo::new(upgraded))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            return done(Some(format!(
                "the sandbox's TLS to {host} failed ({e}); its programs must trust the sandbox's CA \
                 (berth points SSL_CERT_FILE and the like at a bundle holding it)"
            )));
        }
    };
    let name = match rustls::pki_types::ServerName::try_from(host.to_string()) {
        Ok(n) => n,
        Err(e) => return done(Some(e.to_string())),
    };
    let wire = Counted {
        inner: upstream,
        counts: counts.clone(),
    };
    let upstream = tokio_rustls::TlsConnector::from(creds.client.clone())
        .connect(name, wire)
        .await;
    let sender = match upstream {
        Ok(tls) => match hyper::client::conn::http1::handshake(TokioIo::new(tls)).await {
            Ok((sender, conn)) => {
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "egress upstream connection ended with an error");
                    }
                });
                Ok(sender)
            }
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(format!("berth's TLS to {host}:{port} failed: {e}")),
    };
    let failed = sender.as_ref().err().cloned();
    let sender = Arc::new(tokio::sync::Mutex::new(sender.ok()));
    let authority = if port == 443 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let sender = sender.clone();
        let creds = creds.clone();
        let cred = cred.clone();
        let authority = authority.clone();
        async move {
            let mut guard = sender.lock().await;
            let Some(sender) = guard.as_mut() else {
                return Ok::<_, std::convert::Infallible>(reply(
                    StatusCode::BAD_GATEWAY,
                    None,
                    &format!("berth: could not reach {authority} with TLS\n"),
                ));
            };
            let Some(value) = (creds.secret)(&cred.value_env) else {
                return Ok(reply(
                    StatusCode::BAD_GATEWAY,
                    None,
                    &format!(
                        "berth: the credential for {authority} is read from {} in berth's server's \
                         environment, which does not have it; set it where `berth serve` starts \
                         (or before the first berth command starts the server) and restart the server\n",
                        cred.value_env
                    ),
                ));
            };
            let value = format!("{}{value}", cred.prefix);
            let Ok(mut value) = hyper::header::HeaderValue::from_str(&value) else {
                return Ok(reply(
                    StatusCode::BAD_GATEWAY,
                    None,
                    &format!(
                        "berth: {} holds a value no HTTP header can carry\n",
                        cred.value_env
                    ),
                ));
            };
            value.set_sensitive(true);
            let Ok(name) = hyper::header::HeaderName::from_bytes(cred.header.as_bytes()) else {
                return Ok(reply(
                    StatusCode::BAD_GATEWAY,
                    None,
                    "berth: a bad header name\n",
                ));
            };
            req.headers_mut().insert(name, value);
            // The host that carries the credential is the host it goes to.
            if let Ok(a) = authority.parse() {
                req.headers_mut().insert(hyper::header::HOST, a);
            }
            for h in ["proxy-connection", "proxy-authorization"] {
                req.headers_mut().remove(h);
            }
            if sender.ready().await.is_err() {
                return Ok(reply(
                    StatusCode::BAD_GATEWAY,
                    None,
                    &format!("berth: {authority} closed the connection; send the request again\n"),
                ));
            }
            Ok(match sender.send_request(req).await {
                Ok(resp) => resp.map(|b| b.boxed()),
                Err(e) => reply(
                    StatusCode::BAD_GATEWAY,
                    None,
                    &format!("berth: {authority} did not answer: {e}\n"),
                ),
            })
        }
    });
    let served = http1::Builder::new()
        .serve_connection(TokioIo::new(client), svc)
        .await;
    done(failed.or(served.err().map(|e| e.to_string())))
}

/// Connect to a judged address, with Nagle's algorithm off: the proxy
/// writes whole messages, and a small write held for an ACK costs a
/// request-and-answer exchange ~40 ms (most of all where TLS is ended and
/// opened again, so each handshake crosses it).
async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A stream whose bytes are counted: read into `.1`, written into `.0`.
struct Counted<S> {
    inner: S,
    counts: Arc<(AtomicU64, AtomicU64)>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before) as u64;
        self.counts.1.fetch_add(n, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            self.counts.0.fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body as the proxy sends it: its own text, or an origin's
/// answer streamed through.
type Body = BoxBody<Bytes, hyper::Error>;

/// Counts a forwarded answer's bytes and reports its record once, when the
/// last holder (the answer's body) lets go.
struct Tally {
    proxy: Arc<Proxy>,
    record: std::sync::Mutex<Option<Record>>,
    down: AtomicU64,
}

impl Tally {
    fn fail(&self, e: String) {
        if let Some(mut r) = self.record.lock().ok().and_then(|mut r| r.take()) {
            r.error = Some(e);
            r.bytes_up = 0;
            (self.proxy.report)(r);
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        if let Some(mut r) = self.record.get_mut().ok().and_then(Option::take) {
            r.bytes_down = self.down.load(Ordering::Relaxed);
            (self.proxy.report)(r);
        }
    }
}

/// What a refused client reads.
fn refusal_text(r: &Record) -> String {
    format!(
        "berth: connection to {}:{} refused by the sandbox's network policy ({}): {}\n",
        r.host, r.port, r.verdict.rule, r.verdict.reason
    )
}

fn reply(status: StatusCode, rule: Option<&str>, body: &str) -> Response<Body> {
    let full = Full::new(Bytes::from(body.to_string())).map_err(|never| match never {});
    let mut r = Response::new(full.boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(v) = rule.and_then(|t| hyper::header::HeaderValue::from_str(t).ok()) {
        r.headers_mut().insert("x-berth-refused", v);
    }
    r
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use berth_policies::egress::{Mode, Rule};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, UnixStream};

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Names the tests make up, resolved without DNS.
    struct Names(HashMap<String, IpAddr>);

    impl Resolve for Names {
        fn resolve(&self, host: String, port: u16) -> Hook<io::Result<Vec<SocketAddr>>> {
            let found = self.0.get(&host).map(|ip| vec![SocketAddr::new(*ip, port)]);
            Box::pin(async move {
                found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
            })
        }
    }

    /// A server that echoes what it reads, on loopback.
    async fn echo() -> io::Result<u16> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let port = l.local_addr()?.port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        Ok(port)
    }

    struct Rig {
        socket: std::path::PathBuf,
        records: Arc<Mutex<Vec<Record>>>,
        _dir: tempfile::TempDir,
    }

    async fn rig(
        policy: Egress,
        names: &[(&str, &str)],
    ) -> Result<Rig, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("proxy.sock");
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = records.clone();
        let mut map = HashMap::new();
        for (n, a) in names {
            map.insert(n.to_string(), a.parse()?);
        }
        let proxy = Proxy::new(
            policy,
            Arc::new(move |r| sink.lock().unwrap_or_else(|p| p.into_inner()).push(r)),
        )
        .with_resolver(Arc::new(Names(map)));
        let listener = UnixListener::bind(&socket)?;
        tokio::spawn(Arc::new(proxy).serve(listener));
        Ok(Rig {
            socket,
            records,
            _dir: dir,
        })
    }

    impl Rig {
        /// CONNECT to `target`; the status line and headers, the body of a
        /// refusal, and the stream (for a tunnel).
        async fn connect(&self, target: &str) -> io::Result<(String, UnixStream)> {
            let mut s = UnixStream::connect(&self.socket).await?;
            s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
                .await?;
            let head = super::read_head(&mut s).await?;
            let mut text = String::from_utf8_lossy(&head).into_owned();
            let length = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            s.read_exact(&mut body).await?;
            text.push_str(&String::from_utf8_lossy(&body));
            Ok((text, s))
        }

        /// A plain-HTTP GET of `url` through the proxy: the whole answer.
        async fn get(&self, url: &str) -> io::Result<String> {
            let mut s = UnixStream::connect(&self.socket).await?;
            s.write_all(
                format!(
                    "GET {url} HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await?;
            let mut text = String::new();
            s.read_to_string(&mut text).await?;
            Ok(text)
        }

        /// The records, once `n` have come (each is reported as its
        /// connection ends).
        async fn records(&self, n: usize) -> Vec<Record> {
            for _ in 0..200 {
                let got = self
                    .records
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                if got.len() >= n {
                    return got;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            self.records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        }
    }

    fn allowing(rules: &[&str]) -> Result<Egress, String> {
        Ok(Egress {
            mode: Mode::Allow,
            allow: rules
                .iter()
                .map(|r| Rule::parse(r))
                .collect::<Result<_, _>>()?,
            ..Egress::default()
        })
    }

    #[tokio::test]
    async fn an_allowed_address_is_tunnelled_and_its_bytes_are_counted() -> TestResult {
        let port = echo().await?;
        let rig = rig(allowing(&[&format!("127.0.0.1:{port}")])?, &[]).await?;
        let (head, mut s) = rig.connect(&format!("127.0.0.1:{port}")).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s.write_all(b"ping").await?;
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await?;
        assert_eq!(&back, b"ping");
        drop(s);
        let recs = rig.records(1).await;
        assert_eq!(recs.len(), 1, "{recs:?}");
        assert_eq!(recs[0].verdict.action, Action::Allow);
        assert_eq!(recs[0].verdict.rule, format!("allow: 127.0.0.1:{port}"));
        assert_eq!((recs[0].bytes_up, recs[0].bytes_down), (4, 4));
        Ok(())
    }

    #[tokio::test]
    async fn a_refusal_names_the_rule_and_nothing_is_connected() -> TestResult {
        let port = echo().await?;
        // An allowed *name* that resolves to loopback (DNS rebinding, or a
        // name pointed at the host's own services) is refused.
        let rig = rig(
            allowing(&["pypi.test", "metadata.test"])?,
            &[
                ("pypi.test", "127.0.0.1"),
                ("metadata.test", "169.254.169.254"),
            ],
        )
        .await?;
        let (head, _) = rig.connect(&format!("pypi.test:{port}")).await?;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        assert!(
            head.contains("x-berth-refused: guarded: loopback"),
            "{head}"
        );
        assert!(
            head.contains("refused unless a rule names the address"),
            "{head}"
        );
        let (head, _) = rig.connect("metadata.test:80").await?;
        assert!(head.contains("guarded: link-local"), "{head}");
        // A host in no rule.
        let (head, _) = rig.connect("1.1.1.1:443").await?;
        assert!(head.contains("x-berth-refused: mode allow"), "{head}");
        let recs = rig.records(3).await;
        assert_eq!(recs.len(), 3, "{recs:?}");
        assert!(
            recs.iter()
                .all(|r| r.verdict.action == Action::Deny && r.bytes_up == 0)
        );
        assert_eq!(
            recs[0].addr,
            Some(SocketAddr::new([127, 0, 0, 1].into(), port))
        );
        Ok(())
    }

    #[tokio::test]
    async fn off_looks_nothing_up_for_a_tunnel_or_a_plain_request() -> TestResult {
        let rig = rig(Egress::default(), &[("pypi.test", "151.101.0.223")]).await?;
        let (head, _) = rig.connect("pypi.test:443").await?;
        assert!(head.contains("x-berth-refused: mode off"), "{head}");
        let text = rig.get("http://pypi.test/simple/").await?;
        assert!(text.starts_with("HTTP/1.1 403"), "{text}");
        assert!(text.contains("x-berth-refused: mode off"), "{text}");
        let recs = rig.records(2).await;
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert!(
            recs.iter().all(|r| r.addr.is_none()),
            "a name was resolved under mode off: {recs:?}"
        );
        Ok(())
    }

    /// An HTTP server on loopback that answers every request with `body`
    /// and the path it was asked for, then closes.
    async fn web(body: &'static str) -> io::Result<u16> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let port = l.local_addr()?.port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let head = match super::read_head(&mut s).await {
                        Ok(h) if h.ends_with(b"\r\n\r\n") => h,
                        _ => return,
                    };
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let line = text.lines().next().unwrap_or("").to_string();
                    let lower = text.to_ascii_lowercase();
                    let proxied = lower.contains("proxy-connection");
                    let fronted = lower.contains("host: x\r\n");
                    let out = format!("{body} {line} proxy-header:{proxied} fronted:{fronted}");
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
                        out.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        Ok(port)
    }

    #[tokio::test]
    async fn a_plain_request_is_judged_then_forwarded_with_the_path_only() -> TestResult {
        let port = web("hello").await?;
        // Allowed by address; a server reached by a name that resolves to
        // loopback is refused (the address connected to is what is judged).
        let rig = rig(
            allowing(&[&format!("127.0.0.1:{port}"), "pypi.test"])?,
            &[("pypi.test", "127.0.0.1")],
        )
        .await?;
        let text = rig
            .get(&format!("http://127.0.0.1:{port}/simple/pip/"))
            .await?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(
            text.contains("hello GET /simple/pip/ HTTP/1.1 proxy-header:false fronted:false"),
            "{text}"
        );
        // (Another port: the address rule above names the first one.)
        let other = web("other").await?;
        let text = rig.get(&format!("http://pypi.test:{other}/")).await?;
        assert!(
            text.contains("x-berth-refused: guarded: loopback"),
            "{text}"
        );
        let recs = rig.records(2).await;
        assert_eq!(recs.len(), 2, "{recs:?}");
        let ok = recs
            .iter()
            .find(|r| r.verdict.action == Action::Allow)
            .ok_or("no allowed record")?;
        assert_eq!(
            ok.bytes_down,
            "hello GET /simple/pip/ HTTP/1.1 proxy-header:false fronted:false".len() as u64
        );
        assert_eq!(ok.error, None);
        Ok(())
    }

    #[tokio::test]
    async fn a_name_no_rule_names_is_never_looked_up() -> TestResult {
        let rig = rig(
            allowing(&["pypi.test"])?,
            &[("secret.attacker.test", "151.101.0.223")],
        )
        .await?;
        let (head, _) = rig.connect("secret.attacker.test:443").await?;
        assert!(head.contains("x-berth-refused: mode allow"), "{head}");
        assert!(head.contains("not looked up"), "{head}");
        let text = rig.get("http://secret.attacker.test/").await?;
        assert!(text.contains("not looked up"), "{text}");
        let recs = rig.records(2).await;
        assert!(
            recs.iter().all(|r| r.addr.is_none()),
            "a name in no rule was resolved: {recs:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_policy_changed_while_running_judges_the_next_connection() -> TestResult {
        let port = echo().await?;
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("p.sock");
        let proxy = Arc::new(Proxy::new(Egress::default(), Arc::new(|_| {})));
        tokio::spawn(proxy.clone().serve(UnixListener::bind(&socket)?));
        let rig = Rig {
            socket,
            records: Arc::default(),
            _dir: dir,
        };
        let target = format!("127.0.0.1:{port}");
        assert!(rig.connect(&target).await?.0.starts_with("HTTP/1.1 403"));
        proxy.set_policy(allowing(&[&target])?);
        assert!(rig.connect(&target).await?.0.starts_with("HTTP/1.1 200"));
        Ok(())
    }

    /// A TLS server on loopback, its certificate for `name` signed by a
    /// root of its own, answering with the `authorization` header it saw.
    async fn tls_web(
        name: &str,
    ) -> Result<(u16, rustls::pki_types::CertificateDer<'static>), Box<dyn std::error::Error>> {
        let root_key = rcgen::KeyPair::generate()?;
        let mut root = rcgen::CertificateParams::new(Vec::<String>::new())?;
        root.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let root_cert = root.self_signed(&root_key)?;
        let issuer = rcgen::Issuer::new(root, root_key);
        let leaf_key = rcgen::KeyPair::generate()?;
        let leaf =
            rcgen::CertificateParams::new(vec![name.to_string()])?.signed_by(&leaf_key, &issuer)?;
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let port = l.local_addr()?.port();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(s).await else {
                        return;
                    };
                    let head = match super::read_head(&mut s).await {
                        Ok(h) if h.ends_with(b"\r\n\r\n") => h,
                        _ => return,
                    };
                    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    let auth = text
                        .lines()
                        .find_map(|l| l.strip_prefix("authorization: "))
                        .unwrap_or("none")
                        .to_string();
                    let host = text
                        .lines()
                        .find_map(|l| l.strip_prefix("host: "))
                        .unwrap_or("none")
                        .to_string();
                    let out = format!("auth={auth} host={host}");
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
                        out.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Ok((port, root_cert.der().clone()))
    }

    /// Speak TLS to `name` through a tunnel, trusting `root`; send one GET
    /// with `authorization: placeholder`, return the answer.
    async fn https_get(
        s: UnixStream,
        name: &str,
        root: rustls::pki_types::CertificateDer<'static>,
    ) -> Result<String, Box<dyn std::error::Error>> {
        let mut store = rustls::RootCertStore::empty();
        store.add(root)?;
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(store)
        .with_no_client_auth();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(
                rustls::pki_types::ServerName::try_from(name.to_string())?,
                s,
            )
            .await?;
        tls.write_all(
            b"GET /h HTTP/1.1\r\nHost: other.test\r\nAuthorization: berth-placeholder-T\r\nConnection: close\r\n\r\n",
        )
        .await?;
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[tokio::test]
    async fn a_credential_is_put_on_requests_to_its_host_and_nowhere_else() -> TestResult {
        let (port, root) = tls_web("api.test").await?;
        let dir = tempfile::tempdir()?;
        let ca = Arc::new(tls::Ca::load_or_make(&dir.path().join("ca.key"), "t")?);
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = records.clone();
        let mut map = HashMap::new();
        map.insert("api.test".to_string(), "127.0.0.1".parse()?);
        map.insert("plain.test".to_string(), "127.0.0.1".parse()?);
        let file: berth_policies::egress::RawNetworkPolicy = toml_like("api.test", "T");
        let credentials = file.build()?.credentials;
        let with_secret = |secret: Option<&'static str>| Credentials {
            list: credentials.clone(),
            ca: ca.clone(),
            client: tls::client(std::slice::from_ref(&root)).unwrap_or_else(|e| panic!("{e}")),
            secret: Arc::new(move |k| (k == "T").then_some(secret).flatten().map(String::from)),
        };
        let policy = allowing(&["api.test", "plain.test", &format!("127.0.0.1:{port}")])?;
        let proxy = Proxy::new(
            policy.clone(),
            Arc::new(move |r| sink.lock().unwrap_or_else(|p| p.into_inner()).push(r)),
        )
        .with_resolver(Arc::new(Names(map.clone())))
        .with_credentials(with_secret(Some("s3cret")));
        let socket = dir.path().join("p.sock");
        tokio::spawn(Arc::new(proxy).serve(UnixListener::bind(&socket)?));
        let rig = Rig {
            socket,
            records,
            _dir: dir,
        };
        // The sandbox trusts its CA; the host sees the real key, and the
        // Host the tunnel was judged for, not the one the client wrote.
        let ca_root = {
            let pem = ca.cert_pem().to_string();
            let der = pem::parse(pem)?.into_contents();
            rustls::pki_types::CertificateDer::from(der)
        };
        let (head, s) = rig.connect(&format!("api.test:{port}")).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let text = https_get(s, "api.test", ca_root.clone()).await?;
        assert!(
            text.contains(&format!("auth=bearer s3cret host=api.test:{port}")),
            "{text}"
        );
        // A host with no credential is passed through: the sandbox sees the
        // host's own certificate (its root, not the sandbox's CA) and the
        // placeholder it sent goes as it was.
        let (_, s) = rig.connect(&format!("plain.test:{port}")).await?;
        assert!(https_get(s, "plain.test", ca_root.clone()).await.is_err());
        let recs = rig.records(2).await;
        let carried: Vec<_> = recs.iter().map(|r| r.credential.clone()).collect();
        assert!(
            carried.contains(&Some("authorization".into())) && carried.contains(&None),
            "{recs:?}"
        );
        let with = recs
            .iter()
            .find(|r| r.credential.is_some())
            .ok_or("no record")?;
        assert!(
            with.bytes_up > 0 && with.bytes_down > 0 && with.error.is_none(),
            "{with:?}"
        );
        // No value in berth's environment: the request is answered with why,
        // and nothing goes to the host.
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("p.sock");
        let proxy = Proxy::new(policy, Arc::new(|_| {}))
            .with_resolver(Arc::new(Names(map)))
            .with_credentials(with_secret(None));
        tokio::spawn(Arc::new(proxy).serve(UnixListener::bind(&socket)?));
        let rig = Rig {
            socket,
            records: Arc::default(),
            _dir: dir,
        };
        let (_, s) = rig.connect(&format!("api.test:{port}")).await?;
        let text = https_get(s, "api.test", ca_root).await?;
        assert!(text.starts_with("HTTP/1.1 502"), "{text}");
        assert!(text.contains("read from T in berth's server's"), "{text}");
        Ok(())
    }

    /// Says yes to `yes.test` only, and counts what it was asked.
    type Asked = Arc<Mutex<Vec<(String, Option<SocketAddr>)>>>;
    struct Person(Asked);

    impl Ask for Person {
        fn ask(
            &self,
            host: String,
            _port: u16,
            addr: Option<SocketAddr>,
            _v: Verdict,
        ) -> Hook<Result<(), String>> {
            let yes = host == "yes.test";
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((host, addr));
            Box::pin(async move {
                if yes {
                    Ok(())
                } else {
                    Err("approval #7 was denied by cli".into())
                }
            })
        }
    }

    /// Resolves every name to `to`, counting the lookups.
    struct Counting(IpAddr, Arc<AtomicU64>);

    impl Resolve for Counting {
        fn resolve(&self, _host: String, port: u16) -> Hook<io::Result<Vec<SocketAddr>>> {
            self.1.fetch_add(1, Ordering::Relaxed);
            let a = vec![SocketAddr::new(self.0, port)];
            Box::pin(async move { Ok(a) })
        }
    }

    #[tokio::test]
    async fn an_unknown_name_is_put_to_a_person_before_it_is_looked_up() -> TestResult {
        let port = echo().await?;
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("p.sock");
        let asked = Arc::new(Mutex::new(Vec::new()));
        let lookups = Arc::new(AtomicU64::new(0));
        let mut policy = allowing(&[&format!("127.0.0.1:{port}")])?;
        policy.ask = true;
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = records.clone();
        let proxy = Proxy::new(
            policy,
            Arc::new(move |r| sink.lock().unwrap_or_else(|p| p.into_inner()).push(r)),
        )
        .with_resolver(Arc::new(Counting([127, 0, 0, 1].into(), lookups.clone())))
        .with_asker(Arc::new(Person(asked.clone())));
        tokio::spawn(Arc::new(proxy).serve(UnixListener::bind(&socket)?));
        let rig = Rig {
            socket,
            records,
            _dir: dir,
        };
        let (head, _) = rig.connect(&format!("no.test:{port}")).await?;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        assert!(head.contains("approval #7 was denied by cli"), "{head}");
        assert_eq!(
            lookups.load(Ordering::Relaxed),
            0,
            "a refused name was looked up"
        );
        let (head, _) = rig.connect(&format!("yes.test:{port}")).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(lookups.load(Ordering::Relaxed), 1);
        let asked = asked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(
            asked,
            vec![
                ("no.test".to_string(), None),
                ("yes.test".to_string(), None)
            ]
        );
        let recs = rig.records(2).await;
        assert!(
            recs.iter().any(|r| r.verdict.rule == "approved"),
            "{recs:?}"
        );
        Ok(())
    }

    fn toml_like(host: &str, env: &str) -> berth_policies::egress::RawNetworkPolicy {
        let text = format!(
            "[[credentials]]\nhost = \"{host}\"\nheader = \"Authorization\"\nvalue_env = \"{env}\"\nprefix = \"Bearer \"\n"
        );
        toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"))
    }
}
