//! A lineage: one session's WAL, its lease, its replayed state and its derived store rows.
//!
//! [`Lineage`] is the only writer of its WAL (it holds the lease for as long as it lives).
//! Opening it acquires the lease, replays the WAL from the store's checkpoint (or from the
//! start), truncates a torn tail, and seals a run a previous process left open. Appends are
//! checked against the replay state before they are written, so an invalid record is refused
//! and nothing is written. Control units become visible (are returned by [`Lineage::commit`])
//! only after the fsync that makes them durable.

pub mod calls;
pub mod ends;
pub mod fold;
mod held;
pub mod ledger;
mod listed;
pub mod projection;
pub mod read;
pub mod reader;
mod shared;
pub mod unit;

pub use shared::Shared;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::clock::SharedClock;
use crate::message::Message;
use crate::record::{self, CancelAt, FinishReason, ProviderError, Record, RequestIdentity};
use crate::replay::{self, Replay, ReplayError, Resolution};
use crate::session_key::SessionKey;
use crate::state_root::Placement;
use crate::store::writer::{FlushMark, StoreWriter};
use crate::store::{Checkpoint, Store, StoreBatch, StoreError};
use crate::wal::{self, FeatureFloor, Lease, LeaseError, RecordOutcome, ScannedFrame, Storage, Wal, WalError, WalOpen};
use crate::wire::{Refusal, RefusalCode};
use ends::{Durable, DurableEnds, WriterEnd};
use projection::{ControlUnit, Cursor};

/// Derived effects held before the store is written (bounds memory during a long replay).
const FLUSH_EFFECTS: usize = 512;

/// Every way opening, reading or writing a lineage fails.
#[derive(Debug)]
pub enum LineageError {
    Lease(LeaseError),
    Wal(WalError),
    /// A frame's payload is not a record this build can read.
    Decode {
        seq: u64,
        reason: String,
    },
    /// The WAL holds a record that may not follow its predecessors.
    Replay(ReplayError),
    /// An append was refused before anything was written.
    Refused(String),
    /// The session's actor has `limit` commands waiting: try again shortly.
    MailboxFull {
        limit: usize,
    },
    /// `limit` sessions are open in this process already (`limits.open_sessions`).
    TooManySessions {
        limit: usize,
    },
    Store(StoreError),
    /// Settling the session's retention at open failed (nothing was deleted before its
    /// tombstone was durable).
    Retention(crate::retention::RetentionError),
}

impl std::fmt::Display for LineageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineageError::Lease(e) => e.fmt(f),
            LineageError::Wal(e) => e.fmt(f),
            LineageError::Decode { seq, reason } => {
                write!(f, "wal record seq {seq} does not decode: {reason}")
            }
            LineageError::Replay(e) => e.fmt(f),
            LineageError::Refused(why) => write!(f, "append refused: {why}"),
            LineageError::MailboxFull { limit } => {
                write!(f, "the session is busy: its actor has {limit} commands waiting; try again shortly")
            }
            LineageError::TooManySessions { limit } => {
                write!(f, "{limit} sessions are open in this process; try again when one closes")
            }
            LineageError::Store(e) => e.fmt(f),
            LineageError::Retention(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LineageError {}

impl From<WalError> for LineageError {
    fn from(e: WalError) -> Self {
        LineageError::Wal(e)
    }
}
impl From<LeaseError> for LineageError {
    fn from(e: LeaseError) -> Self {
        LineageError::Lease(e)
    }
}
impl From<ReplayError> for LineageError {
    fn from(e: ReplayError) -> Self {
        LineageError::Replay(e)
    }
}
impl From<StoreError> for LineageError {
    fn from(e: StoreError) -> Self {
        LineageError::Store(e)
    }
}

impl LineageError {
    /// The refusal an operation that opens or reads this lineage answers with (spec §10.2).
    pub fn refusal(&self) -> Refusal {
        match self {
            LineageError::Wal(e @ WalError::NewerWriter { missing, .. }) => Refusal::new(
                RefusalCode::WalNewerWriter,
                format!("open failed: wal range-read failed: {e}"),
                Some(crate::detail!("kind" => "newer_writer", "missing" => missing)),
            ),
            LineageError::Lease(e @ LeaseError::Busy { pid, .. }) => Refusal::new(
                RefusalCode::SessionBusy,
                e.to_string(),
                Some(crate::detail!("state" => "leased", "holder_pid" => pid)),
            ),
            LineageError::Lease(e @ LeaseError::Stale { .. }) => {
                Refusal::new(RefusalCode::LeaseStale, e.to_string(), None)
            }
            LineageError::TooManySessions { limit } => {
                crate::wire::over_limit(RefusalCode::TooManySessions, "no more sessions may open", *limit, None)
            }
            // An I/O failure (interrupted, or a latched write/fsync failure) or a full mailbox:
            // try again later.
            LineageError::Wal(WalError::Io { .. } | WalError::Poisoned { .. }) | LineageError::MailboxFull { .. } => {
                Refusal::new(
                    RefusalCode::OpenFailed,
                    format!("open failed: {self}"),
                    Some(crate::detail!("class" => "transient")),
                )
            }
            other => Refusal::new(RefusalCode::OpenFailed, format!("open failed: {other}"), None),
        }
    }
}

/// What happened to a retract request (decided atomically against consumption).
#[derive(Debug, PartialEq, Eq)]
pub enum RetractOutcome {
    /// It was pending; a durable `Retracted` tombstone now says so.
    Retracted,
    /// Not pending: already consumed into a run, already retracted, or never queued.
    NotPending,
}

/// What opening found and did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OpenReport {
    /// Records replayed from the WAL during this open (the tail after the checkpoint).
    pub replayed: u64,
    /// The store checkpoint was used.
    pub from_checkpoint: bool,
    /// The run sealed because a previous process left it open.
    pub sealed_orphan: Option<String>,
}

