//! The write-ahead log: one append-only file per session, the source of truth.
//!
//! A file is a header frame (seq 0: the lineage id and an incarnation UUID minted once at
//! creation) followed by record frames with seqs 1, 2, 3, … across every episode. This layer
//! frames, checksums, fsyncs and recovers bytes; it does not know what records mean.
//!
//! Invariants of [`Wal`]:
//! - one writer: the caller holds the session's [`Lease`]; `end` is the file length this writer
//!   last saw, and an append finding the file at another length is refused (`Stale`);
//! - `synced_seq <= appended_seq`; an accepted seq is durable only once `sync` returned it;
//! - unsynced frames live only in `pending` (so nothing a reader can see is undurable for long,
//!   and a group of records costs one `write` and one `fdatasync`);
//! - after any failed write or fsync the WAL is poisoned and refuses appends until reopened;
//!   it then tries to cut the file back to `synced_end`, so frames whose commit failed never
//!   come back on a later open (the lineage layer retries that cut at the next open);
//! - `synced_end <= end`: the offset after the last fsynced frame, what readers may see;
//! - a WAL made by [`Wal::create_on_first_write`] has no file until its first frame is written
//!   (so a refused first send leaves nothing behind); until then `end == synced_end` is the
//!   header's length and no reader can find the session.

pub mod container;
mod floor;
pub mod frame;
mod lease;
pub mod reader;
pub mod storage;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use floor::FeatureFloor;
pub use frame::{Frame, FrameKind, FRAME_VERSION};
pub use lease::{Lease, LeaseError};
pub use reader::{FrameReader, Next};
pub use storage::{FileStorage, Storage, WalFile, WalRead};

/// Magic and layout of the header frame's payload.
const HEADER_MAGIC: &[u8; 4] = b"BWAL";
const HEADER_LAYOUT: u8 = 1;
const HEADER_PAYLOAD_LEN: usize = 4 + 1 + 16 + 16;
/// Unsynced bytes beyond which `append` writes (without syncing) to bound memory.
const PENDING_FLUSH: usize = 1 << 20;

/// The identity a WAL file carries in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalHeader {
    /// The session's lineage id (derived from its bind triple).
    pub lineage: [u8; 16],
    /// Minted once when the file is created, never by a read.
    pub incarnation: [u8; 16],
}

impl WalHeader {
    fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(HEADER_PAYLOAD_LEN);
        p.extend_from_slice(HEADER_MAGIC);
        p.push(HEADER_LAYOUT);
        p.extend_from_slice(&self.lineage);
        p.extend_from_slice(&self.incarnation);
        p
    }

    fn decode(payload: &[u8]) -> Option<WalHeader> {
        if payload.len() < HEADER_PAYLOAD_LEN || &payload[..4] != HEADER_MAGIC || payload[4] != HEADER_LAYOUT {
            return None;
        }
        Some(WalHeader { lineage: payload[5..21].try_into().ok()?, incarnation: payload[21..37].try_into().ok()? })
    }

    pub fn incarnation_string(&self) -> String {
        uuid::Uuid::from_bytes(self.incarnation).hyphenated().to_string()
    }
}

/// Every way a WAL operation fails. One enum for the family; the lineage layer maps it to the
/// spec's refusal codes (`wal_newer_writer`, `open_failed`).
#[derive(Debug)]
pub enum WalError {
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A bad frame before the tail. Nothing was rewritten.
    Corrupt {
        offset: u64,
        reason: String,
    },
    /// A complete frame requires features this build does not know.
    NewerWriter {
        version: u16,
        offset: u64,
        missing: Vec<String>,
    },
    /// The file does not start with a valid header frame.
    NotAWal {
        reason: &'static str,
    },
    /// An earlier write or fsync failed; reopen to continue.
    Poisoned {
        cause: String,
    },
    /// Another writer appended since this one last looked.
    Stale {
        expected_len: u64,
        found_len: u64,
    },
    /// The record cannot be framed (too large, a bad feature name).
    Unframeable {
        reason: String,
    },
}

