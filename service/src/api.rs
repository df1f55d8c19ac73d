//! `berth.v1` served: each gRPC service a thin map from its messages to
//! [`Service`] and back.
//!
//! Every call first checks its connection's [`Caller`] (the peer's uid, read
//! from the kernel by the server). Calls that last (`Jobs.Logs` with
//! `follow`, `Jobs.Wait`) hold the server as a running call does, so it
//! neither idles out under them nor drains them at a shutdown: a stopping
//! server ends them with UNAVAILABLE, and a follower asks the next server
//! from the offset it got to.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use berth_core::backend::{Limits, SandboxSpec};
use berth_core::jobs::JobOptions;
use futures::Stream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::convert::{self, status, status_any, target};
use crate::proto;
use crate::proto::approvals_server::{Approvals, ApprovalsServer};
use crate::proto::commands_server::{Commands, CommandsServer};
use crate::proto::events_server::{Events, EventsServer};
use crate::proto::files_server::{Files, FilesServer};
use crate::proto::jobs_server::{Jobs, JobsServer};
use crate::proto::sandboxes_server::{Sandboxes, SandboxesServer};
use crate::service::{READ_MAX, Service};

/// A stream of a call's replies.
pub type Replies<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A boxed future a [`Host`] returns.
pub type HostFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A call the server counts as running while this is held.
pub struct Held {
    /// Dropped when the call ends.
    pub guard: Box<dyn Send + Sync>,
    /// Cancelled when the server stops: end the call, do not drain it.
    pub stopping: CancellationToken,
}

/// What the server lends the API: its own exec path (counted, interrupted
/// at a shutdown or when the client goes away, as the CLI's calls are) and
/// its count of running calls.
pub trait Host: Send + Sync + 'static {
    /// Run `req` as the server runs a CLI `exec`.
    fn exec(
        &self,
        req: proto::ExecRequest,
    ) -> HostFuture<Result<Replies<proto::ExecEvent>, Status>>;
    /// Interrupt running call `call_id`; whether it ran.
    fn interrupt(&self, call_id: &str) -> bool;
    /// Count a lasting call as running until the guard is dropped.
    fn hold(&self) -> Held;
}

/// Who is calling, as the server read it from the kernel: `None` when the
/// peer may use this server, else why not.
#[derive(Clone)]
pub struct Caller {
    refusal: Option<String>,
    /// The server's count of typed calls answered (`berth server status`).
    calls: Arc<std::sync::atomic::AtomicU64>,
}

impl Caller {
    /// A peer that may call; each call it makes counts in `calls`.
    pub fn allowed(calls: Arc<std::sync::atomic::AtomicU64>) -> Caller {
        Caller {
            refusal: None,
            calls,
        }
    }

    /// A peer refused, with why (every call gets PERMISSION_DENIED).
    pub fn refused(why: impl Into<String>) -> Caller {
        Caller {
            refusal: Some(why.into()),
            calls: Arc::default(),
        }
    }

    fn check(&self) -> Result<(), Status> {
        match &self.refusal {
            None => {
                self.calls.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Some(why) => Err(Status::permission_denied(why.clone())),
        }
    }
}

/// One connection's view of the API: each service's handlers.
#[derive(Clone)]
pub struct Api {
    svc: Arc<Service>,
    host: Arc<dyn Host>,
    caller: Caller,
}

impl Api {
    /// The API in this process, for a front end with no server
    /// (`BERTH_SERVER=off`): the same handlers, called directly, so both
    /// ways answer alike. It runs no commands (`Commands.Exec` is the
    /// server's: in-process, a front end runs them on the runtime).
    pub fn in_process(svc: Arc<Service>) -> Api {
        Api {
            svc,
            host: Arc::new(NoServer),
            caller: Caller::allowed(Arc::default()),
        }
    }
}

/// The [`Host`] of an in-process [`Api`]: no server to lend its exec path
/// or to stop under a lasting call.
struct NoServer;

impl Host for NoServer {
    fn exec(
        &self,
        _req: proto::ExecRequest,
    ) -> HostFuture<Result<Replies<proto::ExecEvent>, Status>> {
        Box::pin(async {
            Err(Status::unimplemented(
                "commands run through a berth server; in-process, run them on the runtime",
            ))
        })
    }

