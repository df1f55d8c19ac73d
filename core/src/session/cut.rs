//! A command the lost link cut off. Over SSH the link's end reaches neither
//! the shell nor its command: sshd sends no signal to a process with no
//! terminal, so a `sleep 600` or a server started by the command runs on
//! after berth reported the link lost. The session remembers the shell it
//! lost while a command ran, and before its next shell starts (the link is
//! back) it stops what is left of that command, and says so.
//!
//! What is stopped: the lost shell itself, and every process of its session
//! created since its watermark (the command's tree, as [`super::script::KILL_TREE`]
//! picks it), that was there before berth saw the link drop. Background
//! jobs of earlier commands are older than the watermark; berth's jobs are
//! sessions of their own; a process that came after the drop (a pid used
//! again) is newer than it. A host that rebooted in between has nothing left.

use std::time::{Duration, Instant};

use tracing::warn;

use super::{SURVIVED, Session};
use crate::error::{Error, Result};

/// The shell the link was lost under, while a command ran.
#[derive(Clone, Debug)]
pub(super) struct CutOff {
    sid: u32,
    watermark: u64,
    /// When berth saw the link drop.
    at: Instant,
    command: String,
}

/// `$1` the lost shell's session id (its pid), `$2` its watermark, `$3` how
/// long ago (hundredths of a second) berth saw the link drop. Prints
/// `KILLED LEFT`. Builtins only, as `KILL_TREE`.
pub const REAP_CUT_OFF: &str = r#"sid=$1; wm=$2; ago=$3
wt=$((10#${wm:-0} / 4194304)); hz=100; me=$$
read -r up _ < /proc/uptime; up=${up/./}; up=$((10#$up))
# Nothing is left of a shell whose host rebooted, or that had no watermark.
if [ "$wt" -le 0 ] || [ "$up" -le "$wt" ]; then echo "0 0"; exit 0; fi
until=$(( up - 10#$ago + 100 ))
scan() {
  out=()
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; [ "$p" = "$me" ] && continue
    read -r l < "$d/stat" 2>/dev/null || continue
    l=${l##*) }; read -r -a f <<< "$l"
    [ "${f[0]}" = Z ] && continue
    [ "${f[3]}" = "$sid" ] || continue
    cs=$(( ${f[19]} * 100 / hz ))
    [ "$cs" -le "$until" ] || continue
    if [ "$p" != "$sid" ] && [ "$cs" -lt "$wt" ]; then continue; fi
    out+=("$p")
  done
}
killed=0; rounds=0; scan
while [ ${#out[@]} -gt 0 ] && [ $rounds -lt 50 ]; do
  kill -s STOP "${out[@]}" 2>/dev/null; kill -s KILL "${out[@]}" 2>/dev/null
  killed=$((killed + ${#out[@]})); rounds=$((rounds + 1)); scan
done
echo "$killed ${#out[@]}""#;

impl Session {
    /// Remember the running shell as cut off by the lost link.
    pub(super) fn note_cut_off(&mut self, command: &str) {
        if let Some(sh) = self.shell.as_ref()
            && sh.info.sid == sh.info.pid
            && !self.sandbox.host_processes()
        {
            self.cut_off = Some(CutOff {
                sid: sh.info.sid,
                watermark: sh.watermark,
                at: Instant::now(),
                command: command.chars().take(80).collect(),
            });
        }
    }

    /// Stop what is left of the command the lost link cut off, if any, with
    /// a notice. An unreachable host keeps it for the next try.
    pub(super) async fn reap_cut_off(&mut self) -> Result<()> {
        let Some(cut) = self.cut_off.take() else {
            return Ok(());
        };
        let ago = cut.at.elapsed().as_millis() / 10;
        let argv = vec![
            "bash".to_string(),
            "-c".to_string(),
            REAP_CUT_OFF.to_string(),
            "berth-cut-off".to_string(),
            cut.sid.to_string(),
            cut.watermark.to_string(),
            ago.to_string(),
        ];
        let run = crate::backend::run_to_end(
            self.sandbox.as_ref(),
            &argv,
            None,
            4096,
            Duration::from_secs(30),
        )
        .await;
        let out = match run {
            Ok(c) => String::from_utf8_lossy(&c.stdout).into_owned(),
            Err(e @ Error::Unreachable { .. }) => {
                self.cut_off = Some(cut);
                return Err(e);
            }
            Err(e) => {
                warn!(session = %self.cfg.name, error = %e, "could not stop the command the lost link cut off");
                self.notices.push(format!(
                    "the command the lost link cut off (`{}`) may still run on the host: berth could not check ({e}); look with `ps` and stop it by hand",
                    cut.command
                ));
                return Ok(());
            }
        };
        let mut n = out
            .split_whitespace()
            .map(|w| w.parse::<u64>().unwrap_or(0));
        let (killed, left) = (n.next().unwrap_or(0), n.next().unwrap_or(0));
        if killed > 0 {
            self.notices.push(format!(
                "the command the lost link cut off (`{}`) was still running on the host: berth stopped it ({killed} process(es), its old shell included)",
                cut.command
            ));
        }
        if left > 0 {
            self.notices.push(format!(
                "{left} process(es) of the command the lost link cut off (`{}`) {SURVIVED}; list them with `ps` and stop them by hand",
                cut.command
            ));
        }
        Ok(())
    }
}
