//! The REST surface: discovery, and the verbs on every resource (get, list,
//! watch, create, update, patch, delete) with the subresources berth and
//! kubectl use (`status`, `exec`, `eviction`).
//!
//! One handler reads the path the way the API server lays it out:
//! `/api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUB]]` and
//! `/apis/GROUP/VERSION[/namespaces/NS]/RESOURCE[/NAME[/SUB]]`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::ws::{WebSocketUpgrade, rejection::WebSocketUpgradeRejection};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;

use super::K8s;
use super::resources::{self, Resource};
use super::select::Selector;
use super::store::{ApiError, ApiResult, Change};

/// The server's version, as `/version` reports it.
pub const VERSION: (&str, &str) = ("1", "37");

/// The query parameters the stand-in reads; repeated ones (`command`) kept
/// in order.
#[derive(Default, Debug)]
pub struct Query(pub Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Query {
        Query(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

pub fn reply(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        reply(
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &self.status(),
        )
    }
}

fn not_served() -> ApiError {
    ApiError::not_found_text("the server could not find the requested resource")
}

impl ApiError {
    fn not_found_text(message: &str) -> ApiError {
        ApiError::new(404, "NotFound", message)
    }
}

/// Where a request points.
struct Target<'a> {
    res: &'static Resource,
    ns: Option<&'a str>,
    name: Option<&'a str>,
    sub: Option<&'a str>,
}

fn target<'a>(
    group: &str,
    version: &str,
    rest: &[&'a str],
    with_crds: bool,
) -> ApiResult<Target<'a>> {
    if !resources::serves(group, version, with_crds) {
        return Err(not_served());
    }
    let (ns, plural, name, sub) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !matches!(*plural, "status" | "finalize") && tail.len() <= 2 =>
        {
            (
                Some(*ns),
                *plural,
                tail.first().copied(),
                tail.get(1).copied(),
            )
        }
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => return Err(not_served()),
    };
    let res = resources::find(group, version, plural).ok_or_else(not_served)?;
    if (res.namespaced && ns.is_none() && name.is_some()) || (!res.namespaced && ns.is_some()) {
        return Err(not_served());
    }
    if let Some(sub) = sub
        && !res.subresources.iter().any(|(s, _)| *s == sub)
    {
        return Err(not_served());
    }
    Ok(Target { res, ns, name, sub })
}

/// The one handler.
pub async fn handle(
    State(k): State<Arc<K8s>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let q = Query::parse(uri.query());
    let crds = k.with_crds;
    let doc = match segs.as_slice() {
        ["version"] => Some(json!({
            "major": VERSION.0, "minor": VERSION.1,
            "gitVersion": format!("v{}.{}.0-berth-standin", VERSION.0, VERSION.1),
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "", "compiler": "gc", "platform": "linux/amd64",
        })),
        ["healthz" | "livez" | "readyz"] => return "ok".into_response(),
        ["api"] => Some(resources::core_versions(&k.addr)),
        ["apis"] => Some(resources::group_list(crds)),
        ["api", "v1"] => Some(resources::resource_list("", "v1")),
        ["apis", g] => resources::group(g, crds),
        ["apis", g, v] if resources::serves(g, v, crds) => Some(resources::resource_list(g, v)),
        ["openapi", "v3"] => Some(resources::openapi_root(crds)),
        ["openapi", "v3", "api", "v1"] => Some(resources::openapi_group_version("", "v1")),
        ["openapi", "v3", "apis", g, v] if resources::serves(g, v, crds) => {
            Some(resources::openapi_group_version(g, v))
        }
        _ => None,
    };
    if let Some(doc) = doc {
        return reply(StatusCode::OK, &doc);
    }
    let t = match segs.as_slice() {
        ["api", "v1", rest @ ..] => target("", "v1", rest, crds),
        ["apis", g, v, rest @ ..] => target(g, v, rest, crds),
        _ => Err(not_served()),
    };
    let t = match t {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    match call(&k, t, &method, &q, &headers, body, ws).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn parse_body(body: &Bytes) -> ApiResult<Value> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the body is not JSON the stand-in can read: {e}"))
    })
}

