//! Bounded output capture: the first and last bytes of a command's output, exact
//! counts of everything, and an optional spool of the whole for paging.
//!
//! The spool is bounded too (`yes` writes gigabytes in seconds): past its cap it
//! keeps the first half and a rolling last half. The first half goes to the
//! file as it arrives. The last half is a ring in memory, written once, in
//! order, by `finish`, with a line saying how much was left out: a ring on disk
//! would write every byte of the output to the file, each to be overwritten,
//! and need one more copy of the file to put it in order.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How much output to keep in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureLimits {
    /// Bytes kept from the start.
    pub head: usize,
    /// Bytes kept from the end.
    pub tail: usize,
}

impl Default for CaptureLimits {
    fn default() -> Self {
        Self {
            head: 32 * 1024,
            tail: 32 * 1024,
        }
    }
}

/// The largest spool file by default: its first 8 MiB and its last 8 MiB.
///
/// It bounds what one command writes to disk, and holds in memory for the
/// ring, whatever the output's size: past it, output costs a copy into the
/// ring rather than a write to the file. For 500 MB of output, 17 MB were
/// written, against 65 MB with the earlier 64 MiB cap and its ring on disk.
pub const DEFAULT_SPOOL_CAP: u64 = 16 * 1024 * 1024;

/// The largest spool cap: its last half is held in memory while the command
/// runs (see [`Capture::with_spool_cap`]).
pub const MAX_SPOOL_CAP: u64 = 256 * 1024 * 1024;

/// A live copy of output as it arrives (for a terminal), unbounded by the capture.
pub type Tee = std::sync::Arc<dyn Fn(&[u8]) + Send + Sync>;

/// A stream transform that output goes through before anything else sees it:
/// the live tee, the kept head and tail, the spool and the counts (berth's
/// redaction, so no secret reaches even the spool file). `push` may hold back
/// a tail that the next chunk completes; `finish` lets it out.
pub trait OutputFilter: Send {
    /// Transform `chunk` and return what can go on now, as two pieces in
    /// order: typically a part of `out`, an empty buffer the filter may fill,
    /// then a part of `chunk` itself that the filter changes nothing in (so
    /// large output is not copied).
    fn push<'a>(&mut self, chunk: &'a [u8], out: &'a mut Vec<u8>) -> [&'a [u8]; 2];
    /// The output has ended: append whatever was held back.
    fn finish(&mut self, out: &mut Vec<u8>);
}

/// Makes a fresh [`OutputFilter`] for each command.
pub type FilterFactory = std::sync::Arc<dyn Fn() -> Box<dyn OutputFilter> + Send + Sync>;

/// Collects a stream of output chunks within a fixed memory budget.
pub struct Capture {
    limits: CaptureLimits,
    tee: Option<Tee>,
    filter: Option<Box<dyn OutputFilter>>,
    /// The filter's output for the chunk at hand (kept to reuse its memory).
    filtered: Vec<u8>,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    /// Where to spool, until the spool is made.
    spool_path: Option<PathBuf>,
    spool: Option<Spool>,
    spool_cap: u64,
}

/// A spool file being written: the cap's first half in the file, its last
/// half in `ring`.
struct Spool {
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    /// Bytes from the start of the output that go straight to the file.
    head: u64,
    /// The last bytes past `head`, at most `ring_len`: while fewer arrived,
    /// in order; after that, byte `head + k` is at `k % ring_len`.
    ring: Vec<u8>,
    ring_len: usize,
}

impl Spool {
    /// Take `chunk`, which starts at output offset `at`.
    fn write(&mut self, at: u64, mut chunk: &[u8]) -> std::io::Result<()> {
        if at < self.head {
            let n = chunk
                .len()
                .min(usize::try_from(self.head - at).unwrap_or(usize::MAX));
            self.file.write_all(&chunk[..n])?;
            chunk = &chunk[n..];
        }
        if chunk.is_empty() {
            return Ok(());
        }
        let mut k = at.max(self.head) - self.head;
        // Only the chunk's last `ring_len` bytes can stay.
        if chunk.len() >= self.ring_len {
            k += (chunk.len() - self.ring_len) as u64;
            chunk = &chunk[chunk.len() - self.ring_len..];
            // Exact: `resize` alone may reserve up to twice what it needs.
            self.ring.reserve_exact(self.ring_len - self.ring.len());
            self.ring.resize(self.ring_len, 0);
        }
        while !chunk.is_empty() {
            // Below `ring_len`, so it fits a usize.
            let p = (k % self.ring_len as u64) as usize;
            let n = chunk.len().min(self.ring_len - p);
            if p == self.ring.len() {
                // Still filling: grow by doubling, never past `ring_len`.
                let want = (self.ring.len() + n)
                    .max(self.ring.capacity() * 2)
                    .min(self.ring_len);
                self.ring.reserve_exact(want - self.ring.len());
                self.ring.extend_from_slice(&chunk[..n]);
            } else {
                self.ring[p..p + n].copy_from_slice(&chunk[..n]);
            }
            k += n as u64;
            chunk = &chunk[n..];
        }
        Ok(())
    }

