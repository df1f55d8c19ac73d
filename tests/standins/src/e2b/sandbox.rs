//! The stand-in's sandboxes and the real processes behind them.
//!
//! Flow at a glance:
//! - A [`Sandbox`] is a temp dir (its user's home) plus the processes started
//!   in it, each a real child of this server in a session of its own.
//! - A process's stdout and stderr are read in chunks of at most 32 KiB and
//!   fanned out to every subscriber (a `Start` stream, any `Connect`), with
//!   back-pressure; its exit becomes the `end` event.
//! - A process started with a `pty` runs on a terminal of its own (openpty):
//!   the terminal's output is its `pty` data, input goes to the terminal,
//!   and `Update` resizes it.
//! - Killing a sandbox kills every process that carries its id in its
//!   environment or lives under its directory, double-forked ones included,
//!   then removes the directory.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

/// One output chunk's largest size, as envd sends it.
pub const CHUNK: usize = 32 * 1024;

/// An event of one process, as the process service streams it.
#[derive(Clone, Debug)]
pub enum ProcEvent {
    /// Bytes on stdout.
    Stdout(Vec<u8>),
    /// Bytes on stderr.
    Stderr(Vec<u8>),
    /// Bytes on its terminal.
    Pty(Vec<u8>),
    /// The process ended.
    End(EndInfo),
}

/// How a process ended, in envd's terms.
#[derive(Clone, Debug)]
pub struct EndInfo {
    /// The exit code, -1 when a signal killed it.
    pub exit_code: i32,
    /// It exited on its own (not by a signal).
    pub exited: bool,
    /// Go's wording: `exit status N` or `signal: killed`.
    pub status: String,
}

/// What a process was started with.
#[derive(Clone, Debug, Default)]
pub struct ProcConfig {
    /// The program.
    pub cmd: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// A running (or just finished) process.
pub struct Proc {
    /// Its pid on this host.
    pub pid: u32,
    /// The tag the client gave it.
    pub tag: Option<String>,
    /// How it was started.
    pub config: ProcConfig,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    /// The terminal's master, for a process started with a `pty`.
    pty: Mutex<Option<std::fs::File>>,
    subscribers: Mutex<Vec<mpsc::Sender<ProcEvent>>>,
    end: Mutex<Option<EndInfo>>,
}

impl Proc {
    /// Subscribe to its future events. Returns the end when it already ended.
    pub fn subscribe(&self) -> Result<mpsc::Receiver<ProcEvent>, EndInfo> {
        let (tx, rx) = mpsc::channel(64);
        let mut subs = lock(&self.subscribers);
        if let Some(end) = lock(&self.end).clone() {
            return Err(end);
        }
        subs.push(tx);
        Ok(rx)
    }

    /// Write to its stdin, or type on its terminal. `Err` names why not.
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), String> {
        let terminal = lock(&self.pty).as_ref().map(|m| m.try_clone());
        if let Some(m) = terminal {
            // A program that does not read fills the terminal's input queue,
            // and the write then blocks: not on the server's own threads.
            let mut m = m.map_err(|e| e.to_string())?;
            let data = data.to_vec();
            return tokio::task::spawn_blocking(move || {
                use std::io::Write;
                m.write_all(&data)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string());
        }
        let mut g = self.stdin.lock().await;
        let Some(s) = g.as_mut() else {
            return Err("stdin is closed or was not enabled".into());
        };
        s.write_all(data).await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())
    }

    /// Resize its terminal. `Err` names why not.
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let g = lock(&self.pty);
        let Some(m) = g.as_ref() else {
            return Err("the process has no pty".into());
        };
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize from the pointer; the fd is ours.
        if unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        Ok(())
    }

    /// Close its stdin.
    pub async fn close_stdin(&self) {
        self.stdin.lock().await.take();
    }

    /// Send a signal to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with a pid we started; a stale pid at worst gets ESRCH.
        unsafe {
            libc::kill(self.pid as libc::pid_t, sig);
        }
    }

    /// Whether it ended.
    pub fn ended(&self) -> bool {
        lock(&self.end).is_some()
    }
}

/// running or paused, as the API says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Running.
    Running,
    /// Paused: processes stopped, envd unreachable until connect.
    Paused,
}