async fn call(
    k: &Arc<K8s>,
    t: Target<'_>,
    method: &Method,
    q: &Query,
    headers: &HeaderMap,
    body: Bytes,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let ns = t.ns.unwrap_or("");
    let res = t.res;
    match (method.as_str(), t.name, t.sub) {
        ("GET", None, None) => {
            let sel = Selector::parse(q.get("labelSelector"), q.get("fieldSelector"))?;
            if q.flag("watch") {
                // A streaming list (`sendInitialEvents`) starts with every
                // object, as a watch from no version does, and marks the
                // end of them with a bookmark.
                let initial = q.flag("sendInitialEvents");
                let since = match q.get("resourceVersion") {
                    _ if initial => None,
                    None | Some("" | "0") => None,
                    Some(v) => Some(v.parse().map_err(|_| {
                        ApiError::bad_request(format!("resourceVersion {v:?} is not a number"))
                    })?),
                };
                let timeout = q
                    .get("timeoutSeconds")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1800);
                return watch(
                    k,
                    res,
                    t.ns,
                    sel,
                    since,
                    initial,
                    Duration::from_secs(timeout),
                );
            }
            let (items, rv) = k.store.list(res, t.ns);
            let items: Vec<Value> = items.into_iter().filter(|o| sel.matches(o)).collect();
            if wants_table(headers) {
                return Ok(reply(StatusCode::OK, &table(res, &items, rv, q)));
            }
            Ok(reply(
                StatusCode::OK,
                &json!({
                    "kind": res.list_kind(),
                    "apiVersion": res.api_version(),
                    "metadata": {"resourceVersion": rv.to_string()},
                    "items": items,
                }),
            ))
        }
        ("GET", Some(name), None) => {
            let obj = k.store.get(res, ns, name)?;
            if wants_table(headers) {
                return Ok(reply(
                    StatusCode::OK,
                    &table(res, &[obj], k.store.version(), q),
                ));
            }
            Ok(reply(StatusCode::OK, &obj))
        }
        ("GET", Some(name), Some("status")) => {
            Ok(reply(StatusCode::OK, &k.store.get(res, ns, name)?))
        }
        ("GET" | "POST", Some(name), Some("exec")) => {
            let ws = ws.map_err(|e| {
                ApiError::bad_request(format!(
                    "exec needs a WebSocket upgrade (v5.channel.k8s.io or v4.channel.k8s.io); SPDY is not served by the stand-in: {e}"
                ))
            })?;
            super::exec::start(k, ns, name, q, ws).await
        }
        ("POST", Some(name), Some("eviction")) => {
            k.evict(ns, name).await?;
            Ok(reply(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        ("POST", None, None) => {
            let mut obj = parse_body(&body)?;
            let kind = obj["kind"].as_str().unwrap_or(res.kind);
            if kind != res.kind {
                return Err(ApiError::bad_request(format!(
                    "the body is a {kind}, not a {}",
                    res.kind
                )));
            }
            if let Some(body_ns) = obj["metadata"]["namespace"].as_str()
                && res.namespaced
                && body_ns != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            k.admit(res, ns, &mut obj)?;
            if q.get("dryRun").is_some() {
                return Ok(reply(StatusCode::CREATED, &obj));
            }
            let made = k.store.create(res, ns, obj)?;
            k.created(res, ns, &made);
            Ok(reply(StatusCode::CREATED, &made))
        }
        ("PUT", Some(name), sub) => {
            let new = parse_body(&body)?;
            let obj = if sub == Some("status") {
                k.store.update(res, ns, name, |o| {
                    o["status"] = new["status"].clone();
                    Ok(())
                })?
            } else {
                k.store.replace(res, ns, name, new)?
            };
            k.changed(res, ns, &obj);
            Ok(reply(StatusCode::OK, &obj))
        }
        ("PATCH", Some(name), sub) => {
            let patch = parse_body(&body)?;
            let ctype = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let json_patch = ctype.starts_with("application/json-patch+json");
            if !json_patch
                && !ctype.starts_with("application/merge-patch+json")
                && !ctype.starts_with("application/strategic-merge-patch+json")
            {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the stand-in takes merge, strategic-merge and JSON patches, not {ctype:?} (server-side apply is not served)"
                    ),
                ));
            }
            let status_only = sub == Some("status");
            let obj = k.store.update(res, ns, name, |o| {
                let before_status = o.get("status").cloned();
                if json_patch {
                    apply_json_patch(o, &patch)?;
                } else {
                    merge_patch(o, &patch);
                }
                if !status_only && let Some(s) = before_status {
                    o["status"] = s;
                }
                Ok(())
            })?;
            k.changed(res, ns, &obj);
            Ok(reply(StatusCode::OK, &obj))
        }
        ("DELETE", Some(name), None) => {
            // `propagationPolicy: Orphan`, in the DeleteOptions body or the
            // query: what the object owns stays, without its owner
            // reference, as the garbage collector does it.
            let body_says = !body.is_empty()
                && parse_body(&body).is_ok_and(|o| o["propagationPolicy"] == "Orphan");
            if body_says || q.get("propagationPolicy") == Some("Orphan") {
                k.orphan_dependents(res, ns, name)?;
            }
            let obj = k.delete(res, ns, name).await?;
            Ok(reply(StatusCode::OK, &obj))
        }
        ("DELETE", None, None) => {
            let sel = Selector::parse(q.get("labelSelector"), q.get("fieldSelector"))?;
            let (items, _) = k.store.list(res, t.ns);
            let mut gone = Vec::new();
            for o in items.iter().filter(|o| sel.matches(o)) {
                let name = o["metadata"]["name"].as_str().unwrap_or("");
                let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
                if let Ok(o) = k.delete(res, ns, name).await {
                    gone.push(o);
                }
            }
            Ok(reply(
                StatusCode::OK,
                &json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {}, "items": gone}),
            ))
        }
        (m, _, _) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({m})"),
        )),
    }
}

