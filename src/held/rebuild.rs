//! The intake store's boot work (spec §19 "At boot…"), on the held-call boot thread, off the
//! startup path and before any puller starts, so no entry is delivered or acked against a
//! partial intake:
//!
//! - [`from_wals`] (H-27, H-28): a recreated `late-results.db` is registered again by scanning
//!   the live WAL trees (`wal/`, `wal-durable/`, `wal-ephemeral/`) frame by frame, decoding the
//!   records only of a WAL holding a frame that requires `provider-held/v1`; each call such a
//!   WAL shows held and unanswered is registered again. Sessions are found in the WALs, never
//!   listed from `run-index.db` (a projection that may be lost or behind as well). A held record
//!   names its session's bind triple, which the WAL header does not (it holds the lineage's
//!   hash); one written before records did is named by the run index's row of its lineage, or
//!   not at all (logged). A state root whose WAL feature floor never named `provider-held/v1`
//!   holds no such frame: its rebuild reads no WAL. The rebuild marker stays set (spec: this
//!   runtime cannot durably verify that the scan was complete).
//! - [`prune_tombstoned`] (H-25): the intake rows of lineages retention deleted go, without
//!   opening an actor for them.
//!
//! WALs are read without their lease, as the retention sweep reads them: a torn tail is not
//! durable and is ignored. A WAL whose deletion its tombstone already names is no live session.

use std::path::Path;

use crate::held::intake::{Intake, Registration};
use crate::lineage::Shared;
use crate::record::{Record, FEATURE_PROVIDER_HELD, KNOWN_FEATURES};
use crate::replay::Replay;
use crate::state_root::Placement;
use crate::wal::{self, ScannedFrame, WalError};

/// Whether the registered call still waits for a result in its session's WAL: its batch is open
/// and it has no result. `false` once it has one (or its session is gone): its registration
/// can go. `None` when the WAL cannot be read now.
pub fn still_waiting(shared: &Shared, reg: &Registration) -> Option<bool> {
    let page = crate::lineage::read::snapshot(shared, &reg.key).ok()?;
    let Some(page) = page else { return Some(false) };
    let open = page
        .state
        .last
        .as_ref()
        .is_some_and(|e| e.batch.iter().any(|c| c.call_key == reg.call_key && c.result.is_none()));
    Some(open)
}

/// What one rebuild did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Live WAL files found.
    pub wals: usize,
    /// Of those, the ones holding a `provider-held/v1` frame: the only ones decoded.
    pub decoded: usize,
    /// Held, unanswered calls registered again.
    pub registered: usize,
    /// Held, unanswered calls whose session could not be named (nothing registered for them).
    pub unnamed: usize,
    /// WALs that could not be read.
    pub unreadable: usize,
}

/// Registers again every held, unanswered call the live WALs show ([module docs](self)).
pub fn from_wals(shared: &Shared, intake: &Intake) -> Rebuilt {
    let mut out = Rebuilt::default();
    if !shared.floor.features().iter().any(|f| f == FEATURE_PROVIDER_HELD) {
        log::info!("held calls: the WAL feature floor never named {FEATURE_PROVIDER_HELD}: the rebuild reads no WAL");
        return out;
    }
    for tree in Placement::LOOKUP_ORDER {
        let Ok(entries) = std::fs::read_dir(shared.root.path().join(tree.dir_name())) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(addr) = name.to_str().and_then(|n| n.strip_suffix(".wal")) else { continue };
            out.wals += 1;
            let calls = match held_calls_of(shared, addr, &entry.path()) {
                Ok(Some(calls)) => calls,
                Ok(None) => continue,
                Err(e) => {
                    log::warn!("held calls: the intake rebuild cannot read session {addr}: {e}");
                    out.unreadable += 1;
                    continue;
                }
            };
            out.decoded += 1;
            let mut rows = Vec::with_capacity(calls.len());
            for held in calls {
                let named = held.session.as_ref().map(|s| s.key()).filter(|k| k.addr() == addr);
                let Some(key) = named.or_else(|| shared.store.key_of(addr).ok().flatten()) else {
                    log::warn!("held calls: the intake rebuild cannot name the session of held call {}", held.call_key);
                    out.unnamed += 1;
                    continue;
                };
                rows.push(Registration {
                    call_key: held.call_key,
                    key,
                    run_id: held.run_id,
                    tool_call_id: held.tool_call_id,
                    module: held.provider,
                });
            }
            match intake.register(&rows, 0) {
                Ok(()) => out.registered += rows.len(),
                Err(e) => log::warn!("held calls: the intake rebuild cannot register session {addr}: {e}"),
            }
        }
    }
    log::info!(
        "held calls: the intake was rebuilt from the live WALs: {} WAL(s), {} holding a provider-held frame \
         (decoded), {} held call(s) registered, {} unnamed, {} unreadable",
        out.wals,
        out.decoded,
        out.registered,
        out.unnamed,
        out.unreadable
    );
    out
}

