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

mod checkpoints;
mod doors;
mod hints;
mod pools;
mod sandboxes;
mod spool;

pub use checkpoints::RestoreReport;
pub use doors::HOSTS_ENV as EGRESS_HOSTS_ENV;
pub use doors::{NET_ASK_RULE, add_network_rule};
pub use pools::{FromPool, PoolStatus};
pub use sandboxes::SandboxStatus;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backend::{Backend, BackendKind, RemoveOpts, Sandbox, SandboxInfo, SandboxSpec};
use crate::error::{Error, Result};
use crate::events::EventKind;
use crate::gate::{ApprovalNotice, Gate};
use crate::session::{CaptureLimits, ExecOpts, ExecResult, Session, SessionConfig};
use crate::store::{Event, SandboxRow, Store};

/// The sandbox used when none is named; created on first use.
pub const DEFAULT_SANDBOX: &str = "default";
/// The session every sandbox has.
pub const MAIN_SESSION: &str = "main";
/// How many spooled outputs are kept.
const SPOOL_KEEP: usize = 200;
/// The most the spool directory holds by default; the oldest outputs go first.
pub const DEFAULT_SPOOL_DIR_CAP: u64 = 1024 * 1024 * 1024;

/// Opens backends by name. The binary implements it over `berth-backends`, which
/// core cannot depend on.
#[async_trait]
pub trait BackendSource: Send + Sync {
    /// Open the backend called `kind`.
    async fn open(&self, kind: BackendKind) -> Result<Arc<dyn Backend>>;
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
    /// The most output one command's spool file keeps (its first and last halves).
    pub spool_file_cap: u64,
    /// The most all spool files together hold; the oldest are removed past it.
    pub spool_dir_cap: u64,
}

impl RuntimeConfig {
    /// Defaults under `state_dir`.
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            state_dir,
            grace: Duration::from_millis(1000),
            limits: CaptureLimits::default(),
            spool_file_cap: crate::session::capture::DEFAULT_SPOOL_CAP,
            spool_dir_cap: DEFAULT_SPOOL_DIR_CAP,
        }
    }
}

/// One command to run.
#[derive(Clone, Default)]
pub struct ExecRequest {
    /// Its backend.
    pub backend: BackendKind,
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
    /// Told when the command waits for an approval (else the runtime's notice).
    pub on_approval: Option<ApprovalNotice>,
    /// Already admitted by the gate: berth's own launcher for an admitted job.
    pub admitted: bool,
    /// The id to record the call under (a tool call's own); a new one when `None`.
    pub call_id: Option<String>,
    /// The sandbox's session to run in: [`MAIN_SESSION`] when `None`.
    pub session: Option<String>,
    /// Keep stderr apart from stdout (see [`ExecOpts::split_stderr`]).
    pub split_stderr: bool,
    /// With `split_stderr`: a live copy of the stderr as it arrives.
    pub stderr_tee: Option<crate::session::Tee>,
}

impl ExecRequest {
    /// The session it runs in.
    pub fn session_name(&self) -> &str {
        self.session.as_deref().unwrap_or(MAIN_SESSION)
    }
}

/// Check a session name: 1 to 64 letters, digits, `-`, `_` or `.`, not
/// starting with `.` (it names a directory in the sandbox).
pub fn check_session_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "session name {name:?} is not 1-64 letters, digits, '-', '_' or '.' (not starting \
             with '.'), e.g. --session tests"
        )))
    }
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

/// Backend, sandbox, session name.
type SessionKey = (BackendKind, String, String);

/// A sandbox's warm shell for checkpoint helpers.
type HelperShell = Arc<Mutex<Session>>;

/// A command running now.
#[derive(Clone)]
struct Inflight {
    key: SessionKey,
    command: String,
    stop: CancellationToken,
}

/// One sandbox's place in the session map. Its own lock is held while the
/// sandbox is provisioned and its shell opened, so a slow docker create
/// blocks only calls for that sandbox; the map's lock is held only to find
/// the slot.
type SessionSlot = Arc<Mutex<Option<SharedSession>>>;
/// A session several tasks take turns on.
type SharedSession = Arc<Mutex<Session>>;

