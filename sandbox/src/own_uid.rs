//! A sandbox of berth run as root runs as a uid of its own (#49 item 13).
//!
//! Without capabilities, uid 0 is still the owner of every file root owns:
//! `/opt/app/secret.env`, mode 0600, is readable by a root sandbox that
//! Landlock grants `/opt`. The kernel's own owner checks are the second line
//! behind Landlock only when the sandbox is not root, so as root the wrapper
//! switches to an unprivileged uid (and gid) of the sandbox's own before it
//! execs, as the docker backend runs its containers as uid 1000.
//!
//! The sandbox's files stay root's on disk, so nothing outside the sandbox
//! changes (berth writes its workspace, jobs, checkpoints and clones as
//! before): each write grant is an **idmapped** bind in the sandbox's mount
//! namespace, through which disk uid 0 is the sandbox's uid and back. Inside
//! the sandbox its files are its own; what it creates is root's on disk.
//!
//! Root's state dir lies below `/root` (mode 0700), which the sandbox's uid
//! may not search. A directory on the way to a grant that others may not
//! search is covered, in the sandbox's namespace only, by a read-only tmpfs
//! holding nothing but the path to each grant below it, and each grant is
//! bound there. So the sandbox reaches its workspace by its usual path, and
//! sees nothing else of `/root` (which Landlock denied anyway).
//!
//! The uid is `BASE` plus a hash of the sandbox's name and directory: each
//! sandbox of each state dir gets its own, so `RLIMIT_NPROC` counts only its
//! own processes and two sandboxes' processes are different users to the
//! kernel. `[local] run_as_root = true` keeps uid 0 (with no capabilities).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The first uid of the range a sandbox's own uid is drawn from. High
/// enough to meet no account of the host and no container's subordinate
/// range (`/etc/subuid` hands out 100000 and up by 65536s).
pub const BASE: u32 = 0x6000_0000;
/// How many uids the range holds.
pub const SPAN: u32 = 0x1000_0000;

/// The uid (and gid) sandbox `name` in `dir` runs as when berth is root.
pub fn uid_for(name: &str, dir: &Path) -> u32 {
    // FNV-1a: stable across builds and releases, unlike std's hasher.
    let mut h: u32 = 0x811c_9dc5;
    for b in name
        .as_bytes()
        .iter()
        .chain(b"\0")
        .chain(dir.as_os_str().as_bytes())
    {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    BASE + h % SPAN
}

/// The `uid_map`/`gid_map` text of an idmapping that swaps 0 and `id` and
/// keeps every other id as it is: through it, a file root owns on disk is
/// `id`'s, a file `id` creates is root's, and every other owner is unchanged.
pub fn swap_map(id: u32) -> String {
    // Ids run to 2^32 - 2 (-1 is "no id").
    let last = u32::MAX - 1;
    let mut lines = vec![format!("0 {id} 1"), format!("{id} 0 1")];
    if id > 1 {
        lines.push(format!("1 1 {}", id - 1));
    }
    if id < last {
        lines.push(format!("{} {} {}", id + 1, id + 1, last - id));
    }
    lines.join("\n") + "\n"
}

/// Where a grant must be reached through a cover: the topmost directory on
/// its way (itself excluded) that others may not search. Never `/`: a cover
/// there would hide the whole file system, so [`become_own`] refuses a root
/// others may not search before it asks.
pub fn cover_for(grant: &Path) -> Option<PathBuf> {
    cover_among(grant, |a| {
        std::fs::metadata(a).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 == 0)
    })
}

/// [`cover_for`] with the "others may not search" test given.
fn cover_among(grant: &Path, shut: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let mut ancestors: Vec<&Path> = grant
        .ancestors()
        .skip(1)
        .filter(|a| a.parent().is_some())
        .collect();
    ancestors.reverse();
    ancestors
        .into_iter()
        .find(|a| shut(a))
        .map(Path::to_path_buf)
}

