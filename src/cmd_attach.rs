//! `berth attach ID`: your terminal on a terminal job, as `tmux attach` is,
//! until the detach key (Ctrl-] unless `--detach-key` says otherwise).
//!
//! The job's terminal takes your terminal's size (and follows it), the screen
//! as it stands is drawn first, then the job's output streams live while your
//! keys go to it through one open stdin. Detaching leaves the job running;
//! the job ending ends the attach. The connection itself is
//! [`crate::terminal::connect`], which `berth shell` uses too.

use std::path::PathBuf;

use anyhow::{Result, bail};
use berth_core::jobs::pty::key_bytes;
use clap::Args;

use crate::context;
use crate::terminal::{self, Ended};

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

pub async fn run(state_dir: Option<PathBuf>, a: AttachArgs) -> Result<u8> {
    let detach = match key_bytes(&a.detach_key)?.as_slice() {
        [b] => *b,
        _ => bail!(
            "--detach-key must be one key that sends one byte, such as C-] or C-q; {:?} is not",
            a.detach_key
        ),
    };
    if !terminal::is_terminal() {
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
    let how = terminal::Connect {
        detach,
        redraw: true,
    };
    let ended = terminal::connect(&rt, job, how, terminal::stdout()).await;
    let code = match ended? {
        Ended::Exited(job) => {
            eprintln!("\r\nberth: job {} {}", job.id, job.standing());
            0
        }
        Ended::Detached(job) | Ended::Closed(job) => {
            eprintln!(
                "\r\nberth: detached from job {id}; it goes on (`berth attach {id}` to return)",
                id = job.id
            );
            0
        }
    };
    rt.shutdown().await;
    Ok(code)
}
