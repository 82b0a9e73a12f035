//! The session actor's half of a move (`crate::moves`, DESIGN §8): the `moved_out` tombstone,
//! written between runs and only while the session is idle, and the refusals a session being
//! moved, or moved away, answers.

use crate::lineage::Lineage;
use crate::record::{MovedOut, Record};
use crate::replay::EpisodeStatus;
use crate::wire::{Refusal, RefusalCode};

/// How long an export that found the session busy keeps new sends out, so the run in flight
/// can finish and the next export finds the session idle.
pub const MOVE_FENCE_MS: u64 = 10_000;
/// The actor's half: the session's tombstone, written now if the session is idle (or the one
/// an earlier export wrote). A busy session is fenced for [`MOVE_FENCE_MS`] and refused.
pub fn tombstone(lineage: &mut Lineage) -> Result<MovedOut, Refusal> {
    let state = lineage.state();
    if let Some(done) = &state.moved_out {
        return Ok(done.clone());
    }
    let running = state.last.as_ref().is_some_and(|e| !matches!(e.status, EpisodeStatus::Finished { .. }));
    if running || !state.queue.is_empty() {
        let now = lineage.now_ms();
        lineage.fence_sends_until(now + MOVE_FENCE_MS);
        return Err(not_idle(MOVE_FENCE_MS));
    }
    let wal_bytes = lineage.durable_end();
    if wal_bytes > crate::limits::MOVE_WAL_BYTES {
        // Refused before the tombstone: an archive no host could adopt would strand the session.
        return Err(too_large(wal_bytes));
    }
    let wal = read_prefix(lineage.wal_path(), wal_bytes).map_err(|e| open_failed(&e))?;
    let tombstone =
        MovedOut { epoch: state.last_epoch, wal_bytes, wal_sha256: sha256_hex(&wal), at_ms: lineage.now_ms() };
    lineage.append_commit(&Record::MovedOut(Box::new(tombstone.clone()))).map_err(|e| e.refusal())?;
    Ok(tombstone)
}

/// `session_moved`: this host's copy was exported (never names a path or the target).
pub fn session_moved(addr: &str, epoch: u64) -> Refusal {
    Refusal::new(
        RefusalCode::SessionMoved,
        "the session was moved to another host; send it there",
        Some(crate::detail!("class" => "permanent", "session_ref" => addr, "epoch" => epoch)),
    )
}

/// `session_too_large`: the session's WAL is larger than a move carries; nothing was written.
pub fn too_large(wal_bytes: u64) -> Refusal {
    Refusal::new(
        RefusalCode::SessionTooLarge,
        format!("the session's WAL ({wal_bytes} bytes) is larger than a move carries; it stays on this host"),
        Some(
            crate::detail!("class" => "permanent", "limit" => crate::limits::MOVE_WAL_BYTES, "wal_bytes" => wal_bytes),
        ),
    )
}

/// `session_busy` to a send while a move waits for the session to drain.
pub fn moving(retry_after_ms: u64) -> Refusal {
    busy("the session is being moved: it takes no new sends until it has drained", retry_after_ms)
}

/// `session_busy` to an export (or adopt) that found the session running, queued or open.
pub fn not_idle(retry_after_ms: u64) -> Refusal {
    busy(
        "the session has a run in progress or sends queued: new sends are held off while it drains; ask again",
        retry_after_ms,
    )
}

fn busy(message: &str, retry_after_ms: u64) -> Refusal {
    Refusal::new(
        RefusalCode::SessionBusy,
        message,
        Some(crate::detail!("class" => "transient", "retry_after_ms" => retry_after_ms)),
    )
}

/// The first `len` bytes of the file at `path`.
pub fn read_prefix(path: &std::path::Path, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    std::fs::File::open(path)?.take(len).read_to_end(&mut out)?;
    if out.len() as u64 != len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the WAL is shorter than its durable end"));
    }
    Ok(out)
}

pub fn open_failed(e: &std::io::Error) -> Refusal {
    Refusal::new(
        RefusalCode::OpenFailed,
        format!("cannot read the session's WAL: {e}"),
        Some(crate::detail!("class" => "transient")),
    )
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    crate::session_key::hex(&Sha256::digest(bytes))
}