    fn interrupt(&self, _call_id: &str) -> bool {
        false
    }

    fn hold(&self) -> Held {
        Held {
            guard: Box::new(()),
            stopping: CancellationToken::new(),
        }
    }
}

/// Every `berth.v1` service for one connection, to add to the server's
/// routes beside its own.
pub fn add_to(
    routes: tonic::service::Routes,
    svc: Arc<Service>,
    host: Arc<dyn Host>,
    caller: Caller,
) -> tonic::service::Routes {
    let api = Api { svc, host, caller };
    // A file travels whole in one message: take the largest one berth reads.
    let file_cap = READ_MAX as usize + 64 * 1024;
    routes
        .add_service(SandboxesServer::new(api.clone()))
        .add_service(CommandsServer::new(api.clone()).max_decoding_message_size(file_cap))
        .add_service(
            FilesServer::new(api.clone())
                .max_decoding_message_size(file_cap)
                .max_encoding_message_size(file_cap),
        )
        .add_service(JobsServer::new(api.clone()))
        .add_service(ApprovalsServer::new(api.clone()))
        .add_service(EventsServer::new(api))
}

#[tonic::async_trait]
impl Sandboxes for Api {
    async fn create(
        &self,
        req: Request<proto::CreateSandbox>,
    ) -> Result<Response<proto::Sandbox>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        let spec = SandboxSpec {
            name: name.clone(),
            image: r.image,
            env: r.env.into_iter().collect(),
            network: crate::convert::network(r.network, r.network_rules),
            limits: Limits {
                memory_mb: r.memory_mb,
                milli_cpu: r.milli_cpu,
                pids: r.pids,
            },
            options: r.options.into_iter().collect(),
            ..Default::default()
        };
        if let Some(pool) = r.from_pool {
            // The pool names the backend; one given must be its.
            let asked = r.sandbox.as_ref().map_or(0, |s| s.backend);
            let backend = (asked != proto::Backend::Unspecified as i32).then_some(backend);
            let got = self
                .svc
                .take_from_pool(&pool, backend, &spec)
                .await
                .map_err(status)?;
            return Ok(Response::new(proto::Sandbox {
                sandbox: Some(convert::sandbox_ref(got.backend, &name)),
                workdir: got.workdir,
                created: true,
                recreated: None,
                state: String::new(),
                created_at_ms: None,
                last_used_ms: None,
                id: None,
                orphan: false,
                pool_member: got.instance,
            }));
        }
        let made = self
            .svc
            .create_sandbox(backend, spec)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Sandbox {
            sandbox: Some(convert::sandbox_ref(backend, &name)),
            workdir: made.workdir,
            created: made.created,
            recreated: made.recreated,
            // Not looked at here: a listing says how a sandbox stands.
            state: String::new(),
            created_at_ms: None,
            last_used_ms: None,
            id: None,
            orphan: false,
            pool_member: None,
        }))
    }

    async fn create_pool(
        &self,
        req: Request<proto::CreatePoolRequest>,
    ) -> Result<Response<proto::Pool>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let settings = r.settings.unwrap_or_default();
        let (backend, _) = target(settings.sandbox.as_ref())?;
        let spec = SandboxSpec {
            name: String::new(),
            image: settings.image,
            env: settings.env.into_iter().collect(),
            network: crate::convert::network(settings.network, settings.network_rules),
            limits: Limits {
                memory_mb: settings.memory_mb,
                milli_cpu: settings.milli_cpu,
                pids: settings.pids,
            },
            options: settings.options.into_iter().collect(),
            ..Default::default()
        };
        let pool = self
            .svc
            .create_pool(&r.name, backend, r.size, spec, r.wait)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::pool(pool)))
    }

    async fn pools(
        &self,
        req: Request<proto::ListPools>,
    ) -> Result<Response<proto::PoolList>, Status> {
        self.caller.check()?;
        let _ = req.into_inner();
        let pools = self.svc.pools().map_err(status)?;
        Ok(Response::new(proto::PoolList {
            pools: pools.into_iter().map(convert::pool).collect(),
        }))
    }

    async fn fill_pool(
        &self,
        req: Request<proto::PoolRef>,
    ) -> Result<Response<proto::Pool>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let pool = self.svc.fill_pool(&r.name).await.map_err(status)?;
        Ok(Response::new(convert::pool(pool)))
    }

    async fn remove_pool(
        &self,
        req: Request<proto::PoolRef>,
    ) -> Result<Response<proto::PoolRemoved>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let members = self.svc.remove_pool(&r.name).await.map_err(status)?;
        Ok(Response::new(proto::PoolRemoved { members }))
    }

    async fn list(
        &self,
        req: Request<proto::ListSandboxes>,
    ) -> Result<Response<proto::SandboxList>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (rows, failed) = if r.all {
            self.svc.list_all_sandboxes().await.map_err(status)?
        } else {
            let backend = convert::backend(r.backend)?;
            (
                self.svc.list_sandboxes(backend).await.map_err(status)?,
                Vec::new(),
            )
        };
        Ok(Response::new(proto::SandboxList {
            sandboxes: rows.into_iter().map(convert::sandbox_status).collect(),
            failed: failed
                .into_iter()
                .map(|(b, error)| proto::BackendFailure {
                    backend: convert::backend_out(b) as i32,
                    error,
                })
                .collect(),
        }))
    }

    async fn remove(
        &self,
        req: Request<proto::RemoveSandbox>,
    ) -> Result<Response<proto::Removed>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        self.svc
            .remove_sandbox(backend, &name, r.keep_workspace)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Removed {}))
    }

    async fn checkpoint(
        &self,
        req: Request<proto::TakeCheckpoint>,
    ) -> Result<Response<proto::CheckpointInfo>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        let (row, left_out) = self
            .svc
            .checkpoint(backend, &name, r.label.as_deref())
            .await
            .map_err(status)?;
        let mut info = convert::checkpoint(row);
        info.outside_workspace = left_out;
        Ok(Response::new(info))
    }

    async fn checkpoints(
        &self,
        req: Request<proto::SandboxRef>,
    ) -> Result<Response<proto::CheckpointList>, Status> {
        self.caller.check()?;
        let (backend, name) = target(Some(req.get_ref()))?;
        let rows = self.svc.checkpoints(backend, &name).map_err(status)?;
        Ok(Response::new(proto::CheckpointList {
            checkpoints: rows.into_iter().map(convert::checkpoint).collect(),
        }))
    }

    async fn restore(
        &self,
        req: Request<proto::RestoreCheckpoint>,
    ) -> Result<Response<proto::Restored>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        if r.checkpoint.trim().is_empty() {
            return Err(Status::invalid_argument(
                "name the checkpoint to restore by its id or label (Sandboxes.Checkpoints lists them)",
            ));
        }
        let done = self
            .svc
            .restore(backend, &name, &r.checkpoint, r.force)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Restored {
            checkpoint: Some(convert::checkpoint(done.checkpoint)),
            written: done.written as u64,
            removed: done.removed as u64,
            stopped: done.stopped,
            took_ms: done.took_ms,
        }))
    }

    async fn clone_sandbox(
        &self,
        req: Request<proto::CloneRequest>,
    ) -> Result<Response<proto::Cloned>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, src) = target(r.from.as_ref())?;
        let Some(to) = r.to.as_ref().filter(|t| !t.name.trim().is_empty()) else {
            return Err(Status::invalid_argument(
                "name the new sandbox in `to`, e.g. `agent-2`",
            ));
        };
        let to_backend = if to.backend == proto::Backend::Unspecified as i32 {
            backend
        } else {
            convert::backend(to.backend)?
        };
        let (row, left_out) = self
            .svc
            .clone_sandbox(backend, &src, to_backend, &to.name, r.at.as_deref())
            .await
            .map_err(status)?;
        let mut info = convert::checkpoint(row);
        info.outside_workspace = left_out;
        Ok(Response::new(proto::Cloned {
            checkpoint: Some(info),
        }))
    }

    async fn inspect(
        &self,
        req: Request<proto::SandboxRef>,
    ) -> Result<Response<proto::SandboxDetail>, Status> {
        self.caller.check()?;
        let (backend, name) = target(Some(req.get_ref()))?;
        let i = self.svc.inspect(backend, &name).await.map_err(status)?;
        Ok(Response::new(convert::inspection(backend, &name, i)))
    }

    async fn set_network(
        &self,
        req: Request<proto::NetworkChange>,
    ) -> Result<Response<proto::NetworkRules>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        let rules = self
            .svc
            .runtime()
            .set_network_rule(backend, &name, r.allow, &r.host)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::NetworkRules {
            allow: rules.allow,
            deny: rules.deny,
        }))
    }

    async fn reap(
        &self,
        req: Request<proto::ReapSandboxes>,
    ) -> Result<Response<proto::Reaped>, Status> {
        self.caller.check()?;
        let idle = self
            .svc
            .reap(req.into_inner().dry_run)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Reaped {
            idle: idle.into_iter().map(convert::idle).collect(),
        }))
    }

    async fn collect(
        &self,
        req: Request<proto::CollectGarbage>,
    ) -> Result<Response<proto::Collected>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let backend = convert::backend(r.backend)?;
        let older_than = if r.older_than_secs == 0.0 {
            std::time::Duration::ZERO
        } else {
            convert::seconds("older_than_secs", Some(r.older_than_secs))?.unwrap_or_default()
        };
        let c = self
            .svc
            .collect(backend, older_than, r.workspaces)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::collected(c)))
    }
}

