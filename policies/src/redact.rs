//! Secret redaction for output and event text.
//!
//! A [`Redactor`] is built once from berth's environment (the values of
//! variables whose names look secret) and a fixed set of token shapes, then
//! applied to every piece of output and every event. One pass per shape finds
//! match ranges in the original text; overlapping ranges are merged and the text
//! is rebuilt once, so clean text is returned without copying.

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use regex::bytes::Regex;

/// Name fragments that mark a variable's value as secret.
pub const SECRET_NAME_PARTS: &[&str] = &[
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
    "API",
];

/// Name endings that hold locations, not secrets.
const NOT_SECRET_SUFFIXES: &[&str] = &[
    "_SOCK", "_PATH", "_FILE", "_DIR", "_HOST", "_PORT", "_REGION",
];

/// Bytes [`Redactor::redact_stream`] holds back between reads, so a secret
/// split across two reads is still caught.
pub const STREAM_OVERLAP: usize = 64 * 1024;

/// The first prefix of a chunk that [`RedactStream::push_borrowed`] settles a
/// held tail on (copied); each next one is twice as long.
const SETTLE_STEP: usize = 4096;

/// Values shorter than this are not treated as secrets (too many false hits).
pub const MIN_SECRET_LEN: usize = 8;

/// Whether a variable with this name holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let up = name.to_ascii_uppercase();
    SECRET_NAME_PARTS.iter().any(|p| up.contains(p))
        && !NOT_SECRET_SUFFIXES.iter().any(|s| up.ends_with(s))
}

struct Shape {
    kind: &'static str,
    re: Regex,
    /// The capture group holding the secret (0: the whole match).
    group: usize,
    /// The pattern begins with `\b`: it cannot match at the start of a
    /// piece of a stream whose previous byte is a word byte (see
    /// [`Redactor::ranges_of`]).
    word_start: bool,
}

/// Finds and masks secrets in text.
pub struct Redactor {
    literals: Option<AhoCorasick>,
    literal_names: Vec<String>,
    /// The known values themselves, for [`RedactStream`]'s hold-back.
    literal_values: Vec<Vec<u8>>,
    shapes: Vec<Shape>,
    /// How each shape begins (see [`INTROS`]), ASCII case-insensitive.
    intros: Option<AhoCorasick>,
    /// For one question only, is any shape's intro anywhere: the intros of
    /// the case-sensitive shapes, exactly. The regex engine finds a small set
    /// of exact literals with a SIMD search (Teddy), which neither the
    /// overlapping automaton nor a case-insensitive pattern can use, so output
    /// with no intro at all (most of it) costs one fast pass. The two
    /// case-insensitive shapes are found by their punctuation (see [`FOLDED`]).
    any_intro: Option<regex::bytes::Regex>,
}

/// The intros of the shapes whose patterns ignore case, and the offset of
/// the one byte in each that has no case: a search for that byte, then a
/// case-blind comparison around it, finds them without a case-folding pass.
const FOLDED: &[(&str, usize)] = &[("aws_secret_access_key", 3), ("authorization:", 13)];

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("values", &self.literal_names)
            .field(
                "shapes",
                &self.shapes.iter().map(|s| s.kind).collect::<Vec<_>>(),
            )
            .finish()
    }
}

const SHAPES: &[(&str, &str, usize)] = &[
    (
        "private-key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----",
        0,
    ),
    ("anthropic-key", r"sk-ant-[A-Za-z0-9_\-]{20,}", 0),
    (
        "openai-key",
        r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
        0,
    ),
    (
        "github-token",
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",
        0,
    ),
    ("github-token", r"\bgithub_pat_[A-Za-z0-9_]{20,}", 0),
    ("aws-access-key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", 0),
    (
        "aws-secret-key",
        r#"(?i)aws_secret_access_key["']?\s*[=:]\s*["']?([A-Za-z0-9/+=]{40})"#,
        1,
    ),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}", 0),
    (
        "bearer-token",
        r"(?i)authorization:\s*bearer\s+([A-Za-z0-9._~+/=\-]{8,})",
        1,
    ),
    ("google-api-key", r"\bAIza[0-9A-Za-z_\-]{35}", 0),
];

/// Where a match can end for a shape that has begun.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// At the first blank: tokens have none.
    Word,
    /// At the end of the line.
    Line,
    /// At the block's `-----END`.
    Block,
}

