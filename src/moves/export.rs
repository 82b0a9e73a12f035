//! `move.export {}`: tombstone the session on this host (its actor, between runs), then
//! write the archive of everything before the tombstone, sealed with the move key, into the
//! exchange directory under a name broca chooses (`<addr>.e<epoch>.archive`). Every check (who
//! asks, the exchange directory, the key, the session's size) comes before the tombstone.

use std::time::Duration;

use serde_json::{json, Value};

use super::archive::{self, Header};
use super::key::MoveKey;
use super::{authorize, exchange, MOVE_WAIT_MS};
use crate::actor::moving::{not_idle, open_failed, read_prefix, MOVE_FENCE_MS};
use crate::actor::{Answer, SessionCommand};
use crate::lineage::reader::{Reader, Sink, Start};
use crate::lineage::LineageError;
use crate::ops::{Ops, Route};
use crate::record::MovedOut;
use crate::state_root::Placement;
use crate::wire::{Refusal, RefusalCode};

/// The op: checks the caller, has the actor tombstone the session, writes the archive.
pub fn export(ops: &Ops, route: &Route) -> Result<Value, Refusal> {
    super::caller_may_move(&route.caller, super::EXPORT)?;
    let shared = ops.registry.shared();
    let key = &route.key;
    let Some(reader) = Reader::open(shared, key) else {
        return Err(not_found(&key.addr()));
    };
    let first = crate::ops::first_run_started(&reader).map_err(|e| e.refusal())?;
    authorize(&route.caller, first.as_ref().and_then(|r| r.owner.as_ref()), super::EXPORT)?;
    let dir = exchange::of(&shared.root).map_err(|e| exchange_refusal("open the exchange directory", &e))?;
    let seal_key = MoveKey::load_or_create(shared.root.path()).map_err(|e| exchange_refusal("read move.key", &e))?;
    // The name the archive will take is checked before the tombstone: a file there that an
    // earlier export of this session did not write (planted, say) refuses the export while the
    // session still takes sends. (The write after the tombstone never replaces a file either.)
    let (last_epoch, moved) = epoch_and_tombstone(&reader).map_err(|e| e.refusal())?;
    let planned = dir.join(exchange::export_name(&key.addr(), last_epoch));
    if moved.is_none() && std::fs::symlink_metadata(&planned).is_ok() {
        let taken = std::io::Error::other(format!(
            "{} exists in the exchange directory and is not this export's archive",
            exchange::export_name(&key.addr(), last_epoch)
        ));
        return Err(exchange_refusal("write the archive", &taken));
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let answer = Answer::new(move |r: Result<MovedOut, Refusal>| {
        let _ = tx.send(r);
    });
    let cmd = SessionCommand::Export { answer: answer.clone() };
    if let Err(e) = ops.registry.command(key, Placement::Standard, cmd) {
        answer.send(Err(e.refusal()));
    }
    drop(answer);
    let tombstone = rx.recv_timeout(Duration::from_millis(MOVE_WAIT_MS)).map_err(|_| not_idle(MOVE_FENCE_MS))??;
    crate::failpoint!("move.export.after_tombstone");
    // The prompt cache's clock stays with this host's last request: the session's next request
    // is another host's (#44).
    ops.registry.cache_clocks().forget(&key.addr());
    let path = shared.root.wal_path(key);
    let wal = read_prefix(&path, tombstone.wal_bytes).map_err(|e| open_failed(&e))?;
    if archive::sha256_hex(&wal) != tombstone.wal_sha256 {
        return Err(open_failed(&std::io::Error::other("the WAL before the tombstone changed")));
    }
    let incarnation = crate::wal::read_header_of(shared.storage.as_ref(), &path, crate::record::KNOWN_FEATURES)
        .map_err(|e| LineageError::from(e).refusal())?
        .incarnation_string();
    let header = Header {
        addr: key.addr(),
        project_root: key.project_root.clone(),
        harness: key.harness.clone(),
        session: key.session.clone(),
        incarnation,
        epoch: tombstone.epoch,
        tree: shared.root.placement_of(key).unwrap_or_default().dir_name().to_owned(),
        wal_bytes: tombstone.wal_bytes,
        wal_sha256: tombstone.wal_sha256.clone(),
        exported_at_ms: tombstone.at_ms,
        source_machine: route.caller.machine.clone(),
    };
    let name = exchange::export_name(&header.addr, header.epoch);
    let bytes = archive::encode(&header, &wal, &seal_key);
    let archive_bytes = match exchange::create_new(&dir, &name, &bytes, || {
        crate::failpoint!("move.export.before_rename")
    }) {
        Ok(()) => bytes.len() as u64,
        // A repeated export of the same tombstone: the archive an earlier one wrote stands, if
        // it holds this very WAL; any other file of that name is never replaced.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => earlier_archive(&dir, &name, &header, &seal_key)?,
        Err(e) => return Err(exchange_refusal("write the archive", &e)),
    };
    log::info!("session {} exported (epoch {}, {} WAL bytes)", header.addr, header.epoch, header.wal_bytes);
    Ok(json!({
        "session_ref": header.addr,
        "incarnation": header.incarnation,
        "epoch": header.epoch,
        "wal_bytes": header.wal_bytes,
        "wal_sha256": header.wal_sha256,
        "archive": name,
        "archive_bytes": archive_bytes,
    }))
}

/// The size of the archive an earlier export of the same tombstone left at `name`, when it is
/// this session's archive of the same WAL bytes.
fn earlier_archive(dir: &std::path::Path, name: &str, header: &Header, key: &MoveKey) -> Result<u64, Refusal> {
    let bytes = exchange::read_bounded(&dir.join(name), archive::MAX_ARCHIVE_BYTES)
        .map_err(|e| exchange_refusal("read the earlier archive", &std::io::Error::other(e.to_string())))?;
    match archive::decode(&bytes, key) {
        Ok((earlier, _)) if earlier.addr == header.addr && earlier.wal_sha256 == header.wal_sha256 => {
            Ok(bytes.len() as u64)
        }
        _ => Err(exchange_refusal(
            "write the archive",
            &std::io::Error::other(format!("{name} exists in the exchange directory and is not this export's archive")),
        )),
    }
}

fn exchange_refusal(what: &str, e: &std::io::Error) -> Refusal {
    Refusal::new(RefusalCode::OpenFailed, format!("cannot {what}: {e}"), Some(crate::detail!("class" => "transient")))
}

/// The session's tombstone, if its WAL ends in one.
pub(super) fn moved_out_of(reader: &Reader) -> Result<Option<MovedOut>, LineageError> {
    Ok(epoch_and_tombstone(reader)?.1)
}

/// The lease epoch of the session's last record (a tombstone written now carries it) and its
/// tombstone, if its WAL ends in one.
fn epoch_and_tombstone(reader: &Reader) -> Result<(u64, Option<MovedOut>), LineageError> {
    struct Nothing;
    impl Sink for Nothing {}
    let replay = reader.scan(Start::Checkpoint { before: None }, &mut Nothing)?.replay;
    Ok((replay.last_epoch, replay.moved_out))
}

pub(super) fn not_found(addr: &str) -> Refusal {
    Refusal::new(
        RefusalCode::SessionNotFound,
        "this host holds no record of the session",
        Some(crate::detail!("class" => "permanent", "session_ref" => addr)),
    )
}
