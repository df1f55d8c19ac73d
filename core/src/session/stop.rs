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
                if let Some(n) = self.reap_stopped(None).await {
                    self.notices.push(n);
                }
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
    ) -> Result<String> {
        let Some(shell) = self.shell.as_ref() else {
            return Ok(String::new());
        };
        let watermark = watermark.unwrap_or(shell.watermark);
        let (pid, sid) = (shell.info.pid, shell.info.sid);
        // How long ago the command was sent, in hundredths: where the shell
        // adopts orphans, one outside its session older than that is not
        // the command's. Told as an age, not a time, since the sandbox's
        // clock since boot is not berth's (a remote host).
        let age = shell
            .command_sent
            .map_or(0, |t| t.elapsed().as_millis() / 10 + 1);
        let age = u64::try_from(age).unwrap_or(u64::MAX);
        // Where the sandbox's processes are berth's, berth signals them: a
        // helper spawned there may signal only its own tree (the kernel
        // scopes each spawn's signals), and needs room for a process that a
        // command which filled its process limit leaves none of.
        if self.sandbox.host_processes() {
            let since = match age {
                0 => 0,
                age => super::tree::boot_hundredths().saturating_sub(age),
            };
            let tree = super::tree::Tree::new(pid, sid, watermark)
                .adopted_since(since)
                .children_before(&shell.children_before);
            let out = tree.signal(sig, cut).await?;
            debug!(session = %self.cfg.name, sig, killed = %out.trim(), "signalled command tree");
            return Ok(out);
        }
        let argv = vec![
            "bash".to_string(),
            "-c".to_string(),
            script::KILL_TREE.to_string(),
            "berth-kill".to_string(),
            pid.to_string(),
            sid.to_string(),
            watermark.to_string(),
            sig.to_string(),
            cut.unwrap_or("").to_string(),
            // The age, and when the command was sent by berth's own clock:
            // the helper starts later than the age was measured, and where
            // the sandbox's clock is berth's (a local docker daemon) the
            // script takes this exact time instead (see `KILL_TREE`).
            age.to_string(),
            match age {
                0 => 0,
                age => super::tree::boot_hundredths().saturating_sub(age),
            }
            .to_string(),
        ];
        let out = self.run_helper(&argv).await?;
        debug!(session = %self.cfg.name, sig, killed = %out.trim(), "signalled command tree");
        Ok(out)
    }

    /// KILL what a stopped command left (every process of the shell's
    /// session created since `watermark`), the shell alive or not: a shell
    /// killed during the stop (one the engine distrusts, or one that died)
    /// leaves its command's processes behind, reparented, and a command that
    /// ignores TERM lives on until KILL reaches it. Returns a notice when
    /// berth cannot tell that they are gone, or saw some survive: the report
    /// must not claim a stop that did not happen.
    pub(super) async fn reap_stopped(&mut self, watermark: Option<u64>) -> Option<String> {
        match self.kill_tree("KILL", watermark, None).await {
            Ok(out) => {
                let left: u64 = out
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                (left > 0).then(|| {
                    format!(
                        "{left} process(es) of the stopped command {SURVIVED}; list them with `ps` and stop them by hand"
                    )
                })
            }
            Err(e) => {
                warn!(session = %self.cfg.name, error = %e, "could not reap a stopped command's leftovers");
                Some(format!(
                    "berth could not check that the stopped command's processes are gone ({e}); some may {SURVIVED}"
                ))
            }
        }
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

/// The words of a notice that says a stopped command's processes may live
/// on: the report then does not claim they were stopped.
pub const SURVIVED: &str = "still run after KILL";

/// Why a command was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    Timeout,
    Interrupt,
}
