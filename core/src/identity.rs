//! Who a process is, from kernel facts only: which berth sandbox holds it
//! (its pids cgroup, or the marker mount of its mount namespace), which uid
//! owns a TCP connection's other end, and which processes hold that end.
//!
//! Nothing here trusts a process's environment or a file a sandbox can
//! write: a sandboxed process can empty its environment (a double fork and
//! an exec with none), but it cannot leave its cgroup or its mount
//! namespace, nor unmount what berth mounted there (seccomp refuses `mount`,
//! `umount2`, `unshare` and `setns` in a sandbox). The environment variable
//! `BERTH_SANDBOX` may only add a refusal ([`sandbox_of`]).
//!
//! The marker: the local sandbox's wrapper mounts a tiny read-only tmpfs in
//! the sandbox's own mount namespace whose *source* is
//! `berth-sandbox:<name>:<sandbox dir>` (`berth_sandbox::mounts::marker_source`).
//! `/proc/PID/mountinfo` shows it for every process of that namespace. Other
//! programs run in mount namespaces of their own too (a snap or flatpak
//! browser), so a namespace is a sandbox's only when it holds the marker,
//! never merely because it is not the host's.

use crate::procfs::proc_file;

/// The environment variable every sandboxed process of berth's carries
/// (`BERTH_SANDBOX=<name>`). It may only add a refusal: it never tells a
/// sandbox's processes from the host's (a process can drop it); the kernel
/// does that (see this module), except for a sandbox run without kernel
/// restrictions (see `procs::SandboxProcs::Unconfined`).
pub const SANDBOX_MARKER: &str = "BERTH_SANDBOX";

/// The prefix of the marker mount's source (the sandbox crate writes it).
pub const MARKER_PREFIX: &str = "berth-sandbox:";

/// One sandbox of one state dir, as the kernel shows its processes: the
/// leaf of its pids cgroup and the source of its marker mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxIdentity {
    /// The sandbox's name, for messages.
    pub name: String,
    /// `berth-<name>-<hash of dir>`: the pids cgroup's leaf, where there is one.
    pub cgroup_leaf: String,
    /// The source of the sandbox's marker mount.
    pub mount_source: String,
}

impl SandboxIdentity {
    /// Whether `pid` is a process of this very sandbox: in its cgroup, or in
    /// a mount namespace holding its marker.
    pub fn holds(&self, pid: i32) -> bool {
        cgroup_leaves(pid).contains(&self.cgroup_leaf)
            || marker_sources(pid).is_some_and(|m| m.contains(&self.mount_source))
    }
}

/// The sandbox a process belongs to, if any, for a refusal: by kernel facts,
/// a berth sandbox's pids cgroup it is in or a berth marker in its mount
/// namespace; failing those, the environment variable ([`env_hint`]), which
/// may only refuse.
/// A process whose mount namespace cannot be read, and is not this
/// process's own, is taken for a sandbox's (`"unknown"`): the callers refuse
/// it, which is the safe side.
///
/// The cheap case first: a process in this process's own mount namespace
/// (a CLI started from the same shell, a browser that is not a snap) holds no
/// marker, since berth mounts it only in a sandbox's namespace.
pub fn sandbox_of(pid: i32) -> Option<String> {
    if let Some(leaf) = cgroup_leaves(pid)
        .into_iter()
        .find(|l| l.starts_with("berth-"))
    {
        let rest = &leaf["berth-".len()..];
        return Some(
            rest.rsplit_once('-')
                .map_or(rest, |(name, _)| name)
                .to_string(),
        );
    }
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    let theirs = ns(&pid.to_string());
    if theirs.is_some() && theirs == ns("self") {
        return env_hint(pid);
    }
    match marker_sources(pid) {
        Some(m) => match m.into_iter().next() {
            Some(s) => {
                let rest = &s[MARKER_PREFIX.len()..];
                Some(rest.split_once(':').map_or(rest, |(n, _)| n).to_string())
            }
            None => env_hint(pid),
        },
        None => Some("unknown (its mount namespace cannot be read)".into()),
    }
}

