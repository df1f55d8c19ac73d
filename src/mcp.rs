//! `berth mcp`: berth's sandboxes as an MCP server on stdio.
//!
//! Flow at a glance: newline-delimited JSON-RPC 2.0 on stdin/stdout. The server
//! answers `initialize`, `ping`, `tools/list` and `tools/call`; every tool call
//! goes through the same runtime as the CLI (policies, event log, persistent
//! session), and the session stays open for the life of the server, so a command
//! costs one round trip to an already-running shell. Diagnostics go to stderr.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use berth_core::backend::Signal;
use berth_core::jobs::KillOutcome;
use berth_core::runtime::{DEFAULT_SANDBOX, ExecRequest, Runtime};
use berth_core::session::capture::strip_ansi;
use clap::Args;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::context::{self, DEFAULT_BACKEND};

/// The newest protocol revision this server speaks.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// Default command timeout for the terminal tool.
const DEFAULT_TIMEOUT_SECS: f64 = 180.0;
/// Largest file the read tool returns.
const READ_LIMIT: u64 = 1 << 20;

#[derive(Args, Debug)]
#[command(
    after_help = "Add it to an MCP client, e.g.:\n  {\"command\": \"berth\", \"args\": [\"mcp\", \"--backend\", \"docker\", \"--sandbox\", \"agent\"]}"
)]
pub struct McpArgs {
    /// Backend the tools run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// Sandbox the tools run in (created on first use if it is `default`).
    #[arg(long, short = 's', default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
}

struct Server {
    rt: Runtime,
    backend: String,
    sandbox: String,
}

pub async fn run(state_dir: Option<PathBuf>, a: McpArgs) -> Result<u8> {
    let server = Server {
        rt: context::runtime(state_dir)?,
        backend: a.backend,
        sandbox: a.sandbox,
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(msg) => server.handle(msg).await,
            Err(e) => Some(error_reply(
                Value::Null,
                -32700,
                &format!("parse error: {e}"),
            )),
        };
        if let Some(r) = reply {
            let mut text = serde_json::to_string(&r)?;
            text.push('\n');
            out.write_all(text.as_bytes()).await?;
            out.flush().await?;
        }
    }
    server.rt.shutdown().await;
    Ok(0)
}

fn error_reply(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

fn ok_reply(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// A tool result: text for the model, structured data for programs.
fn tool_result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": is_error,
    })
}

