//! `berth cp`'s progress line on stderr: bytes moved, of how many when that
//! is known, and the rate, redrawn at most five times a second. Drawn only
//! on a terminal; elsewhere the copy is quiet.

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the line is redrawn, at most.
const REDRAW: Duration = Duration::from_millis(200);

/// Bytes moved so far, and the line that shows them.
pub struct Progress {
    on: bool,
    done: AtomicU64,
    total: AtomicU64,
    start: Instant,
    drawn: Mutex<Option<Instant>>,
}

impl Progress {
    /// A counter that draws on stderr when `on`.
    pub fn new(on: bool) -> Progress {
        Progress {
            on,
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            start: Instant::now(),
            drawn: Mutex::new(None),
        }
    }

    /// A counter that never draws.
    #[cfg(test)]
    pub fn off() -> Progress {
        Progress::new(false)
    }

    /// Whether the line is drawn.
    pub fn shown(&self) -> bool {
        self.on
    }

    /// About how many bytes the copy moves, when known.
    pub fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    /// Bytes moved so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// `n` more bytes moved.
    pub fn add(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        if !self.on {
            return;
        }
        let Ok(mut drawn) = self.drawn.lock() else {
            return;
        };
        if drawn.is_some_and(|t| t.elapsed() < REDRAW) {
            return;
        }
        *drawn = Some(Instant::now());
        let total = self.total.load(Ordering::Relaxed);
        let text = line(done, (total > 0).then_some(total), self.start.elapsed());
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K{text}");
        let _ = e.flush();
    }

    /// Clear the line, if one was drawn.
    pub fn clear(&self) {
        if self.on && self.drawn.lock().is_ok_and(|d| d.is_some()) {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
        }
    }
}

/// `12.5 MiB of 40.0 MiB (31%), 25.0 MiB/s`.
pub fn line(done: u64, total: Option<u64>, elapsed: Duration) -> String {
    let mut s = size(done);
    if let Some(t) = total {
        // The stream carries headers beyond the files' bytes: never 100%
        // before the end.
        let pct = (done.saturating_mul(100) / t.max(1)).min(99);
        s.push_str(&format!(" of {} ({pct}%)", size(t)));
    }
    s.push_str(&format!(", {}", rate(done, elapsed)));
    s
}

/// `40.0 MiB/s`.
pub fn rate(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(0.001);
    format!("{}/s", size((bytes as f64 / secs) as u64))
}

/// Bytes for people: `512 B`, `1.5 KiB`, `40.0 MiB`, `2.1 GiB`.
pub fn size(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_bytes_share_and_rate() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(40 << 20), "40.0 MiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
        let l = line(10 << 20, Some(40 << 20), Duration::from_secs(2));
        assert_eq!(l, "10.0 MiB of 40.0 MiB (25%), 5.0 MiB/s");
        let l = line(41 << 20, Some(40 << 20), Duration::from_secs(1));
        assert!(l.contains("(99%)"), "{l}");
        assert_eq!(line(0, None, Duration::ZERO), "0 B, 0 B/s");
    }

    #[test]
    fn a_counter_that_is_off_counts_and_draws_nothing() {
        let p = Progress::off();
        p.add(5);
        p.add(7);
        assert_eq!(p.done(), 12);
        assert!(!p.shown());
    }
}
