//! A program run from a private copy that its own user cannot read, so the
//! process is not dumpable.
//!
//! Why: a session's shell reads berth's frames and prints the end of each
//! command's report; a process the command starts runs as the same user, and
//! could otherwise read the shell's memory (`/proc/PID/mem`) or open its
//! descriptors (`/proc/PID/fd/N`) and learn what ends a report before the
//! command has ended (issue 49, item 8). The kernel decides: `execve` of a file
//! the caller may execute but not read leaves the process non-dumpable, and a
//! non-dumpable process's memory, descriptors, environment and ptrace are
//! refused to every process without `CAP_SYS_PTRACE` over it, whatever its uid
//! (`man 5 proc`, "ptrace access mode"). The flag lasts until the shell's next
//! `execve`: the programs a command runs are dumpable as usual, and so cannot
//! read the shell.
//!
//! The copy is a memfd, mode `0111`, that lives only as long as the descriptors
//! on it: nothing on disk for the sandbox to replace or `chmod`. Run it by
//! [`PrivateCopy::path`], which names it through `/proc/self/fd`.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The program's executable, found as `execvp` finds it: as given when it
/// holds a slash, else in the first directory of `path` (a `PATH` value) that
/// has an executable file of that name.
pub fn resolve(program: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path: OsString = path
        .map(OsStr::to_os_string)
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A private, execute-only copy of an executable (see the module's notes).
#[derive(Debug)]
pub struct PrivateCopy {
    fd: OwnedFd,
}

impl PrivateCopy {
    /// Copy the executable at `exe` into a memfd that nobody can read.
    pub fn of(exe: &Path) -> io::Result<PrivateCopy> {
        let bytes = std::fs::read(exe)?;
        let mut file = File::from(memfd()?);
        file.write_all(&bytes)?;
        // Exec refuses a file open for writing (ETXTBSY): keep a read-only
        // descriptor, made while the mode still allows reading, and drop the
        // writable one.
        let ro = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
        drop(file);
        ro.set_permissions(Permissions::from_mode(0o111))?;
        Ok(PrivateCopy { fd: ro.into() })
    }

    /// The path that executes the copy, in this process or a child forked
    /// from it before its `execve` (the descriptor is close-on-exec, which the
    /// kernel applies only after it has opened the file it runs).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// A new close-on-exec memfd, executable where the kernel asks to be told
/// (`MFD_EXEC`, Linux 6.3; older kernels refuse the flag and need none).
fn memfd() -> io::Result<OwnedFd> {
    let name = c"berth-private";
    for flags in [libc::MFD_CLOEXEC | libc::MFD_EXEC, libc::MFD_CLOEXEC] {
        // SAFETY: `name` is a valid NUL-terminated string that outlives the
        // call, which takes no other pointer.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if raw >= 0 {
            // SAFETY: `raw` is a descriptor the call just opened, owned by
            // nothing else.
            return Ok(unsafe { OwnedFd::from_raw_fd(raw) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_copy_runs_and_its_mode_is_execute_only() {
        let exe = resolve(OsStr::new("true"), None).unwrap();
        let copy = PrivateCopy::of(&exe).unwrap();
        let mode = std::fs::metadata(copy.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o111);
        let st = std::process::Command::new(copy.path()).status().unwrap();
        assert!(st.success());
        assert_eq!(
            resolve(OsStr::new("/bin/sh"), None),
            Some(PathBuf::from("/bin/sh"))
        );
    }
}
