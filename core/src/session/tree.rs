//! Stopping a command's process tree from berth's own process, for a sandbox
//! whose processes are berth's (see [`Sandbox::host_processes`]).
//!
//! The rules are [`script::KILL_TREE`]'s, read the same way from `/proc`; only
//! the place differs. The script needs a process of its own, and a command
//! that filled its user's process limit (a fork bomb, with berth run by an
//! ordinary user and no delegated pids cgroup) leaves no room for one: that
//! spawn fails, and the command would outlive its timeout. Signalling from
//! here creates no process and no thread (threads count against the same
//! limit).
//!
//! [`Sandbox::host_processes`]: crate::backend::Sandbox::host_processes
//! [`script::KILL_TREE`]: super::script::KILL_TREE

use std::collections::{HashMap, HashSet};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::Result;
use crate::procs::{pids, signal, stat};

/// What [`script::KILL_TREE`](super::script::KILL_TREE) takes as arguments.
pub(super) struct Tree {
    shell: i32,
    sid: i32,
    /// The watermark's time (hundredths since boot; 0: none) and pid.
    wt: u64,
    wpid: u64,
    /// The last pid allocated now, to tell a wrap at `pid_max`.
    now: u64,
    hz: u64,
    spare: HashSet<i32>,
    /// When the command began (hundredths since boot; 0: unknown): a
    /// process outside the shell's session must be no older to be its.
    since: u64,
    /// Processes that were the shell's children before the command began:
    /// not the command's, and neither is what they start.
    before: HashSet<i32>,
}

/// The direct children of `pid` (its main thread's, which is where a
/// single-threaded shell's children are), from
/// `/proc/PID/task/PID/children`: one read, cheap enough for every command.
/// Empty when unreadable.
pub(super) fn children(pid: u32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The time since boot in hundredths of a second, the clock of
/// `/proc/PID/stat`'s start times (boot time, suspend included); 0 if
/// unreadable.
pub(super) fn boot_hundredths() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `t` is, and nothing else.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) } != 0 {
        return 0;
    }
    u64::try_from(t.tv_sec).unwrap_or(0) * 100 + u64::try_from(t.tv_nsec).unwrap_or(0) / 10_000_000
}

