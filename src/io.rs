//! Where a subcommand's output goes: this process's stdout and stderr, or,
//! when `berth serve` runs the subcommand for a CLI client, that client's
//! stream.
//!
//! The server runs a client's `berth job …`, `sandbox …`, `events` or
//! `approve` with the same code the CLI runs in-process (as tmux's server runs
//! its clients' commands), inside [`for_client`]. Everything such a command
//! prints goes through [`out`]/[`err`] (or the `outln!`/`errln!` macros), which
//! look up the client of the task they run in: its bytes go to that client, in
//! order, and never to the server's own stdout. Outside such a task they go to
//! this process's stdout and stderr.
//!
//! The stream to a client is bounded in bytes ([`Live`]): a command that
//! prints much (job logs) waits in [`drained`] until the client has read
//! enough, so a slow client never grows the server's memory.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// One piece of a subcommand's output, for a client.
#[derive(Debug)]
pub enum Piece {
    /// Bytes for its stdout.
    Out(Vec<u8>),
    /// Bytes for its stderr.
    Err(Vec<u8>),
    /// The subcommand ended with this status.
    Exit(u8),
    /// The subcommand failed with this error.
    Error(String),
    /// The server stopped the subcommand as it shut down.
    Stopping(String),
}

tokio::task_local! {
    static CLIENT: Live<Piece>;
}

/// Run `fut` with everything it prints going to `client`.
pub async fn for_client<F: std::future::Future>(client: Live<Piece>, fut: F) -> F::Output {
    CLIENT.scope(client, fut).await
}

/// Whether this task prints for a remote client.
pub fn remote() -> bool {
    CLIENT.try_with(|_| ()).is_ok()
}

/// Write bytes to stdout (this process's, or the client's).
pub fn out(b: &[u8]) {
    if b.is_empty() {
        return;
    }
    if CLIENT
        .try_with(|c| c.send(Piece::Out(b.to_vec()), b.len()))
        .is_err()
    {
        let mut o = std::io::stdout().lock();
        // Nobody reads any more (`| head -1`): stop quietly, as SIGPIPE
        // would, rather than go on following into a closed pipe.
        if let Err(e) = o.write_all(b).and_then(|()| o.flush())
            && berth_client::closed_pipe(&e)
        {
            std::process::exit(berth_client::EXIT_CLOSED_STDOUT.into());
        }
    }
}

/// Write bytes to stderr (this process's, or the client's).
pub fn err(b: &[u8]) {
    if b.is_empty() {
        return;
    }
    if CLIENT
        .try_with(|c| c.send(Piece::Err(b.to_vec()), b.len()))
        .is_err()
    {
        let _ = std::io::stderr().lock().write_all(b);
    }
}

/// `println!` to [`out`].
macro_rules! outln {
    ($($t:tt)*) => {{
        let mut s = format!($($t)*);
        s.push('\n');
        $crate::io::out(s.as_bytes());
    }};
}

/// `eprintln!` to [`err`].
macro_rules! errln {
    ($($t:tt)*) => {{
        let mut s = format!($($t)*);
        s.push('\n');
        $crate::io::err(s.as_bytes());
    }};
}

pub(crate) use {errln, outln};

/// How many bytes may wait for a client before output is held back (job logs)
/// or left out of the live view (`exec`, whose spool keeps it all).
pub const LIVE_CAP: usize = 8 * 1024 * 1024;

/// The sending end of a byte-bounded stream to one client. Sending never
/// blocks (the engine's output callbacks are synchronous): [`Live::send`]
/// always queues, and [`Live::send_if_room`] refuses beyond the cap.
pub struct Live<T> {
    tx: mpsc::UnboundedSender<(T, usize)>,
    queued: Arc<AtomicUsize>,
    cap: usize,
}

impl<T> Clone for Live<T> {
    fn clone(&self) -> Self {
        Live {
            tx: self.tx.clone(),
            queued: self.queued.clone(),
            cap: self.cap,
        }
    }
}