/// A refusal only, never a trust: the sandbox named by `BERTH_SANDBOX=` in
/// the environment of `pid` or an ancestor. The kernel facts above decide
/// for a restricted sandbox; this catches what they cannot see, a process
/// of a sandbox run unrestricted (which has neither a cgroup nor a marker)
/// calling berth by mistake, an agent running `berth approve` say. Such a
/// process can shed the variable (a clean environment, a double fork): an
/// unrestricted sandbox is the user's own in every respect.
///
/// The walk stops at a process whose own ancestry an earlier call found
/// clean ([`CLEAN`]): a CLI's calls come from one shell, so most walks read
/// the caller and its parent and stop there.
fn env_hint(pid: i32) -> Option<String> {
    let me = std::process::id() as i32;
    let marker = format!("{}=", SANDBOX_MARKER);
    let mut walked = Vec::new();
    let mut at = pid;
    // Whether the walk reached its top (init, this server, or a process
    // known clean) rather than losing its way (a parent that exited as it
    // was read): only then are the processes walked known clean.
    let mut whole = false;
    for _ in 0..ANCESTRY {
        if at <= 1 || at == me {
            whole = true;
            break;
        }
        let Some(s) = crate::procfs::stat(at) else {
            break;
        };
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
        // The caller itself is not kept: it may not have exec'd yet (a
        // child read between its fork and its exec shows its parent's
        // environment), and it is read once per connection anyway.
        if at != pid {
            walked.push((at, s.start));
        }
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

/// How far up the parents [`env_hint`] looks.
const ANCESTRY: usize = 64;

/// How many clean processes [`CLEAN`] keeps before it starts over.
const CLEAN_KEPT: usize = 4096;

/// Processes, by pid and start time (together never reused), whose own
/// environment and every ancestor's were read without the variable. That
/// stays true: a process that is not a sandbox's does not become one, and
/// one whose parent exits is adopted by an ancestor already read.
static CLEAN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<(i32, u64)>>> =
    std::sync::LazyLock::new(Default::default);

/// The last component of each cgroup path of `pid`.
fn cgroup_leaves(pid: i32) -> Vec<String> {
    let Ok(raw) = proc_file(&format!("/proc/{pid}/cgroup")) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&raw)
        .lines()
        .filter_map(|l| {
            let path = l.splitn(3, ':').nth(2)?;
            Some(path.rsplit('/').next()?.to_string())
        })
        .collect()
}

/// The berth marker sources among the mounts of `pid`'s mount namespace;
/// `None` when its mountinfo cannot be read.
fn marker_sources(pid: i32) -> Option<Vec<String>> {
    let raw = proc_file(&format!("/proc/{pid}/mountinfo")).ok()?;
    let text = String::from_utf8_lossy(&raw);
    Some(
        text.lines()
            .filter_map(|l| {
                // `… - FSTYPE SOURCE OPTIONS`
                let (_, post) = l.split_once(" - ")?;
                let mut f = post.split(' ');
                let (fstype, source) = (f.next()?, f.next()?);
                let source = unescape(source);
                (fstype == "tmpfs" && source.starts_with(MARKER_PREFIX)).then_some(source)
            })
            .collect(),
    )
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The client end of a TCP connection to one of this process's listeners,
/// as this network namespace's socket table shows it.
#[derive(Debug, PartialEq, Eq)]
pub enum TcpPeer {
    /// No socket of this network namespace has that address pair: the
    /// connection came from another host or another namespace (a container).
    Elsewhere,
    /// The socket is this namespace's: the uid that owns it and every
    /// process holding it (none when it was let go of while looked up).
    Here { uid: u32, pids: Vec<i32> },
}

/// Look up the client end of a TCP connection: the socket whose local
/// address is `peer` and whose remote address is `local` (ours), whatever
/// the addresses are (a client may bind any local address, `172.17.0.1` or
/// a non-local one, and connect to `127.0.0.1`).
///
/// The kernel lists every TCP socket of the namespace in `/proc/net/tcp` and
/// `tcp6` with its owner's uid and its inode; its holders are the processes
/// with that inode among their descriptors (`/proc/PID/fd/N ->
/// socket:[INODE]`). Every holder is returned: a descriptor passed on or
/// inherited is held by several.
pub fn tcp_peer(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> TcpPeer {
    // An IPv4 client of a dual-stack listener is in `tcp` as IPv4; an IPv6
    // socket that connected to an IPv4-mapped address is in `tcp6` as written.
    let v4 = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    let found = tcp_row(&v4, proc_addr(peer), proc_addr(local))
        .or_else(|| tcp_row(&v6, proc_addr(peer), proc_addr(local)))
        .or_else(|| tcp_row(&v6, proc_addr_as_is(peer), proc_addr_as_is(local)));
    let Some((uid, inode)) = found else {
        return TcpPeer::Elsewhere;
    };
    let want = format!("socket:[{inode}]");
    let pids = crate::procfs::pids()
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str())
                })
            })
        })
        .collect();
    TcpPeer::Here { uid, pids }
}