/// Why the first pass over a WAL stopped early.
enum Stop {
    /// A frame requiring `provider-held/v1`: the WAL is decoded.
    Held,
    /// The WAL does not read.
    Bad(String),
}

impl From<WalError> for Stop {
    fn from(e: WalError) -> Self {
        Stop::Bad(e.to_string())
    }
}

/// The held, unanswered calls of the WAL at `path`, or `None` when it holds no held frame (its
/// records are then never decoded) or is a deletion its tombstone names.
fn held_calls_of(
    shared: &Shared,
    addr: &str,
    path: &Path,
) -> Result<Option<Vec<crate::record::ToolCallProviderHeld>>, String> {
    let storage = shared.storage.as_ref();
    let header = wal::read_header_of(storage, path, KNOWN_FEATURES).map_err(|e| e.to_string())?;
    let tombstone = crate::retention::tombstone(&shared.root, addr);
    if tombstone.is_some_and(|t| t.incarnation == header.incarnation_string()) {
        return Ok(None);
    }
    let mut find =
        |f: ScannedFrame<'_>| if f.features.contains(&FEATURE_PROVIDER_HELD) { Err(Stop::Held) } else { Ok(()) };
    match wal::read_bounded(storage, path, KNOWN_FEATURES, None, None, &mut find) {
        Ok(_) => return Ok(None),
        Err(Stop::Held) => {}
        Err(Stop::Bad(e)) => return Err(e),
    }
    let mut replay = Replay::default();
    let mut visit = |f: ScannedFrame<'_>| -> Result<(), Bad> {
        let record = Record::decode(f.payload).map_err(|e| Bad(e.0))?;
        replay.apply(f.seq, &record, &mut |_| {}).map_err(|e| Bad(e.to_string()))
    };
    wal::read_bounded(storage, path, KNOWN_FEATURES, None, None, &mut visit).map_err(|Bad(e)| e)?;
    Ok(Some(replay.held_calls().into_iter().cloned().collect()))
}

/// A WAL or a record of it that does not read (the decoding pass).
struct Bad(String);

impl From<WalError> for Bad {
    fn from(e: WalError) -> Self {
        Bad(e.to_string())
    }
}

/// Drops the intake rows (registrations and receipts) of every lineage retention deleted: its
/// tombstone exists and no record started after the expiry holds its address. Opens no actor.
/// Returns how many lineages were pruned.
pub fn prune_tombstoned(shared: &Shared, intake: &Intake) -> usize {
    let lineages = match intake.lineages() {
        Ok(l) => l,
        Err(e) => {
            log::warn!("held calls: cannot list the intake's lineages: {e}");
            return 0;
        }
    };
    let mut pruned = 0;
    for lineage in lineages {
        // Rows name lineages by address; anything else is not a file name to build.
        if lineage.len() != 32 || !lineage.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Some(tombstone) = crate::retention::tombstone(&shared.root, &lineage) else { continue };
        if record_after(shared, &lineage, &tombstone.incarnation) {
            continue;
        }
        match intake.forget_lineage(&lineage) {
            Ok(()) => pruned += 1,
            Err(e) => log::warn!("held calls: cannot prune tombstoned lineage {lineage} from the intake: {e}"),
        }
    }
    if pruned > 0 {
        log::info!("held calls: pruned {pruned} tombstoned lineage(s) from the intake");
    }
    pruned
}

/// Whether a record of `addr` other than the expired one (`incarnation`) exists: a live WAL of
/// another incarnation, or a folded one (a retained record is never folded). A WAL whose header
/// does not read counts as one (its rows are kept).
fn record_after(shared: &Shared, addr: &str, incarnation: &str) -> bool {
    let live = Placement::LOOKUP_ORDER.iter().any(|tree| {
        let path = shared.root.path().join(tree.dir_name()).join(format!("{addr}.wal"));
        path.exists()
            && wal::read_header_of(shared.storage.as_ref(), &path, KNOWN_FEATURES)
                .map_or(true, |h| h.incarnation_string() != incarnation)
    });
    live || crate::lineage::fold::container_of(shared, addr).is_some()
}
