//! A live E2B sandbox: processes over envd's `Start` stream, files over
//! `/files`, and the task that keeps the sandbox's timeout pushed forward while
//! any of its processes runs.

use super::*;

pub(super) struct Inner {
    pub(super) backend: E2bBackend,
    pub(super) id: String,
    pub(super) name: String,
    pub(super) envd: Envd,
    pub(super) env: BTreeMap<String, String>,
    /// Processes of this handle still running: while any is, the timeout is extended.
    pub(super) live: Arc<AtomicUsize>,
    pub(super) timeout: u64,
}

/// Counts a live process; dropped with the process.
pub(super) struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Inner {
    pub(super) fn api(&self) -> &Api {
        &self.backend.shared.api
    }

    /// Start a process, resuming the sandbox once if envd's proxy says it is
    /// not running but E2B has it paused.
    pub(super) async fn start(
        &self,
        request: StartRequest,
        deadline: Option<Duration>,
    ) -> Result<E2bProcess> {
        let program = request.process.cmd.clone();
        for attempt in 0..2 {
            let spec = StartSpec {
                request: request.clone(),
                deadline,
                sandbox: self.name.clone(),
            };
            self.live.fetch_add(1, Ordering::SeqCst);
            let guard: Box<dyn Send + Sync> = Box::new(LiveGuard(self.live.clone()));
            match process::start(&self.envd, spec, Some(guard)).await {
                Ok(p) => return Ok(p),
                Err(StartError::Refused(e)) => return Err(process::refused(&program, &e)),
                Err(StartError::Call(e)) if e.status() == Some(502) && attempt == 0 => {
                    if !self.resume_if_paused().await? {
                        return Err(gone(
                            &self.name,
                            &format!("E2B sandbox {} is no longer running", self.id),
                        ));
                    }
                }
                Err(StartError::Call(e)) => {
                    return Err(self.envd_error(&format!("starting `{program}`"), e).await);
                }
                Err(StartError::Cut(why)) => {
                    return Err(self
                        .dead_or(Error::unreachable(
                            KIND,
                            BackendFailure::Transport,
                            format!("sandbox `{}`: the stream starting `{program}` broke: {why}", self.name),
                            "check the network; if the sandbox timed out, run the command again to recreate it",
                        ))
                        .await);
                }
                Err(StartError::Protocol(m)) => {
                    return Err(Error::backend(
                        KIND,
                        BackendFailure::Protocol,
                        format!("sandbox `{}`: starting `{program}`: {m}", self.name),
                    ));
                }
            }
        }
        Err(gone(&self.name, "envd stayed unreachable after a resume"))
    }

    /// If E2B has the sandbox paused, resume it. `Ok(false)` when it is gone.
    pub(super) async fn resume_if_paused(&self) -> Result<bool> {
        match self.api().get(&self.id).await? {
            None => Ok(false),
            Some(s) if s.state == "paused" => {
                self.api()
                    .connect(&self.id, &self.name, self.timeout)
                    .await?;
                Ok(true)
            }
            // Running, yet its proxy said no: give envd one more try.
            Some(_) => Ok(true),
        }
    }

    /// `err`, unless the sandbox turns out to be gone, which says more.
    pub(super) async fn dead_or(&self, err: Error) -> Error {
        match self.api().get(&self.id).await {
            Ok(None) => gone(&self.name, &format!("E2B sandbox {} is gone", self.id)),
            _ => err,
        }
    }

    /// Map an envd call's failure.
    pub(super) async fn envd_error(&self, doing: &str, e: CallError) -> Error {
        match &e {
            CallError::Status { status: 502, .. } => gone(
                &self.name,
                &format!("E2B sandbox {} is not running ({doing})", self.id),
            ),
            CallError::Status { status: 401, .. } => Error::unreachable(
                KIND,
                BackendFailure::Auth,
                format!(
                    "sandbox `{}`: envd refused the access token ({doing})",
                    self.name
                ),
                "run the command again: berth reconnects and fetches the sandbox's current token",
            )
            .caused_by(e),
            CallError::Transport(t) if t.is_connect() || t.is_timeout() => {
                let kind = e.failure();
                let detail = format!(
                    "sandbox `{}`: cannot reach envd at {} ({doing})",
                    self.name,
                    self.envd.base()
                );
                self.dead_or(
                    Error::unreachable(
                        KIND,
                        kind,
                        detail,
                        "check the network, E2B_DOMAIN and E2B_SANDBOX_URL",
                    )
                    .caused_by(e),
                )
                .await
            }
            _ => Error::backend_call(
                KIND,
                e.failure(),
                format!("sandbox `{}`: {doing} failed", self.name),
                e,
            ),
        }
    }

    pub(super) fn config(
        &self,
        argv: &[String],
        env: &[(String, String)],
        cwd: Option<String>,
    ) -> Result<ProcessConfig> {
        let Some(cmd) = argv.first() else {
            return Err(Error::InvalidInput("empty argv".into()));
        };
        let mut envs = self.env.clone();
        envs.extend(env.iter().cloned());
        Ok(ProcessConfig {
            cmd: cmd.clone(),
            args: argv[1..].to_vec(),
            envs,
            cwd,
        })
    }

    /// End the processes tagged with `key` (see [`SpawnOpts::replaces`])
    /// whose berth is gone: envd keeps a process whose stream dropped, so a
    /// session's shell would otherwise outlive a berth killed mid-command,
    /// idle at its `read` for as long as the sandbox lives. A failure here
    /// stops nothing: the new process starts all the same.
    ///
    /// [`SpawnOpts::replaces`]: berth_core::backend::SpawnOpts::replaces
    pub(super) async fn end_orphans(&self, key: &str) {
        let listed = match self.processes().await {
            Ok(l) => l,
            Err(e) => {
                debug!(sandbox = %self.name, error = %e, "listing processes for orphans");
                return;
            }
        };
        let prefix = format!("{key}|");
        for p in listed {
            let Some(owner) = p.tag.as_deref().and_then(|t| t.strip_prefix(&prefix)) else {
                continue;
            };
            if !berth_core::owner::is_gone(owner) {
                continue;
            }
            let r: std::result::Result<proto::Empty, _> = self
                .envd
                .unary(
                    "/process.Process/SendSignal",
                    &proto::SendSignalRequest {
                        process: proto::Selector::Pid(p.pid),
                        signal: proto::SignalName::Kill,
                    },
                )
                .await;
            match r {
                Ok(_) => {
                    debug!(sandbox = %self.name, pid = p.pid, key, "ended the shell of a berth that is gone")
                }
                Err(e) => {
                    debug!(sandbox = %self.name, pid = p.pid, error = %e, "ending an orphaned shell")
                }
            }
        }
    }

    /// The processes envd is running.
    async fn processes(&self) -> Result<Vec<proto::ProcessInfo>> {
        let r: proto::ListResponse = self
            .envd
            .unary("/process.Process/List", &proto::Empty {})
            .await
            .map_err(|e| {
                Error::backend_call(
                    KIND,
                    e.failure(),
                    format!("sandbox `{}`: listing processes failed", self.name),
                    e,
                )
            })?;
        Ok(r.processes)
    }

    /// Run a short helper script; its stdout when it exits 0.
    pub(super) async fn helper(&self, script: &str) -> Result<Vec<u8>> {
        let argv = ["bash".to_string(), "-c".to_string(), script.to_string()];
        let request = StartRequest {
            process: self.config(&argv, &[], None)?,
            tag: None,
            stdin: Some(false),
            pty: None,
        };
        let mut p = self.start(request, Some(Duration::from_secs(60))).await?;
        let collected = collect(&mut p).await;
        let status = p.wait().await?;
        let (out, err) = collected?;
        if status.code != Some(0) {
            return Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "sandbox `{}`: helper failed ({}): {}",
                    self.name,
                    status.shell_code(),
                    String::from_utf8_lossy(&err).trim()
                ),
            ));
        }
        Ok(out)
    }

    /// Make the workspace and berth's directory; return `$HOME`.
    pub(super) async fn home(&self) -> Result<String> {
        let out = self
            .helper(r#"mkdir -p -- "$HOME/workspace" "$HOME/.berth" && printf %s "$HOME""#)
            .await?;
        let home = String::from_utf8_lossy(&out).trim().to_string();
        if !home.starts_with('/') {
            return Err(Error::backend(
                KIND,
                BackendFailure::Protocol,
                format!(
                    "sandbox `{}`: $HOME is {home:?}, not an absolute path",
                    self.name
                ),
            ));
        }
        Ok(home)
    }
}