#[tonic::async_trait]
impl Commands for Api {
    type ExecStream = Replies<proto::ExecEvent>;

    async fn exec(
        &self,
        req: Request<proto::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        if r.command.trim().is_empty() {
            return Err(Status::invalid_argument(
                "the command is empty: give the shell text to run, e.g. `ls -la`",
            ));
        }
        convert::seconds("timeout_secs", r.timeout_secs)?;
        target(r.sandbox.as_ref())?;
        Ok(Response::new(self.host.exec(r).await?))
    }

    async fn interrupt(
        &self,
        req: Request<proto::InterruptExec>,
    ) -> Result<Response<proto::Interrupted>, Status> {
        self.caller.check()?;
        let found = self.host.interrupt(&req.into_inner().call_id);
        Ok(Response::new(proto::Interrupted { found }))
    }
}

#[tonic::async_trait]
impl Files for Api {
    async fn read(
        &self,
        req: Request<proto::ReadFile>,
    ) -> Result<Response<proto::FileData>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        let (path, data) = self
            .svc
            .read_file(backend, &name, &r.path, r.limit)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::FileData { data, path }))
    }

    async fn write(
        &self,
        req: Request<proto::WriteFile>,
    ) -> Result<Response<proto::Written>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        let path = self
            .svc
            .write_file(backend, &name, &r.path, &r.data, r.mode)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Written {
            path,
            bytes: r.data.len() as u64,
        }))
    }
}

