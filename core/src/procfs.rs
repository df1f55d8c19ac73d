//! Reading `/proc`: a process's `stat`, a `/proc` file whole, every pid.
//! Kept apart from [`crate::procs`] (which signals) and
//! [`crate::identity`] (which tells whose a process is) so that both can
//! read `/proc` without importing each other.

/// The fields of `/proc/PID/stat` the rules read.
pub(crate) struct Stat {
    pub(crate) state: u8,
    pub(crate) ppid: i32,
    pub(crate) sid: i32,
    /// Start time since boot, in clock ticks.
    pub(crate) start: u64,
}

pub(crate) fn stat(pid: i32) -> Option<Stat> {
    let raw = proc_file(&format!("/proc/{pid}/stat")).ok()?;
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

/// A file of `/proc` whole. Its size reads as 0, so `fs::read` would stat
/// it for nothing and then grow its buffer from 32 bytes, a read per
/// doubling: this starts at a page, which holds a `stat` or `cgroup` whole
/// and most environments, so it takes two reads (the last one finds the
/// end). The server reads several per connection (the peer check).
pub(crate) fn proc_file(path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(4096);
    std::fs::File::open(path)?.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Every pid in `/proc` now.
pub(crate) fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}
