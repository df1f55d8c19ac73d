//! envd: the process service over Connect with JSON, and `/files`.
//!
//! Flow at a glance:
//! - Every call is routed to a sandbox by `E2b-Sandbox-Id` (or a
//!   `49983-{id}.{domain}` host) and needs its `X-Access-Token`; a sandbox
//!   that is gone or paused gets the proxy's 502, as in the real service.
//! - `Start` and `Connect` are server streams: an HTTP 200 whose body is
//!   envelopes: `start`, then `data` and `keepalive`, then `end`, then the
//!   end-of-stream frame. `Connect-Timeout-Ms` on `Start` is the process's
//!   deadline.
//! - Unary calls take and give bare JSON; errors are Connect's `{code, message}`
//!   with the matching HTTP status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Multipart, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::envelope;
use super::sandbox::{EndInfo, Proc, ProcConfig, ProcEvent, Sandbox, State as SbState, lock};
use super::{ENVD_PORT, Shared};

/// A Connect error code and its HTTP status.
fn connect_status(code: &str) -> StatusCode {
    match code {
        "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "permission_denied" => StatusCode::FORBIDDEN,
        "not_found" | "unimplemented" => StatusCode::NOT_FOUND,
        "already_exists" | "aborted" => StatusCode::CONFLICT,
        "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A unary Connect error.
fn connect_error(code: &str, message: impl Into<String>) -> Response {
    (
        connect_status(code),
        axum::Json(json!({"code": code, "message": message.into()})),
    )
        .into_response()
}

/// The proxy's answer for a sandbox that is not running.
fn proxy_502(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(json!({
            "code": 502,
            "message": "The sandbox was not found",
            "sandboxId": id,
        })),
    )
        .into_response()
}

/// Find the sandbox a request is for and check its token.
fn route(shared: &Shared, headers: &HeaderMap) -> Result<Arc<Sandbox>, Response> {
    let hv = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    let by_header = hv("e2b-sandbox-id").map(|id| (id.to_string(), hv("e2b-sandbox-port")));
    let by_host = || {
        let host = hv("host")?;
        let (port, rest) = host.split_once('-')?;
        let id = rest.split('.').next()?;
        Some((id.to_string(), Some(port)))
    };
    let Some((id, port)) = by_header.or_else(by_host) else {
        return Err(connect_error(
            "invalid_argument",
            "no sandbox named: send E2b-Sandbox-Id and E2b-Sandbox-Port, or use the 49983-{id} host",
        ));
    };
    let port_ok = port.is_none_or(|p| p == ENVD_PORT.to_string());
    if !port_ok {
        return Err(proxy_502(&id));
    }
    let Some(sb) = shared.get(&id) else {
        return Err(proxy_502(&id));
    };
    if *lock(&sb.state) == SbState::Paused {
        return Err(proxy_502(&id));
    }
    match hv("x-access-token") {
        Some(t) if t == sb.access_token => Ok(sb),
        _ => Err(connect_error(
            "unauthenticated",
            "unauthorized access, please provide a valid access token or method signing if supported",
        )),
    }
}

/// `GET /health`: 204 when the sandbox answers.
pub async fn health(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match shared.get(id) {
        Some(sb) if *lock(&sb.state) == SbState::Running => StatusCode::NO_CONTENT.into_response(),
        _ => proxy_502(id),
    }
}

/// `POST /filesystem.Filesystem/{method}`: `Stat` and `Remove`, unary JSON;
/// the other methods are not implemented by the stand-in.
///
/// `Stat` follows symlinks and reports `FILE_TYPE_FILE` for a regular file,
/// `FILE_TYPE_DIRECTORY` for a directory and `FILE_TYPE_UNSPECIFIED` for
/// anything else (a FIFO, socket or device), as envd does. A missing path is
/// Connect's `not_found`.
pub async fn filesystem(
    State(shared): State<Arc<Shared>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let sb = match route(&shared, &headers) {
        Ok(sb) => sb,
        Err(r) => return r,
    };
    if !matches!(method.as_str(), "Stat" | "Remove") {
        return connect_error(
            "unimplemented",
            format!("filesystem.Filesystem/{method} is not implemented by the stand-in"),
        );
    }
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return connect_error("invalid_argument", format!("invalid JSON: {e}")),
    };
    let Some(path) = req
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    else {
        return connect_error("invalid_argument", "path is required");
    };
    let full = sb.resolve(path);
    let meta = match tokio::fs::symlink_metadata(&full).await {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return connect_error("not_found", format!("file not found: {}", full.display()));
        }
        Err(e) => {
            return connect_error(
                "internal",
                format!("error statting {}: {e}", full.display()),
            );
        }
    };
    if method == "Remove" {
        let r = if meta.is_dir() {
            tokio::fs::remove_dir_all(&full).await
        } else {
            tokio::fs::remove_file(&full).await
        };
        return match r {
            Ok(()) => axum::Json(json!({})).into_response(),
            Err(e) => connect_error(
                "internal",
                format!("error removing {}: {e}", full.display()),
            ),
        };
    }
    let meta = tokio::fs::metadata(&full).await.unwrap_or(meta);
    let kind = if meta.is_file() {
        "FILE_TYPE_FILE"
    } else if meta.is_dir() {
        "FILE_TYPE_DIRECTORY"
    } else {
        "FILE_TYPE_UNSPECIFIED"
    };
    use std::os::unix::fs::MetadataExt;
    let name = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut entry = json!({
        "name": name,
        "path": full.display().to_string(),
        "size": meta.len().to_string(),
        "mode": meta.mode() & 0o7777,
    });
    // proto3 JSON leaves a zero enum out, as envd does.
    if kind != "FILE_TYPE_UNSPECIFIED" {
        entry["type"] = json!(kind);
    }
    axum::Json(json!({ "entry": entry })).into_response()
}

