//! The one reader of a session's WAL (DESIGN §7): from the store checkpoint or the first record,
//! bounded by what is durable — an open writer's published fsynced end, else the end of the file
//! after its torn-tail check — decoding each record and applying it to a replay state.
//!
//! Every read path (transcripts, run status and results, the subscribe replay and its `live`
//! barrier, the baseline) is a [`Sink`] over a [`Scan`]. A scan reads in batches: between two
//! batches it holds no lock, so a slow consumer (a subscriber's socket) never holds up a writer
//! opening the session, and each batch sees the durable end as it is then.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ends::DurableEnds;
use super::projection::{self, ControlUnit};
use super::{decode, LineageError, Shared};
use crate::record::{self, Record};
use crate::replay::{Effect, Replay};
use crate::session_key::SessionKey;
use crate::store::{Checkpoint, Store};
use crate::wal::{self, ScannedFrame, Storage, WalError};

/// What a consumer does with the records a scan reads. Every method has a default, so a sink
/// implements only what it needs.
pub trait Sink {
    /// A record about to be applied; `false` stops the scan before it.
    fn record(&mut self, _seq: u64, _record: &Record) -> bool {
        true
    }
    /// A derived effect of the record being applied.
    fn effect(&mut self, _effect: Effect) {}
    /// Whether the sink wants each record's control units (a projection costs more).
    fn wants_units(&self) -> bool {
        false
    }
    /// The control units of the record just applied; `false` stops the scan after it.
    fn units(&mut self, _units: Vec<ControlUnit>) -> bool {
        true
    }
}

/// Where a scan begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// At the first record, from an empty replay state.
    Beginning,
    /// At the store's checkpoint when it has one for this WAL's incarnation (else the first
    /// record); with `before: Some(seq)`, only a checkpoint whose watermark is below `seq`.
    Checkpoint { before: Option<u64> },
}

/// A session's WAL, read without its writer (or by it, up to its own fsynced end).
pub struct Reader {
    /// `None` for a bare file (forensics, tests): scans then start at the first record.
    store: Option<Arc<Store>>,
    storage: Arc<dyn Storage>,
    ends: Arc<DurableEnds>,
    addr: String,
    path: PathBuf,
    /// The incarnation of a writer's own WAL that no record has created yet
    /// ([`wal::Wal::create_on_first_write`]): its file does not exist, so a scan is empty.
    unwritten: Option<String>,
}

/// A scan in progress: the replay state so far and where the next batch starts.
pub struct Scan {
    pub replay: Replay,
    /// The checkpoint the scan started from (its messages are in the store).
    pub checkpoint: Option<Checkpoint>,
    /// The WAL header's incarnation (a UUID v4 minted once, when the file was created).
    pub incarnation: String,
    /// `(offset, seq)` of the next frame; `None` right after the header.
    next: Option<(u64, u64)>,
    done: bool,
}

impl Scan {
    /// Whether the last batch reached the durable end (or a sink stopped the scan).
    pub fn done(&self) -> bool {
        self.done
    }

    /// Lets a scan that reached the durable end read on from there (a scan kept across reads:
    /// its next batch reads what became durable since).
    pub fn resume(&mut self) {
        self.done = false;
    }
}

/// Why a batch stopped early.
enum Halt {
    Stopped,
    Batch,
    Failed(LineageError),
}

impl From<WalError> for Halt {
    fn from(e: WalError) -> Self {
        Halt::Failed(e.into())
    }
}

impl From<LineageError> for Halt {
    fn from(e: LineageError) -> Self {
        Halt::Failed(e)
    }
}

impl From<crate::replay::ReplayError> for Halt {
    fn from(e: crate::replay::ReplayError) -> Self {
        Halt::Failed(e.into())
    }
}

impl Reader {
    /// The session's reader; `None` when it has no WAL. Looks the WAL up on disk (up to three
    /// `stat`s, one more to rule out a creation a crash cut short): never call it on the io thread.
    pub fn open(shared: &Shared, key: &SessionKey) -> Option<Reader> {
        shared.record_path(key).map(|path| Reader::at(shared, key, path))
    }

    /// The reader of the session's WAL at `path`.
    pub fn at(shared: &Shared, key: &SessionKey, path: PathBuf) -> Reader {
        let (store, storage, ends) = (Arc::clone(&shared.store), Arc::clone(&shared.storage), Arc::clone(&shared.ends));
        Reader::parts(store, storage, ends, key, path)
    }

