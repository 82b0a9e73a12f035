//! A crash-simulating storage for tests, in the style of redb's `CrashBackend`: real files,
//! plus a record of how much of each file is durable.
//!
//! Writes reach the real file at once (so readers, `exists` checks and other processes see
//! what a page cache would show), but only a successful `sync_data` makes them durable: until
//! then each file keeps the bytes its unsynced writes overwrote. [`CrashStorage::power_loss`]
//! then puts every file back as it was at its last sync, or leaves a prefix of the unsynced
//! writes (a torn tail), as a power loss would.
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

/// What a power loss leaves of one file.
#[derive(Debug, Default)]
struct Durable {
    /// The file's length at its last sync.
    len: u64,
    /// Where the first write since that sync began (the WAL writes forward from there).
    written_from: Option<u64>,
    /// The end of the furthest write since that sync.
    written_to: u64,
    /// The durable bytes each unsynced write overwrote, oldest first: `(offset, bytes)`.
    undo: Vec<(u64, Vec<u8>)>,
}

impl Durable {
    fn synced(len: u64) -> Durable {
        Durable { len, ..Durable::default() }
    }
}

#[derive(Debug, Default)]
struct State {
    /// The durable state of every file opened or created through this storage.
    durable: HashMap<PathBuf, Durable>,
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

    /// Bytes of `path` written since its last sync (from the first such write to the end of
    /// the furthest).
    pub fn unsynced_bytes(&self, path: &Path) -> u64 {
        let state = self.state.lock();
        let Some(d) = state.durable.get(path) else { return 0 };
        d.written_from.map_or(0, |from| d.written_to.saturating_sub(from))
    }

    /// The power fails: every file is put back as it was at its last sync, keeping the first
    /// `n` bytes of its unsynced writes with [`Loss::KeepPrefix`] (a torn tail). Faults are
    /// cleared: the machine restarts. Call it with no writer open.
    pub fn power_loss(&self, loss: Loss) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut state = self.state.lock();
        for (path, durable) in state.durable.iter_mut() {
            let Ok(meta) = std::fs::metadata(path) else { continue };
            if let Some(from) = durable.written_from {
                let keep_to = match loss {
                    Loss::Clean => from,
                    Loss::KeepPrefix(n) => from.saturating_add(n),
                };
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                // Overwritten durable bytes at or after the kept prefix come back, newest
                // write first, so the oldest (durable) content wins.
                for (offset, old) in durable.undo.iter().rev() {
                    let skip = keep_to.saturating_sub(*offset).min(old.len() as u64);
                    f.write_all_at(&old[skip as usize..], offset + skip)?;
                }
                let len = durable.len.max(keep_to.min(meta.len()));
                if len < meta.len() {
                    f.set_len(len)?;
                }
                f.sync_all()?;
                *durable = Durable::synced(len);
            }
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
        self.state.lock().durable.entry(path.to_path_buf()).or_insert_with(|| Durable::synced(len));
        let (state, gate) = (Arc::clone(&self.state), Arc::clone(&self.gate));
        Ok(Box::new(CrashFile { inner, path: path.to_path_buf(), state, gate }))
    }

    fn create(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if let Some(kind) = self.state.lock().check(FaultOp::Write) {
            return Err(kind.error());
        }
        FileStorage.create(path, bytes)?;
        self.state.lock().durable.insert(path.to_path_buf(), Durable::synced(bytes.len() as u64));
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

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let fault = self.state.lock().check(FaultOp::Write);
        let written = match fault {
            None => buf,
            // A short write: the device filled up part-way.
            Some(FaultKind::Enospc) => &buf[..buf.len() / 2],
            Some(kind) => return Err(kind.error()),
        };
        self.remember(offset, written.len())?;
        self.inner.write_at(written, offset)?;
        match fault {
            None => Ok(()),
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
        state.durable.insert(self.path.clone(), Durable::synced(len));
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if let Some(kind) = state.check(FaultOp::Sync) {
            return Err(kind.error());
        }
        self.inner.truncate(len)?;
        state.durable.insert(self.path.clone(), Durable::synced(len));
        Ok(())
    }
}

impl CrashFile {
    /// Records what a write of `len` bytes at `offset` overwrites of the durable file, so a
    /// power loss can put it back.
    fn remember(&self, offset: u64, len: usize) -> io::Result<()> {
        let mut state = self.state.lock();
        let durable = state.durable.entry(self.path.clone()).or_default();
        let end = offset + len as u64;
        let overwritten = durable.len.min(end).saturating_sub(offset);
        let mut old = vec![0; overwritten as usize];
        if overwritten > 0 {
            let mut at = 0;
            while at < old.len() {
                match self.inner.read_at(&mut old[at..], offset + at as u64)? {
                    0 => break,
                    n => at += n,
                }
            }
        }
        durable.undo.push((offset, old));
        durable.written_from = Some(durable.written_from.map_or(offset, |from| from.min(offset)));
        durable.written_to = durable.written_to.max(end);
        Ok(())
    }
}
