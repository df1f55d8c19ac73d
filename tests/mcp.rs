//! `berth mcp` end to end, driven by the official SDK's client (rmcp) over stdio
//! and over streamable HTTP, on the local and docker backends; plus raw bytes
//! on stdin for what a well-behaved client never sends.

// rmcp marks MCP logging deprecated (SEP-2577); berth still sends job news that way.
#![allow(deprecated)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::handler::client::ClientHandler;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest,
    LoggingMessageNotificationParam, ProgressNotificationParam, RequestMetaObject,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{BoxError, TestResult};

/// A secret in berth's environment: it must never reach the model in clear.
const SECRET: &str = "sk-mcp-test-0123456789abcdefghijkl";

const POLICY: &str = r#"
[[rules]]
name = "no-shred"
action = "deny"
prefix = "shred"
reason = "shredding is not for agents"

[[files.rules]]
name = "no-dotenv"
action = "deny"
paths = ["**/.env"]
ops = ["read"]
reason = "env files hold credentials"
"#;

/// What the server sent besides replies.
#[derive(Clone, Default)]
pub(crate) struct Seen {
    logs: Arc<Mutex<Vec<Value>>>,
    progress: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Seen {
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut l) = self.logs.lock() {
            l.push(params.data);
        }
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut p) = self.progress.lock() {
            p.push(params.message.unwrap_or_default());
        }
    }
}

/// A state dir, a policy and a sandbox, removed (with its container) on drop.
pub(crate) struct Env {
    pub(crate) dir: tempfile::TempDir,
    backend: &'static str,
    sandbox: String,
}

static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Env {
    pub(crate) fn new(backend: &'static str) -> Result<Env, BoxError> {
        Self::made_with(backend, &[])
    }

    /// [`Env::new`], the sandbox made with `flags` too.
    pub(crate) fn made_with(backend: &'static str, flags: &[&str]) -> Result<Env, BoxError> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("policy.toml"), POLICY)?;
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sandbox = format!("t-mcp-{}-{n}", std::process::id());
        let env = Env {
            dir,
            backend,
            sandbox,
        };
        let o = env
            .berth()
            .args(["sandbox", "create", &env.sandbox, "--backend", backend])
            .args(flags)
            .stdin(Stdio::null())
            .output()?;
        if !o.status.success() {
            return Err(format!(
                "sandbox create failed: {}",
                String::from_utf8_lossy(&o.stderr)
            )
            .into());
        }
        Ok(env)
    }

    pub(crate) fn berth(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_berth"));
        c.env("BERTH_STATE_DIR", self.dir.path())
            .env("BERTH_POLICY", self.dir.path().join("policy.toml"))
            .env("BERTH_TEST_API_KEY", SECRET)
            .env_remove("BERTH_MCP_TOKEN");
        c
    }

    fn mcp_args(&self) -> Vec<String> {
        ["mcp", "--backend", self.backend, "--sandbox", &self.sandbox]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// The SDK's client over `berth mcp` on stdio.
    pub(crate) async fn stdio(&self) -> Result<Client, BoxError> {
        self.stdio_with(&[]).await
    }

    /// The SDK's client over `berth mcp ARGS…` on stdio.
    async fn stdio_with(&self, extra: &[&str]) -> Result<Client, BoxError> {
        let std = self.berth();
        let mut cmd = tokio::process::Command::from(std);
        cmd.args(self.mcp_args()).args(extra);
        let (transport, _stderr) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::inherit())
            .spawn()?;
        let seen = Seen::default();
        let service = seen.clone().serve(transport).await?;
        Ok(Client {
            service,
            seen,
            _server: None,
        })
    }

    /// `berth mcp --listen 127.0.0.1:0`, and its URL once it listens.
    fn http_server(&self, token: &str) -> Result<(ChildGuard, String), BoxError> {
        let (guard, url, _) = self.http_server_with(|c| {
            c.env("BERTH_MCP_TOKEN", token);
        })?;
        Ok((guard, url))
    }

    /// `berth mcp --listen 127.0.0.1:0` as `setup` adds to it: the server,
    /// its URL once it listens, and what it has said on stderr.
    #[allow(clippy::type_complexity)]
    fn http_server_with(
        &self,
        setup: impl FnOnce(&mut Command),
    ) -> Result<(ChildGuard, String, Arc<Mutex<Vec<String>>>), BoxError> {
        let mut cmd = self.berth();
        cmd.args(self.mcp_args()).args(["--listen", "127.0.0.1:0"]);
        setup(&mut cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let guard = ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        let said = Arc::new(Mutex::new(Vec::new()));
        let lines = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[berth mcp] {line}");
                let url = line
                    .split("at http://")
                    .nth(1)
                    .map(|r| r.trim().to_string());
                if let Ok(mut l) = lines.lock() {
                    l.push(line);
                }
                if let Some(rest) = url {
                    let _ = tx.send(format!("http://{rest}"));
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "berth mcp --listen did not say where it listens")?;
        Ok((guard, url, said))
    }

    /// The SDK's client over `berth mcp --listen`, with the token.
    async fn http(&self) -> Result<Client, BoxError> {
        let token = "test-token-0123456789abcdef";
        let (server, url) = self.http_server(token)?;
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
        );
        let seen = Seen::default();
        let service = seen.clone().serve(transport).await?;
        Ok(Client {
            service,
            seen,
            _server: Some(server),
        })
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self
            .berth()
            .args([
                "sandbox",
                "rm",
                &self.sandbox,
                "--backend",
                self.backend,
                "--volumes",
            ])
            .stdin(Stdio::null())
            .output();
    }
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) struct Client {
    pub(crate) service: RunningService<RoleClient, Seen>,
    seen: Seen,
    _server: Option<ChildGuard>,
}

