//! What the stand-in runs behind the protocol: sandboxes as real local
//! processes, each in its own temporary directory, and their execs with
//! buffered, offset-addressed output.
//!
//! A sandbox is its entrypoint process plus every exec started in it; all of
//! them carry `MODAL_TASK_ID` in their environment, which is how terminating
//! the sandbox finds and kills the whole lot (double-forked children too).
//! The image is recorded but not used: processes run on this machine.

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, watch};

use super::pb::client::GenericResult;
use super::pb::client::generic_result::GenericStatus;

/// The PATH every sandbox process starts with.
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One of a child's output pipes.
type BoxedRead = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

/// How an exec ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

/// One output stream of an exec: everything it wrote, and whether it ended.
#[derive(Default)]
pub struct OutBuf {
    /// All bytes so far; a reader asks for them from an offset.
    pub data: Vec<u8>,
    /// The stream reached end-of-file.
    pub eof: bool,
}

/// Where an exec's stdin stands.
pub struct StdinState {
    /// Bytes accepted so far: the next write must start at or before this offset.
    pub written: u64,
    /// The pipe (or the terminal's master), until eof closes it.
    pub pipe: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
}

/// One exec in a sandbox.
pub struct Exec {
    /// stdout (0) and stderr (1).
    pub out: [Mutex<OutBuf>; 2],
    /// Woken whenever output arrives or a stream ends.
    pub changed: Notify,
    /// The stdin pipe and its offset.
    pub stdin: tokio::sync::Mutex<StdinState>,
    /// The exit, once known.
    pub exit: watch::Receiver<Option<ExitKind>>,
    /// The exec's process group, for killing it.
    pub pgid: Option<i32>,
}

/// A sandbox.
pub struct Sandbox {
    pub id: String,
    pub task_id: String,
    pub app_id: String,
    pub name: Option<String>,
    pub tags: Mutex<BTreeMap<String, String>>,
    pub created_at: f64,
    pub image_id: String,
    pub timeout_secs: u32,
    /// The sandbox's home and default working directory.
    pub dir: tempfile::TempDir,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    /// Its network as asked for: `block_network` and the `network_access`
    /// it was made with. The stand-in records them and shows them back; its
    /// processes run on this machine, held to no network filter.
    pub block_network: bool,
    pub network_access: Option<crate::modal::pb::client::NetworkAccess>,
    /// Set once, when the sandbox ends.
    pub result: watch::Sender<Option<GenericResult>>,
    pub execs: Mutex<HashMap<String, Arc<Exec>>>,
}

impl Sandbox {
    /// The result, if the sandbox has ended.
    pub fn result(&self) -> Option<GenericResult> {
        self.result.borrow().clone()
    }

    /// End the sandbox with `status` (unless it already ended) and kill every
    /// process in it. Returns the result it had before, if any.
    pub fn finish(
        &self,
        status: GenericStatus,
        exitcode: i32,
        exception: &str,
    ) -> Option<GenericResult> {
        let mut before = None;
        self.result.send_modify(|r| {
            if r.is_some() {
                before = r.clone();
            } else {
                *r = Some(GenericResult {
                    status: status as i32,
                    exception: exception.to_string(),
                    exitcode,
                    traceback: String::new(),
                });
            }
        });
        self.kill_all();
        before
    }

