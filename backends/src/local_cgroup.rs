//! The pids cgroup of a local sandbox: one per sandbox directory, shared by
//! every process of that sandbox, so a fork bomb meets a bound even when berth
//! runs as root (root is exempt from RLIMIT_NPROC). The exec wrapper joins it;
//! removing the sandbox kills what is left in it and removes it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `<pids controller mount>/<our cgroup>/berth-<name>-<hash of dir>`, if a pids
/// controller is mounted (cgroup v1, or v2 with pids enabled for children).
pub fn dir_for(name: &str, sandbox_dir: &Path) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let leaf = format!(
        "berth-{name}-{:08x}",
        fnv1a(sandbox_dir.as_os_str().as_encoded_bytes())
    );
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mut post_f = post.split_whitespace();
        let fstype = post_f.next().unwrap_or("");
        let opts = post_f.nth(1).unwrap_or("");
        let Some(mount_point) = pre.split_whitespace().nth(4) else {
            continue;
        };
        if fstype == "cgroup" && opts.split(',').any(|o| o == "pids") {
            let rel = cgroups
                .lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
                    ctrl.split(',')
                        .any(|c| c == "pids")
                        .then(|| path.to_string())
                })
                .unwrap_or_else(|| "/".into());
            return Some(
                Path::new(mount_point)
                    .join(rel.trim_start_matches('/'))
                    .join(leaf),
            );
        }
    }
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        if post.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let Some(mount_point) = pre.split_whitespace().nth(4) else {
            continue;
        };
        let rel = cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/");
        let parent = Path::new(mount_point).join(rel.trim_start_matches('/'));
        let control =
            std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
        if control.split_whitespace().any(|c| c == "pids") {
            return Some(parent.join(leaf));
        }
    }
    None
}

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Create the cgroup with `max` processes and move the calling process into it.
pub fn join(dir: &Path, max: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("pids.max"), max.to_string())?;
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
}

/// Kill whatever still runs in the cgroup, then remove it. Absent is fine.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // A pid that already exited gives ESRCH, which is fine.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            // Killed processes leave the cgroup once reaped; try again shortly.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