fn params(tool: &str, args: Value) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(m) = args {
        p = p.with_arguments(m);
    }
    p
}

pub(crate) fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("")
}

pub(crate) fn data(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

impl Client {
    pub(crate) async fn call(&self, tool: &str, args: Value) -> Result<CallToolResult, BoxError> {
        let r = tokio::time::timeout(
            Duration::from_secs(120),
            self.service.peer().call_tool(params(tool, args)),
        )
        .await
        .map_err(|_| format!("no reply to {tool} within 120 s"))??;
        Ok(r)
    }

    pub(crate) async fn run(&self, command: &str) -> Result<CallToolResult, BoxError> {
        self.call("terminal", json!({ "command": command })).await
    }

    /// Wait until `path` exists in the sandbox (read_file does not queue behind
    /// a running command: it does not use the session).
    async fn wait_for_file(&self, path: &str) -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.call("read_file", json!({ "path": path })).await?;
            if r.is_error != Some(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{path} did not appear within 60 s: {}", text(&r)).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A REPL on a terminal, driven by keys and read as a screen; on the local
/// sandbox too, in its own devpts instance.
async fn terminal_job_flow(c: &Client, _backend: &str) -> TestResult {
    let r = c
        .call(
            "terminal",
            json!({ "command": "python3 -q -i", "background": true, "pty": true, "size": "60x12" }),
        )
        .await?;
    assert!(text(&r).contains("60x12 terminal"), "{}", text(&r));
    let py = data(&r)["job_id"].as_str().ok_or("no job id")?.to_string();
    let r = c
        .call(
            "process",
            json!({ "action": "keys", "job_id": py, "data": "6*7", "keys": ["Enter"] }),
        )
        .await?;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = c
            .call("process", json!({ "action": "screen", "job_id": py }))
            .await?;
        let lines = data(&r)["lines"].clone();
        // The answer and the next prompt: python may draw "42" a moment
        // before its next ">>>".
        if lines
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l == "42"))
            && text(&r).contains(">>> 6*7\n42\n>>>")
        {
            assert_eq!(data(&r)["cols"], 60, "{}", text(&r));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 42 and the next prompt on the screen: {}",
            text(&r)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = c
        .call(
            "process",
            json!({ "action": "keys", "job_id": py, "keys": ["Hyper"] }),
        )
        .await?;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("unknown key"), "{}", text(&r));
    let r = c
        .call("process", json!({ "action": "kill", "job_id": py }))
        .await?;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    Ok(())
}

/// What every transport and backend must do: tools and schemas, persistence,
/// timeouts, cancellation, concurrency, job notifications, the gate, redaction,
/// edits.
async fn core_flow(c: &Client, backend: &str) -> TestResult {
    // Tools and their schemas, in a stable order.
    let tools = c.service.peer().list_all_tools().await?;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "terminal",
            "process",
            "read_file",
            "write_file",
            "edit_file",
            "memory",
            "history_search"
        ]
    );
    let schema = |n: &str| -> Value {
        tools
            .iter()
            .find(|t| t.name == n)
            .map(|t| Value::Object((*t.input_schema).clone()))
            .unwrap_or(Value::Null)
    };
    assert_eq!(schema("terminal")["required"], json!(["command"]));
    assert_eq!(
        schema("edit_file")["required"],
        json!(["path", "old", "new"])
    );
    assert!(schema("process")["properties"]["action"].is_object());
    let info = c.service.peer().peer_info().ok_or("no server info")?;
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("berth")
    );

    // cd persists.
    let r = c
        .run("mkdir -p mcpwd/inner && cd mcpwd/inner && export MCPV=7")
        .await?;
    assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
    let r = c.run("pwd; echo $MCPV; false").await?;
    assert!(
        text(&r).ends_with("/mcpwd/inner\n7\n[exit code 1]"),
        "{}",
        text(&r)
    );
    assert!(
        data(&r)["cwd"]
            .as_str()
            .is_some_and(|d| d.ends_with("/mcpwd/inner")),
        "{:?}",
        data(&r)
    );
    assert_eq!(r.is_error, Some(false));
    // stdout and stderr apart, as E2B and Modal return them (issue 50):
    // the stderr under a line of its own, each stream counted.
    let r = c.run("echo out; echo err >&2; echo out2").await?;
    assert_eq!(text(&r), "out\nout2\n[stderr]\nerr\n[exit code 0]");
    assert_eq!(
        (&data(&r)["bytes"], &data(&r)["stderr_bytes"]),
        (&json!(9), &json!(4)),
        "{:?}",
        data(&r)
    );
    let r = c.run("echo quiet").await?;
    assert_eq!(text(&r), "quiet\n[exit code 0]");
    // Back to the workspace, where relative file-tool paths point.
    let r = c.run("cd ../..").await?;
    assert_eq!(data(&r)["exit_code"], 0);

    // A timeout stops the command; the session survives it.
    let r = c
        .call("terminal", json!({ "command": "sleep 30", "timeout": 1 }))
        .await?;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(data(&r)["outcome"]["kind"], "timed_out", "{}", text(&r));
    assert!(text(&r).contains("timed out"), "{}", text(&r));
    // Absurd timeouts are argument errors, not panics.
    for t in [json!(1e20), json!(-1), json!(0)] {
        let r = c
            .call("terminal", json!({ "command": "true", "timeout": t }))
            .await?;
        assert_eq!(
            data(&r)["outcome"]["kind"],
            "invalid_args",
            "{t}: {}",
            text(&r)
        );
        assert!(text(&r).contains("timeout"), "{}", text(&r));
    }

    // ping is answered while a 10 s command runs.
    let peer = c.service.peer().clone();
    let long = tokio::spawn(async move {
        peer.call_tool(params(
            "terminal",
            json!({ "command": "touch mcp-ping-started; sleep 10; echo slept" }),
        ))
        .await
    });
    c.wait_for_file("mcp-ping-started").await?;
    tokio::time::timeout(
        Duration::from_secs(5),
        c.service
            .peer()
            .send_request(ClientRequest::PingRequest(Default::default())),
    )
    .await
    .map_err(|_| "ping was not answered while a command ran")??;
    assert!(
        !long.is_finished(),
        "the 10 s command ended before ping was answered"
    );
    let r = long.await??;
    assert!(text(&r).contains("slept"), "{}", text(&r));

    // Cancelling a command kills its tree; the next call works.
    let handle = c
        .service
        .peer()
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params(
                "terminal",
                json!({ "command": "(sleep 4242 &); touch mcp-cancel-started; sleep 4343" }),
            ))),
            PeerRequestOptions::no_options(),
        )
        .await?;
    c.wait_for_file("mcp-cancel-started").await?;
    handle.cancel(Some("test".into())).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = c
            .run("pgrep -f 'sleep 4[23]4[23]' >/dev/null && echo alive || echo gone")
            .await?;
        if text(&r).starts_with("gone") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled tree lives on: {}",
            text(&r)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = c.run("echo after-cancel; pwd").await?;
    assert!(text(&r).starts_with("after-cancel\n"), "{}", text(&r));

    // A call that asks for progress gets it while the command runs.
    let handle = c
        .service
        .peer()
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params(
                "terminal",
                json!({ "command": "echo tick; sleep 5; echo tock" }),
            ))),
            {
                let mut o = PeerRequestOptions::no_options();
                o.meta = Some(RequestMetaObject::with_progress_token(
                    rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(77)),
                ));
                o
            },
        )
        .await?;
    let r = handle.await_response().await?;
    let _ = r;
    let progress = c
        .seen
        .progress
        .lock()
        .map(|p| p.clone())
        .unwrap_or_default();
    assert!(
        progress.iter().any(|m| m.contains("bytes of output")),
        "{progress:?}"
    );

    // A background job that completes is announced as a logging notification.
    let r = c
        .call(
            "terminal",
            json!({ "command": "sleep 1; echo from-job; exit 3", "background": true }),
        )
        .await?;
    let id = data(&r)["job_id"].as_str().ok_or("no job id")?.to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs = c.seen.logs.lock().map(|l| l.clone()).unwrap_or_default();
        if let Some(n) = logs.iter().find(|l| l["job_id"] == id.as_str()) {
            assert_eq!(n["event"], "job.exited", "{n}");
            assert_eq!(n["exit_code"], 3, "{n}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no notification for job {id}: {logs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = c
        .call("process", json!({ "action": "log", "job_id": id }))
        .await?;
    assert_eq!(text(&r), "from-job\n");
    assert_eq!(data(&r)["next_offset"], 9);

    terminal_job_flow(c, backend).await?;

    // A denied command and a denied file read name their rules.
    let r = c.run("shred -u notes.txt").await?;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(
        data(&r)["outcome"],
        json!({ "kind": "denied", "rule": "no-shred" })
    );
    assert!(text(&r).contains("no-shred"), "{}", text(&r));
    let r = c
        .call(
            "write_file",
            json!({ "path": "app/.env", "content": format!("KEY={SECRET}\n") }),
        )
        .await?;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = c.call("read_file", json!({ "path": "app/.env" })).await?;
    assert_eq!(
        data(&r)["outcome"],
        json!({ "kind": "denied", "rule": "no-dotenv" })
    );
    assert!(text(&r).contains("no-dotenv"), "{}", text(&r));

    // A secret in a file comes back redacted, through read_file and terminal.
    c.call(
        "write_file",
        json!({ "path": "conf/settings.txt", "content": format!("line one\napi_key = {SECRET}\nline three\n") }),
    )
    .await?;
    let r = c
        .call("read_file", json!({ "path": "conf/settings.txt" }))
        .await?;
    assert!(!text(&r).contains(SECRET), "{}", text(&r));
    assert!(
        text(&r).contains("[REDACTED:BERTH_TEST_API_KEY]"),
        "{}",
        text(&r)
    );
    let r = c
        .call(
            "read_file",
            json!({ "path": "conf/settings.txt", "offset": 2, "limit": 1 }),
        )
        .await?;
    assert!(text(&r).starts_with("api_key = [REDACTED"), "{}", text(&r));
    let r = c.run("cat conf/settings.txt").await?;
    assert!(!text(&r).contains(SECRET), "{}", text(&r));

    // edit_file: unique, missing and non-unique `old`.
    c.call(
        "write_file",
        json!({ "path": "e.txt", "content": "a = 1\nb = 1\nc = 2\n" }),
    )
    .await?;
    let r = c
        .call(
            "edit_file",
            json!({ "path": "e.txt", "old": " = 1", "new": " = 9" }),
        )
        .await?;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("occurs 2 times"), "{}", text(&r));
    let r = c
        .call(
            "edit_file",
            json!({ "path": "e.txt", "old": "zzz", "new": "y" }),
        )
        .await?;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("not found"), "{}", text(&r));
    let r = c
        .call(
            "edit_file",
            json!({ "path": "e.txt", "old": "b = 1", "new": "b = 5" }),
        )
        .await?;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = c.call("read_file", json!({ "path": "e.txt" })).await?;
    assert_eq!(text(&r), "a = 1\nb = 5\nc = 2\n");

    // An unknown tool is a protocol error; wrong argument types are tool
    // errors that name the field. The server goes on serving.
    let e = c.call("no_such_tool", json!({})).await;
    assert!(
        e.as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("unknown tool")),
        "{:?}",
        e.map(|r| text(&r))
    );
    let r = c.call("terminal", json!({ "command": 42 })).await?;
    assert_eq!(data(&r)["outcome"]["kind"], "invalid_args");
    assert!(text(&r).contains("`command`"), "{}", text(&r));
    let r = c
        .call("read_file", json!({ "path": "e.txt", "limit": "ten" }))
        .await?;
    assert!(text(&r).contains("`limit`"), "{}", text(&r));

    // A FIFO cannot hang read_file (or the server).
    let r = c.run("mkfifo mcp.fifo").await?;
    assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
    let r = c.call("read_file", json!({ "path": "mcp.fifo" })).await?;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    let r = c.run("echo still-serving").await?;
    assert!(text(&r).starts_with("still-serving"), "{}", text(&r));
    Ok(())
}