    /// SIGKILL every process carrying this sandbox's task id, until none is left.
    pub fn kill_all(&self) {
        let pgids: Vec<i32> = self
            .execs
            .lock()
            .map(|e| e.values().filter_map(|x| x.pgid).collect())
            .unwrap_or_default();
        for pg in pgids {
            // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
            unsafe {
                libc::kill(-pg, libc::SIGKILL);
            }
        }
        let marker = format!("MODAL_TASK_ID={}", self.task_id);
        for _ in 0..20 {
            let pids = pids_with_env(&marker);
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: kill(2) on a pid; no memory is touched.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The base environment of every process in the sandbox.
    fn base_env(&self) -> Vec<(String, String)> {
        let home = self.dir.path().display().to_string();
        let mut env = vec![
            ("PATH".to_string(), SANDBOX_PATH.to_string()),
            ("HOME".to_string(), home),
            ("MODAL_TASK_ID".to_string(), self.task_id.clone()),
            ("MODAL_SANDBOX_ID".to_string(), self.id.clone()),
            ("MODAL_IS_REMOTE".to_string(), "1".to_string()),
        ];
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    fn command(
        &self,
        argv: &[String],
        cwd: Option<&str>,
        extra: &[(String, String)],
    ) -> std::io::Result<Command> {
        let Some(program) = argv.first() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "empty command",
            ));
        };
        let mut cmd = Command::new(program);
        cmd.args(&argv[1..]);
        cmd.env_clear();
        cmd.envs(self.base_env());
        cmd.envs(extra.iter().cloned());
        let cwd = cwd
            .map(str::to_string)
            .or_else(|| self.workdir.clone())
            .unwrap_or_else(|| self.dir.path().display().to_string());
        cmd.current_dir(cwd);
        cmd.kill_on_drop(false);
        Ok(cmd)
    }

