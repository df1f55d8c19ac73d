//! A scripted model provider: OpenAI Chat Completions and Anthropic Messages,
//! streaming (SSE over chunked HTTP/1.1) and not.
//!
//! Flow at a glance: [`ProviderStandin::start`] binds a loopback port and
//! serves `POST …/chat/completions` and `POST …/messages` from a thread of its
//! own. Each request is recorded (path, headers, JSON body), then answered
//! with the next [`Reply`] of the script, in the wire format of the path and
//! streamed when the body says `"stream": true`. Streamed tool-call arguments
//! are split into pieces of a few bytes, so a client must assemble them. A
//! [`Reply::Cut`] stops a stream half way and drops the connection; a
//! [`Reply::Status`] answers with an HTTP error (with `Retry-After`). An
//! exhausted script answers 500 and says so.
//!
//! A context window ([`ProviderStandin::set_window`]) makes it count each
//! request's tokens by a simple estimate, [`tokens`]: the request body's
//! bytes divided by 4, rounded up. A request over the window is refused the
//! way the real APIs refuse it (OpenAI's 400 `context_length_exceeded`,
//! Anthropic's 400 `prompt is too long`) without using up the script, and
//! the reported usage is that count. The window can be advertised as vLLM
//! does (`GET /v1/models`, `max_model_len`) or as llama.cpp does (`GET
//! /props`, `n_ctx`); those requests are kept apart ([`ProviderStandin::probes`]).
//! A request with tools off (the summary call of a compaction) can be given
//! a reply of its own ([`ProviderStandin::on_tools_off`]).
//!
//! Conversations that run at once (sub-agents) each get a script of their
//! own ([`ProviderStandin::route`]): a request whose first user message (the
//! task) contains a route's marker is answered from that route's replies.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One tool call of a scripted reply.
#[derive(Clone, Debug)]
pub struct Call {
    /// Its id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments exactly as sent (may be broken JSON on purpose).
    pub args: String,
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Text and tool calls; `stop` is the finish reason in OpenAI's words
    /// (`stop`, `tool_calls`, `length`), mapped for Anthropic.
    Turn {
        /// Text before the calls.
        text: String,
        /// The calls.
        calls: Vec<Call>,
        /// Why it stopped.
        stop: String,
    },
    /// An HTTP error.
    Status {
        /// The status code.
        code: u16,
        /// `Retry-After` seconds.
        retry_after: Option<u32>,
    },
    /// Stream half of this reply, then drop the connection.
    Cut(Box<Reply>),
    /// A 400 with this JSON body.
    Refuse(Value),
    /// Wait this long, then give the reply.
    Slow(std::time::Duration, Box<Reply>),
}

impl Reply {
    /// A final answer.
    pub fn text(t: &str) -> Reply {
        Reply::Turn {
            text: t.into(),
            calls: vec![],
            stop: "stop".into(),
        }
    }

    /// One tool call with these raw arguments.
    pub fn call(id: &str, name: &str, args: &str) -> Reply {
        Reply::calls(&[(id, name, args)])
    }

    /// Several tool calls in one turn.
    pub fn calls(calls: &[(&str, &str, &str)]) -> Reply {
        Reply::Turn {
            text: String::new(),
            calls: calls
                .iter()
                .map(|(id, name, args)| Call {
                    id: (*id).into(),
                    name: (*name).into(),
                    args: (*args).into(),
                })
                .collect(),
            stop: "tool_calls".into(),
        }
    }

    /// A turn cut by the output limit, its last call's arguments unfinished.
    pub fn truncated(id: &str, name: &str, partial_args: &str) -> Reply {
        Reply::Turn {
            text: String::new(),
            calls: vec![Call {
                id: id.into(),
                name: name.into(),
                args: partial_args.into(),
            }],
            stop: "length".into(),
        }
    }
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The request path.
    pub path: String,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
    /// The raw body bytes.
    pub raw: Vec<u8>,
    /// The body as JSON (`Null` if it was not JSON).
    pub body: Value,
    /// Its tokens by the stand-in's estimate ([`tokens`]).
    pub tokens: u64,
}

/// The stand-in's token count of a request body: its bytes over 4, rounded up.
pub fn tokens(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}

/// How the stand-in tells its window, if it does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Advertise {
    /// It does not (`GET` answers 404).
    #[default]
    Nothing,
    /// vLLM: `GET /v1/models` lists the model with `max_model_len`.
    Models,
    /// llama.cpp: `GET /props` gives `default_generation_settings.n_ctx`.
    Props,
}

