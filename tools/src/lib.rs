//! berth-tools: the tool registry and the tools, and the memory they share
//! with the agent loop.
//!
//! The tool registry: every tool an agent can call, defined once, and one
//! dispatch path that every call takes, whoever the caller is (`berth mcp`,
//! `berth run`).
//!
//! # Flow at a glance, for one [`Registry::dispatch`]
//! 1. find the tool by name (unknown: [`OutcomeKind::UnknownTool`]);
//! 2. parse the JSON arguments into the tool's typed struct; a wrong type, a
//!    missing or an unknown field is [`OutcomeKind::InvalidArgs`] with a message
//!    that names the field;
//! 3. write `tool.started` to the event log (tool name, redacted arguments);
//! 4. run the handler. It applies the gate for its kind of work: command rules
//!    and approvals for `terminal` (and so for background jobs), file rules and
//!    approvals for the file tools, the policy's switch for `sandbox`. Text sent
//!    to a job's stdin is data for the job's program, not shell, and is not
//!    judged by command rules. While it runs, progress reports go
//!    to the context's sink every few seconds, and the context's cancellation
//!    token interrupts it;
//! 5. redact the text and bound it to the sandbox's output cap, for every tool
//!    alike, files included; what was cut is spooled to a file whose path the
//!    outcome carries;
//! 6. write `tool.finished` (kind, error flag, bytes, duration).
//!
//! # The public API (stable: front ends code against it)
//! - [`Registry::new`] builds the registry for a runtime's policy;
//!   [`Registry::specs`] lists the tools as [`ToolSpec`]s (name, description,
//!   JSON schema derived with schemars from the typed argument structs in
//!   [`args`]), in a fixed order and byte-identical on every call, so a
//!   provider's prompt cache keeps hitting.
//! - [`Registry::dispatch`]`(ctx, name, args) -> ToolOutcome` runs one call.
//! - [`ToolContext`] says where and how: the runtime, backend and sandbox, a
//!   cancellation token, an optional [`ProgressSink`], and the
//!   [`ApprovalMode`]: [`ApprovalMode::Wait`] (MCP: an *ask* waits for
//!   `berth approve` until the policy's approval timeout) or
//!   [`ApprovalMode::Defer`] (the agent loop: an *ask* returns at once with
//!   [`OutcomeKind::AwaitingApproval`] and the approval's id; dispatching the same
//!   call again after `berth approve ID` runs it, after `berth deny ID` returns
//!   [`OutcomeKind::Denied`]).
//! - [`ToolOutcome`]: `text` for the model, `is_error`, a machine-readable
//!   [`OutcomeKind`], `data` (structured facts: exit code, cwd, job id, …), the
//!   `call_id` in the event log, and `spool` when output was cut.

// Handlers return the outcome itself as their error: it is made once per
// call and handed back as is, so boxing it would buy nothing.
#![allow(clippy::result_large_err)]

pub mod args;
mod error;
pub use error::{Error, Result};
mod files;
mod jobs;
pub mod memory;
mod memory_tools;
mod output;
mod sandboxes;
mod terminal;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use berth_core::backend::BackendKind;
use berth_core::events::EventKind;
use berth_core::runtime::{Runtime, new_call_id};
use berth_core::store::Event;

/// How often a running call reports progress, and when it first does.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// One tool as a model sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, what persists, what a timeout does.
    pub description: String,
    /// JSON schema of its arguments (an object schema).
    pub input_schema: Value,
}

/// What an *ask* verdict does to a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApprovalMode {
    /// Wait for `berth approve`/`deny` until the policy's approval timeout.
    #[default]
    Wait,
    /// Return at once with [`OutcomeKind::AwaitingApproval`]; the caller pauses
    /// and dispatches the same call again once the approval is answered.
    Defer,
}

/// A progress report of a running call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Time since the call started.
    pub elapsed: Duration,
    /// Output bytes so far (commands).
    pub bytes: u64,
    /// Set while the call waits for this approval.
    pub awaiting_approval: Option<i64>,
    /// One line for a person.
    pub message: String,
}

/// Where progress reports go.
pub type ProgressSink = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Where and how a call runs.
#[derive(Clone)]
pub struct ToolContext {
    /// The runtime every tool works through.
    pub runtime: Arc<Runtime>,
    /// Backend of the sandbox the tools act on.
    pub backend: BackendKind,
    /// The sandbox the tools act on.
    pub sandbox: String,
    /// The sandbox's session `terminal` runs in unless a call names another.
    pub session: String,
    /// Cancel to interrupt the call (a command's whole process tree is stopped;
    /// the session stays usable).
    pub cancel: CancellationToken,
    /// Told every [`PROGRESS_EVERY`] while a call runs.
    pub progress: Option<ProgressSink>,
    /// What an *ask* verdict does.
    pub approval: ApprovalMode,
}

