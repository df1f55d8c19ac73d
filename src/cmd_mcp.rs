//! `berth mcp`: its flags, and the hand-over to the MCP server (berth-mcp).

use berth_core::backend::BackendKind;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use berth_core::runtime::DEFAULT_SANDBOX;

use crate::context::{self, DEFAULT_BACKEND};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Register it with an MCP client, e.g.:\n  {\"mcpServers\": {\"berth\": {\"command\": \"berth\", \"args\": [\"mcp\", \"--backend\", \"docker\", \"--sandbox\", \"agent\"]}}}\nOver HTTP: berth mcp --listen 127.0.0.1:8765 (prints a new bearer token; or give yours in \
the environment variable BERTH_MCP_TOKEN or with --token-file PATH, which keep it out of the \
process list)"
)]
pub struct McpArgs {
    /// Backend the tools run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Sandbox the tools run in (created on first use if it is `default`).
    #[arg(long, short = 's', default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// The sandbox's session `terminal` runs in (a call may name another).
    #[arg(long, value_name = "NAME", default_value = berth_core::runtime::MAIN_SESSION)]
    pub session: String,
    /// Serve streamable HTTP on ADDR (`127.0.0.1:8765`, or a bare port for
    /// loopback) instead of stdio. Every request needs the bearer token.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Refused: a command line is readable by every process of the host
    /// (/proc/PID/cmdline), sandboxes too. Give the token with --token-file
    /// or the environment variable BERTH_MCP_TOKEN; without either, a new
    /// random token is printed on stderr.
    #[arg(long, value_name = "TOKEN", hide = true)]
    pub token: Option<String>,
    /// Read the bearer token for --listen from this file (its first line;
    /// keep the file mode 0600). Overrides BERTH_MCP_TOKEN.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Run the tools in the berth server the CLI uses (started if none
    /// runs), on its warm shells: an agent and a person at the CLI then
    /// share one session. Without it the tools run in this process.
    #[arg(long)]
    pub server: bool,
}

pub async fn run(state_dir: Option<PathBuf>, a: McpArgs) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    let rt = Arc::new(context::runtime(Some(dir.clone()))?);
    let opts = berth_mcp::Options {
        backend: a.backend,
        sandbox: a.sandbox,
        session: a.session,
        listen: a.listen,
        token: a.token,
        token_file: a.token_file,
        server: a.server,
    };
    berth_mcp::run(dir, rt, opts).await
}