/// What one side sets in the shell, even unexported, the other side sees:
/// one shell serves both, not two restored from one snapshot.
async fn shares_the_cli_session(env: &Env, c: &Client) -> TestResult {
    let r = c.run("from_mcp=plain-mcp; cd /").await?;
    assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
    let o = env
        .berth()
        .args(["exec", "--backend", env.backend, "--sandbox", &env.sandbox])
        .args(["--", "echo $from_mcp $PWD; from_cli=plain-cli"])
        .env("BERTH_SERVER", "require")
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "plain-mcp /\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = c.run("echo $from_cli").await?;
    assert!(text(&r).starts_with("plain-cli"), "{}", text(&r));
    Ok(())
}

macro_rules! mcp_suite {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_stdio() -> TestResult {
                let env = Env::new($backend)?;
                let c = env.stdio().await?;
                core_flow(&c, $backend).await?;
                c.service.cancel().await?;
                Ok(())
            }

            /// `--server`: the same flow, run by the berth server the CLI
            /// uses, so the agent and the CLI share one warm shell.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_stdio_through_the_server() -> TestResult {
                let env = Env::new($backend)?;
                let c = env.stdio_with(&["--server"]).await?;
                core_flow(&c, $backend).await?;
                shares_the_cli_session(&env, &c).await?;
                c.service.cancel().await?;
                let _ = env.berth().args(["server", "stop"]).output();
                Ok(())
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_http() -> TestResult {
                let env = Env::new($backend)?;
                let c = env.http().await?;
                core_flow(&c, $backend).await?;
                c.service.cancel().await?;
                Ok(())
            }
        }
    };
}

