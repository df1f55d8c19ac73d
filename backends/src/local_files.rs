//! File access for local sandboxes that cannot leave the sandbox's directory.
//!
//! The sandboxed shell can plant symlinks anywhere it may write (its workspace,
//! berth's private directory), and berth itself reads and writes there with its
//! own, unrestricted rights: the engine's snapshots and stdin file, and the file
//! tools of `berth mcp`. Every such access resolves its path with `openat2` and
//! `RESOLVE_BENEATH` against the sandbox's directory, so the kernel refuses any
//! path, `..` or symlink that would lead out of it. Missing parent directories are
//! created one at a time, each beneath the one before.
//!
//! Only regular files are read or written. Every open is non-blocking, so a FIFO
//! (or a device) planted where berth expects a file cannot stall it: a read
//! refuses it, a write replaces it with a regular file.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// `path` relative to `root`, if it lies under it once `.` and `..` are applied
/// lexically. Symlinks are left to the kernel.
pub fn relative_under(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => parts.clear(),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop();
            }
            Component::Normal(p) => parts.push(p),
        }
    }
    let normal: PathBuf = std::iter::once(std::ffi::OsStr::new("/"))
        .chain(parts)
        .collect();
    normal.strip_prefix(root).ok().map(Path::to_path_buf)
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `openat2(dir, rel, flags, mode)` resolving beneath `dir`.
fn open_beneath(dir: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let mut how = OpenHow::new()
        .flags(OFlag::from_bits_retain(flags | libc::O_CLOEXEC))
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    if flags & libc::O_CREAT != 0 {
        how = how.mode(nix::sys::stat::Mode::from_bits_truncate(mode));
    }
    Ok(nix::fcntl::openat2(dir, rel, how)?)
}

fn open_root(root: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    Ok(nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?)
}

/// The error for a path that is not a regular file.
pub fn not_regular() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "not a regular file (a FIFO, device, socket or directory); berth reads and writes only regular files",
    )
}

/// Fail unless `f` is a regular file.
pub fn check_regular(f: &File) -> io::Result<()> {
    if f.metadata()?.file_type().is_file() {
        Ok(())
    } else {
        Err(not_regular())
    }
}

/// Open `rel` under `root` for reading: a regular file only.
pub fn open_read(root: &Path, rel: &Path) -> io::Result<File> {
    let dir = open_root(root)?;
    let f = File::from(open_beneath(
        &dir,
        rel,
        libc::O_RDONLY | libc::O_NONBLOCK,
        0,
    )?);
    check_regular(&f)?;
    Ok(f)
}

/// Create or truncate `rel` under `root` for writing with `mode`, creating missing
/// parent directories beneath `root`.
pub fn open_write(root: &Path, rel: &Path, mode: u32) -> io::Result<File> {
    let dir = open_root(root)?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    let Some(name) = rel.file_name() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path names a directory, not a file",
        ));
    };
    let parent_fd = make_dirs(&dir, parent)?;
    let name = Path::new(name);
    // Not truncating yet: only a regular file is truncated, and a FIFO opened
    // without a reader fails (ENXIO) instead of waiting for one.
    let opened = open_beneath(
        &parent_fd,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_NONBLOCK,
        mode,
    )
    .map(File::from);
    let file = match opened {
        Ok(f) if f.metadata()?.file_type().is_file() => {
            f.set_len(0)?;
            f
        }
        Ok(_) => replace(&parent_fd, name, mode)?,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => replace(&parent_fd, name, mode)?,
        Err(e) => return Err(e),
    };
    // The mode applies only to a new file; an existing one gets it too.
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(file)
}

