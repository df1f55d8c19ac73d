//! Checkpoints as the runtime runs them: taken and recorded, restored with
//! the sandbox's shells closed (and a busy sandbox refused, or stopped first
//! when forced), copied into a clone, and pruned by the policy's retention.

use std::collections::BTreeSet;
use std::time::Instant;

use berth_policies::CheckpointPolicy;

use super::*;
use crate::backend::Signal;
use crate::checkpoint::{self, Manifest, record, record::CheckpointRow};
use crate::store::now_ms;

/// What a restore did.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreReport {
    /// The checkpoint restored.
    pub checkpoint: CheckpointRow,
    /// Files and links written back.
    pub written: usize,
    /// Paths removed.
    pub removed: usize,
    /// What `--force` stopped first.
    pub stopped: Vec<String>,
    /// How long it took.
    pub took_ms: i64,
}

impl Runtime {
    /// The policy's checkpoint settings.
    pub fn checkpoint_policy(&self) -> CheckpointPolicy {
        self.gate
            .as_ref()
            .map(|g| g.policy().checkpoints.clone())
            .unwrap_or_default()
    }

    pub(super) fn inflight_set(&self, call: &str, what: Option<Inflight>) {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        match what {
            Some(w) => {
                map.insert(call.to_string(), w);
            }
            None => {
                map.remove(call);
            }
        }
    }

    fn inflight_in(&self, backend: BackendKind, sandbox: &str) -> Vec<Inflight> {
        let map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        map.values()
            .filter(|i| i.key.0 == backend && i.key.1 == sandbox)
            .cloned()
            .collect()
    }

    /// Take a checkpoint of a sandbox: its workspace and its sessions' state.
    /// `run` names the run and step that took it.
    pub async fn checkpoint(
        &self,
        backend: BackendKind,
        sandbox: &str,
        label: Option<&str>,
        run: Option<(&str, i64)>,
    ) -> Result<CheckpointRow> {
        if label.is_some_and(|l| l.trim().is_empty()) {
            return Err(Error::InvalidInput("a label cannot be empty".into()));
        }
        let policy = self.checkpoint_policy();
        let base = record::base(&self.store, backend, sandbox)?;
        let id = record::new_id();
        let t0 = Instant::now();
        let created_ms = now_ms();
        let shell = self.checkpoint_shell(backend, sandbox).await?;
        let mut helper = shell.lock().await;
        let sb = helper.sandbox().clone();
        let taken = checkpoint::take(&mut helper, base.as_ref(), &policy, &id).await;
        drop(helper);
        let taken = self.kept_shell(backend, sandbox, taken).await?;
        let row = CheckpointRow {
            id,
            backend,
            sandbox: sandbox.into(),
            created_ms,
            label: label.map(String::from),
            run_id: run.map(|r| r.0.to_string()),
            step: run.map(|r| r.1),
            files: taken.manifest.files() as i64,
            bytes: taken.manifest.bytes() as i64,
            changed: taken.changed as i64,
            new_bytes: taken.new_bytes as i64,
            took_ms: t0.elapsed().as_millis() as i64,
            skipped: taken
                .skipped
                .iter()
                .map(|s| format!("{} ({})", s.path, s.what))
                .collect(),
            origin: None,
        };
        record::insert(&self.store, &row, &taken.manifest, &taken.session, true)?;
        if !taken.tampered.is_empty() {
            tracing::warn!(
                %backend,
                sandbox,
                packs = ?taken.tampered,
                "checkpoint: packs were changed inside the sandbox since berth wrote them; their files were stored again, and older checkpoints that need them cannot be restored"
            );
        }
        self.store.append(&Event {
            kind: EventKind::CheckpointTaken,
            backend: Some(backend),
            sandbox: Some(sandbox.into()),
            duration_ms: Some(row.took_ms),
            detail: Some(
                serde_json::json!({
                    "checkpoint": row.id, "label": row.label, "run": row.run_id,
                    "step": row.step, "changed": row.changed, "new_bytes": row.new_bytes,
                    "tampered_packs": taken.tampered,
                })
                .to_string(),
            ),
            ..Default::default()
        })?;
        let gone = record::expired(
            &record::list(&self.store, backend, sandbox)?,
            policy.keep as usize,
            policy.budget_bytes(),
        );
        if !gone.is_empty() {
            self.prune(backend, sandbox, &*sb, &gone).await?;
        }
        Ok(row)
    }

    /// A sandbox's warm checkpoint helper shell, opened on first use.
    async fn checkpoint_shell(&self, backend: BackendKind, sandbox: &str) -> Result<HelperShell> {
        let key = (backend.to_string(), sandbox.to_string());
        let mut map = self.checkpoint_shells.lock().await;
        if let Some(s) = map.get(&key) {
            return Ok(s.clone());
        }
        let sb = self.attach(backend, sandbox).await?;
        let s = Arc::new(Mutex::new(checkpoint::helper_shell(sb).await?));
        map.insert(key, s.clone());
        Ok(s)
    }

