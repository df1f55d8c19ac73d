//! Checkpoints of a run's sandbox: one before the first step, then one after
//! each step whose tools may have written, so a fork or a rollback finds the
//! sandbox as that step left it. A step that only read costs nothing; one
//! that wrote little costs what it wrote (see `berth_core::checkpoint`).

use std::sync::Arc;

use async_trait::async_trait;
use berth_core::backend::BackendKind;
use berth_core::checkpoint::record::{self, CheckpointRow};
use berth_core::runtime::Runtime;

use super::{Agent, AgentEvent};
use crate::provider::{Message, Role};

/// Takes a run's checkpoints.
#[async_trait]
pub trait StepCheckpoints: Send + Sync {
    /// Checkpoint the run's sandbox after `step` (0: before the first),
    /// unless that step has one; `None` when it had.
    async fn after_step(&self, run: &str, step: i64) -> Result<Option<CheckpointRow>, String>;
}

/// Checkpoints of one sandbox through the runtime.
pub struct SandboxCheckpoints {
    rt: Arc<Runtime>,
    backend: BackendKind,
    sandbox: String,
}

impl SandboxCheckpoints {
    /// Checkpoints of `sandbox` on `backend`.
    pub fn new(rt: Arc<Runtime>, backend: BackendKind, sandbox: &str) -> Self {
        Self {
            rt,
            backend,
            sandbox: sandbox.into(),
        }
    }
}

#[async_trait]
impl StepCheckpoints for SandboxCheckpoints {
    async fn after_step(&self, run: &str, step: i64) -> Result<Option<CheckpointRow>, String> {
        let had = record::of_run(self.rt.store(), run).map_err(|e| e.full_text())?;
        if had.iter().any(|c| c.step == Some(step)) {
            return Ok(None);
        }
        self.rt
            .checkpoint(self.backend, &self.sandbox, None, Some((run, step)))
            .await
            .map(Some)
            .map_err(|e| e.full_text())
    }
}

/// Whether a call of tool `name` may change the sandbox's files or session.
/// Unknown tools may.
pub fn may_write(name: &str) -> bool {
    !matches!(
        name,
        "read_file" | "memory" | "history_search" | "wait_for" | "sandbox"
    )
}

impl Agent {
    /// Give runs checkpoints of their sandbox.
    pub fn with_checkpoints(mut self, c: Arc<dyn StepCheckpoints>) -> Self {
        self.checkpoints = Some(c);
        self
    }

    /// After the calls of the last step have settled: its checkpoint, if its
    /// tools may have written (or the run's first, before any step). A
    /// checkpoint that fails is reported and the run goes on.
    pub(super) async fn checkpoint_step(&self, id: &str, msgs: &[(i64, Message)]) {
        let Some(c) = &self.checkpoints else { return };
        let step = match msgs.iter().rev().find(|(_, m)| m.role == Role::Assistant) {
            Some((s, m)) if m.tool_calls.iter().any(|t| may_write(&t.name)) => *s,
            Some(_) => return,
            None => 0,
        };
        let event = match c.after_step(id, step).await {
            Ok(None) => return,
            Ok(Some(r)) => AgentEvent::Checkpoint {
                step,
                checkpoint: Some(r.id),
                changed: r.changed,
                new_bytes: r.new_bytes,
                took_ms: r.took_ms,
                error: None,
            },
            Err(e) => AgentEvent::Checkpoint {
                step,
                checkpoint: None,
                changed: 0,
                new_bytes: 0,
                took_ms: 0,
                error: Some((self.redact)(&e)),
            },
        };
        (self.events)(&event);
    }
}
