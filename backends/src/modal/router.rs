//! The task command router: the per-task exec service on the worker that runs
//! the sandbox, reached over a second gRPC channel.
//!
//! Flow at a glance:
//! - [`Router::connect`] asks the control plane for access
//!   (`TaskGetCommandRouterAccess` → a URL and a JWT) and opens a lazily
//!   connected channel to that URL.
//! - Every call carries `authorization: Bearer <jwt>`. A JWT close to its
//!   `exp`, or one the router rejects with Unauthenticated, is replaced by
//!   asking the control plane again.
//! - [`Router::unary`] retries the retryable codes; the exec RPCs are safe to
//!   repeat because the client names the exec (`exec_id`) and stdin writes
//!   carry their offset.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use berth_core::error::Result;
use tokio::sync::Mutex;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::auth::CachedToken;
use super::client::{ControlPlane, MAX_RETRIES, backoff, endpoint, retryable};
use super::proto::client::TaskGetCommandRouterAccessRequest;
use super::proto::task_command_router::task_command_router_client::TaskCommandRouterClient;

/// A connection to one task's command router.
pub struct Router {
    control: Arc<ControlPlane>,
    pub(crate) task_id: String,
    stub: TaskCommandRouterClient<Channel>,
    jwt: Mutex<CachedToken>,
}

impl Router {
    /// Get access to `task_id`'s router and open a channel to it.
    pub async fn connect(control: Arc<ControlPlane>, task_id: &str) -> Result<Self> {
        let access = control
            .call(
                "TaskGetCommandRouterAccess",
                TaskGetCommandRouterAccessRequest {
                    task_id: task_id.to_string(),
                },
                |mut c, r| async move { c.task_get_command_router_access(r).await },
            )
            .await?;
        let channel = endpoint(&access.url)?.connect_lazy();
        Ok(Self {
            control,
            task_id: task_id.to_string(),
            stub: TaskCommandRouterClient::new(channel).max_decoding_message_size(64 * 1024 * 1024),
            jwt: Mutex::new(CachedToken::new(access.jwt)),
        })
    }

    /// The current JWT; a new one when the old one is due for refresh or
    /// `force` says the router rejected it.
    async fn jwt(&self, force: bool) -> Result<String, Status> {
        let mut slot = self.jwt.lock().await;
        if !force && slot.fresh() {
            return Ok(slot.token.clone());
        }
        let access = self
            .control
            .unary(
                "TaskGetCommandRouterAccess",
                TaskGetCommandRouterAccessRequest {
                    task_id: self.task_id.clone(),
                },
                |mut c, r| async move { c.task_get_command_router_access(r).await },
            )
            .await;
        match access {
            Ok(a) => {
                *slot = CachedToken::new(a.jwt);
                Ok(slot.token.clone())
            }
            // Keep using a token that has not expired yet.
            Err(e)
                if !force
                    && super::auth::jwt_expiry(&slot.token)
                        .is_some_and(|exp| exp > SystemTime::now()) =>
            {
                tracing::debug!(error = %e, "router JWT refresh failed; using the current one");
                Ok(slot.token.clone())
            }
            Err(e) => Err(e),
        }
    }

    async fn request<Q>(&self, q: Q, force: bool) -> Result<Request<Q>, Status> {
        let jwt = self.jwt(force).await?;
        let mut r = Request::new(q);
        let v = AsciiMetadataValue::try_from(format!("Bearer {jwt}"))
            .map_err(|_| Status::unauthenticated("the router JWT is not a valid header value"))?;
        r.metadata_mut().insert("authorization", v);
        Ok(r)
    }

    /// Call a unary router RPC: refresh the JWT once on Unauthenticated, retry
    /// the retryable codes with backoff.
    pub async fn unary<Q, R, F, Fut>(&self, rpc: &'static str, req: Q, f: F) -> Result<R, Status>
    where
        Q: Clone,
        F: Fn(TaskCommandRouterClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, Status>>,
    {
        let mut attempt = 0u32;
        let mut force = false;
        let mut refreshed = false;
        loop {
            let r = self.request(req.clone(), force).await?;
            force = false;
            match f(self.stub.clone(), r).await {
                Ok(resp) => return Ok(resp.into_inner()),
                Err(s) if s.code() == Code::Unauthenticated && !refreshed => {
                    tracing::debug!(rpc, "router JWT rejected; asking for a new one");
                    refreshed = true;
                    force = true;
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

    /// Open a server stream, refreshing the JWT once on Unauthenticated. The
    /// caller resumes a stream that breaks later.
    pub async fn stream<Q, S, F, Fut>(&self, req: Q, f: F) -> Result<S, Status>
    where
        Q: Clone,
        F: Fn(TaskCommandRouterClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<S>, Status>>,
    {
        let r = self.request(req.clone(), false).await?;
        match f(self.stub.clone(), r).await {
            Ok(s) => Ok(s.into_inner()),
            Err(s) if s.code() == Code::Unauthenticated => {
                let r = self.request(req, true).await?;
                f(self.stub.clone(), r).await.map(|s| s.into_inner())
            }
            Err(s) => Err(s),
        }
    }

    /// The control plane this router was reached through.
    pub fn control(&self) -> &Arc<ControlPlane> {
        &self.control
    }
}
