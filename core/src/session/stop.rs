//! Stopping a running command: the escalation from SIGINT to SIGKILL over the
//! command's process tree, and replacing the shell when even that fails.

use std::time::Duration;

use tracing::{debug, warn};

use super::{Session, script};
use crate::error::Result;

impl Session {
    /// One step of the stop sequence. Returns false once the shell was replaced.
    ///
    /// The first step also tells the shell to abandon the rest of the command's
    /// list (say, the `rm` of `sleep 60; rm x`), as Ctrl-C does at a terminal;
    /// see `script::traps`. `distrust` kills the shell instead.
    pub(super) async fn escalate(&mut self, stage: usize, why: Stop, distrust: bool) -> bool {
        let sig = match stage {
            0 => "INT",
            1 => "TERM",
            2 => "KILL",
            _ => {
                self.replace_shell().await;
                return false;
            }
        };
        let cut = match (stage, why) {
            (0, _) if distrust => Some("KILL"),
            (0, Stop::Timeout) => Some("USR1"),
            (0, Stop::Interrupt) => Some("USR2"),
            _ => None,
        };
        if let Err(e) = self.kill_tree(sig, None, cut).await {
            warn!(session = %self.cfg.name, error = %e, "could not signal the command's processes");
        }
        true
    }

    /// Signal the running command's process tree: every process newer than
    /// `watermark` (the shell's current one by default). `cut`, when given, is
    /// the signal sent to the shell itself (see `KILL_TREE`). Through a second
    /// spawn in the sandbox; when that cannot start and the sandbox's processes
    /// are berth's, from berth's own process (see `tree`).
    pub(super) async fn kill_tree(
        &mut self,
        sig: &str,
        watermark: Option<u64>,
        cut: Option<&str>,
    ) -> Result<()> {
        let Some(shell) = self.shell.as_ref() else {
            return Ok(());
        };
        let watermark = watermark.unwrap_or(shell.watermark);
        let (pid, sid) = (shell.info.pid, shell.info.sid);
        // Where the sandbox's processes are berth's, berth signals them: a
        // helper spawned there may signal only its own tree (the kernel
        // scopes each spawn's signals), and needs room for a process that a
        // command which filled its process limit leaves none of.
        if self.sandbox.host_processes() {
            let tree = super::tree::Tree::new(pid, sid, watermark);
            let out = tree.signal(sig, cut).await?;
            debug!(session = %self.cfg.name, sig, killed = %out.trim(), "signalled command tree");
            return Ok(());
        }
        let mut argv = vec![
            "bash".to_string(),
            "-c".to_string(),
            script::KILL_TREE.to_string(),
            "berth-kill".to_string(),
            pid.to_string(),
            sid.to_string(),
            watermark.to_string(),
            sig.to_string(),
        ];
        argv.extend(cut.map(str::to_string));
        let out = self.run_helper(&argv).await?;
        debug!(session = %self.cfg.name, sig, killed = %out.trim(), "signalled command tree");
        Ok(())
    }

    /// Run a short helper process in the sandbox and return its stdout.
    pub(super) async fn run_helper(&mut self, argv: &[String]) -> Result<String> {
        let c = crate::backend::run_to_end(
            self.sandbox.as_ref(),
            argv,
            None,
            64 * 1024,
            Duration::from_secs(10),
        )
        .await?;
        Ok(String::from_utf8_lossy(&c.stdout).into_owned())
    }
}

/// Why a command was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    Timeout,
    Interrupt,
}
