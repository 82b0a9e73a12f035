//! The held-call intake's boot work in-process (spec §19 "At boot…", `src/held/rebuild.rs`), on
//! real WALs written through the lineage layer and a real `late-results.db`:
//! - the rebuild of a recreated store finds sessions by scanning the live WAL trees, decodes
//!   only the WALs holding a `provider-held/v1` frame, registers each held, unanswered call under
//!   the session its held record names, and needs no `run-index.db` (H-27);
//! - a root whose WAL feature floor never named `provider-held/v1` has no WAL read (H-28);
//! - tombstoned lineages are pruned from the intake at boot, a record started after the expiry
//!   keeps its rows (H-25).
//!
//! The same boot through the real daemon (a held run resumed after both databases were lost,
//! a tombstoned lineage pruned without an actor opening) is in `e2e_held`.

use std::fs;
use std::path::Path;

use broca::held::intake::{Intake, Registration};
use broca::held::rebuild::{self, Rebuilt};
use broca::lineage::{Lineage, Shared};
use broca::record::{HeldSession, Record, ToolCallProviderHeld, KNOWN_FEATURES};
use broca::session_key::SessionKey;
use broca::state_root::{Placement, StateRoot};
use broca_testkit::*;
use cortexkit_role_tool_provider::late_results::IntakeKey;

const TOOLS: &str = "mock-tools";

fn shared(dir: &Path) -> Shared {
    Shared::open(StateRoot::at(dir).unwrap()).unwrap()
}

fn session(name: &str) -> SessionKey {
    SessionKey::new("/work/proj", "held-test", name)
}

fn append(l: &mut Lineage, records: &[Record]) {
    for rec in records {
        l.append(rec).unwrap();
        l.commit().unwrap();
    }
}

/// A run of `key` whose one call (`c1`, key `<run_id>:c1`) its provider holds; answered when
/// `answer` is given. `named`: the held record names its session (older records did not).
fn held_run(l: &mut Lineage, key: &SessionKey, run_id: &str, named: bool, answer: Option<&str>) {
    let held = ToolCallProviderHeld {
        run_id: run_id.into(),
        step: 1,
        tool_call_id: "c1".into(),
        call_key: format!("{run_id}:c1"),
        tool: "approve".into(),
        provider: TOOLS.into(),
        reason: "consent".into(),
        held_at_ms: 1_700_000_000_100,
        session: named.then(|| HeldSession::of(key)),
    };
    append(
        l,
        &[
            run_started(run_id, None, "approve this"),
            step_started(run_id, 1),
            model_step(run_id, 1, "asking", &[("c1", "approve")]),
            intent(run_id, 1, "c1", "approve"),
            Record::ToolCallProviderHeld(Box::new(held)),
        ],
    );
    if let Some(text) = answer {
        append(l, &[tool_result(run_id, 1, "c1", text), step_started(run_id, 2), model_step(run_id, 2, "ok", &[])]);
        l.finish_run(run_id, broca::record::FinishReason::Completed, None, vec![]).unwrap();
        l.commit().unwrap();
    }
}

/// A finished run with an ordinary tool call: no held frame.
fn plain_run(l: &mut Lineage, run_id: &str) {
    append(
        l,
        &[
            run_started(run_id, None, "hello"),
            step_started(run_id, 1),
            model_step(run_id, 1, "reading", &[("c1", "read")]),
            intent(run_id, 1, "c1", "read"),
            tool_result(run_id, 1, "c1", "file text"),
        ],
    );
    l.finish_run(run_id, broca::record::FinishReason::Completed, None, vec![]).unwrap();
    l.commit().unwrap();
}

fn incarnation(path: &Path) -> String {
    broca::wal::read_header_of(&broca::wal::FileStorage, path, KNOWN_FEATURES).unwrap().incarnation_string()
}

/// Writes the tombstone retention writes for an expired record of `addr` (`incarnation`).
fn tombstone(root: &Path, addr: &str, incarnation: &str) {
    let dir = root.join("wal-ephemeral");
    fs::create_dir_all(&dir).unwrap();
    let body = serde_json::json!({"expired_at_ms": 1_700_000_001_000u64, "incarnation": incarnation, "generation": 1});
    fs::write(dir.join(format!("{addr}.tombstone")), body.to_string()).unwrap();
}

fn remove_db(root: &Path, name: &str) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = fs::remove_file(root.join(format!("{name}{suffix}")));
    }
}