impl Recorded {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct State {
    script: VecDeque<Reply>,
    seen: Vec<Recorded>,
    probes: Vec<String>,
    window: Option<u64>,
    advertise: Advertise,
    usage: bool,
    tools_off: Option<Reply>,
    routes: Vec<(String, VecDeque<Reply>)>,
}

/// The running stand-in; stopped when dropped.
pub struct ProviderStandin {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Bytes per streamed piece of text or arguments.
const PIECE: usize = 3;
/// Usage every reply reports.
const USAGE_IN: u64 = 120;
const USAGE_CACHED: u64 = 100;
const USAGE_OUT: u64 = 15;

impl ProviderStandin {
    /// Start serving `script` on a loopback port.
    pub fn start(script: Vec<Reply>) -> std::io::Result<ProviderStandin> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            seen: vec![],
            probes: vec![],
            window: None,
            advertise: Advertise::Nothing,
            usage: true,
            tools_off: None,
            routes: vec![],
        }));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(std_listener) else {
                    return;
                };
                loop {
                    tokio::select! {
                        _ = &mut rx => break,
                        acc = listener.accept() => {
                            if let Ok((sock, _)) = acc {
                                tokio::spawn(serve(sock, st.clone()));
                            }
                        }
                    }
                }
            });
        });
        Ok(ProviderStandin {
            addr,
            state,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// The API root to configure as a base URL (`http://127.0.0.1:PORT/v1`).
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state
            .lock()
            .map(|s| s.seen.clone())
            .unwrap_or_default()
    }

    /// Add replies to the end of the script.
    pub fn push(&self, replies: Vec<Reply>) {
        if let Ok(mut s) = self.state.lock() {
            s.script.extend(replies);
        }
    }

    /// Refuse requests over `window` tokens, report usage as counted, and
    /// advertise the window as `how` says.
    pub fn set_window(&self, window: u64, how: Advertise) {
        if let Ok(mut s) = self.state.lock() {
            s.window = Some(window);
            s.advertise = how;
        }
    }

    /// Report token usage (on by default) or, like some servers, never.
    pub fn set_usage(&self, report: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.usage = report;
        }
    }

    /// Answer the conversation whose task contains `marker` from `replies`,
    /// apart from the main script.
    pub fn route(&self, marker: &str, replies: Vec<Reply>) {
        if let Ok(mut s) = self.state.lock() {
            s.routes.push((marker.into(), replies.into()));
        }
    }

    /// Answer every request with tools off with `reply`, leaving the script alone.
    pub fn on_tools_off(&self, reply: Reply) {
        if let Ok(mut s) = self.state.lock() {
            s.tools_off = Some(reply);
        }
    }

    /// The paths of the `GET` requests (window probes), in order.
    pub fn probes(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.probes.clone())
            .unwrap_or_default()
    }

    /// Replies not yet given.
    pub fn remaining(&self) -> usize {
        self.state.lock().map(|s| s.script.len()).unwrap_or(0)
    }
}

