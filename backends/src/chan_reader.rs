//! The read side of a process's stdout or stderr when a pump task feeds it.
//!
//! The docker, ssh and modal transports each demultiplex one connection into per-stream
//! channels of byte chunks. Reading such a channel is exactly what
//! `tokio_util`'s `StreamReader` does, so all three use it through [`channel_reader`]
//! rather than each keeping its own `AsyncRead`.

use std::io;

use berth_core::backend::BoxRead;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::io::StreamReader;

/// An `AsyncRead` over a pump's channel: chunks are read in order, an `Err`
/// chunk surfaces as a read error, and end-of-file comes once the pump drops
/// its sender.
pub(crate) fn channel_reader(mut rx: mpsc::Receiver<io::Result<Bytes>>) -> BoxRead {
    let chunks = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Box::pin(StreamReader::new(chunks))
}
