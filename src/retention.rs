//! Whole-session retention (llm-runner §9.1, spec §20): a session whose first send set
//! `retention` lives in `wal-ephemeral/`, and once it is idle for its retention it is deleted,
//! whole: its WAL, its store rows and its checkpoint.
//!
//! Expiry is its last durable activity ([`Replay::last_activity_ms`]: a send, a step or a
//! terminal record) plus its current retention, and only while no run is open or paused and
//! nothing is queued ([`expiry_of`]). Reads decide expiry from that alone, so a session past
//! its time answers `expired` before its deletion lands.
//!
//! Deletion is crash-safe and ordered (DESIGN.md §2, durable before visible):
//! 1. a content-free [`Tombstone`] (`wal-ephemeral/<addr>.tombstone`: the expiry time, the
//!    expired record's incarnation, and the history version a later record starts at) is
//!    written and fsynced;
//! 2. the store's rows of the session go (transcript, runs, sends and the checkpoint, one
//!    transaction), then its held-call intake rows (registrations and receipts, one
//!    transaction; the module feed rows stay), then the WAL file, then the directory is
//!    fsynced.
//!
//! Held calls fence the first step (spec §19, [`crate::intake::fence`]): no tombstone is written
//! while the session's WAL shows a held call without its result or the intake registers a call
//! of it, while the intake store is missing on a root that used held intake or is unreadable,
//! or while `late-results-rebuild-required` is set. A fenced session keeps its record (reads
//! answer `expired` all the same; a send is refused, [`Settled::Fenced`]); a root that never
//! enabled held intake expires as before.
//!
//! Invariant: a deletion is pending exactly when a live WAL carries the incarnation its
//! tombstone names; [`Expiry::settle`] finishes it (the sweep and every lineage open call it),
//! and it never deletes a WAL of another incarnation, so a fresh record started after the
//! expiry is never touched. The tombstone stays after deletion: expiry remains distinguishable
//! from a session never written, and history versions never repeat.
//!
//! Everything here runs under the session's lease with no writer open: the sweep takes the
//! lease itself (a session whose actor holds it is the actor's to close at expiry), and a
//! lineage open holds it already.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::intake::fence::{self, Fence};
use crate::record::FEATURE_PROVIDER_HELD;
use crate::record::{Record, KNOWN_FEATURES};
use crate::replay::{Replay, Resolution};
use crate::state_root::{Placement, StateRoot};
use crate::store::writer::StoreWriter;
use crate::store::{Store, StoreError};
use crate::wal::{self, FeatureFloor, Lease, LeaseError, Storage, WalError};

/// The content-free record that a session expired. Holds identifiers and times only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Last durable activity plus retention (unix ms): what `expired` answers.
    pub expired_at_ms: u64,
    /// The incarnation (WAL header UUID) of the record that expired.
    pub incarnation: String,
    /// The history version a record started after this expiry serves (the number of expiries
    /// of this session so far), so a version is never served for two histories.
    pub generation: u64,
}

/// Every way settling a session's retention fails (nothing is deleted before its tombstone
/// is durable).
#[derive(Debug)]
pub enum RetentionError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    Wal(WalError),
    Store(StoreError),
    Lease(LeaseError),
    /// A record of the WAL does not decode or replay: the session is left alone.
    Unreadable(String),
    /// The held-call intake store refused to let go of the session's rows; the deletion stays
    /// pending (its tombstone names the WAL) and is finished later.
    Intake(crate::intake::IntakeError),
}

impl std::fmt::Display for RetentionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetentionError::Io { path, source } => write!(f, "retention: {}: {source}", path.display()),
            RetentionError::Wal(e) => write!(f, "retention: {e}"),
            RetentionError::Store(e) => write!(f, "retention: {e}"),
            RetentionError::Lease(e) => write!(f, "retention: {e}"),
            RetentionError::Unreadable(why) => write!(f, "retention: the wal is unreadable: {why}"),
            RetentionError::Intake(e) => write!(f, "retention: the held-call intake: {e}"),
        }
    }
}

impl std::error::Error for RetentionError {}

impl From<WalError> for RetentionError {
    fn from(e: WalError) -> Self {
        RetentionError::Wal(e)
    }
}

