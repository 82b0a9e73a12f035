//! `session.export {to}`: tombstone the session on this host (its actor, between runs), then
//! write the archive of everything before the tombstone to `to`.

use std::time::Duration;

use serde_json::{json, Value};

use super::archive::{self, Header};
use super::{authorize, MOVE_WAIT_MS};
use crate::actor::moving::{not_idle, open_failed, read_prefix, MOVE_FENCE_MS};
use crate::actor::{Answer, SessionCommand};
use crate::lineage::reader::{Reader, Sink, Start};
use crate::lineage::LineageError;
use crate::ops::{Ops, Route};
use crate::record::MovedOut;
use crate::state_root::Placement;
use crate::wire::{Refusal, RefusalCode};

/// The op: checks the caller, has the actor tombstone the session, writes the archive.
pub fn export(ops: &Ops, route: &Route, to: &std::path::Path) -> Result<Value, Refusal> {
    let shared = ops.registry.shared();
    let key = &route.key;
    let Some(reader) = Reader::open(shared, key) else {
        return Err(not_found(&key.addr()));
    };
    let first = crate::ops::first_run_started(&reader).map_err(|e| e.refusal())?;
    authorize(&route.caller, first.as_ref().and_then(|r| r.owner.as_ref()), super::EXPORT)?;
    if !to.parent().is_some_and(std::path::Path::is_dir) {
        return Err(crate::wire::invalid_params("to", "its directory must exist"));
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
    let bytes = archive::encode(&header, &wal);
    archive::write_atomic(to, &bytes, || crate::failpoint!("move.export.before_rename")).map_err(|e| {
        Refusal::new(
            RefusalCode::OpenFailed,
            format!("cannot write the archive: {e}"),
            Some(crate::detail!("class" => "transient", "field" => "to")),
        )
    })?;
    log::info!("session {} exported (epoch {}, {} WAL bytes)", header.addr, header.epoch, header.wal_bytes);
    Ok(json!({
        "session_ref": header.addr,
        "incarnation": header.incarnation,
        "epoch": header.epoch,
        "wal_bytes": header.wal_bytes,
        "wal_sha256": header.wal_sha256,
        "archive_bytes": bytes.len(),
    }))
}

/// The session's tombstone, if its WAL ends in one.
pub(super) fn moved_out_of(reader: &Reader) -> Result<Option<MovedOut>, LineageError> {
    struct Nothing;
    impl Sink for Nothing {}
    Ok(reader.scan(Start::Checkpoint { before: None }, &mut Nothing)?.replay.moved_out)
}

pub(super) fn not_found(addr: &str) -> Refusal {
    Refusal::new(
        RefusalCode::SessionNotFound,
        "this host holds no record of the session",
        Some(crate::detail!("class" => "permanent", "session_ref" => addr)),
    )
}