/// Refuse a root directory the sandbox's uid may not search: nothing below
/// it could be reached, and covering it would hide everything.
fn root_searchable(mode: u32) -> Result<()> {
    if mode & 0o001 == 0 {
        return Err(Error::Unsupported(format!(
            "the sandbox runs as a uid of its own when berth is root, and `/` (mode {:04o}) may not be \
             searched by other users, so that uid could reach nothing. Make it searchable \
             (`chmod o+x /`), or set `run_as_root = true` under [local] in the policy file to run \
             local sandboxes as uid 0 without capabilities instead",
            mode & 0o7777
        )));
    }
    Ok(())
}

/// Switch the calling (single-threaded, still privileged) process to
/// sandbox uid `id`, with `write` idmapped and `read` reachable where a
/// cover hides it. Call after the read-only view is made, before the
/// capabilities are dropped (a bind and a uid change need them); the caller
/// drops the bounding set first, as only root may.
pub fn become_own(id: u32, write: &[PathBuf], read: &[PathBuf]) -> Result<()> {
    let root = std::fs::metadata("/").map_err(|e| Error::setup("reading the mode of `/`", e))?;
    root_searchable(root.permissions().mode())?;
    let userns = swapped_userns(id)?;
    // The mounts to make: every write grant idmapped where it is, and every
    // read grant under a cover bound into it (idmapped too: what the policy
    // grants below a root-only directory, root could read).
    let eligible = |p: &&PathBuf| {
        !p.starts_with("/dev") && !p.starts_with("/proc") && crate::mounts::bindable(p)
    };
    let mut covers: Vec<PathBuf> = Vec::new();
    let mut binds: Vec<(PathBuf, OwnedFd, bool)> = Vec::new();
    for (p, is_write) in write
        .iter()
        .filter(eligible)
        .map(|p| (p, true))
        .chain(read.iter().filter(eligible).map(|p| (p, false)))
    {
        let cover = cover_for(p);
        if !is_write && cover.is_none() {
            continue;
        }
        if binds.iter().any(|(q, _, _)| q == p) {
            continue;
        }
        if let Some(c) = cover
            && !covers.iter().any(|k| c.starts_with(k))
        {
            covers.retain(|k| !k.starts_with(&c));
            covers.push(c);
        }
        let tree = clone_tree(p)?;
        idmap(&tree, &userns, p)?;
        binds.push((
            p.clone(),
            tree,
            std::fs::metadata(p).is_ok_and(|m| m.is_dir()),
        ));
    }
    for c in &covers {
        crate::mounts::cover(c)?;
    }
    // A grant below another grant is bound after it, so the outer one does
    // not hide it.
    binds.sort_by_key(|(p, _, _)| p.components().count());
    for (p, tree, dir) in &binds {
        if covers.iter().any(|c| p.starts_with(c)) {
            make_point(p, *dir)?;
        }
        move_mount(tree, p)?;
    }
    for c in &covers {
        crate::mounts::seal(c)?;
    }
    // The working directory still points into the mounts it was entered
    // through: enter it again by name, through the new ones.
    if let Ok(cwd) = std::env::current_dir() {
        std::env::set_current_dir(&cwd)
            .map_err(|e| Error::setup(format!("re-entering {}", cwd.display()), e))?;
    }
    switch_to(id)
}

