//! The last step of every call: redact the text and the data, and bound the
//! text to the sandbox's output cap, spooling the whole when it is cut.

use std::io::Write;

use serde_json::Value;

use super::ToolOutcome;
use berth_core::runtime::Runtime;
use berth_core::session::capture::{Output, strip_ansi};

/// The most text one call returns to a model, in bytes: the policy's
/// `tool_result_bytes` (at least 1 KiB), or its default without a policy.
pub(crate) fn result_cap(rt: &Runtime, sandbox: &str) -> usize {
    rt.gate()
        .map(|g| g.limits(sandbox).tool_result_bytes)
        .unwrap_or_else(|| berth_policies::Limits::default().tool_result_bytes)
        .max(1024) as usize
}

/// Room a tool leaves in its result for berth's own lines (exit code,
/// notices, where to read on) after the bulk of its text.
pub(crate) const TRAILER_ROOM: usize = 1024;

/// A command's captured output as text for a model, within `max` bytes:
/// its first and last bytes around one line that says how many of all the
/// bytes it wrote were left out, and where the whole is. The capture's own
/// cut (its head and tail) and this one are told as one, so the count is
/// the truth about the command's output.
pub(crate) fn command_output(o: &Output, max: usize) -> (String, u64) {
    let (head, tail) = (&o.head[..], &o.tail[..]);
    let all_len = head.len() + tail.len();
    if o.omitted_bytes == 0 && all_len <= max {
        return (
            strip_ansi(&String::from_utf8_lossy(&join(head, tail, 0, all_len))),
            0,
        );
    }
    let want_head = max / 2;
    let want_tail = max - want_head;
    if o.omitted_bytes == 0 {
        // Everything was kept: the two ends of head ++ tail.
        let h = byte_floor(head, tail, want_head);
        let t = byte_ceil(head, tail, all_len - want_tail.min(all_len - h));
        return finish_ends(o, &join(head, tail, 0, h), &join(head, tail, t, all_len));
    }
    let h = utf8_floor(head, want_head.min(head.len()));
    let t = utf8_ceil(tail, tail.len() - want_tail.min(tail.len()));
    finish_ends(o, &head[..h], &tail[t..])
}

fn finish_ends(o: &Output, shown_head: &[u8], shown_tail: &[u8]) -> (String, u64) {
    let omitted = o
        .total_bytes
        .saturating_sub((shown_head.len() + shown_tail.len()) as u64);
    let where_ = match &o.spool {
        Some(p) => format!(
            "; the whole output is saved outside the sandbox in {}. To read the middle, send the command's output to a file in the sandbox and read it in parts",
            p.display()
        ),
        None => "; the rest was not kept. To read the middle, send the command's output to a file in the sandbox and read it in parts".to_string(),
    };
    let text = format!(
        "{}\n[... berth: {omitted} of the {} bytes of output omitted here{where_} ...]\n{}",
        strip_ansi(&String::from_utf8_lossy(shown_head)),
        o.total_bytes,
        strip_ansi(&String::from_utf8_lossy(shown_tail)),
    );
    (text, omitted)
}

/// Write `bytes` to `path` (its directory made first); whether it worked.
pub(crate) fn save(path: &std::path::Path, bytes: &[u8]) -> bool {
    std::fs::create_dir_all(path.parent().unwrap_or(path))
        .and_then(|_| {
            let mut f = std::fs::File::create(path)?;
            f.write_all(bytes)
        })
        .is_ok()
}

/// `o` with a spool of its own when it was kept whole by the capture (which
/// spools only what it cuts) but is longer than `max`: the result is cut,
/// and the whole must be somewhere.
pub(crate) fn spooled(rt: &Runtime, call_id: &str, o: &Output, max: usize) -> Output {
    let mut o = o.clone();
    if o.spool.is_none() && o.omitted_bytes == 0 && o.head.len() + o.tail.len() > max {
        let path = rt.spool_path(&format!("{call_id}.result"));
        let all = join(&o.head, &o.tail, 0, o.head.len() + o.tail.len());
        if save(&path, &all) {
            o.spool = Some(path);
        }
    }
    o
}

/// Bytes `from..to` of `a ++ b`.
fn join(a: &[u8], b: &[u8], from: usize, to: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(to - from);
    if from < a.len() {
        v.extend_from_slice(&a[from..to.min(a.len())]);
    }
    if to > a.len() {
        v.extend_from_slice(&b[from.max(a.len()) - a.len()..to - a.len()]);
    }
    v
}

