//! The loop's view of the tools: a list of specs and one way to call them.
//!
//! [`ToolHost`] is the loop's narrow view of the shared tool registry
//! ([`berth_tools::Registry`]): name, description, JSON schema; one dispatch
//! with a cancel token; an *ask* verdict deferred to the caller as a pending
//! approval. [`RegistryTools`] is that view: every call the model makes goes
//! through the registry's one dispatch path (validation, the gate, file rules,
//! the event log, redaction, output bounds), exactly as an MCP call does.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use berth_core::backend::BackendKind;
use berth_core::runtime::Runtime;
use berth_tools::{ApprovalMode, Dispatch, OutcomeKind, Registry, ToolContext};

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON schema of its arguments (an object schema).
    pub input_schema: Value,
}

/// What a call came to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolOutcome {
    /// It ran (or was refused): `text` goes to the model.
    Done {
        /// The result for the model, bounded and redacted.
        text: String,
        /// It failed or was refused.
        is_error: bool,
        /// Facts for the journal and `--json`: exit code, bytes, spool path...
        detail: Value,
    },
    /// The policy asked a person: the call waits on this approval.
    NeedsApproval {
        /// The approval's id (`berth approve ID`).
        approval: i64,
        /// What asked and why.
        reason: String,
    },
}

impl ToolOutcome {
    /// A refusal or failure with this text.
    pub fn error(text: impl Into<String>) -> Self {
        ToolOutcome::Done {
            text: text.into(),
            is_error: true,
            detail: Value::Null,
        }
    }
}

/// The tools the loop may call.
// ?Send: the session engine's futures hold process handles that are not
// Sync, and berth drives a run on one thread.
#[async_trait(?Send)]
pub trait ToolHost: Send + Sync {
    /// Every tool, in a fixed order (the prompt must not change between steps).
    fn specs(&self) -> Vec<ToolSpec>;
    /// Run one call whose arguments already match its schema. `cancel`
    /// interrupts it (the command's process tree is killed).
    async fn call(&self, name: &str, args: &Value, cancel: CancellationToken) -> ToolOutcome;
    /// A short line for people: what this call will do, where.
    fn describe(&self, name: &str, args: &Value) -> String {
        format!("{name} {args}")
    }
}

/// The shared tool registry, in one sandbox, as the loop's [`ToolHost`].
pub struct RegistryTools {
    rt: Arc<Runtime>,
    registry: Arc<Registry>,
    dispatch: Arc<dyn Dispatch>,
    backend: BackendKind,
    sandbox: String,
    session: Option<String>,
}

impl RegistryTools {
    /// The registry's tools in `sandbox` on `backend`.
    pub fn new(rt: Arc<Runtime>, backend: BackendKind, sandbox: &str) -> Self {
        let registry = Arc::new(Registry::new(&rt).with_history(Arc::new(crate::history::Journal)));
        Self {
            dispatch: registry.clone(),
            registry,
            rt,
            backend,
            sandbox: sandbox.into(),
            session: None,
        }
    }

    /// The same tools, running commands in this session of the sandbox
    /// (a sub-agent's own).
    pub fn in_session(mut self, session: Option<String>) -> Self {
        self.session = session;
        self
    }

    /// The same tools, run by `dispatch` (a `berth serve` the front end is
    /// attached to) instead of this process's registry.
    pub fn dispatched_by(mut self, dispatch: Arc<dyn Dispatch>) -> Self {
        self.dispatch = dispatch;
        self
    }
}

#[async_trait(?Send)]
impl ToolHost for RegistryTools {
    fn specs(&self) -> Vec<ToolSpec> {
        self.registry
            .specs()
            .into_iter()
            .map(|s| ToolSpec {
                name: s.name,
                description: s.description,
                input_schema: s.input_schema,
            })
            .collect()
    }

    async fn call(&self, name: &str, args: &Value, cancel: CancellationToken) -> ToolOutcome {
        // An ask pauses the run durably instead of holding berth open.
        let mut ctx = ToolContext::new(self.rt.clone(), self.backend, &self.sandbox)
            .with_cancel(cancel)
            .with_approval(ApprovalMode::Defer);
        if let Some(s) = &self.session {
            ctx = ctx.with_session(s);
        }
        let o = self.dispatch.dispatch(&ctx, name, args.clone()).await;
        if let OutcomeKind::AwaitingApproval { id } = o.kind {
            return ToolOutcome::NeedsApproval {
                approval: id,
                reason: o.text,
            };
        }
        let mut detail = match o.data {
            Value::Object(m) => Value::Object(m),
            Value::Null => json!({}),
            other => json!({ "data": other }),
        };
        detail["call_id"] = json!(o.call_id);
        detail["outcome"] = json!(o.kind.name());
        if let Some(spool) = &o.spool {
            detail["spool"] = json!(spool);
        }
        let mut text = o.text;
        if matches!(o.kind, OutcomeKind::Cancelled) {
            // Only a person's Ctrl-C cancels a run's tool call.
            detail["interrupted"] = json!(true);
            text.push_str("\n[berth: interrupted by the user]");
        }
        ToolOutcome::Done {
            text,
            is_error: o.is_error,
            detail,
        }
    }

    fn describe(&self, name: &str, args: &Value) -> String {
        let str_arg = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or("");
        let what = match name {
            "terminal" => format!("$ {}", str_arg("command")),
            "read_file" => format!("read {}", str_arg("path")),
            "write_file" => format!(
                "write {} ({} bytes)",
                str_arg("path"),
                str_arg("content").len()
            ),
            "edit_file" => format!("edit {}", str_arg("path")),
            "process" => format!("process {} {}", str_arg("action"), str_arg("job_id")),
            other => other.to_string(),
        };
        format!(
            "{} [{}/{}]",
            self.rt.redact(&what),
            self.backend,
            self.sandbox
        )
    }
}