impl Tree {
    pub(super) fn new(shell: u32, sid: u32, watermark: u64) -> Self {
        let now = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().nth(4)?.parse().ok())
            .unwrap_or(0);
        let shell = i32::try_from(shell).unwrap_or(i32::MAX);
        Self {
            shell,
            sid: i32::try_from(sid).unwrap_or(i32::MAX),
            wt: watermark >> 22,
            wpid: watermark & ((1 << 22) - 1),
            now,
            // USER_HZ, the unit of `/proc/PID/stat` times: 100 on every Linux
            // port berth runs on, as the script assumes.
            hz: 100,
            spare: HashSet::from([shell, std::process::id() as i32]),
            since: 0,
            before: HashSet::new(),
        }
    }

    /// Leave alone the shell's children from before the command (see
    /// [`children`]) and what they start.
    pub(super) fn children_before(mut self, pids: &[i32]) -> Self {
        self.before.extend(pids.iter().copied());
        self.spare.extend(pids.iter().copied());
        self
    }

    /// Count a process outside the shell's session as the command's only if
    /// it started at `since` (hundredths since boot) or later. The shell
    /// adopts every orphan of its tree, those of earlier commands and of
    /// jobs too (an `ssh-agent` an earlier command started, a daemon a job
    /// forked): the watermark, taken only when `$!` changes, is older than
    /// the command, and the start time tells them apart.
    pub(super) fn adopted_since(mut self, since: u64) -> Self {
        self.since = since;
        self
    }

    /// Created since the watermark.
    fn new_since(&self, pid: i32, start: u64) -> bool {
        if self.wt > 0 {
            let cs = start * 100 / self.hz;
            if cs != self.wt {
                return cs > self.wt;
            }
        }
        let pid = u64::try_from(pid).unwrap_or(0);
        if self.now >= self.wpid {
            pid > self.wpid
        } else {
            pid > self.wpid || pid <= self.now
        }
    }

    /// One pass over `/proc`: the command's live processes.
    ///
    /// Outside the shell's session, a process is the command's when its
    /// parents lead up to the shell through processes that are new, or in
    /// the shell's session. A process a command detached from itself
    /// (`(setsid sleep 1000 &)`: its parent exits at once) is adopted by the
    /// shell, which the sandbox's wrapper made a child subreaper
    /// (`berth_sandbox::exec`), so its parent is the shell. An old process
    /// of another session (a job an earlier command started, adopted by the
    /// shell the same way) ends the walk: what it starts now is the job's.
    fn scan(&self) -> Vec<i32> {
        // pid -> (parent, ends a walk).
        let mut parent = HashMap::new();
        let mut victims = Vec::new();
        let mut maybe = Vec::new();
        for pid in pids() {
            let Some(s) = stat(pid) else { continue };
            let new = self.new_since(pid, s.start);
            parent.insert(
                pid,
                (
                    s.ppid,
                    (!new && s.sid != self.sid) || self.before.contains(&pid),
                ),
            );
            if self.spare.contains(&pid) || s.state == b'Z' || !new {
                continue;
            }
            if s.sid == self.sid && self.sid == self.shell {
                victims.push(pid);
            } else if s.start * 100 / self.hz >= self.since {
                maybe.push(pid);
            }
        }
        for p in maybe {
            let mut q = parent.get(&p).map(|v| v.0);
            for _ in 0..64 {
                match q {
                    Some(q) if q == self.shell => {
                        victims.push(p);
                        break;
                    }
                    Some(q2) if q2 > 1 => match parent.get(&q2) {
                        Some(&(_, true)) | None => break,
                        Some(&(up, false)) => q = Some(up),
                    },
                    _ => break,
                }
            }
        }
        victims
    }

    /// Whether the shell still catches `sig`.
    fn shell_catches(&self, sig: Signal) -> bool {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.shell)) else {
            return false;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m >> (sig as i32 - 1) & 1 == 1)
    }

    /// Signal the tree as the script does: `cut` to the shell first (or KILL
    /// when it no longer catches it), then `sig` to every process of the
    /// command. For KILL, freeze and kill and look again until nothing is
    /// left. Returns what the script prints.
    pub(super) async fn signal(&self, sig: &str, cut: Option<&str>) -> Result<String> {
        let sig = signal(sig)?;
        let mut out = self.scan();
        if let Some(cut) = cut {
            let cut = signal(cut)?;
            let to = if cut != Signal::SIGKILL && self.shell_catches(cut) {
                cut
            } else {
                Signal::SIGKILL
            };
            let _ = kill(Pid::from_raw(self.shell), to);
        }
        if sig != Signal::SIGKILL {
            for &p in &out {
                let _ = kill(Pid::from_raw(p), sig);
            }
            return Ok(out.len().to_string());
        }
        let (mut killed, mut rounds) = (0, 0);
        while !out.is_empty() && rounds < 50 {
            for &p in &out {
                let _ = kill(Pid::from_raw(p), Signal::SIGSTOP);
            }
            for &p in &out {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            killed += out.len();
            rounds += 1;
            // A scan of a full process table takes a while: let other
            // sandboxes' work run between rounds.
            tokio::task::yield_now().await;
            out = self.scan();
        }
        Ok(format!("{killed} {}", out.len()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// On the same processes, the scan picks what the kill script picks: of
    /// two background children of a shell, the one started after the
    /// watermark and not the older one. (The script is run with signal 0,
    /// which only counts.)
    #[test]
    fn scans_the_processes_the_script_picks() -> std::result::Result<(), Box<dyn std::error::Error>>
    {
        use std::io::{BufRead, BufReader, Write};
        use std::process::{Command, Stdio};
        use std::time::Duration;
        let mut shell = Command::new("setsid")
            .args([
                "bash",
                "-c",
                "sleep 300 & echo $!; read -r _; sleep 300 & echo $!; wait",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let pid = shell.id();
        let mut input = shell.stdin.take().ok_or("no stdin")?;
        let mut lines = BufReader::new(shell.stdout.take().ok_or("no stdout")?).lines();
        let old: i32 = lines.next().ok_or("no first pid")??.parse()?;
        std::thread::sleep(Duration::from_millis(30));
        let up = std::fs::read_to_string("/proc/uptime")?;
        let hundredths: u64 = up
            .split(' ')
            .next()
            .ok_or("uptime")?
            .replace('.', "")
            .parse()?;
        let last: u64 = std::fs::read_to_string("/proc/loadavg")?
            .trim()
            .rsplit(' ')
            .next()
            .ok_or("loadavg")?
            .parse()?;
        std::thread::sleep(Duration::from_millis(30));
        writeln!(input)?;
        let new: i32 = lines.next().ok_or("no second pid")??.parse()?;
        let watermark = hundredths * 4194304 + last;
        let found = Tree::new(pid, pid, watermark).scan();
        let script = Command::new("bash")
            .args([
                "-c",
                crate::session::script::KILL_TREE,
                "berth-kill",
                &pid.to_string(),
                &pid.to_string(),
                &watermark.to_string(),
                "0",
            ])
            .output()?;
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
        let _ = shell.wait();
        assert_eq!(found, vec![new], "old {old}, new {new}");
        assert_eq!(String::from_utf8_lossy(&script.stdout), "1\n", "{script:?}");
        Ok(())
    }

    /// The watermark compares start times first, and pids only within one
    /// hundredth, with a wrap at `pid_max` splitting the range.
    #[test]
    fn created_since_reads_the_watermark_as_the_script_does() {
        let t = |wt: u64, wpid: u64, now: u64| Tree {
            shell: 1,
            sid: 1,
            wt,
            wpid,
            now,
            hz: 100,
            spare: HashSet::new(),
            before: HashSet::new(),
            since: 0,
        };
        let a = t(500, 1000, 2000);
        assert!(
            a.new_since(10, 501),
            "a later start is new, whatever its pid"
        );
        assert!(!a.new_since(5000, 499), "an earlier start is old");
        assert!(a.new_since(1001, 500) && !a.new_since(999, 500));
        let wrapped = t(0, 30000, 200);
        assert!(wrapped.new_since(31000, 0) && wrapped.new_since(100, 0));
        assert!(!wrapped.new_since(20000, 0));
    }
}
