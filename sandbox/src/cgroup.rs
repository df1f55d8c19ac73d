//! The pids cgroup of a local sandbox: one per sandbox directory, shared by
//! every process of that sandbox, so a fork bomb meets a bound even when berth
//! runs as root (root is exempt from RLIMIT_NPROC).
//!
//! Flow at a glance:
//! - the wrapper finds the cgroup ([`dir_for`]), sweeps away other `berth-*`
//!   cgroups whose processes have all ended, and joins its own ([`join`]);
//! - the local backend removes a sandbox's cgroup once the process it waited
//!   for has ended and nothing else is left in it ([`remove_if_empty`]);
//! - removing a sandbox kills what is left in it, waits until the tree is
//!   gone and removes the cgroup ([`remove`]).
//!
//! An ordinary user can only use a pids cgroup that was delegated to them
//! (systemd's `Delegate=yes`, or a user session's own subtree). Without one the
//! bound is RLIMIT_NPROC, which counts all of the user's processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_policies::SandboxProfile;

use crate::error::{Error, Result};

/// The prefix of every sandbox cgroup's name.
const PREFIX: &str = "berth-";
/// `<pids controller mount>/<our cgroup>/berth-<name>-<hash of dir>`, if a pids
/// controller is mounted (cgroup v1, or v2 with pids enabled for children).
pub fn dir_for(name: &str, sandbox_dir: &Path) -> Option<PathBuf> {
    controller_dir("pids", name, sandbox_dir)
}

/// The sandbox's cgroup in the memory controller's hierarchy, if one is
/// mounted: on cgroup v2 the same directory as [`dir_for`]'s, on v1 one of
/// the same name in the memory hierarchy.
pub fn memory_dir_for(name: &str, sandbox_dir: &Path) -> Option<PathBuf> {
    controller_dir("memory", name, sandbox_dir)
}

/// Every cgroup directory of the sandbox (one on v2, one per controller on
/// v1), the pids one first: killing through it reaches every process.
pub fn dirs_for(name: &str, sandbox_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    for d in [
        dir_for(name, sandbox_dir),
        memory_dir_for(name, sandbox_dir),
    ]
    .into_iter()
    .flatten()
    {
        if !v.contains(&d) {
            v.push(d);
        }
    }
    v
}

fn controller_dir(ctrl: &str, name: &str, sandbox_dir: &Path) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let leaf = leaf_for(name, sandbox_dir);
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
        if fstype == "cgroup" && opts.split(',').any(|o| o == ctrl) {
            let rel = cgroups
                .lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, c, path) = (f.next()?, f.next()?, f.next()?);
                    c.split(',').any(|c| c == ctrl).then(|| path.to_string())
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
        if control.split_whitespace().any(|c| c == ctrl) {
            return Some(parent.join(leaf));
        }
    }
    None
}

/// The name of sandbox `name`'s cgroup (in each controller's hierarchy):
/// `berth-<name>-<hash of its directory>`.
pub fn leaf_for(name: &str, sandbox_dir: &Path) -> String {
    format!(
        "berth-{name}-{:08x}",
        fnv1a(sandbox_dir.as_os_str().as_encoded_bytes())
    )
}

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Create the cgroup with `max` processes and move the calling process into
/// it. See [`join_with`] for the race with other sandboxes' sweeps.
pub fn join(dir: &Path, max: u64) -> std::io::Result<()> {
    join_with(dir, |dir| {
        std::fs::write(dir.join("pids.max"), max.to_string())
    })
}

/// Create the sandbox's memory cgroup with a bound of `max` bytes, swap
/// included, and move the calling process into it. cgroup v2 takes
/// `memory.max` and `memory.swap.max` (where swap is accounted); v1
/// `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`, which must never
/// fall below the former, so it is written both before and after.
pub fn join_memory(dir: &Path, max: u64) -> std::io::Result<()> {
    join_with(dir, |dir| set_memory_max(dir, max))
}

/// How long [`join_with`] goes on making a cgroup that other sandboxes'
/// sweeps keep removing before it gives up.
const JOIN_PATIENCE: Duration = Duration::from_secs(10);

