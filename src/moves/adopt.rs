//! `move.adopt {archive}`: take a session an archive in the exchange directory carries.
//! In this order, and nothing written before the last check: who asks (on this host, its
//! key-holder or an attested module), the named file (a regular file read through a bound,
//! never through a symlink), its seal under this host's move key, the archive's digests, every
//! frame and the replay in memory (an idle session whose WAL belongs to this route's triple),
//! and then the caller against the owner the archive records. Only then is this host's copy
//! closed, its lease taken, the WAL staged beside the live tree, synced, and renamed into place
//! under the session's lease, whose epoch is raised above the archive's.
//!
//! Steps, each with a fail point, and what a crash after it leaves:
//!
//! | step | after a crash |
//! |---|---|
//! | `move.adopt.after_stage` (the archive's WAL written to `<addr>.wal.adopting` and synced) | nothing adopted; the staged file is removed by the next adopt of the session |
//! | `move.adopt.after_forget` (this host's derived rows of an older copy dropped) | the older copy rebuilds its rows when next opened |
//! | `move.adopt.after_rename` (the adopted WAL in place, directory synced) | adopted; the next open raises the lease above every frame's epoch |

use std::sync::Arc;

use serde_json::{json, Value};

use super::archive::{self, ArchiveError, Header};
use super::export::moved_out_of;
use super::key::MoveKey;
use super::{authorize, exchange, not_idle, tree_of, MOVE_FENCE_MS};
use crate::lineage::reader::Reader;
use crate::lineage::LineageError;
use crate::ops::{Ops, Route};
use crate::owner::Owner;
use crate::record::{self, Record};
use crate::replay::{EpisodeStatus, Replay};
use crate::wal::{self, ScannedFrame};
use crate::wal::{Lease, LeaseError};
use crate::wire::{invalid_params, Refusal, RefusalCode};

/// How long an adopt waits for this process's own hold on the session's lease (a closing
/// actor) before it is refused busy.
const LEASE_WAIT_MS: u64 = 5_000;

pub fn adopt(ops: &Ops, route: &Route, name: &str) -> Result<Value, Refusal> {
    let shared = ops.registry.shared();
    let dir = exchange::of(&shared.root).map_err(|e| io_refusal("open the exchange directory", &e))?;
    let bytes = exchange::read_bounded(&dir.join(name), archive::MAX_ARCHIVE_BYTES)
        .map_err(|e| refused(&ArchiveError::Unreadable(e)))?;
    let seal_key = MoveKey::load_or_create(shared.root.path()).map_err(|e| io_refusal("read move.key", &e))?;
    let (header, wal_bytes) = archive::decode(&bytes, &seal_key).map_err(|e| refused(&e))?;
    drop(bytes);
    let key = &route.key;
    if header.addr != key.addr() {
        return Err(invalid_params("archive", "the archive holds another session than this route's"));
    }
    let placement = tree_of(&header.tree).ok_or_else(|| invalid("tree"))?;
    let wal_bytes: Arc<[u8]> = wal_bytes.into();
    let owner = check(&wal_bytes, &header, key.lineage_id())?;
    authorize(&route.caller, owner.as_ref(), super::ADOPT)?;
    // The session's actor here (reading a tombstoned copy, say) lets go of the lease first.
    ops.registry.close_idle(key);
    let lease_path = shared.root.lease_path(key);
    let mut lease = Lease::acquire_waiting_for_own(&lease_path, std::time::Duration::from_millis(LEASE_WAIT_MS))
        .map_err(|e| match e {
            LeaseError::Io { .. } => LineageError::from(e).refusal(),
            _ => not_idle(MOVE_FENCE_MS),
        })?;
    let dir = shared.root.wal_path_placed(key, placement).parent().map(std::path::Path::to_path_buf);
    // A folded copy here is compared like a live one: unfolded first, under this lease.
    crate::lineage::fold::unfold(shared, &key.addr(), true)
        .map_err(|e| io_refusal("unfold this host's copy", &std::io::Error::other(e.to_string())))?;
    let existing = shared.record_path(key);
    let target = existing.clone().unwrap_or_else(|| shared.root.wal_path_placed(key, placement));
    let staged = target.with_extension("wal.adopting");
    let _ = std::fs::remove_file(&staged);
    if let Some(path) = &existing {
        match compare(shared, key, path, &header, &wal_bytes) {
            Ok(Existing::Same) => return Ok(answer(&header, lease.epoch(), false)),
            Ok(Existing::Older) => {}
            Err(refusal) => return Err(refusal),
        }
    }
    write_synced(&staged, &wal_bytes).map_err(|e| io_refusal("stage the archive", &e))?;
    crate::failpoint!("move.adopt.after_stage");
    // The older copy's derived rows go before its WAL does: rows describing seqs the adopted
    // WAL numbers differently must never meet it (a crash here rebuilds them from the old WAL).
    shared.store.forget_lineage(&key.addr()).map_err(|e| LineageError::from(e).refusal())?;
    crate::failpoint!("move.adopt.after_forget");
    std::fs::rename(&staged, &target).map_err(|e| io_refusal("rename the adopted WAL", &e))?;
    if let Some(dir) = target.parent().map(std::path::Path::to_path_buf).or(dir) {
        wal::sync_dir(&dir).map_err(|e| LineageError::from(e).refusal())?;
    }
    crate::failpoint!("move.adopt.after_rename");
    if lease.epoch() <= header.epoch {
        lease.raise_to(header.epoch + 1).map_err(|e| io_refusal("raise the lease", &e))?;
    }
    let epoch = lease.epoch();
    drop(lease);
    // The cache clock another host kept does not travel: this host has sent nothing yet.
    ops.registry.cache_clocks().forget(&key.addr());
    // Rebuilds the derived rows now, so reads answer from them at once.
    if let Err(e) = ops.registry.open(key) {
        log::warn!("session {}: adopted, but its first open failed: {e}", header.addr);
    }
    log::info!("session {} adopted at epoch {epoch} ({} WAL bytes)", header.addr, header.wal_bytes);
    Ok(answer(&header, epoch, true))
}

