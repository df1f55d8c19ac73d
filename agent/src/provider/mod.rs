//! Model providers: one neutral request and turn shape, two wire formats.
//!
//! Flow at a glance: the loop builds a [`Request`] (system prompt, transcript,
//! tool specs) and hands it to [`Failover::complete`], which tries each
//! configured [`ProviderConfig`] in order. A provider speaks either OpenAI
//! Chat Completions ([`openai`]) or Anthropic Messages ([`anthropic`]), each
//! streaming (SSE, text passed on as it arrives, tool-call arguments assembled
//! from their fragments) or not. A 429, a 5xx, a timeout, a connection error or
//! a cut stream is *retryable*: the next provider gets the request, and a
//! `Retry-After` keeps the failed one aside until it has passed.
//!
//! Keys: a config holds only the *name* of the variable with the key; the value
//! is read from berth's environment for each request and goes nowhere else.

pub mod anthropic;
pub mod failover;
pub mod openai;
pub mod sse;
pub mod window;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::host::ToolSpec;

pub use failover::{Attempt, Failover};

/// Which wire format a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// OpenAI-compatible Chat Completions (hosted, vLLM, llama.cpp, Ollama).
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

impl Api {
    /// The variable that holds the key when none is named.
    pub fn default_key_env(self) -> &'static str {
        match self {
            Api::Openai => "OPENAI_API_KEY",
            Api::Anthropic => "ANTHROPIC_API_KEY",
        }
    }
}

impl std::str::FromStr for Api {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "openai" => Ok(Api::Openai),
            "anthropic" => Ok(Api::Anthropic),
            other => Err(format!("unknown api `{other}`: use openai or anthropic")),
        }
    }
}

/// One provider, as configured. Holds no secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProviderConfig {
    /// The name `--provider` uses.
    pub name: String,
    /// Its wire format.
    pub kind: Api,
    /// The API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// The model to ask for.
    pub model: String,
    /// The variable holding the key; no key is sent when it is unset or empty.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Extra request headers (values are not secrets: they are stored with the run).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Stream the answer (SSE). On by default.
    #[serde(default = "yes")]
    pub stream: bool,
    /// Output tokens the model may write per step.
    #[serde(default = "default_max_output")]
    pub max_output_tokens: u32,
    /// How long one request may take, in seconds, before it counts as failed.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// Price per million input tokens, for `--max-cost`.
    #[serde(default)]
    pub price_input_per_mtok: Option<f64>,
    /// Price per million output tokens.
    #[serde(default)]
    pub price_output_per_mtok: Option<f64>,
    /// The model's context window in tokens, when the endpoint does not say
    /// (vLLM's `/v1/models` and llama.cpp's `/props` do) or says wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// The share of the window at which a run compacts its transcript
    /// (0.75 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_at: Option<f64>,
}

fn yes() -> bool {
    true
}
fn default_max_output() -> u32 {
    4096
}
fn default_timeout() -> u64 {
    300
}

impl ProviderConfig {
    /// A provider with defaults for everything but what must be said.
    pub fn new(name: &str, kind: Api, base_url: &str, model: &str) -> Self {
        Self {
            name: name.into(),
            kind,
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            headers: BTreeMap::new(),
            stream: true,
            max_output_tokens: default_max_output(),
            timeout_secs: default_timeout(),
            price_input_per_mtok: None,
            price_output_per_mtok: None,
            context_window: None,
            compact_at: None,
        }
    }

    /// The key, read from berth's environment now. Never stored.
    fn key(&self) -> Option<String> {
        let var = self
            .api_key_env
            .clone()
            .unwrap_or_else(|| self.kind.default_key_env().to_string());
        std::env::var(var).ok().filter(|k| !k.is_empty())
    }

    /// The cost of `usage` at this provider's prices, if it has them.
    pub fn cost(&self, usage: &Usage) -> Option<f64> {
        let pin = self.price_input_per_mtok?;
        let pout = self.price_output_per_mtok.unwrap_or(pin);
        Some((usage.input_tokens as f64 * pin + usage.output_tokens as f64 * pout) / 1e6)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url.trim_end_matches('/'))
    }
}

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The person (or the task).
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// One tool call the model made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for it, echoed in the result.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments exactly as the model wrote them (JSON text, maybe broken).
    pub arguments: String,
}

/// One message of the transcript, in neither wire format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// Its text.
    #[serde(default)]
    pub text: String,
    /// Tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The result is an error (tool messages only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// The model hit its output limit in this turn (assistant messages only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl Message {
    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            text: text.into(),
            tool_calls: vec![],
            tool_call_id: None,
            is_error: false,
            truncated: false,
        }
    }

    /// A tool result.
    pub fn tool(call_id: &str, text: impl Into<String>, is_error: bool) -> Self {
        Message {
            role: Role::Tool,
            text: text.into(),
            tool_calls: vec![],
            tool_call_id: Some(call_id.into()),
            is_error,
            truncated: false,
        }
    }
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// A final answer.
    End,
    /// It wants its tool calls run.
    ToolUse,
    /// It hit the output limit (a tool call may be cut short).
    MaxTokens,
    /// Anything else the provider said.
    Other,
}