fn decode(seq: u64, payload: &[u8]) -> Result<Record, LineageError> {
    Record::decode(payload).map_err(|e| LineageError::Decode { seq, reason: e.0 })
}

/// The single writer of one session.
pub struct Lineage {
    key: SessionKey,
    /// `key.addr()`, computed once (call keys name it at every dispatch).
    addr: String,
    store: Arc<Store>,
    wal: Wal,
    replay: Replay,
    /// Units of appended records not yet fsynced (invisible until `commit`).
    unsynced: Vec<ControlUnit>,
    /// The last durable control unit.
    head: Option<Cursor>,
    /// Derived rows since the store's watermark.
    batch: StoreBatch,
    /// Writes derived rows off this thread.
    writer: Arc<StoreWriter>,
    /// How far this lineage's batches are written, and the last batch it sent.
    flush_mark: Arc<FlushMark>,
    flush_generation: u64,
    /// A store flush failed: stop flushing (the old checkpoint stays valid) until reopen.
    store_broken: Arc<AtomicBool>,
    /// The watermark of the last checkpoint sent to the store.
    checkpoint_seq: u64,
    /// A committed record changed the durable queue since the last flush.
    queue_changed: bool,
    report: OpenReport,
    /// Units the open made durable (an orphan's seal) that its owner has not yet published.
    opened_units: Vec<ControlUnit>,
    /// Held from the start of the open until its seal is durable (readers wait).
    opening: Option<ends::Opening>,
    storage: Arc<dyn Storage>,
    ends: Arc<DurableEnds>,
    /// The process's wall clock: every time this lineage records.
    clock: SharedClock,
    /// Where this writer publishes its fsynced end for readers (declared before the lease, so
    /// it is withdrawn before another writer can take the session).
    end: WriterEnd,
    /// New sends are refused busy until then (`fence_sends_until`).
    sends_fenced_until_ms: u64,
    /// The record had expired when this writer opened it, and held calls fenced its deletion
    /// (`crate::retention::Settled::Fenced`): sends are refused rather than revive it.
    deletion_fenced: Option<crate::intake::fence::Fence>,
    _lease: Lease,
}

