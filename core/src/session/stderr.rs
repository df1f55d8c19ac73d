//! A session shell's own stderr: the task that reads it, and a command's
//! stderr kept apart from its stdout up to the fence the shell writes after
//! it (see `script`, stdin flags `2` and `3`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::Notify;
use tracing::debug;

use super::{Capture, STDERR_KEEP};
use crate::error::Result;

/// Read the shell's stderr to its end, handing each piece to the command
/// that keeps its stderr apart, or else to the bounded tail.
pub(super) async fn keep_tail(
    mut err: crate::backend::BoxRead,
    feed: Arc<Mutex<ErrFeed>>,
    bell: Arc<Notify>,
    name: String,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match err.read(&mut buf).await {
            // A re-attached link: the stream goes on.
            Err(e) if crate::backend::OutputGap::of(&e).is_some() => continue,
            Ok(0) | Err(_) => {
                if let Ok(mut f) = feed.lock() {
                    f.closed = true;
                }
                bell.notify_one();
                return;
            }
            Ok(n) => {
                if let Ok(mut f) = feed.lock() {
                    match f.live.as_mut() {
                        Some(live) => live.extend_from_slice(&buf[..n]),
                        None => {
                            debug!(session = %name, stderr = %String::from_utf8_lossy(&buf[..n]), "shell stderr");
                            f.keep(&buf[..n]);
                        }
                    }
                }
                bell.notify_one();
            }
        }
    }
}

/// Where the shell's own stderr goes. The shell writes a command's stderr
/// there only when the command asked for it apart (see `script`); everything
/// else that arrives (the sandbox wrapper's refusal, a shell dying) is kept
/// as a bounded tail for diagnostics.
#[derive(Default)]
pub(super) struct ErrFeed {
    /// The last bytes that arrived while no command took them.
    pub(super) tail: Vec<u8>,
    /// While a command keeps its stderr apart: what arrived since it was
    /// last taken.
    pub(super) live: Option<Vec<u8>>,
    /// The stream ended.
    pub(super) closed: bool,
}

impl ErrFeed {
    /// Keep `bytes` in the bounded tail.
    pub(super) fn keep(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
        let len = self.tail.len();
        if len > STDERR_KEEP {
            self.tail.drain(..len - STDERR_KEEP);
        }
    }
}

/// A command's stderr, kept apart from its stdout: what the shell's stderr
/// reader hands on, up to the fence the shell's report writes after the
/// command (`\x1e<nonce>E\x1e`, with the end nonce, or the cut nonce when
/// the command did not end on its own). Neither nonce is known to the
/// command while it runs, so it cannot end its stderr early.
pub(super) struct ErrSide<'a> {
    capture: &'a mut Capture,
    feed: Arc<Mutex<ErrFeed>>,
    pub(super) bell: Arc<Notify>,
    fences: [Vec<u8>; 2],
    /// Bytes not yet given to the capture: they may start a fence.
    held: Vec<u8>,
    /// The fence came, or the stream ended.
    pub(super) done: bool,
}

impl<'a> ErrSide<'a> {
    pub(super) fn new(
        capture: &'a mut Capture,
        feed: Arc<Mutex<ErrFeed>>,
        bell: Arc<Notify>,
        nonce: &str,
        cut_nonce: &str,
    ) -> Self {
        if let Ok(mut f) = feed.lock() {
            f.live = Some(Vec::new());
        }
        let fence = |n: &str| format!("\u{1e}{n}E\u{1e}").into_bytes();
        ErrSide {
            capture,
            feed,
            bell,
            fences: [fence(nonce), fence(cut_nonce)],
            held: Vec::new(),
            done: false,
        }
    }

    /// Take what arrived: up to a fence, into the capture.
    pub(super) fn take(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        let closed = {
            let Ok(mut f) = self.feed.lock() else {
                self.done = true;
                return Ok(());
            };
            if let Some(live) = f.live.as_mut() {
                if self.held.is_empty() {
                    std::mem::swap(&mut self.held, live);
                } else {
                    self.held.append(live);
                }
            }
            f.closed
        };
        let found = self
            .fences
            .iter()
            .filter_map(|f| memchr::memmem::find(&self.held, f).map(|i| (i, f.len())))
            .min();
        if let Some((at, len)) = found {
            self.capture.push(&self.held[..at])?;
            let after = self.held.split_off(at + len);
            self.held.clear();
            self.done = true;
            if let Ok(mut f) = self.feed.lock() {
                f.live = None;
                f.keep(&after);
            }
            return Ok(());
        }
        if closed {
            self.finish()?;
            return Ok(());
        }
        // Keep back only what may be the start of a fence.
        let keep = self.fences[0].len() - 1;
        if self.held.len() > keep {
            let rest = self.held.split_off(self.held.len() - keep);
            self.capture.push(&self.held)?;
            self.held = rest;
        }
        Ok(())
    }

    /// No fence is coming (the stream ended, or the wait for it did): what
    /// is held is the command's, and the shell's stderr goes back to the tail.
    fn finish(&mut self) -> Result<()> {
        self.done = true;
        if let Ok(mut f) = self.feed.lock() {
            f.live = None;
        }
        let held = std::mem::take(&mut self.held);
        self.capture.push(&held)
    }

    /// After the stdout side ended: wait up to `limit` for the fence.
    pub(super) async fn settle(&mut self, limit: Duration) -> Result<()> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            self.take()?;
            if self.done {
                return Ok(());
            }
            let bell = self.bell.clone();
            if tokio::time::timeout_at(until, bell.notified())
                .await
                .is_err()
            {
                self.take()?;
                if !self.done {
                    debug!("no stderr fence within {limit:?}");
                    self.finish()?;
                }
                return Ok(());
            }
        }
    }
}

impl Drop for ErrSide<'_> {
    fn drop(&mut self) {
        if !self.done
            && let Ok(mut f) = self.feed.lock()
        {
            f.live = None;
        }
    }
}

/// How long the stderr side of a command that ended has to deliver its
/// fence: it was written before the end marker, so it is in flight only
/// where the two streams travel apart (E2B, Modal).
pub(super) const FENCE_WAIT: Duration = Duration::from_secs(2);