/// How much of a job's output may wait for a slow reader before the read
/// from the sandbox pauses.
const LOG_BACKLOG: usize = 4 * 1024 * 1024;

#[tonic::async_trait]
impl Jobs for Api {
    async fn start(&self, req: Request<proto::StartJob>) -> Result<Response<proto::Job>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let (backend, name) = target(r.sandbox.as_ref())?;
        let pty = match r.pty {
            Some(t) => Some(convert::term_size_checked(Some(t))?),
            None => None,
        };
        let opts = JobOptions {
            name: r.name.filter(|n| !n.is_empty()),
            watch: r.watch,
            pty,
            session: Some(r.session).filter(|s| !s.is_empty()),
        };
        let job = self
            .svc
            .start_job(backend, &name, &r.command, opts)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::job(job)))
    }

    async fn get(&self, req: Request<proto::JobRef>) -> Result<Response<proto::Job>, Status> {
        self.caller.check()?;
        let job = self.svc.job(&req.into_inner().id).await.map_err(status)?;
        Ok(Response::new(convert::job(job)))
    }

    async fn list(
        &self,
        req: Request<proto::ListJobs>,
    ) -> Result<Response<proto::JobList>, Status> {
        self.caller.check()?;
        let only = convert::job_filter(req.get_ref())?;
        let jobs = self.svc.jobs(&only).await.map_err(status)?;
        Ok(Response::new(proto::JobList {
            jobs: jobs.into_iter().map(convert::job).collect(),
        }))
    }

    async fn prune(
        &self,
        req: Request<proto::ListJobs>,
    ) -> Result<Response<proto::JobList>, Status> {
        self.caller.check()?;
        let only = convert::job_filter(req.get_ref())?;
        let jobs = self.svc.prune_jobs(&only).await.map_err(status)?;
        Ok(Response::new(proto::JobList {
            jobs: jobs.into_iter().map(convert::job).collect(),
        }))
    }

    async fn screen(
        &self,
        req: Request<proto::JobRef>,
    ) -> Result<Response<proto::TerminalScreen>, Status> {
        self.caller.check()?;
        let s = self
            .svc
            .job_screen(&req.into_inner().id)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::screen(s)))
    }

    async fn resize(
        &self,
        req: Request<proto::ResizeJob>,
    ) -> Result<Response<proto::Resized>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        if r.size.is_none() {
            return Err(Status::invalid_argument(
                "give the terminal's new size, e.g. 120x40",
            ));
        }
        let size = convert::term_size_checked(r.size)?;
        self.svc.resize_job(&r.id, size).await.map_err(status)?;
        Ok(Response::new(proto::Resized {}))
    }

    type LogsStream = Replies<proto::LogChunk>;

    async fn logs(
        &self,
        req: Request<proto::JobLogs>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        self.caller.check()?;
        let mut r = req.into_inner();
        // Unknown jobs are refused now, not as the stream's first item.
        self.svc.job(&r.id).await.map_err(status)?;
        // The last lines first, then on from where they end.
        let tail = match r.tail_lines {
            Some(n) => {
                let (text, end) = self.svc.job_tail(&r.id, n.into()).await.map_err(status)?;
                r.offset = end;
                Some(proto::LogChunk {
                    data: text,
                    offset: end,
                })
            }
            None => None,
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<proto::LogChunk, Status>>();
        // Bytes sent and not yet taken by the client: the read from the
        // sandbox waits while there are too many. Each chunk sent adds its
        // size, and the stream below takes it off as it hands it on.
        let backlog = Arc::new((AtomicUsize::new(0), Notify::new()));
        if let Some(t) = tail {
            if !r.follow {
                let _ = tx.send(Ok(t));
                drop(tx);
                return Ok(Response::new(Box::pin(tokio_stream_from(rx))));
            }
            backlog.0.fetch_add(t.data.len(), Ordering::SeqCst);
            let _ = tx.send(Ok(t));
        }
        let held = self.host.hold();
        let svc = self.svc.clone();
        let pending = backlog.clone();
        tokio::spawn(async move {
            let _guard = held.guard;
            let sent = tx.clone();
            let counted = pending.clone();
            let mut sink = move |b: &[u8], offset: u64| {
                counted.0.fetch_add(b.len(), Ordering::SeqCst);
                let _ = sent.send(Ok(proto::LogChunk {
                    data: b.to_vec(),
                    offset,
                }));
            };
            let waits = pending.clone();
            let pace: &berth_core::jobs::Pace = &move || {
                let waits = waits.clone();
                Box::pin(async move {
                    while waits.0.load(Ordering::SeqCst) > LOG_BACKLOG {
                        let notified = waits.1.notified();
                        if waits.0.load(Ordering::SeqCst) <= LOG_BACKLOG {
                            break;
                        }
                        notified.await;
                    }
                })
            };
            let read = svc
                .runtime()
                .job_logs_at(&r.id, r.offset, r.follow, &mut sink, Some(pace));
            let end = tokio::select! {
                done = read => done.err().map(status),
                _ = tx.closed() => None,
                _ = held.stopping.cancelled() => Some(Status::unavailable(
                    "the berth server is stopping: ask again from the last chunk's offset",
                )),
            };
            if let Some(e) = end {
                let _ = tx.send(Err(e));
            }
        });
        let stream = futures::StreamExt::map(
            tokio_stream_from(rx),
            move |item: Result<proto::LogChunk, Status>| {
                if let Ok(c) = &item {
                    backlog.0.fetch_sub(c.data.len(), Ordering::SeqCst);
                    backlog.1.notify_waiters();
                }
                item
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn wait(&self, req: Request<proto::WaitJob>) -> Result<Response<proto::Job>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let timeout = convert::seconds("timeout_secs", r.timeout_secs)?;
        let held = self.host.hold();
        let _guard = held.guard;
        let job = tokio::select! {
            j = self.svc.wait_job(&r.id, timeout) => j.map_err(status)?,
            _ = held.stopping.cancelled() => {
                return Err(Status::unavailable("the berth server is stopping: wait again"));
            }
        };
        Ok(Response::new(convert::job(job)))
    }

    async fn kill(&self, req: Request<proto::KillJob>) -> Result<Response<proto::Killed>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let signal = convert::signal(r.signal)?;
        let grace = match r.grace_secs {
            Some(0.0) => Some(std::time::Duration::ZERO),
            g => convert::seconds("grace_secs", g)?,
        };
        let (job, already_ended) = self
            .svc
            .kill_job(&r.id, signal, grace)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Killed {
            job: Some(convert::job(job)),
            already_ended,
        }))
    }

    async fn send(&self, req: Request<proto::SendInput>) -> Result<Response<proto::Sent>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        self.svc
            .send_job(&r.id, &r.data, &r.keys, r.eof)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Sent {}))
    }
}