/// Why a TCP peer of a listener of this process is refused, if it is: it
/// belongs to another uid, or a sandbox holds it, or it cannot be told
/// apart from one. `loopback_only`: the listener is bound to a loopback
/// address, so every legitimate peer is on this host and must be found.
/// A peer from elsewhere on a listener open to the network is let through
/// (`Ok(false)`); `Ok(true)`: a process of this host, of this uid, in no
/// sandbox.
pub fn check_tcp_peer(
    peer: std::net::SocketAddr,
    local: std::net::SocketAddr,
    loopback_only: bool,
) -> std::result::Result<bool, String> {
    match tcp_peer(peer, local) {
        TcpPeer::Elsewhere if loopback_only => Err(
            "no socket of this host's network namespace holds the connection's other end".into(),
        ),
        TcpPeer::Elsewhere => Ok(false),
        TcpPeer::Here { uid, pids } => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if uid != me {
                return Err(format!(
                    "the connection belongs to uid {uid}, not to this server's uid {me}"
                ));
            }
            if pids.is_empty() {
                return Err("no process holds the connection's other end".into());
            }
            for pid in pids {
                if let Some(sandbox) = sandbox_of(pid) {
                    return Err(format!("process {pid} runs in sandbox `{sandbox}`"));
                }
            }
            Ok(true)
        }
    }
}

/// The owner's uid and the inode of the socket with local address `me` and
/// remote address `them` in a `/proc/net/tcp{,6}` table.
fn tcp_row(table: &str, me: String, them: String) -> Option<(u32, u64)> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_ascii_whitespace().collect();
        let (local, remote, uid, inode) = (f.get(1)?, f.get(2)?, f.get(7)?, f.get(9)?);
        if !(local.eq_ignore_ascii_case(&me) && remote.eq_ignore_ascii_case(&them)) {
            return None;
        }
        let inode: u64 = inode.parse().ok().filter(|i| *i != 0)?;
        Some((uid.parse().ok()?, inode))
    })
}

/// An address as `/proc/net/tcp` writes it: the address's 32-bit words in
/// host order as hex, a colon, the port in hex. An IPv4-mapped address
/// (`::ffff:a.b.c.d`, as a dual-stack listener sees an IPv4 peer) is looked
/// up as the IPv4 address its client socket has.
pub(crate) fn proc_addr(a: std::net::SocketAddr) -> String {
    proc_addr_of(a.ip().to_canonical(), a.port())
}

/// [`proc_addr`] without the IPv4-mapped address made IPv4.
fn proc_addr_as_is(a: std::net::SocketAddr) -> String {
    proc_addr_of(a.ip(), a.port())
}

fn proc_addr_of(ip: std::net::IpAddr, port: u16) -> String {
    let words = |octets: &[u8]| -> String {
        octets
            .chunks(4)
            .map(|w| {
                let n = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
                format!("{n:08X}")
            })
            .collect()
    };
    let ip = match ip {
        std::net::IpAddr::V4(v4) => words(&v4.octets()),
        std::net::IpAddr::V6(v6) => words(&v6.octets()),
    };
    format!("{ip}:{port:04X}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_loopback_peer_is_found_by_its_socket_with_its_uid() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        let me = std::process::id() as i32;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(
            tcp_peer(peer, l.local_addr().unwrap()),
            TcpPeer::Here {
                uid,
                pids: vec![me]
            }
        );
        assert_eq!(
            check_tcp_peer(peer, l.local_addr().unwrap(), true),
            Ok(true)
        );
        // A peer address no socket has is from elsewhere: refused by a
        // loopback listener, let through (as remote) by an open one.
        let nobody = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(
            tcp_peer(nobody, l.local_addr().unwrap()),
            TcpPeer::Elsewhere
        );
        assert!(check_tcp_peer(nobody, l.local_addr().unwrap(), true).is_err());
        assert_eq!(
            check_tcp_peer(nobody, l.local_addr().unwrap(), false),
            Ok(false)
        );
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
    fn this_process_is_no_sandbox_and_its_environment_only_refuses() {
        use std::process::Command;
        let me = std::process::id() as i32;
        assert_eq!(sandbox_of(me), None);
        // The variable names a sandbox: a refusal (an unrestricted sandbox
        // calling berth by mistake), though the kernel says it is the host's.
        let mut c = Command::new("sleep")
            .arg("30")
            .env(SANDBOX_MARKER, "box")
            .spawn()
            .unwrap();
        // Between its fork and its exec the child shows this process's
        // environment: wait for the exec.
        let cmdline = format!("/proc/{}/cmdline", c.id());
        for _ in 0..500 {
            if std::fs::read(&cmdline).is_ok_and(|b| b.starts_with(b"sleep\0")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(sandbox_of(c.id() as i32).as_deref(), Some("box"));
        // It never makes a process a sandbox's for a signal.
        let id = SandboxIdentity {
            name: "box".into(),
            cgroup_leaf: "berth-box-00000000".into(),
            mount_source: format!("{MARKER_PREFIX}box:/nowhere/box"),
        };
        assert!(!id.holds(c.id() as i32));
        let _ = c.kill();
        let _ = c.wait();
    }

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }
}
