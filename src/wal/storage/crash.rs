//! A crash-simulating storage for tests, in the style of redb's `CrashBackend`: real files,
//! plus a record of how much of each file is durable.
//!
//! Writes reach the real file at once (so readers, `exists` checks and other processes see
//! what a page cache would show), but only a successful `sync_data` moves a file's durable
//! length. [`CrashStorage::power_loss`] then cuts every file back to its durable length, or
//! leaves a prefix of the unsynced tail (a torn tail), as a power loss would.
//!
//! Faults ([`CrashStorage::fail`]) trip on a countdown of writes or fsyncs and then **latch**:
//! every later write and fsync fails too until [`CrashStorage::clear`] — like a device that
//! went away. A failed write of `Enospc` kind writes a prefix of its buffer first (a short
//! write), an `Eio` one writes nothing; a failed fsync makes nothing durable.
//!
//! [`CrashStorage::hold_syncs`] stalls every fsync until its hold is dropped — a device that
//! stopped answering — so a test can hold a writer inside a commit.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{FileStorage, Storage, WalFile, WalRead};

/// Which operation a fault counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Write,
    Sync,
}

/// The error a tripped fault returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// `EIO`: the device failed.
    Eio,
    /// `ENOSPC`: the device is full.
    Enospc,
}

impl FaultKind {
    fn error(self) -> io::Error {
        match self {
            FaultKind::Eio => io::Error::from_raw_os_error(libc::EIO),
            FaultKind::Enospc => io::Error::from_raw_os_error(libc::ENOSPC),
        }
    }
}

/// What survives of the unsynced tail at a power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Everything after the last fsync is gone.
    Clean,
    /// The first `n` unsynced bytes survive (at most all of them): a torn tail.
    KeepPrefix(u64),
}

#[derive(Debug)]
struct Fault {
    op: FaultOp,
    /// Operations of `op` kind that still succeed before it trips.
    remaining: u64,
    kind: FaultKind,
    tripped: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Durable length of every file opened or created through this storage.
    durable: HashMap<PathBuf, u64>,
    fault: Option<Fault>,
    syncs: u64,
    writes: u64,
}

impl State {
    /// Counts an operation and answers whether it fails (and with what).
    fn check(&mut self, op: FaultOp) -> Option<FaultKind> {
        match op {
            FaultOp::Write => self.writes += 1,
            FaultOp::Sync => self.syncs += 1,
        }
        let fault = self.fault.as_mut()?;
        if fault.tripped {
            return Some(fault.kind);
        }
        if fault.op != op {
            return None;
        }
        if fault.remaining == 0 {
            fault.tripped = true;
            return Some(fault.kind);
        }
        fault.remaining -= 1;
        None
    }
}

/// See the module docs. Cloning shares the state.
#[derive(Clone, Debug, Default)]
pub struct CrashStorage {
    state: Arc<Mutex<State>>,
    gate: Arc<Gate>,
}

/// The fsync stall of [`CrashStorage::hold_syncs`].
#[derive(Debug, Default)]
struct Gate {
    /// `(held, fsyncs waiting)`.
    state: Mutex<(bool, u64)>,
    released: Condvar,
}

impl Gate {
    fn pass(&self) {
        let mut state = self.state.lock();
        state.1 += 1;
        while state.0 {
            self.released.wait(&mut state);
        }
        state.1 -= 1;
    }
}

/// While it lives, every fsync through its storage waits.
pub struct SyncHold(Arc<Gate>);

impl SyncHold {
    /// fsyncs waiting on this hold now.
    pub fn waiting(&self) -> u64 {
        self.0.state.lock().1
    }
}

impl Drop for SyncHold {
    fn drop(&mut self) {
        self.0.state.lock().0 = false;
        self.0.released.notify_all();
    }
}

impl CrashStorage {
    pub fn new() -> CrashStorage {
        CrashStorage::default()
    }

