//! Bells: a change to a file wakes whoever waits on it, with no polling.
//!
//! Flow at a glance: one thread per process blocks on one inotify descriptor
//! and watches each directory someone asked about. A [`Bell`] names files of
//! one directory (`berth.db` and `berth.db-wal` for the store, `ui.json`,
//! a config file); when one of them is created, written, moved or removed,
//! the thread rings every bell that names it. A waiter then reads what
//! changed (the event log, the settings) as it did on a timer before, so a
//! ring carries no data and many rings while the waiter works make one.
//!
//! The kernel sees every writer: this process, a `BERTH_SERVER=off` call, a
//! resumed run in a process of its own. A bell that cannot be made (no
//! inotify, the directory missing) or whose directory goes away falls back
//! to its timer, so a loop on a bell is never less timely than the poll it
//! replaced; it only stops waking when nothing happens.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::watch;

/// What a watched directory's changes are: a file written, made, moved in
/// or out, or removed; and the directory itself going away.
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// One bell's names and its ringer.
struct Sub {
    names: Vec<OsString>,
    ring: watch::Sender<u64>,
}

/// The process's watcher: the inotify descriptor and, by watch, its
/// directory's bells.
struct Hub {
    fd: Inotify,
    dirs: Mutex<HashMap<WatchDescriptor, Vec<Sub>>>,
}

static HUB: LazyLock<Option<&'static Hub>> = LazyLock::new(|| {
    let fd = Inotify::init(InitFlags::IN_CLOEXEC).ok()?;
    let hub: &'static Hub = Box::leak(Box::new(Hub {
        fd,
        dirs: Mutex::new(HashMap::new()),
    }));
    std::thread::Builder::new()
        .name("berth-bell".into())
        .spawn(move || hub.listen())
        .ok()?;
    Some(hub)
});

impl Hub {
    fn listen(&self) {
        loop {
            let events = match self.fd.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EINTR) => continue,
                // The descriptor broke: every bell falls back to its timer.
                Err(_) => {
                    if let Ok(mut d) = self.dirs.lock() {
                        d.clear();
                    }
                    return;
                }
            };
            let Ok(mut dirs) = self.dirs.lock() else {
                return;
            };
            for e in events {
                if e.mask
                    .intersects(AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF)
                {
                    // The directory is gone: its bells close, and their
                    // waiters go back to their timers.
                    dirs.remove(&e.wd);
                    continue;
                }
                let Some(subs) = dirs.get_mut(&e.wd) else {
                    continue;
                };
                subs.retain(|s| !s.ring.is_closed());
                if let Some(name) = &e.name {
                    for s in subs.iter().filter(|s| s.names.contains(name)) {
                        s.ring.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
            }
        }
    }

    fn subscribe(&self, dir: &Path, names: &[&str]) -> Option<watch::Receiver<u64>> {
        // Held across the add, so the listener cannot see the watch's first
        // event before its bell is in place.
        let mut dirs = self.dirs.lock().ok()?;
        let wd = self.fd.add_watch(dir, mask()).ok()?;
        let (ring, rx) = watch::channel(0);
        let subs = dirs.entry(wd).or_default();
        subs.retain(|s| !s.ring.is_closed());
        subs.push(Sub {
            names: names.iter().map(OsString::from).collect(),
            ring,
        });
        Some(rx)
    }
}

/// A wait on files of one directory, with a timer to fall back on.
pub struct Bell {
    rx: Option<watch::Receiver<u64>>,
    fallback: Duration,
    dir: PathBuf,
    names: Vec<String>,
    settle: Duration,
}

impl Bell {
    /// A bell for `names` in `dir`. Made before the first read of what the
    /// files hold, so no change between that read and the first wait is
    /// missed. When the kernel cannot watch `dir`, the bell is a timer of
    /// `fallback`.
    pub fn files(dir: &Path, names: &[&str], fallback: Duration) -> Bell {
        let rx = HUB.and_then(|h| h.subscribe(dir, names));
        if rx.is_none() {
            tracing::debug!(dir = %dir.display(), "no inotify watch; polling instead");
        }
        Bell {
            rx,
            fallback,
            dir: dir.to_path_buf(),
            names: names.iter().map(|n| n.to_string()).collect(),
            settle: Duration::ZERO,
        }
    }