#[test]
fn the_rebuild_finds_held_calls_by_scanning_the_live_wals_and_needs_no_run_index() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (plain, waiting, answered, expired, older) =
        (session("plain"), session("waiting"), session("answered"), session("expired"), session("older"));
    {
        let shared = shared(root);
        plain_run(&mut shared.open_lineage(&plain).unwrap(), "run-plain");
        held_run(&mut shared.open_lineage_placed(&waiting, Placement::Durable).unwrap(), &waiting, "run-w", true, None);
        held_run(&mut shared.open_lineage(&answered).unwrap(), &answered, "run-a", true, Some("approved"));
        let mut l = shared.open_lineage_placed(&expired, Placement::Ephemeral).unwrap();
        held_run(&mut l, &expired, "run-e", true, Some("approved"));
        drop(l);
        held_run(&mut shared.open_lineage(&older).unwrap(), &older, "run-o", false, None);
        shared.settle();
    }
    // A deletion retention began: its tombstone names the WAL, which is no live session.
    let expired_wal = root.join("wal-ephemeral").join(format!("{}.wal", expired.addr()));
    tombstone(root, &expired.addr(), &incarnation(&expired_wal));

    // With the run index: the older record's session is named by its row.
    let shared = shared(root);
    let intake = Intake::open(root, false).unwrap();
    let rebuilt = rebuild::from_wals(&shared, &intake);
    assert_eq!(rebuilt, Rebuilt { wals: 5, decoded: 3, registered: 2, unnamed: 0, unreadable: 0 });
    let reg = |key: &SessionKey, run_id: &str| Registration {
        call_key: format!("{run_id}:c1"),
        key: key.clone(),
        run_id: run_id.into(),
        tool_call_id: "c1".into(),
        module: TOOLS.into(),
    };
    let mut rows = intake.registrations().unwrap();
    rows.sort_by(|a, b| a.call_key.cmp(&b.call_key));
    assert_eq!(rows, vec![reg(&older, "run-o"), reg(&waiting, "run-w")]);
    drop((intake, shared));

    // Both projections lost: the WALs alone still name the waiting call's session; the older
    // record cannot be named and is counted, never registered under a wrong session.
    remove_db(root, "late-results.db");
    remove_db(root, "run-index.db");
    let shared = self::shared(root);
    let intake = Intake::open(root, true).unwrap();
    assert!(intake.needs_rebuild(), "a held feature floor is held history");
    let rebuilt = rebuild::from_wals(&shared, &intake);
    assert_eq!(rebuilt, Rebuilt { wals: 5, decoded: 3, registered: 1, unnamed: 1, unreadable: 0 });
    assert_eq!(intake.registrations().unwrap(), vec![reg(&waiting, "run-w")]);
}

#[test]
fn a_root_whose_floor_never_named_provider_held_has_no_wal_read_by_the_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let shared = shared(root);
    plain_run(&mut shared.open_lineage(&session("plain")).unwrap(), "run-plain");
    // A file in a live tree that no reader could decode: a rebuild that read it would count it.
    fs::write(root.join("wal").join(format!("{}.wal", session("junk").addr())), b"not a wal").unwrap();
    assert!(!shared.floor.features().iter().any(|f| f == "provider-held/v1"));
    let intake = Intake::open(root, false).unwrap();
    assert_eq!(rebuild::from_wals(&shared, &intake), Rebuilt::default());
    // The same root once a held frame was written: every live WAL is looked at.
    shared.floor.raise(&["provider-held/v1"]).unwrap();
    let rebuilt = rebuild::from_wals(&shared, &intake);
    assert_eq!((rebuilt.wals, rebuilt.decoded, rebuilt.unreadable), (2, 0, 1));
}

#[test]
fn boot_prunes_tombstoned_lineages_from_the_intake_and_keeps_a_record_started_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let shared = shared(root);
    let (gone, pending, renewed, live) = (session("gone"), session("pending"), session("renewed"), session("live"));
    // `pending`: its tombstone names its live WAL (a deletion a crash cut); `renewed`: a record
    // started after the expiry, of another incarnation; `gone`: deleted; `live`: never expired.
    let mut l = shared.open_lineage_placed(&pending, Placement::Ephemeral).unwrap();
    plain_run(&mut l, "run-p");
    drop(l);
    let pending_wal = root.join("wal-ephemeral").join(format!("{}.wal", pending.addr()));
    tombstone(root, &pending.addr(), &incarnation(&pending_wal));
    plain_run(&mut shared.open_lineage(&renewed).unwrap(), "run-r");
    tombstone(root, &renewed.addr(), "00000000-0000-4000-8000-000000000000");
    tombstone(root, &gone.addr(), "00000000-0000-4000-8000-000000000001");
    let intake = Intake::open(root, false).unwrap();
    for (n, key) in [&gone, &pending, &renewed, &live].into_iter().enumerate() {
        let lineage = key.addr();
        let call_key = format!("{lineage}:{n}");
        let row = Registration {
            call_key: call_key.clone(),
            key: key.clone(),
            run_id: "run-1".into(),
            tool_call_id: "c1".into(),
            module: TOOLS.into(),
        };
        intake.register(&[row], 1).unwrap();
        let receipt = IntakeKey {
            provider: TOOLS.into(),
            custodian: "reserved:broca".into(),
            call_key: format!("{call_key}0"),
            event_id: "e".into(),
        };
        intake.receive(&receipt, &lineage).unwrap();
    }
    intake.set_cursor(TOOLS, Some(("incarnation-1", 4))).unwrap();
    assert_eq!(rebuild::prune_tombstoned(&shared, &intake), 2);
    let mut left = intake.lineages().unwrap();
    left.sort();
    let mut want = vec![renewed.addr(), live.addr()];
    want.sort();
    assert_eq!(left, want);
    let mut registered: Vec<SessionKey> = intake.registrations().unwrap().into_iter().map(|r| r.key).collect();
    registered.sort_by_key(SessionKey::addr);
    let mut want = vec![renewed.clone(), live.clone()];
    want.sort_by_key(SessionKey::addr);
    assert_eq!(registered, want);
    assert_eq!(intake.cursor(TOOLS).unwrap(), Some(("incarnation-1".into(), 4)), "the feed row stays");
    assert!(pending_wal.exists(), "the prune deletes no WAL: finishing the deletion is retention's");
}
