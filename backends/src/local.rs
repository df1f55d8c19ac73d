//! The local backend: a sandbox is a directory under berth's state dir, and its
//! processes run on this machine in sessions of their own, with a minimal,
//! allow-listed environment.
//!
//! Layout of a sandbox `NAME`:
//! ```text
//! <state>/sandboxes/local/NAME/
//!   sandbox.json   the spec it was created with
//!   work/          the workspace: first cwd and $HOME
//!   tmp/           private $TMPDIR
//!   .berth/        snapshots, job logs (berth's, inside the sandbox)
//! ```
//! Kernel restrictions (Landlock, seccomp, capabilities, rlimits, a pids cgroup)
//! are applied by berth-sandbox's exec wrapper: a program that restricts itself
//! and then execs the real argv. It runs in a fresh process image, so none of
//! that setup happens between fork and exec of this multi-threaded process.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::backend::{
    Backend, BoxRead, BoxWrite, ExitStatus, Layout, Pipes, Process, Provisioned, RemoveOpts,
    Sandbox, SandboxInfo, SandboxSpec, SpawnOpts, TermSize, check_sandbox_name, now_unix_secs,
};
use berth_core::error::{Error, Result, SpawnFailure};
use berth_sandbox::{SpawnTarget, WrapperCommand};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

const KIND: &str = "local";

/// The sandbox's own directories, the only ones its processes may write.
const OWN_DIRS: [&str; 3] = ["work", "tmp", ".berth"];

/// The size berth asks for a child's stdout pipe (the kernel's default
/// `pipe-max-size` for an ordinary user).
const PIPE_SIZE: i32 = 1 << 20;

/// The PATH every local sandbox process starts with.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The local backend.
pub struct LocalBackend {
    root: PathBuf,
    wrapper: Option<WrapperCommand>,
}

