//! `pods/exec` over WebSocket, the channel protocols `v5.channel.k8s.io`
//! down to `v4.channel.k8s.io` (and v1–v3 for old clients).
//!
//! Every binary message starts with a channel byte: 0 stdin, 1 stdout,
//! 2 stderr, 3 the error channel (the exit as a `Status`, JSON from v4 on),
//! 4 resize (`{"Width":W,"Height":H}`). v5 adds 255: `[255, 0]` closes the
//! process's stdin. The command runs as a Docker exec in the pod's
//! container; the socket closes after the status is sent.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecResults};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::K8s;
use super::api::Query;
use super::kubelet::container_id;
use super::resources;
use super::store::{ApiError, ApiResult};

/// Sub-protocols in the order the stand-in prefers them.
pub const PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Check the request, then upgrade.
pub async fn start(
    k: &Arc<K8s>,
    ns: &str,
    name: &str,
    q: &Query,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let pod = k.store.get(resources::pods(), ns, name)?;
    let command = q.all("command");
    if command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let wanted = q.get("container");
    let first = pod["spec"]["containers"][0]["name"].as_str().unwrap_or("");
    if let Some(c) = wanted
        && c != first
    {
        return Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        )));
    }
    let Some(id) = container_id(&pod).filter(|_| pod["status"]["phase"] == "Running") else {
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: container not found (\"{first}\"); pod {name} is {phase}"
        )));
    };
    let opts = ExecOpts {
        command,
        stdin: q.flag("stdin"),
        stdout: q.flag("stdout"),
        stderr: q.flag("stderr"),
        tty: q.flag("tty"),
    };
    let k = k.clone();
    Ok(ws
        .protocols(PROTOCOLS)
        .on_upgrade(move |socket| async move {
            let v4 = matches!(
                socket.protocol().and_then(|p| p.to_str().ok()),
                Some("v4.channel.k8s.io" | "v5.channel.k8s.io")
            );
            let v5 = socket.protocol().and_then(|p| p.to_str().ok()) == Some("v5.channel.k8s.io");
            session(k, id, opts, socket, v4, v5).await;
        }))
}

struct ExecOpts {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

fn framed(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::Binary(Bytes::from(v))
}

/// A close with status 1000: clients read it as the end of every stream
/// (a close without a status is an error to them).
fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: close_code::NORMAL,
        reason: "".into(),
    }))
}

/// The exit as the error channel carries it.
fn exit_status(code: i64, command: &[String], v4: bool) -> Vec<u8> {
    if !v4 {
        return if code == 0 {
            Vec::new()
        } else {
            format!("command terminated with non-zero exit code: exit status {code}").into_bytes()
        };
    }
    let status: Value = if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        })
    };
    status.to_string().into_bytes()
}

async fn session(
    k: Arc<K8s>,
    container: String,
    o: ExecOpts,
    socket: WebSocket,
    v4: bool,
    v5: bool,
) {
    let (mut tx, mut rx) = socket.split();
    let fail = |message: String| {
        let status = json!({"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"});
        framed(ERROR, status.to_string().as_bytes())
    };
    let created = k
        .docker
        .create_exec(
            &container,
            CreateExecOptions {
                cmd: Some(o.command.clone()),
                attach_stdin: Some(o.stdin),
                attach_stdout: Some(o.stdout),
                attach_stderr: Some(o.stderr),
                tty: Some(o.tty),
                ..Default::default()
            },
        )
        .await;
    let exec = match created {
        Ok(e) => e.id,
        Err(e) => {
            let _ = tx
                .send(fail(format!("the container cannot run the command: {e}")))
                .await;
            let _ = tx.send(normal_close()).await;
            return;
        }
    };
    let (mut output, input) = match k.docker.start_exec(&exec, None).await {
        Ok(StartExecResults::Attached { output, input }) => (output, input),
        Ok(StartExecResults::Detached) => {
            let _ = tx.send(fail("the exec started detached".into())).await;
            let _ = tx.send(normal_close()).await;
            return;
        }
        Err(e) => {
            let _ = tx.send(fail(format!("starting the command: {e}"))).await;
            let _ = tx.send(normal_close()).await;
            return;
        }
    };
    // The client's side: stdin, resizes, the close signal.
    let docker = k.docker.clone();
    let exec_id = exec.clone();
    let reader = tokio::spawn(async move {
        let mut input = Some(input);
        while let Some(Ok(msg)) = rx.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                Message::Text(t) => Bytes::from(t.as_str().as_bytes().to_vec()),
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&ch, rest)) = data.split_first() else {
                continue;
            };
            match ch {
                STDIN => {
                    if let Some(w) = input.as_mut()
                        && w.write_all(rest).await.is_err()
                    {
                        input = None;
                    }
                }
                RESIZE => {
                    if let Ok(size) = serde_json::from_slice::<Value>(rest) {
                        let width = size["Width"].as_u64().unwrap_or(80) as u16;
                        let height = size["Height"].as_u64().unwrap_or(24) as u16;
                        let _ = docker
                            .resize_exec(&exec_id, ResizeExecOptions { width, height })
                            .await;
                    }
                }
                CLOSE if v5 && rest.first() == Some(&STDIN) => {
                    if let Some(mut w) = input.take() {
                        let _ = w.shutdown().await;
                    }
                }
                _ => {}
            }
        }
    });
    let mut cut = k.cuts.subscribe();
    loop {
        let item = tokio::select! {
            item = output.next() => item,
            // The API server is cut off: the session ends with no status.
            _ = cut.recv() => {
                reader.abort();
                return;
            }
        };
        let Some(item) = item else { break };
        let msg = match item {
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                framed(STDOUT, &message)
            }
            Ok(LogOutput::StdErr { message }) => framed(STDERR, &message),
            Ok(LogOutput::StdIn { .. }) => continue,
            Err(_) => break,
        };
        if tx.send(msg).await.is_err() {
            reader.abort();
            return;
        }
    }
    let code = match k.docker.inspect_exec(&exec).await {
        Ok(info) => info.exit_code.unwrap_or(-1),
        Err(_) => -1,
    };
    let _ = tx
        .send(framed(ERROR, &exit_status(code, &o.command, v4)))
        .await;
    let _ = tx.send(normal_close()).await;
    reader.abort();
}
