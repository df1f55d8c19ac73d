//! A server-sent-events reader: bytes in, whole events out, however the
//! network split them (an event may arrive a byte at a time, or ten at once).

use futures::StreamExt;

use super::ProviderError;

/// One event: its `event:` name (empty when absent) and its joined `data:` lines.
#[derive(Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field.
    pub event: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Incremental parser.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Feed bytes; returns the events they completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &self.buf[start..]) {
            let end = start + nl;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if line.is_empty() {
                if !self.data.is_empty() || !self.event.is_empty() {
                    out.push(SseEvent {
                        event: std::mem::take(&mut self.event),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f.to_string(), v.strip_prefix(' ').unwrap_or(v).to_string()),
                None => (line.clone(), String::new()),
            };
            match field.as_str() {
                "event" => self.event = value,
                "data" => self.data.push(value),
                _ => {}
            }
        }
        self.buf.drain(..start);
        out
    }
}

/// Read a response body as SSE, calling `on_event` for each event until it
/// returns `true` (the stream's own end marker). A body that ends first, or
/// breaks, is a cut stream.
pub async fn each_event(
    resp: reqwest::Response,
    mut on_event: impl FnMut(SseEvent) -> Result<bool, ProviderError>,
    what_end: &str,
) -> Result<(), ProviderError> {
    let mut parser = SseParser::default();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ProviderError::Retryable {
            message: format!("the stream broke before {what_end}: {e}"),
            retry_after: None,
        })?;
        for ev in parser.feed(&chunk) {
            if on_event(ev)? {
                return Ok(());
            }
        }
    }
    Err(super::cut(what_end))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let text = b"event: a\ndata: {\"x\":\ndata: 1}\n\n: comment\r\ndata: two\r\n\r\n";
        for split in 0..text.len() {
            let mut p = SseParser::default();
            let mut evs = p.feed(&text[..split]);
            evs.extend(p.feed(&text[split..]));
            assert_eq!(
                evs,
                vec![
                    SseEvent {
                        event: "a".into(),
                        data: "{\"x\":\n1}".into()
                    },
                    SseEvent {
                        event: "".into(),
                        data: "two".into()
                    }
                ],
                "split at {split}"
            );
        }
    }
}