    /// The reader over these pieces (a lineage reading its own WAL).
    pub fn parts(
        store: Arc<Store>,
        storage: Arc<dyn Storage>,
        ends: Arc<DurableEnds>,
        key: &SessionKey,
        path: PathBuf,
    ) -> Reader {
        Reader { store: Some(store), storage, ends, addr: key.addr(), path, unwritten: None }
    }

    /// This reader, for a writer whose WAL (of `incarnation`) is not created yet.
    pub fn unwritten(self, incarnation: String) -> Reader {
        Reader { unwritten: Some(incarnation), ..self }
    }

    /// A reader of a closed WAL file with no run index (forensic tools and tests).
    pub fn file(path: &Path) -> Reader {
        let addr = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let storage: Arc<dyn Storage> = Arc::new(wal::FileStorage);
        Reader { store: None, storage, ends: Arc::default(), addr, path: path.to_path_buf(), unwritten: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The session's address (its store rows' key).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The run index the scan's checkpoint comes from (`None` for a bare file).
    pub fn store(&self) -> Option<&Store> {
        self.store.as_deref()
    }

    /// Begins a scan: checks the header and picks the checkpoint.
    pub fn start(&self, start: Start) -> Result<Scan, LineageError> {
        if let Some(incarnation) = &self.unwritten {
            let (replay, incarnation) = (Replay::default(), incarnation.clone());
            return Ok(Scan { replay, checkpoint: None, incarnation, next: None, done: true });
        }
        let header = wal::read_header_of(self.storage.as_ref(), &self.path, record::KNOWN_FEATURES)?;
        let checkpoint = match (start, &self.store) {
            (Start::Beginning, _) | (_, None) => None,
            (Start::Checkpoint { before }, Some(store)) => store
                .checkpoint(&self.addr)?
                .filter(|cp| cp.incarnation == header.incarnation_string())
                .filter(|cp| before.is_none_or(|seq| cp.watermark_seq < seq)),
        };
        let (replay, next) = match &checkpoint {
            Some(cp) => (cp.replay.clone(), Some((cp.next_offset, cp.watermark_seq + 1))),
            None => (Replay::default(), None),
        };
        Ok(Scan { replay, checkpoint, incarnation: header.incarnation_string(), next, done: false })
    }

    /// Reads the next batch of at most `max` durable records into `sink`. Returns whether the
    /// scan is done (the durable end reached, or the sink stopped it).
    pub fn next(&self, scan: &mut Scan, max: usize, sink: &mut dyn Sink) -> Result<bool, LineageError> {
        if scan.done {
            return Ok(true);
        }
        let storage = self.storage.as_ref();
        let mut read = 0usize;
        let mut next = scan.next;
        let replay = &mut scan.replay;
        let outcome = self.ends.read_within(&self.addr, |limit| {
            wal::read_bounded::<Halt>(storage, &self.path, record::KNOWN_FEATURES, scan.next, limit, &mut |f| {
                if read >= max {
                    return Err(Halt::Batch);
                }
                read += 1;
                apply(replay, &f, sink)?;
                next = Some((f.offset + f.len, f.seq + 1));
                Ok(())
            })
        });
        scan.next = next;
        match outcome {
            Ok(_) => scan.done = true,
            Err(Halt::Stopped) => scan.done = true,
            Err(Halt::Batch) => {}
            Err(Halt::Failed(e)) => return Err(e),
        }
        Ok(scan.done)
    }

    /// Scans everything durable from `start` into `sink` and returns the scan's end state.
    pub fn scan(&self, start: Start, sink: &mut dyn Sink) -> Result<Scan, LineageError> {
        let mut scan = self.start(start)?;
        while !self.next(&mut scan, usize::MAX, sink)? {}
        Ok(scan)
    }
}

/// Decodes one frame and applies it; `Halt::Stopped` when the sink stops.
fn apply(replay: &mut Replay, f: &ScannedFrame<'_>, sink: &mut dyn Sink) -> Result<(), Halt> {
    let rec = decode(f.seq, f.payload)?;
    if !sink.record(f.seq, &rec) {
        return Err(Halt::Stopped);
    }
    if sink.wants_units() {
        let units = projection::apply(replay, f.seq, &rec, &mut |e| sink.effect(e))?;
        replay.note_units(f.seq, units.len());
        if !sink.units(units) {
            return Err(Halt::Stopped);
        }
    } else {
        let mut tool_message = false;
        replay.apply(f.seq, &rec, &mut |e| {
            tool_message |= projection::is_tool_message(&e);
            sink.effect(e)
        })?;
        replay.note_units(f.seq, projection::unit_count(&rec, tool_message));
    }
    Ok(())
}

/// A sink that only advances the replay state (the head, the queue, the resolution).
pub struct StateOnly;

impl Sink for StateOnly {}