/// RFC 7386: objects merge, `null` removes, anything else replaces. A
/// strategic merge patch is read the same way (lists are replaced whole),
/// which is what the stand-in's callers send (cordon, labels, annotations).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if k.starts_with("$") {
                continue;
            }
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// RFC 6902's `add`, `replace`, `remove` and `test`.
fn apply_json_patch(target: &mut Value, ops: &Value) -> ApiResult<()> {
    let ops = ops
        .as_array()
        .ok_or_else(|| ApiError::bad_request("a JSON patch is a list of operations"))?;
    for op in ops {
        let path = op["path"].as_str().unwrap_or("");
        let parts: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .collect();
        let Some((last, parents)) = parts.split_last() else {
            return Err(ApiError::bad_request(format!(
                "bad JSON patch path {path:?}"
            )));
        };
        let mut at = &mut *target;
        for p in parents {
            at = match at {
                Value::Object(m) => m.get_mut(p),
                Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                _ => None,
            }
            .ok_or_else(|| {
                ApiError::invalid(format!("the JSON patch path {path:?} does not exist"))
            })?;
        }
        let value = op["value"].clone();
        let missing = || ApiError::invalid(format!("the JSON patch path {path:?} does not exist"));
        match (op["op"].as_str(), at) {
            (Some("add" | "replace"), Value::Object(m)) => {
                m.insert(last.clone(), value);
            }
            (Some("add"), Value::Array(a)) if last == "-" => a.push(value),
            (Some("add"), Value::Array(a)) => {
                let i: usize = last.parse().map_err(|_| missing())?;
                if i > a.len() {
                    return Err(missing());
                }
                a.insert(i, value);
            }
            (Some("replace"), Value::Array(a)) => {
                let slot = last
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| a.get_mut(i))
                    .ok_or_else(missing)?;
                *slot = value;
            }
            (Some("remove"), Value::Object(m)) => {
                m.remove(last).ok_or_else(missing)?;
            }
            (Some("remove"), Value::Array(a)) => {
                let i: usize = last.parse().map_err(|_| missing())?;
                if i >= a.len() {
                    return Err(missing());
                }
                a.remove(i);
            }
            (Some("test"), at) => {
                let got = match at {
                    Value::Object(m) => m.get(last),
                    Value::Array(a) => last.parse::<usize>().ok().and_then(|i| a.get(i)),
                    _ => None,
                };
                if got != Some(&value) {
                    return Err(ApiError::invalid(format!(
                        "the JSON patch test at {path:?} failed"
                    )));
                }
            }
            (op, _) => {
                return Err(ApiError::bad_request(format!(
                    "the stand-in does not take JSON patch op {op:?} at {path:?}"
                )));
            }
        }
    }
    Ok(())
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// How long ago, as kubectl prints it.
fn age(created: &str) -> String {
    let Some(then) = crate::k8s::parse_rfc3339(created) else {
        return "<unknown>".into();
    };
    let s = (crate::e2b::sandbox::now_unix() - then).max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The server-side printing kubectl asks for (`as=Table`).
fn table(res: &Resource, items: &[Value], rv: u64, q: &Query) -> Value {
    let col = |name: &str, ty: &str, priority: u8| json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": priority});
    let pods = res.kind == "Pod";
    let nodes = res.kind == "Node";
    let columns = if nodes {
        vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Roles", "string", 0),
            col("Age", "string", 0),
            col("Version", "string", 0),
        ]
    } else if pods {
        vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "string", 0),
            col("Age", "string", 0),
            col("IP", "string", 1),
            col("Node", "string", 1),
        ]
    } else {
        vec![col("Name", "string", 0), col("Age", "string", 0)]
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let m = &o["metadata"];
            let name = m["name"].as_str().unwrap_or("");
            let created = age(m["creationTimestamp"].as_str().unwrap_or(""));
            let cells = if nodes {
                let mut status = if super::kubelet::node_ready(o) { "Ready" } else { "NotReady" }.to_string();
                if o["spec"]["unschedulable"] == json!(true) {
                    status.push_str(",SchedulingDisabled");
                }
                json!([name, status, "<none>", created, o["status"]["nodeInfo"]["kubeletVersion"]])
            } else if pods {
                let statuses = o["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
                let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
                let ready = statuses.iter().filter(|s| s["ready"] == json!(true)).count();
                let restarts: i64 = statuses.iter().map(|s| s["restartCount"].as_i64().unwrap_or(0)).sum();
                let waiting = statuses
                    .iter()
                    .find_map(|s| s["state"]["waiting"]["reason"].as_str());
                let phase = waiting
                    .or_else(|| o["status"]["phase"].as_str())
                    .unwrap_or("Pending");
                json!([
                    name,
                    format!("{ready}/{total}"),
                    phase,
                    restarts.to_string(),
                    created,
                    o["status"]["podIP"].as_str().unwrap_or("<none>"),
                    o["spec"]["nodeName"].as_str().unwrap_or("<none>"),
                ])
            } else {
                json!([name, created])
            };
            let object = if q.get("includeObject") == Some("Object") {
                o.clone()
            } else {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": m})
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// A watch: one JSON event per line, as long as the client reads and the
/// timeout allows. A client too slow for the log is cut off and re-lists,
/// as client-go does after any ended watch.
fn watch(
    k: &Arc<K8s>,
    res: &'static Resource,
    ns: Option<&str>,
    sel: Selector,
    since: Option<u64>,
    initial_end: bool,
    timeout: Duration,
) -> ApiResult<Response> {
    let sub = k.store.subscribe(res, ns, since)?;
    let ns = ns.map(str::to_string);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let keep = move |c: &Change| {
        c.resource == res.id
            && ns
                .as_deref()
                .is_none_or(|n| !res.namespaced || c.namespace == n)
            && sel.matches(&c.object)
    };
    let line = |c: &Change| {
        let mut s = json!({"type": c.kind, "object": c.object}).to_string();
        s.push('\n');
        Ok(Bytes::from(s))
    };
    tokio::spawn(async move {
        let mut live = sub.live;
        let mut last = since.unwrap_or(0);
        for c in sub.backlog.iter().filter(|c| keep(c)) {
            last = last.max(c.rv);
            if tx.send(line(c)).await.is_err() {
                return;
            }
        }
        if initial_end {
            let mark = Change {
                rv: sub.version,
                resource: res.id,
                namespace: String::new(),
                kind: "BOOKMARK",
                object: json!({
                    "kind": res.kind,
                    "apiVersion": res.api_version(),
                    "metadata": {
                        "resourceVersion": sub.version.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }),
            };
            last = last.max(sub.version);
            if tx.send(line(&mark)).await.is_err() {
                return;
            }
        }
        let end = tokio::time::Instant::now() + timeout;
        loop {
            let c = tokio::select! {
                c = live.recv() => c,
                () = tokio::time::sleep_until(end) => return,
                () = tx.closed() => return,
            };
            match c {
                Ok(c) if c.rv > last && keep(&c) => {
                    last = c.rv;
                    if tx.send(line(&c)).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response())
}
