//! `berth mcp --listen`: the streamable HTTP transport behind a bearer token.
//!
//! Flow at a glance: bind (a bare port means loopback), print the address and
//! the token on stderr, then serve each TCP connection, once its peer is
//! checked (this uid, no sandbox: [`checked_peers`]), with tonic's server
//! (hyper underneath). Every request is checked for `Authorization: Bearer
//! <token>` (compared in constant time) before rmcp's service sees it;
//! anything else gets 401.
//!
//! The HTTP side is tonic's (`Server::serve_with_incoming`): it serves any
//! tower service, and with `accept_http1` it speaks the HTTP/1.1 that MCP
//! clients use. It is handed only the connections whose peer passed the
//! check, which runs off the accept loop (it reads `/proc`). The bearer check is a `service_fn` in
//! front of rmcp's service. This listener needs none of what `berth serve`
//! writes around its own loop (a connection cap, an ordered drain, an idle
//! exit): it runs until the process is stopped.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq;
use tower_service::Service;

use super::{BerthServer, Shared};

/// The address to bind: `HOST:PORT`, `[V6]:PORT`, or a bare port on loopback.
pub(crate) fn listen_addr(s: &str) -> Result<SocketAddr> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = s.strip_prefix("localhost:") {
        let port = port.parse::<u16>().context("--listen: bad port")?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>()
        .with_context(|| format!("--listen {s:?}: give HOST:PORT (e.g. 127.0.0.1:8765) or a port"))
}

/// Where a token the user gave came from, for the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenFrom {
    File,
    Env,
}

/// The bearer token the user gave, if any: `--token-file` (its first line),
/// else `BERTH_MCP_TOKEN`. `--token` on the command line is refused: every
/// process of the host can read a command line (/proc/PID/cmdline),
/// sandboxes with the network on included, and would drive every tool with
/// it. A file that cannot be read or holds no token is an error, not a
/// silent fall back to a random token.
pub(crate) fn given_token(
    flag: Option<&str>,
    file: Option<&std::path::Path>,
    env: Option<String>,
) -> Result<Option<(String, TokenFrom)>> {
    if flag.is_some() {
        bail!(
            "--token puts the token on the command line, where every process of this host can read it \
             (/proc/PID/cmdline, ps), sandboxes included; write it to a file of mode 0600 and give \
             --token-file PATH, or set the environment variable BERTH_MCP_TOKEN, or give neither and \
             berth prints a new token on stderr"
        );
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "--token-file {}: cannot read the token file (write the token to it, mode 0600)",
                path.display()
            )
        })?;
        let token = text.lines().next().unwrap_or_default().trim().to_string();
        if token.is_empty() {
            bail!(
                "--token-file {}: the file holds no token (write it on the first line)",
                path.display()
            );
        }
        #[cfg(unix)]
        if let Ok(m) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            if m.permissions().mode() & 0o077 != 0 {
                eprintln!(
                    "berth mcp: warning: --token-file {} is readable by other users; chmod 600 it",
                    path.display()
                );
            }
        }
        return Ok(Some((token, TokenFrom::File)));
    }
    Ok(env.filter(|t| !t.is_empty()).map(|t| (t, TokenFrom::Env)))
}

fn new_token() -> String {
    let bytes: [u8; 24] = rand::random();
    hex::encode(bytes)
}

