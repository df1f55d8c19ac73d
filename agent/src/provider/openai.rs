//! OpenAI-compatible Chat Completions: the request body, a whole answer, and
//! a streamed one (tool-call fragments keyed by `index`, assembled in order).

use serde_json::{Value, json};

use super::{
    OnText, ProviderConfig, ProviderError, Request, Role, Stop, ToolCall, ToolChoice, Turn, Usage,
};

/// The request body. The system prompt and the tools come first and are built
/// the same way every time, so the prefix is byte-identical across steps.
pub fn body(cfg: &ProviderConfig, req: &Request<'_>) -> Value {
    let mut messages = vec![json!({ "role": "system", "content": req.system })];
    for m in req.messages {
        messages.push(match m.role {
            Role::User => json!({ "role": "user", "content": m.text }),
            Role::Assistant => {
                let mut v = json!({
                    "role": "assistant",
                    "content": if m.text.is_empty() { Value::Null } else { Value::String(m.text.clone()) },
                });
                if !m.tool_calls.is_empty() {
                    v["tool_calls"] = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": { "name": c.name, "arguments": c.arguments },
                            })
                        })
                        .collect();
                }
                v
            }
            Role::Tool => json!({
                "role": "tool",
                "tool_call_id": m.tool_call_id,
                "content": m.text,
            }),
        });
    }
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            json!({
                "type": "function",
                "function": { "name": t.name, "description": t.description, "parameters": t.input_schema },
            })
        })
        .collect();
    let mut body = json!({
        "model": cfg.model,
        "messages": messages,
        "max_tokens": cfg.max_output_tokens,
        "stream": cfg.stream,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
        body["tool_choice"] = match req.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
        }
        .into();
    }
    if cfg.stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    body
}

fn stop(reason: Option<&str>) -> Stop {
    match reason {
        Some("stop") => Stop::End,
        Some("tool_calls") | Some("function_call") => Stop::ToolUse,
        Some("length") => Stop::MaxTokens,
        _ => Stop::Other,
    }
}

fn usage(u: &Value) -> Usage {
    Usage {
        input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
        cached_input_tokens: u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        cache_write_tokens: 0,
    }
}

/// A whole (non-streamed) answer.
pub fn parse(v: &Value) -> Result<Turn, ProviderError> {
    let choice = v["choices"].get(0).ok_or_else(|| {
        ProviderError::Fatal(format!("the answer has no choices: {}", snippet(v)))
    })?;
    let msg = &choice["message"];
    let tool_calls = msg["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| ToolCall {
                    id: c["id"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("call_{i}")),
                    name: c["function"]["name"].as_str().unwrap_or("").to_string(),
                    arguments: match &c["function"]["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Turn {
        text: msg["content"].as_str().unwrap_or("").to_string(),
        tool_calls,
        stop: stop(choice["finish_reason"].as_str()),
        usage: usage(&v["usage"]),
    })
}

fn snippet(v: &Value) -> String {
    v.to_string().chars().take(300).collect()
}

/// A streamed answer.
pub async fn read_stream(
    resp: reqwest::Response,
    on_text: OnText<'_>,
) -> Result<Turn, ProviderError> {
    let mut turn = Turn {
        text: String::new(),
        tool_calls: vec![],
        stop: Stop::Other,
        usage: Usage::default(),
    };
    // Calls by the stream's `index`, which may not start at 0 or be dense.
    let mut calls: Vec<(u64, ToolCall)> = Vec::new();
    let mut finished = false;
    let result = super::sse::each_event(
        resp,
        |ev| {
            if ev.data.trim() == "[DONE]" {
                return Ok(true);
            }
            let v: Value = serde_json::from_str(&ev.data).map_err(|e| {
                ProviderError::Fatal(format!("unreadable stream chunk ({e}): {}", ev.data))
            })?;
            if let Some(err) = v.get("error") {
                return Err(ProviderError::Retryable {
                    message: format!("the provider reported an error mid-stream: {err}"),
                    retry_after: None,
                });
            }
            if v["usage"].is_object() {
                turn.usage = usage(&v["usage"]);
            }
            let Some(choice) = v["choices"].get(0) else {
                return Ok(false);
            };
            let delta = &choice["delta"];
            if let Some(t) = delta["content"].as_str()
                && !t.is_empty()
            {
                turn.text.push_str(t);
                on_text(t);
            }
            if let Some(parts) = delta["tool_calls"].as_array() {
                for p in parts {
                    let index = p["index"].as_u64().unwrap_or(calls.len() as u64);
                    let pos = match calls.iter().position(|(i, _)| *i == index) {
                        Some(pos) => pos,
                        None => {
                            calls.push((
                                index,
                                ToolCall {
                                    id: String::new(),
                                    name: String::new(),
                                    arguments: String::new(),
                                },
                            ));
                            calls.len() - 1
                        }
                    };
                    let c = &mut calls[pos].1;
                    if let Some(id) = p["id"].as_str() {
                        c.id.push_str(id);
                    }
                    if let Some(n) = p["function"]["name"].as_str() {
                        c.name.push_str(n);
                    }
                    if let Some(a) = p["function"]["arguments"].as_str() {
                        c.arguments.push_str(a);
                    }
                }
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                turn.stop = stop(Some(r));
                finished = true;
            }
            Ok(false)
        },
        "`data: [DONE]`",
    )
    .await;
    match result {
        Ok(()) => {}
        // Some servers close without `[DONE]` once they have said why they stopped.
        Err(ProviderError::Retryable { .. }) if finished => {}
        Err(e) => return Err(e),
    }
    if !finished {
        return Err(super::cut("a finish_reason"));
    }
    calls.sort_by_key(|(i, _)| *i);
    turn.tool_calls = calls
        .into_iter()
        .enumerate()
        .map(|(n, (_, mut c))| {
            if c.id.is_empty() {
                c.id = format!("call_{n}");
            }
            c
        })
        .collect();
    Ok(turn)
}