/// An unbounded receiver as a stream.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tonic::async_trait]
impl Approvals for Api {
    async fn list(
        &self,
        req: Request<proto::ListApprovals>,
    ) -> Result<Response<proto::ApprovalList>, Status> {
        self.caller.check()?;
        let all = req.into_inner().all;
        let rows = self.svc.approvals(all).map_err(status)?;
        let svc = &self.svc;
        Ok(Response::new(proto::ApprovalList {
            approvals: rows
                .into_iter()
                .map(|a| convert::approval(a, None, |t| svc.redact(t)))
                .collect(),
        }))
    }

    async fn answer(
        &self,
        req: Request<proto::AnswerApproval>,
    ) -> Result<Response<proto::Approval>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        if r.always && !r.allow {
            return Err(Status::invalid_argument(format!(
                "`always` goes only with `allow`; deny approval #{} without it to deny this once",
                r.id
            )));
        }
        let done = self
            .svc
            .answer(
                r.id,
                r.allow,
                r.always,
                match proto::AnsweredVia::try_from(r.via) {
                    Ok(proto::AnsweredVia::Cli) => "cli",
                    _ => "api",
                },
            )
            .map_err(status_any)?;
        let svc = &self.svc;
        Ok(Response::new(convert::approval(
            done.approval,
            done.rule_added
                .map(|(name, file)| (name, file.display().to_string())),
            |t| svc.redact(t),
        )))
    }
}