impl std::fmt::Display for WalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalError::Io { op, path, source } => write!(f, "wal {op} failed for {}: {source}", path.display()),
            WalError::Corrupt { offset, reason } => write!(f, "wal corrupt at offset {offset}: {reason}"),
            WalError::NewerWriter { version, offset, missing } => write!(
                f,
                "wal written by a newer broca (NewerWriter): the version {version} frame at offset {offset} requires features this build does not know: {}",
                missing.join(", ")
            ),
            WalError::NotAWal { reason } => write!(f, "not a broca wal: {reason}"),
            WalError::Poisoned { cause } => write!(f, "wal refuses appends after an earlier failure: {cause}"),
            WalError::Stale { expected_len, found_len } => write!(
                f,
                "wal integrity check failed: another writer appended (expected {expected_len} bytes, found {found_len})"
            ),
            WalError::Unframeable { reason } => write!(f, "record cannot be framed: {reason}"),
        }
    }
}

impl std::error::Error for WalError {}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WalError + 'a {
    move |source| WalError::Io { op, path: path.to_path_buf(), source }
}

/// The answer to an append.
#[derive(Debug)]
pub enum RecordOutcome {
    /// Accepted at this seq; durable only after a successful `sync`.
    Accepted(u64),
    Refused(WalError),
}

/// A record frame seen while opening.
pub struct ScannedFrame<'a> {
    pub offset: u64,
    /// Total frame length: `offset + len` is where the next frame starts.
    pub len: u64,
    pub seq: u64,
    pub epoch: u64,
    /// The must-understand features the frame requires (all known to the reader).
    pub features: &'a [&'a str],
    pub payload: &'a [u8],
}

/// How to open a WAL.
pub struct WalOpen<'a> {
    /// Feature names this build understands.
    pub known_features: &'a [&'a str],
    /// Start the scan here instead of after the header: `(offset, seq of the frame there)`,
    /// from a checkpoint. A mismatch fails with `Corrupt` so the caller can rescan.
    pub resume_at: Option<(u64, u64)>,
    /// The lease epoch stamped on appended frames.
    pub epoch: u64,
    pub floor: Option<Arc<FeatureFloor>>,
    /// Cut the file to this length before scanning: the fsynced end a writer of this process
    /// left behind after a failed write or fsync (its later bytes were never durable).
    pub truncate_to: Option<u64>,
}

/// The writer's file: open, or not yet created (the storage the first write creates it in).
enum Handle {
    Open(Box<dyn WalFile>),
    Uncreated(Arc<dyn Storage>),
}

/// The single writer of one WAL file.
pub struct Wal {
    path: PathBuf,
    file: Handle,
    header: WalHeader,
    epoch: u64,
    floor: Option<Arc<FeatureFloor>>,
    /// File length as this writer last left it (the integrity high-water mark).
    end: u64,
    /// Frames accepted but not yet written.
    pending: Vec<u8>,
    /// Frames written to the file but not yet fsynced.
    unsynced_written: bool,
    /// The offset after the last fsynced frame.
    synced_end: u64,
    appended_seq: u64,
    synced_seq: u64,
    poisoned: Option<String>,
    scratch: Vec<u8>,
    /// fdatasync calls made by this writer (for the fsyncs-per-step benchmark).
    fsyncs: u64,
    /// A WAL this writer's process just created: its directory is fsynced after the first
    /// successful fsync of the file, before that fsync's frames count as durable.
    directory_unsynced: bool,
}

/// Creates a new WAL holding only its header, atomically (temp file, rename: a reader sees a
/// whole header or no file) but not yet durably: a crash before the first fsync of a frame may
/// leave less than a whole header, which no answer ever depended on ([`discard_unfinished`]
/// removes it). Sessions are created by their writer's first write
/// ([`Wal::create_on_first_write`]), which also fsyncs the directory after that first fsync,
/// so a fresh session's first answer pays two syncs, not three; this stand-alone creation
/// serves tools and tests that lay out WAL files.
pub fn create(storage: &dyn Storage, path: &Path, lineage: [u8; 16]) -> Result<WalHeader, WalError> {
    let header = WalHeader { lineage, incarnation: *uuid::Uuid::new_v4().as_bytes() };
    storage.create(path, &header_frame(&header)).map_err(io_err("create", path))?;
    Ok(header)
}