/// Read a helper's stdout and stderr to the end (1 MiB each at most).
async fn collect(p: &mut E2bProcess) -> Result<(Vec<u8>, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let read = |r: Option<berth_core::backend::BoxRead>| async move {
        let mut buf = Vec::new();
        if let Some(r) = r {
            r.take(1 << 20)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| Error::stream("reading a helper's output", e))?;
        }
        Ok::<_, Error>(buf)
    };
    let (out, err) = tokio::join!(read(p.take_stdout()), read(p.take_stderr()));
    Ok((out?, err?))
}

/// Push the sandbox's timeout forward while the handle has live processes.
pub(super) async fn keep_alive(inner: Weak<Inner>) {
    let period = match inner.upgrade() {
        Some(i) => Duration::from_secs((i.timeout / 3).max(1)),
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(i) = inner.upgrade() else { return };
        if i.live.load(Ordering::SeqCst) == 0 {
            continue;
        }
        if let Err(e) = i.api().set_timeout(&i.id, &i.name, i.timeout).await {
            warn!(sandbox = %i.name, "could not extend the e2b sandbox's timeout: {e}");
        }
    }
}

/// A live E2B sandbox.
pub struct E2bSandbox {
    pub(super) inner: Arc<Inner>,
    pub(super) layout: Layout,
}

