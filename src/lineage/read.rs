//! Reading a lineage without opening it for writing: no lease, nothing written, and only what
//! is durable (through [`Reader`]).
//!
//! The transcript is the store's materialized prefix ⊕ the WAL tail after its watermark, so
//! reading a long session costs the page and the tail, not a replay from zero.

use super::projection::{ControlUnit, Cursor};
use super::reader::{Reader, Sink, Start};
use super::{LineageError, Shared};
use crate::message::{Message, Role};
use crate::replay::{Effect, Replay, Resolution};
use crate::session_key::SessionKey;
pub use crate::store::Entry;

/// A page of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptPage {
    /// `(ordinal, message)` in ordinal order.
    pub messages: Vec<(u64, Message)>,
    /// Messages in the whole conversation.
    pub prompt_len: u64,
    /// The last durable control unit this read covers (`session.subscribe {from: head}`
    /// continues strictly after it).
    pub head: Option<Cursor>,
    /// Where the last episode stands.
    pub resolution: Resolution,
    /// The replay state at the durable end (the last episode, the pending queue, counters).
    pub state: Replay,
    /// Run-state and send-ledger effects of the records after the store's watermark, in
    /// order: the store rows ⊕ these are the durable truth (see `ledger`).
    pub tail: Vec<Effect>,
    /// The session record's identity: its WAL header's incarnation.
    pub incarnation: String,
}

/// Entries in `[from, end)` and the other effects of the tail.
struct PageSink {
    from: u64,
    end: u64,
    entries: Vec<Entry>,
    tail: Vec<Effect>,
}

impl Sink for PageSink {
    fn effect(&mut self, effect: Effect) {
        match effect {
            Effect::Message { ordinal, run_id, written_at, message, .. } => {
                if ordinal >= self.from && ordinal < self.end {
                    self.entries.push(Entry { ordinal, run_id, written_at, message });
                }
            }
            other => self.tail.push(other),
        }
    }
}

/// Messages `[from, from + limit)` of the session read by `reader`.
pub fn transcript(reader: &Reader, from: u64, limit: u64) -> Result<TranscriptPage, LineageError> {
    let (entries, page) = entries(reader, from, limit)?;
    Ok(TranscriptPage { messages: entries.into_iter().map(|e| (e.ordinal, e.message)).collect(), ..page })
}

/// Entries `[from, from + limit)` (with their run and write time) and the page's other facts
/// (its `messages` left empty).
pub fn entries(reader: &Reader, from: u64, limit: u64) -> Result<(Vec<Entry>, TranscriptPage), LineageError> {
    let end = from.saturating_add(limit);
    let mut scan = reader.start(Start::Checkpoint { before: None })?;
    let mut sink = PageSink { from, end, entries: Vec::new(), tail: Vec::new() };
    if let (Some(cp), Some(store)) = (&scan.checkpoint, reader.store()) {
        let upto = cp.replay.prompt_len.min(end);
        if from < upto {
            sink.entries = store.entries(reader.addr(), from, upto - from)?;
        }
    }
    while !reader.next(&mut scan, usize::MAX, &mut sink)? {}
    let replay = scan.replay;
    let page = TranscriptPage {
        messages: Vec::new(),
        prompt_len: replay.prompt_len,
        head: replay.last_unit,
        resolution: replay.resolution(),
        state: replay,
        tail: sink.tail,
        incarnation: scan.incarnation,
    };
    Ok((sink.entries, page))
}

/// The messages at `ordinals` (those the session has): the store's for ordinals below its
/// checkpoint, the WAL tail's for the rest (scanned only when one is asked for).
pub fn messages_at(
    reader: &Reader,
    ordinals: &std::collections::BTreeSet<u64>,
) -> Result<std::collections::BTreeMap<u64, Message>, LineageError> {
    let mut out = std::collections::BTreeMap::new();
    if ordinals.is_empty() {
        return Ok(out);
    }
    let mut scan = reader.start(Start::Checkpoint { before: None })?;
    let stored = match (&scan.checkpoint, reader.store()) {
        (Some(cp), Some(store)) => {
            for &o in ordinals.range(..cp.replay.prompt_len) {
                out.extend(store.messages(reader.addr(), o, 1)?);
            }
            cp.replay.prompt_len
        }
        _ => 0,
    };
    if ordinals.range(stored..).next().is_none() {
        return Ok(out);
    }
    let mut sink = Wanted { ordinals, out: &mut out };
    while !reader.next(&mut scan, usize::MAX, &mut sink)? {}
    Ok(out)
}

