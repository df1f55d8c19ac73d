//! The loop: a bounded state machine over a journaled transcript.
//!
//! Flow at a glance, for [`Agent::run`]:
//! 1. load the run's transcript and frozen setup from the journal;
//! 2. settle the last model turn's tool calls that have no result yet: a call
//!    journaled *started* but never *finished* (berth was killed under it) is
//!    reported to the model as cut off, never rerun; a call waiting on an
//!    approval runs once approved, is refused once denied, or pauses the run;
//!    any other is validated, journaled started, run, journaled finished;
//! 3. stop at a final answer; when a budget is spent, make one last call with
//!    tools off for a summary;
//! 4. otherwise fit the transcript to the model's context window (compacting
//!    it if it would pass the threshold, see [`compact`]), ask the model (with
//!    failover; a refusal for size compacts harder and retries once), journal
//!    its turn, and go to 2.
//!
//! Every exit writes its reason to the run: `done`, `budget_spent`,
//! `interrupted`, `awaiting_approval`, `provider_failed` or `error`.

pub mod checkpoint;
mod compact;
pub mod delegate;
mod settle;
pub mod wait;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::host::{ToolHost, ToolOutcome, ToolSpec};
use super::journal::{self, RunState, StepRow};
use super::provider::{
    Attempt, Failover, Message, ProviderConfig, ProviderError, Request, Role, Stop, ToolChoice,
    Usage,
};
use super::validate;
use crate::error::{Error, Result};
use berth_core::approvals::{self, ApprovalState};
use berth_core::backend::BackendKind;
use berth_core::store::{Store, now_ms};

/// The largest tool result a model is sent, in bytes; the rest is elided in
/// the middle (head and tail kept, with the exact count left out).
const RESULT_LIMIT: usize = 48 * 1024;
/// How often a waiting run (`--wait`) re-reads its approval.
const APPROVAL_POLL: Duration = Duration::from_millis(200);

/// What a run may spend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Model calls.
    pub max_steps: Option<u32>,
    /// Input plus output tokens, over all steps.
    pub max_tokens: Option<u64>,
    /// Money, at the providers' configured prices.
    pub max_cost: Option<f64>,
}

/// The part of a run that must not change between its steps: the prompt
/// prefix (for provider caches) and the rules the model was told.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Setup {
    /// The system prompt.
    pub system: String,
    /// The tools, in order, as first sent.
    pub tools: Vec<ToolSpec>,
    /// Tool calls one turn may make.
    pub max_calls_per_turn: usize,
    /// The providers it was started with, without header values (a resume
    /// with no provider flags uses these, refreshed from the config file).
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    /// A sub-agent's own settings (`delegate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<ChildSetup>,
}

/// What a sub-agent keeps of how its parent started it, so a resume carries
/// it on the same way.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChildSetup {
    /// Its budget, carved out of its parent's.
    pub budget: Budget,
    /// Its own shell session in its parent's sandbox.
    #[serde(default)]
    pub session: Option<String>,
    /// The sandbox its new one was made like (backend, sandbox).
    #[serde(default)]
    pub like: Option<(BackendKind, String)>,
    /// Keep its new sandbox when it ends.
    #[serde(default)]
    pub keep_sandbox: bool,
}

/// The system prompt of a new run.
pub fn default_system(backend: BackendKind, sandbox: &str) -> String {
    format!(
        "You are an agent that completes tasks by running tools in the sandbox `{sandbox}` (backend {backend}) through berth.\n\
         - `terminal` runs bash commands in one persistent session: the working directory, exported variables and functions carry over between calls.\n\
         - `read_file` and `write_file` read and write files in the sandbox.\n\
         - A tool result that starts with `[berth:` is berth talking to you: it says what was wrong with a call, or what happened to it.\n\
         Work step by step, check your results, and when the task is done answer with a short summary and no tool call."
    )
}

/// The system prompt's line on the memory tools, when the run has them.
const MEMORY_HINT: &str = "\n- `memory` keeps notes for later runs (how to build and test here, what failed and why); `history_search` finds words in past runs' transcripts, and in tool results dropped from your context.";

