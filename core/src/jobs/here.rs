//! Jobs seen and ended from berth's own process, for a sandbox whose
//! processes and files are berth's (see
//! [`Sandbox::host_processes`](crate::backend::Sandbox::host_processes)):
//! [`script::STATUS`](super::script::STATUS)'s and
//! [`script::KILL`](super::script::KILL)'s steps, with nothing spawned, so a
//! job that filled its user's process limit (a fork bomb) can still be seen
//! running and ended. A helper's spawn would fail there, and the status
//! script's own `$(stat …)` with it.

use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::procs::{pids, stat};

/// How the script would have ended: its exit code and what it printed.
pub(super) struct Ended {
    pub(super) code: i32,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Ended {
    fn code(code: i32, stderr: impl Into<String>) -> Self {
        Self {
            code,
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }
}

/// One job's processes: its group (led by `pid`) and, for a terminal job, the
/// terminal's session.
struct Job {
    pid: i32,
    pty_sid: Option<i32>,
}

impl Job {
    /// Send `sig` (`None`: only look) to every live process of the terminal's
    /// session. True if there was one.
    fn session(&self, sig: Option<Signal>) -> bool {
        let Some(sp) = self.pty_sid else {
            return false;
        };
        let mut any = false;
        for p in pids() {
            if stat(p).is_some_and(|s| s.sid == sp && s.state != b'Z') {
                any |= kill(Pid::from_raw(p), sig).is_ok();
            }
        }
        any
    }

    /// Send `sig` to the group, or to its leader alone when it has none.
    fn group(&self, sig: Option<Signal>) -> bool {
        kill(Pid::from_raw(-self.pid), sig).is_ok() || kill(Pid::from_raw(self.pid), sig).is_ok()
    }

    fn alive(&self) -> bool {
        self.group(None) || self.session(None)
    }

    /// Whether everything is gone within `ms`. No event tells when the last
    /// process of a group is gone: look every 20 ms.
    async fn gone(&self, ms: u64) -> bool {
        let mut waited = 0;
        while self.alive() {
            if waited >= ms {
                return false;
            }
            waited += 20;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

fn read_num(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// End the job whose directory is `dir`: `sig`, SIGKILL after `grace`, then
/// wait until it is gone and its status is recorded.
pub(super) async fn end(dir: &Path, sig: Signal, grace: Duration) -> Ended {
    let Some(pid) = read_num(&dir.join("pid")) else {
        return Ended::code(3, format!("{}: no pid", dir.display()));
    };
    let job = Job {
        pid,
        pty_sid: read_num(&dir.join("ptysid")),
    };
    let to_session = job.session(Some(sig));
    let to_group = job.group(Some(sig));
    if !(to_session || to_group) {
        return Ended::code(4, "");
    }
    let mut how = "signalled";
    let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    if sig != Signal::SIGKILL && !job.gone(grace_ms).await {
        how = "escalated";
        job.session(Some(Signal::SIGKILL));
        job.group(Some(Signal::SIGKILL));
    }
    if !job.gone(10_000).await {
        return Ended::code(
            5,
            format!("process group {pid} is still there after SIGKILL"),
        );
    }
    // The wrapper records the status as soon as the group leader is reaped,
    // and holds the lock until then.
    if let Ok(f) = std::fs::File::open(dir.join("lock")) {
        let mut f = f;
        for _ in 0..500 {
            match Flock::lock(f, FlockArg::LockSharedNonblock) {
                Ok(_held) => break,
                Err((back, Errno::EWOULDBLOCK | Errno::EINTR)) => {
                    f = back;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => break,
            }
        }
    }
    Ended {
        code: 0,
        stdout: how.into(),
        stderr: String::new(),
    }
}

/// What [`script::STATUS`](super::script::STATUS) prints for the jobs `ids`
/// under `base`: one `<id> <state> <status> <size>` line each.
pub(super) fn status(base: &Path, ids: &[String]) -> String {
    let mut out = String::new();
    for id in ids {
        let d = base.join(id);
        if !d.is_dir() {
            out.push_str(&format!("{id} missing - -\n"));
            continue;
        }
        let size = std::fs::metadata(d.join("out"))
            .map_or_else(|_| "-".to_string(), |m| m.len().to_string());
        let recorded = || {
            std::fs::read_to_string(d.join("status"))
                .ok()
                .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
                .filter(|s| !s.is_empty())
        };
        if let Some(st) = recorded() {
            out.push_str(&format!("{id} exited {st} {size}\n"));
            continue;
        }
        // Its command is written, its wrapper not yet started: still being launched.
        if !d.join("wrapper").exists() {
            out.push_str(&format!("{id} unlaunched - {size}\n"));
            continue;
        }
        if read_num(&d.join("wrapper")).is_some_and(|w| kill(Pid::from_raw(w), None).is_ok()) {
            out.push_str(&format!("{id} running - {size}\n"));
            continue;
        }
        // The wrapper may have written the status just now.
        match recorded() {
            Some(st) => out.push_str(&format!("{id} exited {st} {size}\n")),
            None => out.push_str(&format!("{id} lost - {size}\n")),
        }
    }
    out
}
