//! Your terminal on a terminal job: what `berth attach` and the terminal
//! lines of `berth shell` share.
//!
//! Flow at a glance:
//! 1. the start: `berth attach` gives the job your terminal's size and draws
//!    its screen as it stands; `berth shell` starts its job at your size and
//!    shows its output from the first byte;
//! 2. your terminal goes raw; your keys, read on a thread of their own, go to
//!    the job's stdin through one open helper, its output comes to yours, and
//!    a window change resizes it;
//! 3. the job's end or the detach key ends the connection: the terminal's
//!    mode comes back and the key thread stops without reading another key,
//!    so whatever you type next reaches whoever reads the terminal next
//!    (`berth shell`'s prompt).

use std::io::{IsTerminal, PipeReader, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use anyhow::{Context as _, Result};
use berth_core::backend::TermSize;
use berth_core::jobs::Job;
use berth_core::runtime::Runtime;
use berth_core::session::Tee;
use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

/// How long a job whose output has ended may take to be seen as ended.
const END_WAIT: Duration = Duration::from_secs(10);

/// Whether berth's stdin and stdout are both a terminal: only then is there
/// a terminal to connect a job to.
pub fn is_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// The size of berth's terminal, if it has one.
pub fn size() -> Option<TermSize> {
    term_size(std::io::stdout().as_raw_fd()).or_else(|| term_size(std::io::stdin().as_raw_fd()))
}

/// The terminal size of `fd`, if it is a terminal.
fn term_size(fd: RawFd) -> Option<TermSize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a `winsize` into the pointer it is given.
    let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some(TermSize {
        cols: ws.ws_col,
        rows: ws.ws_row,
    })
}

/// How to connect.
pub struct Connect {
    /// The byte that detaches (Ctrl-] is 0x1d).
    pub detach: u8,
    /// Give the job this terminal's size, clear the screen and draw the job's
    /// screen as it stands, then follow its output from there (`berth
    /// attach`). Without it, the output is shown from its first byte, as a
    /// program started just now at this terminal's size prints it.
    pub redraw: bool,
}

/// How a connection ended.
pub enum Ended {
    /// The job ended; here as it then stood.
    Exited(Job),
    /// The detach key was typed: the job goes on.
    Detached(Job),
    /// The terminal's input closed (the terminal is gone): the job goes on.
    Closed(Job),
}

/// Connect this terminal to terminal job `job` until it ends or is
/// detached from. Its output goes to `out`. The caller has checked that
/// berth is on a terminal ([`is_terminal`]) and that the job is one.
pub async fn connect(rt: &Runtime, job: Job, how: Connect, out: Tee) -> Result<Ended> {
    let (job, screen, offset) = if how.redraw {
        // The job was brought up to date by the caller: the steps below use
        // it as it is, rather than each asking the sandbox again.
        if let Some(size) = size() {
            rt.resize_fresh(&job, size).await?;
        }
        let (job, emu) = rt.emulator_fresh(job).await?;
        let mut screen = b"\x1b[H\x1b[2J".to_vec();
        screen.extend(emu.redraw());
        let offset = emu.screen().offset;
        (job, screen, offset)
    } else {
        (job, Vec::new(), 0)
    };
    let mut input = rt.input_fresh(&job).await?;
    let mut winch = signal(SignalKind::window_change())?;
    let mut keys = Keys::start()?;
    let raw = RawMode::enter()?;
    if !screen.is_empty() {
        out(&screen);
    }
    let mut sink = |b: &[u8]| out(b);
    let id = job.id.clone();
    let logs = rt.job_logs(&id, offset, true, &mut sink);
    tokio::pin!(logs);
    let ended = loop {
        tokio::select! {
            r = &mut logs => break Stop::Exited(r),
            k = keys.rx.recv() => {
                let Some(k) = k else { break Stop::Closed };
                match k.iter().position(|b| *b == how.detach) {
                    Some(i) => {
                        input.stdin.write_all(&k[..i]).await?;
                        input.stdin.flush().await?;
                        break Stop::Detached;
                    }
                    None => {
                        input.stdin.write_all(&k).await?;
                        input.stdin.flush().await?;
                    }
                }
            }
            _ = winch.recv() => {
                if let Some(size) = size() {
                    // A resize that races the job's end is not worth an error.
                    let _ = rt.resize_fresh(&job, size).await;
                }
            }
        }
    };
    // The mode back first, then the key thread stopped before anything else
    // reads the terminal.
    drop(raw);
    drop(keys);
    drop(input);
    match ended {
        Stop::Exited(r) => {
            r?;
            Ok(Ended::Exited(rt.wait_job(&job.id, Some(END_WAIT)).await?))
        }
        Stop::Detached => Ok(Ended::Detached(job)),
        Stop::Closed => Ok(Ended::Closed(job)),
    }
}

