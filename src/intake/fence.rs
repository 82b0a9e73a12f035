//! What held calls ask of retention (spec §19 "For a retention session…", checklist H-30…H-37):
//! when a retained session's record may be deleted, and what its deletion takes from the
//! intake store.
//!
//! Q4.10, as this build reads the spec: "Retention separately blocks deletion while a decoded
//! held record or an intake registration remains" and "Deletion removes the lineage's
//! registrations and receipts" act at two moments. The first is a guard on *starting* a
//! deletion: no tombstone is written while the session's WAL shows a held call without its
//! result, or the intake still registers a call of its lineage (a registration lives until its
//! call's terminal and batch commit are durable, H-24, so one that remains is a call the intake
//! may still route into the session). The second says what a deletion, once its tombstone is
//! durable, takes with it: every intake row keyed by the lineage (receipts always remain after
//! delivered results; a registration can remain only where this guard was not in force: a
//! deletion a crash interrupted, rows an older build left, a store rebuilt meanwhile). The
//! module feed rows (cursor, owed ack) are shared and stay, so a later entry for the deleted
//! lineage finds no registration and is acked as a no-op. Deletion sends no `tool.withdraw`.
//!
//! Whether held intake was ever used on the state root decides whether the store must be
//! consulted at all (H-36): a root without the registered marker, the rebuild marker, a WAL
//! feature floor naming `provider-held/v1` or a store expires as it always did, and nothing
//! here creates a file.

use std::path::Path;

use super::{Holding, REBUILD_MARKER, REGISTERED_MARKER};

/// Why retention may not start deleting a session now. Each keeps the session's record (its
/// reads answer `expired` all the same); only [`Fence::RebuildRequired`] is permanent on this
/// runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fence {
    /// The session's WAL shows a held call without its result (H-33).
    HeldOpen,
    /// The intake store still registers a call of the session (H-33).
    Registered,
    /// `late-results.db` is missing though held intake was used on this root (H-34).
    StoreMissing,
    /// `late-results.db` cannot be read (H-34); counted in retention's unreadable-session total.
    StoreUnreadable(String),
    /// `late-results-rebuild-required` is set: a recreated store cannot be proven complete, and
    /// this runtime never clears the marker (H-37).
    RebuildRequired,
}

impl Fence {
    /// The fence's stable name (logs, refusal details).
    pub fn code(&self) -> &'static str {
        match self {
            Fence::HeldOpen => "held_call_open",
            Fence::Registered => "held_call_registered",
            Fence::StoreMissing => "late_results_missing",
            Fence::StoreUnreadable(_) => "late_results_unreadable",
            Fence::RebuildRequired => "late_results_rebuild_required",
        }
    }

    /// Whether only an operator (or a later capability) can lift it.
    pub fn permanent(&self) -> bool {
        matches!(self, Fence::RebuildRequired)
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fence::HeldOpen => f.write_str("a held call of the session has no result yet"),
            Fence::Registered => f.write_str("the held-call intake still registers a call of the session"),
            Fence::StoreMissing => f.write_str("late-results.db is missing on a state root that used held intake"),
            Fence::StoreUnreadable(why) => write!(f, "late-results.db is unreadable: {why}"),
            Fence::RebuildRequired => {
                f.write_str("late-results-rebuild-required is set: the recreated intake cannot be proven complete")
            }
        }
    }
}

/// Whether the session may be deleted as far as held calls go: checked under the session's
/// lease, before its tombstone. `held_open`: its decoded WAL shows a held call without a
/// result; `held_floor`: the state root's WAL feature floor names `provider-held/v1`.
pub fn check(root: &Path, lineage: &str, held_open: bool, held_floor: bool) -> Result<(), Fence> {
    if held_open {
        return Err(Fence::HeldOpen);
    }
    if root.join(REBUILD_MARKER).exists() {
        return Err(Fence::RebuildRequired);
    }
    match super::holding(root, lineage) {
        Holding::NoStore if root.join(REGISTERED_MARKER).exists() || held_floor => Err(Fence::StoreMissing),
        // A root that never enabled held intake (H-36).
        Holding::NoStore | Holding::Registrations(0) => Ok(()),
        Holding::Registrations(_) => Err(Fence::Registered),
        Holding::Unreadable(why) => Err(Fence::StoreUnreadable(why)),
    }
}

/// What a deletion takes from the intake, once its tombstone is durable: the lineage's
/// registrations and receipts (never a module's feed row). Nothing when there is no store.
pub fn forget(root: &Path, lineage: &str) -> Result<(), super::IntakeError> {
    super::forget_lineage_at(root, lineage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intake::{Intake, Registration};
    use crate::session_key::SessionKey;

    #[test]
    fn the_guard_follows_the_root_s_held_history_and_the_lineage_s_rows() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let key = SessionKey::new("/p", "h", "s");
        let lineage = key.addr();
        // H-36: a root that never enabled held intake is not fenced, and nothing is created.
        assert_eq!(check(root, &lineage, false, false), Ok(()));
        assert_eq!(check(root, &lineage, true, false), Err(Fence::HeldOpen));
        assert_eq!(check(root, &lineage, false, true), Err(Fence::StoreMissing));
        assert!(!root.join(crate::intake::FILE).exists());
        let store = Intake::open(root, false).unwrap();
        assert_eq!(check(root, &lineage, false, false), Ok(()), "a readable store without rows");
        let reg = Registration {
            call_key: format!("{lineage}:4"),
            key: key.clone(),
            run_id: "run-1".into(),
            tool_call_id: "c1".into(),
            module: "tools".into(),
        };
        store.register(std::slice::from_ref(&reg), 1).unwrap();
        assert_eq!(check(root, &lineage, false, false), Err(Fence::Registered));
        assert_eq!(check(root, "another", false, false), Ok(()), "only the lineage's own rows fence it");
        store.prune(std::slice::from_ref(&reg.call_key)).unwrap();
        assert_eq!(check(root, &lineage, false, false), Ok(()));
        drop(store);
        // H-34: the store lost after a registration.
        std::fs::remove_file(root.join(crate::intake::FILE)).unwrap();
        assert_eq!(check(root, &lineage, false, false), Err(Fence::StoreMissing));
        std::fs::write(root.join(crate::intake::FILE), b"garbage, not an sqlite database file").unwrap();
        assert!(matches!(check(root, &lineage, false, false), Err(Fence::StoreUnreadable(_))));
        // H-37: the rebuild marker fences whatever the store says.
        std::fs::remove_file(root.join(crate::intake::FILE)).unwrap();
        Intake::open(root, false).unwrap();
        assert!(root.join(REBUILD_MARKER).exists());
        assert_eq!(check(root, &lineage, false, false), Err(Fence::RebuildRequired));
        assert!(Fence::RebuildRequired.permanent() && !Fence::Registered.permanent());
    }
}
