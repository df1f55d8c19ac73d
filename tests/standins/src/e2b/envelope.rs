//! Connect's envelope: the framing of every message on a streaming call.
//!
//! One envelope is 1 byte of flags, a 4-byte big-endian payload length, then
//! the payload. Flag `0x02` marks the end-of-stream message, whose JSON payload
//! is `{}` or `{"error":{"code","message"}}`; `0x01` marks a compressed payload,
//! which this stand-in never sends and refuses to receive.

/// Flag bit: the payload is compressed.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;

/// Frame one payload with `flags`.
pub fn encode(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The end-of-stream envelope: `{}`, or the error.
pub fn end_stream(error: Option<(&str, &str)>) -> Vec<u8> {
    let body = match error {
        None => serde_json::json!({}),
        Some((code, message)) => serde_json::json!({"error": {"code": code, "message": message}}),
    };
    encode(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Split a request body holding exactly one uncompressed message envelope.
pub fn decode_single(body: &[u8]) -> Result<&[u8], String> {
    if body.len() < 5 {
        return Err(format!(
            "request body of {} bytes is shorter than an envelope header",
            body.len()
        ));
    }
    let flags = body[0];
    if flags & FLAG_COMPRESSED != 0 {
        return Err("compressed request envelopes are not supported".into());
    }
    if flags & FLAG_END_STREAM != 0 {
        return Err("a request envelope cannot be an end-of-stream message".into());
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let payload = &body[5..];
    if payload.len() != len {
        return Err(format!(
            "envelope says {len} bytes, the body holds {}",
            payload.len()
        ));
    }
    Ok(payload)
}
