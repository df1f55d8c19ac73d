//! [`Service`]: typed operations over one runtime, for every front end.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_core::backend::{BackendKind, Sandbox, SandboxSpec, TermSize};
use berth_core::checkpoint::record::CheckpointRow;
use berth_core::error::{Error, Result};
use berth_core::jobs::{Job, JobOptions, JobState};
use berth_core::runtime::{
    FromPool, PoolStatus, RestoreReport, Runtime, SandboxStatus, new_call_id,
};
use berth_core::store::Event;
use berth_policies::files::FileOp;

use crate::answers;

/// The largest file [`Service::read_file`] returns.
pub const READ_MAX: u64 = 16 * 1024 * 1024;
/// How long one file operation in a sandbox may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a follower of events scans running jobs' output for watch
/// patterns.
const WATCH_SCAN: Duration = Duration::from_secs(1);

/// Whether `e`'s kind starts with `kind` (no filter: every kind).
fn kind_matches(e: &Event, kind: Option<&str>) -> bool {
    kind.is_none_or(|k| e.kind.as_str().starts_with(k))
}

/// A follower of kinds starting with `kind` may be sent job events
/// (`job.started`, `job.exited`, …): no filter, or one a job's kind starts
/// with or that starts with `job`.
fn wants_job_events(kind: Option<&str>) -> bool {
    kind.is_none_or(|k| k.starts_with("job") || "job.".starts_with(k))
}

/// A sandbox as it stands, beside its record.
pub struct Inspection {
    /// What it was made with (`None`: not on record, an orphan).
    pub record: Option<SandboxSpec>,
    /// The backend's state and id for it (not on docker).
    pub state: Option<String>,
    pub id: Option<String>,
    /// Docker: its container as the engine has it.
    #[cfg(feature = "docker")]
    pub container: Option<berth_backends::docker::inspect::ContainerFacts>,
    /// Docker: where the container differs from the record.
    pub differences: Vec<String>,
}

/// One sandbox's checkpoints pruned.
pub struct Pruned {
    pub sandbox: String,
    pub checkpoints: usize,
    pub packs: usize,
    pub error: Option<String>,
}

/// What [`Service::collect`] removed.
#[derive(Default)]
pub struct Collected {
    pub checkpoints: Vec<Pruned>,
    pub removed: Vec<String>,
    pub removed_volumes: Vec<String>,
    pub kept: usize,
}

fn not_found(backend: BackendKind, name: &str) -> Error {
    Error::NotFound {
        what: "sandbox",
        name: name.to_string(),
        hint: format!(
            "no {backend} sandbox has that name; list them with `berth sandbox ls -b {backend}`"
        ),
    }
}

#[cfg(not(feature = "docker"))]
fn no_docker() -> Error {
    Error::Unsupported(
        "this berth was built without the docker backend (cargo feature `docker`)".into(),
    )
}

/// Which jobs a listing keeps: every condition given must hold.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    /// Only this backend's.
    pub backend: Option<BackendKind>,
    /// Only sandboxes of this name.
    pub sandbox: Option<String>,
    /// Only these states (none: any)...
    pub states: Vec<JobState>,
    /// ...or, with `ended`, any final state.
    pub ended: bool,
}

