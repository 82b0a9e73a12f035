//! Sequential frame reading with a bounded, reused buffer.
//!
//! The reader tells a torn tail (what a crash leaves: a prefix of the last frame, a last frame
//! whose checksum fails, or a zero-filled extension) from corruption (a bad frame with bytes
//! after it). It never panics on file contents and never buffers more than one frame plus its
//! read-ahead, so memory does not grow with the length of the file; nor with a length a frame
//! only declares: the buffer grows by at most the read-ahead per read, as bytes arrive.
//!
//! A reader may be bounded: with `limit`, bytes at or after that offset do not exist for it
//! (a reader of an open WAL stops at its writer's published fsynced end).

use std::io;

use super::frame::{self, DecodeError, Frame, PREFIX_LEN};
use super::storage::WalRead;

/// The largest read-ahead, reached by doubling from [`FIRST_READ_AHEAD`]: a long scan reads in
/// big steps, while a short file (a CLI turn's session, a read of a small page) costs one
/// small read, not a 256 KiB buffer zeroed and faulted in.
const READ_AHEAD: usize = 256 << 10;
const FIRST_READ_AHEAD: usize = 16 << 10;

/// One step of a scan.
#[derive(Debug)]
pub enum Next<'a> {
    /// A complete frame starting at `offset` and `len` bytes long.
    Frame { offset: u64, len: usize, frame: Frame<'a> },
    /// The clean end of the file.
    End { offset: u64 },
    /// A torn last frame: `bytes` bytes from `offset` to the end of the file.
    Torn { offset: u64, bytes: u64 },
    /// A bad frame with more bytes after it: corruption.
    Corrupt { offset: u64, reason: &'static str },
}

pub struct FrameReader {
    file: Box<dyn WalRead>,
    /// The end of what this reader may see (`None`: the end of the file).
    limit: Option<u64>,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_offset: u64,
    /// Start of the unread part of `buf`.
    pos: usize,
    eof: bool,
    /// The read-ahead of the next fill: doubles from [`FIRST_READ_AHEAD`] to [`READ_AHEAD`].
    ahead: usize,
}

impl FrameReader {
    /// Reads frames from `offset` on, up to `limit` (or the end of the file).
    pub fn new(file: Box<dyn WalRead>, offset: u64, limit: Option<u64>) -> Self {
        let buf = Vec::with_capacity(FIRST_READ_AHEAD);
        FrameReader { file, limit, buf, buf_offset: offset, pos: 0, eof: false, ahead: FIRST_READ_AHEAD }
    }

    /// File offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.buf_offset + self.pos as u64
    }

    /// Makes at least `want` unread bytes available, or as many as the file has.
    fn fill(&mut self, want: usize) -> io::Result<()> {
        if self.buf.len() - self.pos >= want || self.eof {
            return Ok(());
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.buf_offset += self.pos as u64;
            self.pos = 0;
        }
        let target = want.max(self.ahead);
        self.ahead = (self.ahead * 2).min(READ_AHEAD);
        while self.buf.len() < target {
            let have = self.buf.len();
            let at = self.buf_offset + have as u64;
            // At most READ_AHEAD more per read: a frame's declared length (up to MAX_BODY_LEN)
            // is only a claim, so the buffer grows with the bytes the file really holds.
            let step = (target - have).min(READ_AHEAD);
            let room = match self.limit {
                Some(limit) => limit.saturating_sub(at).min(step as u64) as usize,
                None => step,
            };
            if room == 0 {
                self.eof = true;
                break;
            }
            self.buf.resize(have + room, 0);
            let n = match self.file.read_at(&mut self.buf[have..], at) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    self.buf.truncate(have);
                    continue;
                }
                Err(e) => {
                    self.buf.truncate(have);
                    return Err(e);
                }
            };
            self.buf.truncate(have + n);
            if n == 0 {
                self.eof = true;
                break;
            }
            if self.buf.len() >= want {
                break;
            }
        }
        Ok(())
    }

    /// The next frame, the end, or the reason there is none.
    pub fn next_frame(&mut self) -> io::Result<Next<'_>> {
        self.fill(PREFIX_LEN)?;
        let offset = self.offset();
        let avail = self.buf.len() - self.pos;
        if avail == 0 {
            return Ok(Next::End { offset });
        }
        let len = match frame::body_len(&self.buf[self.pos..]) {
            Ok(len) => len,
            Err(DecodeError::Incomplete) => return Ok(Next::Torn { offset, bytes: avail as u64 }),
            Err(_) => return self.bad_length(offset),
        };
        self.fill(PREFIX_LEN + len)?;
        let avail = self.buf.len() - self.pos;
        let start = self.pos;
        match frame::decode(&self.buf[start..]) {
            Ok((frame, total)) => {
                self.pos += total;
                Ok(Next::Frame { offset, len: total, frame })
            }
            Err(DecodeError::Incomplete) => Ok(Next::Torn { offset, bytes: avail as u64 }),
            Err(DecodeError::BadChecksum) if avail == PREFIX_LEN + len => {
                Ok(Next::Torn { offset, bytes: avail as u64 })
            }
            Err(DecodeError::BadChecksum) => Ok(Next::Corrupt { offset, reason: "checksum mismatch" }),
            Err(DecodeError::BadLength) => Ok(Next::Corrupt { offset, reason: "damaged frame length" }),
            Err(DecodeError::Malformed(reason)) => Ok(Next::Corrupt { offset, reason }),
        }
    }

    /// A length that fails its check is torn only when everything from here to the end of the
    /// file is zero (a zero-filled extension left by a crash); otherwise it is damage.
    fn bad_length(&mut self, offset: u64) -> io::Result<Next<'_>> {
        let mut rest = 0u64;
        loop {
            let unread = &self.buf[self.pos..];
            if unread.iter().any(|&b| b != 0) {
                return Ok(Next::Corrupt { offset, reason: "damaged frame length" });
            }
            rest += unread.len() as u64;
            self.pos = self.buf.len();
            if self.eof {
                return Ok(Next::Torn { offset, bytes: rest });
            }
            self.fill(1)?;
            if self.buf.len() == self.pos {
                return Ok(Next::Torn { offset, bytes: rest });
            }
        }
    }
}
