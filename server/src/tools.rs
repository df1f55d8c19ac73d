//! `berth mcp --server` and `berth run --server`: tool calls run by the
//! berth server, in its registry and on its warm runtime, so an agent and a
//! person at the CLI share one session.
//!
//! Each call connects afresh (a connect and a handshake, well under a
//! millisecond; a server that went idle and exited is started again), sends
//! the call, relays progress, and returns the outcome. Cancelling the call
//! (MCP's `notifications/cancelled`, Ctrl-C in `berth run`) interrupts it in
//! the server, which stops the command's tree and still reports the outcome.

use std::path::PathBuf;

use async_trait::async_trait;
use berth_tools::{ApprovalMode, Dispatch, OutcomeKind, Progress, ToolContext, ToolOutcome};
use serde_json::Value;

use super::Mode;
use super::proto::{InterruptRequest, ToolCall, tool_event};

/// Dispatches tool calls to the berth server of a state dir.
pub struct ServerTools {
    state_dir: PathBuf,
    mode: Mode,
}

impl ServerTools {
    /// Calls go to the server of `state_dir` (started if none runs, unless
    /// `mode` is `require`).
    pub fn new(state_dir: PathBuf, mode: Mode) -> Self {
        ServerTools { state_dir, mode }
    }

    /// Connect now, so a front end fails at its start, not at its first call.
    pub async fn check(&self) -> anyhow::Result<u32> {
        let s = super::client::connect(&self.state_dir, self.mode).await?;
        Ok(s.hello.pid)
    }
}

fn failed(text: String) -> ToolOutcome {
    ToolOutcome {
        call_id: String::new(),
        text,
        is_error: true,
        kind: OutcomeKind::Error,
        data: Value::Null,
        spool: None,
    }
}

#[async_trait]
impl Dispatch for ServerTools {
    async fn dispatch(&self, ctx: &ToolContext, name: &str, args: Value) -> ToolOutcome {
        let mut server = match super::client::connect(&self.state_dir, self.mode).await {
            Ok(s) => s,
            Err(e) => {
                return failed(format!(
                    "cannot reach the berth server: {}",
                    berth_client::error_text(&e)
                ));
            }
        };
        let pid = server.hello.pid;
        let call = ToolCall {
            backend: ctx.backend.as_str().to_string(),
            sandbox: ctx.sandbox.clone(),
            session: ctx.session.clone(),
            name: name.to_string(),
            args_json: args.to_string(),
            defer_approvals: ctx.approval == ApprovalMode::Defer,
            progress: ctx.progress.is_some(),
        };
        let mut stream = match server.client.call_tool(call).await {
            Ok(r) => r.into_inner(),
            Err(s) => {
                return failed(format!(
                    "the berth server (pid {pid}) refused the call: {}",
                    s.message()
                ));
            }
        };
        let mut interrupter = server.client.clone();
        let mut call_id: Option<String> = None;
        let mut interrupted = false;
        loop {
            let next = tokio::select! {
                m = stream.message() => m,
                _ = ctx.cancel.cancelled(), if !interrupted => {
                    interrupted = true;
                    if let Some(id) = call_id.clone() {
                        let _ = interrupter.interrupt(InterruptRequest { call_id: id }).await;
                    }
                    continue;
                }
            };
            let event = match next {
                Ok(Some(m)) => m.event,
                Ok(None) => return lost(pid, "the stream ended without an outcome"),
                Err(s) => return lost(pid, s.message()),
            };
            match event {
                Some(tool_event::Event::Started(id)) => {
                    if interrupted {
                        let _ = interrupter
                            .interrupt(InterruptRequest {
                                call_id: id.clone(),
                            })
                            .await;
                    }
                    call_id = Some(id);
                }
                Some(tool_event::Event::Progress(p)) => {
                    if let (Some(sink), Ok(p)) =
                        (&ctx.progress, serde_json::from_str::<Progress>(&p))
                    {
                        sink(&p);
                    }
                }
                Some(tool_event::Event::Outcome(o)) => {
                    return serde_json::from_str(&o).unwrap_or_else(|e| {
                        failed(format!(
                            "the berth server sent an outcome this berth cannot read: {e}"
                        ))
                    });
                }
                None => {}
            }
        }
    }
}

/// A call whose server died under it: its effect is unknown.
fn lost(pid: u32, why: &str) -> ToolOutcome {
    failed(format!(
        "lost the berth server (pid {pid}) during the call ({why}); it may have run in part or in full. The next call starts a new server, which restores the session from its last snapshot"
    ))
}