impl LocalBackend {
    /// A local backend keeping its sandboxes under `state_dir/sandboxes/local`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            root: state_dir.join("sandboxes").join(KIND),
            wrapper: None,
        }
    }

    /// Run every process through `wrapper`, which applies the kernel
    /// restrictions and then execs the process.
    pub fn with_wrapper(mut self, wrapper: WrapperCommand) -> Self {
        self.wrapper = Some(wrapper);
        self
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

/// What is kept in `sandbox.json`.
#[derive(Serialize, Deserialize)]
struct Record {
    spec: SandboxSpec,
    created_unix: i64,
}

#[async_trait]
impl Backend for LocalBackend {
    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Local
    }

    fn network_door(&self) -> std::result::Result<(), String> {
        // A network namespace of its own per spawn, with a relay to the
        // door as its one way out (`berth_sandbox::door`).
        match &self.wrapper {
            Some(w) if !w.is_unrestricted() => Ok(()),
            _ => Err("this berth runs local sandboxes without kernel restrictions (BERTH_UNRESTRICTED=1 or `restricted = false`), and only a restricted sandbox can be held to `--network allow:` rules (its own network namespace, berth's proxy its one door). Use --network on or off, or a docker sandbox".into()),
        }
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        check_sandbox_name(&spec.name)?;
        let dir = self.dir(&spec.name);
        let record_path = dir.join("sandbox.json");
        let existed = record_path.exists();
        let mut recreated = None;
        for sub in OWN_DIRS {
            let p = dir.join(sub);
            if existed && !p.is_dir() {
                recreated = Some(format!(
                    "its `{sub}` directory was missing and was recreated"
                ));
            }
            // The sandbox's own processes run as this user; nobody else needs in.
            berth_core::store::private_dir(&p)
                .map_err(|e| Error::io("creating sandbox directory", &p, e))?;
        }
        let mut record = if existed {
            match std::fs::read(&record_path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
            {
                Some(r) => r,
                None => {
                    recreated = Some("its sandbox.json was unreadable and was rewritten".into());
                    Record {
                        spec: spec.clone(),
                        created_unix: now_unix_secs(),
                    }
                }
            }
        } else {
            Record {
                spec: spec.clone(),
                created_unix: now_unix_secs(),
            }
        };
        if !existed || recreated.is_some() {
            let json = serde_json::to_vec_pretty(&record)
                .map_err(|e| Error::InvalidInput(format!("sandbox spec: {e}")))?;
            // A new record is linked into place, so of two calls that make
            // the same sandbox at once the first one's stands and the other
            // reads it; an unreadable one is replaced.
            let placed = write_atomic(&record_path, &json, recreated.is_some())?;
            if !placed {
                let found = std::fs::read(&record_path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
                if let Some(r) = found {
                    record = r;
                }
            }
        }
        let mut env = record.spec.env.clone();
        env.extend(spec.door_env.iter().cloned());
        let sandbox = LocalSandbox::new(
            spec.name.clone(),
            dir,
            env,
            self.wrapper.clone(),
            record.spec.network.is_open(),
            spec.door.clone(),
        );
        Ok(Provisioned {
            sandbox: Arc::new(sandbox),
            created: !existed,
            recreated,
        })
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(Error::io("listing sandboxes", &self.root, e)),
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            let record = std::fs::read(dir.join("sandbox.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
            let state = if dir.join("work").is_dir() && record.is_some() {
                "ready"
            } else {
                "broken"
            };
            out.push(SandboxInfo {
                name,
                id: dir.display().to_string(),
                state: state.into(),
                created_unix: record.map(|r| r.created_unix),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn remove(&self, name: &str, _opts: RemoveOpts) -> Result<()> {
        check_sandbox_name(name)?;
        let dir = self.dir(name);
        if !dir.exists() {
            return Err(Error::NotFound {
                what: "sandbox",
                name: name.into(),
                hint: "list sandboxes with `berth sandbox ls --backend local`".into(),
            });
        }
        // The tree is gone (killed and reaped) before the sandbox is reported removed.
        for cg in berth_sandbox::cgroup::dirs_for(name, &dir) {
            berth_sandbox::cgroup::remove(&cg)
                .map_err(|e| Error::io("stopping the sandbox's processes", &cg, e))?;
        }
        remove_tree(&dir).await
    }
}

/// Remove a sandbox's directory. A process of the sandbox that is just ending
/// (a job's wrapper recording its status) can add an entry while the tree is
/// being removed, which fails the last `rmdir` with ENOTEMPTY: look again a
/// few times before calling it an error.
async fn remove_tree(dir: &Path) -> Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 10 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            r => return r.map_err(|e| Error::io("removing sandbox", dir, e)),
        }
    }
}

/// Write `data` to `path` whole or not at all, through a temporary file of
/// this call's own (a shared name let two provisions of one sandbox rename
/// each other's file away: "renaming sandbox.json: No such file"). With
/// `replace`, over what is there; without, only if nothing is (a hard
/// link fails on an existing name). Whether `data` was placed.
fn write_atomic(path: &Path, data: &[u8], replace: bool) -> Result<bool> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
    std::fs::write(&tmp, data).map_err(|e| Error::io("writing", &tmp, e))?;
    let placed = if replace {
        std::fs::rename(&tmp, path).map(|()| true)
    } else {
        let linked = match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&tmp);
        linked
    };
    placed.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io("placing", path, e)
    })
}

