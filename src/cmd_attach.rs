//! `berth attach ID`: your terminal on a terminal job, as `tmux attach` is,
//! until the detach key (Ctrl-] unless `--detach-key` says otherwise).
//!
//! The job's terminal takes your terminal's size (and follows it), the screen
//! as it stands is drawn first, then the job's output streams live while your
//! keys go to it through one open stdin. Detaching leaves the job running;
//! the job ending ends the attach.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use berth_core::backend::TermSize;
use berth_core::jobs::pty::key_bytes;
use clap::Args;
use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::context;

#[derive(Args, Debug)]
#[command(
    after_help = "Your keys go to the job as you type them, Ctrl-C included (it \
interrupts the job's program, as in any terminal). The detach key leaves the job running; \
`berth attach ID` again returns to it. Without a terminal, use `berth job screen ID` and \
`berth job send ID --keys ...`."
)]
pub struct AttachArgs {
    /// Job id or name (a job started with `berth job start --pty`).
    pub id: String,
    /// The key that detaches, by name (C-x for control keys).
    #[arg(long, default_value = "C-]", value_name = "KEY")]
    pub detach_key: String,
}

/// The terminal size of `fd`, if it is a terminal.
fn term_size(fd: i32) -> Option<TermSize> {
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

pub async fn run(state_dir: Option<PathBuf>, a: AttachArgs) -> Result<u8> {
    let detach = match key_bytes(&a.detach_key)?.as_slice() {
        [b] => *b,
        _ => bail!(
            "--detach-key must be one key that sends one byte, such as C-] or C-q; {:?} is not",
            a.detach_key
        ),
    };
    let stdin_fd = std::io::stdin().as_raw_fd();
    let stdout_fd = std::io::stdout().as_raw_fd();
    if !nix::unistd::isatty(std::io::stdin()).unwrap_or(false)
        || !nix::unistd::isatty(std::io::stdout()).unwrap_or(false)
    {
        bail!(
            "attach needs a terminal on stdin and stdout; without one, read the job's screen with \
             `berth job screen {id}` and type with `berth job send {id} TEXT --keys Enter`",
            id = a.id
        );
    }
    let rt = context::runtime(state_dir)?;
    let job = rt.job(&a.id).await?;
    if job.pty.is_none() {
        bail!(
            "job {} is not on a terminal: only a job started with `berth job start --pty` can be \
             attached; follow this one with `berth job logs {} --follow`",
            job.id,
            job.id
        );
    }
    if job.state.is_final() {
        bail!(
            "job {} has {}; see its last screen with `berth job screen {}`",
            job.id,
            job.state.as_str(),
            job.id
        );
    }
    // The job was brought up to date above: the steps below use it as it is,
    // rather than each asking the sandbox again.
    if let Some(size) = term_size(stdout_fd).or_else(|| term_size(stdin_fd)) {
        rt.resize_fresh(&job, size).await?;
    }
    let (job, emu) = rt.emulator_fresh(job).await?;
    let mut input = rt.input_fresh(&job).await?;
    let mut winch = signal(SignalKind::window_change())?;

    // Keys come from a thread of their own: a blocking read that never holds
    // up the end of the process (the runtime would wait for its own reader).
    let (tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into a buffer we own, from a descriptor we do not close.
            let n = unsafe { libc::read(stdin_fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 || tx.blocking_send(buf[..n as usize].to_vec()).is_err() {
                break;
            }
        }
    });

    let raw = RawMode::enter()?;
    {
        let mut out = std::io::stdout().lock();
        out.write_all(b"\x1b[H\x1b[2J")?;
        out.write_all(&emu.redraw())?;
        out.flush()?;
    }
    let offset = emu.screen().offset;
    let mut sink = |b: &[u8]| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b);
        let _ = out.flush();
    };
    let logs = rt.job_logs(&job.id, offset, true, &mut sink);
    tokio::pin!(logs);
    let ended = loop {
        tokio::select! {
            r = &mut logs => break Some(r),
            k = keys.recv() => {
                let Some(k) = k else { break None };
                match k.iter().position(|b| *b == detach) {
                    Some(i) => {
                        input.stdin.write_all(&k[..i]).await?;
                        input.stdin.flush().await?;
                        break None;
                    }
                    None => {
                        input.stdin.write_all(&k).await?;
                        input.stdin.flush().await?;
                    }
                }
            }
            _ = winch.recv() => {
                if let Some(size) = term_size(stdout_fd) {
                    // A resize that races the job's end is not worth an error.
                    let _ = rt.resize_fresh(&job, size).await;
                }
            }
        }
    };
    drop(raw);
    let code = match ended {
        Some(r) => {
            r?;
            let job = rt.job(&job.id).await?;
            eprintln!("\r\nberth: job {} {}", job.id, job.standing());
            0
        }
        None => {
            eprintln!(
                "\r\nberth: detached from job {id}; it goes on (`berth attach {id}` to return)",
                id = job.id
            );
            0
        }
    };
    drop(input);
    rt.shutdown().await;
    Ok(code)
}