/// The literal text each shape in [`SHAPES`] begins with. A tail of a stream
/// that holds one of these, still open, or that ends with part of one, may yet
/// become a secret, and [`RedactStream`] holds it back.
const INTROS: &[(&str, Reach, &[usize])] = &[
    // (intro, where its match ends, the SHAPES it begins, by index)
    ("-----BEGIN", Reach::Block, &[0]),
    ("sk-", Reach::Word, &[1, 2]),
    ("ghp_", Reach::Word, &[3]),
    ("gho_", Reach::Word, &[3]),
    ("ghu_", Reach::Word, &[3]),
    ("ghs_", Reach::Word, &[3]),
    ("ghr_", Reach::Word, &[3]),
    ("github_pat_", Reach::Word, &[4]),
    ("AKIA", Reach::Word, &[5]),
    ("ASIA", Reach::Word, &[5]),
    ("aws_secret_access_key", Reach::Line, &[6]),
    ("xox", Reach::Word, &[7]),
    ("authorization:", Reach::Line, &[8]),
    ("AIza", Reach::Word, &[9]),
];

impl Redactor {
    /// A redactor for the secret values in `vars` (by name) plus the token shapes.
    pub fn from_env<I>(vars: I) -> Self
    where
        I: IntoIterator<Item = (String, String)>,
    {
        Self::with_values(
            vars.into_iter()
                .filter(|(k, v)| is_secret_name(k) && v.len() >= MIN_SECRET_LEN),
        )
    }