impl Server {
    async fn handle(&self, msg: Value) -> Option<Value> {
        let id = msg.get("id").cloned();
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        // Notifications (no id) get no reply.
        let id = id?;
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        Some(match method {
            "initialize" => {
                let asked = params["protocolVersion"]
                    .as_str()
                    .unwrap_or(PROTOCOL_VERSION);
                let version = if asked <= PROTOCOL_VERSION {
                    asked
                } else {
                    PROTOCOL_VERSION
                };
                ok_reply(
                    id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": { "tools": { "listChanged": false } },
                        "serverInfo": { "name": "berth", "version": env!("CARGO_PKG_VERSION") },
                        "instructions": format!(
                            "Commands run in a persistent bash session in sandbox `{}` ({}): cd, exported variables and functions carry over between calls.",
                            self.sandbox, self.backend
                        ),
                    }),
                )
            }
            "ping" => ok_reply(id, json!({})),
            "tools/list" => ok_reply(id, json!({ "tools": tools() })),
            "tools/call" => {
                let name = params["name"].as_str().unwrap_or("");
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                match self.call(name, &args).await {
                    Ok(v) => ok_reply(id, v),
                    Err(CallError::Unknown) => error_reply(
                        id,
                        -32602,
                        &format!("unknown tool `{name}`; tools/list names the available ones"),
                    ),
                    Err(CallError::BadArgs(m)) => error_reply(id, -32602, &m),
                    // Failures of the work itself are tool results, so the model sees them.
                    Err(CallError::Failed(m)) => {
                        ok_reply(id, tool_result(m.clone(), json!({ "error": m }), true))
                    }
                }
            }
            other => error_reply(id, -32601, &format!("method `{other}` is not supported")),
        })
    }

    async fn call(&self, name: &str, args: &Value) -> Result<Value, CallError> {
        match name {
            "terminal" => self.terminal(args).await,
            "process" => self.process(args).await,
            "read_file" => self.read_file(args).await,
            "write_file" => self.write_file(args).await,
            _ => Err(CallError::Unknown),
        }
    }

    async fn terminal(&self, args: &Value) -> Result<Value, CallError> {
        let command = str_arg(args, "command")?;
        if command.trim().is_empty() {
            return Err(CallError::BadArgs("`command` is empty".into()));
        }
        let secs = args["timeout"].as_f64().unwrap_or(DEFAULT_TIMEOUT_SECS);
        if !(secs.is_finite() && secs > 0.0) {
            return Err(CallError::BadArgs(
                "`timeout` must be a positive number of seconds".into(),
            ));
        }
        if args["background"].as_bool() == Some(true) {
            let job = self
                .rt
                .start_job(&self.backend, &self.sandbox, command, None, vec![])
                .await
                .map_err(|e| CallError::Failed(e.to_string()))?;
            return Ok(tool_result(
                format!(
                    "started background job {} (pid {})",
                    job.id,
                    job.pid.unwrap_or(0)
                ),
                json!({ "job": job.id, "pid": job.pid }),
                false,
            ));
        }
        let r = self
            .rt
            .exec(ExecRequest {
                backend: self.backend.clone(),
                sandbox: self.sandbox.clone(),
                command: command.to_string(),
                timeout: Some(Duration::from_secs_f64(secs)),
                ..Default::default()
            })
            .await
            .map_err(|e| CallError::Failed(e.to_string()))?;
        let res = &r.result;
        let mut text = strip_ansi(&res.output.text());
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        if res.timed_out {
            text.push_str(&format!(
                "[berth: timed out after {secs}s; the command's processes were stopped]\n"
            ));
        }
        for n in &res.notices {
            text.push_str(&format!("[berth: {n}]\n"));
        }
        text.push_str(&format!("[exit code {}]", res.exit_code));
        Ok(tool_result(
            text,
            json!({
                "exit_code": res.exit_code, "cwd": res.cwd, "timed_out": res.timed_out,
                "truncated": res.output.truncated(), "bytes": res.output.total_bytes,
                "duration_ms": res.duration.as_millis() as u64,
            }),
            false,
        ))
    }

    async fn process(&self, args: &Value) -> Result<Value, CallError> {
        let action = str_arg(args, "action")?;
        let failed = |e: berth_core::Error| CallError::Failed(e.to_string());
        match action {
            "list" => {
                let jobs = self.rt.list_jobs().await.map_err(failed)?;
                let lines: Vec<String> = jobs
                    .iter()
                    .map(|j| {
                        format!(
                            "{} {} exit={} bytes={} {}",
                            j.id,
                            j.state.as_str(),
                            j.exit_code
                                .map(|c| c.to_string())
                                .unwrap_or_else(|| "-".into()),
                            j.out_bytes,
                            j.command
                        )
                    })
                    .collect();
                let text = if lines.is_empty() {
                    "no jobs".to_string()
                } else {
                    lines.join("\n")
                };
                Ok(tool_result(text, json!({ "jobs": jobs }), false))
            }
            "status" | "wait" => {
                let id = str_arg(args, "id")?;
                let job = if action == "wait" {
                    let secs = args["timeout"].as_f64().unwrap_or(60.0).max(0.001);
                    self.rt
                        .wait_job(id, Some(Duration::from_secs_f64(secs)))
                        .await
                        .map_err(failed)?
                } else {
                    self.rt.job(id).await.map_err(failed)?
                };
                let text = format!(
                    "job {} {} exit={} output={} bytes",
                    job.id,
                    job.state.as_str(),
                    job.exit_code
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "-".into()),
                    job.out_bytes
                );
                Ok(tool_result(
                    text,
                    serde_json::to_value(&job).unwrap_or_default(),
                    false,
                ))
            }
            "logs" => {
                let id = str_arg(args, "id")?;
                let offset = args["offset"].as_u64().unwrap_or(0);
                let limit = args["limit"].as_u64().unwrap_or(64 * 1024) as usize;
                let mut buf = Vec::new();
                let mut sink = |b: &[u8]| {
                    let room = limit.saturating_sub(buf.len());
                    buf.extend_from_slice(&b[..b.len().min(room)]);
                };
                self.rt
                    .job_logs(id, offset, false, &mut sink)
                    .await
                    .map_err(failed)?;
                let next = offset + buf.len() as u64;
                let text = strip_ansi(&String::from_utf8_lossy(&buf));
                Ok(tool_result(
                    text,
                    json!({ "offset": offset, "next_offset": next }),
                    false,
                ))
            }
            "kill" => {
                let id = str_arg(args, "id")?;
                let sig = match args["signal"]
                    .as_str()
                    .unwrap_or("TERM")
                    .to_ascii_uppercase()
                    .as_str()
                {
                    "KILL" => Signal::Kill,
                    "INT" => Signal::Int,
                    "TERM" => Signal::Term,
                    other => {
                        return Err(CallError::BadArgs(format!(
                            "unknown signal `{other}`: use TERM, KILL or INT"
                        )));
                    }
                };
                let text = match self.rt.kill_job(id, sig).await.map_err(failed)? {
                    KillOutcome::Signalled => format!("sent SIG{} to job {id}", sig.name()),
                    KillOutcome::AlreadyEnded(st, code) => format!(
                        "job {id} had already {}{}",
                        st.as_str(),
                        code.map(|c| format!(" with code {c}")).unwrap_or_default()
                    ),
                };
                Ok(tool_result(text, json!({}), false))
            }
            "send" => {
                let id = str_arg(args, "id")?;
                let data = args["data"].as_str().unwrap_or("");
                let eof = args["eof"].as_bool().unwrap_or(false);
                self.rt
                    .send_job(id, data.as_bytes(), eof)
                    .await
                    .map_err(failed)?;
                Ok(tool_result(
                    format!("wrote {} bytes to job {id}", data.len()),
                    json!({}),
                    false,
                ))
            }
            other => Err(CallError::BadArgs(format!(
                "unknown action `{other}`: use list, status, logs, wait, kill or send"
            ))),
        }
    }

    async fn read_file(&self, args: &Value) -> Result<Value, CallError> {
        let path = str_arg(args, "path")?;
        let sb = self
            .rt
            .attach(&self.backend, &self.sandbox)
            .await
            .map_err(|e| CallError::Failed(e.to_string()))?;
        let path = &in_workspace(sb.layout(), path);
        let data = sb
            .read_file(path, READ_LIMIT + 1)
            .await
            .map_err(|e| CallError::Failed(e.to_string()))?;
        let truncated = data.len() as u64 > READ_LIMIT;
        let shown = &data[..data.len().min(READ_LIMIT as usize)];
        let mut text = String::from_utf8_lossy(shown).into_owned();
        if truncated {
            text.push_str(&format!(
                "\n[berth: file is larger than {READ_LIMIT} bytes; shown truncated]"
            ));
        }
        Ok(tool_result(
            text,
            json!({ "bytes": shown.len(), "truncated": truncated }),
            false,
        ))
    }

    async fn write_file(&self, args: &Value) -> Result<Value, CallError> {
        let path = str_arg(args, "path")?;
        let content = str_arg(args, "content")?;
        let sb = self
            .rt
            .attach(&self.backend, &self.sandbox)
            .await
            .map_err(|e| CallError::Failed(e.to_string()))?;
        let path = &in_workspace(sb.layout(), path);
        sb.write_file(path, content.as_bytes(), 0o644)
            .await
            .map_err(|e| CallError::Failed(e.to_string()))?;
        Ok(tool_result(
            format!("wrote {} bytes to {path}", content.len()),
            json!({ "bytes": content.len() }),
            false,
        ))
    }
}