/// Token counts of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's prompt cache (Anthropic).
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Input plus output.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// What the model answered in one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// Its text.
    pub text: String,
    /// Its tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub stop: Stop,
    /// Token counts, when reported.
    pub usage: Usage,
}

/// Whether the model may call tools in this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// As it sees fit.
    Auto,
    /// Not at all: the budget's last, summarising call. The tools are still
    /// sent, so the prompt prefix (and the provider's cache) stays the same, and
    /// Anthropic requires them when the transcript holds tool blocks.
    None,
}

/// One request to a model.
pub struct Request<'a> {
    /// The system prompt, byte-identical on every step of a run.
    pub system: &'a str,
    /// The transcript.
    pub messages: &'a [Message],
    /// The tools, byte-identical on every step of a run.
    pub tools: &'a [ToolSpec],
    /// Whether they may be called.
    pub tool_choice: ToolChoice,
}

/// Why a provider gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Worth trying the next provider: 429, 5xx, timeout, connection error, cut stream.
    #[error("{message}")]
    Retryable {
        /// What happened.
        message: String,
        /// The provider's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The request is larger than the model's context window. Not the
    /// provider's fault, so no other provider is tried: the run compacts.
    #[error("{message}")]
    TooLarge {
        /// What the provider said.
        message: String,
        /// The window it named, if any.
        window: Option<u64>,
    },
    /// The request itself is wrong (4xx other than 429, an unreadable answer):
    /// another provider would say the same.
    #[error("{0}")]
    Fatal(String),
    /// The caller cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// Called with each piece of text as it arrives.
pub type OnText<'a> = &'a mut (dyn FnMut(&str) + Send);

/// Ask one provider.
pub async fn complete(
    client: &reqwest::Client,
    cfg: &ProviderConfig,
    req: &Request<'_>,
    on_text: OnText<'_>,
) -> Result<Turn, ProviderError> {
    let (url, body) = match cfg.kind {
        Api::Openai => (cfg.url("chat/completions"), openai::body(cfg, req)),
        Api::Anthropic => (cfg.url("messages"), anthropic::body(cfg, req)),
    };
    let mut http = client
        .post(&url)
        .timeout(Duration::from_secs(cfg.timeout_secs.max(1)))
        .header("content-type", "application/json");
    let key = cfg.key();
    match cfg.kind {
        Api::Openai => {
            if let Some(k) = &key {
                http = http.bearer_auth(k);
            }
        }
        Api::Anthropic => {
            http = http.header("anthropic-version", "2023-06-01");
            if let Some(k) = &key {
                http = http.header("x-api-key", k);
            }
        }
    }
    for (k, v) in &cfg.headers {
        http = http.header(k, v);
    }
    let body = serde_json::to_vec(&body).map_err(|e| ProviderError::Fatal(e.to_string()))?;
    let resp = http
        .body(body)
        .send()
        .await
        .map_err(|e| transport(&url, e))?;
    let status = resp.status();
    if !status.is_success() {
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let text = resp.text().await.unwrap_or_default();
        let snippet: String = text.chars().take(300).collect();
        let message = format!("{url} answered {status}: {snippet}");
        if let Some(r) = window::refusal(status.as_u16(), &text) {
            return Err(ProviderError::TooLarge {
                message,
                window: r.window,
            });
        }
        return Err(
            if status.as_u16() == 429 || status.is_server_error() || status.as_u16() == 408 {
                ProviderError::Retryable {
                    message,
                    retry_after,
                }
            } else {
                ProviderError::Fatal(message)
            },
        );
    }
    if cfg.stream {
        match cfg.kind {
            Api::Openai => openai::read_stream(resp, on_text).await,
            Api::Anthropic => anthropic::read_stream(resp, on_text).await,
        }
    } else {
        let v: Value = resp.json().await.map_err(|e| transport(&url, e))?;
        let turn = match cfg.kind {
            Api::Openai => openai::parse(&v)?,
            Api::Anthropic => anthropic::parse(&v)?,
        };
        if !turn.text.is_empty() {
            on_text(&turn.text);
        }
        Ok(turn)
    }
}

/// `Retry-After` as seconds (the HTTP-date form is rare from model APIs and
/// is treated as absent).
fn parse_retry_after(v: &str) -> Option<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(3600.0)))
}

fn transport(url: &str, e: reqwest::Error) -> ProviderError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_decode() {
        "sent an unreadable answer"
    } else {
        "failed mid-answer"
    };
    ProviderError::Retryable {
        message: format!("{url}: {what}: {e}"),
        retry_after: None,
    }
}

/// A stream that ended before its end marker.
fn cut(what: &str) -> ProviderError {
    ProviderError::Retryable {
        message: format!("the stream was cut before {what}"),
        retry_after: None,
    }
}