impl ToolContext {
    /// A context for `sandbox` on `backend`: a fresh cancellation token, no
    /// progress sink, approvals waited for.
    pub fn new(runtime: Arc<Runtime>, backend: BackendKind, sandbox: &str) -> Self {
        Self {
            runtime,
            backend,
            sandbox: sandbox.into(),
            session: berth_core::runtime::MAIN_SESSION.into(),
            cancel: CancellationToken::new(),
            progress: None,
            approval: ApprovalMode::Wait,
        }
    }

    /// The same context running commands in this session of the sandbox.
    pub fn with_session(mut self, session: &str) -> Self {
        self.session = session.into();
        self
    }

    /// The same context with this cancellation token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// The same context reporting progress to `sink`.
    pub fn with_progress(mut self, sink: ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }

    /// The same context with this approval mode.
    pub fn with_approval(mut self, mode: ApprovalMode) -> Self {
        self.approval = mode;
        self
    }
}

/// What became of a call, for programs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutcomeKind {
    /// It ran (a command that exited non-zero still ran: see `data.exit_code`).
    Ok,
    /// It failed (a missing file, a gone sandbox, …); the text says why.
    Error,
    /// A policy refused it.
    Denied {
        /// The rule that refused.
        rule: String,
    },
    /// It waits for a person's approval ([`ApprovalMode::Defer`] only).
    AwaitingApproval {
        /// The approval's id, for `berth approve ID`.
        id: i64,
    },
    /// The caller cancelled it.
    Cancelled,
    /// It hit its timeout; its processes were stopped.
    TimedOut,
    /// The arguments do not fit the tool's schema.
    InvalidArgs,
    /// No tool has that name.
    UnknownTool,
}

impl OutcomeKind {
    /// The kind's name as in JSON: `ok`, `denied`, `timed_out`, …
    pub fn name(&self) -> &'static str {
        match self {
            OutcomeKind::Ok => "ok",
            OutcomeKind::Error => "error",
            OutcomeKind::Denied { .. } => "denied",
            OutcomeKind::AwaitingApproval { .. } => "awaiting_approval",
            OutcomeKind::Cancelled => "cancelled",
            OutcomeKind::TimedOut => "timed_out",
            OutcomeKind::InvalidArgs => "invalid_args",
            OutcomeKind::UnknownTool => "unknown_tool",
        }
    }
}

/// What a call returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolOutcome {
    /// The call's id in the event log.
    pub call_id: String,
    /// Text for the model: redacted, ANSI-free, bounded.
    pub text: String,
    /// True unless the call ran ([`OutcomeKind::Ok`]) or waits for an approval.
    pub is_error: bool,
    /// What became of it.
    pub kind: OutcomeKind,
    /// Structured facts (exit code, cwd, job id, byte counts, …), redacted.
    pub data: Value,
    /// Where the whole text was spooled when `text` had to be cut.
    pub spool: Option<PathBuf>,
}

impl ToolOutcome {
    /// An outcome of `kind` with `text` and no data.
    pub(crate) fn new(kind: OutcomeKind, text: impl Into<String>) -> Self {
        let is_error = !matches!(kind, OutcomeKind::Ok | OutcomeKind::AwaitingApproval { .. });
        ToolOutcome {
            call_id: String::new(),
            text: text.into(),
            is_error,
            kind,
            data: Value::Null,
            spool: None,
        }
    }

    pub(crate) fn ok(text: impl Into<String>, data: Value) -> Self {
        ToolOutcome {
            data,
            ..Self::new(OutcomeKind::Ok, text)
        }
    }

    pub(crate) fn error(text: impl Into<String>) -> Self {
        Self::new(OutcomeKind::Error, text)
    }

    pub(crate) fn invalid(text: impl Into<String>) -> Self {
        Self::new(OutcomeKind::InvalidArgs, text)
    }

    pub(crate) fn with_data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }
}

impl From<berth_core::Error> for ToolOutcome {
    fn from(e: berth_core::Error) -> Self {
        match e {
            berth_core::Error::Denied { ref rule, .. } => {
                ToolOutcome::new(OutcomeKind::Denied { rule: rule.clone() }, e.to_string())
            }
            berth_core::Error::InvalidInput(m) => ToolOutcome::invalid(m),
            other => ToolOutcome::error(other.full_text()),
        }
    }
}

impl From<Error> for ToolOutcome {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(e) => e.into(),
            e => ToolOutcome::invalid(e.to_string()),
        }
    }
}

