//! Retention on the read side (llm-runner §9.1): every session op but `role.describe` and
//! `session.send` first asks whether the session's record expired. An expired record answers
//! `expired {expired_at_ms}` (terminal) from the moment its time passed, before its deletion
//! lands (`crate::retention` decides from the WAL alone), and afterwards from its tombstone;
//! a session never written keeps its empty answers. A record started after an expiry serves
//! the history version its tombstone allocated.

use super::Ops;
use crate::lineage::read;
use crate::retention::{self, Tombstone};
use crate::session_key::SessionKey;
use crate::state_root::Placement;
use crate::wire::{Refusal, RefusalCode};

/// The `expired` refusal of a record that expired at `expired_at_ms`.
pub fn expired(expired_at_ms: u64) -> Refusal {
    let message = "the session's record expired under its retention (detail.expired_at_ms); its content is deleted";
    Refusal::new(RefusalCode::Expired, message, Some(crate::detail!("expired_at_ms" => expired_at_ms)))
}

/// The session's history version, or `expired` when its record expired.
pub fn record_version(ops: &Ops, key: &SessionKey) -> Result<u64, Refusal> {
    let shared = ops.registry.shared();
    let addr = key.addr();
    let tombstone = retention::tombstone(&shared.root, &addr);
    let version = retention::version_after(tombstone.as_ref());
    match shared.root.placement_of(key) {
        // No live record: expired if it ever was, else never written.
        None => match tombstone {
            Some(t) => Err(expired(t.expired_at_ms)),
            None => Ok(version),
        },
        Some(Placement::Ephemeral) => match read::snapshot(shared, key) {
            Ok(Some(page)) => live_or_expired(&page, tombstone.as_ref(), shared.clock.now_ms()).map(|()| version),
            Ok(None) => tombstone.map_or(Ok(version), |t| Err(expired(t.expired_at_ms))),
            // The sweep may delete the file under the read: its tombstone then answers.
            Err(e) => match retention::tombstone(&shared.root, &addr) {
                Some(t) => Err(expired(t.expired_at_ms)),
                None => Err(e.refusal()),
            },
        },
        // Kept forever (a record started without retention, perhaps after an expiry).
        Some(_) => Ok(version),
    }
}

/// A retained record's own state: expired when its tombstone names it (deletion pending) or
/// when its expiry time has passed at `now_ms`.
fn live_or_expired(page: &read::TranscriptPage, tombstone: Option<&Tombstone>, now_ms: u64) -> Result<(), Refusal> {
    if let Some(t) = tombstone.filter(|t| t.incarnation == page.incarnation) {
        return Err(expired(t.expired_at_ms));
    }
    match retention::expiry_of(&page.state) {
        Some(at) if now_ms >= at => Err(expired(at)),
        _ => Ok(()),
    }
}
