//! The control-plane connection: one gRPC channel to `modal.client.ModalClient`,
//! with Modal's headers on every call and retries that are safe to repeat.
//!
//! Flow at a glance:
//! - [`ControlPlane::connect`] opens a lazily connected channel: TLS with the
//!   webpki roots for `https://` (api.modal.com), plain HTTP/2 for `http://`.
//! - [`ControlPlane::unary`] decorates a request (token headers, the JWT from
//!   `AuthTokenGet`, an `x-idempotency-key` that stays the same across the
//!   attempts of one call, `x-retry-attempt`) and retries Unavailable,
//!   DeadlineExceeded, Internal and Unknown with backoff.
//! - [`status_error`] turns what is left into berth's errors: credentials
//!   rejected (naming the variables), service unavailable, or the RPC's own.

use std::future::Future;
use std::time::Duration;

use berth_core::backend::BackendKind;
use berth_core::error::{BackendFailure, Error, Result};
use tokio::sync::Mutex;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

use super::auth::{CLIENT_TYPE, CLIENT_VERSION, CREDENTIALS_HINT, CachedToken, Resolved};
use super::proto::client::AuthTokenGetRequest;
use super::proto::client::modal_client_client::ModalClientClient;

/// The backend's short name, for this module's errors. Spelled from
/// [`BackendKind`] rather than taken from the parent module, which uses this one.
const KIND: &str = BackendKind::Modal.as_str();

/// How many times a retryable failure is tried again.
pub(crate) const MAX_RETRIES: u32 = 8;
/// The first pause between attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long one unary call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The codes a call may be repeated on: the spec's retryable set.
pub(crate) fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Internal | Code::Unknown
    )
}

/// The pause before attempt `attempt` (1-based) of a retried call.
pub(crate) fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1u32 << attempt.min(10).saturating_sub(1))
        .min(MAX_BACKOFF)
}

/// A random id: exec ids and idempotency keys, in the UUID v4 text form.
pub(crate) fn random_id() -> String {
    let b: [u8; 16] = rand::random();
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-4{}-{:x}{}-{}",
        h(0..4),
        h(4..6),
        &h(6..8)[1..],
        8 | (b[8] & 3),
        &h(8..10)[1..],
        h(10..16)
    )
}

/// An endpoint for `url`: TLS with the public roots for https.
pub(crate) fn endpoint(url: &str) -> Result<Endpoint> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::InvalidInput(format!("modal: bad server URL {url:?}: {e}"))
    };
    let mut ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| bad(&e))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        ep = ep
            .tls_config(ClientTlsConfig::new().with_webpki_roots())
            .map_err(|e| bad(&e))?;
    } else if !url.starts_with("http://") {
        return Err(bad(
            &"use https://host[:port] (or http:// for a local server)",
        ));
    }
    Ok(ep)
}

/// A connection to Modal's control plane.
pub struct ControlPlane {
    pub(crate) cfg: Resolved,
    stub: ModalClientClient<Channel>,
    token: Mutex<Option<CachedToken>>,
}

impl ControlPlane {
    /// A lazily connected channel to `cfg.server_url`.
    pub fn connect(cfg: Resolved) -> Result<Self> {
        let channel = endpoint(&cfg.server_url)?.connect_lazy();
        Ok(Self {
            cfg,
            stub: ModalClientClient::new(channel).max_decoding_message_size(64 * 1024 * 1024),
            token: Mutex::new(None),
        })
    }

    /// Modal's headers: who is calling, and with which token.
    fn headers(&self, m: &mut MetadataMap) -> Result<(), Status> {
        let v = |s: &str| {
            AsciiMetadataValue::try_from(s).map_err(|_| {
                Status::unauthenticated("a credential holds characters a header cannot carry")
            })
        };
        m.insert("x-modal-client-type", v(CLIENT_TYPE)?);
        m.insert("x-modal-client-version", v(CLIENT_VERSION)?);
        m.insert("x-modal-token-id", v(&self.cfg.token_id)?);
        m.insert("x-modal-token-secret", v(&self.cfg.token_secret)?);
        Ok(())
    }