    /// A redactor for these (label, value) secrets plus the token shapes.
    pub fn with_values<I>(values: I) -> Self
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut pairs: Vec<(String, String)> = values
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_SECRET_LEN)
            .collect();
        pairs.sort_by_key(|p| std::cmp::Reverse(p.1.len()));
        pairs.dedup_by(|a, b| a.1 == b.1);
        let literals = if pairs.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .kind(Some(AhoCorasickKind::DFA))
                .match_kind(MatchKind::LeftmostLongest)
                .build(pairs.iter().map(|(_, v)| v.as_bytes()))
                .ok()
        };
        let shapes = SHAPES
            .iter()
            .filter_map(|(kind, re, group)| {
                Regex::new(re).ok().map(|compiled| Shape {
                    kind,
                    re: compiled,
                    group: *group,
                    word_start: re.starts_with(r"\b"),
                })
            })
            .collect();
        let intros = AhoCorasick::builder()
            .kind(Some(AhoCorasickKind::DFA))
            .ascii_case_insensitive(true)
            // Standard: every intro is found, overlapping ones too (an intro
            // hidden inside another must still wake its shape).
            .match_kind(MatchKind::Standard)
            .build(INTROS.iter().map(|(i, _, _)| i.as_bytes()))
            .ok();
        let alternation: Vec<String> = INTROS
            .iter()
            .filter(|(i, _, _)| !FOLDED.iter().any(|(f, _)| f == i))
            .map(|(i, _, _)| regex::escape(i))
            .collect();
        let any_intro = regex::bytes::RegexBuilder::new(&alternation.join("|"))
            .unicode(false)
            .build()
            .ok();
        Self {
            literals,
            literal_values: pairs.iter().map(|(_, v)| v.as_bytes().to_vec()).collect(),
            literal_names: pairs.into_iter().map(|(k, _)| k).collect(),
            shapes,
            intros,
            any_intro,
        }
    }

    /// Only the token shapes, no known values.
    pub fn shapes_only() -> Self {
        Self::with_values(std::iter::empty())
    }

    /// How many known secret values it masks.
    pub fn known_values(&self) -> usize {
        self.literal_names.len()
    }

    /// Which shapes can match in `text`: a shape's match begins with one of its
    /// intros, so one pass of the intro automaton spares the regexes of every
    /// shape whose intro is nowhere (most output has none).
    fn shapes_in(&self, text: &[u8]) -> u32 {
        let Some(intros) = &self.intros else {
            return u32::MAX;
        };
        if !self.any_intro_in(text) {
            return 0;
        }
        let mut found = 0u32;
        for m in intros.find_overlapping_iter(text) {
            for &i in INTROS[m.pattern().as_usize()].2 {
                found |= 1 << i;
            }
        }
        found
    }

    /// Whether any shape's intro occurs in `text` as that shape would match
    /// it: exactly, or ignoring case for the [`FOLDED`] ones (true when
    /// unknown).
    fn any_intro_in(&self, text: &[u8]) -> bool {
        let Some(exact) = &self.any_intro else {
            return true;
        };
        exact.is_match(text)
            || memchr::memchr2_iter(b'_', b':', text).any(|i| {
                FOLDED.iter().any(|(intro, at)| {
                    let intro = intro.as_bytes();
                    intro[*at] == text[i]
                        && i >= *at
                        && text
                            .get(i - at..i - at + intro.len())
                            .is_some_and(|t| t.eq_ignore_ascii_case(intro))
                })
            })
    }

    fn ranges(&self, text: &[u8]) -> Vec<(usize, usize, String)> {
        self.ranges_of(text, self.shapes_in(text), None)
    }

    /// [`Redactor::ranges`] for the shapes in `found` (from [`Redactor::shapes_in`]).
    ///
    /// `text` may be a piece of a stream: `prev` is the byte before it, so
    /// that a shape that begins at a word boundary does not match at its
    /// start when that byte ends a word (`zAKIA…` is no key id, however the
    /// stream was cut before its `A`).
    fn ranges_of(&self, text: &[u8], found: u32, prev: Option<u8>) -> Vec<(usize, usize, String)> {
        let in_word = prev.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        let mut out = Vec::new();
        if let Some(ac) = &self.literals {
            for m in ac.find_iter(text) {
                let name = self
                    .literal_names
                    .get(m.pattern().as_usize())
                    .map(String::as_str)
                    .unwrap_or("secret");
                out.push((m.start(), m.end(), format!("[REDACTED:{name}]")));
            }
        }
        for (i, shape) in self.shapes.iter().enumerate() {
            if found & (1 << i) == 0 {
                continue;
            }
            // Searched from `at`, the regex reads the byte before it as
            // context, as it does between its own matches.
            let mut at = usize::from(shape.word_start && in_word);
            while at <= text.len() {
                let (whole, secret) = if shape.group == 0 {
                    let Some(m) = shape.re.find_at(text, at) else {
                        break;
                    };
                    (m, Some(m))
                } else {
                    let Some(c) = shape.re.captures_at(text, at) else {
                        break;
                    };
                    let Some(whole) = c.get(0) else { break };
                    (whole, c.get(shape.group))
                };
                if let Some(m) = secret {
                    out.push((m.start(), m.end(), format!("[REDACTED:{}]", shape.kind)));
                }
                at = whole.end().max(whole.start() + 1);
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        out
    }

    /// `text` with every secret masked; borrowed when there was none.
    pub fn redact_bytes<'a>(&self, text: &'a [u8]) -> Cow<'a, [u8]> {
        let ranges = self.ranges(text);
        if ranges.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = Vec::with_capacity(text.len());
        let mut pos = 0;
        for (start, end, label) in ranges {
            if end <= pos {
                continue;
            }
            if start >= pos {
                out.extend_from_slice(&text[pos..start]);
                out.extend_from_slice(label.as_bytes());
            }
            // An overlapping range just extends what is hidden.
            pos = end;
        }
        out.extend_from_slice(&text[pos..]);
        Cow::Owned(out)
    }

    /// Copy `r` to `w` with every secret masked, in bounded memory (about
    /// 1 MiB plus [`STREAM_OVERLAP`]). A secret is caught across read
    /// boundaries as long as it is shorter than the overlap. Returns whether
    /// anything was masked.
    pub fn redact_stream(
        &self,
        mut r: impl std::io::Read,
        mut w: impl std::io::Write,
    ) -> std::io::Result<bool> {
        const CHUNK: usize = 1 << 20;
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + STREAM_OVERLAP);
        let mut changed = false;
        let mut eof = false;
        // The last byte written on: context for what is held (see `ranges_of`).
        let mut prev = None;
        while !eof {
            let start = buf.len();
            buf.resize(start + CHUNK, 0);
            let mut filled = start;
            while filled < buf.len() {
                let n = r.read(&mut buf[filled..])?;
                if n == 0 {
                    eof = true;
                    break;
                }
                filled += n;
            }
            buf.truncate(filled);
            // Hold back the tail, where a secret may continue in the next read.
            let limit = if eof {
                buf.len()
            } else {
                buf.len().saturating_sub(STREAM_OVERLAP)
            };
            let mut pos = 0;
            let ranges = self.ranges_of(&buf, self.shapes_in(&buf), prev);
            for (s, e, label) in ranges {
                if s >= limit {
                    break;
                }
                if e <= pos {
                    continue;
                }
                if s >= pos {
                    w.write_all(&buf[pos..s])?;
                    w.write_all(label.as_bytes())?;
                }
                changed = true;
                pos = e;
            }
            if pos < limit {
                w.write_all(&buf[pos..limit])?;
                pos = limit;
            }
            if pos > 0 {
                prev = Some(buf[pos - 1]);
            }
            buf.drain(..pos);
        }
        w.flush()?;
        Ok(changed)
    }

    /// Where the tail of `buf` that may still grow into a secret begins: the
    /// part of a known value, the open start of a token shape, or the start of
    /// a shape's literal text at the very end. At most [`STREAM_OVERLAP`] bytes.
    /// Also returns [`Redactor::shapes_in`] for `buf`, from the same pass.
    fn hold_from(&self, buf: &[u8]) -> (u32, usize) {
        let n = buf.len();
        let floor = n.saturating_sub(STREAM_OVERLAP);
        let mut from = n;
        // The longest end of `buf` that begins a known value.
        for v in &self.literal_values {
            let reach = (v.len() - 1).min(n);
            for p in n - reach..n {
                if buf[p] == v[0] && v.starts_with(&buf[p..]) {
                    from = from.min(p);
                    break;
                }
            }
        }
        // The end of `buf` begins a shape's intro (`...gh`, `...-----BEG`).
        for (intro, _, _) in INTROS {
            let intro = intro.as_bytes();
            for k in (1..intro.len().min(n + 1)).rev() {
                if buf[n - k..].eq_ignore_ascii_case(&intro[..k]) {
                    from = from.min(n - k);
                    break;
                }
            }
        }
        let Some(intros) = &self.intros else {
            return (u32::MAX, from.max(floor));
        };
        if !self.any_intro_in(buf) {
            return (0, from.max(floor));
        }
        // A shape begun and not yet ended: a token in the last word, a keyword
        // in the last line, a key block with no end.
        let line = buf[floor..]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(floor, |i| floor + i + 1);
        let word = buf[line..]
            .iter()
            .rposition(|b| b.is_ascii_whitespace())
            .map_or(line, |i| line + i + 1);
        let mut block_end = floor;
        let mut found = 0u32;
        for m in intros.find_overlapping_iter(buf) {
            let (_, reach, shapes) = INTROS[m.pattern().as_usize()];
            for &i in shapes {
                found |= 1 << i;
            }
            let p = m.start();
            if p < floor {
                continue;
            }
            let open = match reach {
                Reach::Word => p >= word,
                Reach::Line => p >= line,
                Reach::Block => {
                    p >= block_end && {
                        let rest = &buf[p..];
                        // Closed by `-----END …-----`: the END line's own
                        // closing dashes must be there too.
                        let end = rest.windows(8).position(|w| w == b"-----END");
                        let closed = end.and_then(|e| {
                            rest[e + 8..]
                                .windows(5)
                                .position(|w| w == b"-----")
                                .map(|c| e + 8 + c + 5)
                        });
                        match closed {
                            Some(c) => {
                                block_end = p + c;
                                false
                            }
                            None => true,
                        }
                    }
                }
            };
            if open {
                from = from.min(p);
            }
        }
        (found, from.max(floor))
    }

    /// `text` with every secret masked; borrowed when there was none.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.redact_bytes(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(b) => Cow::Owned(match String::from_utf8(b) {
                Ok(s) => s,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            }),
        }
    }
}