/// Remove what is at `name` (not a regular file, not a directory) and create a
/// regular file in its place.
fn replace(parent: &OwnedFd, name: &Path, mode: u32) -> io::Result<File> {
    let cname = cstr(name)?;
    // SAFETY: `parent` is a valid directory descriptor and `cname` a valid C
    // string naming one entry in it; unlinkat never follows a symlink.
    if unsafe { libc::unlinkat(parent.as_raw_fd(), cname.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let f = File::from(open_beneath(
        parent,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        mode,
    )?);
    check_regular(&f)?;
    Ok(f)
}

/// Open directory `rel` beneath `dir`, creating each missing component.
fn make_dirs(dir: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    match open_beneath(dir, rel, libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut cur = open_beneath(dir, Path::new("."), libc::O_PATH | libc::O_DIRECTORY, 0)?;
    for c in rel.components() {
        let Component::Normal(name) = c else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unexpected path component",
            ));
        };
        let cname = cstr(Path::new(name))?;
        // SAFETY: `cur` is a valid directory descriptor and `cname` a valid C
        // string naming one component, so this creates nothing outside `cur`.
        let r = unsafe { libc::mkdirat(cur.as_raw_fd(), cname.as_ptr(), 0o755) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
        cur = open_beneath(&cur, Path::new(name), libc::O_PATH | libc::O_DIRECTORY, 0)?;
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn lexical_containment() {
        let root = Path::new("/s/box");
        assert_eq!(
            relative_under(root, Path::new("/s/box/work/a")),
            Some(PathBuf::from("work/a"))
        );
        assert_eq!(relative_under(root, Path::new("/s/box/work/../../x")), None);
        assert_eq!(relative_under(root, Path::new("/etc/passwd")), None);
        assert_eq!(relative_under(root, Path::new("/s/boxer")), None);
    }

    #[test]
    fn fifos_are_refused_for_reading_and_replaced_for_writing() -> io::Result<()> {
        let root = tempfile::tempdir()?;
        let r = root.path();
        let fifo = r.join("snap.0");
        let c = cstr(&fifo)?;
        // SAFETY: `c` is a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Both would block forever on a FIFO with no peer.
        let e = open_read(r, Path::new("snap.0")).err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
        open_write(r, Path::new("snap.0"), 0o600)?.write_all(b"data")?;
        assert!(std::fs::symlink_metadata(&fifo)?.file_type().is_file());
        assert_eq!(std::fs::read(&fifo)?, b"data");
        // A longer file is truncated, not overwritten in part.
        open_write(r, Path::new("snap.0"), 0o600)?.write_all(b"x")?;
        assert_eq!(std::fs::read(&fifo)?, b"x");
        Ok(())
    }

    #[test]
    fn symlinks_and_dotdot_cannot_leave_the_root() -> io::Result<()> {
        let outside = tempfile::tempdir()?;
        std::fs::write(outside.path().join("secret"), b"host secret")?;
        let root = tempfile::tempdir()?;
        let r = root.path();
        std::fs::create_dir(r.join("work"))?;
        std::os::unix::fs::symlink(outside.path().join("secret"), r.join("work/link"))?;
        std::os::unix::fs::symlink(outside.path(), r.join("work/dirlink"))?;
        std::os::unix::fs::symlink("../work", r.join("work/inner"))?;
        for rel in ["work/link", "work/dirlink/secret", "work/../../etc/passwd"] {
            let e = open_read(r, Path::new(rel)).err();
            assert!(e.is_some(), "{rel} was opened");
        }
        for rel in ["work/link", "work/dirlink/new", "work/dirlink/deeper/new"] {
            assert!(
                open_write(r, Path::new(rel), 0o600).is_err(),
                "{rel} was written"
            );
        }
        assert_eq!(
            std::fs::read(outside.path().join("secret"))?,
            b"host secret"
        );
        assert!(!outside.path().join("new").exists());
        assert!(!outside.path().join("deeper").exists());
        // Inside, symlinks and new directories work as usual.
        open_write(r, Path::new("work/a/b/c.txt"), 0o640)?.write_all(b"ok")?;
        let mut s = String::new();
        open_read(r, Path::new("work/inner/a/b/c.txt"))?.read_to_string(&mut s)?;
        assert_eq!(s, "ok");
        Ok(())
    }
}
