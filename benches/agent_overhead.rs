//! berth's own cost per agent step, beyond the model and the tool: journal
//! writes, validation, the policy check. Target: under 1 ms per step.
//!
//! `cargo bench --bench agent_overhead` prints two figures:
//! - **parts**: the work the loop adds to every step that makes one tool call
//!   (validate the turn, check the command against the policy, journal the
//!   step, the model's message, the call started and the call finished),
//!   timed directly over many iterations;
//! - **loop**: whole steps against the provider stand-in with a tool that
//!   returns at once, minus the time of bare provider calls to the same
//!   stand-in (HTTP on loopback), so what is left is the loop's own cost.

use berth_core::backend::BackendKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_agent::journal::{self, StepRow};
use berth_agent::provider::{
    self, Api, Failover, Message, ProviderConfig, Request, Role, Stop, ToolCall, ToolChoice, Usage,
};
use berth_agent::runner::{Agent, AgentEvent, Budget, default_system};
use berth_agent::{ToolHost, ToolOutcome, ToolSpec, validate};
use berth_core::gate::Gate;
use berth_core::store::Store;
use berth_policies::Policy;
use berth_standins::provider::{ProviderStandin, Reply};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const COMMAND: &str = "cd src && grep -rn 'fn main' . | head -20";

/// Answers at once, after the policy check a real call makes.
struct InstantTool {
    gate: Gate,
}

#[async_trait(?Send)]
impl ToolHost for InstantTool {
    fn specs(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "terminal".into(),
            description: "Run a command.".into(),
            input_schema: json!({
                "type": "object",
                "properties": { "command": { "type": "string" }, "timeout": { "type": "number" } },
                "required": ["command"],
                "additionalProperties": false
            }),
        }]
    }

    async fn call(&self, _name: &str, args: &Value, _cancel: CancellationToken) -> ToolOutcome {
        let v = self
            .gate
            .check(args["command"].as_str().unwrap_or(""), BackendKind::Local);
        ToolOutcome::Done {
            text: format!("ok ({})\n[exit code 0]", v.action),
            is_error: false,
            detail: json!({ "exit_code": 0 }),
        }
    }
}

fn parts(store: &Store, gate: &Gate, tools: &[ToolSpec], n: usize) -> Result<Duration, BoxError> {
    journal::create(
        store,
        "bench-parts",
        "bench",
        BackendKind::Local,
        "default",
        &json!({}),
        journal::Link::None,
    )?;
    let t0 = Instant::now();
    for i in 0..n {
        let step = i as i64 + 1;
        let call = ToolCall {
            id: format!("c{i}"),
            name: "terminal".into(),
            arguments: json!({ "command": COMMAND }).to_string(),
        };
        let checked = validate::turn(std::slice::from_ref(&call), Stop::ToolUse, tools, 8);
        let _ = gate.check(COMMAND, BackendKind::Local);
        journal::put_step(
            store,
            "bench-parts",
            &StepRow {
                step,
                provider: Some("standin".into()),
                attempts: vec![],
                usage: Usage::default(),
                cost: None,
                started_ms: 0,
                ended_ms: 0,
                summary: false,
            },
        )?;
        let msg = Message {
            role: Role::Assistant,
            text: String::new(),
            tool_calls: vec![call.clone()],
            tool_call_id: None,
            is_error: false,
            truncated: false,
        };
        journal::append_message(store, "bench-parts", step, &msg)?;
        journal::call_started(
            store,
            "bench-parts",
            &call.id,
            step,
            0,
            "terminal",
            &call.arguments,
        )?;
        let result = Message::tool(&call.id, "ok\n[exit code 0]", false);
        journal::call_finished(
            store,
            "bench-parts",
            step,
            journal::CallKey {
                call_id: &call.id,
                idx: 0,
                name: "terminal",
                args: &call.arguments,
            },
            journal::CallState::Finished,
            None,
            &json!({ "ok": checked[0].is_ok() }),
            &result,
        )?;
    }
    Ok(t0.elapsed() / n as u32)
}

