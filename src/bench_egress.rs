//! `berth bench --egress`: what berth's egress proxy adds, against a direct
//! connection to the same origin, measured side by side in one run.
//!
//! An origin on loopback serves a one-byte answer and a `--size-mb` one.
//! Each request opens a connection of its own, as a client does per HTTPS
//! request through a proxy: directly (the floor), and through the proxy
//! (`CONNECT` on its unix socket, judged by an allow rule naming the
//! origin, then the same request through the tunnel). What this measures is
//! the proxy itself: the `CONNECT`, the decision, the copy. A sandbox's relay
//! (socat in docker, the wrapper's relay on local) adds its own hop, not
//! counted here; nor is TLS, which costs the same both ways.
//!
//! Except for a host that carries a credential: there the proxy ends the
//! client's TLS and opens its own, so the run also measures an HTTPS
//! request to a TLS origin directly against one through the proxy's
//! credential path (two handshakes and the header set), each on a
//! connection of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use berth_egress::rustls;
use berth_egress::tls;
use berth_egress::tokio_rustls::{TlsAcceptor, TlsConnector};
use berth_policies::egress::{Credential, Egress, Mode, Rule};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::bench::BenchArgs;
use crate::context;
use crate::io::outln;

/// An origin: `/small` answers one byte, anything else `big` bytes; over
/// TLS when given an acceptor.
async fn origin(big: u64, tls: Option<TlsAcceptor>) -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let port = l.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(t) => {
                        if let Ok(s) = t.accept(s).await {
                            answer(s, big).await;
                        }
                    }
                    None => answer(s, big).await,
                }
            });
        }
    });
    Ok(port)
}

/// Answer one request on `s`.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, big: u64) {
    let Ok(head) = read_head(&mut s).await else {
        return;
    };
    let n = if head.starts_with("GET /small ") {
        1
    } else {
        big
    };
    let hdr = format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\nconnection: close\r\n\r\n");
    if s.write_all(hdr.as_bytes()).await.is_err() {
        return;
    }
    let chunk = vec![b'x'; 256 * 1024];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        if s.write_all(&chunk[..k]).await.is_err() {
            return;
        }
        left -= k as u64;
    }
    let _ = s.shutdown().await;
}

/// Read up to the blank line that ends an HTTP head.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Result<String> {
    let head = berth_egress::read_head(s).await?;
    if !head.ends_with(b"\r\n\r\n") {
        bail!("the connection ended inside a head");
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// One request on `s`: the body's length, read to its end.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, path: &str) -> Result<u64> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: origin\r\n\r\n").as_bytes())
        .await?;
    let head = read_head(s).await?;
    let want: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse().ok())
        .context("the origin's answer has no length")?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    while got < want {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            bail!("the answer ended after {got} of {want} bytes");
        }
        got += n as u64;
    }
    Ok(got)
}

async fn direct(port: u16, path: &str) -> Result<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    get(&mut s, path).await
}

async fn tunnel(sock: &std::path::Path, host: &str, port: u16) -> Result<UnixStream> {
    let mut s = UnixStream::connect(sock).await?;
    s.write_all(
        format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
    )
    .await?;
    let head = read_head(&mut s).await?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("the proxy refused the bench's CONNECT: {head}");
    }
    Ok(s)
}

async fn proxied(sock: &std::path::Path, port: u16, path: &str) -> Result<u64> {
    let mut s = tunnel(sock, "127.0.0.1", port).await?;
    get(&mut s, path).await
}

/// The name the TLS origin is known by (the proxy resolves it from a table).
const TLS_NAME: &str = "origin.bench.test";