/// Relative paths are relative to the sandbox's workspace.
fn in_workspace(layout: &berth_core::backend::Layout, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", layout.workdir.trim_end_matches('/'))
    }
}

enum CallError {
    Unknown,
    BadArgs(String),
    Failed(String),
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, CallError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| CallError::BadArgs(format!("missing string argument `{key}`")))
}

fn tools() -> Value {
    json!([
        {
            "name": "terminal",
            "description": "Run a bash command in the sandbox's persistent session: cwd, exported variables, functions and aliases carry over between calls. Output is stdout and stderr interleaved, head and tail kept when long. Set background=true to start it as a detached job and get its id.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "command": { "type": "string", "description": "The command line, run by bash." },
                    "timeout": { "type": "number", "description": "Seconds before the command and its processes are stopped (default 180)." },
                    "background": { "type": "boolean", "description": "Start as a background job and return its id." }
                },
                "required": ["command"]
            }
        },
        {
            "name": "process",
            "description": "Manage background jobs: list, status, logs (by byte offset), wait (with timeout), kill (TERM/KILL/INT to the whole group), send (stdin, optionally closing it).",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "action": { "type": "string", "enum": ["list", "status", "logs", "wait", "kill", "send"] },
                    "id": { "type": "string", "description": "Job id or name." },
                    "offset": { "type": "integer", "description": "logs: start at this byte offset." },
                    "limit": { "type": "integer", "description": "logs: at most this many bytes (default 65536)." },
                    "timeout": { "type": "number", "description": "wait: seconds to wait (default 60)." },
                    "signal": { "type": "string", "enum": ["TERM", "KILL", "INT"] },
                    "data": { "type": "string", "description": "send: text for the job's stdin." },
                    "eof": { "type": "boolean", "description": "send: close the job's stdin afterwards." }
                },
                "required": ["action"]
            }
        },
        {
            "name": "read_file",
            "description": "Read a file in the sandbox (relative paths are under the workspace); up to 1 MiB.",
            "inputSchema": {
                "type": "object",
                "properties": { "path": { "type": "string" } },
                "required": ["path"]
            }
        },
        {
            "name": "write_file",
            "description": "Create or replace a file in the sandbox, creating parent directories.",
            "inputSchema": {
                "type": "object",
                "properties": { "path": { "type": "string" }, "content": { "type": "string" } },
                "required": ["path", "content"]
            }
        }
    ])
}
