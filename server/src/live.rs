//! The bounded streams the server writes to its clients.
//!
//! A stream to a client is bounded in bytes ([`Live`]): what a command
//! prints faster than its client reads is left out of the live view and
//! counted, so a slow client never grows the server's memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

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
}
