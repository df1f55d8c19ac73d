//! E2B's control plane: create, get, list, kill, set timeout, pause, connect.
//!
//! Flow at a glance:
//! - Every call carries `X-API-Key`. 401 names `E2B_API_KEY`; 404 is a
//!   sandbox that is gone.
//! - 429 and 5xx (and a connection that fails before any answer) are retried
//!   with exponential backoff and full jitter, honouring `Retry-After`, then
//!   fail saying how often berth tried. `create` carries an `Idempotency-Key`,
//!   so a retried create cannot make two sandboxes.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_core::error::{BackendFailure, Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::connect::http_failure;
use super::{E2bConfig, KIND};

/// A sandbox as create and connect return it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRecord {
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Its template.
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    /// envd's version inside it.
    #[serde(default)]
    pub envd_version: String,
    /// The token envd wants in `X-Access-Token` (secure sandboxes).
    #[serde(default)]
    pub envd_access_token: Option<String>,
    /// The domain its envd is reached under, when not the configured one.
    #[serde(default)]
    pub domain: Option<String>,
}

/// A sandbox as list and get return it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// `running` or `paused`.
    #[serde(default)]
    pub state: String,
    /// RFC 3339 start time.
    #[serde(default)]
    pub started_at: Option<String>,
    /// Its labels.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// What a create asks for.
#[derive(Clone, Debug, Serialize)]
pub struct NewSandbox {
    /// The template name or id.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until it is killed unless extended.
    pub timeout: u64,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// Environment for every process.
    #[serde(rename = "envVars")]
    pub env_vars: BTreeMap<String, String>,
    /// Whether it may reach the internet.
    pub allow_internet_access: bool,
    /// Its egress allow-list (`--network allow:`), E2B's `network`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
}

/// E2B's egress filter: `allowOut` wins over `denyOut`; with `denyOut`
/// every address, only what `allowOut` names gets out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// Names (`*.domain` too), addresses and CIDR blocks let out.
    #[serde(rename = "allowOut", default)]
    pub allow_out: Vec<String>,
    /// Addresses and CIDR blocks kept in.
    #[serde(rename = "denyOut", default)]
    pub deny_out: Vec<String>,
}

impl NetworkConfig {
    /// An allow-list as E2B's filter: the list let out, all else denied.
    pub fn only(list: &berth_policies::egress::AllowList) -> NetworkConfig {
        NetworkConfig {
            allow_out: list.names.iter().chain(&list.nets).cloned().collect(),
            deny_out: vec!["0.0.0.0/0".into()],
        }
    }
}

/// The control-plane client.
pub struct Api {
    http: reqwest::Client,
    cfg: E2bConfig,
}

/// One call's outcome before mapping: status and body.
struct Answer {
    status: u16,
    body: String,
}

impl Api {
    pub(crate) fn new(http: reqwest::Client, cfg: E2bConfig) -> Self {
        Self { http, cfg }
    }

    fn key(&self) -> Result<&str> {
        self.cfg.api_key.as_deref().ok_or_else(|| {
            Error::unreachable(
                KIND,
                BackendFailure::Auth,
                "no E2B API key",
                "set E2B_API_KEY to a key from the E2B dashboard (https://e2b.dev/dashboard?tab=keys)",
            )
        })
    }

