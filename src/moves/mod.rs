//! Moving a session between hosts (DESIGN §8): `move.export` on the host that owns it,
//! `move.adopt` on the host that takes it, `move.locate` to ask a host where a session
//! stands. The CLI is `broca session export|import|locate`.
//!
//! Moves never take a caller's path and never trust an archive broca's hosts did not seal
//! (#44, docs/security.md): archives live in the exchange directory ([`exchange`]) under names
//! broca checks, each sealed with the move key the hosts share ([`key`]); the operator's CLI
//! copies them in and out. Who asks is decided first: a caller relayed from another machine,
//! or one the daemon did not attest, is refused before anything is read.
//!
//! A move has three states and every crash leaves exactly one of them:
//!
//! 1. **owned by the source**: its live WAL takes sends;
//! 2. **in transit**: the source's WAL ends in a durable `moved_out` tombstone (reads still
//!    served, every send refused `session_moved`); the archive (the WAL before the tombstone)
//!    is on disk, or is written again by repeating the export, which answers from the
//!    tombstone without writing anything else;
//! 3. **owned by the target**: the adopted WAL is renamed into place; its lease epoch starts
//!    above the archive's, so no frame it writes can be mistaken for the source's.
//!
//! The source writes the tombstone only when the session is idle (no run, nothing queued);
//! an export that finds it busy fences new sends for [`MOVE_FENCE_MS`] so it drains, and is
//! refused `session_busy` (transient): the CLI asks again. The adopter refuses an archive when
//! it already holds a live copy that differs, or a tombstone newer than the archive
//! (`session_exists`), so a stale or replayed archive never forks a session; adopting the same
//! archive twice answers as the first time.

mod adopt;
pub mod archive;
pub mod exchange;
mod export;
pub mod key;

pub use crate::actor::moving::{moving, not_idle, session_moved, tombstone, MOVE_FENCE_MS};
pub use adopt::adopt;
pub use export::export;

use serde_json::Value;

use crate::ops::{strict, Ops, Route};
use crate::owner::{self, Caller};
use crate::state_root::Placement;
use crate::wire::{invalid_params, Refusal, RefusalCode};

/// How long a move op waits for the session's actor.
pub const MOVE_WAIT_MS: u64 = 30_000;

/// The management ops this module serves (broca extensions outside the llm-runner role).
pub use crate::op::{MOVE_ADOPT as ADOPT, MOVE_EXPORT as EXPORT, MOVE_LOCATE as LOCATE, MOVE_OPS as OPS};

/// Serves one of [`OPS`] (blocking: call it from a worker). Authorization before params.
pub fn serve(ops: &Ops, route: &Route, method: &str, params: &Value) -> Result<Value, Refusal> {
    match method {
        EXPORT => {
            caller_may_move(&route.caller, EXPORT)?;
            no_path(params, "to")?;
            strict(params, &[])?;
            export(ops, route)
        }
        ADOPT => {
            caller_may_move(&route.caller, ADOPT)?;
            no_path(params, "from")?;
            strict(params, &["archive"])?;
            adopt(ops, route, &archive_param(params)?)
        }
        _ => {
            strict(params, &[])?;
            locate(ops, route)
        }
    }
}

/// `move.locate`: whether this host holds the session live, holds its tombstone (moved
/// out, with the epoch the move left at), or holds nothing of it. A read: any caller.
fn locate(ops: &Ops, route: &Route) -> Result<Value, Refusal> {
    where_is(ops.registry.shared(), &route.key)
}

/// Where this host holds the session: `{state: "live" | "folded" | "moved" | "absent", session_ref,
/// tree?, epoch?}` (`move.locate`, and `broca session ROOT HARNESS SESSION`).
pub fn where_is(shared: &crate::lineage::Shared, key: &crate::session_key::SessionKey) -> Result<Value, Refusal> {
    if !shared.root.wal_path(key).exists() {
        // Folded: say so without unfolding it (a read would).
        if let Some((path, _)) = crate::lineage::fold::container_of(shared, &key.addr()) {
            let tree = path.parent().and_then(|d| d.file_name()).map(|d| d.to_string_lossy().into_owned());
            return Ok(serde_json::json!({"state": "folded", "session_ref": key.addr(), "tree": tree}));
        }
    }
    let Some(reader) = crate::lineage::reader::Reader::open(shared, key) else {
        return Ok(serde_json::json!({"state": "absent", "session_ref": key.addr()}));
    };
    let moved = export::moved_out_of(&reader).map_err(|e| e.refusal())?;
    let tree = shared.root.placement_of(key).map(Placement::dir_name);
    Ok(match moved {
        Some(t) => serde_json::json!({"state": "moved", "session_ref": key.addr(), "epoch": t.epoch, "tree": tree}),
        None => serde_json::json!({"state": "live", "session_ref": key.addr(), "tree": tree}),
    })
}

/// A move is an operator's act on its own host: refused to a caller relayed from another
/// machine, admitted to the host's key-holder (`direct`) and to the session's owner.
fn authorize(caller: &Caller, owner: Option<&owner::Owner>, method: &str) -> Result<(), Refusal> {
    if caller.via.is_none() && (caller.principal == owner::DIRECT || owner.is_some_and(|o| o.admits(caller))) {
        return Ok(());
    }
    Err(not_authorized(caller, method))
}

/// The part of [`authorize`] decided before anything is read: the caller is on this host and
/// is its key-holder or a module the daemon attested.
fn caller_may_move(caller: &Caller, method: &str) -> Result<(), Refusal> {
    if caller.via.is_none() && (caller.principal == owner::DIRECT || caller.attested().is_some()) {
        return Ok(());
    }
    Err(not_authorized(caller, method))
}

fn not_authorized(caller: &Caller, method: &str) -> Refusal {
    let message = format!(
        "{method} is an operator's act on this host: only its key-holder or the session's owner may call it; this route's caller is {}",
        crate::wire::loggable(&caller.principal)
    );
    Refusal::new(RefusalCode::NotAuthorized, message, Some(crate::detail!("principal" => caller.principal)))
}

/// The member a move once took a path in: refused by name, saying where archives live now.
fn no_path(params: &Value, field: &str) -> Result<(), Refusal> {
    match params.get(field) {
        Some(_) => Err(invalid_params(
            field,
            "moves take no paths: archives live in broca's exchange directory; `broca session export|import` copies them out and in",
        )),
        None => Ok(()),
    }
}

/// `archive`: the name of a file in the exchange directory.
fn archive_param(params: &Value) -> Result<String, Refusal> {
    let name = params
        .get("archive")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_params("archive", "required, an archive's file name"))?;
    exchange::check_name(name).map_err(|why| invalid_params("archive", why))?;
    Ok(name.to_owned())
}

/// The tree name an archive records for a placement, and back.
fn tree_of(name: &str) -> Option<Placement> {
    [Placement::Standard, Placement::Durable, Placement::Ephemeral].into_iter().find(|p| p.dir_name() == name)
}
