//! Processes as `/proc` shows them, for the backends whose processes are
//! berth's own (see [`Sandbox::host_processes`]): read and signalled from
//! berth's process, with nothing spawned.
//!
//! [`Sandbox::host_processes`]: crate::backend::Sandbox::host_processes

use std::path::Path;
use std::str::FromStr;

use nix::sys::signal::Signal;

use crate::error::{Error, Result};

pub(crate) use crate::procfs::{pids, proc_file, stat};

/// Read a small file of a sandbox's (a job's `pid`, `status`) from berth's
/// own process: `rel` resolved beneath `root` by the kernel, so no `..` or
/// symlink the sandbox planted leads out of it; opened non-blocking and read
/// only when it is a regular file, so a FIFO planted in its place cannot hang
/// berth; and no more than 4 KiB. `None` when any of that fails.
pub(crate) fn read_small(root: &Path, rel: &Path) -> Option<String> {
    use std::io::Read;
    let f = open_regular(root, rel)?;
    let mut s = String::new();
    f.take(4096).read_to_string(&mut s).ok()?;
    Some(s)
}

/// Open `rel` beneath `root` read-only and non-blocking, as [`read_small`]
/// does: a regular file or nothing.
pub(crate) fn open_regular(root: &Path, rel: &Path) -> Option<std::fs::File> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let f = std::fs::File::from(nix::fcntl::openat2(&dir, rel, how).ok()?);
    f.metadata().ok()?.file_type().is_file().then_some(f)
}

/// How berth tells a sandbox's processes from the host's before it signals
/// one (see [`SandboxProc`]).
#[derive(Clone, Debug)]
pub enum SandboxProcs {
    /// A kernel-confined sandbox: its processes are in its pids cgroup or
    /// in a mount namespace holding its marker (see [`crate::identity`]).
    Confined(crate::identity::SandboxIdentity),
    /// A sandbox run without kernel restrictions: its processes are this
    /// uid's, unconfined, and may signal every process of this uid
    /// themselves. berth signals one whose environment (or an ancestor's)
    /// holds `BERTH_SANDBOX=<name>` and whose uid is berth's: nothing the
    /// sandbox could not do itself.
    Unconfined { name: String },
    /// None of its processes is berth's to signal.
    Nobody,
}

impl SandboxProcs {
    /// Whether `pid` is one of this sandbox's processes.
    fn holds(&self, pid: i32) -> bool {
        match self {
            SandboxProcs::Confined(id) => id.holds(pid),
            SandboxProcs::Unconfined { name } => {
                use std::os::unix::fs::MetadataExt;
                // SAFETY: geteuid has no preconditions.
                let me = unsafe { libc::geteuid() };
                std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == me)
                    && env_marked(pid, name)
            }
            SandboxProcs::Nobody => false,
        }
    }
}

/// A process berth may signal on behalf of a sandbox, pinned by a pidfd so
/// that the pid cannot be reused by another process between the check and
/// the signal.
///
/// A pid read from a sandbox's files (a job's `pid`, `holder`) is the
/// sandbox's word, and the sandbox may write any number there: `1`, berth's
/// own pid, a process of the host, another user's or another state dir's
/// sandbox of the same name. berth signals it from its own, unconfined
/// process only when the kernel says it is that very sandbox's
/// ([`SandboxProcs`]): in its pids cgroup, or in a mount namespace holding
/// its marker, which names the sandbox and its directory (so its state
/// dir). A sandboxed process can leave neither, and cannot give them to a
/// process outside the sandbox.
pub(crate) struct SandboxProc {
    pid: i32,
    fd: Option<std::os::fd::OwnedFd>,
}

/// How far up the parents an unconfined sandbox's marker is looked for.
const ANCESTRY: usize = 64;

/// Whether `pid`'s environment, or an ancestor's, holds `BERTH_SANDBOX=<name>`.
fn env_marked(pid: i32, name: &str) -> bool {
    let me = std::process::id() as i32;
    let want = format!("{}={name}", crate::identity::SANDBOX_MARKER);
    let mut at = pid;
    for _ in 0..ANCESTRY {
        if at <= 1 || at == me {
            return false;
        }
        if environ_has(at, want.as_bytes()) {
            return true;
        }
        match stat(at) {
            Some(s) => at = s.ppid,
            None => return false,
        }
    }
    false
}

impl SandboxProc {
    /// `pid` if it is a live process of sandbox `sandbox`.
    pub(crate) fn find(pid: i32, sandbox: &SandboxProcs) -> Option<Self> {
        let me = std::process::id() as i32;
        if pid <= 1 || pid == me {
            return None;
        }
        let fd = pidfd_open(pid);
        if !sandbox.holds(pid) {
            return None;
        }
        let p = Self { pid, fd };
        // Still the process that was checked: while the pidfd's process
        // lives, its pid is not given to another.
        p.send(None).then_some(p)
    }

    /// Send `sig` (`None`: only look) to this process alone.
    pub(crate) fn send(&self, sig: Option<Signal>) -> bool {
        let raw = sig.map_or(0, |s| s as i32);
        match &self.fd {
            Some(fd) => {
                use std::os::fd::AsRawFd;
                // SAFETY: pidfd_send_signal with a pidfd we own, a signal
                // number and null info; it reads no memory of ours.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        raw,
                        std::ptr::null::<libc::siginfo_t>(),
                        0u32,
                    )
                };
                r == 0
            }
            None => nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig).is_ok(),
        }
    }

    /// Send `sig` to the process group this process leads. A group's id is
    /// the pid of the process that made it, which is not reused while the
    /// group exists: a group led by a process of the sandbox is the sandbox's.
    pub(crate) fn send_group(&self, sig: Option<Signal>) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(-self.pid), sig).is_ok()
    }
}

fn pidfd_open(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags; on success it returns a new
    // descriptor that we alone own.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    let fd = i32::try_from(r).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Whether `/proc/PID/environ` holds the entry `want` exactly.
fn environ_has(pid: i32, want: &[u8]) -> bool {
    proc_file(&format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == want))
}

/// A signal by the name the scripts use (`TERM`).
pub(crate) fn signal(name: &str) -> Result<Signal> {
    Signal::from_str(&format!("SIG{name}"))
        .map_err(|_| Error::InvalidInput(format!("no signal named {name}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_reads_a_name_with_parentheses() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert_eq!(s.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(s.sid, nix::unistd::getsid(None).unwrap().as_raw());
        assert_ne!(s.state, b'Z');
    }

    #[test]
    fn signal_names_are_the_scripts() {
        assert_eq!(signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(signal("USR2").unwrap(), Signal::SIGUSR2);
        assert!(signal("NOPE").is_err());
    }

    #[test]
    fn pids_holds_this_process() {
        assert!(pids().any(|p| p == std::process::id() as i32));
    }
}
