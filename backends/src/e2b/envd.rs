//! The client of one sandbox's envd: process calls and `/files`.
//!
//! Every request names the sandbox twice, as the official SDK does: by its
//! host (`49983-{id}.{domain}`) and by the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers, which a shared `E2B_SANDBOX_URL` relies on.
//! `X-Access-Token` carries the sandbox's envd token and
//! `Authorization: Basic base64("user:")` picks the user.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::connect::{self, CallError, ServerStream};
use super::proto::{EntryInfo, PathRequest, StatResponse};

/// envd's port inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// How often envd should send a keepalive on a quiet stream (seconds).
const KEEPALIVE_SECS: u64 = 30;

/// One sandbox's envd.
#[derive(Clone)]
pub struct Envd {
    http: reqwest::Client,
    base: String,
    sandbox_id: String,
    token: Option<String>,
    user: String,
    unary_timeout: Duration,
}

impl Envd {
    pub(crate) fn new(
        http: reqwest::Client,
        base: String,
        sandbox_id: String,
        token: Option<String>,
        user: String,
    ) -> Self {
        Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            sandbox_id,
            token,
            user,
            unary_timeout: Duration::from_secs(60),
        }
    }

    /// The base URL in use.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", &self.sandbox_id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
            .header(
                "Authorization",
                format!("Basic {}", B64.encode(format!("{}:", self.user))),
            );
        if let Some(t) = &self.token {
            r = r.header("X-Access-Token", t);
        }
        r
    }

    /// A unary Connect call: `/{service}/{method}` with bare JSON both ways.
    pub async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        req: &Req,
    ) -> Result<Resp, CallError> {
        let body =
            serde_json::to_vec(req).map_err(|e| CallError::Protocol(format!("encoding: {e}")))?;
        let resp = self
            .request(reqwest::Method::POST, path)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .header(
                "Connect-Timeout-Ms",
                self.unary_timeout.as_millis().to_string(),
            )
            .timeout(self.unary_timeout + Duration::from_secs(5))
            .body(body)
            .send()
            .await
            .map_err(CallError::Transport)?;
        if !resp.status().is_success() {
            return Err(connect::error_from(resp).await);
        }
        let bytes = resp.bytes().await.map_err(CallError::Transport)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| CallError::Protocol(format!("undecodable {path} response: {e}")))
    }

    /// A server-streaming Connect call. `deadline` becomes `Connect-Timeout-Ms`,
    /// which envd also applies to the process it starts.
    pub async fn stream<Req: Serialize>(
        &self,
        path: &str,
        req: &Req,
        deadline: Option<Duration>,
    ) -> Result<ServerStream, CallError> {
        let payload =
            serde_json::to_vec(req).map_err(|e| CallError::Protocol(format!("encoding: {e}")))?;
        let mut r = self
            .request(reqwest::Method::POST, path)
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", KEEPALIVE_SECS.to_string())
            .body(connect::encode(0, &payload));
        if let Some(d) = deadline {
            r = r.header("Connect-Timeout-Ms", d.as_millis().max(1).to_string());
        }
        let resp = r.send().await.map_err(CallError::Transport)?;
        if !resp.status().is_success() {
            return Err(connect::error_from(resp).await);
        }
        Ok(ServerStream::new(resp))
    }

    /// `filesystem.Filesystem/Stat`: what is at `path`, or `None` when
    /// nothing is.
    pub async fn stat(&self, path: &str) -> Result<Option<EntryInfo>, CallError> {
        let req = PathRequest { path };
        match self
            .unary::<_, StatResponse>("/filesystem.Filesystem/Stat", &req)
            .await
        {
            Ok(r) => Ok(Some(r.entry.unwrap_or_default())),
            Err(CallError::Status { code, .. }) if code == "not_found" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `filesystem.Filesystem/Remove`.
    pub async fn remove(&self, path: &str) -> Result<(), CallError> {
        let req = PathRequest { path };
        self.unary::<_, serde_json::Value>("/filesystem.Filesystem/Remove", &req)
            .await
            .map(drop)
    }

    /// `GET /files?path=`: at most `limit` bytes of the file.
    pub async fn download(&self, path: &str, limit: u64) -> Result<Vec<u8>, CallError> {
        use futures::StreamExt;
        let resp = self
            .request(reqwest::Method::GET, "/files")
            .query(&[("path", path), ("username", self.user.as_str())])
            .send()
            .await
            .map_err(CallError::Transport)?;
        if !resp.status().is_success() {
            return Err(connect::error_from(resp).await);
        }
        let mut out = Vec::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(CallError::Transport)?;
            let room = (limit as usize).saturating_sub(out.len());
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if out.len() as u64 >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// `POST /files?path=` as `application/octet-stream`; envd creates the
    /// parent directories.
    pub async fn upload(&self, path: &str, data: Vec<u8>) -> Result<(), CallError> {
        let resp = self
            .request(reqwest::Method::POST, "/files")
            .query(&[("path", path), ("username", self.user.as_str())])
            .header("Content-Type", "application/octet-stream")
            .body(data)
            .send()
            .await
            .map_err(CallError::Transport)?;
        if !resp.status().is_success() {
            return Err(connect::error_from(resp).await);
        }
        Ok(())
    }
}