    /// Let a sandbox's checkpoint helper shell go (the sandbox is removed,
    /// or the shell failed: the next checkpoint opens a new one).
    pub(super) async fn forget_checkpoint_shell(&self, backend: BackendKind, sandbox: &str) {
        let key = (backend.to_string(), sandbox.to_string());
        let gone = self.checkpoint_shells.lock().await.remove(&key);
        if let Some(s) = gone
            && let Ok(s) = Arc::try_unwrap(s)
        {
            s.into_inner().close().await;
        }
    }

    /// `r` as it is; a failure other than bad input also lets the helper
    /// shell go, so a dead shell or sandbox is not reused.
    async fn kept_shell<T>(&self, backend: BackendKind, sandbox: &str, r: Result<T>) -> Result<T> {
        if let Err(e) = &r
            && !matches!(e, Error::InvalidInput(_))
        {
            self.forget_checkpoint_shell(backend, sandbox).await;
        }
        r
    }

    /// Forget checkpoints `gone` of a sandbox, and remove the packs no kept
    /// one names. Returns how many packs went.
    async fn prune(
        &self,
        backend: BackendKind,
        sandbox: &str,
        sb: &dyn Sandbox,
        gone: &[String],
    ) -> Result<usize> {
        let mut dropped = BTreeSet::new();
        for id in gone {
            if let Some((_, m, _)) = record::get(&self.store, id)? {
                dropped.extend(m.packs());
            }
        }
        record::delete(&self.store, gone)?;
        let keep = record::packs_in_use(&self.store, backend, sandbox)?;
        checkpoint::drop_packs_except(sb, &keep, &dropped).await
    }

    /// Apply retention to a sandbox's checkpoints and remove unused packs
    /// (`berth sandbox gc`). Returns the checkpoints and packs that went.
    pub async fn gc_checkpoints(
        &self,
        backend: BackendKind,
        sandbox: &str,
    ) -> Result<(usize, usize)> {
        let policy = self.checkpoint_policy();
        let gone = record::expired(
            &record::list(&self.store, backend, sandbox)?,
            policy.keep as usize,
            policy.budget_bytes(),
        );
        let sb = self.attach(backend, sandbox).await?;
        let packs = self.prune(backend, sandbox, &*sb, &gone).await?;
        Ok((gone.len(), packs))
    }

    /// One checkpoint of a sandbox, checked to be that sandbox's.
    fn checkpoint_of(
        &self,
        backend: BackendKind,
        sandbox: &str,
        id: &str,
    ) -> Result<(CheckpointRow, Manifest, Vec<u8>)> {
        let found = record::get(&self.store, id)?.ok_or_else(|| Error::NotFound {
            what: "checkpoint",
            name: id.into(),
            hint: format!("list them with `berth sandbox checkpoints {sandbox}`"),
        })?;
        if found.0.backend != backend || found.0.sandbox != sandbox {
            return Err(Error::InvalidInput(format!(
                "checkpoint {id} is of sandbox `{}` ({}), not `{sandbox}` ({backend}); to get it in another sandbox, use `berth sandbox clone {} NEW --at {id}`",
                found.0.sandbox, found.0.backend, found.0.sandbox
            )));
        }
        Ok(found)
    }

    /// Restore a sandbox to one of its checkpoints. A command or job running
    /// in it is refused, named; `force` stops it first.
    pub async fn restore_checkpoint(
        &self,
        backend: BackendKind,
        sandbox: &str,
        id: &str,
        force: bool,
    ) -> Result<RestoreReport> {
        let (row, target, session) = self.checkpoint_of(backend, sandbox, id)?;
        let t0 = Instant::now();
        let running = self.inflight_in(backend, sandbox);
        // This sandbox's unfinished jobs, brought up to date.
        let mut jobs: Vec<crate::jobs::Job> = Vec::new();
        for j in self.store.jobs()? {
            if j.backend == backend && j.sandbox == sandbox && !j.state.is_final() {
                let j = self.job(&j.id).await?;
                if !j.state.is_final() {
                    jobs.push(j);
                }
            }
        }
        let mut busy: Vec<String> = running
            .iter()
            .map(|i| format!("session `{}` runs `{}`", i.key.2, i.command))
            .collect();
        busy.extend(
            jobs.iter()
                .map(|j| format!("job {} runs `{}`", j.id, j.command)),
        );
        if !busy.is_empty() && !force {
            return Err(Error::InvalidInput(format!(
                "sandbox `{sandbox}` is busy: {}; wait for it, stop it (`berth job kill ID`), or restore with --force, which stops it first",
                busy.join("; ")
            )));
        }
        for i in &running {
            i.stop.cancel();
        }
        for j in &jobs {
            self.kill_job(&j.id, Signal::Kill).await?;
        }
        // Close every shell of the sandbox (waiting out a stopped command),
        // so none writes its state over the restored one.
        self.close_sessions(backend, sandbox).await;
        let policy = self.checkpoint_policy();
        let base = record::base(&self.store, backend, sandbox)?;
        let shell = self.checkpoint_shell(backend, sandbox).await?;
        let mut helper = shell.lock().await;
        let done =
            checkpoint::restore(&mut helper, &target, &session, base.as_ref(), &policy, None).await;
        drop(helper);
        let done = self.kept_shell(backend, sandbox, done).await?;
        record::set_base(&self.store, backend, sandbox, &done.base)?;
        let report = RestoreReport {
            checkpoint: row,
            written: done.written,
            removed: done.removed,
            stopped: if force { busy } else { Vec::new() },
            took_ms: t0.elapsed().as_millis() as i64,
        };
        self.store.append(&Event {
            kind: EventKind::CheckpointRestored,
            backend: Some(backend),
            sandbox: Some(sandbox.into()),
            duration_ms: Some(report.took_ms),
            detail: Some(
                serde_json::json!({
                    "checkpoint": id, "written": report.written,
                    "removed": report.removed, "stopped": report.stopped,
                })
                .to_string(),
            ),
            ..Default::default()
        })?;
        Ok(report)
    }