    /// The JWT for `x-modal-auth-token`, fetched or refreshed when due.
    async fn auth_token(&self) -> Result<String, Status> {
        let mut slot = self.token.lock().await;
        if let Some(t) = slot.as_ref().filter(|t| t.fresh()) {
            return Ok(t.token.clone());
        }
        let resp = self.fetch_auth_token().await;
        match resp {
            Ok(r) if !r.token.is_empty() => {
                let t = CachedToken::new(r.token);
                let tok = t.token.clone();
                *slot = Some(t);
                Ok(tok)
            }
            Ok(_) => Err(Status::internal("AuthTokenGet returned an empty token")),
            // A still-valid old token beats a failed refresh.
            Err(e) => match slot.as_ref() {
                Some(old)
                    if super::auth::jwt_expiry(&old.token)
                        .is_some_and(|exp| exp > std::time::SystemTime::now()) =>
                {
                    Ok(old.token.clone())
                }
                _ => Err(e),
            },
        }
    }

    /// `AuthTokenGet`, with the token headers only, retried like any call.
    async fn fetch_auth_token(&self) -> Result<super::proto::client::AuthTokenGetResponse, Status> {
        let key = random_id();
        let mut attempt = 0u32;
        loop {
            let mut r = Request::new(AuthTokenGetRequest {});
            r.set_timeout(CALL_TIMEOUT);
            self.headers(r.metadata_mut())?;
            stamp(r.metadata_mut(), &key, attempt);
            match self.stub.clone().auth_token_get(r).await {
                Ok(resp) => return Ok(resp.into_inner()),
                Err(s) if retryable(s.code()) && attempt < MAX_RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(s) => return Err(s),
            }
        }
    }

    /// Forget the JWT, so the next call fetches a new one.
    async fn drop_token(&self) {
        *self.token.lock().await = None;
    }