/// The tools, in the order [`Registry::specs`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tool {
    Terminal,
    Process,
    ReadFile,
    WriteFile,
    EditFile,
    Sandbox,
    Memory,
    HistorySearch,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Terminal => "terminal",
            Tool::Process => "process",
            Tool::ReadFile => "read_file",
            Tool::WriteFile => "write_file",
            Tool::EditFile => "edit_file",
            Tool::Sandbox => "sandbox",
            Tool::Memory => "memory",
            Tool::HistorySearch => "history_search",
        }
    }
}

/// A running call's shared counters, for progress reports.
#[derive(Default)]
pub(crate) struct Live {
    /// Output bytes so far.
    pub bytes: AtomicU64,
    /// The approval the call waits for, or 0.
    pub approval: AtomicI64,
}

/// One call as a handler sees it.
pub(crate) struct Call<'a> {
    pub ctx: &'a ToolContext,
    pub id: String,
    pub live: Arc<Live>,
    pub history: Option<&'a dyn memory::History>,
}

/// Runs tool calls: the [`Registry`] itself in this process, or a front
/// end's link to a `berth serve` that runs them in its registry (so an agent
/// and a person at the CLI share one warm session).
#[async_trait]
pub trait Dispatch: Send + Sync {
    /// Run one call as [`Registry::dispatch`] does.
    async fn dispatch(&self, ctx: &ToolContext, name: &str, args: Value) -> ToolOutcome;
}

#[async_trait]
impl Dispatch for Registry {
    async fn dispatch(&self, ctx: &ToolContext, name: &str, args: Value) -> ToolOutcome {
        Registry::dispatch(self, ctx, name, args).await
    }
}

/// The tools and their specs, built once.
pub struct Registry {
    tools: Vec<(Tool, ToolSpec)>,
    /// The search over past runs, where a front end gave one.
    history: Option<Arc<dyn memory::History>>,
}

impl Registry {
    /// The registry for `runtime`'s policy: the `sandbox` tool only when the
    /// policy's `[tools] sandbox = true`, the memory tools unless its
    /// `[tools] memory = "off"`.
    pub fn new(runtime: &Runtime) -> Registry {
        let sandbox_tool = runtime.gate().is_some_and(|g| g.policy().tools.sandbox);
        let mut tools = vec![
            Tool::Terminal,
            Tool::Process,
            Tool::ReadFile,
            Tool::WriteFile,
            Tool::EditFile,
        ];
        if sandbox_tool {
            tools.push(Tool::Sandbox);
        }
        if memory_tools::access(runtime) != berth_policies::MemoryAccess::Off {
            tools.push(Tool::Memory);
        }
        Registry {
            tools: tools.into_iter().map(|t| (t, args::spec(t))).collect(),
            history: None,
        }
    }

    /// Offer `history_search` over `history` (the agent's journal, which
    /// keeps the runs), where the memory tools are on.
    pub fn with_history(mut self, history: Arc<dyn memory::History>) -> Registry {
        if self.tools.iter().any(|(t, _)| *t == Tool::Memory) {
            self.tools
                .push((Tool::HistorySearch, args::spec(Tool::HistorySearch)));
            self.history = Some(history);
        }
        self
    }