impl Lineage {
    /// Opens (creating if new) the session's lineage for writing. An existing WAL is opened in
    /// whichever live tree holds it (configuration never moves a session); `placement` only
    /// decides the tree a NEW session's WAL is created in. The lease, taken first, makes the
    /// exists-then-create decision race-free against other writers of the session.
    pub fn open(shared: &Shared, key: &SessionKey, placement: Placement) -> Result<Lineage, LineageError> {
        let (root, store, floor) = (&shared.root, Arc::clone(&shared.store), Some(Arc::clone(&shared.floor)));
        let storage = shared.storage.as_ref();
        // No settle of the run-index writer here: a previous holder in this process waited
        // for its own rows before it let the lease go (`Drop for Lineage`), so none of this
        // session's rows is still queued, and a new session never waits behind every other
        // session's queued rows.
        let own_wait = std::time::Duration::from_millis(crate::limits::OWN_LEASE_WAIT_MS);
        let mut lease = Lease::acquire_waiting_for_own(&root.lease_path(key), own_wait)?;
        // A creation a crash cut before its first fsync holds nothing anyone was answered
        // about: it goes, and this send starts the session afresh.
        wal::discard_unfinished(storage, &root.wal_path(key))?;
        // A retained session past its expiry (or with a deletion a crash interrupted) is
        // deleted before anything reads it: a send to it starts a fresh record. One whose
        // deletion held calls fence stays as it is, and this writer refuses sends to it.
        let settled = shared.expiry().settle(&key.addr(), shared.clock.now_ms()).map_err(|e| match e {
            // A WAL this build cannot read is refused as any open refuses it.
            crate::retention::RetentionError::Wal(e) => LineageError::Wal(e),
            other => LineageError::Retention(other),
        })?;
        let deletion_fenced = match settled {
            crate::retention::Settled::Fenced { fence, .. } => Some(fence),
            _ => None,
        };
        let end = shared.ends.writer(&key.addr());
        // Readers of this session wait while it opens: the scan may cut a torn tail.
        let mut opening = end.opening();
        let truncate_to = opening.failed_end;
        // Kept in the slot until this open succeeds (a failed open must not forget it).
        let failure = opening.failure.clone();
        let mut path = root.wal_path(key);
        if !path.exists() {
            // A folded session reopens in the tree it was folded from (its class is kept).
            if let Some(live) =
                fold::unfold(shared, &key.addr(), true).map_err(|e| LineageError::Refused(e.to_string()))?
            {
                path = live;
            }
        }
        let (mut wal, mut replay, head, batch, report) = if path.exists() {
            Self::open_existing(shared, key, &path, lease.epoch(), truncate_to)?
        } else {
            // A new session: its WAL is created by the first committed record, so an open whose
            // send is then refused leaves no file behind (and readers still find no session).
            let path = root.wal_path_placed(key, placement);
            let wal = wal::Wal::create_on_first_write(
                Arc::clone(&shared.storage),
                &path,
                key.lineage_id(),
                lease.epoch(),
                floor,
            );
            (wal, Replay::default(), None, StoreBatch::default(), OpenReport::default())
        };
        opening.failed_end = None;
        opening.failure = None;
        opening.open = Some(Durable { offset: wal.synced_end(), seq: wal.synced_seq(), head });
        if replay.last_epoch >= lease.epoch() {
            let lease_path = root.lease_path(key);
            lease.raise_to(replay.last_epoch + 1).map_err(|source| LeaseError::Io { path: lease_path, source })?;
            wal.set_epoch(lease.epoch());
        }
        replay.last_epoch = lease.epoch();
        let mut lineage = Lineage {
            key: key.clone(),
            addr: key.addr(),
            store,
            wal,
            replay,
            unsynced: Vec::new(),
            head,
            batch,
            writer: Arc::clone(&shared.writer),
            flush_mark: Arc::default(),
            flush_generation: 0,
            store_broken: Arc::new(AtomicBool::new(false)),
            checkpoint_seq: 0,
            queue_changed: false,
            report,
            opened_units: Vec::new(),
            opening: Some(opening),
            storage: Arc::clone(&shared.storage),
            ends: Arc::clone(&shared.ends),
            clock: Arc::clone(&shared.clock),
            end,
            sends_fenced_until_ms: 0,
            deletion_fenced,
            _lease: lease,
        };
        lineage.seal_orphan(failure.as_deref())?;
        // Readers may look now: the orphan (if any) is sealed and durable.
        lineage.opening = None;
        lineage.flush_store(true);
        Ok(lineage)
    }

