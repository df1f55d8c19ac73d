//! Processes as `/proc` shows them, for the backends whose processes are
//! berth's own (see [`Sandbox::host_processes`]): read and signalled from
//! berth's process, with nothing spawned.
//!
//! [`Sandbox::host_processes`]: crate::backend::Sandbox::host_processes

use std::path::Path;
use std::str::FromStr;

use nix::sys::signal::Signal;

use crate::error::{Error, Result};

/// The fields of `/proc/PID/stat` the rules read.
pub(crate) struct Stat {
    pub(crate) state: u8,
    pub(crate) ppid: i32,
    pub(crate) sid: i32,
    /// Start time since boot, in clock ticks.
    pub(crate) start: u64,
}

pub(crate) fn stat(pid: i32) -> Option<Stat> {
    let raw = proc_file(&format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold anything, parentheses too: the
    // fields start after the last `)`.
    let at = raw.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(raw.get(at + 1..)?).ok()?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some(Stat {
        state: *f.first()?.as_bytes().first()?,
        ppid: f.get(1)?.parse().ok()?,
        sid: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// A file of `/proc` whole. Its size reads as 0, so `fs::read` would stat
/// it for nothing and then grow its buffer from 32 bytes, a read per
/// doubling: this starts at a page, which holds a `stat` or `cgroup` whole
/// and most environments, so it takes two reads (the last one finds the
/// end). The server reads several per connection (the peer check).
pub(crate) fn proc_file(path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(4096);
    std::fs::File::open(path)?.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Every pid in `/proc` now.
pub(crate) fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

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

/// A process berth may signal on behalf of sandbox `sandbox`, pinned by a
/// pidfd so that the pid cannot be reused by another process between the
/// check and the signal.
///
/// A pid read from a sandbox's files (a job's `pid`, `holder`) is the
/// sandbox's word, and the sandbox may write any number there: `1`, berth's
/// own pid, a process of the host. berth signals it from its own,
/// unconfined process only when it is the sandbox's: its environment holds
/// `BERTH_SANDBOX=<sandbox>`, or one of its ancestors' does. Neither can be
/// forged for a process outside the sandbox: a sandboxed process cannot set
/// another's environment, and every child of a sandboxed process is
/// sandboxed, so a host process has no sandboxed ancestor.
pub(crate) struct SandboxProc {
    pid: i32,
    fd: Option<std::os::fd::OwnedFd>,
}

/// How far up the parents [`SandboxProc::find`] looks for the marker.
const ANCESTRY: usize = 64;

impl SandboxProc {
    /// `pid` if it is a live process of sandbox `sandbox`.
    pub(crate) fn find(pid: i32, sandbox: &str) -> Option<Self> {
        let me = std::process::id() as i32;
        if pid <= 1 || pid == me {
            return None;
        }
        let fd = pidfd_open(pid);
        let want = format!("{}={sandbox}", crate::backend::SANDBOX_MARKER);
        let mut at = pid;
        let mut marked = false;
        for _ in 0..ANCESTRY {
            if at <= 1 || at == me {
                break;
            }
            if environ_has(at, want.as_bytes()) {
                marked = true;
                break;
            }
            match stat(at) {
                Some(s) => at = s.ppid,
                None => break,
            }
        }
        if !marked {
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

/// The sandbox a process belongs to, if any: a berth sandbox's pids cgroup
/// it is in, which a sandboxed process cannot leave, or the value of the
/// marker berth puts in the environment of every sandboxed program (in its
/// own or an ancestor's environment). berth's server refuses such a peer:
/// nothing in a sandbox may call berth (answer its own approval, say).
///
/// The cgroup is read first: one small read that decides where cgroups are
/// delegated. The ancestry is walked after it, and stops at a process whose
/// own ancestry an earlier call found clean ([`CLEAN`]): a CLI's
/// calls come from one shell, so most walks read the caller and its parent
/// and stop there.
pub fn sandbox_of(pid: i32) -> Option<String> {
    if let Some(name) = sandbox_cgroup(pid) {
        return Some(name);
    }
    let me = std::process::id() as i32;
    let marker = format!("{}=", crate::backend::SANDBOX_MARKER);
    let mut walked = Vec::new();
    let mut at = pid;
    // Whether the walk reached its top (init, this server, or a process
    // known clean) rather than losing its way (a parent that exited as it
    // was read, whose children another process adopts): only then are the
    // processes walked known clean.
    let mut whole = false;
    for _ in 0..ANCESTRY {
        if at <= 1 || at == me {
            whole = true;
            break;
        }
        let Some(s) = stat(at) else { break };
        if CLEAN.lock().is_ok_and(|c| c.contains(&(at, s.start))) {
            whole = true;
            break;
        }
        if let Ok(env) = proc_file(&format!("/proc/{at}/environ"))
            && let Some(name) = env
                .split(|b| *b == 0)
                .find_map(|e| e.strip_prefix(marker.as_bytes()))
        {
            return Some(String::from_utf8_lossy(name).into_owned());
        }
        walked.push((at, s.start));
        at = s.ppid;
    }
    if whole && let Ok(mut clean) = CLEAN.lock() {
        if clean.len() + walked.len() > CLEAN_KEPT {
            clean.clear();
        }
        clean.extend(walked);
    }
    None
}

/// How many clean processes [`CLEAN`] keeps before it starts over.
const CLEAN_KEPT: usize = 4096;

/// Processes, by pid and start time (together never reused), whose own
/// environment and every ancestor's were read without the marker. That stays
/// true: a process that is not a sandbox's does not become one (a sandbox's
/// processes are new ones berth starts), and one whose parent exits is
/// adopted by an ancestor (init, or a subreaper above it), already read.
static CLEAN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<(i32, u64)>>> =
    std::sync::LazyLock::new(Default::default);

/// The sandbox whose pids cgroup (`berth-<name>-<hash>`) holds `pid`.
fn sandbox_cgroup(pid: i32) -> Option<String> {
    let cgroups = String::from_utf8(proc_file(&format!("/proc/{pid}/cgroup")).ok()?).ok()?;
    cgroups.lines().find_map(|l| {
        let path = l.splitn(3, ':').nth(2)?;
        let leaf = path.rsplit('/').next()?;
        leaf.strip_prefix("berth-").map(|rest| {
            rest.rsplit_once('-')
                .map_or(rest, |(name, _)| name)
                .to_string()
        })
    })
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

/// The process that holds the client end of a loopback TCP connection: the
/// one with `peer` as its local address and `local` (ours) as its remote one.
/// `None` when no process in this network namespace holds it (it came from
/// another namespace or host, or went away), or `/proc` cannot be read.
///
/// The kernel lists every TCP socket of the namespace in `/proc/net/tcp` and
/// `tcp6` by address and inode; the process is the one with that inode among
/// its descriptors (`/proc/PID/fd/N -> socket:[INODE]`).
pub fn tcp_peer_pid(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<i32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|f| {
        let table = std::fs::read_to_string(f).ok()?;
        tcp_inode(&table, peer, local)
    })?;
    let want = format!("socket:[{inode}]");
    pids().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str())
            })
        })
    })
}

/// The inode of the socket with local address `me` and remote address `them`
/// in a `/proc/net/tcp{,6}` table.
fn tcp_inode(table: &str, me: std::net::SocketAddr, them: std::net::SocketAddr) -> Option<u64> {
    let (me, them) = (proc_addr(me), proc_addr(them));
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_ascii_whitespace().collect();
        let (local, remote, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
        (local.eq_ignore_ascii_case(&me) && remote.eq_ignore_ascii_case(&them))
            .then(|| inode.parse().ok())
            .flatten()
            .filter(|i| *i != 0)
    })
}