impl E2bSandbox {
    /// The E2B sandbox id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Start `argv` with a deadline envd enforces (`Connect-Timeout-Ms`).
    pub async fn start_with_deadline(
        &self,
        argv: &[String],
        stdin: bool,
        deadline: Option<Duration>,
    ) -> Result<E2bProcess> {
        let request = StartRequest {
            process: self
                .inner
                .config(argv, &[], Some(self.layout.workdir.clone()))?,
            tag: None,
            stdin: Some(stdin),
            pty: None,
        };
        self.inner.start(request, deadline).await
    }

    /// The processes envd is running, by pid.
    pub async fn processes(&self) -> Result<Vec<u32>> {
        let listed = self.inner.processes().await?;
        Ok(listed.into_iter().map(|p| p.pid).collect())
    }
}

/// How long one file transfer may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);

/// The error for a path that holds neither a regular file nor a directory.
fn not_regular(path: &str, sandbox: &str) -> Error {
    Error::InvalidInput(format!(
        "`{path}` in sandbox `{sandbox}` is not a regular file (a FIFO, device or socket); berth reads only regular files"
    ))
}

#[async_trait]
impl Sandbox for E2bSandbox {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::E2b
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        let cwd = opts
            .cwd
            .map(|c| self.layout.resolve(&c))
            .unwrap_or_else(|| self.layout.workdir.clone());
        let mut env = opts.env.clone();
        // On envd's terminal the output is the terminal's; a program needs to
        // know what it is talking to.
        if opts.tty && !env.iter().any(|(k, _)| k == "TERM") {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        // A session's shell adopts what its commands detach (see
        // `crate::subreaper`).
        let wrapped = crate::subreaper::wrap(argv, opts.replaces.as_deref(), opts.tty);
        let argv = &wrapped[..];
        let tag = match &opts.replaces {
            Some(key) => {
                self.inner.end_orphans(key).await;
                Some(format!("{key}|{}", berth_core::owner::this()))
            }
            None => None,
        };
        let request = StartRequest {
            process: self.inner.config(argv, &env, Some(cwd))?,
            tag,
            stdin: Some(true),
            pty: opts
                .tty
                .then(|| process::pty(opts.tty_size.unwrap_or_default())),
        };
        Ok(Box::new(self.inner.start(request, None).await?))
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        let full = self.layout.resolve(path);
        // envd's `/files` opens whatever is there, and a FIFO would hold the
        // download open forever: only a regular file is read.
        match self.inner.envd.stat(&full).await {
            Ok(Some(e)) if e.is_file() => {}
            Ok(Some(e)) if e.is_dir() => {
                return Err(Error::InvalidInput(format!(
                    "`{full}` is a directory, not a file (sandbox `{}`)",
                    self.inner.name
                )));
            }
            Ok(Some(_)) => return Err(not_regular(&full, &self.inner.name)),
            Ok(None) => {
                return Err(Error::NotFound {
                    what: "file",
                    name: full,
                    hint: format!("in e2b sandbox `{}`", self.inner.name),
                });
            }
            Err(e) => return Err(self.inner.envd_error(&format!("reading `{full}`"), e).await),
        }
        let download = self.inner.envd.download(&full, limit);
        let Ok(downloaded) = tokio::time::timeout(FILE_TIMEOUT, download).await else {
            return Err(Error::backend(
                KIND,
                BackendFailure::Timeout,
                format!(
                    "sandbox `{}`: reading `{full}` took longer than {}s; it may have become a FIFO or device",
                    self.inner.name,
                    FILE_TIMEOUT.as_secs()
                ),
            ));
        };
        match downloaded {
            Ok(b) => Ok(b),
            Err(CallError::Status { status: 404, .. }) => Err(Error::NotFound {
                what: "file",
                name: full,
                hint: format!("in e2b sandbox `{}`", self.inner.name),
            }),
            Err(CallError::Status {
                status: 400,
                message,
                ..
            }) => Err(Error::InvalidInput(format!(
                "cannot read `{full}` in sandbox `{}`: {message}",
                self.inner.name
            ))),
            Err(e) => Err(self.inner.envd_error(&format!("reading `{full}`"), e).await),
        }
    }

    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        let full = self.layout.resolve(path);
        // A FIFO, socket or device where the file goes is replaced, never
        // written into (a FIFO without a reader would hold the upload).
        match self.inner.envd.stat(&full).await {
            Ok(Some(e)) if !e.is_file() && !e.is_dir() => {
                if let Err(e) = self.inner.envd.remove(&full).await {
                    return Err(self
                        .inner
                        .envd_error(&format!("replacing `{full}`"), e)
                        .await);
                }
            }
            Ok(_) => {}
            Err(e) => return Err(self.inner.envd_error(&format!("writing `{full}`"), e).await),
        }
        if let Err(e) = self.inner.envd.upload(&full, data.to_vec()).await {
            return Err(match e {
                CallError::Status { status: 507, .. } => Error::backend_call(
                    KIND,
                    BackendFailure::Exhausted,
                    format!(
                        "sandbox `{}`: the disk is full writing `{full}`; free space in the sandbox, or write less",
                        self.inner.name
                    ),
                    e,
                ),
                e => self.inner.envd_error(&format!("writing `{full}`"), e).await,
            });
        }
        // envd has no mode in its upload: set it afterwards when it matters.
        let mode = mode & 0o7777;
        if mode != 0o644 && mode != 0 {
            let script = format!(
                "chmod {mode:o} -- {}",
                berth_core::session::script::quote(&full)
            );
            self.inner.helper(&script).await?;
        }
        Ok(())
    }

    async fn alive(&self) -> Result<bool> {
        match self.inner.api().get(&self.inner.id).await? {
            None => Ok(false),
            Some(s) if s.state == "paused" => {
                self.inner
                    .api()
                    .connect(&self.inner.id, &self.inner.name, self.inner.timeout)
                    .await?;
                Ok(true)
            }
            Some(_) => Ok(true),
        }
    }

    async fn destroy(&self) -> Result<()> {
        self.inner.api().kill(&self.inner.id).await?;
        Ok(())
    }
}