    /// Opens an existing WAL for writing: from the store's checkpoint when it matches the
    /// file's incarnation (else a full replay), cutting what a failed writer left unsynced.
    #[allow(clippy::type_complexity)]
    fn open_existing(
        shared: &Shared,
        key: &SessionKey,
        path: &Path,
        epoch: u64,
        truncate_to: Option<u64>,
    ) -> Result<(Wal, Replay, Option<Cursor>, StoreBatch, OpenReport), LineageError> {
        let (store, floor, storage) = (&shared.store, Some(Arc::clone(&shared.floor)), shared.storage.as_ref());
        let header = wal::read_header_of(storage, path, record::KNOWN_FEATURES)?;
        let incarnation = header.incarnation_string();
        let addr = key.addr();
        let checkpoint = match store.checkpoint(&addr) {
            Ok(Some(cp)) if cp.incarnation == incarnation => Some(cp),
            Ok(Some(_)) => {
                log::info!("wal {} has a new incarnation; rebuilding its store rows", path.display());
                store.forget_lineage(&addr)?;
                None
            }
            Ok(None) => None,
            Err(e) => {
                log::warn!("store checkpoint of {addr} unreadable ({e}); replaying from the start");
                None
            }
        };
        let at = OpenAt { storage, path, key, store, epoch, truncate_to };
        match checkpoint {
            Some(cp) => match at.replay_open(floor.clone(), Some(cp), &incarnation) {
                Err(LineageError::Wal(WalError::Corrupt { offset, reason })) => {
                    log::warn!("store checkpoint of {addr} does not match its wal ({reason} at {offset}); replaying from the start");
                    store.forget_lineage(&addr)?;
                    at.replay_open(floor, None, &incarnation)
                }
                other => other,
            },
            None => at.replay_open(floor, None, &incarnation),
        }
    }
}

/// What one open replays: the WAL, its session, the store and the tenure stamp.
struct OpenAt<'a> {
    storage: &'a dyn Storage,
    path: &'a Path,
    key: &'a SessionKey,
    store: &'a Store,
    epoch: u64,
    truncate_to: Option<u64>,
}

impl OpenAt<'_> {
    #[allow(clippy::type_complexity)]
    fn replay_open(
        &self,
        floor: Option<Arc<FeatureFloor>>,
        checkpoint: Option<Checkpoint>,
        incarnation: &str,
    ) -> Result<(Wal, Replay, Option<Cursor>, StoreBatch, OpenReport), LineageError> {
        let (path, key, store) = (self.path, self.key, self.store);
        let from_checkpoint = checkpoint.is_some();
        let resume_at = checkpoint.as_ref().map(|cp| (cp.next_offset, cp.watermark_seq + 1));
        let mut replay = checkpoint.map(|cp| cp.replay).unwrap_or_default();
        let mut batch = StoreBatch::default();
        let mut replayed = 0u64;
        let mut visit = |f: ScannedFrame<'_>| -> Result<(), LineageError> {
            let rec = decode(f.seq, f.payload)?;
            let mut tool_message = false;
            replay.apply(f.seq, &rec, &mut |e| {
                tool_message |= projection::is_tool_message(&e);
                batch.effects.push(e)
            })?;
            replay.note_units(f.seq, projection::unit_count(&rec, tool_message));
            replay.last_epoch = replay.last_epoch.max(f.epoch);
            replayed += 1;
            if batch.len() >= FLUSH_EFFECTS {
                batch.checkpoint = Some(Checkpoint {
                    incarnation: incarnation.to_string(),
                    watermark_seq: f.seq,
                    next_offset: f.offset + f.len,
                    replay: replay.clone(),
                });
                store.flush(key, path, &batch)?;
                batch = StoreBatch::default();
            }
            Ok(())
        };
        let opts = WalOpen {
            known_features: record::KNOWN_FEATURES,
            resume_at,
            epoch: self.epoch,
            floor,
            truncate_to: self.truncate_to,
        };
        let wal = Wal::open(self.storage, path, opts, &mut visit)?;
        let head = replay.last_unit;
        Ok((wal, replay, head, batch, OpenReport { replayed, from_checkpoint, sealed_orphan: None }))
    }
}

