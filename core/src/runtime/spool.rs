//! Keeping the spool dir within its bounds (a count of files and a total
//! size) without listing and stat-ing every file on every call.
//!
//! A long-lived runtime (`berth serve`) spools every call's output; a full
//! scan of a directory of 200 files per call cost a quarter of the server's
//! time for a small command. The index below is this process's view of the
//! directory: built by a full scan on first use and again every
//! [`RESCAN_EVERY`] calls, since other processes spool into the same
//! directory (each prunes by the same rule on its own calls), and kept in
//! between by adding each call's own file.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// Calls between two full scans of the directory.
const RESCAN_EVERY: u32 = 64;

#[derive(Default)]
pub(super) struct SpoolIndex {
    /// Files this process knows of, oldest first, with their lengths.
    files: VecDeque<(PathBuf, u64)>,
    used: u64,
    /// Calls since the last full scan; `None` before the first.
    since_scan: Option<u32>,
}

impl SpoolIndex {
    /// `newest` was just spooled into `dir`: remove the oldest files while
    /// more than `keep` remain or together they hold more than `cap` bytes
    /// (the newest is always kept).
    pub(super) fn prune(&mut self, dir: &Path, newest: &Path, keep: usize, cap: u64) {
        match self.since_scan {
            Some(n) if n < RESCAN_EVERY => {
                self.since_scan = Some(n + 1);
                if let Ok(m) = std::fs::metadata(newest) {
                    self.files.push_back((newest.to_path_buf(), m.len()));
                    self.used = self.used.saturating_add(m.len());
                }
            }
            _ => {
                self.scan(dir);
                self.since_scan = Some(0);
            }
        }
        while self.files.len() > keep || (self.files.len() > 1 && self.used > cap) {
            let Some((path, len)) = self.files.pop_front() else {
                break;
            };
            self.used = self.used.saturating_sub(len);
            let _ = std::fs::remove_file(path);
        }
    }

    /// Rebuild the index from the directory, oldest first by modification time.
    fn scan(&mut self, dir: &Path) {
        self.files.clear();
        self.used = 0;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf, u64)> = entries
            .flatten()
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                m.is_file()
                    .then_some(())
                    .and_then(|()| Some((m.modified().ok()?, e.path(), m.len())))
            })
            .collect();
        files.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        for (_, path, len) in files {
            self.used = self.used.saturating_add(len);
            self.files.push_back((path, len));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn the_directory_keeps_its_count_and_size_between_scans() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut idx = SpoolIndex::default();
        // Files of 10 bytes: at most 5 of them, and at most 35 bytes.
        for i in 0..20 {
            let p = dir.join(format!("f{i:02}.out"));
            std::fs::write(&p, [b'x'; 10]).unwrap();
            idx.prune(dir, &p, 5, 35);
            let left = names(dir);
            assert!(left.len() <= 3, "{left:?} after f{i:02}");
            assert!(left.contains(&format!("f{i:02}.out")), "{left:?}");
        }
        assert_eq!(names(dir), ["f17.out", "f18.out", "f19.out"]);
        // The count bound alone.
        let mut idx = SpoolIndex::default();
        for i in 20..30 {
            let p = dir.join(format!("f{i:02}.out"));
            std::fs::write(&p, [b'x'; 10]).unwrap();
            idx.prune(dir, &p, 4, u64::MAX);
        }
        assert_eq!(names(dir), ["f26.out", "f27.out", "f28.out", "f29.out"]);
        // One file over the size bound on its own is kept: it is the newest.
        let big = dir.join("g.out");
        std::fs::write(&big, vec![b'x'; 100]).unwrap();
        idx.prune(dir, &big, 4, 50);
        assert_eq!(names(dir), ["g.out"]);
    }

    #[test]
    fn files_another_process_spooled_are_counted_at_the_next_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut idx = SpoolIndex::default();
        let first = dir.join("a.out");
        std::fs::write(&first, b"x").unwrap();
        idx.prune(dir, &first, 3, u64::MAX);
        // Another process adds files this index has not seen.
        // Older by an hour: the file system's clock may not tell files
        // written within one tick apart.
        let earlier = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for i in 0..10 {
            let p = dir.join(format!("other{i}.out"));
            std::fs::write(&p, b"x").unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(earlier).unwrap();
        }
        let mut last = first;
        for i in 0..=RESCAN_EVERY {
            last = dir.join(format!("mine{i:03}.out"));
            std::fs::write(&last, b"x").unwrap();
            idx.prune(dir, &last, 3, u64::MAX);
        }
        let left = names(dir);
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(left.iter().all(|n| n.starts_with("mine")), "{left:?}");
        assert!(left.contains(&last.file_name().unwrap().to_string_lossy().into_owned()));
    }
}