    /// Send one call, retrying what is worth retrying.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        doing: &str,
    ) -> Result<Answer> {
        let key = self.key()?.to_string();
        let url = format!("{}{}", self.cfg.api_url.trim_end_matches('/'), path);
        let idem = format!("berth-{:032x}", rand::random::<u128>());
        let policy = &self.cfg.retry;
        let mut last = LastFailure::default();
        for attempt in 0..=policy.retries {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .header("X-API-Key", &key)
                .timeout(policy.request_timeout);
            if method == reqwest::Method::POST && path.ends_with("/sandboxes") {
                req = req.header("Idempotency-Key", &idem);
            }
            if let Some(b) = &body {
                req = req.json(b);
            }
            let wait = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let retry_after = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let should_retry = resp
                        .headers()
                        .get("should-retry")
                        .and_then(|v| v.to_str().ok())
                        .map(|v| v.eq_ignore_ascii_case("true"));
                    let body = resp.text().await.unwrap_or_default();
                    let transient = status == 429 || (500..=599).contains(&status);
                    if !(transient && should_retry != Some(false)) {
                        return Ok(Answer { status, body });
                    }
                    last = LastFailure::status(status, &body);
                    retry_after
                }
                // Only a failure to connect is known not to have reached the
                // server; anything later might have, so it is not retried.
                Err(e) if e.is_connect() => {
                    last = LastFailure::link(format!("cannot connect to {url}"), e);
                    None
                }
                Err(e) => {
                    return Err(Error::unreachable(
                        KIND,
                        http_failure(&e),
                        format!("{doing}: the request to {url} failed"),
                        "check the network and E2B_API_URL / E2B_DOMAIN; the call was not retried because it may have reached E2B",
                    )
                    .caused_by(e));
                }
            };
            if attempt == policy.retries {
                break;
            }
            let backoff = policy.backoff(attempt);
            tokio::time::sleep(wait.map_or(backoff, |w| w.min(policy.max_delay))).await;
        }
        Err(last.gave_up(doing, policy.retries + 1))
    }

    /// Map a non-success answer.
    fn fail(&self, a: &Answer, doing: &str, sandbox: Option<&str>) -> Error {
        let msg = message_of(&a.body);
        match (a.status, sandbox) {
            (401 | 403, _) => Error::unreachable(
                KIND,
                BackendFailure::Auth,
                format!(
                    "{doing}: E2B rejected the API key (HTTP {}: {msg})",
                    a.status
                ),
                "set E2B_API_KEY to a valid key from the E2B dashboard (https://e2b.dev/dashboard?tab=keys)",
            ),
            (404, Some(name)) => gone(name, &format!("E2B has no such sandbox ({doing}: {msg})")),
            _ => Error::backend(
                KIND,
                BackendFailure::from_http_status(a.status),
                format!("{doing}: HTTP {}: {msg}", a.status),
            ),
        }
    }

    /// `POST /v2/sandboxes`.
    pub async fn create(&self, new: &NewSandbox) -> Result<SandboxRecord> {
        let doing = "creating a sandbox";
        let body = serde_json::to_value(new).map_err(|e| {
            Error::backend_call(
                KIND,
                BackendFailure::Local,
                format!("{doing}: cannot encode the request"),
                e,
            )
        })?;
        let a = self
            .call(reqwest::Method::POST, "/v2/sandboxes", Some(body), doing)
            .await?;
        if a.status == 404 || a.status == 400 {
            return Err(Error::InvalidInput(format!(
                "E2B cannot create a sandbox from template `{}`: {} (set the template with --opt template=NAME or BERTH_E2B_TEMPLATE)",
                new.template_id,
                message_of(&a.body)
            )));
        }
        if a.status != 201 && a.status != 200 {
            return Err(self.fail(&a, doing, None));
        }
        parse(&a.body, doing)
    }

    /// `POST /v2/sandboxes/{id}/connect`: resumes a paused sandbox (201) or
    /// extends a running one (200), and returns its envd token either way.
    pub async fn connect(
        &self,
        id: &str,
        name: &str,
        timeout: u64,
    ) -> Result<(SandboxRecord, bool)> {
        let doing = "connecting to the sandbox";
        let a = self
            .call(
                reqwest::Method::POST,
                &format!("/v2/sandboxes/{id}/connect"),
                Some(json!({ "timeout": timeout })),
                doing,
            )
            .await?;
        match a.status {
            200 | 201 => Ok((parse(&a.body, doing)?, a.status == 201)),
            _ => Err(self.fail(&a, doing, Some(name))),
        }
    }

    /// `PUT /sandboxes/{id}/network`: a running sandbox's filter, changed.
    pub async fn set_network(&self, id: &str, name: &str, net: &NetworkConfig) -> Result<()> {
        let doing = "changing the sandbox's network";
        let body = json!({ "allowOut": net.allow_out, "denyOut": net.deny_out });
        let a = self
            .call(
                reqwest::Method::PUT,
                &format!("/sandboxes/{id}/network"),
                Some(body),
                doing,
            )
            .await?;
        match a.status {
            200 | 204 => Ok(()),
            _ => Err(self.fail(&a, doing, Some(name))),
        }
    }

    /// `GET /sandboxes/{id}`: `Ok(None)` when it is gone.
    pub async fn get(&self, id: &str) -> Result<Option<ListedSandbox>> {
        let doing = "looking up the sandbox";
        let a = self
            .call(
                reqwest::Method::GET,
                &format!("/sandboxes/{id}"),
                None,
                doing,
            )
            .await?;
        match a.status {
            200 => Ok(Some(parse(&a.body, doing)?)),
            404 => Ok(None),
            _ => Err(self.fail(&a, doing, None)),
        }
    }

    /// `GET /v2/sandboxes`, running and paused, filtered by `metadata`, all pages.
    pub async fn list(&self, metadata: &[(&str, &str)]) -> Result<Vec<ListedSandbox>> {
        let doing = "listing sandboxes";
        let filter = form_encode(metadata);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..1000 {
            let mut q = vec![
                ("metadata", filter.clone()),
                ("state", "running,paused".to_string()),
                ("limit", "100".to_string()),
            ];
            if let Some(t) = &token {
                q.push(("nextToken", t.clone()));
            }
            let (a, next) = self.list_page(&q, doing).await?;
            if a.status != 200 {
                return Err(self.fail(&a, doing, None));
            }
            let page: Vec<ListedSandbox> = parse(&a.body, doing)?;
            out.extend(page);
            match next {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(out),
            }
        }
        Ok(out)
    }

    async fn list_page(
        &self,
        q: &[(&str, String)],
        doing: &str,
    ) -> Result<(Answer, Option<String>)> {
        // The next-page token travels in a header, which `call` does not keep;
        // a list page is idempotent, so the retry loop is simply repeated here.
        let key = self.key()?.to_string();
        let url = format!("{}/v2/sandboxes", self.cfg.api_url.trim_end_matches('/'));
        let policy = &self.cfg.retry;
        let mut last = LastFailure::default();
        for attempt in 0..=policy.retries {
            let resp = self
                .http
                .get(&url)
                .header("X-API-Key", &key)
                .query(q)
                .timeout(policy.request_timeout)
                .send()
                .await;
            match resp {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let next = r
                        .headers()
                        .get("x-next-token")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let body = r.text().await.unwrap_or_default();
                    if status != 429 && !(500..=599).contains(&status) {
                        return Ok((Answer { status, body }, next));
                    }
                    last = LastFailure::status(status, &body);
                }
                Err(e) => last = LastFailure::link(format!("the request to {url} failed"), e),
            }
            if attempt < policy.retries {
                tokio::time::sleep(policy.backoff(attempt)).await;
            }
        }
        Err(last.gave_up(doing, policy.retries + 1))
    }

    /// `DELETE /sandboxes/{id}`: `Ok(false)` when it was already gone.
    pub async fn kill(&self, id: &str) -> Result<bool> {
        let doing = "killing the sandbox";
        let a = self
            .call(
                reqwest::Method::DELETE,
                &format!("/sandboxes/{id}"),
                None,
                doing,
            )
            .await?;
        match a.status {
            204 | 200 => Ok(true),
            404 => Ok(false),
            _ => Err(self.fail(&a, doing, None)),
        }
    }

    /// `POST /sandboxes/{id}/timeout`: killed `secs` from now unless extended again.
    pub async fn set_timeout(&self, id: &str, name: &str, secs: u64) -> Result<()> {
        let doing = "extending the sandbox's timeout";
        let a = self
            .call(
                reqwest::Method::POST,
                &format!("/sandboxes/{id}/timeout"),
                Some(json!({ "timeout": secs })),
                doing,
            )
            .await?;
        match a.status {
            204 | 200 => Ok(()),
            _ => Err(self.fail(&a, doing, Some(name))),
        }
    }

    /// `POST /sandboxes/{id}/pause`. A sandbox already paused is fine.
    pub async fn pause(&self, id: &str, name: &str) -> Result<()> {
        let doing = "pausing the sandbox";
        let a = self
            .call(
                reqwest::Method::POST,
                &format!("/sandboxes/{id}/pause"),
                None,
                doing,
            )
            .await?;
        match a.status {
            204 | 200 | 409 => Ok(()),
            _ => Err(self.fail(&a, doing, Some(name))),
        }
    }
}

