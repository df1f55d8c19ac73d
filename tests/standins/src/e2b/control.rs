//! The control plane: `/sandboxes` and `/v2/sandboxes`, per `spec/openapi.yml`.
//!
//! Every call first passes the fault switchboard, then the `X-API-Key` check.
//! Errors are `{code, message}` with the HTTP status as `code`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::sandbox::{Sandbox, State as SbState, lock, now_unix};
use super::{ENVD_VERSION, Shared, random_hex, rfc3339};

/// The default sandbox timeout, seconds (the spec's default).
const DEFAULT_TIMEOUT: u64 = 15;
/// The longest timeout the stand-in grants (a Pro team's 24 h).
const MAX_TIMEOUT: u64 = 86_400;

/// An API error answer.
pub fn api_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

/// Faults first, then the key.
fn gate(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    if let Some(code) = shared.faults.take_api_fault() {
        let msg = match code {
            StatusCode::UNAUTHORIZED => "Invalid API key",
            StatusCode::TOO_MANY_REQUESTS => "Rate limit exceeded, please try again later",
            _ => "Service temporarily unavailable",
        };
        return Some(api_error(code, msg));
    }
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    match key {
        Some(k) if k == shared.api_key => None,
        Some(_) => Some(api_error(
            StatusCode::UNAUTHORIZED,
            "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.",
        )),
        None => Some(api_error(
            StatusCode::UNAUTHORIZED,
            "Missing API key, please provide it in the X-API-Key header.",
        )),
    }
}

/// The gate, then the body: the prologue of every call that takes one.
fn gated<T: for<'de> Deserialize<'de> + Default>(
    shared: &Shared,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, Response> {
    match gate(shared, headers) {
        Some(r) => Err(r),
        None => parse_body(body),
    }
}

fn parse_body<T: for<'de> Deserialize<'de> + Default>(body: &Bytes) -> Result<T, Response> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        api_error(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkBody>,
}

/// The egress part of `network` (create) or the body of `PUT
/// /sandboxes/{id}/network`: `allowOut` (names, `*.domain`, addresses,
/// CIDR blocks) wins over `denyOut` (addresses and CIDR blocks only).
#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct NetworkBody {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

impl NetworkBody {
    /// Check it as E2B does; the stored form.
    fn checked(&self) -> Result<Value, Response> {
        let is_net = |t: &str| {
            let (addr, bits) = t.split_once('/').unwrap_or((t, "32"));
            addr.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 128)
        };
        for d in self.deny_out.iter().flatten() {
            if !is_net(d) {
                return Err(api_error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "invalid denyOut entry `{d}`: domain names are not supported for deny rules"
                    ),
                ));
            }
        }
        for a in self.allow_out.iter().flatten() {
            let name_ok = a
                .trim_start_matches("*.")
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
            if a == "*" || !(is_net(a) || name_ok) {
                return Err(api_error(
                    StatusCode::BAD_REQUEST,
                    format!("invalid allowOut entry `{a}`"),
                ));
            }
        }
        Ok(json!({
            "allowOut": self.allow_out.clone().unwrap_or_default(),
            "denyOut": self.deny_out.clone().unwrap_or_default(),
        }))
    }
}

fn sandbox_json(sb: &Sandbox) -> Value {
    json!({
        "templateID": sb.template_id,
        "sandboxID": sb.id,
        "clientID": "standin",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.access_token,
        "domain": null,
    })
}

fn detail_json(sb: &Sandbox) -> Value {
    let state = match *lock(&sb.state) {
        SbState::Running => "running",
        SbState::Paused => "paused",
    };
    json!({
        "templateID": sb.template_id,
        "sandboxID": sb.id,
        "clientID": "standin",
        "startedAt": rfc3339(sb.started_unix),
        "endAt": rfc3339(*lock(&sb.end_unix)),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.access_token,
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": state,
        "metadata": sb.metadata,
        "domain": null,
        "allowInternetAccess": *lock(&sb.allow_internet_access),
        "network": lock(&sb.network).clone(),
    })
}

