//! File access for local sandboxes that cannot leave the sandbox's directory.
//!
//! The sandboxed shell can plant symlinks anywhere it may write (its workspace,
//! berth's private directory), and berth itself reads and writes there with its
//! own, unrestricted rights: the engine's snapshots and stdin file, and the file
//! tools of `berth mcp`. Every such access resolves its path with `openat2` and
//! `RESOLVE_BENEATH` against the sandbox's directory, so the kernel refuses any
//! path, `..` or symlink that would lead out of it. Missing parent directories are
//! created one at a time, each beneath the one before.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// The kernel's `struct open_how` (libc's is non-exhaustive, so it cannot be built).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dir, rel, flags, mode)` resolving beneath `dir`.
fn open_beneath(dir: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let path = cstr(rel)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: if flags & libc::O_CREAT != 0 {
            u64::from(mode)
        } else {
            0
        },
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `path` is a valid C string and `how` a valid `struct open_how` of the size
    // passed; the kernel only reads both. On success the result is a new
    // descriptor that nothing else owns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let c = cstr(root)?;
    // SAFETY: `c` is a valid C string; the result is checked and then owned.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open `rel` under `root` for reading.
pub fn open_read(root: &Path, rel: &Path) -> io::Result<File> {
    let dir = open_root(root)?;
    Ok(File::from(open_beneath(&dir, rel, libc::O_RDONLY, 0)?))
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
    let fd = open_beneath(
        &parent_fd,
        Path::new(name),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        mode,
    )?;
    // The mode applies only to a new file; an existing one gets it too.
    let file = File::from(fd);
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(file)
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