/// `k=v&k2=v2`, each part percent-encoded: the `metadata` filter's form, which
/// the query string then encodes once more.
fn form_encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", pct(k), pct(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse<T: for<'de> Deserialize<'de>>(body: &str, doing: &str) -> Result<T> {
    serde_json::from_str(body).map_err(|e| {
        Error::backend_call(
            KIND,
            BackendFailure::Protocol,
            format!(
                "{doing}: E2B answered with an unexpected body: {}",
                body.chars().take(200).collect::<String>()
            ),
            e,
        )
    })
}

/// The last failure of a retried call, for the error when the retries run out.
#[derive(Default)]
struct LastFailure {
    kind: Option<BackendFailure>,
    text: String,
    source: Option<reqwest::Error>,
}

impl LastFailure {
    /// An answer with a transient status (429, 5xx).
    fn status(status: u16, body: &str) -> Self {
        Self {
            kind: Some(BackendFailure::from_http_status(status)),
            text: format!("HTTP {status}: {}", message_of(body)),
            source: None,
        }
    }

    /// No answer: the request itself failed.
    fn link(text: String, e: reqwest::Error) -> Self {
        Self {
            kind: Some(http_failure(&e)),
            text,
            source: Some(e),
        }
    }

    fn gave_up(self, doing: &str, attempts: u32) -> Error {
        let e = Error::unreachable(
            KIND,
            self.kind.unwrap_or(BackendFailure::Transport),
            format!(
                "{doing}: E2B kept failing after {attempts} attempts (last: {})",
                self.text
            ),
            "E2B is rate-limiting or unavailable; wait and retry, or check https://status.e2b.dev",
        );
        match self.source {
            Some(s) => e.caused_by(s),
            None => e,
        }
    }
}

/// The `message` of an error body, or the body itself.
fn message_of(body: &str) -> String {
    #[derive(Deserialize)]
    struct E {
        message: String,
    }
    serde_json::from_str::<E>(body)
        .map(|e| e.message)
        .unwrap_or_else(|_| body.chars().take(200).collect())
}

/// The sandbox is gone: say how to get a new one.
pub(crate) fn gone(name: &str, reason: &str) -> Error {
    Error::sandbox_gone(
        KIND,
        name,
        reason,
        format!(
            "it timed out or was killed; run the command again to create a new `{name}` (the old one's files are lost), or `berth sandbox rm {name}`"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_filter_is_form_encoded() {
        assert_eq!(
            form_encode(&[("berth.sandbox", "a b&c"), ("k", "v=1")]),
            "berth.sandbox=a%20b%26c&k=v%3D1"
        );
    }
}
