//! A provider's streamed answer as server-sent events: the body's bytes, split
//! however the network split them, come out as whole events. The parsing is
//! the `eventsource-stream` crate's (the WHATWG event-stream rules: `event:`,
//! joined `data:` lines, comments, CR/LF line ends); this module turns its end
//! and its errors into what failover acts on.

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};

use super::ProviderError;

/// One event: its `event:` name and its joined `data:` lines.
#[derive(Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (`message` when the event named none).
    pub event: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Read a response body as SSE, calling `on_event` for each event until it
/// returns `true` (the stream's own end marker). A body that ends first, or
/// breaks, is a cut stream.
pub async fn each_event(
    resp: reqwest::Response,
    on_event: impl FnMut(SseEvent) -> Result<bool, ProviderError>,
    what_end: &str,
) -> Result<(), ProviderError> {
    each_event_of(resp.bytes_stream(), on_event, what_end).await
}

async fn each_event_of<B, E>(
    body: impl Stream<Item = Result<B, E>> + Unpin,
    mut on_event: impl FnMut(SseEvent) -> Result<bool, ProviderError>,
    what_end: &str,
) -> Result<(), ProviderError>
where
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    let mut events = body.eventsource();
    while let Some(ev) = events.next().await {
        let ev = ev.map_err(|e| ProviderError::Retryable {
            message: format!("the stream broke before {what_end}: {e}"),
            retry_after: None,
        })?;
        if on_event(SseEvent {
            event: ev.event,
            data: ev.data,
        })? {
            return Ok(());
        }
    }
    Err(super::cut(what_end))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every event `text` holds, fed in two chunks split at `split`.
    async fn events(text: &'static [u8], split: usize) -> (Vec<SseEvent>, bool) {
        let chunks: Vec<Result<&[u8], std::io::Error>> =
            vec![Ok(&text[..split]), Ok(&text[split..])];
        let mut seen = Vec::new();
        let ended = each_event_of(
            futures::stream::iter(chunks),
            |ev| {
                let end = ev.data == "[DONE]";
                seen.push(ev);
                Ok(end)
            },
            "the end",
        )
        .await
        .is_ok();
        (seen, ended)
    }

    #[tokio::test]
    async fn events_split_anywhere_come_out_whole() {
        let text =
            b"event: a\ndata: {\"x\":\ndata: 1}\n\n: comment\r\ndata: two\r\n\r\ndata: [DONE]\n\n";
        for split in 0..text.len() {
            let (evs, ended) = events(text, split).await;
            assert!(ended, "split at {split}");
            assert_eq!(
                evs,
                vec![
                    SseEvent {
                        event: "a".into(),
                        data: "{\"x\":\n1}".into()
                    },
                    SseEvent {
                        event: "message".into(),
                        data: "two".into()
                    },
                    SseEvent {
                        event: "message".into(),
                        data: "[DONE]".into()
                    }
                ],
                "split at {split}"
            );
        }
    }

    #[tokio::test]
    async fn a_body_that_ends_before_its_marker_is_a_cut_stream() {
        let (evs, ended) = events(b"data: half\n\ndata: never fin", 5).await;
        assert_eq!(evs.len(), 1);
        assert!(!ended);
    }
}