/// `POST /process.Process/{method}`.
pub async fn process(
    State(shared): State<Arc<Shared>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let sb = match route(&shared, &headers) {
        Ok(sb) => sb,
        Err(r) => return r,
    };
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let want = if streaming {
        "application/connect+json"
    } else {
        "application/json"
    };
    if ctype != want {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("{method} takes {want}, got {ctype:?}"),
        )
            .into_response();
    }
    if streaming {
        return stream_call(shared, sb, &method, &headers, &body);
    }
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return connect_error("invalid_argument", format!("invalid JSON: {e}")),
    };
    match method.as_str() {
        "SendInput" => send_input(&sb, &req).await,
        "SendSignal" => send_signal(&sb, &req),
        "CloseStdin" => close_stdin(&sb, &req).await,
        "List" => list(&sb),
        "Update" => match select(&sb, req.get("process")) {
            Ok(p) => match req.get("pty").map(pty_size) {
                None => axum::Json(json!({})).into_response(),
                Some(None) => {
                    connect_error("invalid_argument", "pty.size needs cols and rows above 0")
                }
                Some(Some((cols, rows))) => match p.resize(cols, rows) {
                    Ok(()) => axum::Json(json!({})).into_response(),
                    Err(e) => connect_error("failed_precondition", e),
                },
            },
            Err(r) => r,
        },
        other => connect_error(
            "unimplemented",
            format!("process.Process/{other} is not implemented"),
        ),
    }
}

/// A `PTY`'s size, `{"size": {"cols": C, "rows": R}}`, when both are above 0.
fn pty_size(pty: &Value) -> Option<(u16, u16)> {
    let size = pty.get("size")?;
    let n = |k: &str| {
        size.get(k)
            .and_then(json_u32)
            .and_then(|v| u16::try_from(v).ok())
            .filter(|v| *v > 0)
    };
    Some((n("cols")?, n("rows")?))
}

/// Resolve a `ProcessSelector`: `{"pid": N}` or `{"tag": "…"}`.
fn select(sb: &Sandbox, sel: Option<&Value>) -> Result<Arc<Proc>, Response> {
    let sel =
        sel.ok_or_else(|| connect_error("invalid_argument", "process selector is required"))?;
    let pid = sel.get("pid").and_then(json_u32);
    let tag = sel.get("tag").and_then(Value::as_str);
    if pid.is_none() && tag.is_none() {
        return Err(connect_error(
            "invalid_argument",
            "process selector needs a pid or a tag",
        ));
    }
    match sb.find(pid, tag) {
        Some(p) if !p.ended() => Ok(p),
        _ => Err(connect_error(
            "not_found",
            match (pid, tag) {
                (Some(p), _) => format!("process with pid {p} not found"),
                (_, Some(t)) => format!("process with tag {t} not found"),
                _ => "process not found".into(),
            },
        )),
    }
}