fn refused(e: &ArchiveError) -> Refusal {
    Refusal::new(
        RefusalCode::ArchiveInvalid,
        e.to_string(),
        Some(crate::detail!("class" => "permanent", "field" => "archive", "reason" => e.reason())),
    )
}

fn answer(header: &Header, epoch: u64, adopted: bool) -> Value {
    json!({
        "session_ref": header.addr,
        "incarnation": header.incarnation,
        "epoch": epoch,
        "wal_bytes": header.wal_bytes,
        "adopted": adopted,
    })
}

/// What this host already holds of the session.
enum Existing {
    /// The very WAL the archive holds: adopted before.
    Same,
    /// A tombstoned copy the archive continues (this host exported it earlier).
    Older,
}

fn compare(
    shared: &crate::lineage::Shared,
    key: &crate::session_key::SessionKey,
    path: &std::path::Path,
    header: &Header,
    wal_bytes: &[u8],
) -> Result<Existing, Refusal> {
    let local = std::fs::read(path).map_err(|e| io_refusal("read this host's copy", &e))?;
    let reader = Reader::at(shared, key, path.to_path_buf());
    let tombstone = moved_out_of(&reader).map_err(|e| e.refusal())?;
    let exists = |why: &str| {
        Refusal::new(
            RefusalCode::SessionExists,
            format!("this host holds {why}: adopting the archive would fork the session"),
            Some(crate::detail!("class" => "permanent", "session_ref" => header.addr.as_str())),
        )
    };
    match tombstone {
        None if local == wal_bytes => Ok(Existing::Same),
        None => Err(exists("a live copy of the session")),
        Some(t) => {
            let continues = t.epoch < header.epoch
                && (t.wal_bytes as usize) <= wal_bytes.len()
                && archive::sha256_hex(&wal_bytes[..t.wal_bytes as usize]) == t.wal_sha256;
            if continues {
                Ok(Existing::Older)
            } else {
                Err(exists("a copy the archive does not continue (an older archive, or another lineage)"))
            }
        }
    }
}

/// Every frame of the archive's WAL read and replayed, in memory: the header names this session
/// and the archive's incarnation, the frames end exactly at `wal_bytes`, and the session is idle
/// and not itself moved out. Returns its recorded owner.
fn check(wal_bytes: &Arc<[u8]>, header: &Header, lineage: [u8; 16]) -> Result<Option<Owner>, Refusal> {
    let mut replay = Replay::default();
    let mut end = 0u64;
    let mut owner = None;
    let storage = wal::storage::InMemory(Arc::clone(wal_bytes));
    let mut visit = |f: ScannedFrame<'_>| -> Result<(), LineageError> {
        let rec = Record::decode(f.payload).map_err(|e| LineageError::Refused(e.0))?;
        if let (None, Record::RunStarted(r)) = (&owner, &rec) {
            owner = Some(r.owner.clone());
        }
        replay.apply(f.seq, &rec, &mut |_| {})?;
        end = f.offset + f.len;
        Ok(())
    };
    let read =
        wal::read_bounded(&storage, std::path::Path::new("archive"), record::KNOWN_FEATURES, None, None, &mut visit);
    let (wal_header, _) = read.map_err(|e| match e {
        LineageError::Wal(wal::WalError::NewerWriter { .. }) => e.refusal(),
        other => Refusal::new(
            RefusalCode::ArchiveInvalid,
            format!("the archive's WAL does not read back: {other}"),
            Some(crate::detail!("class" => "permanent", "field" => "archive", "reason" => "wal")),
        ),
    })?;
    if wal_header.lineage != lineage || wal_header.incarnation_string() != header.incarnation {
        return Err(invalid("wal header"));
    }
    if end != header.wal_bytes {
        return Err(invalid("wal frames"));
    }
    let running = replay.last.as_ref().is_some_and(|e| !matches!(e.status, EpisodeStatus::Finished { .. }));
    if running || !replay.queue.is_empty() || replay.moved_out.is_some() {
        return Err(invalid("session state"));
    }
    Ok(owner.flatten())
}

fn invalid(what: &str) -> Refusal {
    Refusal::new(
        RefusalCode::ArchiveInvalid,
        format!("the archive is not an idle session's WAL: {what}"),
        Some(crate::detail!("class" => "permanent", "field" => "archive", "reason" => "wal")),
    )
}

fn write_synced(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn io_refusal(what: &str, e: &std::io::Error) -> Refusal {
    Refusal::new(RefusalCode::OpenFailed, format!("cannot {what}: {e}"), Some(crate::detail!("class" => "transient")))
}
