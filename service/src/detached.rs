//! `berth run` started as a process of its own, detached from the caller:
//! what a schedule's slot, a fired wait and the dashboard's Resume and Fork
//! buttons each start.

use std::ffi::OsStr;
use std::path::Path;

use anyhow::{Context, Result};

/// Start `berth run ARGS…` for state dir `dir`, in a process group of its
/// own, its output appended to `runs/LOG.log` there; returns its pid. It is
/// reaped when it ends.
pub fn start_run<I, S>(dir: &Path, args: I, log: &str) -> Result<u32>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let logs = dir.join("runs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let path = logs.join(format!("{log}.log"));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let exe = std::env::current_exe().context("cannot find berth's own executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("run")
        .args(args)
        .env("BERTH_STATE_DIR", dir)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("cannot start `berth run`")?;
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}