impl JobFilter {
    /// Whether `j` is kept.
    pub fn keeps(&self, j: &Job) -> bool {
        self.backend.is_none_or(|b| b == j.backend)
            && self.sandbox.as_ref().is_none_or(|s| *s == j.sandbox)
            && ((self.states.is_empty() && !self.ended)
                || self.states.contains(&j.state)
                || (self.ended && j.state.is_final()))
    }
}

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
        let (sb, created, recreated) = self.rt.create_sandbox(backend, spec).await?;
        Ok(Made {
            workdir: sb.layout().workdir.clone(),
            created,
            recreated,
        })
    }

    /// Make sandbox `asked.name` from pool `pool`, and refill the pool in
    /// the background.
    pub async fn take_from_pool(
        &self,
        pool: &str,
        backend: Option<BackendKind>,
        asked: &SandboxSpec,
    ) -> Result<FromPool> {
        if asked.name.trim().is_empty() {
            return Err(Error::InvalidInput(
                "a sandbox needs a name, e.g. `agent`".into(),
            ));
        }
        let got = self.rt.take_from_pool(pool, backend, asked).await?;
        self.refill(pool);
        Ok(got)
    }

    /// Make the members pool `pool` lacks, in the background.
    pub fn refill(&self, pool: &str) {
        let rt = self.rt.clone();
        let pool = pool.to_string();
        tokio::spawn(async move {
            if let Err(e) = rt.fill_pool(&pool).await {
                tracing::warn!(pool = %pool, error = %e.full_text(), "refilling a pool failed");
            }
        });
    }

    /// Record a pool and make its members: before returning with `wait`,
    /// else in the background.
    pub async fn create_pool(
        &self,
        name: &str,
        backend: BackendKind,
        size: u32,
        spec: SandboxSpec,
        wait: bool,
    ) -> Result<PoolStatus> {
        self.rt.create_pool(name, backend, size, spec).await?;
        if wait {
            if let Err(e) = self.rt.fill_pool(name).await {
                // Nothing half made is kept: the pool goes with its members.
                if let Err(rm) = self.rt.remove_pool(name).await {
                    tracing::warn!(pool = %name, error = %rm.full_text(), "removing a pool that could not be filled");
                }
                return Err(e);
            }
        } else {
            self.refill(name);
        }
        self.pool(name)
    }

    /// Fill a pool now; returns it as it then stands.
    pub async fn fill_pool(&self, name: &str) -> Result<PoolStatus> {
        self.rt.fill_pool(name).await?;
        self.pool(name)
    }

    /// A pool as it stands.
    pub fn pool(&self, name: &str) -> Result<PoolStatus> {
        self.rt
            .pools()?
            .into_iter()
            .find(|p| p.row.name == name)
            .ok_or_else(|| Error::NotFound {
                what: "pool",
                name: name.to_string(),
                hint: "list pools with `berth pool ls`".into(),
            })
    }

    /// Every pool.
    pub fn pools(&self) -> Result<Vec<PoolStatus>> {
        self.rt.pools()
    }

    /// Remove a pool and its members not yet taken.
    pub async fn remove_pool(&self, name: &str) -> Result<Vec<String>> {
        self.rt.remove_pool(name).await
    }

    /// One backend's sandboxes.
    pub async fn list_sandboxes(&self, backend: BackendKind) -> Result<Vec<SandboxStatus>> {
        self.rt.list_sandboxes(backend).await
    }

    /// Remove a sandbox; `keep_workspace` keeps its files.
    pub async fn remove_sandbox(
        &self,
        backend: BackendKind,
        name: &str,
        keep_workspace: bool,
    ) -> Result<()> {
        self.rt.remove_sandbox(backend, name, !keep_workspace).await
    }

    /// The sandboxes of every backend with sandboxes on record (and
    /// local), and the backends that could not be asked, with why.
    pub async fn list_all_sandboxes(
        &self,
    ) -> Result<(Vec<SandboxStatus>, Vec<(BackendKind, String)>)> {
        let mut backends = vec![BackendKind::Local];
        for r in self.rt.store().sandboxes(None)? {
            if !backends.contains(&r.backend) {
                backends.push(r.backend);
            }
        }
        let mut list = Vec::new();
        let mut failed = Vec::new();
        for b in backends {
            match self.rt.list_sandboxes(b).await {
                Ok(l) => list.extend(l),
                Err(e) => failed.push((b, e.full_text())),
            }
        }
        Ok((list, failed))
    }

    /// Take a checkpoint of a sandbox; and what it leaves out beside the
    /// workspace, said in words ([`Service::outside_workspace`]).
    pub async fn checkpoint(
        &self,
        backend: BackendKind,
        sandbox: &str,
        label: Option<&str>,
    ) -> Result<(CheckpointRow, Option<String>)> {
        let row = self.rt.checkpoint(backend, sandbox, label, None).await?;
        let left_out = self.outside_workspace(backend, sandbox).await;
        Ok((row, left_out))
    }

    /// Make sandbox `dst` on `to` from `src` as it is now or `at` a
    /// checkpoint; its first checkpoint, and what was not carried over.
    pub async fn clone_sandbox(
        &self,
        backend: BackendKind,
        src: &str,
        to: BackendKind,
        dst: &str,
        at: Option<&str>,
    ) -> Result<(CheckpointRow, Option<String>)> {
        let row = self.rt.clone_sandbox(backend, src, to, dst, at).await?;
        let left_out = self.outside_workspace(backend, src).await;
        Ok((row, left_out))
    }

    /// What a checkpoint of a sandbox leaves out beside its workspace:
    /// files under `~/.local` (where `pip install --user` puts packages)
    /// when the home lies outside the workspace. A checkpoint and a clone
    /// carry the workspace only; this says so instead of dropping them
    /// without a word. `None` when there are none, or the sandbox could not
    /// be asked (then nothing is claimed).
    async fn outside_workspace(&self, backend: BackendKind, name: &str) -> Option<String> {
        const PROBE: &str = r#"W=$1 h=${HOME:-}
[ -n "$h" ] || exit 0
d=${h%/}/.local
case "$d/" in "${W%/}"/*) exit 0;; esac
[ -d "$d" ] || exit 0
n=$(find "$d" -type f 2>/dev/null | head -n 100000 | wc -l)
[ "$n" -gt 0 ] && printf '%s\t%s' "$n" "$d"
exit 0"#;
        let sb = self.rt.attach(backend, name).await.ok()?;
        let workdir = sb.layout().workdir.clone();
        let argv = [
            "bash".to_string(),
            "-c".into(),
            PROBE.into(),
            "berth-probe".into(),
            workdir.clone(),
        ];
        let c = berth_core::backend::run_to_end(&*sb, &argv, None, 4096, Duration::from_secs(20))
            .await
            .ok()?;
        let out = String::from_utf8_lossy(&c.stdout).into_owned();
        let (n, dir) = out.trim().split_once('\t')?;
        Some(format!(
            "{n} files under {dir} (where `pip install --user` puts packages) are outside the workspace {workdir}, so checkpoints and clones do not carry them; install into a venv in the workspace instead (`python3 -m venv .venv`), which they do"
        ))
    }

    /// A sandbox as it stands, beside its record.
    pub async fn inspect(&self, backend: BackendKind, name: &str) -> Result<Inspection> {
        let record = self.rt.store().sandbox(backend, name)?.map(|r| r.spec);
        if backend == BackendKind::Docker {
            return self.inspect_docker(name, record).await;
        }
        let live = self
            .rt
            .list_sandboxes(backend)
            .await?
            .into_iter()
            .find(|s| s.name == name);
        if record.is_none() && live.is_none() {
            return Err(not_found(backend, name));
        }
        Ok(Inspection {
            record,
            state: live.as_ref().map(|l| l.state.clone()),
            id: live.and_then(|l| l.id),
            #[cfg(feature = "docker")]
            container: None,
            differences: Vec::new(),
        })
    }

    #[cfg(feature = "docker")]
    async fn inspect_docker(&self, name: &str, record: Option<SandboxSpec>) -> Result<Inspection> {
        use berth_backends::docker::config::ContainerPlan;
        use berth_backends::docker::inspect::{ContainerSettings, differences};
        let backend = self.docker().await?;
        // A sandbox taken from a pool is its member's container.
        let on_engine = record
            .as_ref()
            .map_or(name, |spec| berth_core::pools::instance_of(spec));
        let facts = backend.inspect_sandbox(on_engine).await?;
        if record.is_none() && facts.is_none() {
            return Err(not_found(BackendKind::Docker, name));
        }
        let differences = match (&record, &facts) {
            (Some(spec), Some(f)) => {
                let spec = berth_core::pools::on_backend(spec);
                let plan = ContainerPlan::from_spec(&spec)?;
                differences(&ContainerSettings::planned(&spec, &plan), &f.settings)
            }
            _ => Vec::new(),
        };
        Ok(Inspection {
            record,
            state: None,
            id: None,
            container: facts,
            differences,
        })
    }

    #[cfg(not(feature = "docker"))]
    async fn inspect_docker(&self, _: &str, _: Option<SandboxSpec>) -> Result<Inspection> {
        Err(no_docker())
    }

    /// This installation's docker backend.
    #[cfg(feature = "docker")]
    async fn docker(&self) -> Result<berth_backends::docker::DockerBackend> {
        Ok(berth_backends::docker::DockerBackend::connect()
            .await?
            .with_installation(&berth_backends::installation_id(
                &self.rt.config().state_dir,
            )?))
    }

    /// Remove the sandboxes idle past the policy's lifetime (`dry_run`:
    /// only say which).
    pub async fn reap(&self, dry_run: bool) -> Result<Vec<berth_core::reaper::Idle>> {
        berth_core::reaper::reap_idle(&self.rt, dry_run).await
    }

    /// Prune checkpoints past retention on `backend`; on docker, also
    /// remove containers stopped longer than `older_than` and orphaned
    /// volumes (with `workspaces`, those of sandboxes not on record too).
    pub async fn collect(
        &self,
        backend: BackendKind,
        older_than: Duration,
        workspaces: bool,
    ) -> Result<Collected> {
        let b = backend;
        let mut out = Collected::default();
        for row in self.rt.store().sandboxes(Some(b))? {
            if self.rt.checkpoints(b, &row.name)?.is_empty() {
                continue;
            }
            out.checkpoints
                .push(match self.rt.gc_checkpoints(b, &row.name).await {
                    Ok((checkpoints, packs)) => Pruned {
                        sandbox: row.name,
                        checkpoints,
                        packs,
                        error: None,
                    },
                    Err(e) => Pruned {
                        sandbox: row.name,
                        checkpoints: 0,
                        packs: 0,
                        error: Some(e.full_text()),
                    },
                });
        }
        if backend == BackendKind::Docker {
            self.collect_docker(older_than, workspaces, &mut out)
                .await?;
        }
        Ok(out)
    }

    #[cfg(feature = "docker")]
    async fn collect_docker(
        &self,
        older_than: Duration,
        workspaces: bool,
        out: &mut Collected,
    ) -> Result<()> {
        let backend = self.docker().await?;
        let report = backend.gc(older_than).await?;
        // Volumes of sandboxes still on record are how `sandbox create`
        // brings them back.
        // Pool members are the pools' (and sandboxes taken from a pool are
        // their member's name on the engine).
        let known: std::collections::HashSet<String> = self
            .rt
            .backend_names(BackendKind::Docker)?
            .into_iter()
            .collect();
        out.removed_volumes = backend
            .gc_volumes(|name| known.contains(name), workspaces)
            .await?;
        out.removed = report.removed;
        out.kept = report.kept;
        Ok(())
    }

    #[cfg(not(feature = "docker"))]
    async fn collect_docker(&self, _: Duration, _: bool, _: &mut Collected) -> Result<()> {
        Err(no_docker())
    }

    /// A sandbox's checkpoints, oldest first.
    pub fn checkpoints(&self, backend: BackendKind, sandbox: &str) -> Result<Vec<CheckpointRow>> {
        self.rt.checkpoints(backend, sandbox)
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
        let rows = self.rt.checkpoints(backend, sandbox)?;
        let id = if rows.iter().any(|c| c.id == checkpoint) {
            checkpoint.to_string()
        } else {
            rows.iter()
                .rev()
                .find(|c| c.label.as_deref() == Some(checkpoint))
                .map_or_else(|| checkpoint.to_string(), |c| c.id.clone())
        };
        self.rt
            .restore_checkpoint(backend, sandbox, &id, force)
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
        let sb = self.rt.attach(backend, sandbox).await?;
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
                .admit_verdict(&new_call_id(), backend, sandbox, &subject, v)
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
        if command.trim().is_empty() {
            return Err(Error::InvalidInput(
                "the job's command is empty: give the shell text to run, e.g. `make -j2`".into(),
            ));
        }
        if let Some(s) = &opts.session {
            berth_core::runtime::check_session_name(s)?;
        }
        self.rt
            .start_job_with(backend, sandbox, command, opts)
            .await
    }

    /// A job by id or name, brought up to date.
    pub async fn job(&self, id: &str) -> Result<Job> {
        self.rt.job(id).await
    }

    /// Every job, brought up to date, that `only` keeps.
    pub async fn jobs(&self, only: &JobFilter) -> Result<Vec<Job>> {
        Ok(self
            .rt
            .list_jobs()
            .await?
            .into_iter()
            .filter(|j| only.keeps(j))
            .collect())
    }

    /// Forget the ended jobs `only` keeps, with their output; the pruned.
    pub async fn prune_jobs(&self, only: &JobFilter) -> Result<Vec<Job>> {
        let jobs = self.jobs(only).await?;
        self.rt.prune_jobs(jobs).await
    }

    /// A job's last `lines` lines, and the offset they end at.
    pub async fn job_tail(&self, id: &str, lines: u64) -> Result<(Vec<u8>, u64)> {
        self.rt.job_tail_at(id, lines).await
    }

    /// Wait for a job to end, at most `timeout`.
    pub async fn wait_job(&self, id: &str, timeout: Option<Duration>) -> Result<Job> {
        self.rt.wait_job(id, timeout).await
    }

    /// Signal a job's process group (SIGKILL after `grace`); the job as it
    /// stands after, and whether it had already ended.
    pub async fn kill_job(
        &self,
        id: &str,
        signal: berth_core::backend::Signal,
        grace: Option<Duration>,
    ) -> Result<(Job, bool)> {
        let outcome = match grace {
            Some(g) => self.rt.kill_job_with_grace(id, signal, g).await?,
            None => self.rt.kill_job(id, signal).await?,
        };
        let already = matches!(outcome, berth_core::jobs::KillOutcome::AlreadyEnded(..));
        Ok((self.rt.job(id).await?, already))
    }

    /// Write to a job's stdin, then type `keys` (a pty job's), and close
    /// its stdin with `eof`.
    pub async fn send_job(&self, id: &str, data: &[u8], keys: &[String], eof: bool) -> Result<()> {
        if data.is_empty() && keys.is_empty() && !eof {
            return Err(Error::InvalidInput(
                "nothing to send: give data, keys, eof, or any of them".into(),
            ));
        }
        self.rt.send_input(id, data, keys, eof).await.map(|_| ())
    }

    /// What a pty job's terminal shows.
    pub async fn job_screen(&self, id: &str) -> Result<berth_core::jobs::pty::Screen> {
        self.rt.job_screen(id).await
    }

    /// Resize a pty job's terminal.
    pub async fn resize_job(&self, id: &str, size: TermSize) -> Result<()> {
        self.rt.resize_job(id, size).await
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

    /// Events: the newest `limit` (with `after` unset), else the first
    /// `limit` after id `after`; oldest first, only kinds starting with
    /// `kind` if given.
    pub fn events(
        &self,
        limit: usize,
        kind: Option<&str>,
        after: Option<i64>,
    ) -> Result<Vec<Event>> {
        let store = self.rt.store();
        let Some(mut last) = after else {
            return store.events(0, limit, kind);
        };
        let mut out = Vec::new();
        while out.len() < limit {
            let page = store.events_after(last, 1000)?;
            let Some(end) = page.last().map(|e| e.id) else {
                break;
            };
            last = end;
            out.extend(page.into_iter().filter(|e| kind_matches(e, kind)));
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Send every event after `after` (unset: the newest now) whose kind
    /// starts with `kind` to `tx`, as each is written, until `tx` closes.
    /// Where the follower may want job events, each running job meanwhile
    /// has a waiter in its sandbox, so its end is written the moment it
    /// comes, and running jobs' output is scanned for watch patterns about
    /// once a second; a follower of other kinds (a job start watching for
    /// its approval asks for `approval.`) starts no waiter and scans
    /// nothing. A slow reader holds the follow here (the channel is
    /// bounded), not in memory.
    pub async fn follow_events(
        &self,
        after: Option<i64>,
        kind: Option<String>,
        tx: tokio::sync::mpsc::Sender<Event>,
    ) -> Result<()> {
        use futures::StreamExt;
        let rt = &self.rt;
        let store = rt.store().clone();
        let mut last = match after {
            Some(a) => a,
            None => store.events(0, 1, None)?.last().map_or(0, |e| e.id),
        };
        let mut waits = futures::stream::FuturesUnordered::new();
        let mut watched = std::collections::HashSet::new();
        // An appended event rings the store's bell: it is sent at once.
        let mut bell = store.bell(Duration::from_millis(200));
        let mut scanned = std::time::Instant::now();
        let jobs = wants_job_events(kind.as_deref());
        loop {
            for e in store.events_after(last, 1000)? {
                last = e.id;
                if kind_matches(&e, kind.as_deref()) && tx.send(e).await.is_err() {
                    return Ok(());
                }
            }
            let running = match jobs {
                true => store.jobs()?,
                false => Vec::new(),
            };
            for j in running.into_iter().filter(|j| !j.state.is_final()) {
                if watched.insert(j.id.clone()) {
                    waits.push(async move {
                        let r = rt.wait_job(&j.id, None).await;
                        (j.id, r.err())
                    });
                }
            }
            tokio::select! {
                _ = tx.closed() => return Ok(()),
                _ = bell.wait(WATCH_SCAN) => {
                    // Watch patterns match output, which is in the sandbox,
                    // not the store: scan about once a second.
                    if jobs && scanned.elapsed() >= WATCH_SCAN {
                        scanned = std::time::Instant::now();
                        if let Err(e) = rt.list_jobs().await {
                            tracing::debug!(error = %e, "refreshing jobs");
                        }
                    }
                }
                Some((id, err)) = waits.next(), if !waits.is_empty() => {
                    // A waiter that failed (sandbox gone) is not retried:
                    // the scan records how the job ended.
                    if let Some(e) = err {
                        tracing::debug!(job = %id, error = %e, "waiting for a job");
                    }
                }
            }
        }
    }

    /// Redact secrets from `text` as the policy says.
    pub fn redact(&self, text: &str) -> String {
        self.rt.redact(text)
    }
}

#[cfg(test)]
mod tests {
    use super::wants_job_events;

    #[test]
    fn only_a_follower_that_may_get_job_events_waits_on_jobs() {
        for k in [
            None,
            Some(""),
            Some("j"),
            Some("job"),
            Some("job."),
            Some("job.exited"),
        ] {
            assert!(wants_job_events(k), "{k:?}");
        }
        for k in [
            Some("approval."),
            Some("exec"),
            Some("jobs"),
            Some("sandbox.created"),
        ] {
            assert_eq!(wants_job_events(k), k == Some("jobs"), "{k:?}");
        }
    }
}
