//! `berth exec` over the quick framing: the served call people make most,
//! without HTTP/2, tonic or an async runtime in the client.
//!
//! Why a second framing beside gRPC: a served `exec` from the CLI is one call
//! on a new connection, and most of its cost was fixed work around the call,
//! not the call (docs/PERFORMANCE.md, "Where a served local call's time goes"):
//! a tokio runtime in the client, and on both sides HTTP/2's connection
//! preface, settings and window updates, each a socket write and a wake-up.
//! Here the client makes one blocking write and one read per event. The
//! messages are the protocol's own (`CheckedExec`, `ExecEvent`), so the
//! server runs the call exactly as it runs `ExecChecked`, and the client
//! prints it with the same code ([`crate::report::on_exec_event`]).
//!
//! The wire, on the server's one socket (the server tells the two apart by
//! the first byte: HTTP/2's preface starts with `P`, this with `b`):
//! 1. the client sends [`MAGIC`], then one frame holding a `CheckedExec`;
//! 2. the server sends [`MAGIC`] back *before it reads the call*, then frames
//!    holding `QuickReply`: a refusal, or the call's events up to its report
//!    (all but `Started`: the call's id is the server's to use, which maps
//!    an interrupt to it, and the report carries it);
//! 3. on Ctrl-C the client sends a frame holding `QuickInterrupt`.
//!
//! A frame is a 4-byte big-endian length, then that many bytes of protobuf.
//!
//! When this path steps aside ([`exec`] returns `None`), the gRPC path runs the
//! call instead: no server listens (it starts one, or says none runs), the
//! server is another build (it is replaced by the handshake), or it predates
//! this framing. Stepping aside is safe only while the call cannot have run:
//! the server's answering magic comes before it reads the call, so a
//! connection that ends before the magic never ran it; one that ends after
//! it, before the report, is a lost server (exit 125), never a second run.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Result, bail};
use prost::Message;

use crate::proto::{CheckedExec, ExecCall, QuickInterrupt, QuickReply, quick_reply};
use crate::report::{Step, lost, on_exec_event};

/// The first bytes each side sends. Its first byte is not HTTP/2's `P`.
pub const MAGIC: &[u8; 8] = b"berthq1\n";

/// The largest frame either side takes (a report's kept output is far less).
pub const MAX_FRAME: usize = 64 << 20;

/// `berth exec` through the server over the quick framing, blocking. `None`:
/// nothing ran; make the call over gRPC instead (see the module doc).
pub fn exec(
    state_dir: &Path,
    call: &ExecCall,
    json: bool,
    early: Option<Early>,
) -> Result<Option<u8>> {
    crate::check_socket_path(state_dir)?;
    let connected = match early {
        Some(e) if e.state_dir == state_dir => Ok(e.stream),
        _ => UnixStream::connect(crate::socket_path(state_dir)),
    };
    let Ok(mut stream) = connected else {
        return Ok(None);
    };
    let pid = peer_pid(&stream);
    let checked = CheckedExec {
        client: Some(crate::identity()),
        call: Some(call.clone()),
    };
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&frame(&checked.encode_to_vec())?);
    if stream.write_all(&hello).is_err() {
        return Ok(None);
    }
    let mut magic = [0u8; MAGIC.len()];
    if stream.read_exact(&mut magic).is_err() || &magic != MAGIC {
        // An older server closes a connection it cannot read; nothing ran.
        tracing::debug!(pid, "the server does not speak the quick framing");
        return Ok(None);
    }
    tracing::debug!(pid, "connected to the berth server (quick framing)");
    // Ctrl-C from here on interrupts the command, not the client.
    let mut interrupts = Interrupts::default();
    interrupts.catch();
    let mut sent_interrupt = 0;
    loop {
        // A Ctrl-C: the first interrupts the command (its report follows),
        // a second stops waiting for it.
        let n = interrupts.count();
        if n > 1 {
            eprintln!("berth: interrupted again; not waiting for the command's report");
            return Ok(Some(130));
        }
        if n > sent_interrupt {
            sent_interrupt = n;
            let _ = stream.write_all(&frame(&QuickInterrupt {}.encode_to_vec())?);
        }
        let body = match read_frame(&mut stream) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(Some(lost(pid, json, "the stream ended without a report"))),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Ok(Some(lost(pid, json, &e.to_string()))),
        };
        let reply = QuickReply::decode(body.as_slice())
            .map_err(|e| anyhow::anyhow!("the berth server sent a malformed reply: {e}"))?;
        match reply.reply {
            Some(quick_reply::Reply::Refused(r)) => {
                match tonic::Code::from(r.code) {
                    tonic::Code::FailedPrecondition | tonic::Code::Unimplemented => {
                        if interrupts.count() > 0 {
                            // Nothing ran; the person asked to stop.
                            eprintln!("berth: interrupted before the command started");
                            return Ok(Some(130));
                        }
                        tracing::debug!(
                            pid,
                            reason = r.message,
                            "the server did not take the quick call"
                        );
                        return Ok(None);
                    }
                    tonic::Code::PermissionDenied => {
                        bail!("the berth server refused this client: {}", r.message)
                    }
                    tonic::Code::InvalidArgument => bail!("{}", r.message),
                    _ => return Ok(Some(lost(pid, json, &r.message))),
                }
            }
            Some(quick_reply::Reply::Event(e)) => match on_exec_event(e.event, json)? {
                Step::Done(code) => return Ok(Some(code)),
                Step::Started(_) | Step::Next => {}
            },
            None => {}
        }
    }
}

