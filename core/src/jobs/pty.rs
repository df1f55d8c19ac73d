//! Terminal jobs: the keys a person would press, and the screen a terminal
//! would show for a job's raw output.
//!
//! A terminal job's log is the byte stream its terminal received. The screen
//! is that stream run through a VT100/xterm emulator ([`vt100`]) at the sizes
//! the terminal had, changed at the output offsets where each resize took
//! effect (the job's `sizes` file), so a screen rendered at any later time is
//! the one a terminal attached all along would show.

use serde::Serialize;

use crate::backend::TermSize;
use crate::error::{Error, Result};

/// The bytes a terminal sends for a key, by tmux's names: `Enter`, `Tab`,
/// `Escape`, `BSpace`, `Space`, `Up`, `Down`, `Left`, `Right`, `Home`, `End`,
/// `PageUp`/`PPage`, `PageDown`/`NPage`, `Insert`/`IC`, `Delete`/`DC`,
/// `F1`..`F12`, `C-x` (control), `M-x` (meta: Escape then the key), and any
/// single character as itself. Names are case-insensitive.
pub fn key_bytes(name: &str) -> Result<Vec<u8>> {
    let bad = |why: &str| {
        Error::InvalidInput(format!(
            "unknown key {name:?}{why}: use a name such as Enter, Tab, Escape, BSpace, Up, \
             Down, Left, Right, Home, End, PageUp, PageDown, Delete, F1..F12, C-c (control) \
             or M-x (meta), or a single character"
        ))
    };
    if let Some(rest) = name.strip_prefix("M-").or_else(|| name.strip_prefix("m-")) {
        if rest.is_empty() {
            return Err(bad(""));
        }
        let mut out = vec![0x1b];
        out.extend(key_bytes(rest)?);
        return Ok(out);
    }
    if let Some(rest) = name.strip_prefix("C-").or_else(|| name.strip_prefix("c-")) {
        let mut chars = rest.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            return Err(bad(" (C- takes one character, e.g. C-c)"));
        };
        let b = match c.to_ascii_lowercase() {
            c @ 'a'..='z' => c as u8 - b'a' + 1,
            '@' | ' ' | '2' => 0,
            '[' | '3' => 0x1b,
            '\\' | '4' => 0x1c,
            ']' | '5' => 0x1d,
            '^' | '6' => 0x1e,
            '_' | '7' | '/' => 0x1f,
            '?' | '8' => 0x7f,
            _ => return Err(bad(" (no control code for that character)")),
        };
        return Ok(vec![b]);
    }
    let mut chars = name.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        return Ok(c.to_string().into_bytes());
    }
    let seq: &[u8] = match name.to_ascii_lowercase().as_str() {
        "enter" | "return" | "cr" => b"\r",
        "tab" => b"\t",
        "btab" | "backtab" => b"\x1b[Z",
        "escape" | "esc" => b"\x1b",
        "bspace" | "backspace" => b"\x7f",
        "space" => b" ",
        "up" => b"\x1b[A",
        "down" => b"\x1b[B",
        "right" => b"\x1b[C",
        "left" => b"\x1b[D",
        "home" => b"\x1b[H",
        "end" => b"\x1b[F",
        "pageup" | "ppage" | "pgup" => b"\x1b[5~",
        "pagedown" | "npage" | "pgdn" => b"\x1b[6~",
        "insert" | "ic" => b"\x1b[2~",
        "delete" | "dc" => b"\x1b[3~",
        "f1" => b"\x1bOP",
        "f2" => b"\x1bOQ",
        "f3" => b"\x1bOR",
        "f4" => b"\x1bOS",
        "f5" => b"\x1b[15~",
        "f6" => b"\x1b[17~",
        "f7" => b"\x1b[18~",
        "f8" => b"\x1b[19~",
        "f9" => b"\x1b[20~",
        "f10" => b"\x1b[21~",
        "f11" => b"\x1b[23~",
        "f12" => b"\x1b[24~",
        _ => return Err(bad("")),
    };
    Ok(seq.to_vec())
}

/// The bytes of several keys, in order.
pub fn keys_bytes<S: AsRef<str>>(names: &[S]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for n in names {
        out.extend(key_bytes(n.as_ref())?);
    }
    Ok(out)
}