/// When a retained session expires: its last durable activity plus its current retention, but
/// only while its last run is terminal and nothing is queued (`None`: it does not expire now;
/// a session without retention never does).
pub fn expiry_of(replay: &Replay) -> Option<u64> {
    let seconds = replay.last.as_ref()?.config.config()?.policy.retention?;
    if !replay.queue.is_empty() || !matches!(replay.resolution(), Resolution::Idle { .. }) {
        return None;
    }
    replay.last_activity_ms?.checked_add(seconds.saturating_mul(1000))
}

fn tombstone_path(root: &StateRoot, addr: &str) -> PathBuf {
    root.path().join(Placement::Ephemeral.dir_name()).join(format!("{addr}.tombstone"))
}

fn ephemeral_wal(root: &StateRoot, addr: &str) -> PathBuf {
    root.path().join(Placement::Ephemeral.dir_name()).join(format!("{addr}.wal"))
}

/// The session's tombstone, if it ever expired. An unreadable one is logged and read as none
/// (the WAL, while it exists, still decides its expiry).
pub fn tombstone(root: &StateRoot, addr: &str) -> Option<Tombstone> {
    let path = tombstone_path(root, addr);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!("retention: cannot read {}: {e}", path.display());
            return None;
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| log::warn!("retention: {} does not decode: {e}", path.display())).ok()
}

/// The history version of a session that never expired. Versions count from 1, like ordinals.
pub const FIRST_HISTORY_VERSION: u64 = 1;

/// The history version the session's current record serves: the first one plus how many times
/// the session expired (`tombstone` is its tombstone, if any).
pub fn version_after(tombstone: Option<&Tombstone>) -> u64 {
    FIRST_HISTORY_VERSION + tombstone.map_or(0, |t| t.generation)
}

/// Writes `tombstone` durably: a temporary file, fsynced, renamed over, directory fsynced.
fn write_tombstone(path: &Path, tombstone: &Tombstone) -> Result<(), RetentionError> {
    use std::io::Write;
    let io = |source| RetentionError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tombstone.tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(&serde_json::to_vec(tombstone).expect("tombstones serialize")).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    wal::sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(())
}

/// The incarnation and replayed state of the WAL at `path` (read under the session's lease).
fn replay_of(storage: &dyn Storage, path: &Path) -> Result<(String, Replay), RetentionError> {
    let mut replay = Replay::default();
    let mut visit = |frame: wal::ScannedFrame<'_>| -> Result<(), RetentionError> {
        let record = Record::decode(frame.payload).map_err(|e| RetentionError::Unreadable(e.0))?;
        replay.apply(frame.seq, &record, &mut |_| {}).map_err(|e| RetentionError::Unreadable(e.to_string()))
    };
    let (header, _) = wal::read_bounded(storage, path, KNOWN_FEATURES, None, None, &mut visit)?;
    Ok((header.incarnation_string(), replay))
}

/// What settling a session's retention came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Its expired record is deleted (now, or by a deletion its tombstone began).
    Deleted,
    /// Nothing to do: no retained record, or its expiry has not come.
    Live,
    /// Its record expired at `expired_at_ms` but held calls fence its deletion: it stays,
    /// reads answer `expired`, and a send is refused until the fence lifts.
    Fenced { expired_at_ms: u64, fence: Fence },
}

/// Expires and deletes retained sessions of one state root.
pub struct Expiry<'a> {
    pub root: &'a StateRoot,
    pub storage: &'a dyn Storage,
    pub store: &'a Store,
    pub writer: &'a StoreWriter,
    /// The WAL feature floor: whether held records were ever written under this root.
    pub floor: &'a FeatureFloor,
}

