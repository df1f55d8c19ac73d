//! The server's side of the quick framing ([`berth_client::quick`]): one
//! `exec` per connection, without HTTP/2.
//!
//! The call runs through the same method as gRPC's `ExecChecked` ([`Exec`] is
//! how the connection hands it over), so the checks, the session, the
//! cancellation when the client goes and the events are the same; only the
//! bytes on the socket differ.

use std::future::Future;
use std::pin::Pin;

use berth_client::quick::{MAGIC, body_len, frame};
use futures::{Stream, StreamExt};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tonic::Status;
use tracing::info;

use super::proto::{CheckedExec, ExecEvent, QuickRefusal, QuickReply, exec_event, quick_reply};

/// An `exec`'s events, as the gRPC method streams them.
pub type Events = Pin<Box<dyn Stream<Item = Result<ExecEvent, Status>> + Send>>;

/// What a connection does for a quick call.
pub trait Exec {
    /// Start the call: its events, or why it was refused.
    fn exec(&self, call: CheckedExec) -> impl Future<Output = Result<Events, Status>> + Send;
    /// Interrupt the running call `call_id` (Ctrl-C in the client).
    fn interrupt(&self, call_id: &str);
}

/// Whether a new connection speaks the quick framing: its first byte, read
/// without taking it (`MSG_PEEK`), is the magic's. `None`: it closed, or
/// failed, before saying anything.
pub async fn is_quick(stream: &UnixStream) -> Option<bool> {
    use std::os::fd::AsRawFd;
    loop {
        stream.readable().await.ok()?;
        let mut first = 0u8;
        let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
            // SAFETY: `first` is a live one-byte buffer and the fd is the
            // stream's, open for the call; MSG_PEEK leaves the byte queued.
            let n = unsafe {
                libc::recv(
                    stream.as_raw_fd(),
                    (&mut first as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n)
            }
        });
        match peeked {
            Ok(0) => return None,
            Ok(_) => return Some(first == MAGIC[0]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
    }
}

/// Serve one quick call on `stream`, whose first byte is the magic's.
pub async fn serve(stream: UnixStream, conn: impl Exec) {
    let (mut rd, mut wr) = stream.into_split();
    let mut magic = [0u8; MAGIC.len()];
    if rd.read_exact(&mut magic).await.is_err() || &magic != MAGIC {
        info!("a connection sent neither HTTP/2 nor the quick framing; closed");
        return;
    }
    // Before the call is read: a client that sees this knows a lost
    // connection from here on may have run its command (see the client).
    if wr.write_all(MAGIC).await.is_err() {
        return;
    }
    let call = match read_frame(&mut rd).await {
        Ok(Some(body)) => match CheckedExec::decode(body.as_slice()) {
            Ok(c) => c,
            Err(e) => {
                let refusal = Status::invalid_argument(format!("a malformed quick call: {e}"));
                let _ = send(&mut wr, refused(&refusal)).await;
                return;
            }
        },
        _ => return,
    };
    let mut events = match conn.exec(call).await {
        Ok(events) => events,
        Err(status) => {
            let _ = send(&mut wr, refused(&status)).await;
            return;
        }
    };
    // The client's later frames are interrupts; its end of the connection
    // means it is gone. They are read here, into `unread`, with `read_buf`,
    // which takes nothing from the socket when the other branch wins: no
    // frame is cut, and no task of its own is spawned for them (a second
    // spawn would hand the call's task to another worker to steal, and each
    // of its events would then wake a thread).
    let mut unread: Vec<u8> = Vec::new();
    // The call's id comes with its first event; an interrupt before that
    // waits for it.
    let mut call_id: Option<String> = None;
    let mut pending = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(e)) => {
                    if let Some(exec_event::Event::Started(id)) = &e.event {
                        if pending {
                            conn.interrupt(id);
                        }
                        call_id = Some(id.clone());
                        // The id is this side's to use (an interrupt names
                        // it); the client has no use for it, and a frame it
                        // need not wake for is one less wake-up per call.
                        continue;
                    }
                    let reply = QuickReply { reply: Some(quick_reply::Reply::Event(e)) };
                    if send(&mut wr, reply).await.is_err() {
                        break;
                    }
                }
                Some(Err(status)) => {
                    let _ = send(&mut wr, refused(&status)).await;
                    break;
                }
                None => break,
            },
            read = rd.read_buf(&mut unread) => {
                // The client hung up (or its end failed): dropping `events`
                // ends the call, as a dropped gRPC stream does.
                if !matches!(read, Ok(n) if n > 0) {
                    break;
                }
                match take_frames(&mut unread) {
                    Ok(0) => {}
                    Ok(_) => match &call_id {
                        Some(id) => conn.interrupt(id),
                        None => pending = true,
                    },
                    Err(_) => break,
                }
            }
        }
    }
}

/// Take the whole frames at the front of `unread` (the client's interrupts:
/// any frame after the call is one), leaving a partial one for the next
/// read; how many there were. A length over the limit is an error.
fn take_frames(unread: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut at = 0;
    let mut frames = 0;
    while let Some(head) = unread.get(at..at + 4) {
        let len = body_len([head[0], head[1], head[2], head[3]])?;
        if unread.len() < at + 4 + len {
            break;
        }
        at += 4 + len;
        frames += 1;
    }
    unread.drain(..at);
    Ok(frames)
}

fn refused(status: &Status) -> QuickReply {
    QuickReply {
        reply: Some(quick_reply::Reply::Refused(QuickRefusal {
            code: status.code() as i32,
            message: status.message().to_string(),
        })),
    }
}

async fn send(wr: &mut tokio::net::unix::OwnedWriteHalf, reply: QuickReply) -> std::io::Result<()> {
    wr.write_all(&frame(&reply.encode_to_vec())?).await
}

/// The next frame's body; `None` at a clean end between frames.
async fn read_frame(rd: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match rd.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; body_len(len)?];
    rd.read_exact(&mut body).await?;
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_frames_are_taken_and_a_partial_one_waits() -> std::io::Result<()> {
        let interrupt = frame(&[])?;
        let mut unread = [interrupt.clone(), interrupt.clone()].concat();
        unread.extend_from_slice(&frame(b"abc")?[..5]);
        assert_eq!(take_frames(&mut unread)?, 2);
        assert_eq!(unread, [0, 0, 0, 3, b'a']);
        unread.extend_from_slice(b"bc");
        assert_eq!(take_frames(&mut unread)?, 1);
        assert!(unread.is_empty());
        assert_eq!(take_frames(&mut unread)?, 0);
        let mut huge = vec![0xff; 4];
        assert!(take_frames(&mut huge).is_err());
        Ok(())
    }
}
