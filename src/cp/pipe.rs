//! Bytes between the blocking thread that packs or unpacks here and the
//! pipes of a process in the sandbox, in bounded chunks: a copy holds at
//! most [`DEPTH`] chunks of [`CHUNK`] bytes in memory, whatever its size.
//! A slow side holds the other back (the channel is full), never grows it.

use std::io::{self, Read, Write};
use std::sync::Arc;

use berth_core::backend::{BoxRead, BoxWrite};
use bytes::{Buf, Bytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::progress::Progress;

/// Bytes per chunk.
pub const CHUNK: usize = 256 * 1024;
/// Chunks in flight between the two sides.
pub const DEPTH: usize = 8;

/// A `Write` for the blocking side whose bytes [`feed`] writes to a process.
pub struct ChunkWriter {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    /// A writer and the receiver [`feed`] takes.
    pub fn new() -> (ChunkWriter, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(DEPTH);
        let w = ChunkWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        (w, rx)
    }

    fn send(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx.blocking_send(Bytes::from(chunk)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the sandbox's side of the copy stopped reading",
            )
        })
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

/// A `Read` for the blocking side of what [`pump`] reads from a process.
pub struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    cur: Bytes,
}

impl ChunkReader {
    /// A reader and the sender [`pump`] takes.
    pub fn new() -> (ChunkReader, mpsc::Sender<io::Result<Bytes>>) {
        let (tx, rx) = mpsc::channel(DEPTH);
        let r = ChunkReader {
            rx,
            cur: Bytes::new(),
        };
        (r, tx)
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        self.cur.advance(n);
        Ok(n)
    }
}

/// Write what arrives on `rx` to `w` (a process's stdin), counted on
/// `progress`, then close `w` so the process sees the end.
pub async fn feed(
    mut rx: mpsc::Receiver<Bytes>,
    mut w: BoxWrite,
    progress: &Arc<Progress>,
) -> io::Result<()> {
    while let Some(chunk) = rx.recv().await {
        w.write_all(&chunk).await?;
        progress.add(chunk.len() as u64);
    }
    w.shutdown().await?;
    drop(w);
    Ok(())
}

/// Read `r` (a process's stdout) into `tx`, counted on `progress`. When
/// the blocking side stops taking chunks (it read the archive's end), the
/// rest is read and dropped, so the process can finish writing.
pub async fn pump(mut r: BoxRead, tx: mpsc::Sender<io::Result<Bytes>>, progress: &Arc<Progress>) {
    let mut buf = vec![0u8; CHUNK];
    let mut taken = true;
    loop {
        match r.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => {
                progress.add(n as u64);
                if taken
                    && tx
                        .send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                {
                    taken = false;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// All of `r` read, the first `keep` bytes kept: a process's stderr (or an
/// output nobody expects), read to its end so the process never blocks on it.
pub async fn collect(r: Option<BoxRead>, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut r) = r else {
        return kept;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = keep.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_cross_both_ways_whole_and_in_order() -> anyhow::Result<()> {
        let progress = Arc::new(Progress::off());
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i % 251) as u8).collect();
        // Blocking writer -> feed -> an in-memory pipe -> pump -> blocking reader.
        let (mut w, rx) = ChunkWriter::new();
        let (r, tx) = ChunkReader::new();
        let (pipe_w, pipe_r) = tokio::io::duplex(64 * 1024);
        let sent = data.clone();
        let writer = tokio::task::spawn_blocking(move || {
            w.write_all(&sent)?;
            w.flush()
        });
        let reader = tokio::task::spawn_blocking(move || {
            let mut r = r;
            let mut got = Vec::new();
            r.read_to_end(&mut got).map(|_| got)
        });
        let (fed, ()) = tokio::join!(
            feed(rx, Box::pin(pipe_w), &progress),
            pump(Box::pin(pipe_r), tx, &progress)
        );
        fed?;
        writer.await??;
        let got = reader.await??;
        assert_eq!(got, data);
        assert_eq!(progress.done(), 2 * data.len() as u64);
        Ok(())
    }
}