/// A proto3 JSON integer: a number or a decimal string.
fn json_u32(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

async fn send_input(sb: &Sandbox, req: &Value) -> Response {
    let p = match select(sb, req.get("process")) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let input = req.get("input");
    let data = input
        .and_then(|i| i.get("stdin").or_else(|| i.get("pty")))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let bytes = match B64.decode(data) {
        Ok(b) => b,
        Err(e) => return connect_error("invalid_argument", format!("input is not base64: {e}")),
    };
    match p.write_stdin(&bytes).await {
        Ok(()) => axum::Json(json!({})).into_response(),
        Err(e) => connect_error(
            "failed_precondition",
            format!("error writing to process stdin: {e}"),
        ),
    }
}

fn send_signal(sb: &Sandbox, req: &Value) -> Response {
    let p = match select(sb, req.get("process")) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let sig = match req.get("signal") {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => libc::SIGKILL,
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => libc::SIGTERM,
        Some(Value::Number(n)) if n.as_i64() == Some(9) => libc::SIGKILL,
        Some(Value::Number(n)) if n.as_i64() == Some(15) => libc::SIGTERM,
        other => {
            return connect_error("invalid_argument", format!("invalid signal: {other:?}"));
        }
    };
    p.signal(sig);
    axum::Json(json!({})).into_response()
}

async fn close_stdin(sb: &Sandbox, req: &Value) -> Response {
    match select(sb, req.get("process")) {
        Ok(p) => {
            p.close_stdin().await;
            axum::Json(json!({})).into_response()
        }
        Err(r) => r,
    }
}

fn list(sb: &Sandbox) -> Response {
    let procs: Vec<Value> = lock(&sb.procs)
        .values()
        .filter(|p| !p.ended())
        .map(|p| {
            let mut cfg = json!({"cmd": p.config.cmd});
            if !p.config.args.is_empty() {
                cfg["args"] = json!(p.config.args);
            }
            if !p.config.envs.is_empty() {
                cfg["envs"] = json!(p.config.envs);
            }
            if let Some(c) = &p.config.cwd {
                cfg["cwd"] = json!(c);
            }
            let mut info = json!({"config": cfg, "pid": p.pid});
            if let Some(t) = &p.tag {
                info["tag"] = json!(t);
            }
            info
        })
        .collect();
    let body = if procs.is_empty() {
        json!({})
    } else {
        json!({"processes": procs})
    };
    axum::Json(body).into_response()
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartRequest {
    process: Option<ProcessConfigJson>,
    tag: Option<String>,
    stdin: Option<bool>,
    pty: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProcessConfigJson {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// One streaming response: a channel of framed bytes behind a 200.
fn stream_response(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response {
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        body,
    )
        .into_response()
}

/// An already-failed stream: 200, then only the end-of-stream error.
fn stream_failure(code: &str, message: &str) -> Response {
    let frame = envelope::end_stream(Some((code, message)));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        frame,
    )
        .into_response()
}

fn stream_call(
    shared: Arc<Shared>,
    sb: Arc<Sandbox>,
    method: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let payload = match envelope::decode_single(body) {
        Ok(p) => p,
        Err(e) => return stream_failure("invalid_argument", &e),
    };
    let req: Value = match serde_json::from_slice(payload) {
        Ok(v) => v,
        Err(e) => return stream_failure("invalid_argument", &format!("invalid JSON: {e}")),
    };
    let hv = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    let keepalive = hv("keepalive-ping-interval")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(90));
    let deadline = hv("connect-timeout-ms")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|ms| Instant::now() + Duration::from_millis(ms));

    let (proc, events, ended) = if method == "Start" {
        let req: StartRequest = match serde_json::from_value(req) {
            Ok(r) => r,
            Err(e) => {
                return stream_failure("invalid_argument", &format!("invalid StartRequest: {e}"));
            }
        };
        let pty = match req.pty.as_ref().map(pty_size) {
            None => None,
            Some(Some(size)) => Some(size),
            Some(None) => {
                return stream_failure("invalid_argument", "pty.size needs cols and rows above 0");
            }
        };
        let Some(cfg) = req.process.filter(|c| !c.cmd.is_empty()) else {
            return stream_failure("invalid_argument", "process.cmd is required");
        };
        let cfg = ProcConfig {
            cmd: cfg.cmd,
            args: cfg.args,
            envs: cfg.envs,
            cwd: cfg.cwd,
        };
        match sb.start(cfg, req.tag, req.stdin.unwrap_or(false), pty) {
            Ok((p, rx)) => (p, Some(rx), None),
            Err(e) => return stream_failure("internal", &e),
        }
    } else {
        let sel = req.get("process");
        let pid = sel.and_then(|s| s.get("pid")).and_then(json_u32);
        let tag = sel.and_then(|s| s.get("tag")).and_then(Value::as_str);
        let Some(p) = sb.find(pid, tag) else {
            return stream_failure("not_found", "process not found");
        };
        match p.subscribe() {
            Ok(rx) => (p, Some(rx), None),
            Err(end) => (p, None, Some(end)),
        }
    };
    let (tx, rx) = mpsc::channel(16);
    let call = StreamCall {
        shared,
        sb,
        proc,
        tx,
        keepalive,
        deadline: if method == "Start" { deadline } else { None },
    };
    tokio::spawn(call.run(events, ended));
    stream_response(rx)
}

struct StreamCall {
    shared: Arc<Shared>,
    sb: Arc<Sandbox>,
    proc: Arc<Proc>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    keepalive: Duration,
    deadline: Option<Instant>,
}

/// Why a stream stopped early.
enum Stop {
    /// The client went away.
    ClientGone,
    /// Cut on purpose: the connection dies without an end-of-stream frame.
    Cut,
}

impl StreamCall {
    async fn send(&self, event: Value) -> Result<(), Stop> {
        let frame = envelope::encode(0, json!({"event": event}).to_string().as_bytes());
        self.tx
            .send(Ok(Bytes::from(frame)))
            .await
            .map_err(|_| Stop::ClientGone)
    }

    async fn finish(&self, error: Option<(&str, &str)>) {
        let _ = self
            .tx
            .send(Ok(Bytes::from(envelope::end_stream(error))))
            .await;
    }

    /// Abort the body: the client sees the connection break mid-stream.
    async fn cut(&self) {
        // hyper drops frames still buffered when a body fails; give the ones
        // already sent time to reach the socket, so the cut lands mid-output.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = self
            .tx
            .send(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "stream cut by the stand-in",
            )))
            .await;
    }

    async fn run(self, events: Option<mpsc::Receiver<ProcEvent>>, ended: Option<EndInfo>) {
        match self.pump(events, ended).await {
            Ok(()) | Err(Stop::ClientGone) => {}
            Err(Stop::Cut) => self.cut().await,
        }
    }

    async fn pump(
        &self,
        events: Option<mpsc::Receiver<ProcEvent>>,
        ended: Option<EndInfo>,
    ) -> Result<(), Stop> {
        self.send(json!({"start": {"pid": self.proc.pid}})).await?;
        let Some(mut events) = events else {
            if let Some(end) = ended {
                self.send(end_json(&end)).await?;
            }
            self.finish(None).await;
            return Ok(());
        };
        let mut killed = self.sb.killed.subscribe();
        let mut deadline_hit = false;
        loop {
            let wait_deadline = async {
                match self.deadline {
                    Some(d) if !deadline_hit => {
                        tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await
                    }
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ProcEvent::Stdout(d)) => self.data("stdout", &d).await?,
                    Some(ProcEvent::Stderr(d)) => self.data("stderr", &d).await?,
                    Some(ProcEvent::Pty(d)) => self.data("pty", &d).await?,
                    Some(ProcEvent::End(end)) => {
                        self.send(end_json(&end)).await?;
                        self.finish(None).await;
                        return Ok(());
                    }
                    None => {
                        self.finish(Some(("internal", "process events ended without an exit"))).await;
                        return Ok(());
                    }
                },
                _ = wait_killed(&mut killed) => return Err(Stop::Cut),
                _ = tokio::time::sleep(self.keepalive) => self.send(json!({"keepalive": {}})).await?,
                _ = wait_deadline => {
                    deadline_hit = true;
                    self.proc.signal(libc::SIGKILL);
                    if self.shared.faults.deadline_as_error() {
                        self.finish(Some(("deadline_exceeded", "context deadline exceeded"))).await;
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn data(&self, stream: &str, d: &[u8]) -> Result<(), Stop> {
        let faults = &self.shared.faults;
        if faults.take_cut(d) {
            // Send part of the chunk, then break the connection.
            let half = &d[..d.len() / 2];
            if !half.is_empty() {
                self.send(json!({"data": {stream: B64.encode(half)}}))
                    .await?;
            }
            return Err(Stop::Cut);
        }
        if faults.take_kill(d) {
            self.send(json!({"data": {stream: B64.encode(d)}})).await?;
            self.shared.kill(&self.sb.id);
            return Err(Stop::Cut);
        }
        self.send(json!({"data": {stream: B64.encode(d)}})).await
    }
}

/// Resolves once the sandbox is killed.
async fn wait_killed(rx: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// An `end` event, zero values omitted.
fn end_json(end: &EndInfo) -> Value {
    let mut e = serde_json::Map::new();
    if end.exit_code != 0 {
        e.insert("exitCode".into(), json!(end.exit_code));
    }
    if end.exited {
        e.insert("exited".into(), json!(true));
    }
    if !end.status.is_empty() {
        e.insert("status".into(), json!(end.status));
    }
    json!({"end": e})
}

#[derive(Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    #[allow(dead_code)]
    username: Option<String>,
}

fn file_error(status: StatusCode, message: String) -> Response {
    (
        status,
        axum::Json(json!({"code": status.as_u16(), "message": message})),
    )
        .into_response()
}

/// `GET /files?path=`: the raw bytes.
pub async fn download(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
) -> Response {
    let sb = match route(&shared, &headers) {
        Ok(sb) => sb,
        Err(r) => return r,
    };
    let Some(path) = q.path.filter(|p| !p.is_empty()) else {
        return file_error(StatusCode::BAD_REQUEST, "path is required".into());
    };
    let full = sb.resolve(&path);
    if full.is_dir() {
        return file_error(
            StatusCode::BAD_REQUEST,
            format!("path '{}' is a directory", full.display()),
        );
    }
    match tokio::fs::read(&full).await {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => file_error(
            StatusCode::NOT_FOUND,
            format!("file '{}' not found", full.display()),
        ),
        Err(e) => file_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error reading file '{}': {e}", full.display()),
        ),
    }
}

/// `POST /files?path=`: multipart (part `file`) or octet-stream.
pub async fn upload(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<FileQuery>,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    let sb = match route(&shared, &headers) {
        Ok(sb) => sb,
        Err(r) => return r,
    };
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    if ctype.starts_with("multipart/form-data") {
        let mut mp = match <Multipart as axum::extract::FromRequest<()>>::from_request(req, &())
            .await
        {
            Ok(m) => m,
            Err(e) => return file_error(StatusCode::BAD_REQUEST, format!("bad multipart: {e}")),
        };
        loop {
            match mp.next_field().await {
                Ok(Some(field)) => {
                    if field.name() != Some("file") {
                        continue;
                    }
                    // Without `path`, the part's file name is the path.
                    let name = field.file_name().map(str::to_string);
                    let data = match field.bytes().await {
                        Ok(b) => b.to_vec(),
                        Err(e) => {
                            return file_error(
                                StatusCode::BAD_REQUEST,
                                format!("bad multipart: {e}"),
                            );
                        }
                    };
                    let Some(path) = q.path.clone().filter(|p| !p.is_empty()).or(name) else {
                        return file_error(StatusCode::BAD_REQUEST, "path is required".into());
                    };
                    files.push((path, data));
                }
                Ok(None) => break,
                Err(e) => {
                    return file_error(StatusCode::BAD_REQUEST, format!("bad multipart: {e}"));
                }
            }
        }
    } else if ctype.starts_with("application/octet-stream") {
        let Some(path) = q.path.clone().filter(|p| !p.is_empty()) else {
            return file_error(StatusCode::BAD_REQUEST, "path is required".into());
        };
        let bytes = match axum::body::to_bytes(req.into_body(), usize::MAX).await {
            Ok(b) => b,
            Err(e) => return file_error(StatusCode::BAD_REQUEST, format!("reading body: {e}")),
        };
        files.push((path, bytes.to_vec()));
    } else {
        return file_error(
            StatusCode::BAD_REQUEST,
            format!("unsupported content type {ctype:?}"),
        );
    }
    let mut out = Vec::new();
    for (path, data) in files {
        let full = sb.resolve(&path);
        if let Some(parent) = full.parent()
            && let Err(e) = tokio::fs::create_dir_all(parent).await
        {
            return file_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error creating directory '{}': {e}", parent.display()),
            );
        }
        if full.is_dir() {
            return file_error(
                StatusCode::BAD_REQUEST,
                format!("path '{}' is a directory", full.display()),
            );
        }
        if let Err(e) = tokio::fs::write(&full, &data).await {
            let status = if e.raw_os_error() == Some(libc::ENOSPC) {
                StatusCode::INSUFFICIENT_STORAGE
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            return file_error(
                status,
                format!("error writing file '{}': {e}", full.display()),
            );
        }
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(json!({"path": full.display().to_string(), "name": name, "type": "file"}));
    }
    axum::Json(out).into_response()
}