    /// Write the ring after the head, oldest byte first, with a line saying
    /// what was left out when it wrapped; `total` bytes arrived in all.
    /// Returns the file and how many bytes were left out of it.
    fn finish(mut self, total: u64) -> std::io::Result<(PathBuf, u64)> {
        let past = total.saturating_sub(self.head);
        let omitted = past.saturating_sub(self.ring_len as u64);
        if omitted > 0 {
            write!(
                self.file,
                "\n[... berth: {} of {} bytes left out of this spool (cap {} bytes) ...]\n",
                omitted,
                total,
                self.head + self.ring_len as u64
            )?;
            let oldest = (past % self.ring_len as u64) as usize;
            self.file.write_all(&self.ring[oldest..])?;
            self.file.write_all(&self.ring[..oldest])?;
        } else {
            self.file.write_all(&self.ring)?;
        }
        self.file.flush()?;
        Ok((self.path, omitted))
    }
}

impl Capture {
    /// A capture with the given limits, spooling everything to `spool` if set
    /// and if the output outgrows the limits: output kept whole needs no
    /// spool, so the file is made only when the first byte would be left out
    /// (head and tail still hold all of it then, and go in first).
    pub fn new(limits: CaptureLimits, spool: Option<PathBuf>) -> Result<Self> {
        Ok(Self {
            limits,
            tee: None,
            filter: None,
            filtered: Vec::new(),
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            spool_path: spool,
            spool: None,
            spool_cap: DEFAULT_SPOOL_CAP,
        })
    }

    /// Make the spool file and write all the output so far into it: what head
    /// and tail hold, which is all of it while nothing has been left out.
    fn open_spool(&mut self, path: PathBuf) -> Result<()> {
        if let Some(parent) = path.parent() {
            crate::store::private_dir(parent)
                .map_err(|e| Error::io("creating spool directory", parent, e))?;
        }
        // Output can hold anything a command printed: this user's only.
        let f = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true),
            0o600,
        )
        .open(&path)
        .map_err(|e| Error::io("creating spool file", &path, e))?;
        let head = self.spool_cap / 2;
        let mut spool = Spool {
            path,
            file: std::io::BufWriter::with_capacity(64 * 1024, f),
            head,
            ring: Vec::new(),
            // The cap is at most MAX_SPOOL_CAP, so its half fits a usize.
            ring_len: usize::try_from(self.spool_cap - head).unwrap_or(usize::MAX),
        };
        let (tail_a, tail_b) = self.tail.as_slices();
        let mut at = 0u64;
        for part in [&self.head[..], tail_a, tail_b] {
            spool
                .write(at, part)
                .map_err(|e| Error::io("writing output spool", &spool.path, e))?;
            at += part.len() as u64;
        }
        debug_assert_eq!(at, self.total);
        self.spool = Some(spool);
        Ok(())
    }

    /// Keep at most `cap` bytes of output in the spool file, at least 2 and
    /// at most [`MAX_SPOOL_CAP`]: its first half is written as it arrives,
    /// its last half is held in memory until the output ends.
    pub fn with_spool_cap(mut self, cap: u64) -> Self {
        self.spool_cap = cap.clamp(2, MAX_SPOOL_CAP);
        self
    }

    /// Also hand every chunk to `tee` as it arrives.
    pub fn with_tee(mut self, tee: Option<Tee>) -> Self {
        self.tee = tee;
        self
    }

    /// Pass every chunk through `filter` first.
    pub fn with_filter(mut self, filter: Option<Box<dyn OutputFilter>>) -> Self {
        self.filter = filter;
        self
    }

    /// Take one chunk of output.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        let Some(filter) = self.filter.as_mut() else {
            return self.accept(chunk);
        };
        let mut out = std::mem::take(&mut self.filtered);
        out.clear();
        let [first, second] = filter.push(chunk, &mut out);
        let r = self.accept(first).and_then(|()| self.accept(second));
        self.filtered = out;
        r
    }

    /// Take one chunk of output as it will be shown.
    fn accept(&mut self, mut chunk: &[u8]) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        if let Some(tee) = &self.tee {
            tee(chunk);
        }
        let at = self.total;
        let kept = (self.limits.head + self.limits.tail) as u64;
        if at + chunk.len() as u64 > kept
            && let Some(path) = self.spool_path.take()
        {
            self.open_spool(path)?;
        }
        self.total += chunk.len() as u64;
        if let Some(spool) = &mut self.spool
            && let Err(e) = spool.write(at, chunk)
        {
            let path = spool.path.clone();
            self.spool = None;
            return Err(Error::io("writing output spool", path, e));
        }
        let room = self.limits.head.saturating_sub(self.head.len());
        if room > 0 {
            let n = room.min(chunk.len());
            self.head.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
        }
        if self.limits.tail == 0 || chunk.is_empty() {
            return Ok(());
        }
        if chunk.len() >= self.limits.tail {
            self.tail.clear();
            self.tail.extend(&chunk[chunk.len() - self.limits.tail..]);
        } else {
            let overflow = (self.tail.len() + chunk.len()).saturating_sub(self.limits.tail);
            self.tail.drain(..overflow);
            self.tail.extend(chunk);
        }
        Ok(())
    }

    /// Finish: flush the spool and return what was kept.
    pub fn finish(mut self) -> Result<Output> {
        if let Some(mut filter) = self.filter.take() {
            let mut rest = Vec::new();
            filter.finish(&mut rest);
            self.accept(&rest)?;
        }
        let (spool, spool_omitted) = match self.spool.take() {
            Some(spool) => {
                let path = spool.path.clone();
                let (file, omitted) = spool
                    .finish(self.total)
                    .map_err(|e| Error::io("writing output spool", path, e))?;
                (Some(file), omitted)
            }
            None => (None, 0),
        };
        let tail: Vec<u8> = self.tail.into_iter().collect();
        let kept = (self.head.len() + tail.len()) as u64;
        Ok(Output {
            head: self.head,
            tail,
            total_bytes: self.total,
            omitted_bytes: self.total.saturating_sub(kept),
            spool_omitted,
            spool,
        })
    }
}