fn at(a: &[u8], b: &[u8], i: usize) -> Option<u8> {
    if i < a.len() {
        Some(a[i])
    } else {
        b.get(i - a.len()).copied()
    }
}

fn is_cont(b: Option<u8>) -> bool {
    b.is_some_and(|b| b & 0xC0 == 0x80)
}

/// `i` moved back (at most 3 bytes) off the middle of a UTF-8 character of `a ++ b`.
fn byte_floor(a: &[u8], b: &[u8], mut i: usize) -> usize {
    let mut n = 0;
    while i > 0 && n < 3 && is_cont(at(a, b, i)) {
        i -= 1;
        n += 1;
    }
    i
}

/// `i` moved on (at most 3 bytes) off the middle of a UTF-8 character of `a ++ b`.
fn byte_ceil(a: &[u8], b: &[u8], mut i: usize) -> usize {
    let mut n = 0;
    while i < a.len() + b.len() && n < 3 && is_cont(at(a, b, i)) {
        i += 1;
        n += 1;
    }
    i
}

fn utf8_floor(a: &[u8], i: usize) -> usize {
    byte_floor(a, &[], i)
}

fn utf8_ceil(a: &[u8], i: usize) -> usize {
    byte_ceil(a, &[], i)
}

/// `s` cut to at most `max` bytes at a character boundary, marked when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}…", &s[..floor_char(s, max)])
}

fn floor_char(s: &str, mut i: usize) -> usize {
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

/// Redact and bound `o` for the model.
pub(crate) fn finish(rt: &Runtime, sandbox: &str, call_id: &str, o: &mut ToolOutcome) {
    if let Some(g) = rt.gate() {
        if let std::borrow::Cow::Owned(t) = g.redact(&o.text) {
            o.text = t;
        }
        if !o.data.is_null() {
            let d = o.data.to_string();
            if let std::borrow::Cow::Owned(r) = g.redact(&d) {
                o.data = serde_json::from_str(&r).unwrap_or(Value::Null);
            }
        }
    }
    let cap = result_cap(rt, sandbox);
    if o.text.len() <= cap {
        return;
    }
    let spool = rt.spool_path(&format!("{call_id}.tool"));
    let saved = save(&spool, o.text.as_bytes());
    let head = floor_char(&o.text, cap / 2);
    let tail = ceil_char(&o.text, o.text.len() - cap / 2);
    let omitted = tail - head;
    let where_ = if saved {
        format!("; the whole text is in {}", spool.display())
    } else {
        String::new()
    };
    o.text = format!(
        "{}\n[... berth: {omitted} of this result's {} bytes omitted (tool_result_bytes under [limits] in the policy file){where_} ...]\n{}",
        &o.text[..head],
        o.text.len(),
        &o.text[tail..]
    );
    if saved && o.spool.is_none() {
        o.spool = Some(spool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_output_is_cut_once_and_told_truly() {
        let out = |head: &[u8], tail: &[u8], total: u64| Output {
            head: head.to_vec(),
            tail: tail.to_vec(),
            total_bytes: total,
            omitted_bytes: total - (head.len() + tail.len()) as u64,
            spool: Some("/state/spool/c1.out".into()),
            spool_omitted: 0,
        };
        // Cut by the capture, then again to the result's size: one marker,
        // counting every byte the command wrote.
        let o = out(&[b'a'; 1000], &[b'z'; 1000], 1_000_000);
        let (t, omitted) = command_output(&o, 100);
        assert_eq!(omitted, 1_000_000 - 100);
        assert_eq!(t.matches("berth:").count(), 1, "{t}");
        assert!(t.contains("999900 of the 1000000 bytes"), "{t}");
        assert!(t.contains("/state/spool/c1.out"), "{t}");
        assert!(t.starts_with(&"a".repeat(50)) && t.ends_with(&"z".repeat(50)));
        // Kept whole by the capture, too long for a result.
        let o = out("é".repeat(100).as_bytes(), b"", 200);
        let (t, omitted) = command_output(&o, 51);
        assert!(t.contains(&format!("{omitted} of the 200 bytes")), "{t}");
        assert!(!t.contains('\u{FFFD}'), "{t}");
        // Short output is left alone.
        let o = out(b"hi\n", b"", 3);
        assert_eq!(command_output(&o, 100), ("hi\n".to_string(), 0));
    }

    #[test]
    fn clipping_respects_characters() {
        assert_eq!(clip("héllo", 2), "h…");
        assert_eq!(clip("hi", 5), "hi");
        let s = "ééé";
        assert_eq!(floor_char(s, 3), 2);
        assert_eq!(ceil_char(s, 3), 4);
    }
}