/// `POST /sandboxes` and `POST /v2/sandboxes`.
pub async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: NewSandbox = match gated(&shared, &headers, &body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(template) = req.template_id.filter(|t| !t.is_empty()) else {
        return api_error(StatusCode::BAD_REQUEST, "templateID is required");
    };
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT);
    if timeout > MAX_TIMEOUT {
        return api_error(
            StatusCode::BAD_REQUEST,
            format!("timeout cannot be greater than {MAX_TIMEOUT} seconds"),
        );
    }
    let network = match req.network.as_ref().map(NetworkBody::checked).transpose() {
        Ok(n) => n,
        Err(r) => return r,
    };
    let dir = match tempfile::Builder::new().prefix("e2b-standin-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            return api_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot make the sandbox: {e}"),
            );
        }
    };
    let id = random_id();
    let sb = Arc::new(Sandbox {
        id: id.clone(),
        template_id: template,
        metadata: req.metadata.unwrap_or_default(),
        env_vars: req.env_vars.unwrap_or_default(),
        access_token: format!("ea_{}", random_hex(16)),
        started_unix: now_unix(),
        end_at: Mutex::new(Instant::now()),
        end_unix: Mutex::new(0),
        state: Mutex::new(SbState::Running),
        dir,
        procs: Mutex::new(HashMap::new()),
        killed: tokio::sync::watch::channel(false).0,
        allow_internet_access: Mutex::new(req.allow_internet_access.unwrap_or(true)),
        network: Mutex::new(network),
    });
    sb.set_timeout(timeout);
    lock(&shared.sandboxes).insert(id, sb.clone());
    (StatusCode::CREATED, axum::Json(sandbox_json(&sb))).into_response()
}