/// An address as `/proc/net/tcp` writes it: the address's 32-bit words in
/// host order as hex, a colon, the port in hex. An IPv4-mapped address
/// (`::ffff:a.b.c.d`, as a dual-stack listener sees an IPv4 peer) is looked
/// up as the IPv4 address its client socket has.
fn proc_addr(a: std::net::SocketAddr) -> String {
    let words = |octets: &[u8]| -> String {
        octets
            .chunks(4)
            .map(|w| {
                let n = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
                format!("{n:08X}")
            })
            .collect()
    };
    let ip = match a.ip().to_canonical() {
        std::net::IpAddr::V4(v4) => words(&v4.octets()),
        std::net::IpAddr::V6(v6) => words(&v6.octets()),
    };
    format!("{ip}:{:04X}", a.port())
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
    fn a_loopback_peer_is_found_by_its_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        let me = std::process::id() as i32;
        assert_eq!(tcp_peer_pid(peer, l.local_addr().unwrap()), Some(me));
        // A peer address no socket has is nobody's.
        let nobody = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(tcp_peer_pid(nobody, l.local_addr().unwrap()), None);
    }

    #[test]
    fn proc_addresses_are_written_as_the_kernel_writes_them() {
        let a: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_addr(a), "0100007F:1F90");
        let mapped: std::net::SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        assert_eq!(proc_addr(mapped), "0100007F:0050");
        let v6: std::net::SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(proc_addr(v6), "00000000000000000000000001000000:0050");
    }

    #[test]
    fn signal_names_are_the_scripts() {
        assert_eq!(signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(signal("USR2").unwrap(), Signal::SIGUSR2);
        assert!(signal("NOPE").is_err());
    }

    #[test]
    fn a_peer_under_a_marked_parent_is_found_though_its_ancestors_were_seen_clean() {
        use std::io::{BufRead, Write};
        use std::process::{Command, Stdio};
        let marker = crate::backend::SANDBOX_MARKER;
        // An unmarked shell, asked about first: clean, and remembered so.
        // Told to go on, it starts a marked shell whose child drops the
        // marker from its own environment.
        let mut outer = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "read go; env {marker}=box sh -c 'env -u {marker} sleep 30 & echo $!; wait'"
                ),
            ])
            .env_remove(marker)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let outer_pid = outer.id() as i32;
        assert_eq!(sandbox_of(outer_pid), None);
        let known = (outer_pid, stat(outer_pid).unwrap().start);
        assert!(CLEAN.lock().unwrap().contains(&known));
        outer.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(outer.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let inner: i32 = line.trim().parse().unwrap();
        // The walk reads the child, then its marked parent, before it meets
        // the known-clean shell above them.
        assert_eq!(sandbox_of(inner).as_deref(), Some("box"));
        assert_eq!(sandbox_of(inner).as_deref(), Some("box"), "asked again");
        assert_eq!(sandbox_of(outer_pid), None, "asked again");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(inner), Signal::SIGKILL);
        let _ = outer.kill();
        let _ = outer.wait();
    }

    #[test]
    fn pids_holds_this_process() {
        assert!(pids().any(|p| p == std::process::id() as i32));
    }
}