impl Expiry<'_> {
    /// Under the session's lease, with no writer open: finishes a deletion its tombstone began,
    /// or expires the session if its time has come and held calls do not fence it (tombstone
    /// first, then deletion). A session outside `wal-ephemeral/` is untouched.
    pub fn settle(&self, addr: &str, now: u64) -> Result<Settled, RetentionError> {
        let path = ephemeral_wal(self.root, addr);
        if !path.exists() {
            return Ok(Settled::Live);
        }
        let tombstone = tombstone(self.root, addr);
        let incarnation = wal::read_header_of(self.storage, &path, KNOWN_FEATURES)?.incarnation_string();
        if tombstone.as_ref().is_some_and(|t| t.incarnation == incarnation) {
            log::info!("retention: finishing the deletion of expired session {addr}");
            self.delete(addr, &path)?;
            return Ok(Settled::Deleted);
        }
        let (_, replay) = replay_of(self.storage, &path)?;
        let Some(expired_at_ms) = expiry_of(&replay).filter(|&at| now >= at) else { return Ok(Settled::Live) };
        let held_floor = self.floor.features().iter().any(|f| f == FEATURE_PROVIDER_HELD);
        if let Err(fence) = fence::check(self.root.path(), addr, !replay.held_calls().is_empty(), held_floor) {
            return Ok(Settled::Fenced { expired_at_ms, fence });
        }
        let generation = tombstone.map_or(1, |t| t.generation + 1);
        write_tombstone(&tombstone_path(self.root, addr), &Tombstone { expired_at_ms, incarnation, generation })?;
        crate::failpoint!("retention.after_tombstone");
        self.delete(addr, &path)?;
        log::info!("retention: session {addr} expired at {expired_at_ms} and is deleted");
        Ok(Settled::Deleted)
    }

    /// Deletes the store's rows of the session (rows a closed writer still had queued land
    /// first, so none comes back), then its held-call intake rows, then its WAL: the WAL goes
    /// last, so a deletion cut anywhere is still pending and is finished whole.
    fn delete(&self, addr: &str, path: &Path) -> Result<(), RetentionError> {
        self.writer.settle();
        self.store.forget_lineage(addr).map_err(RetentionError::Store)?;
        fence::forget(self.root.path(), addr).map_err(RetentionError::Intake)?;
        std::fs::remove_file(path).map_err(|source| RetentionError::Io { path: path.to_path_buf(), source })?;
        wal::sync_dir(path.parent().unwrap_or(Path::new(".")))?;
        Ok(())
    }
}

