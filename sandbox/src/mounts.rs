//! A read-only view of the host: the sandbox's processes get a mount
//! namespace of their own in which every mount is read-only except the
//! profile's write grants, which are bind-mounted onto themselves (read-write,
//! `nosuid`, `nodev`).
//!
//! It also mounts a devpts instance of the namespace's own on `/dev/pts`, so
//! the sandbox can open terminals (terminal jobs) without seeing the host's.
//!
//! Why: Landlock decides which files a process may open, read, write, create
//! or remove, but it has no right for a file's *metadata*. `chmod`, `chown`
//! and `utimes` of a file the sandbox's uid owns go through it, wherever the
//! file is: as root that is all of `/etc`; as an ordinary user, `~/.ssh`. On a
//! read-only mount the kernel refuses every such change (EROFS), so outside
//! the grants the metadata is as fixed as the contents. Extended attributes
//! are refused by seccomp already.
//!
//! With it comes an IPC namespace of the process's own: SysV shared memory,
//! semaphores and message queues, and POSIX message queues, are named by
//! keys Landlock never sees and checked by uid, so a host process's segment
//! of berth's uid would otherwise be the sandbox's to attach.
//!
//! As root the namespace is a plain `unshare(CLONE_NEWNS)`. An ordinary user
//! gets it inside a user namespace that maps only its own uid and gid to
//! themselves, so every file keeps its owner and every check its outcome.
//! Where the kernel allows neither (unprivileged user namespaces turned off,
//! a container without `CAP_SYS_ADMIN`), the view is not made and the rest of
//! the sandbox stands as before; `docs/POLICIES.md` says so.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What a sandbox with a private devpts instance may open read-write.
pub const PRIVATE_TERMINALS: &[&str] = &["/dev/ptmx", "/dev/pts"];

/// Whether the view was made.
#[derive(Debug, PartialEq, Eq)]
pub enum View {
    /// Every mount outside the grants is read-only for this process tree.
    /// `terminals`: `/dev/pts` is a devpts instance of this namespace's own
    /// (and `/dev/ptmx` its multiplexer), so the sandbox may open terminals
    /// without reaching any of the host's.
    Made {
        /// The private devpts instance is mounted.
        terminals: bool,
    },
    /// The kernel would not give this process a mount namespace.
    Unavailable(String),
}

/// Whether this process is refused the mere lookup of `point`.
fn unreachable(point: &Path) -> bool {
    std::fs::symlink_metadata(point).is_err_and(|e| e.kind() == io::ErrorKind::PermissionDenied)
}

/// Whether grant `p` can be bound onto itself: a directory or a regular
/// file, named by its real path (no link on the way, which a bind would
/// follow to elsewhere).
pub(crate) fn bindable(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir() || m.is_file())
        && std::fs::canonicalize(p).is_ok_and(|real| real == p)
}