impl Lineage {
    /// Seals a run a previous process left open (spec §14): unknown-outcome results for calls
    /// with an intent and no result (never a resend), then `RunFinished{interrupted}` with the
    /// crash diagnostic — or `cancelled` when a cancel was already durably acknowledged.
    /// `failure` names the I/O failure of this process's previous writer, if that is why the
    /// run was left open.
    fn seal_orphan(&mut self, failure: Option<&str>) -> Result<(), LineageError> {
        let Resolution::Resume { run_id } = self.replay.resolution() else {
            return Ok(());
        };
        let step = self.replay.last.as_ref().map_or(0, |e| e.step);
        // A durably acknowledged cancel ends it `cancelled`, unless the cancel came from an
        // interrupt still waiting to start: that unfinished interrupted run is `interrupted`.
        let cancelled = self.replay.last.as_ref().and_then(|e| e.cancel).is_some() && !self.replay.interrupt_pending();
        // Calls a provider holds keep waiting for their late results (the run pauses), unless
        // the run was cancelled.
        let waiting_held = |c: &crate::replay::BatchCall| c.held.is_some() && !cancelled;
        let open = self.replay.indeterminate_calls();
        let held = open.iter().filter(|c| waiting_held(c)).count();
        let calls: Vec<String> = open.iter().filter(|c| !waiting_held(c)).map(|c| c.tool_call_id.clone()).collect();
        for id in &calls {
            let output = json!({"kind": "error", "reason": "outcome_unknown", "message": "the outcome of this call is unknown: broca ended while it was in flight, and it was not sent again"});
            self.append_sealed_result(&run_id, step, id, output, record::CallOutcome::Unknown)?;
        }
        if held > 0 {
            self.append(&Record::RunPaused {
                run_id: run_id.clone(),
                reason: record::PauseReason::ToolHeld,
                error: None,
            })?;
            self.opened_units = self.commit()?;
            log::info!("run {run_id} left open by a previous process waits for {held} held call(s)");
            return Ok(());
        }
        // Steers acknowledged into this run and not yet delivered join its transcript now, as
        // at any run's end (spec §4: no new turn is started for them).
        self.deliver_steers(&run_id)?;
        let (reason, error) = if cancelled {
            (FinishReason::Cancelled, None)
        } else {
            let error = failure.map_or_else(ProviderError::previous_process_ended, ProviderError::storage_failed);
            (FinishReason::Interrupted, Some(error))
        };
        self.finish_run(&run_id, reason, error, calls)?;
        let units = self.commit()?;
        // Published by the lineage's owner as soon as it has one (subscribers attached before
        // the open are waiting for exactly these units).
        self.opened_units = units;
        log::info!("sealed run {run_id} left open by a previous process as {}", reason.as_str());
        self.report.sealed_orphan = Some(run_id);
        Ok(())
    }

    /// Appends a `Steered` record for every queued steer that targets `run_id` (not yet durable):
    /// their messages join the transcript. Returns the messages, in queue order.
    pub fn deliver_steers(&mut self, run_id: &str) -> Result<Vec<Message>, LineageError> {
        let steers: Vec<_> = self.replay.pending_steers(run_id).cloned().collect();
        let mut delivered = Vec::with_capacity(steers.len());
        for p in steers {
            self.append(&Record::Steered {
                run_id: run_id.to_string(),
                submission_id: p.submission_id,
                message: p.message.clone(),
                title: p.request.title,
            })?;
            delivered.push(p.message);
        }
        Ok(delivered)
    }

    /// Appends the last episode's `RunFinished` with its counters (not yet durable).
    pub fn finish_run(
        &mut self,
        run_id: &str,
        reason: FinishReason,
        error: Option<ProviderError>,
        indeterminate_tool_calls: Vec<String>,
    ) -> Result<u64, LineageError> {
        self.finish_run_with(run_id, reason, error, indeterminate_tool_calls, None)
    }

    /// [`Lineage::finish_run`] with the terminal's `detail` (e.g. `budget_exhausted`'s).
    pub fn finish_run_with(
        &mut self,
        run_id: &str,
        reason: FinishReason,
        error: Option<ProviderError>,
        indeterminate_tool_calls: Vec<String>,
        detail: Option<record::BudgetDetail>,
    ) -> Result<u64, LineageError> {
        let e = self.replay.last.as_ref().ok_or_else(|| LineageError::Refused("no run to finish".into()))?;
        let rec = Record::RunFinished {
            run_id: run_id.to_string(),
            reason,
            error,
            usage: e.usage.clone(),
            retries_used: e.retries_used,
            final_step_finish_reason: e.final_step_finish_reason.clone(),
            indeterminate_tool_calls,
            at_ms: self.now_ms(),
            detail,
            undelivered_steers: e.unrendered_steers.clone(),
        };
        self.append(&rec)
    }

