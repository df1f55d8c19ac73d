//! Terminals for the stand-ins' processes (envd's `pty`, Modal's `pty_info`).

/// A new terminal of `cols` x `rows`: its master and its slave.
pub fn open_pty(
    cols: u16,
    rows: u16,
) -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), String> {
    use std::os::fd::FromRawFd;
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let (mut m, mut s) = (-1, -1);
    // SAFETY: openpty writes two fds we then own; the name buffer is unused.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    if r != 0 {
        return Err(format!(
            "error opening a pty: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both fds were just opened by openpty and are owned by no one else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(m),
            std::os::fd::OwnedFd::from_raw_fd(s),
        )
    })
}
