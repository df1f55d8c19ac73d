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
use nix::sys::signal::Signal;

use crate::procs::{SandboxProc, SandboxProcs, open_regular, pids, read_small, stat};

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

/// One job's processes: its group (led by `leader`) and, for a terminal job,
/// the terminal's session. Every pid here was read from the sandbox's files
/// and is signalled only once known to be the sandbox's (see
/// [`SandboxProc`]).
struct Job<'a> {
    leader: SandboxProc,
    pty_sid: Option<i32>,
    sandbox: &'a SandboxProcs,
}

impl Job<'_> {
    /// Send `sig` (`None`: only look) to every live process of the terminal's
    /// session that is the sandbox's. True if there was one.
    fn session(&self, sig: Option<Signal>) -> bool {
        let Some(sp) = self.pty_sid else {
            return false;
        };
        let mut any = false;
        for p in pids() {
            if stat(p).is_some_and(|s| s.sid == sp && s.state != b'Z')
                && let Some(proc_) = SandboxProc::find(p, self.sandbox)
            {
                any |= proc_.send(sig);
            }
        }
        any
    }

    /// Send `sig` to the group, or to its leader alone when it has none.
    fn group(&self, sig: Option<Signal>) -> bool {
        self.leader.send_group(sig) || self.leader.send(sig)
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

/// A number from one of a job's files, read as [`read_small`] does.
fn read_num(base: &Path, rel: &str) -> Option<i32> {
    read_small(base, Path::new(rel))?.trim().parse().ok()
}

/// End job `id` of sandbox `sandbox`, whose jobs live under `base`: `sig`,
/// SIGKILL after `grace`, then wait until it is gone and its status is
/// recorded.
pub(super) async fn end(
    base: &Path,
    id: &str,
    sandbox: &SandboxProcs,
    sig: Signal,
    grace: Duration,
) -> Ended {
    let Some(pid) = read_num(base, &format!("{id}/pid")) else {
        return Ended::code(3, format!("{}/{id}: no pid", base.display()));
    };
    let Some(leader) = SandboxProc::find(pid, sandbox) else {
        // Gone already, or a number that names no process of this sandbox
        // (its files are the sandbox's to write): nothing of it to signal.
        return Ended::code(4, "");
    };
    let job = Job {
        leader,
        pty_sid: read_num(base, &format!("{id}/ptysid")),
        sandbox,
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
    if let Some(f) = open_regular(base, Path::new(&format!("{id}/lock"))) {
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

/// Send `sig` to the process whose pid is in the job's file `file` (its
/// stdin's `holder`, its terminal's `resizer`), once known to be the
/// sandbox's. False when there is none.
pub(super) fn signal_one(
    base: &Path,
    id: &str,
    file: &str,
    sandbox: &SandboxProcs,
    sig: Signal,
) -> bool {
    read_num(base, &format!("{id}/{file}"))
        .and_then(|pid| SandboxProc::find(pid, sandbox))
        .is_some_and(|p| p.send(Some(sig)))
}

/// Whether the process whose pid is in the job's file `file` is gone (the
/// job's wrapper stops its stdin's holder when the job ends).
/// A process that has exited but is not yet reaped (a zombie) is gone: its
/// descriptors are closed.
pub(super) fn gone(base: &Path, id: &str, file: &str) -> bool {
    read_num(base, &format!("{id}/{file}")).is_some_and(|pid| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(Errno::ESRCH)
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with(['Z', 'X']))
            })
    })
}

/// What [`script::STATUS`](super::script::STATUS) prints for the jobs `ids`
/// under `base`: one `<id> <state> <status> <size>` line each.
pub(super) fn status(base: &Path, ids: &[String], sandbox: &SandboxProcs) -> String {
    let mut out = String::new();
    for id in ids {
        let d = base.join(id);
        if !d.is_dir() {
            out.push_str(&format!("{id} missing - -\n"));
            continue;
        }
        let size = std::fs::symlink_metadata(d.join("out"))
            .map_or_else(|_| "-".to_string(), |m| m.len().to_string());
        let recorded = || {
            read_small(base, Path::new(&format!("{id}/status")))
                .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
                .filter(|s| !s.is_empty())
        };
        if let Some(st) = recorded() {
            out.push_str(&format!("{id} exited {st} {size}\n"));
            continue;
        }
        // Its command is written, its wrapper not yet started: still being launched.
        if std::fs::symlink_metadata(d.join("wrapper")).is_err() {
            out.push_str(&format!("{id} unlaunched - {size}\n"));
            continue;
        }
        if read_num(base, &format!("{id}/wrapper"))
            .and_then(|w| SandboxProc::find(w, sandbox))
            .is_some()
        {
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
