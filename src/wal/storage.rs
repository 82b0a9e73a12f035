//! The WAL's storage seam: what a WAL file is to the code that frames and recovers it.
//!
//! [`FileStorage`] is the real thing (files, `fdatasync`). [`crash::CrashStorage`] wraps it for
//! tests: it remembers how much of each file is durable, can drop everything written since
//! the last fsync (a power loss), and can fail a write or an fsync on a countdown.
//!
//! The crash model (what the WAL assumes of its media, written down as the tests check it):
//! - bytes written and then covered by a successful `sync_data` survive a power loss;
//! - bytes written after the last successful `sync_data` may be lost, whole or in part (a
//!   prefix may survive: a torn tail), but are never reordered before durable bytes;
//! - a failed write or fsync leaves the file's unsynced tail in an unknown state; the WAL
//!   latches the failure and never retries the fsync;
//! - `create` (temp file, rename) is atomic for readers but not durable: a crash before the
//!   file's first `sync_data` (which the writer follows with its directory's fsync) may leave
//!   no file, an empty one or a torn header, which `wal::discard_unfinished` removes.

pub mod crash;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Reading a WAL file at offsets (never moves a shared cursor, so one handle serves a scan).
pub trait WalRead: Send {
    /// Reads up to `buf.len()` bytes at `offset`; 0 at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

/// The writer's handle of one WAL file: reads, appends at the end, syncs, truncates.
pub trait WalFile: WalRead {
    /// The file's current length.
    fn size(&self) -> io::Result<u64>;
    /// Appends all of `buf` at the end of the file (not yet durable).
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes every appended byte durable (`fdatasync`).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes and makes that durable.
    fn truncate(&mut self, len: u64) -> io::Result<()>;
}

/// Where WAL files live. One per state root; shared by every lineage and reader of it.
pub trait Storage: Send + Sync + 'static {
    /// Opens an existing WAL for reading.
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn WalRead>>;
    /// Opens an existing WAL for writing (the caller holds the session's lease).
    fn open_write(&self, path: &Path) -> io::Result<Box<dyn WalFile>>;
    /// Creates `path` holding exactly `bytes`, atomically (temp, rename) but not durably: the
    /// file's first `sync_data` and then its directory's fsync make it so.
    fn create(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
}

/// Real files on the local file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStorage;

impl WalRead for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl WalFile for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_all(buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)?;
        self.sync_all()
    }
}

/// One WAL's bytes in memory, read-only: an archive is read and replayed here before any of
/// it is written to disk (`crate::moves`). Every path names these bytes.
#[derive(Clone, Debug)]
pub struct InMemory(pub std::sync::Arc<[u8]>);

struct MemRead(std::sync::Arc<[u8]>);

impl WalRead for MemRead {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.0.len());
        let n = buf.len().min(self.0.len() - start);
        buf[..n].copy_from_slice(&self.0[start..start + n]);
        Ok(n)
    }
}

impl Storage for InMemory {
    fn open_read(&self, _path: &Path) -> io::Result<Box<dyn WalRead>> {
        Ok(Box::new(MemRead(std::sync::Arc::clone(&self.0))))
    }

    fn open_write(&self, _path: &Path) -> io::Result<Box<dyn WalFile>> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "an in-memory WAL is read-only"))
    }

    fn create(&self, _path: &Path, _bytes: &[u8]) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "an in-memory WAL is read-only"))
    }
}

impl Storage for FileStorage {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn WalRead>> {
        Ok(Box::new(File::open(path)?))
    }

    fn open_write(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        Ok(Box::new(OpenOptions::new().read(true).append(true).open(path)?))
    }

    fn create(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = path.with_extension("wal.tmp");
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        fs::rename(&tmp, path)
    }
}
