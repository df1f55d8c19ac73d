//! Anthropic Messages: the request body (tool results folded into user turns,
//! a cache breakpoint after the system prompt), a whole answer, and a streamed
//! one (`input_json_delta` fragments assembled per content block).

use serde_json::{Value, json};

use super::{
    OnText, ProviderConfig, ProviderError, Request, Role, Stop, ToolCall, ToolChoice, Turn, Usage,
};

/// The request body.
pub fn body(cfg: &ProviderConfig, req: &Request<'_>) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    // Anthropic wants user and assistant turns to alternate: tool results and
    // a following user message share one user turn.
    let mut push = |role: &str, blocks: Vec<Value>| {
        if let Some(last) = messages.last_mut()
            && last["role"] == role
            && let Some(content) = last["content"].as_array_mut()
        {
            content.extend(blocks);
            return;
        }
        messages.push(json!({ "role": role, "content": blocks }));
    };
    for m in req.messages {
        match m.role {
            Role::User => push("user", vec![json!({ "type": "text", "text": m.text })]),
            Role::Tool => push(
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.text,
                    "is_error": m.is_error,
                })],
            ),
            Role::Assistant => {
                let mut blocks = Vec::new();
                if !m.text.is_empty() {
                    blocks.push(json!({ "type": "text", "text": m.text }));
                }
                for c in &m.tool_calls {
                    // A malformed call still has to appear; its result says what was wrong.
                    let input = serde_json::from_str::<Value>(&c.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    blocks.push(
                        json!({ "type": "tool_use", "id": c.id, "name": c.name, "input": input }),
                    );
                }
                if blocks.is_empty() {
                    blocks.push(json!({ "type": "text", "text": "(no answer)" }));
                }
                push("assistant", blocks);
            }
        }
    }
    let mut body = json!({
        "model": cfg.model,
        "max_tokens": cfg.max_output_tokens,
        "system": [{ "type": "text", "text": req.system, "cache_control": { "type": "ephemeral" } }],
        "messages": messages,
        "stream": cfg.stream,
    });
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema }))
            .collect();
        body["tool_choice"] = match req.tool_choice {
            ToolChoice::Auto => json!({ "type": "auto" }),
            ToolChoice::None => json!({ "type": "none" }),
        };
    }
    body
}

fn stop(reason: Option<&str>) -> Stop {
    match reason {
        Some("end_turn") | Some("stop_sequence") => Stop::End,
        Some("tool_use") => Stop::ToolUse,
        Some("max_tokens") => Stop::MaxTokens,
        _ => Stop::Other,
    }
}

/// Adds what `u` reports to `usage` (input counts arrive at the start of a
/// stream, output counts at its end).
fn add_usage(usage: &mut Usage, u: &Value) {
    let read = u["cache_read_input_tokens"].as_u64().unwrap_or(0);
    let write = u["cache_creation_input_tokens"].as_u64().unwrap_or(0);
    if let Some(i) = u["input_tokens"].as_u64() {
        usage.input_tokens = i + read + write;
        usage.cached_input_tokens = read;
        usage.cache_write_tokens = write;
    }
    if let Some(o) = u["output_tokens"].as_u64() {
        usage.output_tokens = o;
    }
}

/// A whole (non-streamed) answer.
pub fn parse(v: &Value) -> Result<Turn, ProviderError> {
    let blocks = v["content"].as_array().ok_or_else(|| {
        ProviderError::Fatal(format!(
            "the answer has no content: {}",
            v.to_string().chars().take(300).collect::<String>()
        ))
    })?;
    let mut turn = Turn {
        text: String::new(),
        tool_calls: vec![],
        stop: stop(v["stop_reason"].as_str()),
        usage: Usage::default(),
    };
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => turn.text.push_str(b["text"].as_str().unwrap_or("")),
            Some("tool_use") => turn.tool_calls.push(ToolCall {
                id: b["id"].as_str().unwrap_or("").to_string(),
                name: b["name"].as_str().unwrap_or("").to_string(),
                arguments: b["input"].to_string(),
            }),
            _ => {}
        }
    }
    add_usage(&mut turn.usage, &v["usage"]);
    Ok(turn)
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
    // Tool-use blocks by content index.
    let mut calls: Vec<(u64, ToolCall)> = Vec::new();
    super::sse::each_event(
        resp,
        |ev| {
            let v: Value = serde_json::from_str(&ev.data).map_err(|e| {
                ProviderError::Fatal(format!("unreadable stream event ({e}): {}", ev.data))
            })?;
            match v["type"].as_str().unwrap_or(ev.event.as_str()) {
                "message_start" => add_usage(&mut turn.usage, &v["message"]["usage"]),
                "content_block_start" => {
                    let b = &v["content_block"];
                    if b["type"] == "tool_use" {
                        calls.push((
                            v["index"].as_u64().unwrap_or(0),
                            ToolCall {
                                id: b["id"].as_str().unwrap_or("").to_string(),
                                name: b["name"].as_str().unwrap_or("").to_string(),
                                arguments: String::new(),
                            },
                        ));
                    } else if let Some(t) = b["text"].as_str().filter(|t| !t.is_empty()) {
                        turn.text.push_str(t);
                        on_text(t);
                    }
                }
                "content_block_delta" => {
                    let d = &v["delta"];
                    match d["type"].as_str() {
                        Some("text_delta") => {
                            let t = d["text"].as_str().unwrap_or("");
                            turn.text.push_str(t);
                            on_text(t);
                        }
                        Some("input_json_delta") => {
                            let index = v["index"].as_u64().unwrap_or(0);
                            if let Some((_, c)) = calls.iter_mut().find(|(i, _)| *i == index) {
                                c.arguments
                                    .push_str(d["partial_json"].as_str().unwrap_or(""));
                            }
                        }
                        _ => {}
                    }
                }
                "message_delta" => {
                    if let Some(r) = v["delta"]["stop_reason"].as_str() {
                        turn.stop = stop(Some(r));
                    }
                    add_usage(&mut turn.usage, &v["usage"]);
                }
                "message_stop" => return Ok(true),
                "error" => {
                    let kind = v["error"]["type"].as_str().unwrap_or("");
                    let message =
                        format!("the provider reported an error mid-stream: {}", v["error"]);
                    return Err(if kind == "overloaded_error" || kind == "api_error" {
                        ProviderError::Retryable {
                            message,
                            retry_after: None,
                        }
                    } else {
                        ProviderError::Fatal(message)
                    });
                }
                _ => {}
            }
            Ok(false)
        },
        "`message_stop`",
    )
    .await?;
    turn.tool_calls = calls
        .into_iter()
        .map(|(_, mut c)| {
            if c.arguments.is_empty() {
                c.arguments = "{}".into();
            }
            c
        })
        .collect();
    Ok(turn)
}