/// Become `id` for uid and gid, with no supplementary groups.
fn switch_to(id: u32) -> Result<()> {
    // SAFETY: setgroups with a zero count reads no memory; setresgid and
    // setresuid take plain integers. The process is single-threaded, so the
    // change holds for all of it.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(Error::setup(
                "dropping supplementary groups",
                io::Error::last_os_error(),
            ));
        }
        if libc::setresgid(id, id, id) != 0 {
            return Err(Error::setup(
                format!("setting gid {id}"),
                io::Error::last_os_error(),
            ));
        }
        if libc::setresuid(id, id, id) != 0 {
            return Err(Error::setup(
                format!("setting uid {id}"),
                io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// A user namespace whose idmapping is [`swap_map`] of `id`, as a file
/// descriptor: made by a child that unshares it and waits until this process
/// has written its maps and opened it.
fn swapped_userns(id: u32) -> Result<OwnedFd> {
    let fail = |what: &str| Error::setup(what.to_string(), io::Error::last_os_error());
    let mut ready = [0 as RawFd; 2];
    let mut done = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into each array.
    if unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        || unsafe { libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) } != 0
    {
        return Err(fail("making pipes for the sandbox's idmapping"));
    }
    // SAFETY: the descriptors were just made and are owned here alone.
    let (ready_r, ready_w, done_r, done_w) = unsafe {
        (
            OwnedFd::from_raw_fd(ready[0]),
            OwnedFd::from_raw_fd(ready[1]),
            OwnedFd::from_raw_fd(done[0]),
            OwnedFd::from_raw_fd(done[1]),
        )
    };
    // SAFETY: the process is single-threaded (the wrapper's promise), so the
    // child may do anything; it only makes system calls and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(fail("forking for the sandbox's idmapping"));
    }
    if pid == 0 {
        // SAFETY: plain system calls on descriptors this child holds.
        unsafe {
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
            let b = [u8::from(ok)];
            libc::write(ready_w.as_raw_fd(), b.as_ptr().cast(), 1);
            let mut x = [0u8; 1];
            libc::read(done_r.as_raw_fd(), x.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(done_r);
    let reap = || {
        // SAFETY: pid is this process's child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    };
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a one-byte buffer.
    let n = unsafe { libc::read(ready_r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
    if n != 1 || b[0] != 1 {
        reap();
        return Err(Error::setup(
            "making the user namespace of the sandbox's idmapping",
            io::Error::other("the child could not unshare one"),
        ));
    }
    let map = swap_map(id);
    let made = ["uid_map", "gid_map"]
        .iter()
        .try_for_each(|f| std::fs::write(format!("/proc/{pid}/{f}"), &map))
        .map_err(|e| Error::setup(format!("writing the sandbox's idmapping ({map:?})"), e))
        .and_then(|()| {
            std::fs::File::open(format!("/proc/{pid}/ns/user"))
                .map(OwnedFd::from)
                .map_err(|e| Error::setup("opening the sandbox's user namespace", e))
        });
    drop(done_w);
    reap();
    made
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` (MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| Error::setup(format!("path {}", p.display()), io::Error::other(e)))
}

/// A detached copy of the mount at `p` (not of those below it).
fn clone_tree(p: &Path) -> Result<OwnedFd> {
    let c = c_path(p)?;
    // SAFETY: a NUL-terminated path; the flags ask for a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(Error::setup(
            format!("cloning the mount of {}", p.display()),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: open_tree returned a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Give the detached mount `tree` the idmapping of `userns`.
fn idmap(tree: &OwnedFd, userns: &OwnedFd, p: &Path) -> Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `attr` is a valid mount_attr of the size passed; the path is
    // the empty string, with AT_EMPTY_PATH.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint & !AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::Unsupported(format!(
            "the sandbox runs as a uid of its own when berth is root, which needs an idmapped mount of {}, \
             and the kernel refused one ({e}): its file system may not support idmapped mounts \
             (Linux 5.12+; tmpfs from 6.3). Set `run_as_root = true` under [local] in the policy file \
             to run local sandboxes as uid 0 without capabilities instead",
            p.display()
        )));
    }
    Ok(())
}

/// Attach the detached mount `tree` at `target`.
fn move_mount(tree: &OwnedFd, target: &Path) -> Result<()> {
    let c = c_path(target)?;
    let empty = c"";
    // SAFETY: NUL-terminated paths; the source is `tree` itself.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(Error::setup(
            format!("mounting the sandbox's own view of {}", target.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The empty directory (or file) a bind in a cover is mounted on.
fn make_point(p: &Path, dir: bool) -> Result<()> {
    let made = if dir {
        std::fs::create_dir_all(p)
    } else {
        p.parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::File::create(p).map(drop))
    };
    made.map_err(|e| Error::setup(format!("making {} in the sandbox's view", p.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_swaps_root_and_the_id_and_keeps_the_rest() {
        let m = swap_map(BASE + 7);
        let mut covered: Vec<(u64, u64, u64)> = m
            .lines()
            .map(|l| {
                let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
                (v[0], v[1], v[2])
            })
            .collect();
        covered.sort();
        // Inside ids cover 0..=2^32-2 once each, as do outside ids.
        let total: u64 = covered.iter().map(|c| c.2).sum();
        assert_eq!(total, u64::from(u32::MAX));
        let map = |x: u64| {
            covered
                .iter()
                .find(|(i, _, n)| x >= *i && x < i + n)
                .map(|(i, o, _)| o + (x - i))
        };
        assert_eq!(map(0), Some(u64::from(BASE + 7)));
        assert_eq!(map(u64::from(BASE + 7)), Some(0));
        assert_eq!(map(1000), Some(1000));
        assert_eq!(map(u64::from(u32::MAX - 1)), Some(u64::from(u32::MAX - 1)));
        assert_eq!(map(u64::from(u32::MAX)), None);
    }

    #[test]
    fn each_sandbox_gets_a_uid_of_the_range_and_its_own() {
        let a = uid_for("a", Path::new("/root/.local/state/berth/sandboxes/a"));
        let b = uid_for("b", Path::new("/root/.local/state/berth/sandboxes/b"));
        let a2 = uid_for("a", Path::new("/srv/state/sandboxes/a"));
        for u in [a, b, a2] {
            assert!((BASE..BASE + SPAN).contains(&u), "{u}");
        }
        assert_ne!(a, b);
        assert_ne!(a, a2);
        assert_eq!(
            a,
            uid_for("a", Path::new("/root/.local/state/berth/sandboxes/a"))
        );
    }

    #[test]
    fn a_cover_is_the_topmost_directory_others_may_not_search() {
        let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let base = t.path().canonicalize().unwrap_or_else(|e| panic!("{e}"));
        let open = base.join("open");
        let shut = open.join("shut");
        let deep = shut.join("inner");
        std::fs::create_dir_all(&deep).unwrap_or_else(|e| panic!("{e}"));
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        mode(&base, 0o755);
        mode(&open, 0o755);
        mode(&shut, 0o700);
        mode(&deep, 0o700);
        assert_eq!(cover_for(&deep.join("work")), Some(shut.clone()));
        mode(&shut, 0o711);
        assert_eq!(cover_for(&deep.join("work")), Some(deep.clone()));
        mode(&deep, 0o755);
        // Whatever lies above the temporary dir is searchable by others here.
        assert_eq!(cover_for(&deep.join("work")), None);
    }

    #[test]
    fn root_is_never_a_cover_and_a_shut_root_is_refused_by_name() {
        let grant = Path::new("/root/.local/state/berth/sandboxes/a/work");
        // Everything shut, `/` included: the cover is the topmost below it.
        assert_eq!(cover_among(grant, |_| true), Some(PathBuf::from("/root")));
        // Only `/` shut: no cover at all (and become_own refuses first).
        assert_eq!(cover_among(grant, |a| a == Path::new("/")), None);
        assert_eq!(cover_among(Path::new("/work"), |_| true), None);
        assert!(root_searchable(0o755).is_ok());
        assert!(root_searchable(0o711).is_ok());
        let e = root_searchable(0o750)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("`/` (mode 0750)") && e.contains("run_as_root = true"),
            "{e}"
        );
    }

    /// The kernel refuses an idmapped mount of a file system that has none
    /// (proc); the refusal names the path and the way out.
    #[test]
    fn a_refused_idmapping_says_what_to_set() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test clones a mount and makes a user namespace, as only root may; run it as root (as CI does)"
        );
        let tree = clone_tree(Path::new("/proc")).unwrap_or_else(|e| panic!("{e}"));
        let userns = swapped_userns(BASE + 1).unwrap_or_else(|e| panic!("{e}"));
        let e = idmap(&tree, &userns, Path::new("/proc"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("idmapped mount of /proc") && e.contains("run_as_root = true"),
            "{e}"
        );
    }
}