/// Write `data` at `path`, a path in a directory the sandbox can write:
/// into a new file (never through a link the sandbox left at the name),
/// renamed over whatever is there.
fn place_in_sandbox(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut n = 0u32;
    loop {
        let tmp = path.with_extension(format!("new.{}.{n}", std::process::id()));
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(&tmp);
        match opened {
            Ok(mut f) => {
                let written = f.write_all(data).and_then(|()| std::fs::rename(&tmp, path));
                if written.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                return written;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 16 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// A local sandbox.
pub struct LocalSandbox {
    name: String,
    dir: PathBuf,
    /// `dir` made absolute once, for confining berth's own file access.
    root: PathBuf,
    layout: Layout,
    env: Vec<(String, String)>,
    wrapper: Option<WrapperCommand>,
    /// Whether the sandbox's spec asks for network.
    network: bool,
    /// The network door's directory (`--network allow:`).
    door: Option<PathBuf>,
    /// The sandbox's cgroups (pids, and memory on cgroup v1), when the
    /// wrapper uses them.
    cgroups: Vec<PathBuf>,
    /// The sandbox's memory cgroup, when the wrapper bounds its memory.
    memory_cgroup: Option<PathBuf>,
    /// Its files, held open once found ([`Sandbox::memory`] reads them
    /// before and after every command).
    memory_files: std::sync::Mutex<Option<berth_sandbox::cgroup::MemoryFiles>>,
}

impl LocalSandbox {
    fn new(
        name: String,
        dir: PathBuf,
        spec_env: std::collections::BTreeMap<String, String>,
        wrapper: Option<WrapperCommand>,
        network: bool,
        door: Option<PathBuf>,
    ) -> Self {
        let work = dir.join("work");
        let layout = Layout {
            workdir: work.display().to_string(),
            berth_dir: dir.join(".berth").display().to_string(),
        };
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), SANDBOX_PATH.into()),
            ("HOME".into(), layout.workdir.clone()),
            ("TMPDIR".into(), dir.join("tmp").display().to_string()),
            ("LANG".into(), "C.UTF-8".into()),
            ("BERTH_SANDBOX".into(), name.clone()),
        ];
        if let Some(door) = &door {
            // The sandbox reads its own copy: the door directory is berth's
            // state, out of its reach.
            let bundle = dir.join(".berth").join(berth_core::backend::DOOR_BUNDLE);
            let placed = std::fs::read(door.join(berth_core::backend::DOOR_BUNDLE))
                .and_then(|b| place_in_sandbox(&bundle, &b));
            if let Err(e) = placed {
                warn_once(
                    &name,
                    &format!(
                        "the sandbox's certificate bundle could not be copied to {} ({e}); \
                         HTTPS to a host carrying a credential will fail its certificate check",
                        bundle.display()
                    ),
                );
            }
            env.extend(berth_core::backend::door_env(&bundle.display().to_string()));
        }
        for (k, v) in spec_env {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        let cgroups = match wrapper.as_ref().filter(|w| !w.is_unrestricted()) {
            Some(w) => {
                if w.memory_max(&name).is_some()
                    && w.memory_asked(&name)
                    && let Some(why) = berth_sandbox::cgroup::memory_bound_missing(&name, &dir)
                {
                    warn_once(&name, &why);
                }
                berth_sandbox::cgroup::dirs_for(&name, &dir)
            }
            None => Vec::new(),
        };
        let memory_cgroup = wrapper
            .as_ref()
            .filter(|w| !w.is_unrestricted() && w.memory_max(&name).is_some())
            .and_then(|_| berth_sandbox::cgroup::memory_dir_for(&name, &dir));
        Self {
            name,
            root: std::path::absolute(&dir).unwrap_or_else(|_| dir.clone()),
            dir,
            layout,
            env,
            wrapper,
            network,
            door,
            cgroups,
            memory_cgroup,
            memory_files: Default::default(),
        }
    }

    /// Where berth's own file access for this sandbox may go: under the sandbox's
    /// directory, resolved by the kernel so no `..` or symlink leads out (see
    /// `local_files`). A path outside it is refused while the sandbox runs under
    /// the restricting wrapper (berth would otherwise read and write for the agent
    /// what the sandbox forbids); without one, it is used as is. Returns the root
    /// and the path relative to it, or `None` for unconfined access.
    fn confine(&self, asked: &str, p: &Path) -> Result<Option<(PathBuf, PathBuf)>> {
        let abs = std::path::absolute(p).map_err(|e| Error::io("resolving", p, e))?;
        // Each of the sandbox's own directories is a root of its own: a path
        // (or a symlink planted in one) cannot reach from one into another, nor
        // up to the sandbox's record beside them, which berth reads back to
        // decide how to confine the sandbox.
        for sub in OWN_DIRS {
            let root = self.root.join(sub);
            if let Some(rel) = crate::local_files::relative_under(&root, &abs) {
                return Ok(Some((root, rel)));
            }
        }
        match crate::local_files::relative_under(&self.root, &abs) {
            Some(_) => Err(Error::InvalidInput(format!(
                "{asked} is sandbox `{}`'s own record, not a file of its workspace: \
                 berth's file access reaches only the sandbox's work/, tmp/ and .berth/ directories",
                self.name
            ))),
            None if self.wrapper.is_none() => Ok(None),
            None => Err(Error::InvalidInput(format!(
                "{asked} is outside sandbox `{}`: berth's file access reaches only the sandbox's directory ({}). \
                 Read or write it with a command instead, which runs under the sandbox's restrictions",
                self.name, self.layout.workdir
            ))),
        }
    }

    fn file_error(&self, what: &'static str, asked: &str, p: &Path, e: std::io::Error) -> Error {
        if e.raw_os_error().is_none() && e.kind() == std::io::ErrorKind::InvalidInput {
            return Error::InvalidInput(format!("{asked}: {e}"));
        }
        match e.raw_os_error() {
            Some(libc::ENOENT) => Error::NotFound {
                what: "file",
                name: asked.into(),
                hint: String::new(),
            },
            Some(libc::EXDEV) | Some(libc::ELOOP) => Error::InvalidInput(format!(
                "{asked} leads out of sandbox `{}` through `..` or a symlink; berth's file access stays inside the sandbox",
                self.name
            )),
            _ => Error::io(what, p, e),
        }
    }

    fn resolve(&self, path: &str) -> PathBuf {
        PathBuf::from(self.layout.resolve(path))
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Local
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn host_processes(&self) -> bool {
        true
    }

    fn sandbox_procs(&self) -> berth_core::procs::SandboxProcs {
        use berth_core::procs::SandboxProcs;
        match &self.wrapper {
            Some(w) if !w.is_unrestricted() => {
                SandboxProcs::Confined(berth_core::identity::SandboxIdentity {
                    name: self.name.clone(),
                    cgroup_leaf: berth_sandbox::cgroup::leaf_for(&self.name, &self.dir),
                    mount_source: berth_sandbox::mounts::marker_source(&self.name, &self.dir),
                })
            }
            _ => SandboxProcs::Unconfined {
                name: self.name.clone(),
            },
        }
    }

    fn memory(&self) -> Option<berth_core::backend::MemoryState> {
        let dir = self.memory_cgroup.as_ref()?;
        let mut held = self.memory_files.lock().ok()?;
        // Opened at the first read that finds the cgroup (the shell's wrapper
        // makes it), and again once if the held files stop reading.
        for _ in 0..2 {
            if held.is_none() {
                *held = berth_sandbox::cgroup::MemoryFiles::open(dir);
            }
            match held.as_ref()?.state() {
                Ok(s) => {
                    return s.map(
                        |(limit_bytes, oom_kills)| berth_core::backend::MemoryState {
                            limit_bytes,
                            oom_kills,
                        },
                    );
                }
                Err(_) => *held = None,
            }
        }
        None
    }

    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        let Some(program) = argv.first() else {
            return Err(Error::InvalidInput("empty argv".into()));
        };
        let cwd = opts
            .cwd
            .clone()
            .unwrap_or_else(|| self.layout.workdir.clone());
        if !Path::new(&cwd).is_dir() {
            if !self.dir.join("work").is_dir() {
                return Err(gone(&self.name, "its workspace directory is missing"));
            }
            return Err(Error::Spawn {
                kind: SpawnFailure::BadCwd,
                program: program.clone(),
                detail: format!("working directory {cwd} does not exist"),
            });
        }
        // A session's shell runs from a private copy, so the processes its
        // commands start cannot read its memory (see `berth_sandbox::private`).
        let shell = opts
            .replaces
            .as_deref()
            .is_some_and(|r| r.starts_with("berth-shell:"));
        let full: Vec<std::ffi::OsString> = match &self.wrapper {
            Some(w) => w
                .argv(&SpawnTarget {
                    dir: &self.dir,
                    name: &self.name,
                    network: self.network,
                    door: self.door.as_deref(),
                    nondumpable: shell,
                })
                .into_iter()
                .chain(argv.iter().map(Into::into))
                .collect(),
            None => argv.iter().map(Into::into).collect(),
        };
        // The program's environment; later pairs win.
        let mut env: Vec<(String, String)> =
            self.env.iter().chain(opts.env.iter()).cloned().collect();
        // A program on a terminal expects to be told what kind it is.
        if opts.tty && !opts.env.iter().any(|(k, _)| k == "TERM") {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        // Without the wrapper, berth makes the copy itself.
        let copy = if shell && self.wrapper.is_none() {
            let path = env.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| v);
            berth_sandbox::private::resolve(full[0].as_ref(), path.map(|p| p.as_ref()))
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
                .and_then(|exe| berth_sandbox::private::PrivateCopy::of(&exe))
                .map_err(|e| {
                    tracing::warn!(sandbox = %self.name, error = %e, "the shell runs dumpable: no private copy");
                })
                .ok()
        } else {
            None
        };
        let mut cmd = match &copy {
            Some(c) => {
                let mut cmd = Command::new(c.path());
                cmd.arg0(&full[0]);
                cmd
            }
            None => Command::new(&full[0]),
        };
        cmd.args(&full[1..]).env_clear().current_dir(&cwd);
        if self.wrapper.is_some() {
            // The wrapper runs unconfined until it execs: it gets the
            // program's environment in one variable, applied only at that
            // exec (see `berth_sandbox::exec::ENV_CARRIER`).
            let carried = serde_json::to_string(&env)
                .map_err(|e| Error::InvalidInput(format!("sandbox environment: {e}")))?;
            cmd.env(berth_sandbox::exec::ENV_CARRIER, carried);
        } else {
            cmd.envs(env);
        }
        let pty = if opts.tty {
            let pty = crate::local_pty::Pty::open(opts.tty_size.unwrap_or_default())
                .map_err(|e| Error::stream("opening a terminal (openpty)", e))?;
            let slave = |what| {
                pty.slave
                    .try_clone()
                    .map(Stdio::from)
                    .map_err(|e| Error::stream(what, e))
            };
            cmd.stdin(slave("giving the terminal to stdin")?)
                .stdout(slave("giving the terminal to stdout")?)
                .stderr(slave("giving the terminal to stderr")?);
            Some(pty)
        } else {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        };
        let tty = pty.is_some();
        // Without the wrapper (which does it for every program it starts), a
        // session's shell becomes a child subreaper here, so it adopts what
        // its commands detach (`(setsid sleep 1000 &)`) and the tree kill
        // finds it below the shell; an exec keeps the flag.
        let subreaper = shell && self.wrapper.is_none() && !tty;
        // SAFETY: setsid, prctl and the TIOCSCTTY ioctl are async-signal-safe
        // and touch no memory of the parent; setsid makes the child a session
        // leader so the engine can find its whole tree, and on a terminal that
        // terminal becomes the session's controlling one.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if subreaper && libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if tty {
                    crate::local_pty::Pty::make_controlling()?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound => SpawnFailure::NotFound,
                std::io::ErrorKind::PermissionDenied => SpawnFailure::Permission,
                _ => SpawnFailure::Other,
            };
            Error::Spawn {
                kind,
                program: full[0].to_string_lossy().into_owned(),
                detail: e.to_string(),
            }
        })?;
        // A large output moves through the pipe in fewer, larger pieces: with
        // the default 64 KiB the writer stalls and berth wakes every 64 KiB.
        // Best effort: an ordinary user's pipes may be held to less.
        if let Some(out) = child.stdout.as_ref() {
            let _ = nix::fcntl::fcntl(out, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        }
        // The child holds the slave now; the parent keeps only the master.
        let pty = match pty {
            Some(p) => {
                drop(p.slave);
                Some(
                    crate::local_pty::Master::new(p.master)
                        .map_err(|e| Error::stream("watching the terminal", e))?,
                )
            }
            None => None,
        };
        drop(cmd);
        let mut child = child;
        let (pipes, stdout_fd) = match &pty {
            // On a terminal stderr is merged into stdout: there is no third pipe.
            Some(m) => (
                Pipes {
                    stdin: Some(m.writer()),
                    stdout: Some(m.reader()),
                    stderr: None,
                },
                None,
            ),
            None => {
                use std::os::fd::AsRawFd;
                // tokio registers child pipes with its reactor and makes them non-blocking.
                let fd = child.stdout.as_ref().map(|s| s.as_raw_fd());
                let pipes = Pipes {
                    stdin: child.stdin.take().map(|s| Box::pin(s) as BoxWrite),
                    stdout: child.stdout.take().map(|s| Box::pin(s) as BoxRead),
                    stderr: child.stderr.take().map(|s| Box::pin(s) as BoxRead),
                };
                (pipes, fd)
            }
        };
        Ok(Box::new(LocalProcess {
            child,
            cgroups: self.cgroups.clone(),
            pty,
            pipes,
            stdout_fd,
        }))
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let p = self.resolve(path);
        let f = match self.confine(path, &p)? {
            Some((root, rel)) => crate::local_files::open_read(&root, &rel),
            None => {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&p)
                    .and_then(|f| crate::local_files::check_regular(&f).map(|()| f))
            }
        }
        .map_err(|e| self.file_error("opening", path, &p, e))?;
        let mut buf = Vec::new();
        tokio::fs::File::from_std(f)
            .take(limit)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| Error::io("reading", &p, e))?;
        Ok(buf)
    }

    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let p = self.resolve(path);
        let f = match self.confine(path, &p)? {
            Some((root, rel)) => crate::local_files::open_write(&root, &rel, mode),
            None => {
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| Error::io("creating directory", parent, e))?;
                }
                use std::os::unix::fs::OpenOptionsExt;
                // Non-blocking, and truncated only once known to be a regular file.
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&p)
                    .and_then(|f| {
                        crate::local_files::check_regular(&f)?;
                        f.set_len(0)?;
                        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
                        Ok(f)
                    })
            }
        }
        .map_err(|e| self.file_error("writing", path, &p, e))?;
        let mut f = tokio::fs::File::from_std(f);
        f.write_all(data)
            .await
            .map_err(|e| Error::io("writing", &p, e))?;
        f.flush().await.map_err(|e| Error::io("writing", &p, e))
    }

    async fn alive(&self) -> Result<bool> {
        Ok(self.dir.join("work").is_dir())
    }

    async fn destroy(&self) -> Result<()> {
        remove_tree(&self.dir).await
    }
}