/// Redacts a stream that arrives in pieces: live output, a log read from an
/// offset. Each piece is passed on at once except a tail that may still grow
/// into a secret ([`Redactor`]'s hold-back), so a secret split across two
/// writes, however far apart in time, is masked whole. Output with no such
/// tail (a prompt ending in a blank, a progress line) is not delayed.
#[derive(Debug, Default)]
pub struct RedactStream {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` that are context only, not shown: a log
    /// read from an offset starts a little before it, so a secret that
    /// straddles the offset is recognised and shown masked, not in part.
    skip: usize,
    /// Raw bytes decided (shown or masked) since the start, `skip` included.
    consumed: u64,
    /// The last byte decided, the context of `buf`'s first (see
    /// [`Redactor::ranges_of`]).
    prev: Option<u8>,
}

impl RedactStream {
    /// A stream whose first `context` bytes are read only to recognise a
    /// secret that begins in them.
    pub fn with_context(context: usize) -> Self {
        Self {
            skip: context,
            ..Self::default()
        }
    }

    /// Take `chunk`; append what can be shown to `out`.
    pub fn push(&mut self, r: &Redactor, chunk: &[u8], out: &mut Vec<u8>) {
        self.buf.extend_from_slice(chunk);
        let (found, limit) = r.hold_from(&self.buf);
        let ranges = r.ranges_of(&self.buf, found, self.prev);
        self.emit(&ranges, limit, out);
    }

    /// [`RedactStream::push`], returning what can be shown as two pieces in
    /// order: a part of `out`, then a part of `chunk` itself. Large output is
    /// not copied in the common case: a held tail is settled on a small prefix
    /// of `chunk` (a stream gives the same result however it is cut), and
    /// when nothing is held and nothing is masked the rest passes through as
    /// it is, all but a new held tail.
    pub fn push_borrowed<'a>(
        &mut self,
        r: &Redactor,
        chunk: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> [&'a [u8]; 2] {
        let mut at = 0;
        let mut step = SETTLE_STEP;
        while at < chunk.len() && (!self.buf.is_empty() || self.skip > 0) {
            let n = step.min(chunk.len() - at);
            self.push(r, &chunk[at..at + n], out);
            at += n;
            step = step.saturating_mul(2);
            // The held tail is always a suffix of what was pushed. Once it
            // lies within this chunk, what was held before is decided, and
            // the tail (often one letter that may begin an intro, as `a`
            // may begin `AKIA`) goes back to the chunk: held bytes would
            // otherwise be carried, and the chunk copied, to its end.
            if self.skip == 0 && self.buf.len() <= n {
                at -= self.buf.len();
                self.buf.clear();
                break;
            }
        }
        let rest = &chunk[at..];
        if rest.is_empty() {
            return [out, rest];
        }
        let (found, limit) = r.hold_from(rest);
        let ranges = r.ranges_of(rest, found, self.prev);
        // Ranges come sorted by start: none below the limit means none shown.
        if ranges.first().is_none_or(|(s, ..)| *s >= limit) {
            self.buf.extend_from_slice(&rest[limit..]);
            self.consumed += limit as u64;
            if limit > 0 {
                self.prev = Some(rest[limit - 1]);
            }
            return [out, &rest[..limit]];
        }
        self.buf.extend_from_slice(rest);
        self.emit(&ranges, limit, out);
        [out, &[]]
    }

    /// The stream has ended: append the rest to `out`.
    pub fn finish(&mut self, r: &Redactor, out: &mut Vec<u8>) {
        let found = r.shapes_in(&self.buf);
        let ranges = r.ranges_of(&self.buf, found, self.prev);
        self.emit(&ranges, self.buf.len(), out);
    }

    /// Raw bytes decided so far, counting from the stream's start (context
    /// included): where a reader resumes to see what is still held back.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Bytes held back, waiting for more.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Show `buf` up to `limit` with `ranges` (of all of `buf`) masked; keep the rest.
    fn emit(&mut self, ranges: &[(usize, usize, String)], limit: usize, out: &mut Vec<u8>) {
        let skip = self.skip;
        let copy = |out: &mut Vec<u8>, a: usize, b: usize, buf: &[u8]| {
            let a = a.max(skip);
            if a < b {
                out.extend_from_slice(&buf[a..b]);
            }
        };
        let mut pos = 0;
        for &(s, e, ref label) in ranges {
            if s >= limit {
                break;
            }
            if e <= pos {
                continue;
            }
            if s >= pos {
                copy(out, pos, s, &self.buf);
                if e > skip {
                    out.extend_from_slice(label.as_bytes());
                }
            }
            pos = e;
        }
        if pos < limit {
            copy(out, pos, limit, &self.buf);
            pos = limit;
        }
        if pos > 0 {
            self.prev = Some(self.buf[pos - 1]);
        }
        self.buf.drain(..pos);
        self.skip = self.skip.saturating_sub(pos);
        self.consumed += pos as u64;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn masks_known_values_by_name() {
        let r = Redactor::from_env(env(&[
            ("MY_SERVICE_PASSWORD", "hunter2hunter2"),
            ("DB_TOKEN", "tok-1234567890"),
            ("SHORT_KEY", "abc"),
            ("EDITOR", "vim-is-the-best-editor"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-abc/agent.1"),
        ]));
        assert_eq!(r.known_values(), 2);
        let out = r.redact("pw=hunter2hunter2 t=tok-1234567890 e=vim-is-the-best-editor abc");
        assert_eq!(
            out,
            "pw=[REDACTED:MY_SERVICE_PASSWORD] t=[REDACTED:DB_TOKEN] e=vim-is-the-best-editor abc"
        );
        assert!(!r.redact("/tmp/ssh-abc/agent.1").contains("REDACTED"));
    }

    #[test]
    fn masks_token_shapes() {
        let r = Redactor::shapes_only();
        let cases = [
            (
                "key sk-proj-abcdefghijklmnopqrstuvwxyz012345 end",
                "openai-key",
            ),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "anthropic-key"),
            ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github-token"),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijkl",
                "github-token",
            ),
            ("id AKIAIOSFODNN7EXAMPLE here", "aws-access-key"),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws-secret-key",
            ),
            ("xoxb-123456789012-abcdefghij", "slack-token"),
            (
                "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
                "bearer-token",
            ),
        ];
        for (text, kind) in cases {
            let out = r.redact(text);
            assert!(
                out.contains(&format!("[REDACTED:{kind}]")),
                "{text} -> {out}"
            );
        }
        let pem = "a\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\nz";
        assert_eq!(r.redact(pem), "a\n[REDACTED:private-key]\nz");
        // The context word stays, only the value goes.
        let out = r.redact("Authorization: Bearer abcdefghijkl");
        assert_eq!(out, "Authorization: Bearer [REDACTED:bearer-token]");
    }

    #[test]
    fn leaves_clean_text_alone() {
        let r = Redactor::from_env(env(&[("API_KEY", "s3cr3t-value-xyz")]));
        let text = "cargo build finished; sk-short; task-list; AKIA short";
        assert!(matches!(r.redact(text), Cow::Borrowed(_)));
    }

    #[test]
    fn streaming_catches_secrets_across_reads() {
        let secret = "tok-0123456789-abcdef";
        let r = Redactor::with_values(env(&[("DB_TOKEN", secret)]));
        // Place a secret across every 1 MiB boundary, and more in between.
        let mut text = Vec::new();
        let mut expect = Vec::new();
        while text.len() < 3 << 20 {
            let pad = vec![b'a'; (1 << 20) - 7 - (text.len() % (1 << 20))];
            text.extend_from_slice(&pad);
            expect.extend_from_slice(&pad);
            text.extend_from_slice(secret.as_bytes());
            expect.extend_from_slice(b"[REDACTED:DB_TOKEN]");
        }
        // A reader that hands out odd-sized pieces.
        struct Odd<'a>(&'a [u8]);
        impl std::io::Read for Odd<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(out.len()).min(77_777);
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = Vec::new();
        assert!(r.redact_stream(Odd(&text), &mut out).unwrap());
        assert_eq!(out.len(), expect.len());
        assert!(out == expect, "stream output differs");
        let mut clean = Vec::new();
        assert!(!r.redact_stream(&b"nothing here"[..], &mut clean).unwrap());
        assert_eq!(clean, b"nothing here");
    }

    /// `redact_stream` decides each read but its last [`STREAM_OVERLAP`]
    /// bytes: cut there inside a word, it masks what the whole text does.
    #[test]
    fn a_copied_stream_cut_inside_a_word_masks_what_the_whole_does() {
        let r = Redactor::shapes_only();
        // `redact_stream` reads 1 MiB at a time; its first cut falls here.
        let cut = (1 << 20) - STREAM_OVERLAP;
        let mut text = b"x ".repeat(cut / 2);
        text.pop();
        text.extend_from_slice(b"zAKIA1234567890ABCDEF AKIA1234567890ABCDEF ");
        assert_eq!(&text[cut - 1..cut + 1], b"zA");
        text.extend_from_slice(&b"y ".repeat(300_000));
        let whole = r.redact_bytes(&text).into_owned();
        assert_eq!(
            whole.len(),
            text.len() - 20 + "[REDACTED:aws-access-key]".len()
        );
        let mut out = Vec::new();
        assert!(r.redact_stream(&text[..], &mut out).unwrap());
        assert!(out == whole, "the stream differs from the whole");
    }

    #[test]
    fn overlapping_matches_hide_the_union() {
        let r = Redactor::with_values(env(&[("A", "sk-proj-abcdefghijklmnopqrstuvwxyz")]));
        let out = r.redact("x sk-proj-abcdefghijklmnopqrstuvwxyz0123 y");
        assert!(!out.contains("abcdefghij"), "{out}");
        assert!(out.starts_with("x [REDACTED:"));
        assert!(out.ends_with(" y"));
    }

    /// `pieces` through a stream, by `push` and by `push_borrowed`, which
    /// must agree.
    fn streamed(r: &Redactor, pieces: &[&[u8]]) -> Vec<u8> {
        let mut st = RedactStream::default();
        let mut out = Vec::new();
        for p in pieces {
            st.push(r, p, &mut out);
        }
        st.finish(r, &mut out);
        let mut st = RedactStream::default();
        let mut borrowed = Vec::new();
        let mut fed = 0;
        for p in pieces {
            let mut scratch = Vec::new();
            let [a, b] = st.push_borrowed(r, p, &mut scratch);
            borrowed.extend_from_slice(a);
            borrowed.extend_from_slice(b);
            fed += p.len();
            assert_eq!(st.consumed() as usize + st.held(), fed);
        }
        st.finish(r, &mut borrowed);
        assert_eq!(
            borrowed, out,
            "push_borrowed differs from push for {pieces:?}"
        );
        out
    }

    /// Every way of cutting the text in two or three gives what redacting it
    /// whole gives: known values, tokens, headers and key blocks alike.
    #[test]
    fn a_stream_masks_a_secret_however_it_is_cut() {
        let r = Redactor::from_env(env(&[("DB_PASSWORD", "hunter2 hunter2")]));
        // The last: shapes that begin at a word's start, inside a word and
        // not, which a cut just before the intro must not tell apart.
        let texts: [&[u8]; 5] = [
            b"pw=hunter2 hunter2 and again hunter2 hunter2\n",
            b"k sk-proj-abcdefghijklmnopqrstuvwxyz012345 end ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            b"GET /\nAuthorization: Bearer abc.def-ghi_jkl\nok",
            b"x\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nAAAA\n-----END RSA PRIVATE KEY-----\ny",
            b"zAKIA1234567890ABCDEF AKIA1234567890ABCDEF x_ghp_abcdefghijklmnopqrstuvwxyz0123456789 ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        ];
        for t in texts {
            let whole = r.redact_bytes(t).into_owned();
            assert_ne!(whole, t, "{}", String::from_utf8_lossy(t));
            if t.starts_with(b"zAKIA") {
                let shown = String::from_utf8_lossy(&whole);
                assert!(
                    shown.starts_with("zAKIA1234567890ABCDEF [REDACTED:"),
                    "{shown}"
                );
                assert!(shown.contains(" x_ghp_abc"), "{shown}");
            }
            for a in 0..=t.len() {
                let got = streamed(&r, &[&t[..a], &t[a..]]);
                assert_eq!(got, whole, "cut at {a}: {}", String::from_utf8_lossy(t));
                for b in a..=t.len() {
                    let got = streamed(&r, &[&t[..a], &t[a..b], &t[b..]]);
                    assert_eq!(got, whole, "cut at {a} and {b}");
                }
            }
        }
    }

    /// Large chunks, each ending in a tail that may begin a secret, and
    /// secrets that run far past where a held tail is settled: streamed by
    /// `push_borrowed` they give what redacting the whole gives.
    #[test]
    fn a_stream_of_large_chunks_masks_what_the_whole_does() {
        let r = Redactor::from_env(env(&[("DB_PASSWORD", "hunter2hunter2")]));
        let filler = |n: usize| "abcdefgh ".repeat(n / 9).into_bytes();
        let block = format!(
            "-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\n",
            "QUJD".repeat(6000)
        );
        let mut whole = Vec::new();
        let mut cuts = Vec::new();
        for (i, tail) in [
            &b"...sk-"[..],
            b"a",
            b"pw=hunter2",
            b"x\nAuthorization: Bearer ",
            b"gh",
            b"-----BEG",
        ]
        .iter()
        .enumerate()
        {
            whole.extend_from_slice(&filler(70_000 + i * 1000));
            whole.extend_from_slice(tail);
            cuts.push(whole.len());
        }
        // A held "-----BEG" goes on into a key block of 24 KB.
        whole.extend_from_slice(&block.as_bytes()[8..]);
        whole.extend_from_slice(b"token ghp_abcdefghijklmnopqrstuvwxyz0123456789 ");
        whole.extend_from_slice(&filler(9000));
        whole.extend_from_slice(b"hunter2hunter2 sk-proj-abcdefghijklmnopqrstuvwxyz012345");
        let mut pieces = Vec::new();
        let mut at = 0;
        for c in cuts {
            pieces.push(&whole[at..c]);
            at = c;
        }
        pieces.push(&whole[at..]);
        let expect = r.redact_bytes(&whole).into_owned();
        let got = streamed(&r, &pieces);
        assert!(got == expect, "the stream differs from the whole");
        let text = String::from_utf8_lossy(&got);
        for secret in ["QUJDQUJD", "hunter2hunter2", "ghp_abc", "sk-proj-abc"] {
            assert!(!text.contains(secret), "{secret} was shown");
        }
        assert!(text.contains("[REDACTED:"));
    }

    /// A held tail is settled on a small prefix of the next chunk; the rest
    /// of the chunk passes through uncopied even when every prefix ends in a
    /// letter that may begin an intro (`a` of `AKIA`).
    #[test]
    fn a_held_letter_leaves_the_next_chunk_uncopied() {
        let r = Redactor::from_env(env(&[("DB_PASSWORD", "hunter2hunter2")]));
        let mut st = RedactStream::default();
        let first = b"a".repeat(100_000);
        let mut scratch = Vec::new();
        let [copied, borrowed] = st.push_borrowed(&r, &first, &mut scratch);
        assert_eq!(copied.len() + borrowed.len(), first.len() - 1);
        assert_eq!(st.held(), 1, "a trailing `a` may begin a key id");
        let next = b"a".repeat(400_000);
        let mut scratch = Vec::new();
        let [copied, borrowed] = st.push_borrowed(&r, &next, &mut scratch);
        assert!(
            copied.len() <= SETTLE_STEP + 1,
            "{} bytes were copied to settle one held byte",
            copied.len()
        );
        assert_eq!(copied.len() + borrowed.len(), next.len());
        assert_eq!(st.held(), 1);
    }

    /// Text that cannot become a secret is passed on at once; what could is
    /// held until the next piece says.
    #[test]
    fn a_stream_holds_back_only_what_may_become_a_secret() {
        let r = Redactor::from_env(env(&[("DB_PASSWORD", "hunter2hunter2")]));
        for clean in [&b"name: "[..], b"progress 45%", b"Password:", b"$ "] {
            let mut st = RedactStream::default();
            let mut out = Vec::new();
            st.push(&r, clean, &mut out);
            assert_eq!(out, clean, "held back {:?}", String::from_utf8_lossy(clean));
        }
        for open in [
            &b"pw=hunter2"[..],
            b"key sk-proj-abc",
            b"id gh",
            b"-----BEGIN X",
        ] {
            let mut st = RedactStream::default();
            let mut out = Vec::new();
            st.push(&r, open, &mut out);
            assert!(
                st.held() > 0,
                "{:?} was not held",
                String::from_utf8_lossy(open)
            );
            assert_eq!(out.len() + st.held(), open.len());
            assert_eq!(st.consumed(), out.len() as u64);
        }
    }

    /// A stream read from inside a secret, with the bytes before it as
    /// context, shows the mask and not the secret's rest.
    #[test]
    fn context_before_an_offset_masks_a_secret_that_straddles_it() {
        let r = Redactor::from_env(env(&[("DB_PASSWORD", "hunter2hunter2")]));
        let log = b"start pw=hunter2hunter2 end";
        let offset = 12; // inside the value
        let mut st = RedactStream::with_context(offset);
        let mut out = Vec::new();
        st.push(&r, log, &mut out);
        st.finish(&r, &mut out);
        assert_eq!(out, b"[REDACTED:DB_PASSWORD] end");
        // From just past it, nothing of it is shown.
        let mut st = RedactStream::with_context(23);
        let mut out = Vec::new();
        st.push(&r, log, &mut out);
        st.finish(&r, &mut out);
        assert_eq!(out, b" end");
        assert_eq!(st.consumed(), log.len() as u64);
    }

    /// Every shape is woken by some intro, and an intro overlapped by another
    /// (`AIza` ending in the `a` of `aws_…`) still wakes its own shape.
    #[test]
    fn every_shape_has_an_intro_and_overlaps_do_not_hide_one() {
        let mut covered = 0u32;
        for (_, _, shapes) in INTROS {
            for &i in *shapes {
                covered |= 1 << i;
            }
        }
        assert_eq!(covered, (1 << SHAPES.len()) - 1);
        let r = Redactor::shapes_only();
        let text = "AIzaws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        assert!(
            r.redact(text).contains("[REDACTED:aws-secret-key]"),
            "{}",
            r.redact(text)
        );
    }

    /// The fast "any intro at all?" check never says no where a shape can
    /// match: it agrees with the full (overlapping, case-blind) pass on every
    /// intro as its shape spells it, and on the case-blind shapes in any case.
    #[test]
    fn the_quick_intro_check_agrees_with_the_full_pass() {
        let r = Redactor::shapes_only();
        let mut samples: Vec<String> = vec![
            "a".repeat(5000),
            "plain log line with nothing in it\n".repeat(100),
            "xx-sk".into(),
        ];
        for (intro, _, _) in INTROS {
            samples.push(format!("aaaa {intro} aaaa"));
            samples.push(format!("zz{intro}"));
            samples.push(format!("{intro}zz"));
        }
        for (intro, _) in FOLDED {
            samples.push(format!("zz{}zz", intro.to_ascii_uppercase()));
            samples.push(format!("a_b:{}", intro.to_ascii_lowercase()));
            samples.push(intro.replace('a', "A"));
        }
        for s in &samples {
            let full = r
                .intros
                .as_ref()
                .unwrap()
                .find_overlapping_iter(s.as_bytes())
                .next()
                .is_some();
            assert_eq!(r.any_intro_in(s.as_bytes()), full, "{s:.60}");
        }
        // An intro in a case its shape never matches needs no look: the
        // shapes find nothing there either.
        for (intro, _, _) in INTROS {
            if FOLDED.iter().any(|(f, _)| f == intro) {
                continue;
            }
            for s in [intro.to_ascii_uppercase(), intro.to_ascii_lowercase()] {
                if s != *intro {
                    let found = r.ranges(format!("{s}{}", "A1".repeat(30)).as_bytes());
                    assert!(r.any_intro_in(s.as_bytes()) || found.is_empty(), "{s}");
                }
            }
        }
    }
}