/// The bytes of several keys for a job that reads them from a terminal
/// (`terminal`) or from a pipe: a terminal's Enter is `\r`, which its line
/// discipline turns into the newline a program reads; a pipe has no line
/// discipline, so there Enter is `\n` itself (a program reading a line would
/// otherwise get `alice\r`).
pub fn keys_bytes_for<S: AsRef<str>>(names: &[S], terminal: bool) -> Result<Vec<u8>> {
    if terminal {
        return keys_bytes(names);
    }
    let mut out = Vec::new();
    for n in names {
        match n.as_ref().to_ascii_lowercase().as_str() {
            "enter" | "return" => out.push(b'\n'),
            _ => out.extend(key_bytes(n.as_ref())?),
        }
    }
    Ok(out)
}

/// Where the terminal's size changed: from output offset `at` on, `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeChange {
    /// Output offset the size took effect at.
    pub at: u64,
    /// The size from there on.
    pub size: TermSize,
}

/// Parse a job's `sizes` file: one `OFFSET COLS ROWS` line per size. Lines
/// that do not parse (a write cut short) are skipped.
pub fn parse_sizes(text: &str) -> Vec<SizeChange> {
    let mut out: Vec<SizeChange> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let at = it.next()?.parse().ok()?;
            let cols: u16 = it.next()?.parse().ok()?;
            let rows: u16 = it.next()?.parse().ok()?;
            (cols > 0 && rows > 0).then_some(SizeChange {
                at,
                size: TermSize { cols, rows },
            })
        })
        .collect();
    out.sort_by_key(|c| c.at);
    out
}

/// A terminal job's screen, as a person looking at the terminal would see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Screen {
    /// The terminal's size.
    pub cols: u16,
    /// The terminal's size.
    pub rows: u16,
    /// Each row's text, trailing blanks trimmed.
    pub lines: Vec<String>,
    /// The cursor: row and column, counting from 0.
    pub cursor_row: u16,
    /// The cursor: row and column, counting from 0.
    pub cursor_col: u16,
    /// Whether the program has hidden the cursor.
    pub cursor_hidden: bool,
    /// Whether a full-screen program (the alternate screen) is showing.
    pub alternate_screen: bool,
    /// The output offset the screen was rendered up to.
    pub offset: u64,
}

impl Screen {
    /// `80x24, cursor at row 3 column 5`, counting from 1, and whether a
    /// full-screen program is showing.
    pub fn summary(&self) -> String {
        format!(
            "{}x{}, cursor at row {} column {}{}",
            self.cols,
            self.rows,
            self.cursor_row + 1,
            self.cursor_col + 1,
            if self.alternate_screen {
                " (a full-screen program is showing)"
            } else {
                ""
            }
        )
    }

    /// The rows as text, blank rows at the bottom left out.
    pub fn text(&self) -> String {
        let last = self
            .lines
            .iter()
            .rposition(|l| !l.is_empty())
            .map_or(0, |i| i + 1);
        let mut s = self.lines[..last].join("\n");
        if last > 0 {
            s.push('\n');
        }
        s
    }
}

/// A VT100/xterm emulator fed with a job's output, following its resizes.
pub struct Emulator {
    parser: vt100::Parser,
    sizes: Vec<SizeChange>,
    /// The output offset of the next byte to feed.
    offset: u64,
}

fn nz(n: u16) -> std::num::NonZeroU16 {
    std::num::NonZeroU16::new(n.max(1)).unwrap_or(std::num::NonZeroU16::MIN)
}

impl Emulator {
    /// An emulator whose input starts at output offset `start` (0 unless the
    /// log's head was skipped), with the terminal's size history.
    pub fn new(sizes: Vec<SizeChange>, start: u64) -> Emulator {
        let first = sizes
            .iter()
            .rev()
            .find(|c| c.at <= start)
            .or(sizes.first())
            .map(|c| c.size)
            .unwrap_or_default();
        Emulator {
            parser: vt100::Parser::new(nz(first.rows), nz(first.cols), 0),
            sizes,
            offset: start,
        }
    }

