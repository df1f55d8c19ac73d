//! The CLI's side of the typed API (`berth.v1`): one connection to the
//! server, or with `BERTH_SERVER=off` the same [`berth_service::Service`]
//! in this process; and a follower's way on to the next server when its own
//! goes.
//!
//! A follower (`job logs --follow`, `job wait`, `events --follow`) outlives
//! its server: when the server stops or dies under it, it reconnects
//! (starting a server unless `BERTH_SERVER=require`), with a growing pause,
//! for at most [`RECONNECT_DEADLINE`], and carries on from the position it
//! reached (an output offset, an event id), as `tail -F` does: nothing is
//! printed twice, nothing is left out.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::{context, server};

/// Where a typed call goes.
pub enum Api {
    /// The server, over its socket.
    Served(Channel),
    /// The service in this process, on a runtime of its own.
    Here(Arc<berth_service::Service>),
}

impl Api {
    /// The server of state dir `dir` (started if need be, as `mode` says),
    /// or with [`server::Mode::Off`] a service in this process.
    pub async fn open(dir: &Path, mode: server::Mode) -> Result<Api> {
        if mode == server::Mode::Off {
            let rt = Arc::new(context::runtime(Some(dir.to_path_buf()))?);
            let policy = context::policy_path().ok();
            return Ok(Api::Here(Arc::new(berth_service::Service::new(rt, policy))));
        }
        Ok(Api::Served(
            server::client::connect(dir, mode).await?.channel,
        ))
    }

    /// Shut the in-process runtime down (its shells, its connections).
    pub async fn close(self) {
        if let Api::Here(svc) = self {
            svc.runtime().shutdown().await;
        }
    }
}

/// A refusal or failure from the server as berth's error: its message,
/// which says what to do.
pub fn error(s: Status) -> anyhow::Error {
    anyhow!("{}", s.message())
}

/// Whether a call's status means the connection to the server ended under
/// it (the server died, or stopped and said so), not that the server
/// answered with a refusal or a failure of its own.
pub fn lost(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

/// How long a follower tries to reach a server again after losing one.
pub const RECONNECT_DEADLINE: Duration = Duration::from_secs(60);

/// A follower's way on to the next server.
pub struct Reconnect {
    dir: PathBuf,
    mode: server::Mode,
    /// When the server was first lost, since one last answered.
    lost_at: Option<Instant>,
    /// Whether the user was told.
    told: bool,
    pause: Duration,
}

impl Reconnect {
    pub fn new(dir: &Path, mode: server::Mode) -> Reconnect {
        Reconnect {
            dir: dir.to_path_buf(),
            mode,
            lost_at: None,
            told: false,
            pause: Duration::from_millis(50),
        }
    }

    /// A server answered: the next loss starts its deadline afresh.
    pub fn answered(&mut self) {
        self.lost_at = None;
        self.pause = Duration::from_millis(50);
    }

    /// The server was lost (`why`): a connection to the next one, or an
    /// error past the deadline that ends with `note` (where to resume by
    /// hand). `None`: Ctrl-C while waiting.
    pub async fn again(&mut self, why: String, note: &str) -> Result<Option<Channel>> {
        let mut why = why;
        loop {
            let at = *self.lost_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= RECONNECT_DEADLINE {
                bail!(
                    "{why}; no berth server answered within {}s; {note}",
                    RECONNECT_DEADLINE.as_secs()
                );
            }
            if !self.told {
                eprintln!(
                    "berth: the call to the berth server ended ({why}); reconnecting to carry on"
                );
                self.told = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.pause) => {}
                _ = tokio::signal::ctrl_c() => return Ok(None),
            }
            self.pause = (self.pause * 2).min(Duration::from_secs(1));
            match server::client::connect(&self.dir, self.mode).await {
                Ok(s) => return Ok(Some(s.channel)),
                Err(e) => why = crate::error_text(&e),
            }
        }
    }
}

/// Write bytes to stdout as they come (a closed stdout ends the process
/// with 141, as SIGPIPE would).
pub use crate::io::out;

/// A backend named on the command line.
pub fn backend_kind(name: &str) -> Result<berth_core::backend::BackendKind> {
    berth_core::backend::BackendKind::named(name).map_err(|e| anyhow!(e))
}

/// `--backend`'s parser: a name berth knows, or clap's error naming them.
pub fn parse_backend(name: &str) -> std::result::Result<berth_core::backend::BackendKind, String> {
    berth_core::backend::BackendKind::named(name)
}

/// `--network`'s text: `off`, `on`, `allow:HOST,HOST…`.
pub fn parse_network(text: &str) -> std::result::Result<berth_core::backend::Network, String> {
    berth_core::backend::Network::parse(text)
}

/// A sandbox named on the command line, as the API names it.
pub fn sandbox_ref(
    backend: berth_core::backend::BackendKind,
    name: &str,
) -> Result<berth_service::proto::SandboxRef> {
    Ok(berth_service::proto::SandboxRef {
        backend: berth_service::convert::backend_out(backend) as i32,
        name: name.to_string(),
    })
}

/// One unary call of the typed API: through the server's `$client`, or on
/// the in-process API's `$service` handler. The reply, or berth's error.
macro_rules! call {
    ($api:expr, $client:ident, $service:ident, $method:ident, $req:expr) => {{
        let req = $req;
        match $api {
            $crate::api_client::Api::Served(ch) => $client::new(ch.clone()).$method(req).await,
            $crate::api_client::Api::Here(svc) => {
                <berth_service::api::Api as $service>::$method(
                    &berth_service::api::Api::in_process(svc.clone()),
                    tonic::Request::new(req),
                )
                .await
            }
        }
        .map(tonic::Response::into_inner)
        .map_err($crate::api_client::error)
    }};
}
pub(crate) use call;