mcp_suite!(local, "local");
mcp_suite!(docker, "docker");

/// Raw HTTP without (or with a wrong) token is refused, before MCP is spoken.
#[test]
fn http_without_the_token_is_refused() -> TestResult {
    let env = Env::new("local")?;
    let (_server, url) = env.http_server("right-token-0123456789")?;
    let hostport = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    for auth in [
        None,
        Some("Bearer wrong-token-0123456789"),
        Some("Basic cmlnaHQ="),
    ] {
        let mut s = std::net::TcpStream::connect(&hostport)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let auth = auth
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        assert!(reply.starts_with("HTTP/1.1 401"), "{auth}: {reply}");
        assert!(!reply.contains("serverInfo"), "{reply}");
    }
    Ok(())
}

/// Bytes no client should send: each gets a JSON-RPC error (or, for a
/// notification, nothing), and the server keeps serving in bounded memory.
#[test]
fn bad_stdin_never_kills_or_bloats_the_server() -> TestResult {
    let env = Env::new("local")?;
    let mut child = env
        .berth()
        .args(env.mcp_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let pid = child.id();
    let _guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || -> Result<Value, BoxError> {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "no reply within 60 s")?;
        Ok(serde_json::from_str(&line)
            .map_err(|e| format!("stdout is not protocol ({e}): {line}"))?)
    };
    let mut send = |bytes: &[u8]| -> std::io::Result<()> {
        stdin.write_all(bytes)?;
        stdin.write_all(b"\n")?;
        stdin.flush()
    };
    send(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#)?;
    assert_eq!(next()?["id"], 1);
    send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)?;

    send(b"this is not json")?;
    let r = next()?;
    assert_eq!(r["error"]["code"], -32700, "{r}");
    send(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\xff\"}")?;
    let r = next()?;
    assert_eq!(r["error"]["code"], -32700, "{r}");
    // 100 MB on one line: refused, not buffered.
    let big = vec![b'x'; 100 * 1024 * 1024];
    send(&big)?;
    drop(big);
    let r = next()?;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("longer than"),
        "{r}"
    );
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no VmHWM")?;
    assert!(
        rss_kib < 64 * 1024,
        "peak RSS {rss_kib} KiB after a 100 MB line"
    );
    send(br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#)?;
    let r = next()?;
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(3), json!(-32602)),
        "{r}"
    );
    send(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"terminal","arguments":{"command":"echo ok","timeout":1e20}}}"#)?;
    let r = next()?;
    assert_eq!(r["id"], 4);
    assert_eq!(r["result"]["isError"], true, "{r}");
    send(br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"terminal","arguments":{"command":["echo"]}}}"#)?;
    let r = next()?;
    assert_eq!(r["result"]["isError"], true, "{r}");
    send(br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"terminal","arguments":{"command":"echo alive"}}}"#)?;
    let r = next()?;
    assert_eq!(r["id"], 6);
    assert_eq!(
        r["result"]["content"][0]["text"], "alive\n[exit code 0]",
        "{r}"
    );
    Ok(())
}

