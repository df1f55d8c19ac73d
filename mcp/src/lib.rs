//! `berth mcp`: the tool registry as an MCP server, on the official Rust SDK (rmcp).
//!
//! Flow at a glance:
//! - one [`Registry`] and one [`Runtime`] for the life of the server, so a
//!   command costs one round trip to an already-running shell;
//! - transport: stdio by default ([`stdio`]: bounded lines, and a protocol
//!   error for bytes that are not a JSON-RPC message, never a crash), or
//!   streamable HTTP with `--listen` ([`http`]: bearer token on every request,
//!   loopback unless an address says otherwise);
//! - rmcp runs every request as its own task, so `ping` and other calls are
//!   answered while a command runs; `notifications/cancelled` cancels the
//!   call's token, which stops the command's process tree;
//! - a call with a progress token gets progress notifications (elapsed time,
//!   bytes so far, or the approval it waits for);
//! - [`notify`] reports job completions and watch matches of this sandbox as
//!   logging notifications to every connected client;
//! - nothing but protocol goes to stdout: diagnostics go to stderr.

mod http;
mod notify;
mod stdio;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use berth_core::backend::BackendKind;
use berth_core::runtime::Runtime;
use berth_tools::{Dispatch, OutcomeKind, Progress, ProgressSink, Registry, ToolContext};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;

/// What `berth mcp` was asked for (the CLI parses its flags into this).
#[derive(Debug)]
pub struct Options {
    /// Backend the tools run on.
    pub backend: BackendKind,
    /// Sandbox the tools run in (created on first use if it is `default`).
    pub sandbox: String,
    /// The sandbox's session `terminal` runs in (a call may name another).
    pub session: String,
    /// Serve streamable HTTP on this address instead of stdio.
    pub listen: Option<String>,
    /// A token given on the command line: refused (see the CLI's help).
    pub token: Option<String>,
    /// Read the bearer token for `listen` from this file.
    pub token_file: Option<PathBuf>,
    /// Run the tools in the berth server the CLI uses.
    pub server: bool,
}

/// What every connection of the server shares.
pub(crate) struct Shared {
    rt: Arc<Runtime>,
    /// Runs the calls: this process's registry, or the berth server's.
    dispatch: Arc<dyn Dispatch>,
    /// The server watches jobs itself (`--server`): only read the event log.
    served: bool,
    tools: Vec<Tool>,
    backend: BackendKind,
    sandbox: String,
    session: String,
    notifier: notify::Notifier,
}

/// One client connection's handler.
#[derive(Clone)]
pub(crate) struct BerthServer {
    shared: Arc<Shared>,
}

/// Serve until the client goes (stdio) or the process is stopped (HTTP);
/// `rt` is this process's runtime over state dir `dir`.
pub async fn run(dir: PathBuf, rt: Arc<Runtime>, a: Options) -> Result<u8> {
    berth_core::runtime::check_session_name(&a.session)?;
    let token = if a.listen.is_some() {
        http::given_token(
            a.token.as_deref(),
            a.token_file.as_deref(),
            std::env::var("BERTH_MCP_TOKEN").ok(),
        )?
    } else {
        None
    };
    let registry =
        Registry::new(&rt).with_history(std::sync::Arc::new(berth_agent::history::Journal));
    let tools = registry
        .specs()
        .into_iter()
        .map(|s| {
            let schema = match s.input_schema {
                Value::Object(o) => o,
                _ => Default::default(),
            };
            Tool::new(s.name, s.description, Arc::new(schema))
        })
        .collect();
    let dispatch: Arc<dyn Dispatch> = if a.server {
        let mode = match berth_server::Mode::from_env()? {
            berth_server::Mode::Off => anyhow::bail!(
                "--server runs the tools in the berth server, and BERTH_SERVER=off turns it off; drop one of them"
            ),
            m => m,
        };
        let remote = berth_server::tools::ServerTools::new(dir, mode);
        let pid = remote.check().await?;
        tracing::info!(pid, "tools run in the berth server");
        Arc::new(remote)
    } else {
        Arc::new(registry)
    };
    let shared = Arc::new(Shared {
        rt: rt.clone(),
        dispatch,
        served: a.server,
        tools,
        backend: a.backend,
        sandbox: a.sandbox.clone(),
        session: a.session.clone(),
        notifier: notify::Notifier::default(),
    });
    let watcher = tokio::spawn(notify::watch_jobs(shared.clone()));
    let result = match &a.listen {
        Some(addr) => http::serve(shared.clone(), addr, token).await,
        None => stdio::serve(shared.clone()).await,
    };
    watcher.abort();
    rt.shutdown().await;
    result.map(|()| 0)
}

impl BerthServer {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl ServerHandler for BerthServer {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_logging()
            .build();
        let mut info = ServerConfig::new(caps);
        info.server_info = Implementation::new("berth", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(format!(
            "Commands run in a persistent bash session in sandbox `{}` ({}): cd, exported variables, functions and aliases carry over between calls. Long-running work belongs in background jobs (terminal with background=true, then the process tool); their completions arrive as logging notifications.",
            self.shared.sandbox, self.shared.backend
        ));
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.shared.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let s = &self.shared;
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let mut ctx = ToolContext::new(s.rt.clone(), s.backend, &s.sandbox)
            .with_session(&s.session)
            .with_cancel(context.ct.clone());
        if let Some(token) = context.meta.get_progress_token() {
            let peer = context.peer.clone();
            let sink: ProgressSink = Arc::new(move |p: &Progress| {
                let param = ProgressNotificationParam::new(token.clone(), p.elapsed.as_secs_f64())
                    .with_message(p.message.clone());
                let peer = peer.clone();
                tokio::spawn(async move {
                    let _ = peer.notify_progress(param).await;
                });
            });
            ctx = ctx.with_progress(sink);
        }
        let o = s.dispatch.dispatch(&ctx, &request.name, args).await;
        if o.kind == OutcomeKind::UnknownTool {
            return Err(McpError::invalid_params(o.text, None));
        }
        let mut structured = match o.data {
            Value::Object(m) => m,
            Value::Null => Default::default(),
            other => [("data".to_string(), other)].into_iter().collect(),
        };
        structured.insert(
            "outcome".into(),
            serde_json::to_value(&o.kind).unwrap_or(Value::Null),
        );
        structured.insert("call_id".into(), o.call_id.into());
        if let Some(p) = &o.spool {
            structured.insert("spool".into(), p.display().to_string().into());
        }
        let content = vec![ContentBlock::text(o.text)];
        let mut result = if o.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        result.structured_content = Some(Value::Object(structured));
        Ok(result.into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.shared.notifier.add(context.peer);
    }
}
