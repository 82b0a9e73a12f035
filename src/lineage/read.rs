//! Reading a lineage without opening it for writing: no lease, nothing written. A torn tail
//! is not durable and is not read.
//!
//! The transcript is the store's materialized prefix ⊕ the WAL tail after its watermark, so
//! reading a long session costs the page and the tail, not a replay from zero.

use std::path::Path;

use super::projection::{self, ControlUnit, Cursor};
use super::replay::{Effect, Replay, Resolution};
use super::{decode, LineageError};
use crate::message::Message;
use crate::record;
use crate::session_key::SessionKey;
use crate::store::Store;
use crate::wal::{self, ScannedFrame};

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
}

/// Messages `[from, from + limit)` of the session stored at `wal_path`.
pub fn transcript(
    store: &Store,
    key: &SessionKey,
    wal_path: &Path,
    from: u64,
    limit: u64,
) -> Result<TranscriptPage, LineageError> {
    let header = wal::read_header_of(wal_path, record::KNOWN_FEATURES)?;
    let checkpoint = store.checkpoint(&key.addr())?.filter(|cp| cp.incarnation == header.incarnation_string());
    let end = from.saturating_add(limit);
    let (mut messages, mut replay, resume) = match checkpoint {
        Some(cp) => {
            let upto = cp.replay.prompt_len.min(end);
            let stored = if from < upto { store.messages(&key.addr(), from, upto - from)? } else { Vec::new() };
            (stored, cp.replay, Some((cp.next_offset, cp.watermark_seq + 1)))
        }
        None => (Vec::new(), Replay::default(), None),
    };
    let mut tail = Vec::new();
    let mut visit = |f: ScannedFrame<'_>| -> Result<(), LineageError> {
        let rec = decode(f.seq, f.payload)?;
        replay.apply(f.seq, &rec, &mut |e| match e {
            Effect::Message { ordinal, message, .. } => {
                if ordinal >= from && ordinal < end {
                    messages.push((ordinal, message));
                }
            }
            other => tail.push(other),
        })?;
        replay.note_units(f.seq, projection::unit_count(&rec));
        Ok(())
    };
    wal::read(wal_path, record::KNOWN_FEATURES, resume, &mut visit)?;
    Ok(TranscriptPage {
        messages,
        prompt_len: replay.prompt_len,
        head: replay.last_unit,
        resolution: replay.resolution(),
        state: replay,
        tail,
    })
}

/// The newest durable message of `run_id` with `role`: the WAL tail's, else the store's.
pub fn last_message_of_run(
    store: &Store,
    key: &SessionKey,
    wal_path: &Path,
    run_id: &str,
    role: crate::message::Role,
) -> Result<Option<(u64, Message)>, LineageError> {
    let header = wal::read_header_of(wal_path, record::KNOWN_FEATURES)?;
    let checkpoint = store.checkpoint(&key.addr())?.filter(|cp| cp.incarnation == header.incarnation_string());
    let (mut replay, resume) = match &checkpoint {
        Some(cp) => (cp.replay.clone(), Some((cp.next_offset, cp.watermark_seq + 1))),
        None => (Replay::default(), None),
    };
    let mut found = None;
    let mut visit = |f: ScannedFrame<'_>| -> Result<(), LineageError> {
        let rec = decode(f.seq, f.payload)?;
        replay.apply(f.seq, &rec, &mut |e| {
            if let Effect::Message { ordinal, run_id: r, message, .. } = e {
                if r == run_id && message.role == role {
                    found = Some((ordinal, message));
                }
            }
        })?;
        Ok(())
    };
    wal::read(wal_path, record::KNOWN_FEATURES, resume, &mut visit)?;
    match found {
        Some(m) => Ok(Some(m)),
        None if checkpoint.is_some() => Ok(store.last_message_of_run(&key.addr(), run_id, role)?),
        None => Ok(None),
    }
}

/// Durable control units strictly after `after` (all units when `None`), at most `limit`.
///
/// The replay runs from the start (one record in memory at a time) so each unit names the
/// message ordinals the writer gave it.
pub fn control_units(wal_path: &Path, after: Option<Cursor>, limit: usize) -> Result<Vec<ControlUnit>, LineageError> {
    let mut out = Vec::new();
    let mut replay = Replay::default();
    let mut visit = |f: ScannedFrame<'_>| -> Result<(), LineageError> {
        if out.len() >= limit {
            return Ok(());
        }
        let rec = decode(f.seq, f.payload)?;
        for unit in projection::apply(&mut replay, f.seq, &rec, &mut drop)? {
            if after.is_none_or(|a| unit.cursor > a) && out.len() < limit {
                out.push(unit);
            }
        }
        Ok(())
    };
    wal::read(wal_path, record::KNOWN_FEATURES, None, &mut visit)?;
    Ok(out)
}