async fn bare_provider(url: &str, n: usize) -> Result<Duration, BoxError> {
    let cfg = ProviderConfig::new("standin", Api::Openai, url, "m");
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()?;
    let call = ToolCall {
        id: "c0".into(),
        name: "terminal".into(),
        arguments: json!({ "command": COMMAND }).to_string(),
    };
    let first = vec![Message::user("bench")];
    let second = vec![
        Message::user("bench"),
        Message {
            role: Role::Assistant,
            text: String::new(),
            tool_calls: vec![call],
            tool_call_id: None,
            is_error: false,
            truncated: false,
        },
        Message::tool("c0", "ok (allow)\n[exit code 0]", false),
    ];
    let tools = InstantTool {
        gate: Gate::new(Policy::default(), None, Vec::<(String, String)>::new()),
    }
    .specs();
    let system = default_system(BackendKind::Local, "default");
    let t0 = Instant::now();
    for i in 0..n {
        let req = Request {
            system: &system,
            messages: if i % 2 == 0 { &first } else { &second },
            tools: &tools,
            tool_choice: ToolChoice::Auto,
        };
        provider::complete(&client, &cfg, &req, &mut |_| {})
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(t0.elapsed() / n as u32)
}

fn main() -> Result<(), BoxError> {
    let n: usize = std::env::var("BERTH_BENCH_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path())?);
    let gate = Gate::new(Policy::default(), None, Vec::<(String, String)>::new());
    let host = InstantTool {
        gate: Gate::new(Policy::default(), None, Vec::<(String, String)>::new()),
    };
    let tools = host.specs();
    let per_part = parts(&store, &gate, &tools, n)?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (per_step, per_call) = rt.block_on(async {
        // Many short runs (one tool step, then a final answer), so the
        // transcript stays small and the bare calls below carry the same bytes.
        let runs = n / 2;
        let mut script = Vec::new();
        for i in 0..runs {
            script.push(Reply::call(
                &format!("c{i}"),
                "terminal",
                &json!({ "command": COMMAND }).to_string(),
            ));
            script.push(Reply::text("done"));
        }
        let s = ProviderStandin::start(script)?;
        let failover = Failover::new(vec![ProviderConfig::new(
            "standin",
            Api::Openai,
            &s.url(),
            "m",
        )])
        .map_err(|e| e.to_string())?;
        // Model and tool time, from the loop's own events.
        let clock = Arc::new(std::sync::Mutex::new((None::<Instant>, Duration::ZERO)));
        let c = clock.clone();
        let sink = Arc::new(move |e: &AgentEvent| {
            let Ok(mut c) = c.lock() else { return };
            match e {
                AgentEvent::Step { .. } | AgentEvent::ToolCall { .. } => c.0 = Some(Instant::now()),
                AgentEvent::StepEnd { .. } | AgentEvent::Result { .. } => {
                    if let Some(t) = c.0.take() {
                        c.1 += t.elapsed();
                    }
                }
                _ => {}
            }
        });
        let mut agent = Agent::new(
            store.clone(),
            Arc::new(host),
            failover,
            Budget::default(),
            sink,
            Arc::new(|t: &str| t.to_string()),
        );
        let t0 = Instant::now();
        for _ in 0..runs {
            let id = agent.start("bench", BackendKind::Local, "default")?;
            let exit = agent.run(&id, &CancellationToken::new()).await?;
            if exit.reason != journal::RunState::Done {
                return Err(
                    format!("the bench run ended {}: {:?}", exit.reason, exit.detail).into(),
                );
            }
        }
        let total = t0.elapsed();
        let outside = clock.lock().map(|c| c.1).unwrap_or_default();
        let per_step = (total / (2 * runs) as u32, outside / (2 * runs) as u32);
        // Bare provider calls to a stand-in serving the same answers.
        let mut script = Vec::new();
        for i in 0..runs {
            script.push(Reply::call(
                &format!("c{i}"),
                "terminal",
                &json!({ "command": COMMAND }).to_string(),
            ));
            script.push(Reply::text("done"));
        }
        let s2 = ProviderStandin::start(script)?;
        let per_call = bare_provider(&s2.url(), 2 * runs).await?;
        Ok::<_, BoxError>((per_step, per_call))
    })?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("agent step overhead ({n} steps: runs of one tool step and a final answer)");
    println!(
        "  parts: validate + policy + 4 journal writes   {:>8.1} µs/step",
        us(per_part)
    );
    let (whole, outside) = per_step;
    println!(
        "  loop:  whole step against the stand-in        {:>8.1} µs/step",
        us(whole)
    );
    println!(
        "         of which the model call and the tool   {:>8.1} µs/step",
        us(outside)
    );
    println!(
        "         berth's own overhead                    {:>8.1} µs/step   (target < 1000)",
        us(whole.saturating_sub(outside))
    );
    println!(
        "  for scale: a bare provider call (loopback)    {:>8.1} µs/call",
        us(per_call)
    );
    Ok(())
}