/// The two byte strings are equal, compared in time that does not depend on
/// where they differ (`subtle` keeps the optimiser from cutting it short).
fn same(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

fn authorized<B>(req: &Request<B>, token: &str) -> bool {
    req.headers()
        .get_all(hyper::header::AUTHORIZATION)
        .iter()
        .any(|v| {
            let v = v.as_bytes();
            v.len() > 7
                && v[..7].eq_ignore_ascii_case(b"bearer ")
                && same(v[7..].trim_ascii(), token.as_bytes())
        })
}

pub(crate) async fn serve(
    shared: Arc<Shared>,
    addr: &str,
    token: Option<(String, TokenFrom)>,
) -> Result<()> {
    let addr = listen_addr(addr)?;
    let (token, from) = match token {
        Some((t, from)) if t.len() < 16 => {
            let name = match from {
                TokenFrom::File => "the token in --token-file",
                TokenFrom::Env => "BERTH_MCP_TOKEN",
            };
            bail!("{name} is too short: use 16 characters or more")
        }
        Some((t, from)) => (t, Some(from)),
        None => (new_token(), None),
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".into(),
        "::1".into(),
        local.ip().to_string(),
    ];
    if !local.ip().is_loopback() && !local.ip().is_unspecified() {
        hosts.push(local.to_string());
    }
    // Any Host is accepted on a wildcard bind: the token is what guards it.
    let config = if local.ip().is_unspecified() {
        StreamableHttpServerConfig::default().disable_allowed_hosts()
    } else {
        StreamableHttpServerConfig::default().with_allowed_hosts(hosts)
    };
    let factory_shared = shared.clone();
    let service = StreamableHttpService::new(
        move || Ok(BerthServer::new(factory_shared.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    eprintln!("berth mcp: serving MCP over HTTP at http://{local}/mcp");
    // A token berth made up is printed, for the client; one the user gave is
    // not echoed into logs they may not keep as secret as the token's file.
    let shown = match from {
        None => {
            eprintln!("berth mcp: bearer token: {token}");
            token.as_str()
        }
        Some(TokenFrom::File) => "<the token in --token-file>",
        Some(TokenFrom::Env) => "<$BERTH_MCP_TOKEN>",
    };
    eprintln!(
        "berth mcp: client config: {{\"mcpServers\": {{\"berth\": {{\"type\": \"http\", \"url\": \"http://{local}/mcp\", \"headers\": {{\"Authorization\": \"Bearer {shown}\"}}}}}}}}"
    );
    let token = Arc::new(token);
    let checked = tower::service_fn(move |req: Request<tonic::body::Body>| {
        let mut service = service.clone();
        let ok = authorized(&req, &token);
        async move {
            if !ok {
                return Ok::<_, std::convert::Infallible>(unauthorized());
            }
            service.call(req).await
        }
    });
    tonic::transport::Server::builder()
        .accept_http1(true)
        .serve_with_incoming(checked, checked_peers(listener))
        .await
        .context("serving MCP over HTTP")
}

/// The listener's connections, each once its peer is checked: like the
/// dashboard's, a peer found in this host's socket table (whatever its
/// source address) must be of this process's uid and in no sandbox (by its
/// cgroup or mount namespace); on a loopback listener a peer that cannot be
/// found is refused too. A token read from a sandbox (or another user's
/// process) is then of no use. A peer from another host (a listener on a
/// public address) has only the token to show.
fn checked_peers(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    let loopback = listener
        .local_addr()
        .is_ok_and(|a| a.ip().to_canonical().is_loopback());
    let (tx, rx) = tokio::sync::mpsc::channel::<tokio::net::TcpStream>(64);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("berth mcp: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(local) = stream.local_addr() else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let who = tokio::task::spawn_blocking(move || {
                    berth_core::identity::check_tcp_peer(peer, local, loopback)
                })
                .await;
                match who {
                    Ok(Ok(_)) => {
                        let _ = tx.send(stream).await;
                    }
                    Ok(Err(why)) => eprintln!("berth mcp: refused a connection from {peer}: {why}"),
                    Err(e) => eprintln!(
                        "berth mcp: refused a connection from {peer}: its peer could not be checked ({e})"
                    ),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|s| (Ok::<_, std::io::Error>(s), rx))
    })
}

/// The answer to a request without the token.
fn unauthorized() -> Response<BoxBody<Bytes, std::convert::Infallible>> {
    let body = Full::new(Bytes::from_static(
        b"{\"error\":\"unauthorized: send Authorization: Bearer <token> (printed by berth mcp --listen, or BERTH_MCP_TOKEN)\"}",
    ))
    .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    r.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_loopback() {
        let a = listen_addr("8765").map_err(|e| e.to_string());
        assert_eq!(
            a,
            Ok("127.0.0.1:8765".parse().unwrap_or_else(|_| unreachable!()))
        );
        assert!(listen_addr("localhost:1").is_ok_and(|a| a.ip().is_loopback()));
        assert!(listen_addr("0.0.0.0:80").is_ok_and(|a| a.ip().is_unspecified()));
        assert!(listen_addr("nonsense").is_err());
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }
}