    /// Feed the next bytes of output, applying each resize at its offset.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = self.offset + bytes.len() as u64;
            let next = self
                .sizes
                .iter()
                .find(|c| c.at > self.offset && c.at < end)
                .copied();
            let n = match next {
                Some(c) => (c.at - self.offset) as usize,
                None => bytes.len(),
            };
            self.parser.process(&bytes[..n]);
            self.offset += n as u64;
            bytes = &bytes[n..];
            if let Some(c) = next {
                self.parser.set_size(nz(c.size.rows), nz(c.size.cols));
            }
        }
        // A resize recorded at the very end of the output (nothing printed since).
        if let Some(c) = self.sizes.iter().rev().find(|c| c.at <= self.offset) {
            let (rows, cols) = self.parser.screen().size();
            if (rows.get(), cols.get()) != (c.size.rows, c.size.cols) {
                self.parser.set_size(nz(c.size.rows), nz(c.size.cols));
            }
        }
    }

    /// The screen now.
    pub fn screen(&self) -> Screen {
        let s = self.parser.screen();
        let (rows, cols) = s.size();
        let (cr, cc) = s.cursor_position();
        Screen {
            cols: cols.get(),
            rows: rows.get(),
            lines: s
                .rows(0, cols.get())
                .map(|r| r.trim_end().to_string())
                .collect(),
            cursor_row: cr,
            cursor_col: cc,
            cursor_hidden: s.hide_cursor(),
            alternate_screen: s.alternate_screen(),
            offset: self.offset,
        }
    }

    /// The bytes that draw the screen as it is now on a terminal of the same
    /// size, colours and cursor included (for `berth attach`).
    pub fn redraw(&self) -> Vec<u8> {
        let s = self.parser.screen();
        let mut out = Vec::new();
        if s.alternate_screen() {
            out.extend_from_slice(b"\x1b[?1049h");
        }
        out.extend(s.contents_formatted().into_bytes());
        out.extend(s.input_mode_formatted().into_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_by_name() -> Result<()> {
        assert_eq!(key_bytes("C-c")?, vec![3]);
        assert_eq!(key_bytes("c-D")?, vec![4]);
        assert_eq!(key_bytes("Enter")?, b"\r".to_vec());
        assert_eq!(key_bytes("up")?, b"\x1b[A".to_vec());
        assert_eq!(key_bytes("M-x")?, b"\x1bx".to_vec());
        assert_eq!(key_bytes("q")?, b"q".to_vec());
        assert_eq!(key_bytes("é")?, "é".as_bytes().to_vec());
        assert_eq!(keys_bytes(&[":", "q", "Enter"])?, b":q\r".to_vec());
        let e = key_bytes("C-cc")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("C- takes one character"), "{e}");
        let e = key_bytes("Hyper")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("unknown key \"Hyper\""), "{e}");
        Ok(())
    }

    #[test]
    fn sizes_parse_and_skip_torn_lines() {
        let s = parse_sizes("0 80 24\n120 100 30\n5 10\n");
        assert_eq!(
            s,
            vec![
                SizeChange {
                    at: 0,
                    size: TermSize { cols: 80, rows: 24 }
                },
                SizeChange {
                    at: 120,
                    size: TermSize {
                        cols: 100,
                        rows: 30
                    }
                },
            ]
        );
    }

    #[test]
    fn the_screen_follows_cursor_moves_and_resizes_at_their_offsets() {
        let sizes = parse_sizes("0 20 5\n12 10 3\n");
        let mut e = Emulator::new(sizes, 0);
        // Twelve bytes at 20 columns, then the resize, then more.
        e.feed(b"hello\r\nworld");
        e.feed(b"\x1b[2J\x1b[1;1Habcdefghijkl");
        let s = e.screen();
        assert_eq!((s.cols, s.rows), (10, 3));
        // At 10 columns the 12 letters wrap.
        assert_eq!(s.lines, vec!["abcdefghij", "kl", ""]);
        assert_eq!((s.cursor_row, s.cursor_col), (1, 2));
        assert_eq!(s.text(), "abcdefghij\nkl\n");
        assert_eq!(s.offset, 12 + 10 + 12);
    }

    #[test]
    fn a_full_screen_program_and_its_exit() {
        let mut e = Emulator::new(parse_sizes("0 30 4\n"), 0);
        e.feed(b"$ less f\r\n\x1b[?1049h\x1b[H\x1b[2Jline 1\r\nline 2\r\n:");
        let s = e.screen();
        assert!(s.alternate_screen);
        assert_eq!(s.text(), "line 1\nline 2\n:\n");
        e.feed(b"\x1b[?1049l$ ");
        let s = e.screen();
        assert!(!s.alternate_screen);
        assert_eq!(s.lines[0], "$ less f");
    }
}