/// One HTTPS request over `s`, trusting `client`'s roots.
async fn https<S: AsyncRead + AsyncWrite + Unpin>(
    s: S,
    client: &Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<u64> {
    let name = rustls::pki_types::ServerName::try_from(TLS_NAME)?;
    let mut tls = TlsConnector::from(client.clone()).connect(name, s).await?;
    get(&mut tls, path).await
}

/// The TLS origin, and a proxy that carries a credential to it: the
/// origin's port, the proxy's socket, and the clients that trust the
/// origin's CA (direct) and the sandbox's CA (through the proxy).
struct TlsRig {
    port: u16,
    sock: std::path::PathBuf,
    direct: Arc<rustls::ClientConfig>,
    sandbox: Arc<rustls::ClientConfig>,
}

async fn tls_rig(dir: &std::path::Path, big: u64) -> Result<TlsRig> {
    let origin_ca = tls::Ca::load_or_make(&dir.join("origin.key"), "bench origin")?;
    let sandbox_ca = tls::Ca::load_or_make(&dir.join("sandbox.key"), "bench sandbox")?;
    let acceptor = TlsAcceptor::from(origin_ca.server_for(TLS_NAME).map_err(anyhow::Error::msg)?);
    let port = origin(big, Some(acceptor)).await?;
    let direct =
        tls::client(std::slice::from_ref(origin_ca.cert_der())).map_err(anyhow::Error::msg)?;
    let sandbox =
        tls::client(std::slice::from_ref(sandbox_ca.cert_der())).map_err(anyhow::Error::msg)?;
    let rule = |t: &str| Rule::parse(t).map_err(anyhow::Error::msg);
    let policy = Egress {
        mode: Mode::Allow,
        allow: vec![rule(TLS_NAME)?, rule(&format!("127.0.0.1:{port}"))?],
        ..Egress::default()
    };
    let sock = dir.join("tls-proxy.sock");
    let names = berth_egress::TableResolver::parse(&format!("{TLS_NAME}=127.0.0.1"))
        .map_err(anyhow::Error::msg)?;
    let proxy = berth_egress::Proxy::new(policy, Arc::new(|_| {}))
        .with_resolver(Arc::new(names))
        .with_credentials(berth_egress::Credentials {
            list: vec![Credential {
                host: rule(TLS_NAME)?,
                header: "authorization".into(),
                value_env: "BENCH_TOKEN".into(),
                prefix: "Bearer ".into(),
            }],
            ca: Arc::new(sandbox_ca),
            client: direct.clone(),
            secret: Arc::new(|_| Some("bench-value".into())),
        });
    tokio::spawn(Arc::new(proxy).serve(UnixListener::bind(&sock)?));
    Ok(TlsRig {
        port,
        sock,
        direct,
        sandbox,
    })
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `berth bench --egress`.
pub async fn run(a: BenchArgs) -> Result<u8> {
    a.check()?;
    let size_mb = a.size_mb.unwrap_or(100);
    if size_mb == 0 {
        bail!("--size-mb must be at least 1");
    }
    let big = size_mb * 1024 * 1024;
    let port = origin(big, None).await?;
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("proxy.sock");
    let policy = Egress {
        mode: Mode::Allow,
        allow: vec![Rule::parse(&format!("127.0.0.1:{port}")).map_err(anyhow::Error::msg)?],
        ..Egress::default()
    };
    let proxy = Arc::new(berth_egress::Proxy::new(policy, Arc::new(|_| {})));
    tokio::spawn(proxy.serve(UnixListener::bind(&sock)?));

    // Warm both paths, then alternate, so neither gets a quieter machine.
    direct(port, "/small").await?;
    proxied(&sock, port, "/small").await?;
    let (mut d_small, mut p_small) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..a.count {
        let t = Instant::now();
        direct(port, "/small").await?;
        d_small += t.elapsed();
        let t = Instant::now();
        proxied(&sock, port, "/small").await?;
        p_small += t.elapsed();
    }
    let n = a.count as u32;
    let (d_req, p_req) = (d_small / n, p_small / n);
    let t = Instant::now();
    let got = direct(port, "/big").await?;
    let d_big = t.elapsed();
    let t = Instant::now();
    let got_p = proxied(&sock, port, "/big").await?;
    let p_big = t.elapsed();
    if got != big || got_p != big {
        bail!("a download was short: {got} and {got_p} of {big} bytes");
    }
    // HTTPS to a host carrying a credential: TLS ended at the proxy and
    // opened again, against TLS straight to the origin.
    let rig = tls_rig(dir.path(), big).await?;
    let tls_direct = || async {
        https(
            TcpStream::connect(("127.0.0.1", rig.port)).await?,
            &rig.direct,
            "/small",
        )
        .await
    };
    let tls_proxied = || async {
        https(
            tunnel(&rig.sock, TLS_NAME, rig.port).await?,
            &rig.sandbox,
            "/small",
        )
        .await
    };
    tls_direct().await?;
    tls_proxied().await?;
    let (mut d_tls, mut p_tls) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..a.count {
        let t = Instant::now();
        tls_direct().await?;
        d_tls += t.elapsed();
        let t = Instant::now();
        tls_proxied().await?;
        p_tls += t.elapsed();
    }
    let (d_tls, p_tls) = (d_tls / n, p_tls / n);
    let mbps = |d: Duration| (big as f64 / (1024.0 * 1024.0)) / d.as_secs_f64();
    let out = json!({
        "requests": a.count,
        "direct_request_us": us(d_req),
        "proxied_request_us": us(p_req),
        "added_us": us(p_req) - us(d_req),
        "request_ratio": us(p_req) / us(d_req),
        "download_mib": size_mb,
        "direct_mib_per_s": mbps(d_big),
        "proxied_mib_per_s": mbps(p_big),
        "throughput_ratio": mbps(p_big) / mbps(d_big),
        "direct_https_request_us": us(d_tls),
        "credential_https_request_us": us(p_tls),
        "credential_added_us": us(p_tls) - us(d_tls),
        "credential_request_ratio": us(p_tls) / us(d_tls),
    });
    if a.json {
        context::print_json(&out);
    } else {
        outln!(
            "berth's egress proxy against a direct connection to the same origin, this run \
             ({} requests, each on a connection of its own; the proxy's CONNECT, decision and copy, \
             without a sandbox's relay or TLS):",
            a.count
        );
        outln!(
            "  per request   direct {:>9.1} µs   proxied {:>9.1} µs   +{:.1} µs  ({:.2}x)",
            us(d_req),
            us(p_req),
            us(p_req) - us(d_req),
            us(p_req) / us(d_req)
        );
        outln!(
            "  {} MiB        direct {:>9.1} MiB/s proxied {:>9.1} MiB/s  ({:.2}x of direct)",
            size_mb,
            mbps(d_big),
            mbps(p_big),
            mbps(p_big) / mbps(d_big)
        );
        outln!(
            "  HTTPS with a credential (TLS ended at the proxy and opened again, header set):\n  \
             per request   direct {:>9.1} µs   proxied {:>9.1} µs   +{:.1} µs  ({:.2}x)",
            us(d_tls),
            us(p_tls),
            us(p_tls) - us(d_tls),
            us(p_tls) / us(d_tls)
        );
    }
    Ok(0)
}