/// A command's output as captured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// The first bytes.
    pub head: Vec<u8>,
    /// The last bytes (empty when everything fit in `head`).
    pub tail: Vec<u8>,
    /// Every byte the command wrote.
    pub total_bytes: u64,
    /// Bytes between head and tail that were not kept.
    pub omitted_bytes: u64,
    /// Where the output was spooled, if it was.
    pub spool: Option<PathBuf>,
    /// Bytes the spool left out, past its cap: it keeps the first and last
    /// halves, with a line between them saying so.
    pub spool_omitted: u64,
}

impl Output {
    /// True when bytes were left out.
    pub fn truncated(&self) -> bool {
        self.omitted_bytes > 0
    }

    /// The kept bytes, with an elision marker where bytes were left out.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        if self.truncated() {
            let marker = format!(
                "\n[... berth: {} of {} bytes omitted ...]\n",
                self.omitted_bytes, self.total_bytes
            );
            out.extend_from_slice(marker.as_bytes());
        }
        out.extend_from_slice(&self.tail);
        out
    }

    /// The kept output for display: invalid UTF-8 replaced, elision marked.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }
}

/// Remove ANSI escape sequences, for text shown to a model: CSI (colours,
/// cursor moves), OSC (titles, links; ended by BEL or ST), DCS, SOS/PM/APC
/// strings and the other escapes, intermediates included (`ESC ( B`). Text
/// and the control characters it carries (newline, CR, tab, ...) stay.
///
/// The parsing is `vte`'s, the state machine of the DEC parser that the
/// screen emulator ([`vt100`]) runs on, so what this removes is what a
/// terminal would have taken as a sequence, not the subset a hand-written
/// scanner knows.
pub fn strip_ansi(s: &str) -> String {
    /// Keeps what a terminal would show or execute, drops every sequence.
    struct Text(String);

    impl vte::Perform for Text {
        fn print(&mut self, c: char) {
            self.0.push(c);
        }

        fn execute(&mut self, byte: u8) {
            // C0 controls and, from text, the C1 code points U+0080..U+009F.
            self.0.push(char::from(byte));
        }
    }

    let mut text = Text(String::with_capacity(s.len()));
    vte::Parser::new().advance(&mut text, s.as_bytes());
    text.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_head_and_tail_with_exact_counts() -> Result<()> {
        let mut c = Capture::new(CaptureLimits { head: 4, tail: 3 }, None)?;
        c.push(b"abcdefg")?;
        c.push(b"hij")?;
        let out = c.finish()?;
        assert_eq!(out.head, b"abcd");
        assert_eq!(out.tail, b"hij");
        assert_eq!(out.total_bytes, 10);
        assert_eq!(out.omitted_bytes, 3);
        assert!(out.text().contains("3 of 10 bytes omitted"));
        Ok(())
    }

    #[test]
    fn small_output_is_whole() -> Result<()> {
        let mut c = Capture::new(CaptureLimits { head: 8, tail: 8 }, None)?;
        c.push(b"hi\n")?;
        let out = c.finish()?;
        assert!(!out.truncated());
        assert_eq!(out.text(), "hi\n");
        Ok(())
    }

    #[test]
    fn tail_spans_many_small_chunks() -> Result<()> {
        let mut c = Capture::new(CaptureLimits { head: 2, tail: 5 }, None)?;
        for b in b"0123456789" {
            c.push(&[*b])?;
        }
        let out = c.finish()?;
        assert_eq!(out.head, b"01");
        assert_eq!(out.tail, b"56789");
        assert_eq!(out.omitted_bytes, 3);
        Ok(())
    }

    #[test]
    fn invalid_utf8_is_replaced_for_display_only() -> Result<()> {
        let mut c = Capture::new(CaptureLimits::default(), None)?;
        c.push(&[0xff, b'a'])?;
        let out = c.finish()?;
        assert_eq!(out.bytes(), vec![0xff, b'a']);
        assert_eq!(out.text(), "\u{fffd}a");
        Ok(())
    }

    #[test]
    fn output_kept_whole_makes_no_spool_and_more_spools_all_of_it() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", "/tmp", e))?;
        let path = dir.path().join("s.out");
        let limits = CaptureLimits { head: 4, tail: 4 };
        // Eight bytes fit the capture: no file, and the report names none.
        let mut c = Capture::new(limits, Some(path.clone()))?;
        c.push(b"0123")?;
        c.push(b"4567")?;
        let out = c.finish()?;
        assert_eq!(out.spool, None);
        assert!(!path.exists());
        assert_eq!(out.bytes(), b"01234567");
        // One byte more, arriving in the middle of a chunk or as a chunk of
        // its own, and the spool holds every byte in order, the first ones
        // included.
        let data: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for step in [1, 3, 5, 9, 40] {
            let _ = std::fs::remove_file(&path);
            let mut c = Capture::new(limits, Some(path.clone()))?;
            for part in data.chunks(step) {
                c.push(part)?;
            }
            let out = c.finish()?;
            assert_eq!(out.spool.as_deref(), Some(path.as_path()), "step {step}");
            assert_eq!(
                std::fs::read(&path).unwrap_or_default(),
                data,
                "step {step}"
            );
            assert_eq!(out.omitted_bytes, 32);
        }
        Ok(())
    }

    #[test]
    fn the_spool_keeps_its_head_and_a_rolling_tail() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", "/tmp", e))?;
        let path = dir.path().join("s.out");
        // Under the cap: the whole output, as is.
        let small = CaptureLimits { head: 2, tail: 2 };
        let mut c = Capture::new(small, Some(path.clone()))?.with_spool_cap(10);
        c.push(b"0123456789")?;
        let out = c.finish()?;
        assert_eq!(out.spool_omitted, 0);
        assert_eq!(std::fs::read(&path).unwrap_or_default(), b"0123456789");
        // Over it, in chunks that wrap the ring more than once.
        let data: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        for step in [1, 3, 7, 100] {
            let mut c = Capture::new(small, Some(path.clone()))?.with_spool_cap(10);
            for part in data.chunks(step) {
                c.push(part)?;
            }
            let out = c.finish()?;
            assert_eq!(out.spool_omitted, 90);
            let got = std::fs::read(&path).unwrap_or_default();
            let text = String::from_utf8_lossy(&got);
            assert!(got.starts_with(&data[..5]), "{text}");
            assert!(got.ends_with(&data[95..]), "{text}");
            assert!(text.contains("90 of 100 bytes left out"), "{text}");
        }
        Ok(())
    }

    /// What a spool capped at `cap` must hold after `data`.
    fn expected_spool(data: &[u8], cap: usize) -> Vec<u8> {
        if data.len() <= cap {
            return data.to_vec();
        }
        let head = cap / 2;
        let mut want = data[..head].to_vec();
        want.extend_from_slice(
            format!(
                "\n[... berth: {} of {} bytes left out of this spool (cap {} bytes) ...]\n",
                data.len() - cap,
                data.len(),
                cap
            )
            .as_bytes(),
        );
        want.extend_from_slice(&data[data.len() - (cap - head)..]);
        want
    }

    #[test]
    fn the_spools_last_half_stays_in_memory_until_the_end() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", "/tmp", e))?;
        let path = dir.path().join("s.out");
        let limits = CaptureLimits { head: 4, tail: 4 };
        let cap = 1 << 20;
        // 8 MiB that is not periodic in the ring's length, so a byte in the
        // wrong place shows.
        let data: Vec<u8> = (0..8u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        // Chunks smaller than the ring, larger than it, and ones that
        // straddle the head's end; totals under, at and over the cap.
        // Cuts: uniform chunks of `step`, or (step 0) a ring partly filled
        // and then a chunk longer than it.
        for (step, len) in [
            (0, data.len()),
            (64 * 1024, data.len()),
            (3 * 1024 * 1024, data.len()),
            (300_001, data.len()),
            (7, 600_000),
            (100_000, cap),
            (100_000, cap + 1),
            (cap, 3 * cap),
        ] {
            let data = &data[..len];
            let mut c = Capture::new(limits, Some(path.clone()))?.with_spool_cap(cap as u64);
            let cuts: Vec<&[u8]> = match step {
                0 => vec![&data[..cap / 2 + 300_000], &data[cap / 2 + 300_000..]],
                _ => data.chunks(step).collect(),
            };
            for part in cuts {
                c.push(part)?;
                let spool = c.spool.as_ref().map(|s| (s.ring.capacity(), s.ring_len));
                if let Some((held, ring_len)) = spool {
                    assert!(held <= ring_len, "step {step}: ring of {held} bytes");
                }
            }
            // Nothing past the head reached the file before the end: no
            // byte of the output was written to be overwritten.
            let written = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            assert!(written <= (cap / 2) as u64, "step {step}: {written} bytes");
            let out = c.finish()?;
            assert_eq!(out.spool_omitted, len.saturating_sub(cap) as u64);
            let got = std::fs::read(&path).unwrap_or_default();
            assert!(
                got == expected_spool(data, cap),
                "step {step}, {len} bytes: the spool differs"
            );
        }
        // A cap past the largest is held to it.
        let c = Capture::new(limits, None)?.with_spool_cap(u64::MAX);
        assert_eq!(c.spool_cap, MAX_SPOOL_CAP);
        Ok(())
    }

    #[test]
    fn strips_ansi() {
        assert_eq!(strip_ansi("\u{1b}[31mred\u{1b}[0m ok"), "red ok");
        assert_eq!(strip_ansi("\u{1b}]0;title\u{7}x"), "x");
    }

    #[test]
    fn strips_csi_with_parameters_and_private_marks() {
        // Bold green, a cursor move, clear to the end of line, hide the cursor.
        let s = "\u{1b}[1;32mok\u{1b}[2;10H\u{1b}[K done\u{1b}[?25l";
        assert_eq!(strip_ansi(s), "ok done");
    }

    #[test]
    fn strips_osc_ended_by_bel_or_by_st() {
        // A window title ended by BEL, a hyperlink ended by ST (ESC \).
        assert_eq!(strip_ansi("a\u{1b}]2;build\u{7}b"), "ab");
        let link = "see \u{1b}]8;;https://example.com\u{1b}\\here\u{1b}]8;;\u{1b}\\ now";
        assert_eq!(strip_ansi(link), "see here now");
    }

    #[test]
    fn strips_escapes_with_intermediates_and_dcs() {
        // `tput sgr0` on xterm: a charset designation, then a reset.
        assert_eq!(strip_ansi("x\u{1b}(B\u{1b}[my"), "xy");
        // Keypad mode, then a DCS string ended by ST.
        assert_eq!(strip_ansi("\u{1b}=a\u{1b}Pq#0;2;0;0;0\u{1b}\\b"), "ab");
    }

    #[test]
    fn a_lone_esc_goes_and_text_stays() {
        assert_eq!(strip_ansi("end\u{1b}"), "end");
        assert_eq!(strip_ansi("\u{1b}"), "");
        // ESC and the one character it escapes.
        assert_eq!(strip_ansi("a\u{1b}7b"), "ab");
        assert_eq!(strip_ansi(""), "");
        assert_eq!(strip_ansi("plain text"), "plain text");
    }

    #[test]
    fn keeps_utf8_and_control_characters_around_escapes() {
        let s = "héllo \u{1b}[31m→ wörld ✓\u{1b}[0m 日本\r\n\tnext";
        assert_eq!(strip_ansi(s), "héllo → wörld ✓ 日本\r\n\tnext");
        // An unfinished sequence at the end is dropped, not shown half.
        assert_eq!(strip_ansi("ok \u{1b}[3"), "ok ");
        assert_eq!(strip_ansi("ok \u{1b}]0;tit"), "ok ");
    }
}