/// Make the read-only view for `grants` (directories and files the sandbox
/// may write). Must run while the process is single-threaded (a user
/// namespace requires it), before capabilities are dropped.
pub fn read_only_view(grants: &[PathBuf]) -> Result<View> {
    // SAFETY: geteuid, getuid and getgid have no preconditions.
    let (euid, uid, gid) = unsafe { (libc::geteuid(), libc::getuid(), libc::getgid()) };
    if euid == 0 {
        // SAFETY: unshare only changes this process's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) } != 0 {
            return Ok(View::Unavailable(format!(
                "no mount namespace: {}",
                io::Error::last_os_error()
            )));
        }
    } else {
        // SAFETY: as above; the process is single-threaded (the caller's promise).
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWIPC) }
            != 0
        {
            return Ok(View::Unavailable(format!(
                "no user namespace: {}",
                io::Error::last_os_error()
            )));
        }
        let write = |file: &str, text: String| {
            std::fs::write(file, text)
                .map_err(|e| Error::setup(format!("writing {file} for the read-only view"), e))
        };
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    // Nothing done below reaches the host's mount table.
    mount(None, Path::new("/"), libc::MS_REC | libc::MS_PRIVATE)?;
    let grants: Vec<PathBuf> = grants.iter().filter(|g| bindable(g)).cloned().collect();
    for g in &grants {
        mount(Some(g), g, libc::MS_BIND | libc::MS_REC)?;
    }
    for m in mounts()? {
        let granted = grants.iter().any(|g| m.point.starts_with(g));
        // The kernel's own file systems: read-only already where it matters
        // (Landlock grants none of /sys and only reads of /proc).
        let kernel = ["/proc", "/sys"].iter().any(|k| m.point.starts_with(k));
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | m.locked;
        if granted {
            if !grants.contains(&m.point) {
                continue;
            }
            flags |= libc::MS_NOSUID | libc::MS_NODEV;
        } else if kernel {
            continue;
        } else {
            flags |= libc::MS_RDONLY;
        }
        if let Err(e) = mount(None, &m.point, flags) {
            // A mount this user cannot even look up (under a directory it may
            // not search, as docker's fuse-overlayfs mounts under
            // /var/lib/docker are, or a FUSE file system of another user): no
            // process of the sandbox, the same user with less, can reach it
            // either, so it needs no read-only view. Anything else is fatal.
            if !granted && unreachable(&m.point) {
                continue;
            }
            return Err(e);
        }
    }
    let terminals = private_terminals();
    // The working directory still points into the mount it was entered
    // through; entered again by name, it is the grant's own mount (a cwd in
    // the workspace stays writable).
    if let Ok(cwd) = std::env::current_dir() {
        std::env::set_current_dir(&cwd)
            .map_err(|e| Error::setup(format!("re-entering {}", cwd.display()), e))?;
    }
    Ok(View::Made { terminals })
}

/// Cover directory `c` with an empty tmpfs (mode 0711, so the sandbox's
/// uid may pass through it to the grants bound below it, and list nothing),
/// in this namespace only. See [`crate::own_uid`].
pub fn cover(c: &Path) -> Result<()> {
    mount_fs(
        "tmpfs",
        c,
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "mode=0711,size=64k",
    )
}

/// Make cover `c` read-only once its mount points are made.
pub fn seal(c: &Path) -> Result<()> {
    mount(
        None,
        c,
        libc::MS_REMOUNT
            | libc::MS_BIND
            | libc::MS_RDONLY
            | libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC,
    )
}

/// The prefix of a marker mount's source (`berth_core::identity` reads it).
pub const MARKER_PREFIX: &str = "berth-sandbox:";

/// Where, in its directory, a sandbox's marker is mounted.
pub const MARKER_DIR: &str = ".sandbox-id";

/// The source string of sandbox `name`'s marker mount, `dir` being its
/// directory as the wrapper was given it (under the state dir, so naming
/// both the state dir and the sandbox).
pub fn marker_source(name: &str, dir: &Path) -> String {
    format!("{MARKER_PREFIX}{name}:{}", dir.display())
}

/// Make the directory the marker is mounted on (before the view makes the
/// sandbox's directory read-only). The sandbox cannot write its own
/// directory (only `work/`, `tmp/` and `.berth/` in it), so nothing it
/// planted is there.
pub fn marker_point(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let point = dir.join(MARKER_DIR);
    match std::fs::DirBuilder::new().mode(0o555).create(&point) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::setup(format!("creating {}", point.display()), e)),
    }
    if !std::fs::symlink_metadata(&point).is_ok_and(|m| m.is_dir()) {
        return Err(Error::setup(
            format!("{} is not a directory", point.display()),
            io::Error::other("remove it; berth makes it again"),
        ));
    }
    Ok(point)
}