    /// Every tool, in a fixed order; the same bytes on every call.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|(_, s)| s.clone()).collect()
    }

    /// Run one tool call: validate, gate, log, run, redact, bound. Never panics
    /// and never fails: every problem is an outcome the model can read.
    pub async fn dispatch(&self, ctx: &ToolContext, name: &str, args: Value) -> ToolOutcome {
        let call_id = new_call_id();
        let Some((tool, _)) = self.tools.iter().find(|(_, s)| s.name == name) else {
            let names: Vec<&str> = self.tools.iter().map(|(t, _)| t.name()).collect();
            let mut o = ToolOutcome::new(
                OutcomeKind::UnknownTool,
                format!(
                    "unknown tool `{}`; the tools are: {}",
                    output::clip(name, 100),
                    names.join(", ")
                ),
            );
            o.call_id = call_id;
            return o;
        };
        let tool = *tool;
        let rt = &ctx.runtime;
        let started = Instant::now();
        // Masked before the clip: a clip through a secret would leave its
        // first part unrecognised, and in clear.
        let args_text = output::clip(
            &berth_core::gate::redact_json(&args, &|t| rt.redact(t)).to_string(),
            4096,
        );
        let started_event = Event {
            kind: EventKind::ToolStarted,
            call_id: Some(call_id.clone()),
            backend: Some(ctx.backend),
            sandbox: Some(ctx.sandbox.clone()),
            command: Some(format!("{} {}", tool.name(), output::clip(&args_text, 200))),
            detail: Some(json!({ "tool": tool.name(), "args": args_text }).to_string()),
            ..Default::default()
        };
        if let Err(e) = rt.store().append(&started_event) {
            tracing::warn!(call = %call_id, error = %e, "could not record a tool call");
        }
        let call = Call {
            ctx,
            id: call_id.clone(),
            live: Arc::new(Live::default()),
            history: self.history.as_deref(),
        };
        let mut outcome = self.run_with_progress(tool, &call, args, started).await;
        outcome.call_id = call_id.clone();
        output::finish(rt, &ctx.sandbox, &call_id, &mut outcome);
        let finished = Event {
            kind: EventKind::ToolFinished,
            call_id: Some(call_id.clone()),
            backend: Some(ctx.backend),
            sandbox: Some(ctx.sandbox.clone()),
            command: Some(tool.name().into()),
            duration_ms: Some(started.elapsed().as_millis() as i64),
            bytes_out: Some(outcome.text.len() as i64),
            exit_code: outcome.data.get("exit_code").and_then(Value::as_i64),
            detail: Some(
                json!({
                    "tool": tool.name(),
                    "outcome": outcome.kind,
                    "is_error": outcome.is_error,
                    "spool": outcome.spool,
                })
                .to_string(),
            ),
            ..Default::default()
        };
        if let Err(e) = rt.store().append(&finished) {
            tracing::warn!(call = %call_id, error = %e, "could not record the end of a tool call");
        }
        outcome
    }

    /// Parse and run, reporting progress meanwhile and honouring cancellation.
    async fn run_with_progress(
        &self,
        tool: Tool,
        call: &Call<'_>,
        args: Value,
        started: Instant,
    ) -> ToolOutcome {
        let work = run(tool, call, args);
        tokio::pin!(work);
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        let cancel = call.ctx.cancel.clone();
        let mut cancelled_at: Option<Instant> = None;
        loop {
            tokio::select! {
                o = &mut work => return o,
                _ = ticks.tick() => {
                    if let Some(sink) = &call.ctx.progress {
                        sink(&progress(call, started));
                    }
                }
                // A terminal command notices the token itself and stops its
                // tree; anything else (and a command that does not come back
                // in time) is dropped.
                _ = cancel.cancelled(), if cancelled_at.is_none() => {
                    if tool != Tool::Terminal {
                        return ToolOutcome::new(OutcomeKind::Cancelled, "cancelled by the caller");
                    }
                    cancelled_at = Some(Instant::now());
                }
                _ = tokio::time::sleep(CANCEL_GRACE), if cancelled_at.is_some() => {
                    return ToolOutcome::new(
                        OutcomeKind::Cancelled,
                        "cancelled by the caller (the command did not stop in time; the session will be replaced if needed)",
                    );
                }
            }
        }
    }
}

/// How long a cancelled command may take to stop before the call gives up on it.
const CANCEL_GRACE: Duration = Duration::from_secs(15);

fn progress(call: &Call<'_>, started: Instant) -> Progress {
    let elapsed = started.elapsed();
    let bytes = call.live.bytes.load(Ordering::Relaxed);
    let approval = call.live.approval.load(Ordering::Relaxed);
    let awaiting_approval = (approval > 0).then_some(approval);
    let message = match awaiting_approval {
        Some(id) => format!(
            "waiting {}s for approval #{id}: run `berth approve {id}` or `berth deny {id}`",
            elapsed.as_secs()
        ),
        None => format!(
            "running for {}s, {bytes} bytes of output so far",
            elapsed.as_secs()
        ),
    };
    Progress {
        elapsed,
        bytes,
        awaiting_approval,
        message,
    }
}

async fn run(tool: Tool, call: &Call<'_>, raw: Value) -> ToolOutcome {
    match tool {
        Tool::Terminal => match args::parse(raw) {
            Ok(a) => terminal::run(call, a).await,
            Err(o) => o,
        },
        Tool::Process => match args::parse(raw) {
            Ok(a) => jobs::run(call, a).await,
            Err(o) => o,
        },
        Tool::ReadFile => match args::parse(raw) {
            Ok(a) => files::read(call, a).await,
            Err(o) => o,
        },
        Tool::WriteFile => match args::parse(raw) {
            Ok(a) => files::write(call, a).await,
            Err(o) => o,
        },
        Tool::EditFile => match args::parse(raw) {
            Ok(a) => files::edit(call, a).await,
            Err(o) => o,
        },
        Tool::Sandbox => match args::parse(raw) {
            Ok(a) => sandboxes::run(call, a).await,
            Err(o) => o,
        },
        Tool::Memory => match args::parse(raw) {
            Ok(a) => memory_tools::run(call, a),
            Err(o) => o,
        },
        Tool::HistorySearch => match args::parse(raw) {
            Ok(a) => memory_tools::history(call, a),
            Err(o) => o,
        },
    }
}
