//! This berth process as a name another berth can check: whether the berth
//! that started a process in a sandbox is still alive. A backend whose
//! processes outlive the link that started them (envd keeps a process whose
//! stream dropped) tags a session's shell with it, and ends the shell of a
//! berth that is gone (see [`SpawnOpts::replaces`]).
//!
//! [`SpawnOpts::replaces`]: crate::backend::SpawnOpts::replaces

use std::sync::OnceLock;

/// This process: `machine:boot:pid:start`, where `machine` is the machine id
/// (the host name without one), `boot` the kernel's boot id and `start` the
/// process's start time in clock ticks since boot, since a pid alone is
/// reused.
pub fn this() -> &'static str {
    static THIS: OnceLock<String> = OnceLock::new();
    THIS.get_or_init(|| {
        let pid = std::process::id();
        let start = i32::try_from(pid)
            .ok()
            .and_then(crate::procs::stat)
            .map_or(0, |s| s.start);
        format!("{}:{}:{pid}:{start}", machine(), boot())
    })
}

/// Whether the berth named `owner` (by [`this`], in some process) is gone for
/// certain: it ran on this machine, and the machine has booted since, or no
/// process with its pid and start time is alive. One that ran elsewhere, or a
/// name that does not parse, counts as alive: its process is left alone.
pub fn is_gone(owner: &str) -> bool {
    let mut parts = owner.rsplitn(4, ':');
    let (Some(start), Some(pid), Some(boot_id), Some(machine_id)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Ok(start), Ok(pid)) = (start.parse::<u64>(), pid.parse::<i32>()) else {
        return false;
    };
    if machine_id != machine() || machine_id.is_empty() {
        return false;
    }
    if boot_id != boot() {
        return true;
    }
    match crate::procs::stat(pid) {
        Some(s) => s.start != start || s.state == b'Z',
        None => true,
    }
}

fn machine() -> String {
    [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/etc/hostname",
    ]
    .iter()
    .find_map(|p| {
        let s = std::fs::read_to_string(p).ok()?;
        let s = s.trim().replace(':', "_");
        (!s.is_empty()).then_some(s)
    })
    .unwrap_or_default()
}

fn boot() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn a_live_berth_is_alive_and_a_dead_one_is_gone() {
        let me = this();
        assert!(!is_gone(me), "{me}");
        // A child that has exited and been reaped: its pid no longer runs
        // with its start time.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = crate::procs::stat(i32::try_from(pid).unwrap())
            .map(|s| s.start)
            .unwrap();
        let (machine_id, boot_id) = (machine(), boot());
        let name = format!("{machine_id}:{boot_id}:{pid}:{start}");
        child.wait().unwrap();
        assert!(is_gone(&name), "{name}");
        // The same pid with another start time is another process.
        let mine = std::process::id();
        assert!(is_gone(&format!("{machine_id}:{boot_id}:{mine}:1")));
        // Another boot of this machine: gone. Another machine, or a name
        // that does not parse: left alone.
        assert!(is_gone(&format!("{machine_id}:another-boot:{mine}:1")));
        assert!(!is_gone(&format!("elsewhere:{boot_id}:{pid}:{start}")));
        assert!(!is_gone("garbage"));
        assert!(!is_gone(&format!("{machine_id}:{boot_id}:x:1")));
    }
}
