//! [`Service`]: typed operations over one runtime, for every front end.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_core::backend::{BackendKind, Sandbox, SandboxSpec};
use berth_core::checkpoint::record::CheckpointRow;
use berth_core::error::{Error, Result};
use berth_core::jobs::{Job, JobOptions};
use berth_core::runtime::{RestoreReport, Runtime, SandboxStatus, new_call_id};
use berth_policies::files::FileOp;

use crate::answers;

/// The largest file [`Service::read_file`] returns.
pub const READ_MAX: u64 = 16 * 1024 * 1024;
/// How long one file operation in a sandbox may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a sandbox was made or attached as.
pub struct Made {
    /// The workspace: a new session's first cwd.
    pub workdir: String,
    /// Made by this call (else attached to).
    pub created: bool,
    /// Why it had to be made again first.
    pub recreated: Option<String>,
}

/// The service every front end uses: typed operations over one runtime.
pub struct Service {
    rt: Arc<Runtime>,
    /// The policy file an `always` answer adds its allow rule to.
    policy: Option<PathBuf>,
}

impl Service {
    /// A service over `rt`; `policy` is the policy file, if berth has one.
    pub fn new(rt: Arc<Runtime>, policy: Option<PathBuf>) -> Service {
        Service { rt, policy }
    }

    /// The runtime it serves.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// Make a sandbox, or attach to the one of that name.
    pub async fn create_sandbox(&self, backend: BackendKind, spec: SandboxSpec) -> Result<Made> {
        if spec.name.trim().is_empty() {
            return Err(Error::InvalidInput(
                "a sandbox needs a name, e.g. `agent`".into(),
            ));
        }
        let (sb, created, recreated) = self.rt.create_sandbox(backend.as_str(), spec).await?;
        Ok(Made {
            workdir: sb.layout().workdir.clone(),
            created,
            recreated,
        })
    }

    /// One backend's sandboxes.
    pub async fn list_sandboxes(&self, backend: BackendKind) -> Result<Vec<SandboxStatus>> {
        self.rt.list_sandboxes(backend.as_str()).await
    }

    /// Remove a sandbox; `keep_workspace` keeps its files.
    pub async fn remove_sandbox(
        &self,
        backend: BackendKind,
        name: &str,
        keep_workspace: bool,
    ) -> Result<()> {
        self.rt
            .remove_sandbox(backend.as_str(), name, !keep_workspace)
            .await
    }

    /// Take a checkpoint of a sandbox.
    pub async fn checkpoint(
        &self,
        backend: BackendKind,
        sandbox: &str,
        label: Option<&str>,
    ) -> Result<CheckpointRow> {
        self.rt
            .checkpoint(backend.as_str(), sandbox, label, None)
            .await
    }

    /// A sandbox's checkpoints, oldest first.
    pub fn checkpoints(&self, backend: BackendKind, sandbox: &str) -> Result<Vec<CheckpointRow>> {
        self.rt.checkpoints(backend.as_str(), sandbox)
    }

    /// Restore a sandbox to a checkpoint, by id or label (the newest of that
    /// label).
    pub async fn restore(
        &self,
        backend: BackendKind,
        sandbox: &str,
        checkpoint: &str,
        force: bool,
    ) -> Result<RestoreReport> {
        // An id, else the newest checkpoint of the sandbox with that label.
        let rows = self.rt.checkpoints(backend.as_str(), sandbox)?;
        let id = if rows.iter().any(|c| c.id == checkpoint) {
            checkpoint.to_string()
        } else {
            rows.iter()
                .rev()
                .find(|c| c.label.as_deref() == Some(checkpoint))
                .map_or_else(|| checkpoint.to_string(), |c| c.id.clone())
        };
        self.rt
            .restore_checkpoint(backend.as_str(), sandbox, &id, force)
            .await
    }

    /// The sandbox, and `path` made absolute against its workspace and
    /// admitted by the policy's file rules for `op` (an *ask* waits for its
    /// answer, as a command's does).
    async fn file_access(
        &self,
        backend: BackendKind,
        sandbox: &str,
        op: FileOp,
        path: &str,
    ) -> Result<(Arc<dyn Sandbox>, String)> {
        if path.is_empty() || path.contains('\0') {
            return Err(Error::InvalidInput(format!(
                "{path:?} is not a path: give one relative to the workspace or absolute, e.g. `notes.txt`"
            )));
        }
        let sb = self.rt.attach(backend.as_str(), sandbox).await?;
        let layout = sb.layout().clone();
        let abs = berth_core::backend::normalize_path(&layout.workdir, path);
        let verb = match op {
            FileOp::Read => "read_file",
            FileOp::Write => "write_file",
        };
        let subject = format!("{verb} {abs}");
        let verdict = berth_core::gate::judge_file(
            self.rt.gate().map(|g| g.as_ref()),
            op,
            &abs,
            &layout,
            &subject,
        );
        if let Some(v) = verdict {
            self.rt
                .admit_verdict(&new_call_id(), backend.as_str(), sandbox, &subject, v)
                .await?;
        }
        Ok((sb, abs))
    }

