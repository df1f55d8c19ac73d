//! A provider's context window: asked of the endpoint where it says so, and
//! read from its refusal when a request was too large.
//!
//! Flow at a glance: a configured `context_window` wins; otherwise [`probe`]
//! asks vLLM's `GET /v1/models` (`max_model_len`, or `context_length` as
//! OpenRouter and others spell it) and then llama.cpp's `GET /props`
//! (`n_ctx`). A 400 that says the prompt is too long is classified by
//! [`refusal`]: it is the request's fault, not the provider's, so it never
//! fails over; the window it names, if any, is learned.

use std::time::Duration;

use serde_json::Value;

use super::{Api, ProviderConfig};

/// How long a probe may take; a provider that does not answer in time just
/// has an unknown window.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The window `cfg`'s endpoint reports, if it reports one.
pub async fn probe(client: &reqwest::Client, cfg: &ProviderConfig) -> Option<u64> {
    if cfg.kind != Api::Openai {
        // Anthropic's models endpoint does not give the window.
        return None;
    }
    let get = |url: String| {
        let mut r = client.get(url).timeout(PROBE_TIMEOUT);
        if let Some(k) = cfg.key() {
            r = r.bearer_auth(k);
        }
        for (k, v) in &cfg.headers {
            r = r.header(k, v);
        }
        async move {
            let resp = r.send().await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            resp.json::<Value>().await.ok()
        }
    };
    if let Some(v) = get(cfg.url("models")).await
        && let Some(n) = from_models(&v, &cfg.model)
    {
        return Some(n);
    }
    // llama.cpp serves `/props` at the server's root, beside `/v1`.
    let root = cfg.base_url.trim_end_matches('/');
    let root = root.strip_suffix("/v1").unwrap_or(root);
    let v = get(format!("{root}/props")).await?;
    v["default_generation_settings"]["n_ctx"]
        .as_u64()
        .or_else(|| v["n_ctx"].as_u64())
        .filter(|n| *n > 0)
}

/// The window of `model` in a `/v1/models` listing (or of its only model).
fn from_models(v: &Value, model: &str) -> Option<u64> {
    let data = v["data"].as_array()?;
    let entry = data
        .iter()
        .find(|m| m["id"] == model)
        .or_else(|| (data.len() == 1).then(|| &data[0]))?;
    ["max_model_len", "context_length", "context_window"]
        .iter()
        .find_map(|k| entry[*k].as_u64())
        .filter(|n| *n > 0)
}

/// A refusal for size: the window it names, if it names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The window the provider said it has.
    pub window: Option<u64>,
}

/// Whether an error answer (`status`, `body`) refuses the request for its size.
/// OpenAI and vLLM say `context_length_exceeded` or "maximum context length
/// is N tokens"; Anthropic says "prompt is too long: X tokens > N maximum";
/// llama.cpp says `exceed_context_size_error` with `n_ctx`, or that the
/// request "exceeds the available context size".
pub fn refusal(status: u16, body: &str) -> Option<Refusal> {
    if !matches!(status, 400 | 413 | 422) {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    let said = [
        "context_length_exceeded",
        "maximum context length",
        "prompt is too long",
        "exceed_context_size",
        "exceeds the available context size",
        "context window",
    ]
    .iter()
    .any(|p| lower.contains(p));
    if !said {
        return None;
    }
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let window = v["error"]["n_ctx"]
        .as_u64()
        .or_else(|| number_after(&lower, "maximum context length is "))
        .or_else(|| {
            // "prompt is too long: 9000 tokens > 8000 maximum"
            let at = lower.find("tokens > ")? + "tokens > ".len();
            number_after(&lower[at..], "")
        });
    Some(Refusal { window })
}

fn number_after(text: &str, marker: &str) -> Option<u64> {
    let at = text.find(marker)? + marker.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refusals_for_size_name_their_window() {
        let openai = r#"{"error": {"message": "This model's maximum context length is 8000 tokens. However, your messages resulted in 8613 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}"#;
        assert_eq!(refusal(400, openai), Some(Refusal { window: Some(8000) }));
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210345 tokens > 200000 maximum"}}"#;
        assert_eq!(
            refusal(400, anthropic),
            Some(Refusal {
                window: Some(200000)
            })
        );
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        assert_eq!(refusal(400, llama), Some(Refusal { window: Some(4096) }));
        let vague = r#"{"error":{"message":"the request exceeds the available context size"}}"#;
        assert_eq!(refusal(400, vague), Some(Refusal { window: None }));
        // Other 400s, and a 5xx that mentions it, are not refusals for size.
        assert_eq!(
            refusal(400, r#"{"error":{"message":"bad tool schema"}}"#),
            None
        );
        assert_eq!(refusal(500, openai), None);
    }

    #[test]
    fn a_models_listing_gives_the_window_of_the_model() {
        let v = json!({ "data": [
            { "id": "a", "max_model_len": 4096 },
            { "id": "b", "context_length": 32768 },
        ]});
        assert_eq!(from_models(&v, "a"), Some(4096));
        assert_eq!(from_models(&v, "b"), Some(32768));
        assert_eq!(from_models(&v, "c"), None);
        let one = json!({ "data": [{ "id": "served", "max_model_len": 8000 }] });
        assert_eq!(from_models(&one, "alias"), Some(8000));
        assert_eq!(from_models(&json!({ "data": [{ "id": "x" }] }), "x"), None);
    }
}
