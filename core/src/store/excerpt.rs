//! Bounded text for the event log: an event keeps an excerpt of a long
//! command (a refused 7 MB command is three events of 7 MB otherwise), with
//! the whole text's length and SHA-256, so the log is bounded by size as well
//! as by count, and what was cut can still be matched against its source.

use serde_json::Value;
use sha2::Digest;

/// The most of a command an event keeps, in bytes.
pub const COMMAND_KEEP: usize = 8 * 1024;
/// The most of one string inside an event's detail.
const STRING_KEEP: usize = 4 * 1024;
/// The most of an event's detail, as JSON text.
pub const DETAIL_KEEP: usize = 32 * 1024;

/// SHA-256 of `s`, hex.
pub fn sha256_hex(s: &[u8]) -> String {
    let d = sha2::Sha256::digest(s);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// `s` when it is at most `keep` bytes; else its first and last bytes
/// around a line that gives the whole text's length and SHA-256.
pub fn excerpt(s: &str, keep: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= keep {
        return std::borrow::Cow::Borrowed(s);
    }
    let tail_len = keep / 8;
    let head = floor_char(s, keep - tail_len);
    let tail = ceil_char(s, s.len() - tail_len);
    std::borrow::Cow::Owned(format!(
        "{}\n[... berth: an excerpt; the whole text is {} bytes, sha256 {} ...]\n{}",
        &s[..head],
        s.len(),
        sha256_hex(s.as_bytes()),
        &s[tail..]
    ))
}

/// An event's detail (JSON text) within [`DETAIL_KEEP`]: long strings in it
/// become excerpts; a detail still too long (or not JSON) is replaced by an
/// object with its excerpt, length and SHA-256.
pub fn bound_detail(d: &str) -> std::borrow::Cow<'_, str> {
    if d.len() <= DETAIL_KEEP {
        return std::borrow::Cow::Borrowed(d);
    }
    if let Ok(mut v) = serde_json::from_str::<Value>(d) {
        clip_strings(&mut v);
        let t = v.to_string();
        if t.len() <= DETAIL_KEEP {
            return std::borrow::Cow::Owned(t);
        }
    }
    std::borrow::Cow::Owned(
        serde_json::json!({
            "excerpt": excerpt(d, STRING_KEEP),
            "bytes": d.len(),
            "sha256": sha256_hex(d.as_bytes()),
        })
        .to_string(),
    )
}

fn clip_strings(v: &mut Value) {
    match v {
        Value::String(s) if s.len() > STRING_KEEP => {
            *s = excerpt(s, STRING_KEEP).into_owned();
        }
        Value::Array(a) => a.iter_mut().for_each(clip_strings),
        Value::Object(o) => o.values_mut().for_each(clip_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_keeps_its_ends_length_and_digest() {
        let s = format!("rm -rf {}; echo END", "x".repeat(100_000));
        let e = excerpt(&s, COMMAND_KEEP);
        assert!(e.len() < COMMAND_KEEP + 200, "{}", e.len());
        assert!(e.starts_with("rm -rf xx"));
        assert!(e.ends_with("echo END"));
        assert!(e.contains(&format!("{} bytes", s.len())));
        assert!(e.contains(&sha256_hex(s.as_bytes())));
        assert_eq!(excerpt("short", COMMAND_KEEP), "short");
        // Character boundaries hold.
        let s = "é".repeat(10_000);
        let _ = excerpt(&s, 1001);
    }

    #[test]
    fn a_long_detail_stays_json_and_bounded() {
        let d = serde_json::json!({ "rule": "r", "part": "y".repeat(1 << 20) }).to_string();
        let b = bound_detail(&d);
        assert!(b.len() <= DETAIL_KEEP);
        let v: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
        assert_eq!(v["rule"], "r");
        let d = "z".repeat(1 << 20);
        let b = bound_detail(&d);
        assert!(b.len() <= DETAIL_KEEP);
        let v: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
        assert_eq!(v["bytes"], 1 << 20);
    }
}