/// A connection the sandbox's network rules refuse reaches the MCP client
/// as a warning that names the host and the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_announced() -> TestResult {
    let env = Env::made_with("local", &["--network", "allow:pypi.test"])?;
    let c = env.stdio().await?;
    let r = c.run("curl -sS http://blocked.test/").await?;
    assert!(
        text(&r).contains("refused by the sandbox's network policy (mode allow)"),
        "{}",
        text(&r)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = c.seen.logs.lock().map(|l| l.clone()).unwrap_or_default();
        if let Some(n) = logs.iter().find(|l| l["event"] == "net.refused") {
            let m = n["message"].as_str().unwrap_or("");
            assert!(
                m.contains("blocked.test:80") && m.contains("mode allow"),
                "{n}"
            );
            assert_eq!(n["detail"]["rule"], "mode allow", "{n}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no notification of the refusal: {logs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The file tools cannot reach past a local sandbox, not even through a
/// symlink the agent planted with the terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_file_tools_stay_in_the_sandbox() -> TestResult {
    let env = Env::new("local")?;
    let c = env.stdio().await?;
    let outside = tempfile::tempdir()?;
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "host only")?;
    let r = c
        .run(&format!(
            "(cd ~ && ln -s {} leak && ln -s {} dirleak)",
            secret.display(),
            outside.path().display()
        ))
        .await?;
    assert_eq!(data(&r)["exit_code"], 0, "{}", text(&r));
    for path in [
        "leak".to_string(),
        "dirleak/secret".to_string(),
        "../../../../../../../../etc/passwd".to_string(),
        secret.display().to_string(),
    ] {
        let r = c.call("read_file", json!({ "path": path })).await?;
        assert_eq!(r.is_error, Some(true), "{path}: {}", text(&r));
        assert!(!text(&r).contains("host only"), "{path}: {}", text(&r));
        let r = c
            .call("write_file", json!({ "path": path, "content": "pwned" }))
            .await?;
        assert_eq!(r.is_error, Some(true), "{path}: {}", text(&r));
    }
    assert_eq!(std::fs::read_to_string(&secret)?, "host only");
    assert!(!Path::new(&outside.path().join("new")).exists());
    // Nor the sandbox's record beside its workspace, which berth reads back
    // when it starts the sandbox's shell (#32 item 1): by `..`, by an
    // absolute path, or by a symlink planted beside it.
    let r = c
        .run("cd ~ && ln -s ../sandbox.json rec && cd .. && pwd")
        .await?;
    let dir = text(&r).lines().next().unwrap_or("").to_string();
    assert!(dir.starts_with('/'), "{}", text(&r));
    let record = Path::new(&dir).join("sandbox.json");
    let before = std::fs::read(&record)?;
    for path in [
        "../sandbox.json".to_string(),
        "rec".to_string(),
        record.display().to_string(),
    ] {
        let r = c
            .call(
                "write_file",
                json!({ "path": path, "content": "{\"network\": true}" }),
            )
            .await?;
        assert_eq!(r.is_error, Some(true), "{path}: {}", text(&r));
    }
    assert_eq!(std::fs::read(&record)?, before);
    // berth's own directory in the sandbox is off limits to the file tools.
    let r = c.run("echo $__berth_dir").await?;
    let berth_dir = text(&r).lines().next().unwrap_or("").to_string();
    if !berth_dir.is_empty() {
        let r = c
            .call(
                "write_file",
                json!({ "path": format!("{berth_dir}/snap.1"), "content": "x" }),
            )
            .await?;
        assert_eq!(
            data(&r)["outcome"]["rule"],
            "builtin:berth-dir",
            "{}",
            text(&r)
        );
    }
    c.service.cancel().await?;
    Ok(())
}

/// An MCP `initialize` POSTed to `url` with this Authorization header: the
/// reply as far as it came (up to the server's answer).
fn initialize_over_http(url: &str, auth: Option<&str>) -> Result<String, BoxError> {
    let hostport = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let mut s = std::net::TcpStream::connect(&hostport)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
        if String::from_utf8_lossy(&reply).contains("serverInfo") {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// The token can come from a file (`--token-file`) or the environment
/// (`BERTH_MCP_TOKEN`): either guards the server, and neither puts it where
/// every process of the host can read it, the server's /proc/PID/cmdline,
/// nor on its stderr. `--token` is refused (tests/listeners.rs).
#[test]
fn the_token_from_a_file_or_the_environment_stays_off_the_command_line() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new("local")?;
    let token = "kept-off-argv-0123456789abcdef";
    let file = env.dir.path().join("mcp-token");
    std::fs::write(&file, format!("{token}\n"))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    for how in ["--token-file", "BERTH_MCP_TOKEN"] {
        let (server, url, said) = env.http_server_with(|c| match how {
            "--token-file" => {
                c.arg("--token-file").arg(&file);
            }
            _ => {
                c.env("BERTH_MCP_TOKEN", token);
            }
        })?;
        let reply = initialize_over_http(&url, None)?;
        assert!(reply.starts_with("HTTP/1.1 401"), "{how}: {reply}");
        let reply = initialize_over_http(&url, Some("Bearer wrong-token-0123456789"))?;
        assert!(reply.starts_with("HTTP/1.1 401"), "{how}: {reply}");
        let reply = initialize_over_http(&url, Some(&format!("Bearer {token}")))?;
        assert!(reply.starts_with("HTTP/1.1 200"), "{how}: {reply}");
        assert!(reply.contains("serverInfo"), "{how}: {reply}");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.0.id()))?;
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let said = said.lock().map_err(|_| "poisoned")?.join("\n");
        assert!(!cmdline.contains(token), "{how}: {cmdline}");
        assert!(!said.contains(token), "{how}: {said}");
    }
    // An unreadable or empty token file is an error, not a random token.
    let empty = env.dir.path().join("empty-token");
    std::fs::write(&empty, "\n")?;
    for f in [empty.as_path(), Path::new("/nonexistent/berth-token")] {
        let o = env
            .berth()
            .args(env.mcp_args())
            .args(["--listen", "127.0.0.1:0", "--token-file"])
            .arg(f)
            .stdin(Stdio::null())
            .output()?;
        assert_ne!(o.status.code(), Some(0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--token-file"), "{err}");
    }
    Ok(())
}
