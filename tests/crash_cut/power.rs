//! Power loss and I/O failure through the WAL's storage seam (`CrashStorage`).
//!
//! `power_loss_*`: a scripted multi-episode run (tool batches, a queued send, a steer delivered
//! at a step entry, a boundary cancel, a refused record) is cut at every fsync: that fsync fails
//! as the power goes, the unsynced bytes are dropped (all of them, or all but a torn prefix) and
//! the session is reopened. Nothing a reader or a commit ever saw may be missing, and nothing the
//! writer refused may be present.
//!
//! `io_fault_*`: a failed write or fsync latches the WAL (appends refused, a transient refusal),
//! loses nothing durable, and a reopen after the device recovers cuts what was never durable,
//! seals the open run with a typed error, and goes on.

use std::collections::BTreeMap;
use std::sync::Arc;

use broca::lineage::projection::Cursor;
use broca::lineage::read;
use broca::lineage::reader::Reader;
use broca::lineage::{Lineage, LineageError, Shared};
use broca::message::Message;
use broca::record::{CancelAt, FinishReason, Record, STORAGE_FAILED_CODE};
use broca::state_root::StateRoot;
use broca::wal::storage::crash::{CrashStorage, FaultKind, FaultOp, Loss};
use serde_json::Value;

use super::{intent, key, model_step, read_records, request, request_as, run_started, step_started, tool_ok};

/// One durability barrier of the script.
enum Op {
    /// Append these records, then commit.
    Commit(Vec<Record>),
    /// Finish the open run, then commit.
    Finish(&'static str, FinishReason),
    /// This record must be refused, and nothing written.
    Refuse(Box<Record>),
}

fn script() -> Vec<Op> {
    let queued =
        |sub: &str, req| Record::Queued { submission_id: sub.into(), message: Message::user_text(sub), request: req };
    vec![
        Op::Commit(vec![run_started("run-1", None)]),
        Op::Commit(vec![step_started("run-1", 1)]),
        Op::Commit(vec![
            model_step("run-1", 1, &["c1".into(), "c2".into()]),
            intent("run-1", 1, "c1"),
            intent("run-1", 1, "c2"),
        ]),
        Op::Commit(vec![tool_ok("run-1", 1, "c1"), tool_ok("run-1", 1, "c2")]),
        Op::Commit(vec![queued("sub-q", request("q"))]),
        Op::Commit(vec![queued("sub-s", request_as("s", "steer", Some("run-1")))]),
        Op::Commit(vec![
            Record::Steered {
                run_id: "run-1".into(),
                submission_id: "sub-s".into(),
                message: Message::user_text("sub-s"),
                title: None,
            },
            step_started("run-1", 2),
        ]),
        Op::Commit(vec![model_step("run-1", 2, &[])]),
        Op::Finish("run-1", FinishReason::Completed),
        Op::Commit(vec![run_started("run-2", Some("sub-q")), step_started("run-2", 1)]),
        Op::Commit(vec![Record::RunCancelRequested { run_id: "run-2".into(), at: CancelAt::StepBoundary }]),
        Op::Finish("run-2", FinishReason::Cancelled),
        Op::Refuse(Box::new(step_started("run-2", 9))),
        Op::Commit(vec![run_started("run-3", None), step_started("run-3", 1)]),
        Op::Commit(vec![model_step("run-3", 1, &["c3".into()]), intent("run-3", 1, "c3")]),
    ]
}

/// What the script saw before it stopped.
#[derive(Default)]
struct Seen {
    /// Every control unit a commit returned or a reader read, by cursor.
    units: BTreeMap<Cursor, Value>,
    /// The last seq a commit returned as durable.
    acked_seq: u64,
    /// Encoded records the WAL refused.
    refused: Vec<Vec<u8>>,
    /// Whether the script ran to its end.
    completed: bool,
}

impl Seen {
    fn note(&mut self, cursor: Cursor, unit: &Value) {
        if let Some(before) = self.units.insert(cursor, unit.clone()) {
            assert_eq!(&before, unit, "the unit at {cursor:?} changed while the writer ran");
        }
    }