    /// Close a sandbox's shells, waiting for commands in them to end; the
    /// next call opens a new one, restored from the sandbox's state files.
    pub async fn close_sessions(&self, backend: BackendKind, sandbox: &str) {
        for slot in self.slots(backend, sandbox).await {
            let taken = slot.lock().await.take();
            if let Some(s) = taken {
                let s = s.lock().await;
                drop(s);
            }
        }
    }

    /// A new sandbox `dst` (on `dst_backend`) with the files and session of
    /// sandbox `src` at checkpoint `at`, or as it is now (a checkpoint is
    /// taken first). The new sandbox's first checkpoint is that state.
    pub async fn clone_sandbox(
        &self,
        src_backend: BackendKind,
        src: &str,
        dst_backend: BackendKind,
        dst: &str,
        at: Option<&str>,
    ) -> Result<CheckpointRow> {
        crate::backend::check_sandbox_name(dst)?;
        if self.store.sandbox(dst_backend, dst)?.is_some() {
            return Err(Error::InvalidInput(format!(
                "sandbox `{dst}` ({dst_backend}) already exists; pick another name, or remove it with `berth sandbox rm {dst} --backend {dst_backend}`"
            )));
        }
        let src_b = self.backend(src_backend).await?;
        let src_row = self.sandbox_row(src_b.as_ref(), src_backend, src, true)?;
        let at = match at {
            Some(id) => id.to_string(),
            None => self.checkpoint(src_backend, src, None, None).await?.id,
        };
        let (row, mut manifest, session) = self.checkpoint_of(src_backend, src, &at)?;
        // The source's packs' stamps are not the copies': the restore below
        // records those.
        manifest.stamps.clear();
        let mut spec = src_row.spec.clone();
        spec.name = dst.to_string();
        // A clone is a sandbox of its own, not the pool member the source is.
        spec.options.remove(crate::pools::INSTANCE);
        if dst_backend != src_backend {
            // Backend settings do not carry over (a docker image, an ssh host).
            spec.image = None;
            spec.options.clear();
        }
        let (dst_sb, _, _) = self.create_sandbox(dst_backend, spec).await?;
        let src_sb = self.attach(src_backend, src).await?;
        let t0 = Instant::now();
        let made = async {
            checkpoint::copy_packs(&*src_sb, &*dst_sb, &manifest.packs()).await?;
            let copy = CheckpointRow {
                id: record::new_id(),
                backend: dst_backend,
                sandbox: dst.into(),
                created_ms: now_ms(),
                label: Some(format!("clone of {src}")),
                run_id: None,
                step: None,
                origin: Some(row.id.clone()),
                took_ms: 0,
                ..row.clone()
            };
            record::insert(&self.store, &copy, &manifest, &session, false)?;
            let policy = self.checkpoint_policy();
            let from = src_sb.layout().workdir.clone();
            let shell = self.checkpoint_shell(dst_backend, dst).await?;
            let mut helper = shell.lock().await;
            let done =
                checkpoint::restore(&mut helper, &manifest, &session, None, &policy, Some(&from))
                    .await;
            drop(helper);
            let done = self.kept_shell(dst_backend, dst, done).await?;
            record::set_base(&self.store, dst_backend, dst, &done.base)?;
            Ok::<CheckpointRow, Error>(CheckpointRow {
                took_ms: t0.elapsed().as_millis() as i64,
                ..copy
            })
        }
        .await;
        match made {
            Ok(c) => Ok(c),
            Err(e) => {
                // Half a clone is no clone.
                let _ = self.remove_sandbox(dst_backend, dst, true).await;
                Err(e)
            }
        }
    }

    /// Every checkpoint of a sandbox, oldest first.
    pub fn checkpoints(&self, backend: BackendKind, sandbox: &str) -> Result<Vec<CheckpointRow>> {
        record::list(&self.store, backend, sandbox)
    }

    /// The packs every checkpoint of a sandbox names (for tests and `gc`).
    pub fn checkpoint_packs(
        &self,
        backend: BackendKind,
        sandbox: &str,
    ) -> Result<BTreeSet<String>> {
        record::packs_in_use(&self.store, backend, sandbox)
    }
}