/// What the loop tells its front end, in order. `--json` prints these, one per line.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// A run starts or resumes.
    Run {
        /// Its id.
        run_id: String,
        /// Resumed rather than new.
        resumed: bool,
        /// Backend.
        backend: BackendKind,
        /// Sandbox.
        sandbox: String,
    },
    /// A model call starts.
    Step {
        /// 1-based.
        step: i64,
        /// The budget's summarising call.
        summary: bool,
    },
    /// Model text as it arrives.
    Text {
        /// The new piece.
        delta: String,
    },
    /// A provider failed or was skipped; the next is tried.
    Failover {
        /// What happened.
        #[serde(flatten)]
        attempt: Attempt,
    },
    /// A model call ended.
    StepEnd {
        /// 1-based.
        step: i64,
        /// Who answered.
        provider: String,
        /// Tokens.
        usage: Usage,
        /// Tool calls it made.
        tool_calls: usize,
        /// Wall time of the call.
        duration_ms: u64,
    },
    /// A tool call starts.
    ToolCall {
        /// The step that made it.
        step: i64,
        /// The provider's id.
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments (redacted).
        args: Value,
        /// A line for people.
        describe: String,
    },
    /// A call was refused before running, or waits for a person.
    Verdict {
        /// The call.
        call_id: String,
        /// `invalid`, `ask`, `denied`, `cut_off`.
        verdict: String,
        /// Why.
        detail: String,
        /// The approval to answer, for `ask`.
        #[serde(skip_serializing_if = "Option::is_none")]
        approval: Option<i64>,
    },
    /// A call ended.
    Result {
        /// The call.
        call_id: String,
        /// It failed or was refused.
        is_error: bool,
        /// Bytes of result text sent to the model.
        bytes: usize,
        /// Facts: exit code, output size, spool path.
        detail: Value,
        /// Wall time.
        duration_ms: u64,
    },
    /// The transcript sent from now on was compacted (the journal keeps
    /// every message).
    Compaction {
        /// The step whose request it shaped.
        step: i64,
        /// `mask`, `summary` or `rotate`.
        stage: crate::context::Stage,
        /// The transcript segment from now on.
        segment: i64,
        /// Estimated tokens of the request before.
        tokens_before: u64,
        /// And after.
        tokens_after: u64,
        /// The window it was fitted to.
        window: u64,
        /// The summary of the elided steps.
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// What went wrong on the way.
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// The sandbox was checkpointed after a step (0: before the first), or
    /// could not be.
    Checkpoint {
        /// The step.
        step: i64,
        /// The checkpoint's id.
        #[serde(skip_serializing_if = "Option::is_none")]
        checkpoint: Option<String>,
        /// Files and links stored anew.
        changed: i64,
        /// Their bytes.
        new_bytes: i64,
        /// How long it took.
        took_ms: i64,
        /// Why there is none.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Something a sub-agent did (`delegate`): its own event, wrapped.
    Child {
        /// The run that delegated.
        parent: String,
        /// The sub-agent's run.
        run_id: String,
        /// What it did.
        event: Box<AgentEvent>,
    },
    /// The run stopped.
    Exit {
        /// Its id.
        run_id: String,
        /// `done`, `budget_spent`, ...
        reason: RunState,
        /// Words on why.
        #[serde(skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// Model calls so far.
        steps: i64,
        /// Tokens so far.
        usage: Usage,
        /// The final answer, when there is one.
        #[serde(skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
    },
}

/// Where the loop stops, when it must: the reason, words on why, the answer.
type Stopped = Option<(RunState, Option<String>, Option<String>)>;

/// Receives the loop's events.
pub type EventSink = Arc<dyn Fn(&AgentEvent) + Send + Sync>;
/// Masks secrets in text bound for the journal and the front end.
pub type Redact = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// How a run ended.
#[derive(Clone, Debug, Serialize)]
pub struct Exit {
    /// The run.
    pub run_id: String,
    /// Why.
    pub reason: RunState,
    /// Words on why.
    pub detail: Option<String>,
}

/// The agent: providers, tools and the journal, driving runs.
pub struct Agent {
    store: Arc<Store>,
    host: Arc<dyn ToolHost>,
    failover: Failover,
    budget: Budget,
    wait_approvals: bool,
    events: EventSink,
    redact: Redact,
    memory_tokens: u64,
    delegation: Option<delegate::Delegation>,
    checkpoints: Option<Arc<dyn checkpoint::StepCheckpoints>>,
}

/// How many tokens of memory notes a new run's system prompt carries unless
/// told otherwise.
pub const MEMORY_TOKENS: u64 = 1000;

struct Totals {
    steps: i64,
    usage: Usage,
    cost: f64,
}

impl Agent {
    /// An agent over these parts.
    pub fn new(
        store: Arc<Store>,
        host: Arc<dyn ToolHost>,
        failover: Failover,
        budget: Budget,
        events: EventSink,
        redact: Redact,
    ) -> Self {
        Self {
            store,
            host,
            failover,
            budget,
            wait_approvals: false,
            events,
            redact,
            memory_tokens: MEMORY_TOKENS,
            delegation: None,
            checkpoints: None,
        }
    }

    /// Give a new run's system prompt at most `tokens` of memory notes (0: none).
    pub fn with_memory_tokens(mut self, tokens: u64) -> Self {
        self.memory_tokens = tokens;
        self
    }

    /// Wait for approvals instead of pausing the run.
    pub fn wait_for_approvals(mut self, yes: bool) -> Self {
        self.wait_approvals = yes;
        self
    }

    /// Start a run of `task` (journaled; [`Agent::run`] carries it out).
    /// Its system prompt ends with the newest memory notes the sandbox sees,
    /// frozen with the rest of the setup: notes added later reach later runs.
    pub fn start(&self, task: &str, backend: BackendKind, sandbox: &str) -> Result<String> {
        let mut tools = self.host.specs();
        let mut system = default_system(backend, sandbox);
        if self.may_delegate(0) {
            tools.push(delegate::spec());
            system.push_str(delegate::DELEGATE_HINT);
        }
        tools.push(wait::spec());
        if tools.iter().any(|t| t.name == "memory") {
            system.push_str(MEMORY_HINT);
            if let Some(notes) =
                crate::notes::prompt_section(&self.store, backend, sandbox, self.memory_tokens)?
            {
                system.push_str("\n\n");
                system.push_str(&notes);
            }
        }
        let setup = Setup {
            system,
            tools,
            max_calls_per_turn: 8,
            providers: self
                .failover
                .providers()
                .iter()
                .map(|p| ProviderConfig {
                    headers: Default::default(),
                    ..p.clone()
                })
                .collect(),
            child: None,
        };
        let id = journal::new_run_id();
        let setup = serde_json::to_value(&setup).map_err(|e| Error::journal("a run's setup", e))?;
        journal::create(
            &self.store,
            &id,
            task,
            backend,
            sandbox,
            &setup,
            journal::Link::None,
        )?;
        journal::append_message(&self.store, &id, 0, &Message::user(task))?;
        Ok(id)
    }

    /// A new run from run `from`'s transcript through step `at` (its model
    /// turn and that turn's tool results). Its commands run in the sandbox as
    /// it is now.
    pub fn fork(store: &Store, from: &str, at: i64) -> Result<String> {
        let Some(parent) = journal::run(store, from)? else {
            return Err(not_found(from));
        };
        let msgs = journal::messages(store, from)?;
        let last = msgs.iter().map(|(s, _)| *s).max().unwrap_or(0);
        if at < 1 || at > last {
            return Err(Error::NoSuchStep {
                run: from.into(),
                last,
            });
        }
        let id = journal::new_run_id();
        journal::create(
            store,
            &id,
            &parent.task,
            parent.backend,
            &parent.sandbox,
            &parent.setup,
            journal::Link::Fork { from, at },
        )?;
        for (s, m) in msgs.iter().filter(|(s, _)| *s <= at) {
            journal::append_message(store, &id, *s, m)?;
        }
        Ok(id)
    }

    /// Add a person's message to a run (a chat turn).
    pub fn say(&self, run: &str, text: &str) -> Result<()> {
        let step = journal::messages(&self.store, run)?
            .last()
            .map(|(s, _)| *s)
            .unwrap_or(0);
        journal::append_message(&self.store, run, step, &Message::user(text))
    }

    /// Carry run `id` forward until it stops. `cancel` is Ctrl-C.
    pub async fn run(&mut self, id: &str, cancel: &CancellationToken) -> Result<Exit> {
        let Some(row) = journal::run(&self.store, id)? else {
            return Err(not_found(id));
        };
        let setup: Setup = serde_json::from_value(row.setup.clone())
            .map_err(|e| Error::journal(format!("run {id}: its setup"), e))?;
        journal::claim(&self.store, id)?;
        let mut msgs = journal::messages(&self.store, id)?;
        // A person's wait (`--on`): what happened is the next thing said.
        if let Some(w) = crate::waits::of_run(&self.store, id)?
            && w.call_id.is_none()
        {
            if let Some(o) = &w.outcome {
                let step = msgs.last().map(|(s, _)| *s).unwrap_or(0);
                let m = Message::user(format!(
                    "[berth: the run waited as asked, and {}. Carry on with the task.]",
                    crate::waits::describe(o)
                ));
                journal::append_message(&self.store, id, step, &m)?;
                msgs.push((step, m));
            }
            crate::waits::done(&self.store, id)?;
        }
        let resumed = msgs.iter().any(|(_, m)| m.role != Role::User);
        (self.events)(&AgentEvent::Run {
            run_id: id.into(),
            resumed,
            backend: row.backend,
            sandbox: row.sandbox.clone(),
        });
        // A run that spent its budget and is resumed (with a new one) carries on.
        if row.state == RunState::BudgetSpent
            && let Some((s, m)) = msgs.last()
            && m.role == Role::Assistant
            && m.tool_calls.is_empty()
        {
            let m = Message::user("[berth: the budget was raised; carry on with the task.]");
            journal::append_message(&self.store, id, *s, &m)?;
            msgs.push((*s, m));
        }
        let steps = journal::steps(&self.store, id)?;
        // What it spent, its sub-agents' spend included.
        let mut totals = delegate::totals_of(&self.store, id)?;
        let mut step = steps
            .iter()
            .map(|s| s.step)
            .chain(msgs.iter().map(|(s, _)| *s))
            .max()
            .unwrap_or(0);
        let result = self
            .drive(id, &setup, &mut msgs, &mut step, &mut totals, cancel)
            .await;
        let (reason, detail, answer) = match result {
            Ok(x) => x,
            Err(e) => (
                RunState::Error,
                Some(berth_core::error::chain_text(&e)),
                None,
            ),
        };
        let detail = detail.map(|d| (self.redact)(&d));
        journal::set_state(&self.store, id, reason, detail.as_deref())?;
        // In the event log: `berth events`, and the server's webhooks.
        self.store.append(&berth_core::store::Event {
            kind: berth_core::events::EventKind::RunEnded,
            backend: Some(row.backend),
            sandbox: Some(row.sandbox.clone()),
            detail: Some(
                json!({
                    "run": id,
                    "state": reason,
                    "reason": detail,
                    "steps": totals.steps,
                    "tokens": totals.usage.total(),
                    "parent": if row.kind.as_deref() == Some("child") { row.parent.clone() } else { None },
                    "task": (self.redact)(&row.task.chars().take(200).collect::<String>()),
                })
                .to_string(),
            ),
            ..Default::default()
        })?;
        (self.events)(&AgentEvent::Exit {
            run_id: id.into(),
            reason,
            detail: detail.clone(),
            steps: totals.steps,
            usage: totals.usage,
            answer,
        });
        Ok(Exit {
            run_id: id.into(),
            reason,
            detail,
        })
    }

    async fn drive(
        &mut self,
        id: &str,
        setup: &Setup,
        msgs: &mut Vec<(i64, Message)>,
        step: &mut i64,
        totals: &mut Totals,
        cancel: &CancellationToken,
    ) -> Result<(RunState, Option<String>, Option<String>)> {
        let mut meter = compact::Meter::new(setup, journal::compactions(&self.store, id)?.pop());
        let meter = &mut meter;
        loop {
            if let Some(stop) = self.settle(id, setup, msgs, cancel).await? {
                return Ok(stop);
            }
            self.checkpoint_step(id, msgs).await;
            // Sub-agents may have spent in the meantime.
            *totals = delegate::totals_of(&self.store, id)?;
            if let Some((_, m)) = msgs.last()
                && m.role == Role::Assistant
            {
                return Ok((RunState::Done, None, Some(m.text.clone())));
            }
            if cancel.is_cancelled() {
                return Ok((
                    RunState::Interrupted,
                    Some("interrupted by the user".into()),
                    None,
                ));
            }
            let spent = self.spent(totals);
            if let Some(why) = &spent {
                let note = Message::user(format!(
                    "[berth: the run's budget is spent ({why}). Tools are off now. Summarise where the task stands: what is done, what is not, and what should happen next.]"
                ));
                journal::append_message(&self.store, id, *step, &note)?;
                msgs.push((*step, note));
            }
            let summary = spent.is_some();
            let mut harder = false;
            let answer = loop {
                let (transcript, tokens) = match self
                    .fit(id, setup, msgs, step, totals, meter, harder, cancel)
                    .await?
                {
                    compact::Fit::Send(t, n) => (t, n),
                    compact::Fit::Stop(stop) => return Ok(stop),
                };
                *step += 1;
                (self.events)(&AgentEvent::Step {
                    step: *step,
                    summary,
                });
                let req = Request {
                    system: &setup.system,
                    messages: &transcript,
                    tools: &setup.tools,
                    tool_choice: if summary {
                        ToolChoice::None
                    } else {
                        ToolChoice::Auto
                    },
                };
                let events = self.events.clone();
                let mut on_text = |t: &str| events(&AgentEvent::Text { delta: t.into() });
                let events = self.events.clone();
                let mut on_retry =
                    |a: &Attempt| events(&AgentEvent::Failover { attempt: a.clone() });
                let started_ms = now_ms();
                let t0 = Instant::now();
                let answer = self
                    .failover
                    .complete(&req, &mut on_text, &mut on_retry, cancel)
                    .await;
                match answer {
                    Ok(a) => break (a, started_ms, t0),
                    Err((ProviderError::Cancelled, _)) => {
                        return Ok((
                            RunState::Interrupted,
                            Some("interrupted by the user while the model was answering".into()),
                            None,
                        ));
                    }
                    Err((ProviderError::TooLarge { message, window }, attempts)) => {
                        let learned = self.failover.learn_refusal(window, tokens);
                        if let Some(a) = attempts.last() {
                            (self.events)(&AgentEvent::Failover { attempt: a.clone() });
                        }
                        if harder {
                            return Ok((
                                RunState::Error,
                                Some(format!(
                                    "step {step}: the provider refused the request for its size twice, the second time after compacting to fit a window of {} tokens: {message}. If its window is smaller than that, set `context_window` (or pass --context-window), then carry on with `berth run --resume {id}`",
                                    learned.map_or("unknown".into(), |w| w.to_string())
                                )),
                                None,
                            ));
                        }
                        // Not the provider's failure: compact harder, once.
                        *step -= 1;
                        harder = true;
                    }
                    Err((e, attempts)) => {
                        let why: Vec<String> = attempts
                            .iter()
                            .map(|a| {
                                format!(
                                    "{} {}: {}",
                                    a.provider,
                                    a.outcome,
                                    a.why.clone().unwrap_or_default()
                                )
                            })
                            .collect();
                        return Ok((
                            RunState::ProviderFailed,
                            Some(format!(
                                "no provider answered step {step}: {e} ({})",
                                why.join("; ")
                            )),
                            None,
                        ));
                    }
                }
            };
            let (answer, started_ms, t0) = answer;
            meter.answered(&answer.turn.usage);
            let provider = &self.failover.providers()[answer.provider];
            let cost = provider.cost(&answer.turn.usage);
            let mut turn = answer.turn;
            if summary {
                // Tools are off: anything it tried to call is not run.
                turn.tool_calls.clear();
            }
            let msg = Message {
                role: Role::Assistant,
                text: turn.text.clone(),
                tool_calls: turn.tool_calls.clone(),
                tool_call_id: None,
                is_error: false,
                // Kept with the message, so a resume validates the same way.
                truncated: turn.stop == Stop::MaxTokens,
            };
            journal::put_step(
                &self.store,
                id,
                &StepRow {
                    step: *step,
                    provider: Some(provider.name.clone()),
                    attempts: answer.attempts,
                    usage: turn.usage,
                    cost,
                    started_ms,
                    ended_ms: now_ms(),
                    summary,
                },
            )?;
            journal::append_message(&self.store, id, *step, &msg)?;
            msgs.push((*step, msg));
            if !summary {
                totals.steps += 1;
            }
            add(&mut totals.usage, &turn.usage);
            totals.cost += cost.unwrap_or(0.0);
            (self.events)(&AgentEvent::StepEnd {
                step: *step,
                provider: provider.name.clone(),
                usage: turn.usage,
                tool_calls: turn.tool_calls.len(),
                duration_ms: t0.elapsed().as_millis() as u64,
            });
            if summary {
                return Ok((RunState::BudgetSpent, spent, Some(turn.text)));
            }
        }
    }

    fn spent(&self, t: &Totals) -> Option<String> {
        if let Some(n) = self.budget.max_steps
            && t.steps >= n as i64
        {
            return Some(format!("{} of {n} steps used", t.steps));
        }
        if let Some(n) = self.budget.max_tokens
            && t.usage.total() >= n
        {
            return Some(format!("{} of {n} tokens used", t.usage.total()));
        }
        if let Some(c) = self.budget.max_cost
            && t.cost >= c
        {
            return Some(format!("cost {:.4} of {c:.4} spent", t.cost));
        }
        None
    }
}

fn interrupted() -> (RunState, Option<String>, Option<String>) {
    (
        RunState::Interrupted,
        Some("interrupted by the user during a tool call".into()),
        None,
    )
}

fn not_found(id: &str) -> Error {
    Error::RunNotFound(id.into())
}

fn add(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cached_input_tokens += u.cached_input_tokens;
    total.cache_write_tokens += u.cache_write_tokens;
}
