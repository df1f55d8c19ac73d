//! The stdio transport: newline-delimited JSON-RPC on stdin and stdout.
//!
//! rmcp's own reader drops bad input silently; a client then waits for a reply
//! that never comes. This one reads lines of at most [`MAX_LINE`] bytes
//! (memory stays flat whatever arrives) and answers what is not a message with
//! a JSON-RPC error: a line too long, bytes that are not UTF-8, text that is not
//! JSON (-32700, id null), JSON that is not a valid request (-32600, with the
//! request's id when it has one). The server goes on serving after each.
//! Writing is rmcp's.

use std::sync::Arc;

use anyhow::Result;
use rmcp::model::{ErrorData, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{RoleServer, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Stdin};

use super::{BerthServer, Shared};

/// The longest message accepted on stdin; longer lines are refused and discarded.
pub(crate) const MAX_LINE: usize = 8 * 1024 * 1024;

pub(crate) async fn serve(shared: Arc<Shared>) -> Result<()> {
    let transport = LineTransport {
        reader: BufReader::with_capacity(64 * 1024, tokio::io::stdin()),
        line: Vec::new(),
        discarding: false,
        writer: AsyncRwTransport::new(tokio::io::empty(), tokio::io::stdout()),
    };
    let running = BerthServer::new(shared)
        .serve(transport)
        .await
        .map_err(|e| anyhow::anyhow!("MCP session could not start: {e}"))?;
    running.waiting().await?;
    Ok(())
}

enum LineRead {
    Line,
    TooLong,
    Eof,
}

struct LineTransport {
    reader: BufReader<Stdin>,
    line: Vec<u8>,
    discarding: bool,
    writer: AsyncRwTransport<RoleServer, tokio::io::Empty, tokio::io::Stdout>,
}

impl LineTransport {
    /// Read up to the next newline into `self.line`. Safe to cancel at the await
    /// (nothing is consumed there); a partial line stays in `self.line`.
    async fn read_line(&mut self) -> std::io::Result<LineRead> {
        loop {
            let buf = self.reader.fill_buf().await?;
            if buf.is_empty() {
                return Ok(LineRead::Eof);
            }
            let (n, found) = match memchr::memchr(b'\n', buf) {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if !self.discarding {
                if self.line.len() + n > MAX_LINE {
                    self.discarding = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(&buf[..n]);
                }
            }
            self.reader.consume(n);
            if found {
                if self.discarding {
                    self.discarding = false;
                    return Ok(LineRead::TooLong);
                }
                return Ok(LineRead::Line);
            }
        }
    }

    /// Queue an error reply; sending runs on its own so reading never waits on it.
    fn reply_error(&mut self, error: ErrorData, id: Option<RequestId>) {
        let send = self
            .writer
            .send(TxJsonRpcMessage::<RoleServer>::error(error, id));
        tokio::spawn(async move {
            if let Err(e) = send.await {
                tracing::warn!(error = %e, "could not send an error reply");
            }
        });
    }
}

impl Transport<RoleServer> for LineTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.writer.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Ok(LineRead::Line) => {}
                Ok(LineRead::TooLong) => {
                    self.reply_error(
                        ErrorData::invalid_request(
                            format!("message longer than {MAX_LINE} bytes; it was discarded"),
                            None,
                        ),
                        None,
                    );
                    continue;
                }
                Ok(LineRead::Eof) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "reading stdin failed");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if std::str::from_utf8(text).is_err() {
                self.reply_error(
                    ErrorData::parse_error("message is not valid UTF-8", None),
                    None,
                );
                continue;
            }
            match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(text) {
                Ok(msg) => return Some(msg),
                Err(e) => {
                    let value = match serde_json::from_slice::<Value>(text) {
                        Ok(v) => v,
                        Err(e) => {
                            self.reply_error(
                                ErrorData::parse_error(format!("not JSON: {e}"), None),
                                None,
                            );
                            continue;
                        }
                    };
                    let id = value
                        .get("id")
                        .cloned()
                        .and_then(|v| serde_json::from_value::<RequestId>(v).ok());
                    // A notification gets no reply, whatever is wrong with it.
                    if id.is_none() && value.get("method").is_some() {
                        tracing::debug!(error = %e, "ignoring a notification that does not parse");
                        continue;
                    }
                    let method = value.get("method").and_then(Value::as_str).unwrap_or("");
                    self.reply_error(
                        ErrorData::invalid_request(
                            format!(
                                "invalid request{}: {e}",
                                if method.is_empty() {
                                    String::new()
                                } else {
                                    format!(" `{method}`")
                                }
                            ),
                            None,
                        ),
                        id,
                    );
                }
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.writer.close()
    }
}