    /// Now, on the process's clock: the time a record of this lineage carries.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The process's clock (a wait for a wall-clock moment reads it).
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// The session address (`key().addr()`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn wal_path(&self) -> &Path {
        self.wal.path()
    }

    /// The WAL's incarnation (its header's UUID): the scope of every `seq` in it.
    pub fn incarnation(&self) -> String {
        self.wal.header().incarnation_string()
    }

    pub fn state(&self) -> &Replay {
        &self.replay
    }

    /// The WAL's fsynced end (its length as readers may see it).
    pub fn durable_end(&self) -> u64 {
        self.wal.synced_end()
    }

    /// Keeps new sends out until `until_ms` (a move waiting for the session to drain,
    /// `crate::moves`). In memory only: a restart forgets it, as it forgets the waiting export.
    pub fn fence_sends_until(&mut self, until_ms: u64) {
        self.sends_fenced_until_ms = until_ms;
    }

    /// How long new sends are still kept out (0: not fenced).
    pub fn sends_fenced_for_ms(&self) -> u64 {
        self.sends_fenced_until_ms.saturating_sub(self.clock.now_ms())
    }

    /// Why the expired record this writer opened could not be deleted first (held calls fence
    /// its deletion, spec §19), if so.
    pub fn deletion_fenced(&self) -> Option<&crate::intake::fence::Fence> {
        self.deletion_fenced.as_ref()
    }

    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// The units the open made durable (an orphan's seal), once: the owner publishes them.
    pub fn take_opened_units(&mut self) -> Vec<ControlUnit> {
        std::mem::take(&mut self.opened_units)
    }

    /// Whether every committed record's derived rows reach the store (false after a failed
    /// flush: the store then stays at its older checkpoint until the lineage is reopened).
    pub fn store_current(&self) -> bool {
        !self.store_broken.load(Ordering::Acquire)
    }

    /// Whether a failed write or fsync latched this lineage's WAL (appends are refused until
    /// it is reopened).
    pub fn write_failed(&self) -> bool {
        self.wal.failed()
    }

    /// The last fsynced seq.
    pub fn durable_seq(&self) -> u64 {
        self.wal.synced_seq()
    }

    /// WAL fsyncs made since this lineage was opened.
    pub fn fsyncs(&self) -> u64 {
        self.wal.fsyncs()
    }

    /// The seq the next appended record will get.
    pub fn next_seq(&self) -> u64 {
        self.wal.appended_seq() + 1
    }

    /// Messages `[from, from + limit)` of this lineage: the store prefix ⊕ the WAL tail.
    /// Only what is durable is read.
    pub fn transcript(&self, from: u64, limit: u64) -> Result<read::TranscriptPage, LineageError> {
        read::transcript(&self.reader(), from, limit)
    }

    /// A reader of this lineage's WAL, bounded by its fsynced end (empty until the first
    /// record creates the file).
    pub fn reader(&self) -> reader::Reader {
        let (store, storage, ends) = (Arc::clone(&self.store), Arc::clone(&self.storage), Arc::clone(&self.ends));
        let reader = reader::Reader::parts(store, storage, ends, &self.key, self.wal.path().to_path_buf());
        if self.wal.created() {
            reader
        } else {
            reader.unwritten(self.incarnation())
        }
    }

    /// The last durable control unit; `from: "live"` attaches strictly after it.
    pub fn head(&self) -> Option<Cursor> {
        self.head
    }

    /// Checks and appends a record (not yet durable). A refused record writes nothing.
    pub fn append(&mut self, rec: &Record) -> Result<u64, LineageError> {
        self.replay.check(rec).map_err(LineageError::Refused)?;
        let payload = rec.encode();
        let seq = match self.wal.append(&rec.features(), &payload, false) {
            RecordOutcome::Accepted(seq) => seq,
            RecordOutcome::Refused(e) => {
                if self.wal.failed() {
                    self.unsynced.clear();
                    self.end.failed(self.opening.as_mut(), self.wal.synced_end(), e.to_string());
                }
                return Err(e.into());
            }
        };
        let batch = &mut self.batch;
        let units = projection::apply(&mut self.replay, seq, rec, &mut |e| batch.effects.push(e))?;
        self.queue_changed |= matches!(rec, Record::Queued { .. } | Record::Retracted { .. } | Record::Steered { .. });
        self.unsynced.extend(units);
        Ok(seq)
    }

    /// Makes every appended record durable (one fsync) and returns the control units that
    /// became visible, in cursor order.
    pub fn commit(&mut self) -> Result<Vec<ControlUnit>, LineageError> {
        if let Err(e) = self.wal.sync() {
            self.unsynced.clear();
            self.end.failed(self.opening.as_mut(), self.wal.synced_end(), e.to_string());
            return Err(e.into());
        }
        let units = std::mem::take(&mut self.unsynced);
        if let Some(last) = units.last() {
            self.head = Some(last.cursor);
        }
        let durable = Durable { offset: self.wal.synced_end(), seq: self.wal.synced_seq(), head: self.head };
        self.end.publish(self.opening.as_mut(), durable);
        // Run lifecycle changes and queue changes reach the store at once (boot recovery finds
        // queued work there), and so does a warm's fact (its bill); everything else in batches.
        let terminal = self
            .batch
            .effects
            .iter()
            .any(|e| matches!(e, replay::Effect::RunState { .. } | replay::Effect::Warm { .. }));
        let queue_changed = std::mem::take(&mut self.queue_changed);
        self.flush_store(terminal || queue_changed || self.batch.len() >= FLUSH_EFFECTS);
        Ok(units)
    }

    /// Appends and commits one record.
    pub fn append_commit(&mut self, rec: &Record) -> Result<(u64, Vec<ControlUnit>), LineageError> {
        let seq = self.append(rec)?;
        Ok((seq, self.commit()?))
    }

    /// Queues derived rows and a checkpoint at the durable head for the run-index writer. Only
    /// called with nothing unsynced, so the store never describes undurable records, and never
    /// before the WAL exists (a session nothing was committed to has no rows).
    fn flush_store(&mut self, force: bool) {
        if !self.wal.created()
            || self.store_broken.load(Ordering::Acquire)
            || !force
            || self.wal.appended_seq() != self.wal.synced_seq()
        {
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        self.checkpoint_seq = self.wal.synced_seq();
        batch.checkpoint = Some(Checkpoint {
            incarnation: self.wal.header().incarnation_string(),
            watermark_seq: self.wal.synced_seq(),
            next_offset: self.wal.next_offset(),
            replay: self.replay.clone(),
        });
        self.flush_generation += 1;
        let (wal, generation) = (self.wal.path().to_path_buf(), self.flush_generation);
        self.writer.flush(&self.key, wal, batch, &self.store_broken, &self.flush_mark, generation);
    }

    /// Returns once every derived row this lineage queued is in `run-index.db` (at once when
    /// none is pending; other sessions' rows are not waited for).
    pub fn settle(&self) {
        self.flush_mark.wait_for(self.flush_generation);
    }

    /// Durably queues a send (spec §11). Durable when this returns; the units are the ones
    /// that became visible with it.
    pub fn enqueue(
        &mut self,
        submission_id: &str,
        message: Message,
        request: RequestIdentity,
    ) -> Result<(u64, Vec<ControlUnit>), LineageError> {
        self.append_commit(&Record::Queued { submission_id: submission_id.into(), message, request })
    }

    /// Retracts a pending send, atomically against its consumption (the writer is `&mut`).
    /// Either answer is durable when returned: a `NotPending` caused by a consumption not yet
    /// fsynced commits it first, so a crash cannot make the send pending again.
    pub fn retract(&mut self, submission_id: &str) -> Result<(RetractOutcome, Vec<ControlUnit>), LineageError> {
        if self.replay.pending(submission_id).is_none() {
            return Ok((RetractOutcome::NotPending, self.commit()?));
        }
        let units = self.append_commit(&Record::Retracted { submission_id: submission_id.into() })?.1;
        Ok((RetractOutcome::Retracted, units))
    }

    /// Records a cancel request for the last run: durable before this returns (the `"ack"`);
    /// a later `now` escalates a `step_boundary`.
    pub fn request_cancel(&mut self, run_id: &str, at: CancelAt) -> Result<Vec<ControlUnit>, LineageError> {
        Ok(self.append_commit(&Record::RunCancelRequested { run_id: run_id.into(), at })?.1)
    }
}

impl Drop for Lineage {
    /// A closing lineage leaves the store's checkpoint at its durable head, and waits until
    /// its rows are written: the lease (dropped after this) is then the proof, for the next
    /// writer of the session, that none of its rows is still queued.
    fn drop(&mut self) {
        if self.wal.appended_seq() == self.wal.synced_seq() {
            self.flush_store(self.checkpoint_seq < self.wal.synced_seq());
        }
        self.settle();
    }
}