    /// A reader's view (bounded by the writer's published end, or the failed writer's).
    fn read(&mut self, shared: &Shared) {
        let reader = Reader::open(shared, &key()).expect("the session has a WAL");
        for u in read::control_units(&reader, None, usize::MAX).expect("a reader reads") {
            self.note(u.cursor, &u.body());
        }
    }
}

fn run(l: &mut Lineage, shared: &Shared, seen: &mut Seen) -> Result<(), LineageError> {
    for op in script() {
        let units = match op {
            Op::Commit(records) => {
                for r in &records {
                    l.append(r)?;
                }
                l.commit()?
            }
            Op::Finish(run_id, reason) => {
                l.finish_run(run_id, reason, None, vec![])?;
                l.commit()?
            }
            Op::Refuse(r) => {
                assert!(l.append(&r).is_err(), "{r:?} is refused");
                seen.refused.push(r.encode());
                continue;
            }
        };
        seen.acked_seq = l.durable_seq();
        for u in &units {
            seen.note(u.cursor, &u.body());
        }
        seen.read(shared);
    }
    seen.completed = true;
    Ok(())
}

fn open(dir: &std::path::Path, storage: &CrashStorage) -> Arc<Shared> {
    Arc::new(Shared::open_with(StateRoot::at(dir).unwrap(), Arc::new(storage.clone())).unwrap())
}

/// Runs the script with the `fail_at`-th fsync (from 0) failing as the power goes; returns what
/// was seen. `None` runs it whole.
fn run_until_power_loss(dir: &std::path::Path, storage: &CrashStorage, fail_at: Option<u64>) -> Seen {
    let shared = open(dir, storage);
    let mut l = shared.open_lineage(&key()).unwrap();
    if let Some(n) = fail_at {
        storage.fail(FaultOp::Sync, n, FaultKind::Eio);
    }
    let mut seen = Seen::default();
    if run(&mut l, &shared, &mut seen).is_err() {
        // The writer latched; a reader still sees only what was durable.
        seen.read(&shared);
    }
    drop(l);
    shared.settle();
    seen
}

/// Reopens after the loss and checks the two rules.
fn check_after_loss(dir: &std::path::Path, seen: &Seen, what: &str) {
    let shared = Shared::open(StateRoot::at(dir).unwrap()).unwrap();
    let l = shared.open_lineage(&key()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    assert!(l.durable_seq() >= seen.acked_seq, "{what}: acked seq {} lost (now {})", seen.acked_seq, l.durable_seq());
    let after: BTreeMap<Cursor, Value> =
        read::control_units(&l.reader(), None, usize::MAX).unwrap().into_iter().map(|u| (u.cursor, u.body())).collect();
    for (cursor, unit) in &seen.units {
        assert_eq!(after.get(cursor), Some(unit), "{what}: a unit seen at {cursor:?} is missing or changed");
    }
    let records = read_records(l.wal_path());
    for refused in &seen.refused {
        assert!(records.iter().all(|(_, r)| &r.encode() != refused), "{what}: a refused record is present");
    }
}

fn power_loss_at_every_fsync(loss: Loss) {
    let total = {
        let dir = tempfile::tempdir().unwrap();
        let storage = CrashStorage::new();
        let seen = run_until_power_loss(dir.path(), &storage, None);
        assert!(seen.completed && seen.refused.len() == 1);
        storage.syncs()
    };
    assert!(total >= 14, "the script makes an fsync per barrier: {total}");
    for n in 0..total {
        let dir = tempfile::tempdir().unwrap();
        let storage = CrashStorage::new();
        let seen = run_until_power_loss(dir.path(), &storage, Some(n));
        assert!(!seen.completed, "fsync {n} failed: the script stops there");
        storage.power_loss(loss).unwrap();
        check_after_loss(dir.path(), &seen, &format!("power lost at fsync {n} ({loss:?})"));
    }
}

#[test]
fn power_loss_drops_every_unsynced_byte() {
    power_loss_at_every_fsync(Loss::Clean);
}

#[test]
fn power_loss_leaves_a_torn_tail() {
    power_loss_at_every_fsync(Loss::KeepPrefix(37));
}

#[test]
fn power_loss_keeps_whole_unacked_frames() {
    // The fsync "failed" but the device wrote it all: unacked frames may survive, whole.
    power_loss_at_every_fsync(Loss::KeepPrefix(u64::MAX / 2));
}

/// An `op` failure after `after` successful ones, then checks of the latch, the refusal, the
/// durable prefix and the recovery.
fn io_fault(op: FaultOp, kind: FaultKind, after: u64) {
    let dir = tempfile::tempdir().unwrap();
    let storage = CrashStorage::new();
    let shared = open(dir.path(), &storage);
    let mut l = shared.open_lineage(&key()).unwrap();
    storage.fail(op, after, kind);
    let mut seen = Seen::default();
    let err = run(&mut l, &shared, &mut seen).expect_err("the fault trips inside the script");
    assert!(storage.tripped());
    let refusal = err.refusal();
    assert_eq!(
        (refusal.code.as_str(), refusal.detail.as_ref().and_then(|d| d.get("class").cloned())),
        ("open_failed", Some("transient".into())),
        "{err}"
    );
    // Latched: nothing more is accepted, even once the device is back.
    storage.clear();
    let again = l.append(&step_started("run-9", 1)).expect_err("the latched wal refuses appends");
    assert_eq!(again.refusal().code, "open_failed", "{again}");
    seen.read(&shared);
    drop(l);
    shared.settle();
    // Reopen in the same process after the fault cleared: what was never durable is cut, the
    // run left open is sealed with the storage error, and the session goes on.
    let mut l = shared.open_lineage(&key()).expect("reopens after the fault cleared");
    let units = read::control_units(&l.reader(), None, usize::MAX).unwrap();
    let after: BTreeMap<Cursor, Value> = units.iter().map(|u| (u.cursor, u.body())).collect();
    for (cursor, unit) in &seen.units {
        assert_eq!(after.get(cursor), Some(unit), "a unit seen at {cursor:?} is missing or changed");
    }
    if l.open_report().sealed_orphan.is_some() {
        let sealed = units.last().expect("the seal's run_finished");
        assert_eq!(sealed.body()["type"], "run_finished", "{}", sealed.body());
        assert_eq!(sealed.body()["reason"], "interrupted", "{}", sealed.body());
        assert_eq!(sealed.body()["error"]["provider_code"], STORAGE_FAILED_CODE, "{}", sealed.body());
    }
    l.append(&run_started("run-after", None)).unwrap();
    l.commit().expect("the recovered wal commits");
}

#[test]
fn io_fault_fsync_eio_latches_and_recovers() {
    io_fault(FaultOp::Sync, FaultKind::Eio, 3);
}

#[test]
fn io_fault_write_enospc_short_write_is_cut() {
    io_fault(FaultOp::Write, FaultKind::Enospc, 5);
}

#[test]
fn io_fault_write_eio_mid_episode() {
    io_fault(FaultOp::Write, FaultKind::Eio, 9);
}