    /// The `after + 1`-th `op` from now fails with `kind`, and from then on every write and
    /// fsync fails until [`CrashStorage::clear`].
    pub fn fail(&self, op: FaultOp, after: u64, kind: FaultKind) {
        self.state.lock().fault = Some(Fault { op, remaining: after, kind, tripped: false });
    }

    /// Whether a fault has tripped.
    pub fn tripped(&self) -> bool {
        self.state.lock().fault.as_ref().is_some_and(|f| f.tripped)
    }

    /// Every fsync from now on waits until the returned hold is dropped.
    pub fn hold_syncs(&self) -> SyncHold {
        self.gate.state.lock().0 = true;
        SyncHold(Arc::clone(&self.gate))
    }

    /// The device works again.
    pub fn clear(&self) {
        self.state.lock().fault = None;
    }

    /// fsyncs attempted so far (successful or not).
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// Bytes of `path` written but not yet durable.
    pub fn unsynced_bytes(&self, path: &Path) -> u64 {
        let durable = self.state.lock().durable.get(path).copied().unwrap_or(0);
        std::fs::metadata(path).map_or(0, |m| m.len().saturating_sub(durable))
    }

    /// The power fails: every file is cut back to its durable length (keeping a prefix of its
    /// unsynced tail with [`Loss::KeepPrefix`]). Faults are cleared: the machine restarts.
    /// Call it with no writer open.
    pub fn power_loss(&self, loss: Loss) -> io::Result<()> {
        let mut state = self.state.lock();
        for (path, durable) in state.durable.iter_mut() {
            let Ok(meta) = std::fs::metadata(path) else { continue };
            let keep = match loss {
                Loss::Clean => *durable,
                Loss::KeepPrefix(n) => (*durable + n).min(meta.len()),
            };
            if keep < meta.len() {
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.set_len(keep)?;
                f.sync_all()?;
            }
            *durable = keep;
        }
        state.fault = None;
        Ok(())
    }
}

impl Storage for CrashStorage {
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn WalRead>> {
        FileStorage.open_read(path)
    }

    fn open_write(&self, path: &Path) -> io::Result<Box<dyn WalFile>> {
        let inner = FileStorage.open_write(path)?;
        let len = inner.size()?;
        // A file this storage has not seen was written before the test's crash model began.
        self.state.lock().durable.entry(path.to_path_buf()).or_insert(len);
        let (state, gate) = (Arc::clone(&self.state), Arc::clone(&self.gate));
        Ok(Box::new(CrashFile { inner, path: path.to_path_buf(), state, gate }))
    }

    fn create(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if let Some(kind) = self.state.lock().check(FaultOp::Write) {
            return Err(kind.error());
        }
        FileStorage.create(path, bytes)?;
        // Not durable until the file's first `sync_data`: a power loss before it leaves an
        // empty file or a torn header.
        self.state.lock().durable.insert(path.to_path_buf(), 0);
        Ok(())
    }
}

struct CrashFile {
    inner: Box<dyn WalFile>,
    path: PathBuf,
    state: Arc<Mutex<State>>,
    gate: Arc<Gate>,
}

impl WalRead for CrashFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
}

impl WalFile for CrashFile {
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let fault = self.state.lock().check(FaultOp::Write);
        match fault {
            None => self.inner.append(buf),
            Some(FaultKind::Enospc) => {
                // A short write: the device filled up part-way.
                self.inner.append(&buf[..buf.len() / 2])?;
                Err(FaultKind::Enospc.error())
            }
            Some(kind) => Err(kind.error()),
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.gate.pass();
        let mut state = self.state.lock();
        if let Some(kind) = state.check(FaultOp::Sync) {
            return Err(kind.error());
        }
        // The crash model needs no real fsync: durability is what this records.
        let len = self.inner.size()?;
        state.durable.insert(self.path.clone(), len);
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if let Some(kind) = state.check(FaultOp::Sync) {
            return Err(kind.error());
        }
        self.inner.truncate(len)?;
        state.durable.insert(self.path.clone(), len);
        Ok(())
    }
}