/// A connection made before the command line is parsed, to the server of
/// the state directory the environment names ([`Early::connect`]).
pub struct Early {
    state_dir: std::path::PathBuf,
    stream: UnixStream,
}

impl Early {
    /// Connect to the server of the state directory that `BERTH_STATE_DIR`,
    /// else the default, names, so that the server wakes, accepts and checks
    /// its peer while this process parses its line and builds the call.
    /// [`exec`] uses it when the parsed line names the same directory; else
    /// it is dropped, and the server sees a connection end before its first
    /// byte, which it closes without a word. `None`: no server listens there.
    pub fn connect() -> Option<Early> {
        let state_dir = match std::env::var_os("BERTH_STATE_DIR").filter(|v| !v.is_empty()) {
            Some(d) => std::path::PathBuf::from(d),
            None => crate::state_dir(None).ok()?,
        };
        crate::check_socket_path(&state_dir).ok()?;
        let stream = UnixStream::connect(crate::socket_path(&state_dir)).ok()?;
        Some(Early { state_dir, stream })
    }
}

/// `body` as a frame: its length, then itself.
pub fn frame(body: &[u8]) -> std::io::Result<Vec<u8>> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|n| (*n as usize) <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other("a frame over the size limit"))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

/// The length of the body behind a frame's first four bytes, within the limit.
pub fn body_len(head: [u8; 4]) -> std::io::Result<usize> {
    let n = u32::from_be_bytes(head) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a frame of {n} bytes, over the {MAX_FRAME}-byte limit"
        )));
    }
    Ok(n)
}

/// The next frame's body; `None` at a clean end between frames.
fn read_frame(stream: &mut UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match stream.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            // Ctrl-C before a frame began: the caller decides.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted && got == 0 => return Err(e),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut body = vec![0u8; body_len(len)?];
    // read_exact retries after EINTR: a Ctrl-C mid-frame is seen after it.
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

/// The server's pid, from the socket's peer credentials (0 if unknown).
fn peer_pid(stream: &UnixStream) -> u32 {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live locals of the sizes given; the fd is
    // the stream's, open for this call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        u32::try_from(cred.pid).unwrap_or(0)
    } else {
        0
    }
}

/// Ctrl-Cs seen since [`Interrupts::catch`].
static CTRL_C: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_sigint(_: libc::c_int) {
    CTRL_C.fetch_add(1, Ordering::SeqCst);
}

/// SIGINT counted instead of ending the process, while the command runs: a
/// blocking read returns `Interrupted` (no `SA_RESTART`) and the loop sends
/// the interrupt. The previous disposition comes back on drop.
#[derive(Default)]
struct Interrupts {
    old: Option<libc::sigaction>,
}

impl Interrupts {
    fn catch(&mut self) {
        if self.old.is_some() {
            return;
        }
        // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags).
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigint as *const () as libc::sighandler_t;
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live locals; the handler only touches
        // an atomic, which is async-signal-safe.
        if unsafe { libc::sigaction(libc::SIGINT, &new, &mut old) } == 0 {
            self.old = Some(old);
        }
    }

    fn count(&self) -> u32 {
        CTRL_C.load(Ordering::SeqCst)
    }
}

impl Drop for Interrupts {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            // SAFETY: `old` is the disposition sigaction returned above.
            unsafe { libc::sigaction(libc::SIGINT, &old, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn a_frame_survives_being_split_and_a_cut_one_is_an_error() -> TestResult {
        let (mut a, mut b) = UnixStream::pair()?;
        let f = frame(b"hello")?;
        // Sent in three pieces, read as one frame.
        a.write_all(&f[..2])?;
        a.write_all(&f[2..6])?;
        a.write_all(&f[6..])?;
        assert_eq!(read_frame(&mut b)?, Some(b"hello".to_vec()));
        // An empty frame (an interrupt) is a frame.
        a.write_all(&frame(b"")?)?;
        assert_eq!(read_frame(&mut b)?, Some(Vec::new()));
        // A length with its body cut short is an error, not a frame.
        a.write_all(&[0, 0, 0, 9, b'x'])?;
        drop(a);
        assert!(read_frame(&mut b).is_err());
        Ok(())
    }

    #[test]
    fn an_end_between_frames_is_clean_and_mid_length_is_not() -> TestResult {
        let (a, mut b) = UnixStream::pair()?;
        drop(a);
        assert_eq!(read_frame(&mut b)?, None);
        let (mut a, mut b) = UnixStream::pair()?;
        a.write_all(&[0, 0])?;
        drop(a);
        assert!(read_frame(&mut b).is_err());
        Ok(())
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_both_ways() -> TestResult {
        let (mut a, mut b) = UnixStream::pair()?;
        a.write_all(&u32::MAX.to_be_bytes())?;
        let e = read_frame(&mut b)
            .err()
            .ok_or("an oversized frame was read")?;
        assert!(e.to_string().contains("limit"), "{e}");
        assert!(frame(&vec![0u8; MAX_FRAME + 1]).is_err());
        Ok(())
    }

    #[test]
    fn the_magic_is_not_http2s_first_byte() {
        assert_ne!(MAGIC[0], b"PRI * HTTP/2.0"[0]);
    }
}