/// Create the cgroup `dir`, `set` its bound, and move the calling process
/// into it.
///
/// Until a process is in it, the fresh cgroup is empty, and the wrapper of
/// any other sandbox starting at the same moment sweeps empty `berth-*`
/// cgroups away ([`sweep`]): between any two steps the directory can go.
/// The kernel then answers ENOENT (looked up by path after the removal) or
/// ENODEV (a file opened before it, written after: the cgroup is dead).
/// Either way the cgroup is made again and the steps repeated, until the
/// process is in it (a populated cgroup cannot be removed) or
/// [`JOIN_PATIENCE`] has passed.
fn join_with(dir: &Path, set: impl Fn(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    let deadline = Instant::now() + JOIN_PATIENCE;
    let mut pause = Duration::from_micros(100);
    loop {
        let r = std::fs::create_dir_all(dir)
            .and_then(|()| set(dir))
            .and_then(|()| {
                std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            });
        match r {
            Err(e) if swept(&e) && Instant::now() < deadline => {
                // Let the sweeper finish; a little longer each time.
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Whether `e` says the cgroup was removed under us: ENOENT and ENODEV as
/// above, and EEXIST or EBUSY from a `mkdir` that met the dying cgroup of a
/// removal still under way (`create_dir_all` gives up when the name exists
/// but is no directory by the time it looks). Seen in CI: 3 of 200 joins
/// failed at once with the sweeper running, none of them after the patience.
fn swept(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
        || e.kind() == std::io::ErrorKind::AlreadyExists
        || matches!(e.raw_os_error(), Some(libc::ENODEV | libc::EBUSY))
}

fn set_memory_max(dir: &Path, max: u64) -> std::io::Result<()> {
    let v = max.to_string();
    if dir.join("memory.max").exists() {
        std::fs::write(dir.join("memory.max"), &v)?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            std::fs::write(swap, "0")?;
        }
        return Ok(());
    }
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let has_memsw = memsw.exists();
    if has_memsw {
        // Raising: the swap bound first, or the memory one would exceed it.
        let _ = std::fs::write(&memsw, &v);
    }
    std::fs::write(dir.join("memory.limit_in_bytes"), &v)?;
    if has_memsw {
        std::fs::write(&memsw, &v)?;
    }
    Ok(())
}

/// How a sandbox's memory cgroup stands: its bound and how many of its
/// processes the kernel's OOM killer ended, as the cgroup counts them
/// (`memory.events` on v2, `memory.oom_control` on v1). `None` where there
/// is no such cgroup or it has no bound.
pub fn memory_state(dir: &Path) -> Option<(u64, u64)> {
    MemoryFiles::open(dir)?.state().ok().flatten()
}

/// A sandbox's memory cgroup files, held open. The local backend reads them
/// before and after every command (did the OOM killer end something?), and
/// reading an open file again is one `pread`, where opening it by path walks
/// cgroupfs each time.
#[derive(Debug)]
pub struct MemoryFiles {
    /// `memory.max` (v2) or `memory.limit_in_bytes` (v1).
    limit: std::fs::File,
    /// `memory.events` (v2) or `memory.oom_control` (v1), where readable.
    kills: Option<std::fs::File>,
    v2: bool,
}

impl MemoryFiles {
    /// Open the files of the memory cgroup at `dir`; `None` if it has none.
    pub fn open(dir: &Path) -> Option<MemoryFiles> {
        let open = |f: &str| std::fs::File::open(dir.join(f)).ok();
        if let Some(limit) = open("memory.max") {
            return Some(MemoryFiles {
                limit,
                kills: open("memory.events"),
                v2: true,
            });
        }
        Some(MemoryFiles {
            limit: open("memory.limit_in_bytes")?,
            kills: open("memory.oom_control"),
            v2: false,
        })
    }

    /// The bound and the OOM kills so far, as [`memory_state`] tells them;
    /// an error when the files no longer read (the cgroup was removed): open
    /// them again.
    pub fn state(&self) -> std::io::Result<Option<(u64, u64)>> {
        let limit = read_at_start(&self.limit)?;
        let Ok(limit) = limit.trim().parse::<u64>() else {
            // v2's "max": no bound.
            return Ok(None);
        };
        // v1's "no bound" is a page-rounded i64::MAX.
        if !self.v2 && limit >= (i64::MAX as u64) / 2 {
            return Ok(None);
        }
        let kills = match &self.kills {
            Some(f) => read_at_start(f)?.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                if k == "oom_kill" {
                    v.trim().parse::<u64>().ok()
                } else {
                    None
                }
            }),
            None => None,
        };
        Ok(Some((limit, kills.unwrap_or(0))))
    }
}

/// A small cgroup file's text, read from its start: the kernel renders it
/// afresh for a read at offset 0.
fn read_at_start(f: &std::fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 4096];
    let n = f.read_at(&mut buf, 0)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The host's RAM in bytes, from `/proc/meminfo` (0 if unreadable).
pub fn host_ram() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Join the sandbox's memory cgroup with a bound of `max` bytes (`None`:
/// none). Soft: where no memory controller can be used, the sandbox runs
/// unbounded and the wrapper says nothing (it would say it in every
/// command's output); berth warns where the policy asked for a bound
/// (see [`memory_bound_missing`]).
pub fn join_memory_for(name: &str, sandbox_dir: &Path, max: Option<u64>) {
    let (Some(max), Some(dir)) = (max, memory_dir_for(name, sandbox_dir)) else {
        return;
    };
    if let Some(parent) = dir.parent() {
        sweep(parent, &dir);
    }
    let _ = join_memory(&dir, max);
}

/// Why a memory bound cannot be applied to sandbox `name` here, if it cannot:
/// no memory controller is mounted, or its hierarchy is not writable by this
/// user. Checked from berth's side, once, to warn.
pub fn memory_bound_missing(name: &str, sandbox_dir: &Path) -> Option<String> {
    let Some(dir) = memory_dir_for(name, sandbox_dir) else {
        return Some(
            "no memory cgroup controller is mounted (or enabled for berth's cgroup on cgroup v2)"
                .into(),
        );
    };
    let parent = dir.parent()?;
    if nix::unistd::access(parent, nix::unistd::AccessFlags::W_OK).is_err() {
        return Some(format!(
            "the memory cgroup {} is not writable by this user (delegate it, e.g. systemd's Delegate=yes)",
            parent.display()
        ));
    }
    None
}

/// Join the sandbox's pids cgroup, as the profile asks. Root is refused
/// without one (nothing else bounds its processes); an ordinary user falls
/// back to RLIMIT_NPROC.
pub fn join_for(profile: &SandboxProfile, sandbox_dir: &Path) -> Result<()> {
    let max = profile.rlimits.pids;
    if max == 0 {
        return Ok(());
    }
    let root = nix::unistd::geteuid().is_root();
    match dir_for(&profile.name, sandbox_dir) {
        Some(dir) => {
            if let Some(parent) = dir.parent() {
                sweep(parent, &dir);
            }
            match join(&dir, max) {
                Ok(()) => Ok(()),
                Err(e) if root => Err(Error::Unsupported(format!(
                    "cannot bound processes: joining pids cgroup {} failed ({e}); RLIMIT_NPROC does not apply to root",
                    dir.display()
                ))),
                Err(_) => Ok(()),
            }
        }
        None if root => Err(Error::Unsupported(
            "cannot bound processes for root: no writable pids cgroup controller is mounted, and RLIMIT_NPROC does not apply to root; run berth as a non-root user, mount the pids controller, or set `rlimits.pids = 0` under [local] to accept no bound".into(),
        )),
        None => Ok(()),
    }
}

/// Whether any process is left in the cgroup (or below it).
fn populated(dir: &Path) -> bool {
    if let Ok(events) = std::fs::read_to_string(dir.join("cgroup.events")) {
        return events.lines().any(|l| l == "populated 1");
    }
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|p| !p.trim().is_empty())
        .unwrap_or(false)
}

/// Remove `berth-*` cgroups under `parent` whose processes have all ended
/// (other than `keep`): sandboxes whose last process ended while no berth was
/// waiting for it. A cgroup in use refuses rmdir, so this cannot hurt one.
pub fn sweep(parent: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let ours = e.file_name().to_string_lossy().starts_with(PREFIX);
        if ours && p != keep && e.file_type().is_ok_and(|t| t.is_dir()) && !populated(&p) {
            let _ = std::fs::remove_dir(&p);
        }
    }
}