/// One sandbox.
pub struct Sandbox {
    /// The sandbox id.
    pub id: String,
    /// The template it was created from.
    pub template_id: String,
    /// The user's labels.
    pub metadata: BTreeMap<String, String>,
    /// Environment of every process.
    pub env_vars: BTreeMap<String, String>,
    /// The envd access token.
    pub access_token: String,
    /// When it started (unix seconds).
    pub started_unix: i64,
    /// When it will be killed.
    pub end_at: Mutex<Instant>,
    /// Its end as unix seconds, for the API.
    pub end_unix: Mutex<i64>,
    /// running or paused.
    pub state: Mutex<State>,
    /// The home directory; removed with the sandbox.
    pub dir: tempfile::TempDir,
    /// Processes by pid.
    pub procs: Mutex<HashMap<u32, Arc<Proc>>>,
    /// Flips to true when the sandbox is killed: its streams are cut, as when
    /// a real sandbox's VM goes away.
    pub killed: tokio::sync::watch::Sender<bool>,
    /// Whether it may reach the internet at all.
    pub allow_internet_access: Mutex<bool>,
    /// Its egress filter (`allowOut`, `denyOut`) as last set. The stand-in
    /// records it and shows it back; it runs processes on this machine and
    /// holds them to no network filter.
    pub network: Mutex<Option<serde_json::Value>>,
}

impl Sandbox {
    /// The user's home: every relative path resolves here.
    pub fn home(&self) -> &Path {
        self.dir.path()
    }

