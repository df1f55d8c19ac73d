//! Checking a turn's tool calls before anything runs. Each problem becomes a
//! tool result that says exactly what was wrong, so the model can correct
//! itself on the next step instead of the turn failing.
//!
//! The checks are a pure function of the turn, so a resumed run reaches the
//! same verdicts as the run that was killed.

use serde_json::Value;

use super::host::ToolSpec;
use super::provider::{Stop, ToolCall};

/// One call's verdict: its parsed arguments, or what to tell the model.
pub type Checked = Result<Value, String>;

/// Check every call of one turn, in order.
pub fn turn(calls: &[ToolCall], stop: Stop, tools: &[ToolSpec], max_calls: usize) -> Vec<Checked> {
    let mut seen: Vec<(String, String, usize)> = Vec::new();
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i >= max_calls {
                return Err(format!(
                    "too many tool calls in one turn: the limit is {max_calls}, and this was call {} of {}. It was not run; make it again in your next turn if it is still needed.",
                    i + 1,
                    calls.len()
                ));
            }
            let args = arguments(c, stop, i + 1 == calls.len())?;
            let Some(spec) = tools.iter().find(|t| t.name == c.name) else {
                let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                return Err(format!(
                    "there is no tool `{}`; the tools are: {}. The call was not run.",
                    c.name,
                    names.join(", ")
                ));
            };
            schema(&args, &spec.input_schema).map_err(|why| {
                format!(
                    "the arguments of `{}` do not match its schema: {why}. The call was not run; send it again with corrected arguments.",
                    c.name
                )
            })?;
            let key = args.to_string();
            if let Some((_, _, first)) = seen.iter().find(|(n, k, _)| *n == c.name && *k == key) {
                return Err(format!(
                    "this call is identical to call {} of this turn (same tool, same arguments), so it was not run twice; use that call's result.",
                    first + 1
                ));
            }
            seen.push((c.name.clone(), key, i));
            Ok(args)
        })
        .collect()
}

fn arguments(c: &ToolCall, stop: Stop, last: bool) -> Checked {
    let text = if c.arguments.trim().is_empty() {
        "{}"
    } else {
        c.arguments.as_str()
    };
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(v) => Err(format!(
            "the arguments must be one JSON object, not {}. The call was not run.",
            kind(&v)
        )),
        Err(e) if stop == Stop::MaxTokens && last => Err(format!(
            "this call was cut off by the output limit: {} bytes of arguments arrived and they are not complete JSON ({e}). It was not run. Make it again with shorter arguments (write a large file in parts).",
            c.arguments.len()
        )),
        Err(e) => Err(format!(
            "the arguments are not valid JSON ({e}). The call was not run; send the arguments as one JSON object that matches the tool's schema."
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn matches(v: &Value, ty: &str) -> bool {
    match ty {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

/// The subset of JSON Schema that tool schemas use: required fields, field
/// types (one or a list), enums, and closed objects.
fn schema(args: &Value, schema: &Value) -> Result<(), String> {
    let props = schema["properties"].as_object();
    let mut problems = Vec::new();
    if let Some(req) = schema["required"].as_array() {
        for r in req.iter().filter_map(Value::as_str) {
            if args.get(r).is_none() {
                let ty = props
                    .and_then(|p| p.get(r))
                    .and_then(|p| p["type"].as_str())
                    .unwrap_or("value");
                problems.push(format!("missing required field `{r}` ({ty})"));
            }
        }
    }
    if let (Some(obj), Some(props)) = (args.as_object(), props) {
        for (k, v) in obj {
            let Some(p) = props.get(k) else {
                if schema["additionalProperties"] == Value::Bool(false) {
                    let names: Vec<&str> = props.keys().map(String::as_str).collect();
                    problems.push(format!(
                        "unknown field `{k}` (the fields are: {})",
                        names.join(", ")
                    ));
                }
                continue;
            };
            let types: Vec<&str> = match &p["type"] {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            if v.is_null() && !types.contains(&"null") && !types.is_empty() {
                // Optional fields sent as null mean "not given".
                if schema["required"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| x == k))
                {
                    problems.push(format!(
                        "field `{k}` must be {}, got null",
                        types.join(" or ")
                    ));
                }
                continue;
            }
            if !types.is_empty() && !types.iter().any(|t| matches(v, t)) {
                problems.push(format!(
                    "field `{k}` must be {}, got {}",
                    types.join(" or "),
                    kind(v)
                ));
                continue;
            }
            if let Some(allowed) = p["enum"].as_array()
                && !allowed.contains(v)
            {
                let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
                problems.push(format!("field `{k}` must be one of {}", list.join(", ")));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "terminal".into(),
            description: String::new(),
            input_schema: json!({
                "type": "object",
                "properties": { "command": { "type": "string" }, "timeout": { "type": "number" } },
                "required": ["command"],
                "additionalProperties": false
            }),
        }]
    }

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn each_problem_is_named() {
        let calls = vec![
            call("terminal", r#"{"command":"ls"}"#),
            call("terminal", r#"{"command": "ls" }"#),
            call("terminal", r#"{"command":"ls""#),
            call("nope", "{}"),
            call("terminal", r#"{"timeout":"5"}"#),
            call("terminal", r#"{"command":"x","cmd":1}"#),
            call("terminal", r#"{"command":"y"}"#),
        ];
        let r = turn(&calls, Stop::ToolUse, &tools(), 6);
        assert!(r[0].is_ok());
        assert!(r[1].as_ref().unwrap_err().contains("identical to call 1"));
        assert!(r[2].as_ref().unwrap_err().contains("not valid JSON"));
        assert!(r[3].as_ref().unwrap_err().contains("no tool `nope`"));
        let e = r[4].as_ref().unwrap_err();
        assert!(
            e.contains("missing required field `command` (string)"),
            "{e}"
        );
        assert!(
            e.contains("field `timeout` must be number, got a string"),
            "{e}"
        );
        assert!(r[5].as_ref().unwrap_err().contains("unknown field `cmd`"));
        assert!(r[6].as_ref().unwrap_err().contains("too many tool calls"));
    }

    #[test]
    fn a_call_cut_by_the_output_limit_says_so() {
        let r = turn(
            &[call("terminal", r#"{"command":"echo aaaa"#)],
            Stop::MaxTokens,
            &tools(),
            8,
        );
        assert!(
            r[0].as_ref()
                .unwrap_err()
                .contains("cut off by the output limit")
        );
    }
}
