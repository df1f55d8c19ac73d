//! Terminals for local processes: a PTY pair from `openpty`.
//!
//! Flow at a glance:
//! - [`Pty::open`] makes the pair at the asked size; the slave becomes the
//!   child's stdin, stdout and stderr;
//! - the child calls [`Pty::make_controlling`] after `setsid` (in `pre_exec`),
//!   so Ctrl-C typed into the terminal signals its foreground group;
//! - the parent keeps the master, non-blocking under tokio's reactor: reads
//!   are the terminal's output, writes are keystrokes, [`resize`] sets the
//!   window size (the kernel sends SIGWINCH).
//!
//! Once every holder of the slave has exited, reading the master fails with
//! `EIO`; that is the end of the output, reported as end of file.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use berth_core::backend::{BoxRead, BoxWrite, TermSize};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A fresh PTY pair.
pub(crate) struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

fn winsize(size: TermSize) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Pty {
    /// Open a pair whose terminal is `size`.
    pub fn open(size: TermSize) -> io::Result<Pty> {
        let p = nix::pty::openpty(Some(&winsize(size)), None).map_err(io::Error::from)?;
        nix::fcntl::fcntl(
            &p.master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(io::Error::from)?;
        Ok(Pty {
            master: p.master,
            slave: p.slave,
        })
    }

    /// In the child, after `setsid`: make stdin (the slave) its controlling terminal.
    pub fn make_controlling() -> io::Result<()> {
        // SAFETY: TIOCSCTTY on fd 0 takes an integer argument and touches no
        // memory; it is async-signal-safe, as `pre_exec` requires.
        let r = unsafe { libc::ioctl(0, libc::TIOCSCTTY as _, 0) };
        if r == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Set the window size of the terminal whose master is `fd`.
pub(crate) fn resize(fd: &impl AsFd, size: TermSize) -> io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at
    // a live local of that type.
    let r = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The master side, shared by the reader and the writer.
#[derive(Clone)]
pub(crate) struct Master(Arc<AsyncFd<OwnedFd>>);

impl Master {
    pub fn new(fd: OwnedFd) -> io::Result<Master> {
        // SAFETY: the AsyncFd owns `fd` (an OwnedFd), so the descriptor stays
        // open and the same for as long as the registration lives.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(Master(Arc::new(fd)))
    }

    pub fn reader(&self) -> BoxRead {
        Box::pin(self.clone())
    }

    pub fn writer(&self) -> BoxWrite {
        Box::pin(self.clone())
    }

    pub fn fd(&self) -> &OwnedFd {
        self.0.get_ref()
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let r = guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from));
            match r {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Every slave holder is gone: the terminal's output has ended.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// A terminal has no half-close; the program sees end of input when it
    /// reads Ctrl-D at the start of a line, which the caller can send.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