    /// Resolve a client path: relative ones against the home.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else if let Some(rest) = path.strip_prefix("~/") {
            self.home().join(rest)
        } else {
            self.home().join(p)
        }
    }

    /// Set the timeout: killed `secs` from now.
    pub fn set_timeout(&self, secs: u64) {
        *lock(&self.end_at) = Instant::now() + Duration::from_secs(secs);
        *lock(&self.end_unix) = now_unix() + secs as i64;
    }

    /// Find a process by pid or tag.
    pub fn find(&self, pid: Option<u32>, tag: Option<&str>) -> Option<Arc<Proc>> {
        let procs = lock(&self.procs);
        if let Some(pid) = pid {
            return procs.get(&pid).cloned();
        }
        let tag = tag?;
        procs
            .values()
            .find(|p| p.tag.as_deref() == Some(tag))
            .cloned()
    }

    /// Start a process, subscribed from its first byte. The error is envd's
    /// message for a failed start.
    pub fn start(
        self: &Arc<Self>,
        config: ProcConfig,
        tag: Option<String>,
        stdin: bool,
        pty: Option<(u16, u16)>,
    ) -> Result<(Arc<Proc>, mpsc::Receiver<ProcEvent>), String> {
        let cwd = match &config.cwd {
            Some(c) if !c.is_empty() => self.resolve(c),
            _ => self.home().to_path_buf(),
        };
        if !cwd.is_dir() {
            return Err(format!("cwd '{}' does not exist", cwd.display()));
        }
        let mut cmd = tokio::process::Command::new(&config.cmd);
        cmd.args(&config.args)
            .current_dir(&cwd)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("HOME", self.home())
            .env("USER", "user")
            .env("LANG", "C.UTF-8")
            .env("E2B_SANDBOX", "true")
            .env("E2B_SANDBOX_ID", &self.id)
            .envs(&self.env_vars)
            .envs(&config.envs)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        let master = match pty {
            Some((cols, rows)) => {
                let (master, slave) = crate::pty::open_pty(cols, rows)?;
                let io = |f: &std::os::fd::OwnedFd| {
                    f.try_clone()
                        .map(Stdio::from)
                        .map_err(|e| format!("error starting process '{}': {e}", config.cmd))
                };
                cmd.stdin(io(&slave)?)
                    .stdout(io(&slave)?)
                    .stderr(io(&slave)?);
                Some(std::fs::File::from(master))
            }
            None => None,
        };
        let on_tty = master.is_some();
        // SAFETY: setsid and ioctl are async-signal-safe; the child gets a
        // session of its own, as a process under envd does, so a signal to the
        // group stays in it; on a pty, that terminal becomes its controlling one.
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                if on_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("error starting process '{}': {e}", config.cmd))?;
        let pid = child.id().unwrap_or(0);
        let (tx, rx) = mpsc::channel(64);
        let proc = Arc::new(Proc {
            pid,
            tag,
            config,
            stdin: tokio::sync::Mutex::new(child.stdin.take()),
            pty: Mutex::new(master),
            subscribers: Mutex::new(vec![tx]),
            end: Mutex::new(None),
        });
        lock(&self.procs).insert(pid, proc.clone());
        tokio::spawn(pump(self.clone(), proc.clone(), child));
        Ok((proc, rx))
    }

    /// Stop (SIGSTOP) or continue (SIGCONT) everything in the sandbox.
    pub fn freeze(&self, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        for pid in self.members() {
            // SAFETY: kill(2) on a pid found a moment ago; ESRCH at worst.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// Kill everything in the sandbox, until nothing is left or 5 s pass.
    pub fn kill_all(&self) {
        self.killed.send_replace(true);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.members();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                // SAFETY: as above. CONT first so a paused process can die.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGCONT);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every live process of this sandbox: it carries the sandbox's id in its
    /// environment, or its cwd is under the sandbox's home.
    fn members(&self) -> Vec<libc::pid_t> {
        let marker = format!("E2B_SANDBOX_ID={}", self.id);
        let home = self.home().to_path_buf();
        let me = std::process::id() as libc::pid_t;
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in rd.flatten() {
            let Some(pid) = e
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            if pid == me {
                continue;
            }
            // A zombie has no environ; it needs no signal either.
            let by_env = std::fs::read(e.path().join("environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()))
                .unwrap_or(false);
            let by_cwd = std::fs::read_link(e.path().join("cwd"))
                .map(|c| c.starts_with(&home))
                .unwrap_or(false);
            if by_env || by_cwd {
                out.push(pid);
            }
        }
        out
    }
}

/// Read a process's output and exit, and hand them to its subscribers.
async fn pump(sb: Arc<Sandbox>, proc: Arc<Proc>, mut child: Child) {
    let (tx, mut rx) = mpsc::channel::<ProcEvent>(16);
    let terminal = lock(&proc.pty).as_ref().and_then(|m| m.try_clone().ok());
    let readers = [
        child
            .stdout
            .take()
            .map(|o| tokio::spawn(read_stream(o, tx.clone(), true))),
        child
            .stderr
            .take()
            .map(|e| tokio::spawn(read_stream(e, tx.clone(), false))),
        terminal.map(|m| {
            let tx = tx.clone();
            tokio::task::spawn_blocking(move || read_terminal(m, tx))
        }),
    ];
    drop(tx);
    while let Some(ev) = rx.recv().await {
        fan_out(&proc, ev).await;
    }
    for r in readers.into_iter().flatten() {
        let _ = r.await;
    }
    let end = match child.wait().await {
        Ok(st) => end_info(st),
        Err(e) => EndInfo {
            exit_code: -1,
            exited: false,
            status: format!("wait: {e}"),
        },
    };
    proc.stdin.lock().await.take();
    lock(&proc.pty).take();
    // Record the end under the subscriber lock, so a late subscriber either
    // is told of it or gets the event.
    let subs = {
        let mut subs = lock(&proc.subscribers);
        *lock(&proc.end) = Some(end.clone());
        std::mem::take(&mut *subs)
    };
    for s in subs {
        let _ = s.send(ProcEvent::End(end.clone())).await;
    }
    // envd forgets a process soon after it ends; Connect can still see the end briefly.
    tokio::time::sleep(Duration::from_secs(10)).await;
    lock(&sb.procs).remove(&proc.pid);
}

async fn fan_out(proc: &Proc, ev: ProcEvent) {
    let subs: Vec<_> = lock(&proc.subscribers).clone();
    let mut gone = Vec::new();
    for (i, s) in subs.iter().enumerate() {
        if s.send(ev.clone()).await.is_err() {
            gone.push(i);
        }
    }
    if !gone.is_empty() {
        lock(&proc.subscribers).retain(|s| !s.is_closed());
    }
}

async fn read_stream(
    mut r: impl tokio::io::AsyncRead + Unpin,
    tx: mpsc::Sender<ProcEvent>,
    stdout: bool,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let data = buf[..n].to_vec();
                let ev = if stdout {
                    ProcEvent::Stdout(data)
                } else {
                    ProcEvent::Stderr(data)
                };
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Read a terminal's output until its program (and everything holding the
/// terminal) is gone: the master then reads EIO.
fn read_terminal(mut m: std::fs::File, tx: mpsc::Sender<ProcEvent>) {
    use std::io::Read;
    let mut buf = vec![0u8; CHUNK];
    loop {
        match m.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.blocking_send(ProcEvent::Pty(buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
}

fn end_info(st: std::process::ExitStatus) -> EndInfo {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => EndInfo {
            exit_code: c,
            exited: true,
            status: format!("exit status {c}"),
        },
        (None, Some(s)) => EndInfo {
            exit_code: -1,
            exited: false,
            status: format!("signal: {}", signal_name(s)),
        },
        _ => EndInfo {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
        },
    }
}

/// Go's names for the common signals, as `ProcessState.String()` prints them.
fn signal_name(s: i32) -> String {
    match s {
        libc::SIGKILL => "killed".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGHUP => "hangup".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGABRT => "aborted".into(),
        other => format!("signal {other}"),
    }
}

/// Seconds since the epoch.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Lock a mutex, living with poisoning (a panicked handler must not wedge the server).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