    /// Read up to `limit` bytes (0: [`READ_MAX`]) of a file in a sandbox.
    pub async fn read_file(
        &self,
        backend: BackendKind,
        sandbox: &str,
        path: &str,
        limit: u64,
    ) -> Result<(String, Vec<u8>)> {
        let (sb, abs) = self
            .file_access(backend, sandbox, FileOp::Read, path)
            .await?;
        let limit = if limit == 0 {
            READ_MAX
        } else {
            limit.min(READ_MAX)
        };
        let data = tokio::time::timeout(FILE_TIMEOUT, sb.read_file(&abs, limit))
            .await
            .map_err(|_| {
                Error::InvalidInput(format!(
                    "reading `{abs}` did not finish within {}s: is it a FIFO or a device?",
                    FILE_TIMEOUT.as_secs()
                ))
            })??;
        Ok((abs, data))
    }

    /// Create or replace a file in a sandbox (its directories too).
    pub async fn write_file(
        &self,
        backend: BackendKind,
        sandbox: &str,
        path: &str,
        data: &[u8],
        mode: u32,
    ) -> Result<String> {
        let (sb, abs) = self
            .file_access(backend, sandbox, FileOp::Write, path)
            .await?;
        let mode = if mode == 0 { 0o644 } else { mode & 0o7777 };
        tokio::time::timeout(FILE_TIMEOUT, sb.write_file(&abs, data, mode))
            .await
            .map_err(|_| {
                Error::InvalidInput(format!(
                    "writing `{abs}` did not finish within {}s",
                    FILE_TIMEOUT.as_secs()
                ))
            })??;
        Ok(abs)
    }

    /// Start a job (admitted by the policy as a command is).
    pub async fn start_job(
        &self,
        backend: BackendKind,
        sandbox: &str,
        command: &str,
        opts: JobOptions,
    ) -> Result<Job> {
        self.rt
            .start_job_with(backend.as_str(), sandbox, command, opts)
            .await
    }

    /// A job by id or name, brought up to date.
    pub async fn job(&self, id: &str) -> Result<Job> {
        self.rt.job(id).await
    }

    /// Every job, brought up to date; with `sandbox`, only its.
    pub async fn jobs(&self, sandbox: Option<(BackendKind, &str)>) -> Result<Vec<Job>> {
        let all = self.rt.list_jobs().await?;
        Ok(match sandbox {
            None => all,
            Some((b, name)) => all
                .into_iter()
                .filter(|j| j.backend == b.as_str() && j.sandbox == name)
                .collect(),
        })
    }

    /// Wait for a job to end, at most `timeout`.
    pub async fn wait_job(&self, id: &str, timeout: Option<Duration>) -> Result<Job> {
        self.rt.wait_job(id, timeout).await
    }

    /// Signal a job's process group (SIGKILL after `grace`); the job as it
    /// stands after.
    pub async fn kill_job(
        &self,
        id: &str,
        signal: berth_core::backend::Signal,
        grace: Option<Duration>,
    ) -> Result<Job> {
        match grace {
            Some(g) => self.rt.kill_job_with_grace(id, signal, g).await?,
            None => self.rt.kill_job(id, signal).await?,
        };
        self.rt.job(id).await
    }

    /// Write to a job's stdin (and close it with `eof`).
    pub async fn send_job(&self, id: &str, data: &[u8], eof: bool) -> Result<()> {
        self.rt.send_job(id, data, eof).await
    }

    /// The approvals: pending ones, or with `all` every one.
    pub fn approvals(&self, all: bool) -> Result<Vec<berth_core::approvals::Approval>> {
        self.rt.store().approvals(all)
    }

    /// Answer approval `id` as `by`; `always` adds an allow rule to the
    /// policy file.
    pub fn answer(
        &self,
        id: i64,
        allow: bool,
        always: bool,
        by: &str,
    ) -> anyhow::Result<answers::Answered> {
        let gate = match self.rt.gate() {
            Some(g) => g.clone(),
            None => anyhow::bail!(
                "berth runs with no policy here, so nothing waits for an approval; approval #{id} cannot be answered"
            ),
        };
        let policy = if always { self.policy.clone() } else { None };
        answers::answer(self.rt.store(), &gate, id, allow, always, policy, by)
    }

    /// Redact secrets from `text` as the policy says.
    pub fn redact(&self, text: &str) -> String {
        self.rt.redact(text)
    }
}
