//! The single-writer lease: an exclusive OS file lock on `leases/<addr>.lease`.
//!
//! The lock is held for as long as the [`Lease`] lives (the OS drops it when the process dies,
//! so a crashed holder never strands a session). Each acquisition increments the epoch stored
//! in the file; records are stamped with it as a forensic tenure mark. The file also names the
//! holder's pid so a second opener can say who holds it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum LeaseError {
    /// A live process holds the lease.
    Busy {
        pid: Option<u32>,
        epoch: u64,
    },
    /// The lock is held but the recorded holder is gone (the lock outlived it, e.g. through an
    /// inherited descriptor): not safe to write, and not a live session either.
    Stale {
        pid: u32,
        epoch: u64,
    },
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseError::Busy { pid: Some(pid), epoch } => {
                write!(f, "session lease is held by pid {pid} (epoch {epoch})")
            }
            LeaseError::Busy { pid: None, epoch } => {
                write!(f, "session lease is held (epoch {epoch})")
            }
            LeaseError::Stale { pid, epoch } => {
                write!(f, "session lease is stale: locked, but its holder pid {pid} (epoch {epoch}) is gone")
            }
            LeaseError::Io { path, source } => write!(f, "lease {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for LeaseError {}

/// A held lease. Dropping it releases the lock.
#[derive(Debug)]
pub struct Lease {
    file: File,
    epoch: u64,
}

fn parse(text: &str) -> (u64, Option<u32>) {
    let mut words = text.split_whitespace();
    let epoch = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let pid = words.next().and_then(|w| w.parse().ok());
    (epoch, pid)
}

impl Lease {
    /// Takes the lease at `path`, waiting up to `wait` while this same process holds it. In one
    /// process a session has one writer at a time, so a lease held by our own pid belongs to
    /// a short critical section that is about to end: the retention sweep deleting an expired
    /// record, or a closing session waiting for its last rows. Another process's lease is
    /// refused at once, as [`Lease::acquire`] refuses it.
    pub fn acquire_waiting_for_own(path: &Path, wait: std::time::Duration) -> Result<Lease, LeaseError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match Lease::acquire(path) {
                Err(LeaseError::Busy { pid: Some(pid), .. })
                    if pid == std::process::id() && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                other => return other,
            }
        }
    }

    /// Takes the lease at `path` without waiting.
    pub fn acquire(path: &Path) -> Result<Lease, LeaseError> {
        let io = |source| LeaseError::Io { path: path.to_path_buf(), source };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let mut text = String::new();
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                file.read_to_string(&mut text).map_err(io)?;
                let (epoch, pid) = parse(&text);
                return Err(match pid {
                    Some(pid) if !Path::new(&format!("/proc/{pid}")).exists() => LeaseError::Stale { pid, epoch },
                    pid => LeaseError::Busy { pid, epoch },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.read_to_string(&mut text).map_err(io)?;
        let mut lease = Lease { file, epoch: parse(&text).0 };
        lease.write_epoch(lease.epoch + 1).map_err(io)?;
        Ok(lease)
    }

    /// Raises this tenure's epoch to at least `epoch` (when the WAL shows a higher stamp than
    /// the lease file remembers).
    pub fn raise_to(&mut self, epoch: u64) -> Result<(), std::io::Error> {
        if epoch > self.epoch {
            self.write_epoch(epoch)?;
        }
        Ok(())
    }

    fn write_epoch(&mut self, epoch: u64) -> Result<(), std::io::Error> {
        let file = &mut self.file;
        // Overwrite in place, then trim: a crash between the two leaves the new epoch first
        // (the parser reads only the first two words), never an empty file that would reset it.
        let line = format!("{epoch} {}\n", std::process::id());
        file.seek(SeekFrom::Start(0))?;
        file.write_all(line.as_bytes())?;
        file.set_len(line.len() as u64)?;
        // Not fsynced: the epoch is a tenure mark, and the WAL is its durable record. An open
        // raises the lease past the highest epoch its WAL shows, so a write lost in a crash is
        // repaired before this tenure stamps anything; a tenure that made nothing durable may
        // see its number again, which stamps nothing twice.
        self.epoch = epoch;
        Ok(())
    }

    /// This tenure's epoch (1 for the first holder ever).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}