impl Drop for ProviderStandin {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The text of a request's first user message, in either wire format.
fn first_user_text(body: &Value) -> String {
    let Some(m) = body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &m["content"] {
        Value::String(t) => t.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

async fn serve(mut sock: TcpStream, state: Arc<Mutex<State>>) {
    let Some(req) = read_request(&mut sock).await else {
        return;
    };
    if req.method == "GET" {
        let _ = probe(&mut sock, &state, &req).await;
        return;
    }
    let req = req.recorded;
    let anthropic = req.path.ends_with("/messages");
    let tools_off = req.body["tool_choice"] == "none" || req.body["tool_choice"]["type"] == "none";
    let (reply, usage) = match state.lock() {
        Ok(mut s) => {
            s.seen.push(req.clone());
            let usage = match (s.usage, s.window) {
                (false, _) => Usage::None,
                (true, Some(_)) => Usage::Counted(req.tokens),
                (true, None) => Usage::Fixed,
            };
            match s.window {
                Some(w) if req.tokens > w => (Some(too_long(anthropic, w, req.tokens)), usage),
                _ if tools_off && s.tools_off.is_some() => (s.tools_off.clone(), usage),
                _ => {
                    let task = first_user_text(&req.body);
                    match s.routes.iter_mut().find(|(m, _)| task.contains(m.as_str())) {
                        Some((_, replies)) => (replies.pop_front(), usage),
                        None => (s.script.pop_front(), usage),
                    }
                }
            }
        }
        Err(_) => (None, Usage::Fixed),
    };
    let stream = req.body["stream"] == Value::Bool(true);
    let model = req.body["model"].as_str().unwrap_or("standin").to_string();
    let mut reply = reply;
    while let Some(Reply::Slow(wait, inner)) = reply {
        tokio::time::sleep(wait).await;
        reply = Some(*inner);
    }
    let _ = match reply {
        None => {
            respond(
                &mut sock,
                500,
                &[],
                &json!({ "error": { "message": "provider stand-in: the script is exhausted" } }),
            )
            .await
        }
        Some(Reply::Status { code, retry_after }) => {
            let extra: Vec<(String, String)> = retry_after
                .map(|s| vec![("retry-after".to_string(), s.to_string())])
                .unwrap_or_default();
            respond(
                &mut sock,
                code,
                &extra,
                &json!({ "error": { "type": "rate_limit_error", "message": format!("stand-in status {code}") } }),
            )
            .await
        }
        Some(Reply::Refuse(body)) => respond(&mut sock, 400, &[], &body).await,
        Some(Reply::Cut(inner)) => {
            let events = if anthropic {
                anthropic_events(&inner, &model, usage)
            } else {
                openai_events(&inner, &model, usage)
            };
            let half = events.len() / 2;
            stream_events(&mut sock, &events[..half.max(1)], false).await
        }
        Some(turn) if stream => {
            let events = if anthropic {
                anthropic_events(&turn, &model, usage)
            } else {
                openai_events(&turn, &model, usage)
            };
            stream_events(&mut sock, &events, true).await
        }
        Some(turn) => {
            let body = if anthropic {
                anthropic_whole(&turn, &model, usage)
            } else {
                openai_whole(&turn, &model, usage)
            };
            respond(&mut sock, 200, &[], &body).await
        }
    };
}

/// What a reply reports as usage.
#[derive(Clone, Copy)]
enum Usage {
    /// The fixed counts (no window set).
    Fixed,
    /// The request's counted tokens.
    Counted(u64),
    /// Nothing at all.
    None,
}

/// The real APIs' refusal of a request over the window.
fn too_long(anthropic: bool, window: u64, tokens: u64) -> Reply {
    Reply::Refuse(if anthropic {
        json!({ "type": "error", "error": { "type": "invalid_request_error",
            "message": format!("prompt is too long: {tokens} tokens > {window} maximum") } })
    } else {
        json!({ "error": {
            "message": format!("This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded" } })
    })
}

/// Answer a `GET`: the window, where the stand-in advertises it.
async fn probe(
    sock: &mut TcpStream,
    state: &Arc<Mutex<State>>,
    req: &Request,
) -> std::io::Result<()> {
    let (window, how) = match state.lock() {
        Ok(mut s) => {
            s.probes.push(req.recorded.path.clone());
            (s.window, s.advertise)
        }
        Err(_) => (None, Advertise::Nothing),
    };
    let path = req.recorded.path.as_str();
    match (window, how) {
        (Some(w), Advertise::Models) if path.ends_with("/v1/models") => {
            let body = json!({ "object": "list", "data": [
                { "id": "served-model", "object": "model", "owned_by": "vllm", "max_model_len": w }
            ]});
            respond(sock, 200, &[], &body).await
        }
        (Some(w), Advertise::Props) if path == "/props" => {
            let body = json!({ "default_generation_settings": { "n_ctx": w }, "total_slots": 1 });
            respond(sock, 200, &[], &body).await
        }
        _ => respond(sock, 404, &[], &json!({ "error": "not found" })).await,
    }
}

/// A request and its method.
struct Request {
    method: String,
    recorded: Recorded,
}

async fn read_request(sock: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut raw = buf[head_end + 4..].to_vec();
    while raw.len() < len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Some(Request {
        method,
        recorded: Recorded {
            path,
            headers,
            tokens: tokens(&raw),
            raw,
            body,
        },
    })
}

async fn respond(
    sock: &mut TcpStream,
    code: u16,
    extra: &[(String, String)],
    body: &Value,
) -> std::io::Result<()> {
    let body = body.to_string();
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        reason(code),
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Each event is one HTTP chunk; `complete` sends the terminating chunk,
/// otherwise the connection is dropped mid-body.
async fn stream_events(
    sock: &mut TcpStream,
    events: &[String],
    complete: bool,
) -> std::io::Result<()> {
    sock.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    )
    .await?;
    for e in events {
        sock.write_all(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes())
            .await?;
        sock.flush().await?;
    }
    if complete {
        sock.write_all(b"0\r\n\r\n").await?;
        sock.shutdown().await
    } else {
        // Drop without the last chunk: the client sees a broken body.
        Ok(())
    }
}

fn pieces(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in s.chars() {
        cur.push(c);
        if cur.len() >= PIECE {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn parts(r: &Reply) -> (&str, &[Call], &str) {
    match r {
        Reply::Turn { text, calls, stop } => (text, calls, stop),
        _ => ("", &[], "stop"),
    }
}

fn openai_usage(u: Usage) -> Value {
    let (input, cached) = match u {
        Usage::Fixed => (USAGE_IN, USAGE_CACHED),
        Usage::Counted(n) => (n, 0),
        Usage::None => return Value::Null,
    };
    json!({
        "prompt_tokens": input,
        "completion_tokens": USAGE_OUT,
        "total_tokens": input + USAGE_OUT,
        "prompt_tokens_details": { "cached_tokens": cached }
    })
}

/// Anthropic's input counts: uncached input and cache reads.
fn anthropic_input(u: Usage) -> Option<(u64, u64)> {
    match u {
        Usage::Fixed => Some((USAGE_IN - USAGE_CACHED, USAGE_CACHED)),
        Usage::Counted(n) => Some((n, 0)),
        Usage::None => None,
    }
}

fn openai_events(r: &Reply, model: &str, usage: Usage) -> Vec<String> {
    let (text, calls, stop) = parts(r);
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({
                "id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }]
            })
        )
    };
    let mut out = vec![chunk(
        json!({ "role": "assistant", "content": "" }),
        Value::Null,
    )];
    for p in pieces(text) {
        out.push(chunk(json!({ "content": p }), Value::Null));
    }
    for (i, c) in calls.iter().enumerate() {
        out.push(chunk(
            json!({ "tool_calls": [{ "index": i, "id": c.id, "type": "function",
                                     "function": { "name": c.name, "arguments": "" } }] }),
            Value::Null,
        ));
        for p in pieces(&c.args) {
            out.push(chunk(
                json!({ "tool_calls": [{ "index": i, "function": { "arguments": p } }] }),
                Value::Null,
            ));
        }
    }
    out.push(chunk(json!({}), Value::String(stop.into())));
    if !matches!(usage, Usage::None) {
        out.push(format!(
            "data: {}\n\n",
            json!({ "id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": model,
                    "choices": [], "usage": openai_usage(usage) })
        ));
    }
    out.push("data: [DONE]\n\n".into());
    out
}

fn openai_whole(r: &Reply, model: &str, usage: Usage) -> Value {
    let (text, calls, stop) = parts(r);
    let mut message = json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text.into()) } });
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .map(|c| json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.args } }))
            .collect();
    }
    json!({
        "id": "chatcmpl-standin", "object": "chat.completion", "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": stop }],
        "usage": openai_usage(usage),
    })
}