/// Remove the cgroup if nothing runs in it any more. Absent or busy is fine.
pub fn remove_if_empty(dir: &Path) {
    if !populated(dir) {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Kill whatever still runs in the cgroup, wait until all of it is gone (a
/// fork bomb included: `cgroup.kill` takes new children too), then remove the
/// cgroup. Absent is fine.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if !dir.exists() {
            return Ok(());
        }
        // cgroup v2 (5.14+) kills the whole subtree at once, forks in flight too.
        if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // A pid that already exited gives ESRCH, which is fine.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("processes of the sandbox were still alive after 10s: {e}"),
                ));
            }
            // Killed processes leave the cgroup once reaped; try again shortly.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_joined_cgroup_reads_back_and_goes_away() {
        let name = format!("readback{}", std::process::id());
        let sandbox_dir = std::env::temp_dir().join(&name);
        let Some(dir) = dir_for(&name, &sandbox_dir) else {
            panic!("no pids cgroup controller: the read-back needs one (as root, or delegated)");
        };
        let r = crate::readback::in_child(
            "cgroup::tests::a_joined_cgroup_reads_back_and_goes_away",
            || {
                join(&dir, 7).unwrap();
                let max = std::fs::read_to_string(dir.join("pids.max")).unwrap();
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
                let me = std::process::id().to_string();
                format!(
                    "max={} member={}",
                    max.trim(),
                    procs.lines().any(|l| l == me)
                )
            },
        );
        r.expect_line("max=7 member=true");
        // The child has exited: nothing is left, so it can go.
        remove_if_empty(&dir);
        assert!(!dir.exists(), "{} outlived its last process", dir.display());
    }

    /// Another sandbox's sweep removes the fresh, still empty cgroup while
    /// this one joins it (#49 item 23): here a thread removes it as fast as
    /// it can, all along. Each join still ends in the cgroup; before, the
    /// join failed (ENODEV, or ENOENT after five tries) and a root sandbox
    /// refused to start.
    #[test]
    fn a_join_outlasts_sweeps_of_its_fresh_cgroup() {
        let name = format!("race{}", std::process::id());
        let sandbox_dir = std::env::temp_dir().join(&name);
        let Some(dir) = dir_for(&name, &sandbox_dir) else {
            panic!("no pids cgroup controller: the test needs one (as root, or delegated)");
        };
        let r = crate::readback::in_child(
            "cgroup::tests::a_join_outlasts_sweeps_of_its_fresh_cgroup",
            || {
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let sweeper = {
                    let (stop, dir) = (stop.clone(), dir.clone());
                    std::thread::spawn(move || {
                        let mut removed = 0u32;
                        // A sweep every 100 µs, far more often than
                        // sandboxes start: a sweeper that spins without a
                        // pause starves the joiner on a loaded 2-core
                        // machine (CI), which no wrapper's sweep does.
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            if !populated(&dir) && std::fs::remove_dir(&dir).is_ok() {
                                removed += 1;
                            }
                            std::thread::sleep(std::time::Duration::from_micros(100));
                        }
                        removed
                    })
                };
                // Threads share the process's cgroup: the first join moves
                // the whole process, so each round leaves it again first.
                let parent = dir.parent().unwrap().to_path_buf();
                let mut joined = 0;
                for _ in 0..200 {
                    if join(&dir, 64).is_ok() {
                        joined += 1;
                    }
                    std::fs::write(parent.join("cgroup.procs"), std::process::id().to_string())
                        .unwrap();
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let removed = sweeper.join().unwrap();
                format!("joined={joined} swept={}", removed > 0)
            },
        );
        r.expect_line("joined=200 swept=true");
        remove_if_empty(&dir);
    }
}
