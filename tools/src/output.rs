//! The last step of every call: redact the text and the data, and bound the
//! text to the sandbox's output cap, spooling the whole when it is cut.

use std::io::Write;

use serde_json::Value;

use super::ToolOutcome;
use berth_core::runtime::Runtime;

/// Output cap when there is no policy.
const DEFAULT_CAP: usize = 256 * 1024;

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
    let cap = rt
        .gate()
        .map(|g| g.limits(sandbox).output_cap_bytes as usize)
        .unwrap_or(DEFAULT_CAP)
        .max(1024);
    if o.text.len() <= cap {
        return;
    }
    let spool = rt.spool_path(&format!("{call_id}.tool"));
    let saved = std::fs::create_dir_all(spool.parent().unwrap_or(&spool))
        .and_then(|_| {
            let mut f = std::fs::File::create(&spool)?;
            f.write_all(o.text.as_bytes())
        })
        .is_ok();
    let head = floor_char(&o.text, cap / 2);
    let tail = ceil_char(&o.text, o.text.len() - cap / 2);
    let omitted = tail - head;
    let where_ = if saved {
        format!("; the whole text is in {}", spool.display())
    } else {
        String::new()
    };
    o.text = format!(
        "{}\n[... berth: {omitted} of {} bytes omitted{where_} ...]\n{}",
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
    fn clipping_respects_characters() {
        assert_eq!(clip("héllo", 2), "h…");
        assert_eq!(clip("hi", 5), "hi");
        let s = "ééé";
        assert_eq!(floor_char(s, 3), 2);
        assert_eq!(ceil_char(s, 3), 4);
    }
}