/// Why the connection loop stopped.
enum Stop {
    /// The job's output ended, with how its reading went.
    Exited(berth_core::Result<u64>),
    Detached,
    Closed,
}

/// `out` for [`connect`] straight to berth's stdout.
pub fn stdout() -> Tee {
    std::sync::Arc::new(|b: &[u8]| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b);
        let _ = out.flush();
    })
}

/// Raw mode on stdin for as long as it lives; the saved mode comes back on drop.
struct RawMode(Termios);

impl RawMode {
    fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw)
            .context("putting the terminal in raw mode")?;
        Ok(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.0);
    }
}

/// Keys typed while a job starts, kept for it: for as long as this lives the
/// terminal neither echoes them nor holds them for a whole line, so they
/// reach the program once connected, as if typed there, rather than showing
/// twice (`vim` and then `i` at once). Ctrl-C still makes SIGINT. The saved
/// mode comes back on drop.
pub struct TypeAhead(Option<Termios>);

impl TypeAhead {
    /// Hold typed keys back; a terminal whose mode cannot be read or set is
    /// left as it is.
    pub fn hold() -> TypeAhead {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(&stdin) else {
            return TypeAhead(None);
        };
        let mut quiet = saved.clone();
        quiet.local_flags &= !(termios::LocalFlags::ECHO | termios::LocalFlags::ICANON);
        quiet.control_chars[termios::SpecialCharacterIndices::VMIN as usize] = 1;
        quiet.control_chars[termios::SpecialCharacterIndices::VTIME as usize] = 0;
        match termios::tcsetattr(&stdin, SetArg::TCSANOW, &quiet) {
            Ok(()) => TypeAhead(Some(saved)),
            Err(_) => TypeAhead(None),
        }
    }
}

impl Drop for TypeAhead {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, saved);
        }
    }
}

/// Keys from stdin, read on a thread of their own (a blocking read that the
/// async runtime never waits for) until dropped. The thread waits in `poll`
/// on stdin and on a pipe of its own, and reads stdin only once it has
/// something: dropping closes the pipe, which wakes it, so it ends without
/// taking a key meant for the next reader of the terminal.
struct Keys {
    rx: mpsc::Receiver<Vec<u8>>,
    stop: Option<std::io::PipeWriter>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keys {
    fn start() -> Result<Keys> {
        let (wake, stop) = std::io::pipe().context("creating the key reader's pipe")?;
        let (tx, rx) = mpsc::channel(64);
        let stdin = std::io::stdin().as_raw_fd();
        let thread = std::thread::spawn(move || read_keys(stdin, &wake, &tx));
        Ok(Keys {
            rx,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        // The pipe's hang-up wakes a reader in `poll`; closing the channel
        // fails a send it waits in.
        drop(self.stop.take());
        self.rx.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_keys(stdin: RawFd, wake: &PipeReader, tx: &mpsc::Sender<Vec<u8>>) {
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stdin,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `poll` reads and writes the array we own, of the length given.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if fds[1].revents != 0 {
            break;
        }
        if fds[0].revents == 0 {
            continue;
        }
        // SAFETY: reading into a buffer we own, from a descriptor we do not close.
        let n = unsafe { libc::read(stdin, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 || tx.blocking_send(buf[..n as usize].to_vec()).is_err() {
            break;
        }
    }
}