fn header_frame(header: &WalHeader) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(&mut out, FrameKind::Header, 0, 0, &[], &header.encode());
    out
}

/// Removes the WAL at `path` if it is a creation a crash cut before its first fsync: no longer
/// than a header frame and without a whole header. Nothing in such a file was ever
/// acknowledged. A file with a whole header, or with bytes past a broken one, is kept (the
/// open refuses the latter as it always did), and so is no file at all. Returns whether the
/// file was removed.
pub fn discard_unfinished(storage: &dyn Storage, path: &Path) -> Result<bool, WalError> {
    if !is_unfinished(storage, path) {
        return Ok(false);
    }
    fs::remove_file(path).map_err(io_err("remove", path))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    log::warn!("wal {} was cut before its first fsync; the session starts fresh", path.display());
    Ok(true)
}

/// Whether the WAL at `path` is a creation a crash cut before its first fsync (see
/// [`discard_unfinished`]). A live creation never is: its file appears by rename with its whole
/// header. Readers treat such a file as no session; only the next writer removes it.
pub fn is_unfinished(storage: &dyn Storage, path: &Path) -> bool {
    let whole = header_frame(&WalHeader { lineage: [0; 16], incarnation: [0; 16] }).len() as u64;
    fs::metadata(path).is_ok_and(|m| m.len() <= whole)
        && matches!(read_header_of(storage, path, &[]), Err(WalError::NotAWal { .. }))
}

/// Fsyncs a directory so a rename or create in it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("fsync directory", dir))
}

/// Reads and checks the header frame. Returns the header and the offset after it.
fn read_header(reader: &mut FrameReader, path: &Path, known: &[&str]) -> Result<(WalHeader, u64), WalError> {
    match reader.next_frame().map_err(io_err("read", path))? {
        Next::Frame { frame, len, offset } => {
            check_features(&frame, offset, known)?;
            if frame.kind != FrameKind::Header || frame.seq != 0 {
                return Err(WalError::NotAWal { reason: "first frame is not a header" });
            }
            let header = WalHeader::decode(frame.payload).ok_or(WalError::NotAWal { reason: "bad header payload" })?;
            Ok((header, len as u64))
        }
        _ => Err(WalError::NotAWal { reason: "no complete header frame" }),
    }
}

fn check_features(frame: &Frame<'_>, offset: u64, known: &[&str]) -> Result<(), WalError> {
    let missing: Vec<String> = frame.features.iter().filter(|f| !known.contains(f)).map(|f| f.to_string()).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(WalError::NewerWriter { version: frame.version, offset, missing })
    }
}

/// Where a scan stopped.
struct ScanEnd {
    /// Offset after the last good frame.
    offset: u64,
    last_seq: u64,
    torn_bytes: u64,
}

/// Scans record frames from the reader's position, checking seq continuity and features,
/// calling `visit` for each. Stops at the end or a torn tail; corruption is an error.
fn scan<E: From<WalError>>(
    reader: &mut FrameReader,
    path: &Path,
    mut last_seq: u64,
    known: &[&str],
    visit: &mut dyn FnMut(ScannedFrame<'_>) -> Result<(), E>,
) -> Result<ScanEnd, E> {
    loop {
        match reader.next_frame().map_err(io_err("read", path))? {
            Next::End { offset } => return Ok(ScanEnd { offset, last_seq, torn_bytes: 0 }),
            Next::Torn { offset, bytes } => return Ok(ScanEnd { offset, last_seq, torn_bytes: bytes }),
            Next::Corrupt { offset, reason } => {
                return Err(WalError::Corrupt { offset, reason: reason.to_string() }.into());
            }
            Next::Frame { offset, frame, len } => {
                check_features(&frame, offset, known)?;
                if frame.kind != FrameKind::Record {
                    return Err(WalError::Corrupt { offset, reason: "a second header frame".into() }.into());
                }
                if frame.seq != last_seq + 1 {
                    let reason = format!("seq {} follows seq {last_seq}", frame.seq);
                    return Err(WalError::Corrupt { offset, reason }.into());
                }
                last_seq = frame.seq;
                visit(ScannedFrame {
                    offset,
                    len: len as u64,
                    seq: frame.seq,
                    epoch: frame.epoch,
                    features: &frame.features,
                    payload: frame.payload,
                })?;
            }
        }
    }
}

/// Reads only the header of the WAL at `path`.
pub fn read_header_of(storage: &dyn Storage, path: &Path, known: &[&str]) -> Result<WalHeader, WalError> {
    let file = storage.open_read(path).map_err(io_err("open", path))?;
    Ok(read_header(&mut FrameReader::new(file, 0, None), path, known)?.0)
}

/// Where a read stopped: the offset after the last frame it visited and that frame's seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadEnd {
    pub offset: u64,
    pub last_seq: u64,
}