/// Mount the sandbox's marker, in this process's own mount namespace (made
/// by [`read_only_view`]): an empty read-only tmpfs whose source is
/// [`marker_source`]. `/proc/PID/mountinfo` shows it for every process of
/// the namespace, so berth tells the sandbox's processes from the host's by
/// a kernel fact. None of them can unmount it or leave the namespace
/// (seccomp refuses `umount2`, `unshare` and `setns`).
pub fn mount_marker(point: &Path, source: &str) -> Result<()> {
    mount2(
        Some(source.as_bytes()),
        point,
        Some(b"tmpfs".as_slice()),
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(b"size=4k,nr_inodes=2,mode=555".as_slice()),
    )
}

/// Mount a new devpts instance over `/dev/pts` and bind its `ptmx` over
/// `/dev/ptmx`: terminals the sandbox opens are its own, and the host's
/// (the operator's among them) are not even visible. False where the kernel
/// refuses it; the sandbox then gets no terminals at all.
fn private_terminals() -> bool {
    let pts = Path::new("/dev/pts");
    if !pts.is_dir() || !Path::new("/dev/ptmx").exists() {
        return false;
    }
    let fresh = mount_fs(
        "devpts",
        pts,
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    );
    if fresh.is_err() {
        return false;
    }
    mount(
        Some(Path::new("/dev/pts/ptmx")),
        Path::new("/dev/ptmx"),
        libc::MS_BIND,
    )
    .is_ok()
}

/// One line of `/proc/self/mountinfo`: where, and the per-mount flags a
/// remount must keep (a user namespace may not clear them).
struct Mount {
    point: PathBuf,
    locked: libc::c_ulong,
}

fn mounts() -> Result<Vec<Mount>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::setup("reading /proc/self/mountinfo", e))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split(' ');
        let (Some(point), Some(opts)) = (f.nth(4), f.next()) else {
            continue;
        };
        let mut locked = 0;
        for o in opts.split(',') {
            locked |= match o {
                "nosuid" => libc::MS_NOSUID,
                "nodev" => libc::MS_NODEV,
                "noexec" => libc::MS_NOEXEC,
                "noatime" => libc::MS_NOATIME,
                "nodiratime" => libc::MS_NODIRATIME,
                "relatime" => libc::MS_RELATIME,
                "ro" => libc::MS_RDONLY,
                _ => 0,
            };
        }
        out.push(Mount {
            point: PathBuf::from(unescape(point)),
            locked,
        });
    }
    Ok(out)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
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

/// A bind, a remount or a propagation change: no file system type, no data.
fn mount(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> Result<()> {
    let source = source.map(|p| p.as_os_str().as_bytes());
    mount2(source, target, None, flags, None)
}

/// A new mount of file system `fstype` (its name as the source too) with `data`.
fn mount_fs(fstype: &str, target: &Path, flags: libc::c_ulong, data: &str) -> Result<()> {
    let t = fstype.as_bytes();
    mount2(Some(t), target, Some(t), flags, Some(data.as_bytes()))
}

/// mount(2), with an error that names the target and the flags.
fn mount2(
    source: Option<&[u8]>,
    target: &Path,
    fstype: Option<&[u8]>,
    flags: libc::c_ulong,
    data: Option<&[u8]>,
) -> Result<()> {
    let c = |b: &[u8]| {
        CString::new(b).map_err(|e| {
            Error::setup(
                format!("mount {} for the read-only view", target.display()),
                io::Error::other(e),
            )
        })
    };
    let (src, dst) = (
        source.map(c).transpose()?,
        c(target.as_os_str().as_bytes())?,
    );
    let (fstype, data) = (fstype.map(c).transpose()?, data.map(c).transpose()?);
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives
    // the call; a bind, a remount and a propagation change take null type and
    // data.
    let r = unsafe {
        libc::mount(
            ptr(&src),
            dst.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if r != 0 {
        return Err(Error::setup(
            format!(
                "making the read-only view: mount {} (flags {flags:#x})",
                target.display()
            ),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }
}
