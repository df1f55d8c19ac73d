//! Secret redaction for output and event text.
//!
//! A [`Redactor`] is built once from berth's environment (the values of
//! variables whose names look secret) and a fixed set of token shapes, then
//! applied to every piece of output and every event. One pass per shape finds
//! match ranges in the original text; overlapping ranges are merged and the text
//! is rebuilt once, so clean text is returned without copying.

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, MatchKind};
use regex::bytes::Regex;

/// Name fragments that mark a variable's value as secret.
const SECRET_NAME_PARTS: &[&str] = &[
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
}

/// Finds and masks secrets in text.
pub struct Redactor {
    literals: Option<AhoCorasick>,
    literal_names: Vec<String>,
    shapes: Vec<Shape>,
}

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
                .match_kind(MatchKind::LeftmostLongest)
                .build(pairs.iter().map(|(_, v)| v.as_bytes()))
                .ok()
        };
        let shapes = SHAPES
            .iter()
            .filter_map(|(kind, re, group)| {
                Regex::new(re).ok().map(|re| Shape {
                    kind,
                    re,
                    group: *group,
                })
            })
            .collect();
        Self {
            literals,
            literal_names: pairs.into_iter().map(|(k, _)| k).collect(),
            shapes,
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

    fn ranges(&self, text: &[u8]) -> Vec<(usize, usize, String)> {
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
        for shape in &self.shapes {
            if shape.group == 0 {
                for m in shape.re.find_iter(text) {
                    out.push((m.start(), m.end(), format!("[REDACTED:{}]", shape.kind)));
                }
            } else {
                for c in shape.re.captures_iter(text) {
                    if let Some(m) = c.get(shape.group) {
                        out.push((m.start(), m.end(), format!("[REDACTED:{}]", shape.kind)));
                    }
                }
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
            for (s, e, label) in self.ranges(&buf) {
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
            buf.drain(..pos);
        }
        w.flush()?;
        Ok(changed)
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

    #[test]
    fn overlapping_matches_hide_the_union() {
        let r = Redactor::with_values(env(&[("A", "sk-proj-abcdefghijklmnopqrstuvwxyz")]));
        let out = r.redact("x sk-proj-abcdefghijklmnopqrstuvwxyz0123 y");
        assert!(!out.contains("abcdefghij"), "{out}");
        assert!(out.starts_with("x [REDACTED:"));
        assert!(out.ends_with(" y"));
    }
}