/// The most events one query returns.
const EVENTS_MAX: u32 = 10_000;

#[tonic::async_trait]
impl Events for Api {
    async fn query(
        &self,
        req: Request<proto::EventQuery>,
    ) -> Result<Response<proto::EventList>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let limit = match r.limit {
            0 => 20,
            n => n.min(EVENTS_MAX),
        } as usize;
        let kind = Some(r.kind_prefix.as_str()).filter(|k| !k.is_empty());
        let rows = self.svc.events(limit, kind, r.after).map_err(status)?;
        Ok(Response::new(proto::EventList {
            events: rows.into_iter().map(convert::event).collect(),
        }))
    }

    type FollowStream = Replies<proto::Event>;

    async fn follow(
        &self,
        req: Request<proto::FollowEvents>,
    ) -> Result<Response<Self::FollowStream>, Status> {
        self.caller.check()?;
        let r = req.into_inner();
        let kind = Some(r.kind_prefix).filter(|k| !k.is_empty());
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<proto::Event, Status>>(64);
        let held = self.host.hold();
        let svc = self.svc.clone();
        tokio::spawn(async move {
            let _guard = held.guard;
            let (etx, mut erx) = tokio::sync::mpsc::channel(64);
            let follow = svc.follow_events(r.after, kind, etx);
            let forward = async {
                while let Some(e) = erx.recv().await {
                    if tx.send(Ok(convert::event(e))).await.is_err() {
                        break;
                    }
                }
            };
            let end = tokio::select! {
                done = follow => done.err().map(status),
                _ = forward => None,
                _ = tx.closed() => None,
                _ = held.stopping.cancelled() => Some(Status::unavailable(
                    "the berth server is stopping: follow again after the last event's id",
                )),
            };
            if let Some(e) = end {
                let _ = tx.send(Err(e)).await;
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
