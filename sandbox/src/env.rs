//! The process is sanitised before anything else, as firecracker's jailer does:
//! descriptors inherited from berth (its database, sockets, other sandboxes'
//! pipes) must not reach the sandboxed program. The environment was already
//! cleared and rebuilt from the allow-list by the local backend.

use crate::error::{Error, Result};

/// Mark every descriptor above stderr close-on-exec, so the exec that ends the
/// wrapper closes them all, whatever berth left open.
pub fn close_inherited_fds() -> Result<()> {
    // SAFETY: close_range takes integers only; with CLOSE_RANGE_CLOEXEC it
    // closes nothing now and only sets a flag on descriptors that may exist.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    // Kernels before 5.11: walk /proc/self/fd.
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| Error::setup("listing inherited descriptors", e))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on a descriptor number; a stale one gives EBADF, ignored.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn inherited_fds_become_close_on_exec() {
        crate::readback::in_child("env::tests::inherited_fds_become_close_on_exec", || {
            let f = std::fs::File::open("/dev/null").unwrap();
            let fd = f.as_raw_fd();
            // SAFETY: clearing FD_CLOEXEC on a descriptor this test owns.
            unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
            close_inherited_fds().unwrap();
            // SAFETY: F_GETFD on the same descriptor.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            format!("cloexec={}", flags & libc::FD_CLOEXEC)
        })
        .expect_line("cloexec=1");
    }
}