/// What the sweep last learned of one `wal-ephemeral/` file, so an unchanged WAL is not read
/// again: its length and write time, and the expiry they gave (`None`: not due at any time
/// while they stay the same).
#[derive(Clone, Copy, PartialEq)]
struct Seen {
    len: u64,
    modified: Option<std::time::SystemTime>,
    expiry: Option<u64>,
    pending: bool,
    /// The WAL did not read: counted unreadable, and read again only once it changes or
    /// `fenced`'s instant passed.
    unreadable: bool,
    /// Held calls fenced its deletion at the last try, or its WAL did not read (the reason's
    /// code, for logging once): not tried again before the instant.
    fenced: Option<(std::time::Instant, &'static str)>,
}

/// The retention sweep (one thread, every [`crate::limits::RETENTION_SWEEP_MS`]): sessions in
/// `wal-ephemeral/` whose expiry has come, or whose deletion a crash interrupted, are settled
/// under their lease. Its memory is bounded by the directory: one [`Seen`] per live file and
/// at most one unreadable mark per live file, pruned every pass.
#[derive(Default)]
pub struct Sweep {
    seen: std::collections::HashMap<String, Seen>,
    /// Sessions retention could not read at its last look or try: their WAL, or the intake
    /// store an expired session's deletion must consult (spec §19).
    unreadable: std::collections::HashSet<String>,
}

impl Sweep {
    /// One pass. Returns how many records were deleted.
    pub fn pass(&mut self, expiry: &Expiry<'_>, now: u64) -> usize {
        let dir = expiry.root.path().join(Placement::Ephemeral.dir_name());
        let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
        let mut live = std::collections::HashSet::new();
        let mut deleted = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(addr) = name.to_str().and_then(|n| n.strip_suffix(".wal")) else { continue };
            live.insert(addr.to_owned());
            let Ok(meta) = entry.metadata() else { continue };
            let (len, modified) = (meta.len(), meta.modified().ok());
            let recheck = std::time::Duration::from_millis(crate::limits::RETENTION_FENCE_RECHECK_MS);
            let last = self.seen.get(addr).copied();
            // An unreadable WAL is read again when it changes, or after the recheck interval.
            let stale = |s: &Seen| s.unreadable && s.fenced.is_none_or(|(until, _)| std::time::Instant::now() >= until);
            let seen = match last {
                Some(s) if s.len == len && s.modified == modified && !stale(&s) => s,
                _ => {
                    let seen = match look(expiry, addr, &entry.path()) {
                        Ok((expiry, pending)) => {
                            Seen { len, modified, expiry, pending, unreadable: false, fenced: None }
                        }
                        Err(e) => {
                            if !last.is_some_and(|s| s.unreadable) {
                                log::warn!("retention: cannot read session {addr}; it is kept: {e}");
                            }
                            let fenced = Some((std::time::Instant::now() + recheck, "wal_unreadable"));
                            Seen { len, modified, expiry: None, pending: false, unreadable: true, fenced }
                        }
                    };
                    self.seen.insert(addr.to_owned(), seen);
                    // What a fresh look learned replaces the last mark; a cached one keeps it.
                    self.mark(addr, seen.unreadable);
                    seen
                }
            };
            if seen.unreadable {
                continue;
            }
            let due = seen.pending || seen.expiry.is_some_and(|at| now >= at);
            if !due || seen.fenced.is_some_and(|(until, _)| std::time::Instant::now() < until) {
                continue;
            }
            match expiry.settle_leased(addr, now) {
                Ok(Settled::Deleted) => {
                    deleted += 1;
                    self.mark(addr, false);
                }
                Ok(Settled::Live) => self.mark(addr, false),
                Ok(Settled::Fenced { expired_at_ms, fence }) => {
                    if seen.fenced.is_none_or(|(_, code)| code != fence.code()) {
                        log::info!("retention: session {addr} expired at {expired_at_ms} and is kept: {fence}");
                    }
                    self.mark(addr, matches!(fence, Fence::StoreUnreadable(_)));
                    let fenced = Some((std::time::Instant::now() + recheck, fence.code()));
                    self.seen.insert(addr.to_owned(), Seen { fenced, ..seen });
                    continue;
                }
                // An open actor holds the lease: it closes at expiry, and the next pass deletes.
                Err(RetentionError::Lease(LeaseError::Busy { .. } | LeaseError::Stale { .. })) => {}
                // A begun deletion the intake store holds up: tried again as a fenced one is.
                Err(e @ RetentionError::Intake(_)) => {
                    if seen.fenced.is_none() {
                        log::warn!("retention: the deletion of session {addr} waits: {e}");
                    }
                    self.mark(addr, true);
                    let fenced = Some((std::time::Instant::now() + recheck, "late_results_unreadable"));
                    self.seen.insert(addr.to_owned(), Seen { fenced, ..seen });
                    continue;
                }
                Err(e) => {
                    log::warn!("retention: session {addr} left for the next sweep: {e}");
                    self.mark(addr, matches!(e, RetentionError::Unreadable(_) | RetentionError::Wal(_)));
                }
            }
            self.seen.remove(addr);
        }
        self.seen.retain(|addr, _| live.contains(addr));
        self.unreadable.retain(|addr| live.contains(addr));
        deleted
    }

    /// Retention's unreadable-session total (`health.check`: `retention.unreadable_sessions`):
    /// the sessions of `wal-ephemeral/` whose WAL did not read at the last look, or whose
    /// expired record's deletion an unreadable intake store holds back.
    pub fn unreadable_sessions(&self) -> usize {
        self.unreadable.len()
    }

    fn mark(&mut self, addr: &str, unreadable: bool) {
        if unreadable {
            self.unreadable.insert(addr.to_owned());
        } else {
            self.unreadable.remove(addr);
        }
    }
}

/// Reads a retained WAL without its lease (a torn tail is not durable and is ignored): when it
/// expires, and whether its tombstone already names it (a deletion to finish).
fn look(expiry: &Expiry<'_>, addr: &str, path: &Path) -> Result<(Option<u64>, bool), RetentionError> {
    let (incarnation, replay) = replay_of(expiry.storage, path)?;
    let pending = tombstone(expiry.root, addr).is_some_and(|t| t.incarnation == incarnation);
    Ok((expiry_of(&replay), pending))
}

impl Expiry<'_> {
    fn settle_leased(&self, addr: &str, now: u64) -> Result<Settled, RetentionError> {
        let _lease = Lease::acquire(&self.root.lease_path_of(addr)).map_err(RetentionError::Lease)?;
        self.settle(addr, now)
    }
}