    /// Call a unary RPC with Modal's headers and the JWT, retrying the
    /// retryable codes under one idempotency key.
    pub async fn unary<Q, R, F, Fut>(&self, rpc: &'static str, req: Q, f: F) -> Result<R, Status>
    where
        Q: Clone,
        F: Fn(ModalClientClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, Status>>,
    {
        self.raw_unary(rpc, req, true, f).await
    }

    /// Like [`unary`](Self::unary), mapping a failure to berth's error.
    pub async fn call<Q, R, F, Fut>(&self, rpc: &'static str, req: Q, f: F) -> Result<R>
    where
        Q: Clone,
        F: Fn(ModalClientClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, Status>>,
    {
        self.unary(rpc, req, f)
            .await
            .map_err(|s| status_error(&self.cfg, rpc, s))
    }

    /// Open a server stream with Modal's headers and the JWT (no retries: a
    /// stream's caller resumes it from where it got to).
    pub async fn stream<Q, S, F, Fut>(&self, rpc: &'static str, req: Q, f: F) -> Result<S, Status>
    where
        F: FnOnce(ModalClientClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<S>, Status>>,
    {
        let mut r = Request::new(req);
        self.decorate(&mut r, true).await?;
        tracing::trace!(rpc, "opening stream");
        f(self.stub.clone(), r).await.map(|r| r.into_inner())
    }

    async fn decorate<Q>(&self, r: &mut Request<Q>, with_jwt: bool) -> Result<(), Status> {
        self.headers(r.metadata_mut())?;
        if with_jwt {
            let tok = self.auth_token().await?;
            if let Ok(v) = AsciiMetadataValue::try_from(tok.as_str()) {
                r.metadata_mut().insert("x-modal-auth-token", v);
            }
        }
        Ok(())
    }

    async fn raw_unary<Q, R, F, Fut>(
        &self,
        rpc: &'static str,
        req: Q,
        with_jwt: bool,
        f: F,
    ) -> Result<R, Status>
    where
        Q: Clone,
        F: Fn(ModalClientClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, Status>>,
    {
        let key = random_id();
        let mut attempt = 0u32;
        let mut refreshed = false;
        loop {
            let mut r = Request::new(req.clone());
            r.set_timeout(CALL_TIMEOUT);
            // AuthTokenGet retried on its own; its failure is final.
            self.decorate(&mut r, with_jwt).await?;
            stamp(r.metadata_mut(), &key, attempt);
            match f(self.stub.clone(), r).await {
                Ok(resp) => return Ok(resp.into_inner()),
                // An expired JWT: fetch a new one once, then try again.
                Err(s) if s.code() == Code::Unauthenticated && with_jwt && !refreshed => {
                    tracing::debug!(rpc, "auth token rejected; fetching a new one");
                    refreshed = true;
                    self.drop_token().await;
                }
                Err(s) if retryable(s.code()) && attempt < MAX_RETRIES => {
                    attempt += 1;
                    tracing::debug!(rpc, attempt, code = ?s.code(), msg = s.message(), "retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(s) => return Err(s),
            }
        }
    }
}

/// Mark an attempt of a call: the same key on every attempt, so the server
/// can tell a retry from a new call.
fn stamp(m: &mut MetadataMap, key: &str, attempt: u32) {
    if let Ok(v) = AsciiMetadataValue::try_from(key) {
        m.insert("x-idempotency-key", v);
    }
    if let Ok(v) = AsciiMetadataValue::try_from(attempt.to_string()) {
        m.insert("x-retry-attempt", v);
    }
}

/// How a gRPC call failed, from its status code.
pub(crate) fn grpc_failure(code: Code) -> BackendFailure {
    match code {
        Code::Unauthenticated | Code::PermissionDenied => BackendFailure::Auth,
        Code::DeadlineExceeded => BackendFailure::Timeout,
        // tonic reports a failed or dropped connection as `Unavailable`.
        Code::Unavailable => BackendFailure::Transport,
        Code::ResourceExhausted => BackendFailure::Exhausted,
        _ => BackendFailure::Rejected,
    }
}

/// berth's error for a failed control-plane call. The status is classified
/// by its code, and its message goes into the text; the status itself is not
/// kept as the source, since its `Display` is a dump of code, message, details
/// and metadata that would repeat the text and show the call's headers.
pub(crate) fn status_error(cfg: &Resolved, rpc: &str, s: Status) -> Error {
    let kind = grpc_failure(s.code());
    match s.code() {
        Code::Unauthenticated | Code::PermissionDenied => Error::unreachable(
            KIND,
            kind,
            format!(
                "Modal at {} rejected token `{}` ({}) on {rpc}: {}",
                cfg.server_url,
                cfg.token_id,
                cfg.source,
                s.message()
            ),
            CREDENTIALS_HINT,
        ),
        c if retryable(c) => Error::unreachable(
            KIND,
            kind,
            format!(
                "Modal at {} did not answer {rpc} after {} attempts: {:?}: {}",
                cfg.server_url,
                MAX_RETRIES + 1,
                c,
                s.message()
            ),
            "check the network and MODAL_SERVER_URL, or retry when https://status.modal.com says Modal is up",
        ),
        c => Error::backend(KIND, kind, format!("{rpc}: {c:?}: {}", s.message())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_look_like_uuids_and_differ() {
        let a = random_id();
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4');
        assert_ne!(a, random_id());
    }

    #[test]
    fn statuses_classify_by_code() {
        let cfg = Resolved {
            server_url: "https://api.modal.com".into(),
            token_id: "ak-1".into(),
            token_secret: "as-1".into(),
            source: "test".into(),
            environment: String::new(),
            app: "berth".into(),
        };
        let e = status_error(&cfg, "SandboxCreate", Status::unauthenticated("bad token"));
        assert!(matches!(e, Error::Unreachable { .. }), "{e}");
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
        let e = status_error(&cfg, "SandboxCreate", Status::permission_denied("no"));
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
        let e = status_error(&cfg, "SandboxCreate", Status::unavailable("down"));
        assert!(matches!(e, Error::Unreachable { .. }), "{e}");
        assert_eq!(e.backend_kind(), Some(BackendFailure::Transport));
        let e = status_error(&cfg, "SandboxCreate", Status::deadline_exceeded("slow"));
        assert_eq!(e.backend_kind(), Some(BackendFailure::Timeout));
        let e = status_error(&cfg, "SandboxCreate", Status::resource_exhausted("quota"));
        assert!(matches!(e, Error::Backend { .. }), "{e}");
        assert_eq!(e.backend_kind(), Some(BackendFailure::Exhausted));
        let e = status_error(&cfg, "SandboxCreate", Status::invalid_argument("bad image"));
        assert_eq!(e.backend_kind(), Some(BackendFailure::Rejected));
        assert!(e.to_string().contains("bad image"), "{e}");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) < backoff(2));
        assert_eq!(backoff(30), MAX_BACKOFF);
    }
}