    /// After a ring, wait `settle` more and take the rings that came
    /// meanwhile with it: a burst of writes (one transaction writes the
    /// log many times) wakes the waiter once.
    pub fn settle(mut self, settle: Duration) -> Bell {
        self.settle = settle;
        self
    }

    /// A bell for the file at `path`.
    pub fn file(path: &Path, fallback: Duration) -> Bell {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        Bell::files(dir, &[name], fallback)
    }

    /// Whether a change wakes this bell (false: it is a timer).
    pub fn rings(&self) -> bool {
        self.rx.as_ref().is_some_and(|r| r.has_changed().is_ok())
    }

    /// Wait for a change, or `at_most`, whichever comes first; a bell that
    /// cannot ring waits `at_most` or its fallback, whichever is shorter,
    /// then tries to watch again. True when it rang (or just began to
    /// watch). A ring that came while nobody waited is not lost: the next
    /// wait returns at once.
    pub async fn wait(&mut self, at_most: Duration) -> bool {
        if let Some(rx) = &mut self.rx {
            tokio::select! {
                r = rx.changed() => match r {
                    Ok(()) => {
                        if !self.settle.is_zero() {
                            tokio::time::sleep(self.settle).await;
                        }
                        rx.mark_unchanged();
                        return true;
                    }
                    Err(_) => {
                        tracing::debug!(dir = %self.dir.display(), "watch ended; polling instead");
                        self.rx = None;
                    }
                },
                _ = tokio::time::sleep(at_most) => return false,
            }
        }
        tokio::time::sleep(at_most.min(self.fallback)).await;
        // The directory may be there now (a config dir made after the
        // server started): watch it from here on, and say it may have
        // changed, since nothing watched it until now.
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        if let Some(rx) = HUB.and_then(|h| h.subscribe(&self.dir, &names)) {
            self.rx = Some(rx);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_write_rings_the_bells_that_name_the_file_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = Bell::files(dir.path(), &["a.db", "a.db-wal"], Duration::from_secs(60));
        let mut other = Bell::file(&dir.path().join("ui.json"), Duration::from_secs(60));
        assert!(db.rings() && other.rings());
        std::fs::write(dir.path().join("a.db-wal"), b"x").unwrap();
        assert!(
            db.wait(Duration::from_secs(10)).await,
            "the write did not ring"
        );
        assert!(
            !other.wait(Duration::from_millis(100)).await,
            "a bell for another file rang"
        );
        // Rings while nobody waits are kept, as one.
        std::fs::write(dir.path().join("ui.json"), b"{}").unwrap();
        std::fs::rename(dir.path().join("ui.json"), dir.path().join("old.json")).unwrap();
        assert!(other.wait(Duration::from_secs(10)).await);
    }

    #[tokio::test]
    async fn a_bell_whose_directory_goes_falls_back_to_its_timer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let mut b = Bell::file(&path.join("x"), Duration::from_millis(20));
        assert!(b.rings());
        drop(dir);
        // The kernel says the directory went; the bell then closes.
        for _ in 0..100 {
            if !b.rings() {
                break;
            }
            let _ = b.wait(Duration::from_millis(100)).await;
        }
        assert!(
            !b.rings(),
            "a bell on a removed directory still claims to ring"
        );
    }

    #[tokio::test]
    async fn a_directory_made_later_is_watched_from_then_on() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("berth");
        let mut b = Bell::file(&dir.join("config.toml"), Duration::from_millis(10));
        assert!(!b.rings());
        std::fs::create_dir(&dir).unwrap();
        assert!(
            b.wait(Duration::from_secs(10)).await,
            "the new directory was not taken up"
        );
        assert!(b.rings());
        std::fs::write(dir.join("config.toml"), b"x").unwrap();
        assert!(b.wait(Duration::from_secs(10)).await);
    }

    #[tokio::test]
    async fn a_bell_that_cannot_ring_is_its_timer() {
        let mut b = Bell::file(Path::new("/nonexistent/berth/x"), Duration::from_millis(10));
        assert!(!b.rings());
        // Its fallback, not the hour asked for.
        let waited =
            tokio::time::timeout(Duration::from_secs(60), b.wait(Duration::from_secs(3600)));
        assert_eq!(waited.await.ok(), Some(false));
    }
}