/// The runtime.
pub struct Runtime {
    store: Arc<Store>,
    source: Arc<dyn BackendSource>,
    cfg: RuntimeConfig,
    backends: Mutex<HashMap<BackendKind, Arc<dyn Backend>>>,
    sessions: Mutex<HashMap<SessionKey, SessionSlot>>,
    /// The commands running now, by call id: where, what, and the token that
    /// interrupts them (a forced restore stops them first).
    inflight: std::sync::Mutex<HashMap<String, Inflight>>,
    /// Each sandbox's warm shell for checkpoint helpers (see
    /// `checkpoint::helper_shell`), by backend and sandbox.
    checkpoint_shells: Mutex<HashMap<(String, String), HelperShell>>,
    gate: Option<Arc<Gate>>,
    approval_notice: Option<ApprovalNotice>,
    spool_index: std::sync::Mutex<spool::SpoolIndex>,
    /// The network doors this process serves, by sandbox.
    doors: Mutex<HashMap<(BackendKind, String), doors::Door>>,
    /// The open main shells of pool members not yet taken, by backend and
    /// member (see `pools`).
    warm: Mutex<HashMap<(BackendKind, String), SharedSession>>,
    /// One fill at a time per pool.
    pool_fills: Mutex<HashMap<String, Arc<Mutex<()>>>>,
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
            inflight: std::sync::Mutex::new(HashMap::new()),
            checkpoint_shells: Mutex::new(HashMap::new()),
            gate: None,
            approval_notice: None,
            spool_index: Default::default(),
            doors: Mutex::new(HashMap::new()),
            warm: Mutex::new(HashMap::new()),
            pool_fills: Mutex::new(HashMap::new()),
        }
    }

    /// Tell `notice` whenever a command starts waiting for an approval.
    pub fn with_approval_notice(mut self, notice: ApprovalNotice) -> Self {
        self.approval_notice = Some(notice);
        self
    }

    /// Check a command that is about to run (for paths other than `exec`, such
    /// as jobs); records refusals and waits on approvals like `exec` does.
    pub async fn admit(
        &self,
        call_id: &str,
        backend: BackendKind,
        sandbox: &str,
        command: &str,
    ) -> Result<()> {
        if let Some(g) = &self.gate {
            g.admit(
                &self.store,
                call_id,
                backend,
                sandbox,
                command,
                self.approval_notice.as_ref(),
            )
            .await?;
        }
        Ok(())
    }

    /// [`Runtime::admit`] for a verdict already reached (a file rule's, see
    /// [`crate::gate::judge_file`]): `subject` is what the event log and an
    /// approval show. Without a gate, anything but *allow* is refused.
    pub async fn admit_verdict(
        &self,
        call_id: &str,
        backend: BackendKind,
        sandbox: &str,
        subject: &str,
        verdict: berth_policies::Verdict,
    ) -> Result<crate::gate::Admission> {
        match &self.gate {
            Some(g) => {
                g.admit_verdict(
                    verdict,
                    &self.store,
                    call_id,
                    backend,
                    sandbox,
                    subject,
                    self.approval_notice.as_ref(),
                )
                .await
            }
            None if verdict.action == berth_policies::Action::Allow => Ok(crate::gate::Admission {
                verdict,
                approval: None,
            }),
            None => Err(Error::Denied {
                rule: verdict.rule,
                reason: verdict.reason,
                part: verdict.part,
                hint: String::new(),
            }),
        }
    }

    /// Check every command against `gate`, give sandboxes only its allowed
    /// environment, apply its limits and redact output and events with it.
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The gate, if there is one.
    pub fn gate(&self) -> Option<&Arc<Gate>> {
        self.gate.as_ref()
    }

    /// `text` with secrets masked (unchanged without a gate).
    pub fn redact(&self, text: &str) -> String {
        match &self.gate {
            Some(g) => g.redact(text).into_owned(),
            None => text.to_string(),
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
    pub async fn backend(&self, kind: BackendKind) -> Result<Arc<dyn Backend>> {
        let mut map = self.backends.lock().await;
        if let Some(b) = map.get(&kind) {
            return Ok(b.clone());
        }
        let b = self.source.open(kind).await?;
        map.insert(kind, b.clone());
        Ok(b)
    }

    /// The main session of a sandbox, opening (and restoring) it if needed.
    /// Returns the session and, when the sandbox had to be recreated, why.
    pub async fn session(
        &self,
        backend: BackendKind,
        sandbox: &str,
    ) -> Result<(Arc<Mutex<Session>>, Option<String>)> {
        self.named_session(backend, sandbox, MAIN_SESSION).await
    }

    /// A named session of a sandbox: a shell of its own, with its own cwd,
    /// environment and snapshots, beside the others in the same sandbox.
    pub async fn named_session(
        &self,
        backend: BackendKind,
        sandbox: &str,
        name: &str,
    ) -> Result<(Arc<Mutex<Session>>, Option<String>)> {
        check_session_name(name)?;
        let slot = self.slot(backend, sandbox, name).await;
        let mut slot = slot.lock().await;
        if let Some(s) = slot.as_ref() {
            return Ok((s.clone(), None));
        }
        let b = self.backend(backend).await?;
        let mut row = self.sandbox_row(b.as_ref(), backend, sandbox, false)?;
        self.open_door(backend, &mut row.spec).await?;
        let p = self.provision_row(b.as_ref(), &row.spec).await?;
        if p.created || p.recreated.is_some() {
            self.store.append(&Event {
                kind: if p.created {
                    EventKind::SandboxCreated
                } else {
                    EventKind::SandboxRecreated
                },
                backend: Some(backend),
                sandbox: Some(sandbox.into()),
                detail: p
                    .recreated
                    .as_ref()
                    .map(|r| serde_json::json!({ "reason": r }).to_string()),
                ..Default::default()
            })?;
        }
        let cfg = self.session_config(backend, sandbox, name, &p.sandbox);
        let session = Session::open(p.sandbox, cfg).await?;
        let s = Arc::new(Mutex::new(session));
        *slot = Some(s.clone());
        Ok((s, p.recreated))
    }

    /// How a session of a sandbox is configured.
    fn session_config(
        &self,
        backend: BackendKind,
        sandbox: &str,
        name: &str,
        sb: &Arc<dyn Sandbox>,
    ) -> SessionConfig {
        let mut cfg = SessionConfig::named(format!("{backend}/{sandbox}/{name}"));
        if name != MAIN_SESSION {
            cfg.dir = Some(format!("{}/sessions/{name}", sb.layout().berth_dir));
        }
        cfg.grace = self.cfg.grace;
        if let Some(g) = &self.gate {
            // Only what the policy allows of berth's own environment.
            cfg.env
                .extend(g.sandbox_env().iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        cfg
    }

    /// The slot of a sandbox's session, made on first use.
    async fn slot(&self, backend: BackendKind, sandbox: &str, session: &str) -> SessionSlot {
        let key = (backend, sandbox.to_string(), session.to_string());
        self.sessions.lock().await.entry(key).or_default().clone()
    }

    /// The slots of every session of a sandbox known to this runtime, main first.
    async fn slots(&self, backend: BackendKind, sandbox: &str) -> Vec<SessionSlot> {
        let map = self.sessions.lock().await;
        let mut found: Vec<(&SessionKey, &SessionSlot)> = map
            .iter()
            .filter(|(k, _)| k.0 == backend && k.1 == sandbox)
            .collect();
        found.sort_by_key(|(k, _)| (k.2 != MAIN_SESSION, k.2.clone()));
        found.into_iter().map(|(_, s)| s.clone()).collect()
    }

    /// The open session of a sandbox, if any, without waiting for one being
    /// opened.
    fn open_session(&self, slot: &SessionSlot) -> Option<Arc<Mutex<Session>>> {
        slot.try_lock().ok().and_then(|s| s.clone())
    }

    /// True when a command is running (or a shell is being opened) in the
    /// sandbox's session, so a new command would wait for it.
    pub async fn is_busy(&self, backend: BackendKind, sandbox: &str, session: &str) -> bool {
        let slot = self.slot(backend, sandbox, session).await;
        if slot.try_lock().is_err() {
            return true;
        }
        self.open_session(&slot)
            .is_some_and(|s| s.try_lock().is_err())
    }

    /// How many sessions have an open shell.
    pub async fn open_sessions(&self) -> usize {
        let slots: Vec<SessionSlot> = self.sessions.lock().await.values().cloned().collect();
        slots
            .iter()
            .filter(|s| self.open_session(s).is_some())
            .count()
    }

    /// A live handle on a sandbox, without opening a session: the running
    /// session's sandbox if there is one, else a provision of the stored spec.
    pub async fn attach(&self, backend: BackendKind, sandbox: &str) -> Result<Arc<dyn Sandbox>> {
        // Not behind a running command: a busy session's sandbox is provisioned
        // again (idempotent, a re-attach), so file reads and job queries answer
        // while a command runs.
        for slot in self.slots(backend, sandbox).await {
            let existing = self.open_session(&slot);
            // A shell that ended while idle may mean a stopped sandbox:
            // provision it then (idempotent), which starts it again.
            if let Some(Ok(mut s)) = existing.as_ref().map(|s| s.try_lock())
                && !s.shell_gone()
            {
                return Ok(s.sandbox().clone());
            }
        }
        let b = self.backend(backend).await?;
        let mut row = self.sandbox_row(b.as_ref(), backend, sandbox, true)?;
        self.open_door(backend, &mut row.spec).await?;
        Ok(self.provision_row(b.as_ref(), &row.spec).await?.sandbox)
    }

    /// [`Runtime::attach`] for a call that gives the sandbox's settings on
    /// its own command line (the CLI's `--host`): as for `exec`, settings
    /// that differ from the sandbox's are an error that names them, not
    /// passed over, and only `default` is made on first use.
    pub async fn attach_as_called(
        &self,
        backend: BackendKind,
        sandbox: &str,
    ) -> Result<Arc<dyn Sandbox>> {
        let b = self.backend(backend).await?;
        self.sandbox_row(b.as_ref(), backend, sandbox, false)?;
        self.attach(backend, sandbox).await
    }

    /// True when the session's shell ended while idle and its sandbox is not
    /// alive: the sandbox stopped under it. Costs nothing while the shell
    /// lives (a poll of its output); one backend call when it has ended.
    async fn sandbox_stopped_under(&self, session: &Arc<Mutex<Session>>) -> bool {
        let sandbox = {
            let mut s = session.lock().await;
            if !s.shell_gone() {
                return false;
            }
            s.sandbox().clone()
        };
        matches!(sandbox.alive().await, Ok(false))
    }

    /// Forget a sandbox's sessions (after it died), so the next call in any
    /// of them re-provisions it.
    pub async fn forget_session(&self, backend: BackendKind, sandbox: &str) {
        for slot in self.slots(backend, sandbox).await {
            slot.lock().await.take();
        }
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
        let call_id = req.call_id.clone().unwrap_or_else(new_call_id);
        let mut req = req;
        let mut verdict = None;
        let mut admitted_as = None;
        if let Some(g) = self.gate.as_ref().filter(|_| !req.admitted) {
            req.timeout = Some(
                g.limits(&req.sandbox)
                    .timeout(req.timeout)
                    .map_err(|e| Error::InvalidInput(e.to_string()))?,
            );
            let admission = g
                .admit(
                    &self.store,
                    &call_id,
                    req.backend,
                    &req.sandbox,
                    &req.command,
                    req.on_approval.as_ref().or(self.approval_notice.as_ref()),
                )
                .await?;
            verdict = Some(admission.summary());
            admitted_as = Some(admission.verdict.action);
        }
        let command_text = self.redact(&req.command);
        self.store.append(&Event {
            kind: EventKind::ExecStarted,
            call_id: Some(call_id.clone()),
            backend: Some(req.backend),
            sandbox: Some(req.sandbox.clone()),
            session: Some(req.session_name().into()),
            command: Some(command_text.clone()),
            verdict,
            ..Default::default()
        })?;
        // Output is redacted as it streams (ExecOpts::filter), before the
        // tee, the result or the spool file sees it.
        let stop = req
            .cancel
            .get_or_insert_with(CancellationToken::new)
            .clone();
        self.inflight_set(
            &call_id,
            Some(Inflight {
                key: (
                    req.backend,
                    req.sandbox.clone(),
                    req.session_name().to_string(),
                ),
                command: command_text.clone(),
                stop,
            }),
        );
        let outcome = self.exec_inner(&req, &call_id, admitted_as).await;
        self.inflight_set(&call_id, None);
        let finished = match &outcome {
            Ok(r) => Event {
                kind: EventKind::ExecFinished,
                exit_code: Some(r.result.exit_code as i64),
                duration_ms: Some(r.result.duration.as_millis() as i64),
                bytes_out: Some(
                    (r.result.output.total_bytes
                        + r.result.stderr.as_ref().map_or(0, |e| e.total_bytes))
                        as i64,
                ),
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
                kind: EventKind::ExecFailed,
                detail: Some(serde_json::json!({ "error": e.full_text() }).to_string()),
                ..Default::default()
            },
        };
        let finished = Event {
            detail: finished.detail.map(|d| self.redact(&d)),
            ..finished
        };
        let finished = Event {
            call_id: Some(call_id.clone()),
            backend: Some(req.backend),
            sandbox: Some(req.sandbox.clone()),
            session: Some(req.session_name().into()),
            command: Some(command_text),
            ..finished
        };
        let used = outcome.as_ref().ok().map(|r| crate::store::SessionUse {
            backend: req.backend,
            sandbox: &req.sandbox,
            session: req.session_name(),
            cwd: r.result.cwd.as_deref(),
        });
        if let Err(e) = self.store.record_call_end(used.as_ref(), &finished) {
            warn!(call = %call_id, error = %e, "could not record the end of a call");
            // The command ran, but the store missed it: say so rather than
            // report a success the event log and the session table lack.
            if outcome.is_ok() {
                return Err(e);
            }
        }
        outcome
    }

    /// Judge the command again with the session's aliases and functions
    /// resolved, when it names one of them: `alias e='env '` in one call and
    /// `e rm f` in the next must meet `deny rm`. The text alone was judged
    /// before the session was opened; only a stricter verdict acts here.
    async fn readmit_with_session(
        &self,
        gate: &Gate,
        session: &mut Session,
        req: &ExecRequest,
        call_id: &str,
        first: berth_policies::Action,
    ) -> Result<()> {
        // A shell that died or was never started has unknown names: start
        // it (restored from its snapshot) so they are known, or the first
        // command after a restore would meet none of what the snapshot files
        // define, which the sandbox can write.
        if session.names().is_none() {
            let startup = req
                .timeout
                .unwrap_or(crate::session::STARTUP_DEADLINE)
                .min(crate::session::STARTUP_DEADLINE);
            session.prepare(startup).await?;
        }
        let Some(names) = session.names() else {
            return Ok(());
        };
        // Functions bash calls without their name in the text: the handler
        // runs for any word that names no command, which the gate cannot
        // tell from the text alone. A session that defines one has it
        // judged with every command, as though the command called it.
        let implicit: Vec<&str> = crate::session::script::IMPLICIT_FUNCTIONS
            .iter()
            .copied()
            .filter(|f| names.contains(*f))
            .collect();
        let implicit = if implicit.is_empty()
            || crate::session::script::may_miss_a_command(&req.command, names)
        {
            implicit
        } else {
            Vec::new()
        };
        // Exported variables that load code into the programs a command
        // starts (`LD_PRELOAD`, `BASH_ENV`, ...), which the shell reports as
        // `$NAME`: restored from a snapshot the sandbox can write, or set by
        // a command judged opaque, they run text the gate never read.
        // Those berth sets itself (`PAGER=cat`, what the policy passes) are
        // berth's while they keep berth's value; the shell reports one that
        // changed as `$!NAME`.
        let mut loaders: Vec<&str> = names
            .iter()
            .filter_map(|n| n.strip_prefix('$'))
            .filter(|n| !n.starts_with('!'))
            .filter(|n| !session.sets_env(n) || names.contains(&format!("$!{n}")))
            .collect();
        loaders.sort_unstable();
        let loaded = (!loaders.is_empty()
            && crate::session::script::may_start_a_program(&req.command))
        .then(|| {
            gate.opaque_verdict(&format!(
                "the session exports {}, which make the programs a command starts run code berth did not read; \
                 `unset` {} first",
                loaders.join(", "),
                if loaders.len() == 1 { "it" } else { "them" }
            ))
        });
        if implicit.is_empty()
            && loaded.is_none()
            && !names.iter().any(|n| req.command.contains(n.as_str()))
        {
            return Ok(());
        }
        let defined = session.definitions().await;
        let mut verdict = gate.check_in(&req.command, req.backend, &defined);
        if let Some(v) = loaded
            && v.action > verdict.action
        {
            verdict = v;
        }
        for f in implicit {
            let called = gate.check_in(f, req.backend, &defined);
            if called.action > verdict.action {
                verdict = called;
            }
        }
        if verdict.action <= first {
            return Ok(());
        }
        let judged = crate::gate::Judged {
            command: &req.command,
            verdict,
        };
        gate.admit_judged(
            &self.store,
            call_id,
            req.backend,
            &req.sandbox,
            judged,
            req.on_approval.as_ref().or(self.approval_notice.as_ref()),
        )
        .await?;
        Ok(())
    }

    async fn exec_inner(
        &self,
        req: &ExecRequest,
        call_id: &str,
        admitted_as: Option<berth_policies::Action>,
    ) -> Result<ExecReport> {
        let (mut session, mut recreated) = self
            .named_session(req.backend, &req.sandbox, req.session_name())
            .await?;
        // A shell that ended while idle because its sandbox stopped (a
        // `docker kill`, a host reboot): the command has not been sent, so
        // provision the sandbox again (which starts or recreates it, and
        // says so) instead of failing the call.
        if self.sandbox_stopped_under(&session).await {
            info!(call = %call_id, sandbox = %req.sandbox, "the sandbox stopped while idle; provisioning it again");
            self.forget_session(req.backend, &req.sandbox).await;
            (session, recreated) = self
                .named_session(req.backend, &req.sandbox, req.session_name())
                .await?;
        }
        let mut session = session.lock().await;
        if let (Some(g), Some(first)) = (&self.gate, admitted_as) {
            self.readmit_with_session(g, &mut session, req, call_id, first)
                .await?;
        }
        let limits = match &self.gate {
            Some(g) => {
                let cap = g.limits(&req.sandbox).output_cap_bytes as usize;
                CaptureLimits {
                    head: cap / 2,
                    tail: cap - cap / 2,
                }
            }
            None => self.cfg.limits,
        };
        let opts = ExecOpts {
            timeout: req.timeout,
            stdin: req.stdin.clone(),
            limits,
            spool: Some(self.spool_path(call_id)),
            spool_cap: Some(self.cfg.spool_file_cap),
            cancel: req.cancel.clone(),
            tee: req.tee.clone(),
            filter: self.gate.as_ref().map(|g| g.output_filter()),
            split_stderr: req.split_stderr,
            stderr_tee: req.stderr_tee.clone(),
        };
        let sandbox = session.sandbox().clone();
        let memory_before = sandbox.memory();
        let mut result = match session.exec(&req.command, opts).await {
            Ok(r) => r,
            Err(e) => {
                if e.is_sandbox_gone() {
                    info!(call = %call_id, sandbox = %req.sandbox, "sandbox died; the next call re-provisions it");
                    drop(session);
                    self.forget_session(req.backend, &req.sandbox).await;
                }
                return Err(e);
            }
        };
        if let Some(n) = oom_notice(memory_before, sandbox.memory()) {
            result.notices.push(n);
        }
        if result.exit_code != 0
            && let Ok(Some(row)) = self.store.sandbox(req.backend, &req.sandbox)
            && let Some(h) = std::iter::once(&result.output)
                .chain(result.stderr.as_ref())
                .find_map(|o| hints::network_hint(req.backend, &row.spec, result.exit_code, o))
        {
            result.notices.push(h);
        }
        // The sandbox and session are marked used with the call's end event
        // (`Store::record_call_end`), in one transaction.
        // A spool is made only for output that outgrew the capture.
        if let Some(p) = &result.output.spool {
            self.prune_spool(p);
        }
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

    fn prune_spool(&self, newest: &std::path::Path) {
        let dir = self.cfg.state_dir.join("spool");
        if let Ok(mut idx) = self.spool_index.lock() {
            idx.prune(&dir, newest, SPOOL_KEEP, self.cfg.spool_dir_cap);
        }
    }

    /// Close every session's shell.
    pub async fn shutdown(&self) {
        self.close_warm().await;
        let helpers: Vec<_> = self.checkpoint_shells.lock().await.drain().collect();
        for (_, s) in helpers {
            if let Ok(s) = Arc::try_unwrap(s) {
                s.into_inner().close().await;
            }
        }
        let slots: Vec<_> = self.sessions.lock().await.drain().collect();
        for (_, slot) in slots {
            let Some(s) = slot.lock().await.take() else {
                continue;
            };
            if let Ok(s) = Arc::try_unwrap(s) {
                s.into_inner().close().await;
            }
        }
    }
}

/// A fresh id for a call in the event log.
pub fn new_call_id() -> String {
    let n: u64 = rand::random();
    format!("c{n:016x}")
}

/// What to tell of the kernel's OOM killer ending processes of a sandbox
/// during one command, from its memory bound as it stood before and after.
fn oom_notice(
    before: Option<crate::backend::MemoryState>,
    after: Option<crate::backend::MemoryState>,
) -> Option<String> {
    let after = after?;
    let killed = after.oom_kills - before.map_or(0, |b| b.oom_kills.min(after.oom_kills));
    (killed > 0).then(|| {
        format!(
            "the sandbox reached its memory limit of {} MiB: the kernel's OOM killer ended {killed} of its processes during this command (a `Killed` message and exit code 137 are its mark); use less memory or raise `memory_max_bytes` under [limits] in the policy file",
            after.limit_bytes >> 20
        )
    })
}