/// Sandbox ids look like E2B's: 20 lowercase letters and digits.
fn random_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..20)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The start of every handler on one sandbox: the key check (and any planted
/// fault), the JSON body, then the sandbox itself.
fn sandbox_call<T: for<'de> Deserialize<'de> + Default>(
    shared: &Shared,
    headers: &HeaderMap,
    id: &str,
    body: &Bytes,
) -> Result<(T, Arc<Sandbox>), Response> {
    if let Some(r) = gate(shared, headers) {
        return Err(r);
    }
    let req = parse_body(body)?;
    let sb = shared.get(id).ok_or_else(|| not_found(id))?;
    Ok((req, sb))
}

fn not_found(id: &str) -> Response {
    api_error(
        StatusCode::NOT_FOUND,
        format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

/// `GET /sandboxes/{id}`.
pub async fn get_one(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(r) = gate(&shared, &headers) {
        return r;
    }
    match shared.get(&id) {
        Some(sb) => axum::Json(detail_json(&sb)).into_response(),
        None => not_found(&id),
    }
}

/// `DELETE /sandboxes/{id}`.
pub async fn kill(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(r) = gate(&shared, &headers) {
        return r;
    }
    if shared.kill(&id) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        not_found(&id)
    }
}

/// `PUT /sandboxes/{id}/network`: the running sandbox's egress filter,
/// replaced.
pub async fn set_network(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let req: NetworkBody = match gated(&shared, &headers, &body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let checked = match req.checked() {
        Ok(c) => c,
        Err(r) => return r,
    };
    match shared.get(&id) {
        Some(sb) => {
            *lock(&sb.network) = Some(checked);
            if let Some(open) = req.allow_internet_access {
                *lock(&sb.allow_internet_access) = open;
            }
            StatusCode::NO_CONTENT.into_response()
        }
        None => not_found(&id),
    }
}

#[derive(Deserialize, Default)]
pub struct TimeoutBody {
    timeout: Option<u64>,
    duration: Option<u64>,
}

/// `POST /sandboxes/{id}/timeout`: killed `timeout` seconds from now.
pub async fn set_timeout(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let req: TimeoutBody = match gated(&shared, &headers, &body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(t) = req.timeout else {
        return api_error(StatusCode::BAD_REQUEST, "timeout is required");
    };
    if t > MAX_TIMEOUT {
        return api_error(
            StatusCode::BAD_REQUEST,
            format!("timeout cannot be greater than {MAX_TIMEOUT} seconds"),
        );
    }
    match shared.get(&id) {
        Some(sb) => {
            sb.set_timeout(t);
            StatusCode::NO_CONTENT.into_response()
        }
        None => not_found(&id),
    }
}

/// `POST /sandboxes/{id}/refreshes`: extend by `duration` seconds from now.
pub async fn refresh(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (req, sb) = match sandbox_call::<TimeoutBody>(&shared, &headers, &id, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    sb.set_timeout(req.duration.unwrap_or(DEFAULT_TIMEOUT).min(3600));
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /sandboxes/{id}/pause`.
pub async fn pause(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(r) = gate(&shared, &headers) {
        return r;
    }
    let Some(sb) = shared.get(&id) else {
        return not_found(&id);
    };
    let mut st = lock(&sb.state);
    if *st == SbState::Paused {
        return api_error(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already paused"),
        );
    }
    *st = SbState::Paused;
    drop(st);
    sb.freeze(true);
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /sandboxes/{id}/resume` (deprecated): 201, or 409 when running.
pub async fn resume(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (req, sb) = match sandbox_call::<TimeoutBody>(&shared, &headers, &id, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if *lock(&sb.state) == SbState::Running {
        return api_error(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already running"),
        );
    }
    wake(&sb, req.timeout);
    (StatusCode::CREATED, axum::Json(sandbox_json(&sb))).into_response()
}

/// `POST /sandboxes/{id}/connect` and `/v2/...`: 200 when it was running
/// (its timeout is only ever extended), 201 when it was resumed.
pub async fn connect(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (req, sb) = match sandbox_call::<TimeoutBody>(&shared, &headers, &id, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let paused = *lock(&sb.state) == SbState::Paused;
    if paused {
        wake(&sb, req.timeout);
        return (StatusCode::CREATED, axum::Json(sandbox_json(&sb))).into_response();
    }
    if let Some(t) = req.timeout {
        let left = lock(&sb.end_at)
            .saturating_duration_since(Instant::now())
            .as_secs();
        if t > left {
            sb.set_timeout(t.min(MAX_TIMEOUT));
        }
    }
    axum::Json(sandbox_json(&sb)).into_response()
}

fn wake(sb: &Sandbox, timeout: Option<u64>) {
    *lock(&sb.state) = SbState::Running;
    sb.freeze(false);
    sb.set_timeout(timeout.unwrap_or(DEFAULT_TIMEOUT).min(MAX_TIMEOUT));
}

/// The filters of a list call: `metadata` (itself url-encoded `k=v&…`) and
/// `state` (repeated or comma-separated).
struct ListQuery {
    metadata: Vec<(String, String)>,
    states: Vec<String>,
}

fn list_query(raw: Option<String>) -> ListQuery {
    let mut q = ListQuery {
        metadata: Vec::new(),
        states: Vec::new(),
    };
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "metadata" | "query" => q.metadata.extend(
                form_urlencoded::parse(v.as_bytes()).map(|(a, b)| (a.into_owned(), b.into_owned())),
            ),
            "state" => q
                .states
                .extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_string)),
            _ => {}
        }
    }
    q
}

fn listed(shared: &Shared, q: &ListQuery, default_states: &[&str]) -> Vec<Value> {
    let states: Vec<String> = if q.states.is_empty() {
        default_states.iter().map(|s| s.to_string()).collect()
    } else {
        q.states.clone()
    };
    let all: Vec<Arc<Sandbox>> = lock(&shared.sandboxes).values().cloned().collect();
    let mut out: Vec<(i64, Value)> = all
        .iter()
        .filter(|sb| {
            q.metadata
                .iter()
                .all(|(k, v)| sb.metadata.get(k) == Some(v))
        })
        .map(|sb| (sb.started_unix, detail_json(sb)))
        .filter(|(_, j)| {
            j.get("state")
                .and_then(Value::as_str)
                .is_some_and(|s| states.iter().any(|w| w == s))
        })
        .collect();
    out.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
    out.into_iter()
        .map(|(_, mut j)| {
            if let Some(o) = j.as_object_mut() {
                o.remove("envdAccessToken");
            }
            j
        })
        .collect()
}

/// `GET /sandboxes` (deprecated): running sandboxes only.
pub async fn list_v1(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Some(r) = gate(&shared, &headers) {
        return r;
    }
    axum::Json(listed(&shared, &list_query(raw), &["running"])).into_response()
}

/// `GET /v2/sandboxes`: one page holds everything, so no `X-Next-Token`.
pub async fn list_v2(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Some(r) = gate(&shared, &headers) {
        return r;
    }
    axum::Json(listed(&shared, &list_query(raw), &["running", "paused"])).into_response()
}