/// Warn, once per sandbox in this process, that its memory bound cannot be
/// applied: the sandbox runs, unbounded, as the pids bound's fallback does for
/// an ordinary user.
fn warn_once(name: &str, why: &str) {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = WARNED
        .lock()
        .map(|mut w| w.insert(name.to_string()))
        .unwrap_or(false);
    if first {
        tracing::warn!(
            sandbox = %name,
            "memory_max_bytes is set for local sandbox `{name}` but is NOT enforced: {why}. \
             The sandbox runs without a memory bound; set `memory_max_bytes = 0` under [limits] to silence this"
        );
    }
}

fn gone(name: &str, reason: &str) -> Error {
    Error::sandbox_gone(
        KIND,
        name,
        reason,
        format!("run the command again to recreate it, or `berth sandbox rm {name}`"),
    )
}

struct LocalProcess {
    child: Child,
    /// The sandbox's pids cgroup: removed once this process has ended and
    /// nothing else of the sandbox runs.
    cgroups: Vec<PathBuf>,
    /// The terminal's master, for a process spawned with `tty`.
    pty: Option<crate::local_pty::Master>,
    /// Its stdio: the child's pipes, or the terminal's writer and reader.
    pipes: Pipes,
    /// The stdout pipe's descriptor, which tokio has made non-blocking (none
    /// on a terminal).
    stdout_fd: Option<std::os::fd::RawFd>,
}

