//! What a compaction costs berth itself, the model's time excluded, for a
//! 200-step transcript whose every step printed about 3 KB.
//!
//! `cargo bench --bench compaction` prints two figures and their ratio:
//! - **floor**: what berth does for every step of such a run anyway: build
//!   the transcript to send and serialise the request body;
//! - **compaction**: the work [`berth_agent::runner`] adds when a
//!   request passes the threshold: read the run's compactions, plan the
//!   stage (masking is tried first and falls short, so a summary is
//!   planned), build the summary call's transcript and the compacted one,
//!   count both, and journal the compaction with its summary step.
//!
//! Both are measured in the same process on the same transcript, so the
//! ratio holds across machines better than either figure.

use berth_core::backend::BackendKind;
use std::time::{Duration, Instant};

use berth_agent::ToolSpec;
use berth_agent::context::{self, Compaction, Stage, Target};
use berth_agent::journal::{self, StepRow};
use berth_agent::provider::{
    Api, Message, ProviderConfig, Request, Role, ToolCall, ToolChoice, Usage, openai,
};
use berth_agent::runner::default_system;
use berth_core::store::Store;
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const STEPS: i64 = 200;
const WINDOW: u64 = 128_000;

fn transcript() -> Vec<(i64, Message)> {
    let mut msgs = vec![(0, Message::user("print 3 KB, two hundred times over"))];
    for k in 1..=STEPS {
        let id = format!("c{k}");
        let command = format!("yes 'step {k}: the quick brown fox' | head -n 90");
        msgs.push((
            k,
            Message {
                role: Role::Assistant,
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: id.clone(),
                    name: "terminal".into(),
                    arguments: json!({ "command": command }).to_string(),
                }],
                tool_call_id: None,
                is_error: false,
                truncated: false,
            },
        ));
        let out = format!("step {k}: the quick brown fox\n").repeat(90);
        msgs.push((k, Message::tool(&id, format!("{out}[exit code 0]"), false)));
    }
    msgs
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "terminal".into(),
        description: "Run a command in the sandbox's persistent shell.".into(),
        input_schema: json!({
            "type": "object",
            "properties": { "command": { "type": "string" }, "timeout": { "type": "number" } },
            "required": ["command"],
            "additionalProperties": false
        }),
    }]
}

fn main() -> Result<(), BoxError> {
    let n: usize = std::env::var("BERTH_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path())?;
    let msgs = transcript();
    let system = default_system(BackendKind::Local, "default");
    let tools = tools();
    let cfg = ProviderConfig::new("bench", Api::Openai, "http://127.0.0.1:1/v1", "m");
    let cap = Some((WINDOW * context::BYTES_PER_TOKEN / 4) as usize);

    // The floor: the request every step builds anyway.
    let t0 = Instant::now();
    let mut bytes = 0;
    for _ in 0..n {
        let view = context::view(&msgs, None, "bench", cap);
        let req = Request {
            system: &system,
            messages: &view,
            tools: &tools,
            tool_choice: ToolChoice::Auto,
        };
        bytes = serde_json::to_vec(&openai::body(&cfg, &req))?.len();
    }
    let floor = t0.elapsed() / n as u32;

    // A compaction of the same transcript, down to a sixteenth of what it
    // is: stubs alone leave about an eighth, so a summary is planned.
    let all = context::estimate_all(&context::view(&msgs, None, "bench", cap));
    for i in 0..n {
        let run = format!("bench-{i}");
        journal::create(
            &store,
            &run,
            "t",
            BackendKind::Local,
            "default",
            &json!({}),
            journal::Link::None,
        )?;
    }
    let t0 = Instant::now();
    for i in 0..n {
        let run = format!("bench-{i}");
        let prev = journal::compactions(&store, &run)?.pop();
        let plan = context::plan(
            &msgs,
            prev.as_ref(),
            &run,
            &Target {
                tokens: all / 16,
                at_least: Stage::Mask,
            },
        );
        let mut c = Compaction::from_plan(&plan, prev.as_ref(), STEPS + 1, WINDOW);
        // The summary call's transcript: the elided middle, all stubs.
        let mut ask = prev.clone().unwrap_or_else(|| c.clone());
        ask.masked = plan.summarised;
        ask.summarised = 0;
        let ask = context::view(&msgs[..plan.summarised], Some(&ask), &run, None);
        c.tokens_before = all;
        c.summary = Some(format!(
            "## Task\n…\n## Next step\n… ({} messages)",
            ask.len()
        ));
        c.summary_step = Some(STEPS + 1);
        let sent = context::view(&msgs, Some(&c), &run, cap);
        c.tokens_after = context::estimate_all(&sent);
        let row = StepRow {
            step: STEPS + 1,
            provider: Some("bench".into()),
            attempts: vec![],
            usage: Usage::default(),
            cost: None,
            started_ms: 0,
            ended_ms: 0,
            summary: true,
        };
        journal::put_compaction(&store, &run, &c, Some(&row))?;
        if c.stage < Stage::Summary || c.tokens_after >= all {
            return Err(format!("the bench compaction did not compact: {c:?}").into());
        }
    }
    let compaction = t0.elapsed() / n as u32;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "compaction cost, model excluded ({STEPS}-step transcript, {} KB request, {n} rounds)",
        bytes / 1024
    );
    println!(
        "  floor: build and serialise one request       {:>9.1} µs",
        us(floor)
    );
    println!(
        "  compaction: plan, views, count, journal      {:>9.1} µs",
        us(compaction)
    );
    println!(
        "  ratio compaction / floor                     {:>9.2}",
        compaction.as_secs_f64() / floor.as_secs_f64().max(1e-9)
    );
    Ok(())
}
