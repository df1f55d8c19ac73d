//! The runtime: one engine above every backend.
//!
//! Flow at a glance, for one `exec`:
//! 1. validate the request (empty command, bad timeout);
//! 2. find the sandbox in the store (`default` is created on first use; any other
//!    name must have been created), provision it (idempotent: re-attach, restart or
//!    recreate) and open or reuse its session;
//! 3. write `exec.started` to the event log, run the command, write `exec.finished`
//!    with exit code, duration and byte counts;
//! 4. if the sandbox died under the command, forget the session so the next call
//!    re-provisions and restores from the snapshot.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backend::{Backend, RemoveOpts, Sandbox, SandboxInfo, SandboxSpec};
use crate::error::{Error, Result};
use crate::session::{CaptureLimits, ExecOpts, ExecResult, Session, SessionConfig};
use crate::store::{Event, SandboxRow, Store};

/// The sandbox used when none is named; created on first use.
pub const DEFAULT_SANDBOX: &str = "default";
/// The session every sandbox has.
pub const MAIN_SESSION: &str = "main";
/// How many spooled outputs are kept.
const SPOOL_KEEP: usize = 200;

/// Opens backends by name. The binary implements it over `berth-backends`, which
/// core cannot depend on.
#[async_trait]
pub trait BackendSource: Send + Sync {
    /// Open the backend called `kind`.
    async fn open(&self, kind: &str) -> Result<Arc<dyn Backend>>;
}

/// Runtime settings.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// berth's state directory.
    pub state_dir: PathBuf,
    /// Grace between INT, TERM and KILL.
    pub grace: Duration,
    /// In-memory output budget per command.
    pub limits: CaptureLimits,
}

impl RuntimeConfig {
    /// Defaults under `state_dir`.
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            state_dir,
            grace: Duration::from_millis(1000),
            limits: CaptureLimits::default(),
        }
    }
}

/// One command to run.
#[derive(Clone, Default)]
pub struct ExecRequest {
    /// Backend short name.
    pub backend: String,
    /// Sandbox name.
    pub sandbox: String,
    /// The command text, run by bash.
    pub command: String,
    /// Stop it after this long.
    pub timeout: Option<Duration>,
    /// Bytes for its stdin.
    pub stdin: Option<Vec<u8>>,
    /// Interrupt it when cancelled.
    pub cancel: Option<CancellationToken>,
    /// A live copy of the output as it arrives.
    pub tee: Option<crate::session::Tee>,
}

/// What `exec` returns.
#[derive(Clone, Debug)]
pub struct ExecReport {
    /// The call's id in the event log.
    pub call_id: String,
    /// The command's result.
    pub result: ExecResult,
    /// Set when the sandbox had to be recreated first, with the reason.
    pub recreated: Option<String>,
}

/// A sandbox as `ls` shows it: what the store knows and what the backend sees.
#[derive(Clone, Debug, Serialize)]
pub struct SandboxStatus {
    /// Backend short name.
    pub backend: String,
    /// Sandbox name.
    pub name: String,
    /// Live state from the backend, or `missing`.
    pub state: String,
    /// The backend's id for it.
    pub id: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_at: Option<i64>,
    /// Last use, ms since the epoch.
    pub last_used: Option<i64>,
    /// True when the backend has it but the store does not (an orphan).
    pub orphan: bool,
}

type SessionKey = (String, String);

/// The runtime.
pub struct Runtime {
    store: Arc<Store>,
    source: Arc<dyn BackendSource>,
    cfg: RuntimeConfig,
    backends: Mutex<HashMap<String, Arc<dyn Backend>>>,
    sessions: Mutex<HashMap<SessionKey, Arc<Mutex<Session>>>>,
}