/// Collects the messages at the wanted ordinals.
struct Wanted<'a> {
    ordinals: &'a std::collections::BTreeSet<u64>,
    out: &'a mut std::collections::BTreeMap<u64, Message>,
}

impl Sink for Wanted<'_> {
    fn effect(&mut self, effect: Effect) {
        if let Effect::Message { ordinal, message, .. } = effect {
            if self.ordinals.contains(&ordinal) {
                self.out.insert(ordinal, message);
            }
        }
    }
}

/// The session's durable state with no messages: `None` when it has no WAL.
pub fn snapshot(shared: &Shared, key: &SessionKey) -> Result<Option<TranscriptPage>, LineageError> {
    Reader::open(shared, key).map(|r| transcript(&r, u64::MAX, 0)).transpose()
}

/// The newest message of one run with one role.
struct LastOfRun<'a> {
    run_id: &'a str,
    role: Role,
    found: Option<(u64, Message)>,
}

impl Sink for LastOfRun<'_> {
    fn effect(&mut self, effect: Effect) {
        if let Effect::Message { ordinal, run_id, message, .. } = effect {
            if run_id == self.run_id && message.role == self.role {
                self.found = Some((ordinal, message));
            }
        }
    }
}

/// The newest durable message of `run_id` with `role`: the WAL tail's, else the store's.
pub fn last_message_of_run(reader: &Reader, run_id: &str, role: Role) -> Result<Option<(u64, Message)>, LineageError> {
    let mut sink = LastOfRun { run_id, role, found: None };
    let scan = reader.scan(Start::Checkpoint { before: None }, &mut sink)?;
    match (sink.found, reader.store()) {
        (Some(m), _) => Ok(Some(m)),
        (None, Some(store)) if scan.checkpoint.is_some() => {
            Ok(store.last_message_of_run(reader.addr(), run_id, role)?)
        }
        (None, _) => Ok(None),
    }
}

/// A sink of durable control units strictly after `after`, at most `limit`.
pub struct UnitsAfter {
    after: Option<Cursor>,
    limit: usize,
    pub out: Vec<ControlUnit>,
}

impl UnitsAfter {
    pub fn new(after: Option<Cursor>, limit: usize) -> UnitsAfter {
        UnitsAfter { after, limit, out: Vec::new() }
    }
}

impl Sink for UnitsAfter {
    fn wants_units(&self) -> bool {
        true
    }

    fn units(&mut self, units: Vec<ControlUnit>) -> bool {
        let after = self.after;
        self.out.extend(units.into_iter().filter(|u| after.is_none_or(|a| u.cursor > a)));
        self.out.truncate(self.limit);
        self.out.len() < self.limit
    }
}

/// Durable control units strictly after `after` (all units when `None`), at most `limit`.
///
/// The scan starts at a store checkpoint below the cursor (units name the message ordinals the
/// replay state gives them, the same from a checkpoint as from the start).
pub fn control_units(reader: &Reader, after: Option<Cursor>, limit: usize) -> Result<Vec<ControlUnit>, LineageError> {
    let start = match after {
        Some(c) => Start::Checkpoint { before: Some(c.wal_seq) },
        None => Start::Beginning,
    };
    let mut sink = UnitsAfter::new(after, limit);
    if limit > 0 {
        reader.scan(start, &mut sink)?;
    }
    Ok(sink.out)
}

/// The last durable control unit (the `live` attach point): the open writer's published head,
/// else a scan from the checkpoint that builds no unit.
pub fn durable_head(shared: &Shared, key: &SessionKey) -> Result<Option<Cursor>, LineageError> {
    if let Some(open) = shared.ends.open_writer(&key.addr()) {
        return Ok(open.head);
    }
    match Reader::open(shared, key) {
        Some(reader) => {
            Ok(reader.scan(Start::Checkpoint { before: None }, &mut super::reader::StateOnly)?.replay.last_unit)
        }
        None => Ok(None),
    }
}
