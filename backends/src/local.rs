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
//! Kernel restrictions (Landlock, seccomp, rlimits) are applied by an exec
//! wrapper: a program that restricts itself and then execs the real argv. It runs
//! in a fresh process image, so none of that setup happens between fork and exec
//! of this multi-threaded process.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::backend::{
    Backend, BoxRead, BoxWrite, ExitStatus, Layout, Process, Provisioned, RemoveOpts, Sandbox,
    SandboxInfo, SandboxSpec, SpawnOpts, check_sandbox_name, now_unix_secs,
};
use berth_core::error::{Error, Result, SpawnFailure};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

const KIND: &str = "local";
/// The PATH every local sandbox process starts with.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// In a wrapper argv, replaced by the sandbox's directory at spawn time.
pub const WRAPPER_SANDBOX_DIR: &str = "{sandbox_dir}";
/// In a wrapper argv, replaced by the sandbox's name at spawn time.
pub const WRAPPER_SANDBOX: &str = "{sandbox}";
/// In a wrapper argv, replaced by `on` or `off`: whether the sandbox's spec asks for network.
pub const WRAPPER_NETWORK: &str = "{network}";

/// The local backend.
pub struct LocalBackend {
    root: PathBuf,
    wrapper: Option<Vec<String>>,
}

impl LocalBackend {
    /// A local backend keeping its sandboxes under `state_dir/sandboxes/local`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            root: state_dir.join("sandboxes").join(KIND),
            wrapper: None,
        }
    }

    /// Run every process through `wrapper` (argv prefix), which applies the kernel
    /// restrictions and then execs the rest of its arguments.
    pub fn with_wrapper(mut self, wrapper: Vec<String>) -> Self {
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
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        check_sandbox_name(&spec.name)?;
        let dir = self.dir(&spec.name);
        let record_path = dir.join("sandbox.json");
        let existed = record_path.exists();
        let mut recreated = None;
        for sub in ["work", "tmp", ".berth"] {
            let p = dir.join(sub);
            if existed && !p.is_dir() {
                recreated = Some(format!(
                    "its `{sub}` directory was missing and was recreated"
                ));
            }
            std::fs::create_dir_all(&p)
                .map_err(|e| Error::io("creating sandbox directory", &p, e))?;
        }
        let record = if existed {
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
            write_atomic(&record_path, &json)?;
        }
        // The sandbox's own network setting reaches the wrapper as `{network}`.
        let network = if record.spec.network { "on" } else { "off" };
        let wrapper = self.wrapper.as_ref().map(|w| {
            w.iter()
                .map(|a| a.replace(WRAPPER_NETWORK, network))
                .collect()
        });
        let sandbox = LocalSandbox::new(spec.name.clone(), dir, record.spec.env.clone(), wrapper);
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
        if let Some(cg) = crate::local_cgroup::dir_for(name, &dir)
            && let Err(e) = crate::local_cgroup::remove(&cg)
        {
            tracing::warn!(sandbox = name, cgroup = %cg.display(), error = %e, "could not remove the sandbox's pids cgroup");
        }
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io("removing sandbox", &dir, e))
    }
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(|e| Error::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("renaming", path, e))
}

/// A local sandbox.
pub struct LocalSandbox {
    name: String,
    dir: PathBuf,
    /// `dir` made absolute once, for confining berth's own file access.
    root: PathBuf,
    layout: Layout,
    env: Vec<(String, String)>,
    wrapper: Option<Vec<String>>,
}

impl LocalSandbox {
    fn new(
        name: String,
        dir: PathBuf,
        spec_env: std::collections::BTreeMap<String, String>,
        wrapper: Option<Vec<String>>,
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
        for (k, v) in spec_env {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        Self {
            name,
            root: std::path::absolute(&dir).unwrap_or_else(|_| dir.clone()),
            dir,
            layout,
            env,
            wrapper,
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
        match crate::local_files::relative_under(&self.root, &abs) {
            Some(rel) => Ok(Some((self.root.clone(), rel))),
            None if self.wrapper.is_none() => Ok(None),
            None => Err(Error::InvalidInput(format!(
                "{asked} is outside sandbox `{}`: berth's file access reaches only the sandbox's directory ({}). \
                 Read or write it with a command instead, which runs under the sandbox's restrictions",
                self.name, self.layout.workdir
            ))),
        }
    }

    fn file_error(&self, what: &'static str, asked: &str, p: &Path, e: std::io::Error) -> Error {
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
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            Path::new(&self.layout.workdir).join(p)
        }
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        KIND
    }

    fn layout(&self) -> &Layout {
        &self.layout
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
        // The wrapper may name the sandbox with `{sandbox}` and `{sandbox_dir}`.
        let full: Vec<String> = match &self.wrapper {
            Some(w) => w
                .iter()
                .map(|a| {
                    a.replace(WRAPPER_SANDBOX_DIR, &self.dir.display().to_string())
                        .replace(WRAPPER_SANDBOX, &self.name)
                })
                .chain(argv.iter().cloned())
                .collect(),
            None => argv.to_vec(),
        };
        let mut cmd = Command::new(&full[0]);
        cmd.args(&full[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent;
        // it makes the child a session leader so the engine can find its whole tree.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
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
                program: full[0].clone(),
                detail: e.to_string(),
            }
        })?;
        Ok(Box::new(LocalProcess { child }))
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let p = self.resolve(path);
        let f = match self.confine(path, &p)? {
            Some((root, rel)) => crate::local_files::open_read(&root, &rel),
            None => std::fs::File::open(&p),
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
                std::fs::File::create(&p).and_then(|f| {
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
        std::fs::remove_dir_all(&self.dir).map_err(|e| Error::io("removing sandbox", &self.dir, e))
    }
}

fn gone(name: &str, reason: &str) -> Error {
    Error::SandboxGone {
        sandbox: name.into(),
        backend: KIND,
        reason: reason.into(),
        hint: format!("run the command again to recreate it, or `berth sandbox rm {name}`"),
    }
}

struct LocalProcess {
    child: Child,
}

#[async_trait]
impl Process for LocalProcess {
    fn take_stdin(&mut self) -> Option<BoxWrite> {
        self.child.stdin.take().map(|s| Box::pin(s) as BoxWrite)
    }

    fn take_stdout(&mut self) -> Option<BoxRead> {
        self.child.stdout.take().map(|s| Box::pin(s) as BoxRead)
    }

    fn take_stderr(&mut self) -> Option<BoxRead> {
        self.child.stderr.take().map(|s| Box::pin(s) as BoxRead)
    }

    fn stdout_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        // tokio registers child pipes with its reactor and makes them non-blocking.
        self.child.stdout.as_ref().map(|s| s.as_raw_fd())
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        let st = self
            .child
            .wait()
            .await
            .map_err(|e| Error::stream("waiting for process", e))?;
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