#[async_trait]
impl Process for LocalProcess {
    fn pipes(&mut self) -> &mut Pipes {
        &mut self.pipes
    }

    async fn resize(&mut self, size: TermSize) -> Result<()> {
        match &self.pty {
            Some(m) => crate::local_pty::resize(m.fd(), size)
                .map_err(|e| Error::stream("resizing the terminal", e)),
            None => Err(Error::Unsupported(
                "resizing a process that has no terminal (spawn it with `tty`)".into(),
            )),
        }
    }

    fn stdout_fd(&self) -> Option<std::os::fd::RawFd> {
        // Only while the reader that owns it has not been handed out.
        self.pipes.stdout.as_ref().and(self.stdout_fd)
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        let st = self
            .child
            .wait()
            .await
            .map_err(|e| Error::stream("waiting for process", e))?;
        for cg in &self.cgroups {
            berth_sandbox::cgroup::remove_if_empty(cg);
        }
        Ok(ExitStatus {
            code: st.code(),
            signal: st.signal(),
        })
    }

    async fn terminate(&mut self) -> Result<()> {
        match self.child.start_kill() {
            Ok(()) => Ok(()),
            // Already reaped.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            Err(e) => Err(Error::stream("killing process", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    /// The wrapper writes the marker; berth's core reads it back: both must
    /// agree on its prefix.
    #[test]
    fn the_marker_is_written_as_it_is_read() {
        let m = berth_sandbox::mounts::marker_source("box", std::path::Path::new("/s/box"));
        assert!(m.starts_with(berth_core::identity::MARKER_PREFIX), "{m}");
        assert_eq!(
            berth_sandbox::mounts::MARKER_PREFIX,
            berth_core::identity::MARKER_PREFIX
        );
    }

    /// Many calls that make one new sandbox at once all get it (a shared
    /// temporary name once failed some with "renaming sandbox.json: No such
    /// file or directory"), and its record is whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_sandbox_made_by_many_calls_at_once() -> Result<(), Box<dyn std::error::Error>> {
        use berth_core::backend::{Backend, SandboxSpec};
        let dir = tempfile::tempdir()?;
        let backend = std::sync::Arc::new(super::LocalBackend::new(dir.path()));
        for round in 0..20 {
            let name = format!("same{round}");
            let calls: Vec<_> = (0..8)
                .map(|_| {
                    let b = backend.clone();
                    let spec = SandboxSpec::named(&name);
                    tokio::spawn(async move { b.provision(&spec).await.map(|_| ()) })
                })
                .collect();
            for c in calls {
                c.await??;
            }
            let record = std::fs::read(backend.dir(&name).join("sandbox.json"))?;
            let parsed: serde_json::Value = serde_json::from_slice(&record)?;
            assert_eq!(parsed["spec"]["name"], name.as_str());
        }
        let left: Vec<_> = std::fs::read_dir(backend.dir("same0"))?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
        Ok(())
    }
}