/// Reads a closed WAL file to its end with the real file system (forensic tools and tests):
/// [`read_bounded`] without a bound. Readers of a live session go through `lineage::Reader`.
pub fn read<E: From<WalError>>(
    path: &Path,
    known: &[&str],
    from: Option<(u64, u64)>,
    visit: &mut dyn FnMut(ScannedFrame<'_>) -> Result<(), E>,
) -> Result<WalHeader, E> {
    Ok(read_bounded(&FileStorage, path, known, from, None, visit)?.0)
}

/// Reads a WAL without opening it for writing: no lease, no truncation. Frames from `from`
/// (`(offset, seq of the frame there)`, else the first record) up to `limit` (a writer's
/// fsynced end; `None`: the end of the file) are visited; a torn tail is ignored (it is not
/// durable). Returns the header and where the read stopped.
pub fn read_bounded<E: From<WalError>>(
    storage: &dyn Storage,
    path: &Path,
    known: &[&str],
    from: Option<(u64, u64)>,
    limit: Option<u64>,
    visit: &mut dyn FnMut(ScannedFrame<'_>) -> Result<(), E>,
) -> Result<(WalHeader, ReadEnd), E> {
    let file = storage.open_read(path).map_err(io_err("open", path))?;
    let mut reader = FrameReader::new(file, 0, limit);
    let (header, after_header) = read_header(&mut reader, path, known)?;
    let last_seq = match from {
        Some((offset, seq)) if offset > after_header => {
            let file = storage.open_read(path).map_err(io_err("open", path))?;
            reader = FrameReader::new(file, offset, limit);
            seq.saturating_sub(1)
        }
        _ => 0,
    };
    let end = scan(&mut reader, path, last_seq, known, visit)?;
    Ok((header, ReadEnd { offset: end.offset, last_seq: end.last_seq }))
}

impl Wal {
    /// Opens an existing WAL for writing: checks the header, scans records (from the checkpoint
    /// in `opts.resume_at`, or from the start) calling `visit` for each, truncates a torn tail
    /// (logged at WARN with the byte count) and positions the writer at the end.
    pub fn open<E: From<WalError>>(
        storage: &dyn Storage,
        path: &Path,
        opts: WalOpen<'_>,
        visit: &mut dyn FnMut(ScannedFrame<'_>) -> Result<(), E>,
    ) -> Result<Wal, E> {
        let mut file = storage.open_write(path).map_err(io_err("open", path))?;
        if let Some(end) = opts.truncate_to {
            let len = file.size().map_err(io_err("stat", path))?;
            if len > end {
                log::warn!(
                    "wal {}: cutting {} bytes written after the last fsync of a writer that failed",
                    path.display(),
                    len - end
                );
                file.truncate(end).map_err(io_err("truncate", path))?;
            }
        }
        let reader_file = storage.open_read(path).map_err(io_err("open", path))?;
        let mut reader = FrameReader::new(reader_file, 0, None);
        let (header, after_header) = read_header(&mut reader, path, opts.known_features)?;
        let mut last_seq = 0;
        if let Some((offset, seq)) = opts.resume_at {
            if offset != after_header || seq != 1 {
                reader = FrameReader::new(storage.open_read(path).map_err(io_err("open", path))?, offset, None);
                last_seq = seq.saturating_sub(1);
            }
        }
        let end = scan(&mut reader, path, last_seq, opts.known_features, visit)?;
        if let Some((offset, seq)) = opts.resume_at {
            if end.last_seq < seq.saturating_sub(1) || end.offset < offset {
                let reason = format!("checkpoint at offset {offset} (seq {seq}) is past the end of the file");
                return Err(WalError::Corrupt { offset, reason }.into());
            }
        }
        if end.torn_bytes > 0 {
            log::warn!(
                "wal {}: truncating a torn tail of {} bytes at offset {}",
                path.display(),
                end.torn_bytes,
                end.offset
            );
            file.truncate(end.offset).map_err(io_err("truncate", path))?;
        }
        Ok(Wal {
            path: path.to_path_buf(),
            file: Handle::Open(file),
            header,
            epoch: opts.epoch,
            floor: opts.floor,
            end: end.offset,
            pending: Vec::new(),
            unsynced_written: false,
            synced_end: end.offset,
            appended_seq: end.last_seq,
            synced_seq: end.last_seq,
            poisoned: None,
            scratch: Vec::new(),
            fsyncs: 0,
            directory_unsynced: false,
        })
    }

    /// A writer of a new WAL at `path` whose file does not exist yet: the first write creates
    /// it (its header atomically, by rename, then the pending frames) and the first fsync then
    /// also fsyncs its directory. Until then nothing is on disk, so an open whose first command is refused
    /// leaves no file and no reader finds the session. The caller holds the session's lease.
    pub fn create_on_first_write(
        storage: Arc<dyn Storage>,
        path: &Path,
        lineage: [u8; 16],
        epoch: u64,
        floor: Option<Arc<FeatureFloor>>,
    ) -> Wal {
        let header = WalHeader { lineage, incarnation: *uuid::Uuid::new_v4().as_bytes() };
        let end = header_frame(&header).len() as u64;
        Wal {
            path: path.to_path_buf(),
            file: Handle::Uncreated(storage),
            header,
            epoch,
            floor,
            end,
            pending: Vec::new(),
            unsynced_written: false,
            synced_end: end,
            appended_seq: 0,
            synced_seq: 0,
            poisoned: None,
            scratch: Vec::new(),
            fsyncs: 0,
            directory_unsynced: true,
        }
    }

    /// Whether the file exists (a [`Wal::create_on_first_write`] writer has written).
    pub fn created(&self) -> bool {
        matches!(self.file, Handle::Open(_))
    }

    pub fn header(&self) -> &WalHeader {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last fsynced seq: what anything durable-facing may use.
    pub fn synced_seq(&self) -> u64 {
        self.synced_seq
    }

    /// The offset after the last fsynced frame: the end of what a reader may see.
    pub fn synced_end(&self) -> u64 {
        self.synced_end
    }

    /// Whether a failed write or fsync latched this writer (it refuses appends until reopened).
    pub fn failed(&self) -> bool {
        self.poisoned.is_some()
    }

    /// Stamps later frames with `epoch`.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// How many fdatasyncs this writer has made.
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs
    }

    /// The last accepted seq (not necessarily durable).
    pub fn appended_seq(&self) -> u64 {
        self.appended_seq
    }

    /// The byte offset where the next frame will start once pending frames are written.
    pub fn next_offset(&self) -> u64 {
        self.end + self.pending.len() as u64
    }

    /// Accepts a record frame requiring `features`; with `sync`, also makes it durable.
    /// A feature not yet in the state root's floor raises the floor (durably) first.
    pub fn append(&mut self, features: &[&str], payload: &[u8], sync: bool) -> RecordOutcome {
        match self.try_append(features, payload, sync) {
            Ok(seq) => RecordOutcome::Accepted(seq),
            Err(e) => RecordOutcome::Refused(e),
        }
    }

    fn try_append(&mut self, features: &[&str], payload: &[u8], sync: bool) -> Result<u64, WalError> {
        if let Some(cause) = &self.poisoned {
            return Err(WalError::Poisoned { cause: cause.clone() });
        }
        if features.len() > u8::MAX as usize
            || features.iter().any(|f| f.is_empty() || f.len() > frame::MAX_FEATURE_LEN)
        {
            return Err(WalError::Unframeable {
                reason: "feature names must be 1 to 255 bytes, at most 255 of them".into(),
            });
        }
        let body = frame::BODY_FIXED_LEN + features.iter().map(|f| f.len() + 1).sum::<usize>() + payload.len();
        if body > frame::MAX_BODY_LEN {
            return Err(WalError::Unframeable {
                reason: format!("a {body}-byte frame exceeds {}", frame::MAX_BODY_LEN),
            });
        }
        if !features.is_empty() {
            if let Some(floor) = &self.floor {
                floor.raise(features)?;
            }
        }
        let seq = self.appended_seq + 1;
        frame::encode(&mut self.scratch, FrameKind::Record, seq, self.epoch, features, payload);
        self.pending.extend_from_slice(&self.scratch);
        self.appended_seq = seq;
        if sync {
            self.sync()?;
        } else if self.pending.len() >= PENDING_FLUSH {
            self.write_pending()?;
        }
        Ok(seq)
    }

    /// Writes pending frames with one `write`, after checking no other writer moved the end.
    fn write_pending(&mut self) -> Result<(), WalError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.create_file()?;
        let Handle::Open(file) = &mut self.file else { unreachable!("create_file opened it") };
        let found = match file.size() {
            Ok(len) => len,
            Err(e) => return Err(self.poison("stat", e)),
        };
        if found != self.end {
            let err = WalError::Stale { expected_len: self.end, found_len: found };
            self.poisoned = Some(err.to_string());
            return Err(err);
        }
        if let Err(e) = file.append(&self.pending) {
            return Err(self.poison("write", e));
        }
        self.end += self.pending.len() as u64;
        self.pending.clear();
        self.unsynced_written = true;
        Ok(())
    }

    /// Makes every accepted frame durable with one write and one fsync; returns the last
    /// fsynced seq.
    pub fn sync(&mut self) -> Result<u64, WalError> {
        if let Some(cause) = &self.poisoned {
            return Err(WalError::Poisoned { cause: cause.clone() });
        }
        self.write_pending()?;
        if self.unsynced_written {
            let Handle::Open(file) = &mut self.file else { unreachable!("frames were written, so the file exists") };
            if let Err(e) = file.sync_data() {
                return Err(self.poison("fsync", e));
            }
            self.fsyncs += 1;
            self.unsynced_written = false;
            if self.directory_unsynced {
                let dir = File::open(self.path.parent().unwrap_or(Path::new("."))).and_then(|d| d.sync_all());
                if let Err(e) = dir {
                    return Err(self.poison("fsync directory", e));
                }
                self.directory_unsynced = false;
            }
        }
        self.synced_seq = self.appended_seq;
        self.synced_end = self.end;
        Ok(self.synced_seq)
    }

    /// Creates the file of a [`Wal::create_on_first_write`] writer (its header, atomically by
    /// rename) and opens it; nothing to do once it exists.
    fn create_file(&mut self) -> Result<(), WalError> {
        let Handle::Uncreated(storage) = &self.file else { return Ok(()) };
        let storage = Arc::clone(storage);
        let created =
            storage.create(&self.path, &header_frame(&self.header)).and_then(|()| storage.open_write(&self.path));
        match created {
            Ok(file) => {
                self.file = Handle::Open(file);
                Ok(())
            }
            Err(e) => Err(self.poison("create", e)),
        }
    }

    /// Latches an I/O failure: nothing more is appended, accepted frames are dropped, and the
    /// file is cut back to its fsynced end if the device still allows it.
    fn poison(&mut self, op: &'static str, source: io::Error) -> WalError {
        let err = WalError::Io { op, path: self.path.clone(), source };
        log::error!("{err}: the wal refuses appends until it is reopened");
        self.poisoned = Some(err.to_string());
        self.pending.clear();
        self.cut_unsynced();
        err
    }

    /// Cuts bytes written after the last fsync (best effort; the next open retries).
    fn cut_unsynced(&mut self) {
        let Handle::Open(file) = &mut self.file else { return };
        let longer = file.size().map_or(true, |len| len > self.synced_end);
        if longer && file.truncate(self.synced_end).is_ok() {
            self.end = self.synced_end;
            self.unsynced_written = false;
        }
    }
}

/// Creates `dir` (and its parents) and makes it 0700. An existing directory that already is
/// 0700 is left untouched (opening a state root writes nothing that is already so).
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    if let Ok(meta) = fs::metadata(dir) {
        if meta.is_dir() && meta.permissions().mode() & 0o7777 == 0o700 {
            return Ok(());
        }
    }
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests;
