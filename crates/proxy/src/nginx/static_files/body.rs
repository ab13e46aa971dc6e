//! A file's bytes as a response body: read in chunks of 128 KiB on
//! tokio's blocking pool (one read in flight), between bytes of its own
//! (the parts of a multipart/byteranges answer). A file that is small
//! enough is read at once by the caller instead (see [`SMALL`]).

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::wire::payload::BoxError;

/// Up to this many bytes of a file are read on the worker when the
/// answer is made (one `pread` of a page-cached file, as nginx's
/// blocking read); more are streamed from the blocking pool.
pub(crate) const SMALL: u64 = 64 * 1024;

/// The size of one read of a streamed file.
const CHUNK: u64 = 128 * 1024;

/// A piece of the body.
pub(crate) enum Piece {
    /// Bytes of vigil's own (a multipart boundary).
    Bytes(Bytes),
    /// `len` bytes of the file from `offset`.
    File { offset: u64, len: u64 },
}

/// A response body read from a file.
pub(crate) struct FileBody {
    file: Arc<File>,
    /// The file's name, for the error of a read that fails.
    name: Arc<str>,
    pieces: VecDeque<Piece>,
    /// Bytes still to send.
    remaining: u64,
    pending: Option<tokio::task::JoinHandle<io::Result<Bytes>>>,
}

impl FileBody {
    pub(crate) fn new(file: File, name: Arc<str>, pieces: Vec<Piece>) -> Self {
        let remaining = pieces
            .iter()
            .map(|p| match p {
                Piece::Bytes(b) => b.len() as u64,
                Piece::File { len, .. } => *len,
            })
            .sum();
        Self {
            file: Arc::new(file),
            name,
            pieces: pieces.into(),
            remaining,
            pending: None,
        }
    }
}

/// `len` bytes at `offset`, or an error when the file is shorter now
/// (nginx: "was truncated").
pub(crate) fn read_at(file: &File, offset: u64, len: u64) -> io::Result<Bytes> {
    let n = usize::try_from(len).map_err(|_| io::Error::other("read too large"))?;
    let mut buf = vec![0u8; n];
    let mut done = 0;
    while done < n {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "was truncated",
                ))
            }
            Ok(k) => done += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Bytes::from(buf))
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(h) = this.pending.as_mut() {
                let r = std::task::ready!(Pin::new(h).poll(cx));
                this.pending = None;
                let bytes = match r {
                    Ok(Ok(b)) => b,
                    Ok(Err(e)) => {
                        tracing::error!("read() \"{}\" failed: {e}", this.name);
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                    Err(e) => return Poll::Ready(Some(Err(Box::new(e)))),
                };
                this.remaining = this.remaining.saturating_sub(bytes.len() as u64);
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            let Some(piece) = this.pieces.front_mut() else {
                return Poll::Ready(None);
            };
            match piece {
                Piece::Bytes(b) => {
                    let b = std::mem::take(b);
                    this.pieces.pop_front();
                    this.remaining = this.remaining.saturating_sub(b.len() as u64);
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Piece::File { offset, len } => {
                    let n = (*len).min(CHUNK);
                    let at = *offset;
                    *offset += n;
                    *len -= n;
                    if *len == 0 {
                        this.pieces.pop_front();
                    }
                    if n == 0 {
                        continue;
                    }
                    let file = this.file.clone();
                    this.pending = Some(tokio::task::spawn_blocking(move || read_at(&file, at, n)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0 && self.pending.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