/// The receiving end: yields items in order and gives their bytes back to
/// the sender's budget as it does.
pub struct LiveRx<T> {
    rx: mpsc::UnboundedReceiver<(T, usize)>,
    queued: Arc<AtomicUsize>,
}

/// A stream to a client that holds about `cap` bytes at most, unless told
/// to take more ([`Live::send`]).
pub fn live<T>(cap: usize) -> (Live<T>, LiveRx<T>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Live {
            tx,
            queued: queued.clone(),
            cap,
        },
        LiveRx { rx, queued },
    )
}

impl<T> Live<T> {
    /// Queue `item` of `bytes` bytes whatever the queue holds. False if the
    /// client is gone.
    pub fn send(&self, item: T, bytes: usize) -> bool {
        self.queued.fetch_add(bytes, Ordering::SeqCst);
        if self.tx.send((item, bytes)).is_err() {
            self.queued.fetch_sub(bytes, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Queue `item` only if the queue then stays within the cap. False if it
    /// did not fit or the client is gone.
    pub fn send_if_room(&self, item: T, bytes: usize) -> bool {
        if self.queued.load(Ordering::SeqCst) + bytes > self.cap {
            return false;
        }
        self.send(item, bytes)
    }

    /// Whether at most half the cap is queued: room to resume after leaving
    /// something out, without flapping at the edge.
    pub fn half_empty(&self) -> bool {
        self.queued.load(Ordering::SeqCst) <= self.cap / 2
    }

    /// Resolves when the client has gone (its stream was dropped).
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

impl<T> LiveRx<T> {
    /// The next item; `None` once every sender is gone and all was read.
    pub async fn recv(&mut self) -> Option<T> {
        let (item, bytes) = self.rx.recv().await?;
        self.queued.fetch_sub(bytes, Ordering::SeqCst);
        Some(item)
    }

    /// The items as a stream, for a gRPC reply.
    pub fn into_stream(self) -> impl futures::Stream<Item = T> {
        futures::stream::unfold(self, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[tokio::test]
    async fn a_slow_reader_bounds_what_waits_for_it() -> TestResult {
        let (tx, mut rx) = live::<Vec<u8>>(100);
        assert!(tx.send_if_room(vec![0; 60], 60));
        // 60 + 60 > 100: left out, and the queue still holds 60 bytes only.
        assert!(!tx.send_if_room(vec![0; 60], 60));
        assert!(tx.send(vec![1; 60], 60), "send always queues");
        assert!(!tx.half_empty(), "120 queued");
        assert_eq!(rx.recv().await.map(|v| v.len()), Some(60));
        // 60 left, over half the cap.
        assert!(!tx.half_empty(), "60 > 50 still queued");
        assert_eq!(rx.recv().await, Some(vec![1; 60]));
        assert!(tx.half_empty());
        assert!(tx.send_if_room(vec![2; 100], 100), "room again");
        Ok(())
    }

    #[tokio::test]
    async fn a_gone_reader_refuses_more() -> TestResult {
        let (tx, rx) = live::<Vec<u8>>(10);
        assert!(tx.send(vec![0; 50], 50));
        drop(rx);
        assert!(!tx.send(vec![0], 1));
        tokio::time::timeout(std::time::Duration::from_secs(5), tx.closed()).await?;
        Ok(())
    }

    #[tokio::test]
    async fn output_goes_to_the_client_of_its_task_in_order() {
        let (tx, mut rx) = live::<Piece>(LIVE_CAP);
        for_client(tx, async {
            assert!(remote());
            outln!("one {}", 1);
            errln!("warn");
            out(b"two");
        })
        .await;
        assert!(!remote());
        let mut got = Vec::new();
        while let Some(p) = rx.recv().await {
            got.push(match p {
                Piece::Out(b) => format!("out:{}", String::from_utf8_lossy(&b)),
                Piece::Err(b) => format!("err:{}", String::from_utf8_lossy(&b)),
                other => format!("{other:?}"),
            });
        }
        assert_eq!(got, ["out:one 1\n", "err:warn\n", "out:two"]);
    }
}
