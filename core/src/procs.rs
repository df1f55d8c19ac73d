//! Processes as `/proc` shows them, for the backends whose processes are
//! berth's own (see [`Sandbox::host_processes`]): read and signalled from
//! berth's process, with nothing spawned.
//!
//! [`Sandbox::host_processes`]: crate::backend::Sandbox::host_processes

use std::str::FromStr;

use nix::sys::signal::Signal;

use crate::error::{Error, Result};

/// The fields of `/proc/PID/stat` the rules read.
pub(crate) struct Stat {
    pub(crate) state: u8,
    pub(crate) ppid: i32,
    pub(crate) sid: i32,
    /// Start time since boot, in clock ticks.
    pub(crate) start: u64,
}

pub(crate) fn stat(pid: i32) -> Option<Stat> {
    let raw = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold anything, parentheses too: the
    // fields start after the last `)`.
    let at = raw.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(raw.get(at + 1..)?).ok()?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some(Stat {
        state: *f.first()?.as_bytes().first()?,
        ppid: f.get(1)?.parse().ok()?,
        sid: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// Every pid in `/proc` now.
pub(crate) fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// A signal by the name the scripts use (`TERM`).
pub(crate) fn signal(name: &str) -> Result<Signal> {
    Signal::from_str(&format!("SIG{name}"))
        .map_err(|_| Error::InvalidInput(format!("no signal named {name}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_reads_a_name_with_parentheses() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert_eq!(s.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(s.sid, nix::unistd::getsid(None).unwrap().as_raw());
        assert_ne!(s.state, b'Z');
    }

    #[test]
    fn signal_names_are_the_scripts() {
        assert_eq!(signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(signal("USR2").unwrap(), Signal::SIGUSR2);
        assert!(signal("NOPE").is_err());
    }

    #[test]
    fn pids_holds_this_process() {
        assert!(pids().any(|p| p == std::process::id() as i32));
    }
}