    /// Start the entrypoint; when it exits the sandbox ends with its code.
    pub fn start_entrypoint(self: &Arc<Self>, argv: &[String]) -> std::io::Result<()> {
        let mut cmd = self.command(argv, None, &[])?;
        cmd.process_group(0);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn()?;
        let sb = self.clone();
        tokio::spawn(async move {
            let st = child.wait().await;
            let code = st.ok().and_then(|s| s.code()).unwrap_or(137);
            let status = if code == 0 {
                GenericStatus::Success
            } else {
                GenericStatus::Failure
            };
            sb.finish(status, code, "");
        });
        if self.timeout_secs > 0 {
            let sb = Arc::downgrade(self);
            let t = Duration::from_secs(u64::from(self.timeout_secs));
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                if let Some(sb) = sb.upgrade() {
                    sb.finish(GenericStatus::Timeout, 0, "sandbox reached its timeout");
                }
            });
        }
        Ok(())
    }

    /// Start an exec with piped stdio; `merge` sends stderr into stdout.
    pub fn start_exec(
        &self,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
        pipe_out: bool,
        pipe_err: bool,
        merge: bool,
    ) -> std::io::Result<Arc<Exec>> {
        let mut cmd = self.command(argv, cwd, env)?;
        cmd.process_group(0);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child: Child = cmd.spawn()?;
        Ok(self.track(child, None, pipe_out, pipe_err, merge))
    }

    /// Start an exec on a terminal of its own (`pty_info`): stdin, stdout and
    /// stderr are the terminal, which is its controlling one (a new session),
    /// and everything it prints is stdout.
    pub fn start_exec_pty(
        &self,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
        size: (u16, u16),
        term: &str,
    ) -> std::io::Result<Arc<Exec>> {
        let mut env = env.to_vec();
        if !term.is_empty() {
            env.push(("TERM".into(), term.into()));
        }
        let mut cmd = self.command(argv, cwd, &env)?;
        let (master, slave) =
            crate::pty::open_pty(size.0, size.1).map_err(std::io::Error::other)?;
        cmd.stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid and ioctl are async-signal-safe; the child leads a
        // session of its own whose controlling terminal is the new one.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child: Child = cmd.spawn()?;
        let master = std::fs::File::from(master);
        let reader = master.try_clone()?;
        Ok(self.track(
            child,
            Some((reader, Box::new(tokio::fs::File::from_std(master)))),
            true,
            false,
            false,
        ))
    }

    /// Follow a started child: its output into the exec's buffers, its exit
    /// into the exec's state. `pty`: the terminal's master to read (output)
    /// and write (input) instead of the child's pipes.
    #[allow(clippy::type_complexity)]
    fn track(
        &self,
        mut child: Child,
        pty: Option<(std::fs::File, Box<dyn tokio::io::AsyncWrite + Send + Unpin>)>,
        pipe_out: bool,
        pipe_err: bool,
        merge: bool,
    ) -> Arc<Exec> {
        let (pty_out, pty_in) = match pty {
            Some((r, w)) => (Some(r), Some(w)),
            None => (None, None),
        };
        let (tx, rx) = watch::channel(None);
        let exec = Arc::new(Exec {
            out: [Mutex::new(OutBuf::default()), Mutex::new(OutBuf::default())],
            changed: Notify::new(),
            stdin: tokio::sync::Mutex::new(StdinState {
                written: 0,
                pipe: pty_in.or_else(|| {
                    child
                        .stdin
                        .take()
                        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>)
                }),
            }),
            exit: rx,
            pgid: child.id().and_then(|p| i32::try_from(p).ok()),
        });
        let streams: [(Option<BoxedRead>, usize, bool); 2] = [
            (child.stdout.take().map(|s| Box::new(s) as _), 0, pipe_out),
            (
                child.stderr.take().map(|s| Box::new(s) as _),
                if merge { 0 } else { 1 },
                pipe_err || merge,
            ),
        ];
        let mut readers = Vec::new();
        if let Some(mut m) = pty_out {
            // A terminal's master reads EIO once nothing holds the terminal.
            let e = exec.clone();
            readers.push(tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut buf = vec![0u8; 32 * 1024];
                while let Ok(n) = m.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut o) = e.out[0].lock() {
                        o.data.extend_from_slice(&buf[..n]);
                    }
                    e.changed.notify_waiters();
                }
            }));
        }
        for (stream, fd, keep) in streams {
            let Some(mut stream) = stream else { continue };
            let e = exec.clone();
            readers.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if keep && let Ok(mut o) = e.out[fd].lock() {
                                o.data.extend_from_slice(&buf[..n]);
                            }
                            e.changed.notify_waiters();
                        }
                    }
                }
            }));
        }
        let e = exec.clone();
        tokio::spawn(async move {
            let st = child.wait().await;
            // Output first: a reader that saw the exit must also see all output.
            for r in readers {
                let _ = r.await;
            }
            for o in &e.out {
                if let Ok(mut o) = o.lock() {
                    o.eof = true;
                }
            }
            e.changed.notify_waiters();
            use std::os::unix::process::ExitStatusExt;
            let kind = match st {
                Ok(s) => match (s.code(), s.signal()) {
                    (Some(c), _) => ExitKind::Code(c),
                    (None, Some(sig)) => ExitKind::Signal(sig),
                    _ => ExitKind::Code(-1),
                },
                Err(_) => ExitKind::Code(-1),
            };
            let _ = tx.send(Some(kind));
        });
        exec
    }
}

/// Write to an exec's stdin at `offset`: bytes before what was already
/// accepted are duplicates of a retried write and skipped; a gap is refused.
pub async fn write_stdin(exec: &Exec, offset: u64, data: &[u8], eof: bool) -> Result<(), String> {
    let mut st = exec.stdin.lock().await;
    if offset > st.written {
        return Err(format!(
            "stdin write at offset {offset} leaves a gap: {} bytes were written so far",
            st.written
        ));
    }
    let skip = usize::try_from(st.written - offset).unwrap_or(usize::MAX);
    if skip < data.len() {
        let fresh = &data[skip..];
        if let Some(p) = st.pipe.as_mut() {
            // A process that stopped reading loses its input, as with a pipe.
            if p.write_all(fresh).await.is_err() {
                st.pipe = None;
            }
        }
        st.written += fresh.len() as u64;
    }
    if eof {
        st.pipe = None;
    }
    Ok(())
}

/// The pids whose environment holds `marker` (as `KEY=VALUE`).
fn pids_with_env(marker: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}
