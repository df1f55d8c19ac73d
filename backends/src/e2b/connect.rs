//! The Connect protocol with the JSON codec, as envd speaks it.
//!
//! Flow at a glance:
//! - A unary call posts bare JSON (`application/json`) and reads bare JSON
//!   back; a non-200 carries `{code, message}`.
//! - A server-streaming call posts one envelope (`application/connect+json`)
//!   and reads envelopes: flags (1 byte), big-endian length (4 bytes), payload.
//!   The last one has flag `0x02` and holds `{}` or `{"error": …}`.
//! - A body that ends without that frame was cut: [`Frame::Cut`], never a
//!   clean end.

use berth_core::error::BackendFailure;
use bytes::{Buf, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Flag bit: the payload is compressed (never sent by berth, refused on receipt).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;
/// The largest envelope berth accepts: envd's chunks are at most 32 KiB of
/// output, which base64 and JSON grow to under 64 KiB.
pub const MAX_ENVELOPE: usize = 16 * 1024 * 1024;

/// A Connect error: its code word and message.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ConnectError {
    /// `not_found`, `deadline_exceeded`, `unauthenticated`, …
    #[serde(default)]
    pub code: String,
    /// What went wrong.
    #[serde(default)]
    pub message: String,
}

/// Why an envd call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// envd (or the proxy in front of it) answered with an error status.
    #[error("HTTP {status}: {code} {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The Connect code, or the proxy's numeric code as text.
        code: String,
        /// The message.
        message: String,
    },
    /// A streaming call ended with an error in its end-of-stream frame.
    #[error("{}: {}", .0.code, .0.message)]
    Stream(ConnectError),
    /// The connection failed or broke.
    #[error("{0}")]
    Transport(#[source] reqwest::Error),
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// How an HTTP request failed before an answer came, from reqwest's own
/// classification of the error.
pub(crate) fn http_failure(e: &reqwest::Error) -> BackendFailure {
    if e.is_timeout() {
        BackendFailure::Timeout
    } else if e.is_builder() {
        BackendFailure::Local
    } else if e.is_decode() {
        BackendFailure::Protocol
    } else if let Some(status) = e.status() {
        BackendFailure::from_http_status(status.as_u16())
    } else {
        // Connecting, sending, reading the body: the link failed.
        BackendFailure::Transport
    }
}

/// The class of a Connect error code, where the code says more than the
/// HTTP status.
pub(crate) fn connect_code_failure(code: &str) -> Option<BackendFailure> {
    Some(match code {
        "unauthenticated" | "permission_denied" => BackendFailure::Auth,
        "deadline_exceeded" => BackendFailure::Timeout,
        "unavailable" => BackendFailure::Transport,
        "resource_exhausted" => BackendFailure::Exhausted,
        _ => return None,
    })
}

impl CallError {
    /// How the call failed: the Connect code where it names a class, else
    /// the HTTP status, else what reqwest says about the link.
    pub fn failure(&self) -> BackendFailure {
        match self {
            CallError::Status { status, code, .. } => connect_code_failure(code)
                .unwrap_or_else(|| BackendFailure::from_http_status(*status)),
            CallError::Stream(e) => {
                connect_code_failure(&e.code).unwrap_or(BackendFailure::Rejected)
            }
            CallError::Transport(e) => http_failure(e),
            CallError::Protocol(_) => BackendFailure::Protocol,
        }
    }

    /// The Connect code, when there is one.
    pub fn code(&self) -> Option<&str> {
        match self {
            CallError::Status { code, .. } => Some(code),
            CallError::Stream(e) => Some(&e.code),
            _ => None,
        }
    }

    /// The HTTP status, when the call got one.
    pub fn status(&self) -> Option<u16> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Frame one message.
pub fn encode(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// One decoded frame of a response stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A message payload.
    Message(Vec<u8>),
    /// The end-of-stream frame: clean, or with an error.
    End(Option<ConnectError>),
}

/// Incremental envelope decoder over a byte stream.
#[derive(Default)]
pub struct Decoder {
    buf: BytesMut,
}

#[derive(Deserialize)]
struct EndStream {
    #[serde(default)]
    error: Option<ConnectError>,
}

impl Decoder {
    /// Add received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet framed.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_ENVELOPE {
            return Err(format!(
                "envelope of {len} bytes is over the {MAX_ENVELOPE}-byte limit"
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let payload = self.buf.split_to(len).to_vec();
        if flags & FLAG_COMPRESSED != 0 {
            return Err("compressed envelope, but berth asked for none".into());
        }
        if flags & FLAG_END_STREAM != 0 {
            let end: EndStream = serde_json::from_slice(&payload)
                .map_err(|e| format!("bad end-of-stream message: {e}"))?;
            return Ok(Some(Frame::End(end.error)));
        }
        Ok(Some(Frame::Message(payload)))
    }
}

/// A response stream being read.
pub struct ServerStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    decoder: Decoder,
    ended: bool,
}

/// One step of a [`ServerStream`].
#[derive(Debug)]
pub enum Step<T> {
    /// A message.
    Message(T),
    /// The clean end of the stream.
    End,
    /// The stream ended with an error frame.
    Error(ConnectError),
    /// The body ended (or broke) before the end-of-stream frame.
    Cut(String),
}

impl ServerStream {
    pub(crate) fn new(resp: reqwest::Response) -> Self {
        Self {
            body: resp.bytes_stream().boxed(),
            decoder: Decoder::default(),
            ended: false,
        }
    }

    /// The next message, decoded as `T`.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Step<T> {
        if self.ended {
            return Step::End;
        }
        loop {
            match self.decoder.next_frame() {
                Ok(Some(Frame::Message(m))) => {
                    return match serde_json::from_slice(&m) {
                        Ok(v) => Step::Message(v),
                        Err(e) => {
                            self.ended = true;
                            Step::Cut(format!("undecodable message: {e}"))
                        }
                    };
                }
                Ok(Some(Frame::End(err))) => {
                    self.ended = true;
                    return match err {
                        None => Step::End,
                        Some(e) => Step::Error(e),
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    self.ended = true;
                    return Step::Cut(e);
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(e)) => {
                    self.ended = true;
                    return Step::Cut(format!("the connection broke: {e}"));
                }
                None => {
                    self.ended = true;
                    let left = self.decoder.pending();
                    return Step::Cut(if left > 0 {
                        format!("the stream ended inside a frame ({left} bytes left over)")
                    } else {
                        "the stream ended without its end-of-stream frame".into()
                    });
                }
            }
        }
    }
}

/// Read an error response's body into a [`CallError`].
pub(crate) async fn error_from(resp: reqwest::Response) -> CallError {
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        code: serde_json::Value,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_str::<Body>(&text) {
        Ok(b) => CallError::Status {
            status,
            code: match b.code {
                serde_json::Value::String(s) => s,
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            },
            message: b.message,
        },
        Err(_) => CallError::Status {
            status,
            code: String::new(),
            message: text.chars().take(300).collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_errors_classify_by_code_then_status() {
        let status = |status: u16, code: &str| CallError::Status {
            status,
            code: code.into(),
            message: String::new(),
        };
        assert_eq!(
            status(401, "unauthenticated").failure(),
            BackendFailure::Auth
        );
        // The Connect code wins over a generic status.
        assert_eq!(
            status(400, "deadline_exceeded").failure(),
            BackendFailure::Timeout
        );
        assert_eq!(status(403, "").failure(), BackendFailure::Auth);
        assert_eq!(status(429, "").failure(), BackendFailure::Exhausted);
        assert_eq!(status(500, "internal").failure(), BackendFailure::Rejected);
        assert_eq!(
            CallError::Protocol("odd frame".into()).failure(),
            BackendFailure::Protocol
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_transport_and_a_silent_server_timeout() {
        // A port with nothing listening: bind one, learn it, close it.
        let port = match std::net::TcpListener::bind("127.0.0.1:0") {
            Ok(l) => match l.local_addr() {
                Ok(a) => a.port(),
                Err(e) => panic!("{e}"),
            },
            Err(e) => panic!("{e}"),
        };
        let http = reqwest::Client::new();
        let e = match http.get(format!("http://127.0.0.1:{port}/")).send().await {
            Ok(r) => panic!("nothing listens, yet {}", r.status()),
            Err(e) => e,
        };
        assert!(e.is_connect(), "{e}");
        assert_eq!(CallError::Transport(e).failure(), BackendFailure::Transport);

        // A server that accepts and never answers.
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("{e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        let held = tokio::spawn(async move {
            let conn = listener.accept().await;
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            drop(conn);
        });
        let e = match http
            .get(format!("http://{addr}/"))
            .timeout(std::time::Duration::from_millis(200))
            .send()
            .await
        {
            Ok(r) => panic!("the server never answers, yet {}", r.status()),
            Err(e) => e,
        };
        held.abort();
        assert_eq!(http_failure(&e), BackendFailure::Timeout, "{e}");
    }

    #[test]
    fn an_envelope_is_flags_then_a_big_endian_length() {
        let e = encode(0, b"{\"a\":1}");
        assert_eq!(&e[..5], &[0x00, 0x00, 0x00, 0x00, 0x07]);
        assert_eq!(&e[5..], b"{\"a\":1}");
        let big = vec![b'x'; 0x01_02_03];
        let e = encode(0, &big);
        assert_eq!(&e[..5], &[0x00, 0x00, 0x01, 0x02, 0x03]);
        assert_eq!(e.len(), 5 + 0x01_02_03);
        let e = encode(FLAG_END_STREAM, b"{}");
        assert_eq!(e, [0x02, 0, 0, 0, 2, b'{', b'}']);
    }

    #[test]
    fn frames_split_anywhere_decode_the_same() {
        let mut wire = encode(0, br#"{"event":{"start":{"pid":7}}}"#);
        wire.extend(encode(0, br#"{"event":{"data":{"stdout":"aGkK"}}}"#));
        wire.extend(encode(FLAG_END_STREAM, b"{}"));
        for split in 0..wire.len() {
            let mut d = Decoder::default();
            let mut frames = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                d.push(part);
                while let Ok(Some(f)) = d.next_frame() {
                    frames.push(f);
                }
            }
            assert_eq!(frames.len(), 3, "split at {split}");
            assert_eq!(
                frames[0],
                Frame::Message(br#"{"event":{"start":{"pid":7}}}"#.to_vec())
            );
            assert_eq!(frames[2], Frame::End(None));
        }
    }

    #[test]
    fn the_end_frame_carries_an_error_or_nothing() {
        let mut d = Decoder::default();
        d.push(&encode(
            FLAG_END_STREAM,
            br#"{"error":{"code":"deadline_exceeded","message":"context deadline exceeded"}}"#,
        ));
        assert_eq!(
            d.next_frame(),
            Ok(Some(Frame::End(Some(ConnectError {
                code: "deadline_exceeded".into(),
                message: "context deadline exceeded".into()
            }))))
        );
        let mut d = Decoder::default();
        d.push(&[0x02, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(d.next_frame(), Ok(Some(Frame::End(None))));
        // Metadata in the end frame is ignored.
        let mut d = Decoder::default();
        d.push(&encode(FLAG_END_STREAM, br#"{"metadata":{"x":["y"]}}"#));
        assert_eq!(d.next_frame(), Ok(Some(Frame::End(None))));
    }

    #[test]
    fn a_partial_or_compressed_or_huge_frame_is_not_a_message() {
        let mut d = Decoder::default();
        d.push(&[0x00, 0, 0, 0, 9, b'{']);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.pending(), 6);
        let mut d = Decoder::default();
        d.push(&encode(FLAG_COMPRESSED, b"xx"));
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[0x00, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err());
    }
}