impl Runtime {
    /// A runtime over `store`, opening backends through `source`.
    pub fn new(store: Arc<Store>, source: Arc<dyn BackendSource>, cfg: RuntimeConfig) -> Self {
        Self {
            store,
            source,
            cfg,
            backends: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    /// The backend called `kind`, opened once per runtime.
    pub async fn backend(&self, kind: &str) -> Result<Arc<dyn Backend>> {
        let mut map = self.backends.lock().await;
        if let Some(b) = map.get(kind) {
            return Ok(b.clone());
        }
        let b = self.source.open(kind).await?;
        map.insert(kind.to_string(), b.clone());
        Ok(b)
    }

    /// Create a sandbox (or re-attach to it) and record it.
    pub async fn create_sandbox(
        &self,
        backend: &str,
        spec: SandboxSpec,
    ) -> Result<(Arc<dyn Sandbox>, bool, Option<String>)> {
        let b = self.backend(backend).await?;
        // Written first: if berth dies mid-provision, `ls` still shows the sandbox
        // and `rm` can clean up whatever the backend made.
        self.store.put_sandbox(backend, &spec)?;
        let p = b.provision(&spec).await?;
        self.store.append(&Event {
            kind: if p.created {
                "sandbox.created"
            } else {
                "sandbox.attached"
            }
            .into(),
            backend: Some(backend.into()),
            sandbox: Some(spec.name.clone()),
            detail: p
                .recreated
                .as_ref()
                .map(|r| serde_json::json!({ "recreated": r }).to_string()),
            ..Default::default()
        })?;
        Ok((p.sandbox, p.created, p.recreated))
    }

    /// Remove a sandbox from the backend and the store.
    pub async fn remove_sandbox(&self, backend: &str, name: &str, volumes: bool) -> Result<()> {
        let key = (backend.to_string(), name.to_string());
        if let Some(s) = self.sessions.lock().await.remove(&key) {
            let s = s.lock().await;
            drop(s);
        }
        let known = self.store.sandbox(backend, name)?.is_some();
        let b = self.backend(backend).await?;
        let removed = match b.remove(name, RemoveOpts { volumes }).await {
            Ok(()) => true,
            Err(Error::NotFound { .. }) => false,
            Err(e) => return Err(e),
        };
        self.store.delete_sandbox(backend, name)?;
        if !known && !removed {
            return Err(Error::NotFound {
                what: "sandbox",
                name: name.into(),
                hint: format!("list them with `berth sandbox ls --backend {backend}`"),
            });
        }
        self.store.append(&Event {
            kind: "sandbox.removed".into(),
            backend: Some(backend.into()),
            sandbox: Some(name.into()),
            ..Default::default()
        })?;
        Ok(())
    }

    /// Sandboxes of one backend: the store's rows joined with the backend's view.
    pub async fn list_sandboxes(&self, backend: &str) -> Result<Vec<SandboxStatus>> {
        let rows = self.store.sandboxes(Some(backend))?;
        let live: Vec<SandboxInfo> = self.backend(backend).await?.list().await?;
        let mut out: Vec<SandboxStatus> = rows
            .iter()
            .map(|r| {
                let l = live.iter().find(|l| l.name == r.name);
                SandboxStatus {
                    backend: backend.into(),
                    name: r.name.clone(),
                    state: l
                        .map(|l| l.state.clone())
                        .unwrap_or_else(|| "missing".into()),
                    id: l.map(|l| l.id.clone()),
                    created_at: Some(r.created_at),
                    last_used: Some(r.last_used),
                    orphan: false,
                }
            })
            .collect();
        for l in live {
            if !rows.iter().any(|r| r.name == l.name) {
                out.push(SandboxStatus {
                    backend: backend.into(),
                    name: l.name,
                    state: l.state,
                    id: Some(l.id),
                    created_at: l.created_unix.map(|s| s * 1000),
                    last_used: None,
                    orphan: true,
                });
            }
        }
        Ok(out)
    }

    /// The stored row of a sandbox, creating `default` on first use.
    fn sandbox_row(&self, backend: &str, name: &str) -> Result<SandboxRow> {
        if let Some(row) = self.store.sandbox(backend, name)? {
            return Ok(row);
        }
        if name == DEFAULT_SANDBOX {
            self.store.put_sandbox(backend, &SandboxSpec::named(name))?;
            if let Some(row) = self.store.sandbox(backend, name)? {
                return Ok(row);
            }
        }
        Err(Error::NotFound {
            what: "sandbox",
            name: name.into(),
            hint: format!(
                "create it with `berth sandbox create {name} --backend {backend}`, or list sandboxes with `berth sandbox ls --backend {backend}`"
            ),
        })
    }

    /// The session of a sandbox, opening (and restoring) it if needed.
    /// Returns the session and, when the sandbox had to be recreated, why.
    pub async fn session(
        &self,
        backend: &str,
        sandbox: &str,
    ) -> Result<(Arc<Mutex<Session>>, Option<String>)> {
        let key = (backend.to_string(), sandbox.to_string());
        let mut map = self.sessions.lock().await;
        if let Some(s) = map.get(&key) {
            return Ok((s.clone(), None));
        }
        let row = self.sandbox_row(backend, sandbox)?;
        let b = self.backend(backend).await?;
        let p = b.provision(&row.spec).await?;
        if p.created || p.recreated.is_some() {
            self.store.append(&Event {
                kind: if p.created {
                    "sandbox.created"
                } else {
                    "sandbox.recreated"
                }
                .into(),
                backend: Some(backend.into()),
                sandbox: Some(sandbox.into()),
                detail: p
                    .recreated
                    .as_ref()
                    .map(|r| serde_json::json!({ "reason": r }).to_string()),
                ..Default::default()
            })?;
        }
        let mut cfg = SessionConfig::named(format!("{backend}/{sandbox}/{MAIN_SESSION}"));
        cfg.grace = self.cfg.grace;
        let session = Session::open(p.sandbox, cfg).await?;
        let s = Arc::new(Mutex::new(session));
        map.insert(key, s.clone());
        Ok((s, p.recreated))
    }

    /// A live handle on a sandbox, without opening a session: the running
    /// session's sandbox if there is one, else a provision of the stored spec.
    pub async fn attach(&self, backend: &str, sandbox: &str) -> Result<Arc<dyn Sandbox>> {
        let key = (backend.to_string(), sandbox.to_string());
        let existing = self.sessions.lock().await.get(&key).cloned();
        if let Some(s) = existing {
            return Ok(s.lock().await.sandbox().clone());
        }
        let row = self.sandbox_row(backend, sandbox)?;
        let b = self.backend(backend).await?;
        Ok(b.provision(&row.spec).await?.sandbox)
    }

    /// Forget a session (after its sandbox died), so the next call re-provisions.
    pub async fn forget_session(&self, backend: &str, sandbox: &str) {
        self.sessions
            .lock()
            .await
            .remove(&(backend.to_string(), sandbox.to_string()));
    }

    /// Run one command.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecReport> {
        if req.command.trim().is_empty() {
            return Err(Error::InvalidInput(
                "empty command: pass the command after `--`, e.g. `berth exec -- ls -la`".into(),
            ));
        }
        if req.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::InvalidInput(
                "timeout must be greater than zero seconds".into(),
            ));
        }
        let call_id = new_call_id();
        self.store.append(&Event {
            kind: "exec.started".into(),
            call_id: Some(call_id.clone()),
            backend: Some(req.backend.clone()),
            sandbox: Some(req.sandbox.clone()),
            session: Some(MAIN_SESSION.into()),
            command: Some(req.command.clone()),
            ..Default::default()
        })?;
        let outcome = self.exec_inner(&req, &call_id).await;
        let finished = match &outcome {
            Ok(r) => Event {
                kind: "exec.finished".into(),
                exit_code: Some(r.result.exit_code as i64),
                duration_ms: Some(r.result.duration.as_millis() as i64),
                bytes_out: Some(r.result.output.total_bytes as i64),
                detail: Some(
                    serde_json::json!({
                        "timed_out": r.result.timed_out,
                        "interrupted": r.result.interrupted,
                        "cwd": r.result.cwd,
                        "notices": r.result.notices,
                        "recreated": r.recreated,
                    })
                    .to_string(),
                ),
                ..Default::default()
            },
            Err(e) => Event {
                kind: "exec.failed".into(),
                detail: Some(serde_json::json!({ "error": e.to_string() }).to_string()),
                ..Default::default()
            },
        };
        let finished = Event {
            call_id: Some(call_id.clone()),
            backend: Some(req.backend.clone()),
            sandbox: Some(req.sandbox.clone()),
            session: Some(MAIN_SESSION.into()),
            command: Some(req.command.clone()),
            ..finished
        };
        if let Err(e) = self.store.append(&finished) {
            warn!(call = %call_id, error = %e, "could not record the end of a call");
        }
        outcome
    }

    async fn exec_inner(&self, req: &ExecRequest, call_id: &str) -> Result<ExecReport> {
        let (session, recreated) = self.session(&req.backend, &req.sandbox).await?;
        let mut session = session.lock().await;
        let opts = ExecOpts {
            timeout: req.timeout,
            stdin: req.stdin.clone(),
            limits: self.cfg.limits,
            spool: Some(self.spool_path(call_id)),
            cancel: req.cancel.clone(),
            tee: req.tee.clone(),
        };
        let result = match session.exec(&req.command, opts).await {
            Ok(r) => r,
            Err(e) => {
                if e.is_sandbox_gone() {
                    info!(call = %call_id, sandbox = %req.sandbox, "sandbox died; the next call re-provisions it");
                    drop(session);
                    self.forget_session(&req.backend, &req.sandbox).await;
                }
                return Err(e);
            }
        };
        self.store.touch_sandbox(&req.backend, &req.sandbox)?;
        self.store.session_used(
            &req.backend,
            &req.sandbox,
            MAIN_SESSION,
            result.cwd.as_deref(),
        )?;
        self.prune_spool();
        Ok(ExecReport {
            call_id: call_id.to_string(),
            result,
            recreated,
        })
    }

    /// Where a call's full output is spooled.
    pub fn spool_path(&self, call_id: &str) -> PathBuf {
        self.cfg
            .state_dir
            .join("spool")
            .join(format!("{call_id}.out"))
    }

    fn prune_spool(&self) {
        let dir = self.cfg.state_dir.join("spool");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() <= SPOOL_KEEP {
            return;
        }
        files.sort();
        for (_, p) in &files[..files.len() - SPOOL_KEEP] {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Close every session's shell.
    pub async fn shutdown(&self) {
        let sessions: Vec<_> = self.sessions.lock().await.drain().collect();
        for (_, s) in sessions {
            if let Ok(s) = Arc::try_unwrap(s) {
                s.into_inner().close().await;
            }
        }
    }
}

fn new_call_id() -> String {
    let n: u64 = rand::random();
    format!("c{n:016x}")
}