fn anthropic_stop(stop: &str) -> &'static str {
    match stop {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    }
}

fn anthropic_events(r: &Reply, model: &str, usage: Usage) -> Vec<String> {
    let (text, calls, stop) = parts(r);
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let start_usage = match anthropic_input(usage) {
        Some((input, cached)) => json!({ "input_tokens": input, "cache_read_input_tokens": cached,
                       "cache_creation_input_tokens": 0, "output_tokens": 1 }),
        None => json!({}),
    };
    let mut out = vec![ev(
        "message_start",
        json!({ "type": "message_start", "message": {
            "id": "msg_standin", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "usage": start_usage } }),
    )];
    let mut index = 0;
    if !text.is_empty() {
        out.push(ev(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": { "type": "text", "text": "" } }),
        ));
        for p in pieces(text) {
            out.push(ev(
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": index, "delta": { "type": "text_delta", "text": p } }),
            ));
        }
        out.push(ev(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": index }),
        ));
        index += 1;
    }
    out.push(ev("ping", json!({ "type": "ping" })));
    for c in calls {
        out.push(ev(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index,
                    "content_block": { "type": "tool_use", "id": c.id, "name": c.name, "input": {} } }),
        ));
        for p in pieces(&c.args) {
            out.push(ev(
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": index,
                        "delta": { "type": "input_json_delta", "partial_json": p } }),
            ));
        }
        out.push(ev(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": index }),
        ));
        index += 1;
    }
    out.push(ev(
        "message_delta",
        json!({ "type": "message_delta", "delta": { "stop_reason": anthropic_stop(stop), "stop_sequence": null },
                "usage": if matches!(usage, Usage::None) { json!({}) } else { json!({ "output_tokens": USAGE_OUT }) } }),
    ));
    out.push(ev("message_stop", json!({ "type": "message_stop" })));
    out
}

fn anthropic_whole(r: &Reply, model: &str, usage: Usage) -> Value {
    let (text, calls, stop) = parts(r);
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({ "type": "text", "text": text }));
    }
    for c in calls {
        // The real API always sends an object; broken arguments stay a string
        // here so a test can still script them.
        let input = serde_json::from_str::<Value>(&c.args).unwrap_or(Value::String(c.args.clone()));
        content.push(json!({ "type": "tool_use", "id": c.id, "name": c.name, "input": input }));
    }
    json!({
        "id": "msg_standin", "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": anthropic_stop(stop), "stop_sequence": null,
        "usage": match anthropic_input(usage) {
            Some((input, cached)) => json!({ "input_tokens": input, "cache_read_input_tokens": cached,
                   "cache_creation_input_tokens": 0, "output_tokens": USAGE_OUT }),
            None => json!({}),
        },
    })
}
