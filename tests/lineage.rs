//! The lineage core end to end on a real state root: refusals pinned by golden bytes, the store
//! as a rebuildable projection, checkpointed opens, cursors, orphan sealing and the metering lane.

use std::fs;
use std::path::Path;

use broca::lineage::projection::Cursor;
use broca::lineage::read;
use broca::lineage::reader::Reader;
use broca::lineage::{Lineage, RetractOutcome, Shared};
use broca::message::Message;
use broca::record::{FinishReason, Record, RequestIdentity};
use broca::replay::Resolution;
use broca::session_key::SessionKey;
use broca::state_root::{Placement, StateRoot};
use broca::wal::frame::{self, FrameKind};
use broca_testkit::*;

fn key() -> SessionKey {
    SessionKey::new("/work/proj", "test", "s1")
}

fn shared(dir: &Path) -> Shared {
    Shared::open(StateRoot::at(dir).unwrap()).unwrap()
}

fn golden(name: &str) -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/golden").join(name)).unwrap()
}

/// One finished episode with a tool batch.
fn episode(l: &mut Lineage, run_id: &str, submission: Option<&str>) {
    let input = submission.unwrap_or("hello");
    for rec in [
        run_started(run_id, submission, input),
        step_started(run_id, 1),
        model_step(run_id, 1, "reading", &[("c1", "read")]),
        intent(run_id, 1, "c1", "read"),
        tool_result(run_id, 1, "c1", "file text"),
        step_started(run_id, 2),
        model_step(run_id, 2, "done", &[]),
    ] {
        l.append(&rec).unwrap();
        l.commit().unwrap();
    }
    l.finish_run(run_id, FinishReason::Completed, None, vec![]).unwrap();
    l.commit().unwrap();
}

#[test]
fn a_newer_writers_wal_is_refused_with_the_pinned_body_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let path = shared.wal_path(&key());
    broca::wal::create(&broca::wal::FileStorage, &path, key().lineage_id()).unwrap();
    let mut frame_bytes = Vec::new();
    frame::encode(&mut frame_bytes, FrameKind::Record, 1, 9, &["probe-unknown/v1"], br#"{"probe":{}}"#);
    let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, &frame_bytes).unwrap();
    let before = fs::read(&path).unwrap();
    let err = shared.open_lineage(&key()).err().expect("refused");
    assert_eq!(err.refusal().to_json(), golden("wal_newer_writer.json"));
    // The read path refuses the same way, and nothing was written by either.
    let err = read::transcript(&Reader::at(&shared, &key(), (path).to_path_buf()), 0, 10).unwrap_err();
    assert_eq!(err.refusal().to_json(), golden("wal_newer_writer.json"));
    assert_eq!(fs::read(&path).unwrap(), before);
}

#[test]
fn corruption_before_the_tail_answers_open_failed_without_detail() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    drop(l);
    let path = shared.wal_path(&key());
    let mut bytes = fs::read(&path).unwrap();
    bytes[69 + 40] ^= 0x20;
    fs::write(&path, &bytes).unwrap();
    fs::remove_file(dir.path().join("run-index.db")).unwrap();
    let refusal =
        Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap().open_lineage(&key()).err().unwrap().refusal();
    assert_eq!(refusal.code, "open_failed");
    assert!(refusal.detail.is_none());
    assert!(refusal.message.starts_with("open failed: wal corrupt at offset 69"), "{}", refusal.message);
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing rewritten");
}

#[test]
fn a_second_opener_is_refused_busy_never_a_second_writer() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let _l = shared.open_lineage(&key()).unwrap();
    let refusal = shared.open_lineage(&key()).err().unwrap().refusal();
    assert_eq!(refusal.code, "session_busy");
}

#[test]
fn deleting_the_store_rebuilds_everything_derivable_from_the_wals() {
    let dir = tempfile::tempdir().unwrap();
    let shared1 = shared(dir.path());
    let mut l = shared1.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    l.enqueue("sub-2", Message::user_text("queued"), RequestIdentity::default()).unwrap();
    let next = l.state().queue.front().unwrap().submission_id.clone();
    episode(&mut l, &format!("run-{next}"), Some(&next));
    let path = l.wal_path().to_path_buf();
    drop(l);
    shared1.settle();
    let before = read::transcript(&Reader::at(&shared1, &key(), (path).to_path_buf()), 0, 100).unwrap();
    let run_before = shared1.store.run("run-1").unwrap().unwrap();
    drop(shared1);
    assert_eq!(before.prompt_len, 8);
    for f in ["run-index.db", "run-index.db-wal", "run-index.db-shm"] {
        let _ = fs::remove_file(dir.path().join(f));
    }
    let shared2 = shared(dir.path());
    let l = shared2.open_lineage(&key()).unwrap();
    assert!(!l.open_report().from_checkpoint);
    drop(l);
    shared2.settle();
    let after = read::transcript(&Reader::at(&shared2, &key(), (path).to_path_buf()), 0, 100).unwrap();
    // The lease epoch in the replay state is the new tenure's; everything derived is equal.
    assert_eq!(
        (&after.messages, after.prompt_len, after.head, &after.resolution, &after.state.queue),
        (&before.messages, before.prompt_len, before.head, &before.resolution, &before.state.queue)
    );
    assert_eq!(shared2.store.run("run-1").unwrap().unwrap(), run_before);
    assert_eq!(shared2.store.run("run-sub-2").unwrap().unwrap().submission_id.as_deref(), Some("sub-2"));
}

#[test]
fn an_open_with_a_current_watermark_replays_only_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    for i in 0..5 {
        episode(&mut l, &format!("run-{i}"), None);
    }
    drop(l);
    let l = shared.open_lineage(&key()).unwrap();
    assert!(l.open_report().from_checkpoint);
    assert_eq!(l.open_report().replayed, 0);
    assert_eq!(l.state().prompt_len, 20);
    drop(l);
    // A page from the middle comes from the store prefix.
    let page = read::transcript(&Reader::at(&shared, &key(), (shared.wal_path(&key())).to_path_buf()), 4, 4).unwrap();
    assert_eq!(page.messages.iter().map(|(o, _)| *o).collect::<Vec<_>>(), [4, 5, 6, 7]);
    assert_eq!(page.messages[0].1, Message::user_text("hello"));
}

#[test]
fn units_are_visible_only_after_commit_and_cursors_are_continuous_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let path = shared.wal_path(&key());
    let mut l = shared.open_lineage(&key()).unwrap();
    l.append(&run_started("run-1", None, "hi")).unwrap();
    assert!(Reader::open(&shared, &key()).is_none(), "nothing visible before fsync: the WAL is not even created");
    assert!(read::control_units(&l.reader(), None, usize::MAX).unwrap().is_empty(), "nor to its writer");
    assert_eq!(l.head(), None);
    let units = l.commit().unwrap();
    assert_eq!(units.len(), 3, "run_started, message_started, user_message");
    assert_eq!(l.head(), Some(Cursor { wal_seq: 1, sub_index: 2 }));
    l.append(&step_started("run-1", 1)).unwrap();
    drop(l); // a crash-like drop: the step was never committed
    let mut l = shared.open_lineage(&key()).unwrap();
    let all = read::control_units(&Reader::at(&shared, &key(), path.clone()), None, usize::MAX).unwrap();
    let types: Vec<_> = all.iter().map(|u| u.body()["type"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        types,
        ["run_started", "message_started", "user_message", "error", "run_finished"],
        "orphan sealed with its diagnostic first"
    );
    assert_eq!(all[3].body()["error"]["provider_code"], "previous_process_ended_unsealed");
    assert_eq!(all[4].body()["reason"], "interrupted");
    assert!(all.windows(2).all(|w| w[0].cursor < w[1].cursor));
    assert_eq!(l.head(), Some(all[4].cursor), "live attaches strictly after the last durable unit");
    // Attach at a cursor is strictly after it.
    let after =
        read::control_units(&Reader::at(&shared, &key(), path.clone()), Some(all[2].cursor), usize::MAX).unwrap();
    assert_eq!(after[0].cursor, all[3].cursor);
    // A new episode continues the same cursor space.
    let units = l.append_commit(&run_started("run-2", None, "again")).unwrap().1;
    assert_eq!(units[0].cursor, Cursor { wal_seq: 3, sub_index: 0 });
    assert_eq!(l.open_report().sealed_orphan.as_deref(), Some("run-1"), "this open sealed run-1");
    drop(l);
    let l = shared.open_lineage(&key()).unwrap();
    assert_eq!(l.open_report().sealed_orphan.as_deref(), Some("run-2"));
    assert!(matches!(l.state().resolution(), Resolution::Idle { .. }));
}

#[test]
fn retract_is_decided_against_consumption() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    l.enqueue("sub-a", Message::user_text("a"), RequestIdentity::default()).unwrap();
    l.enqueue("sub-b", Message::user_text("b"), RequestIdentity::default()).unwrap();
    l.append_commit(&run_started("run-sub-a", Some("sub-a"), "a")).unwrap();
    assert_eq!(l.retract("sub-a").unwrap().0, RetractOutcome::NotPending);
    assert_eq!(l.retract("sub-b").unwrap().0, RetractOutcome::Retracted);
    assert_eq!(l.retract("sub-b").unwrap().0, RetractOutcome::NotPending);
    // An invalid record is refused before anything is written.
    let seq = l.durable_seq();
    assert!(l.append(&run_started("run-x", None, "x")).is_err());
    assert!(l.commit().unwrap().is_empty());
    assert_eq!(l.durable_seq(), seq);
}

/// A fact says when its usage was billed (spec §17b): `pricing_at_ms`, the first answer of
/// that model in the run, with `pricing_at_precision` `step`; a run whose records carry no
/// answer time reads `degraded` with no time (#47).
#[test]
fn export_facts_carry_their_pricing_time_or_read_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    let timed = |step, at_ms, calls: &[(&str, &str)]| model_step_at("run-2", step, "x", calls, Some(at_ms));
    for rec in [
        run_started("run-2", None, "again"),
        step_started("run-2", 1),
        timed(1, 1_700_000_000_111, &[("c1", "read")]),
        intent("run-2", 1, "c1", "read"),
        tool_result("run-2", 1, "c1", "text"),
        step_started("run-2", 2),
        timed(2, 1_700_000_000_999, &[]),
    ] {
        l.append(&rec).unwrap();
        l.commit().unwrap();
    }
    l.finish_run("run-2", FinishReason::Completed, None, vec![]).unwrap();
    l.commit().unwrap();
    shared.settle();
    let db = rusqlite::Connection::open(dir.path().join("run-index.db")).unwrap();
    let mut stmt =
        db.prepare("SELECT run_id, pricing_at_ms, pricing_at_precision FROM export_facts ORDER BY export_seq").unwrap();
    let facts: Vec<(String, Option<i64>, String)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
    assert_eq!(
        facts,
        [
            ("run-1".to_string(), None, "degraded".to_string()),
            ("run-2".to_string(), Some(1_700_000_000_111), "step".to_string())
        ]
    );
}

#[test]
fn export_facts_are_insert_once_and_readable_read_only_while_broca_writes() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    let db = dir.path().join("run-index.db");
    let ro = rusqlite::Connection::open_with_flags(
        format!("file:{}?mode=ro", db.display()),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    let read_facts = || -> Vec<(i64, String, Option<i64>, String)> {
        shared.settle();
        let mut stmt = ro
            .prepare("SELECT export_seq, run_id, output_tokens, terminal_reason FROM export_facts ORDER BY export_seq")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).unwrap().map(Result::unwrap).collect()
    };
    let source: String =
        ro.query_row("SELECT value FROM export_meta WHERE key = 'source_instance_id'", [], |r| r.get(0)).unwrap();
    assert_eq!(read_facts(), vec![(1, "run-1".to_string(), Some(10), "completed".to_string())]);
    episode(&mut l, "run-2", None);
    assert_eq!(read_facts().len(), 2, "a reader sees new facts while the writer holds the database");
    drop(l);
    // Reopening replays nothing new into the facts; the identity survives restarts.
    drop(shared.open_lineage(&key()).unwrap());
    let shared2 = Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap();
    drop(shared2.open_lineage(&key()).unwrap());
    assert_eq!(read_facts().len(), 2);
    let again: String =
        ro.query_row("SELECT value FROM export_meta WHERE key = 'source_instance_id'", [], |r| r.get(0)).unwrap();
    assert_eq!(again, source);
    let high: String =
        ro.query_row("SELECT value FROM export_meta WHERE key = 'high_water'", [], |r| r.get(0)).unwrap();
    assert_eq!(high, "2");
    let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&db).unwrap().permissions()) & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_terminal_index_row_is_never_overridden_by_a_nonterminal_one() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    drop(l);
    shared.settle();
    assert!(shared.store.run("run-1").unwrap().unwrap().terminal);
    // Force a full re-derivation: the active row derived from RunStarted must not win.
    shared.store.forget_lineage(&key().addr()).unwrap();
    drop(shared.open_lineage(&key()).unwrap());
    shared.settle();
    let row = shared.store.run("run-1").unwrap().unwrap();
    assert!(row.terminal);
    assert_eq!(row.reason.as_deref(), Some("completed"));
}

/// Property: arbitrary bytes never panic the frame decoder, the record decoder or an open;
/// arbitrary damage to a valid WAL either opens (a torn tail) or fails by name.
#[test]
fn garbage_never_panics() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let len = (next() % 96) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = frame::decode(&bytes);
        let _ = Record::decode(&bytes);
    }
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    drop(l);
    let path = shared.wal_path(&key());
    let good = fs::read(&path).unwrap();
    for _ in 0..300 {
        let mut bytes = good.clone();
        let at = (next() as usize) % bytes.len();
        bytes[at] = next() as u8;
        let cut = if next() % 2 == 0 { bytes.len() } else { (next() as usize) % bytes.len() };
        bytes.truncate(cut);
        fs::write(&path, &bytes).unwrap();
        let _ = shared.store.forget_lineage(&key().addr());
        match Lineage::open(&shared, &key(), Placement::Standard) {
            Ok(l) => assert!(l.durable_seq() <= 8),
            Err(e) => assert!(!e.refusal().code.as_str().is_empty()),
        }
    }
}

/// Property: the WAL cut at any byte (what a crash mid-write leaves) opens, truncates the torn
/// tail only, and replays to a consistent state: every complete frame before the cut survives,
/// the transcript is gap-free, and a run left open is sealed.
#[test]
fn any_byte_prefix_of_a_valid_wal_replays_to_a_consistent_state() {
    let dir = tempfile::tempdir().unwrap();
    let shared = shared(dir.path());
    let mut l = shared.open_lineage(&key()).unwrap();
    episode(&mut l, "run-1", None);
    l.enqueue("sub-q", Message::user_text("queued"), RequestIdentity::default()).unwrap();
    episode(&mut l, "run-sub-q", Some("sub-q"));
    drop(l);
    let path = shared.wal_path(&key());
    let full = fs::read(&path).unwrap();
    // Frame boundaries, from the read-only scan.
    let mut ends = vec![69u64];
    broca::wal::read(
        &path,
        broca::record::KNOWN_FEATURES,
        None,
        &mut |f: broca::wal::ScannedFrame<'_>| -> Result<(), broca::wal::WalError> {
            ends.push(f.offset + f.len);
            Ok(())
        },
    )
    .unwrap();
    // Every frame boundary and its neighbours, and every 5th byte between.
    let mut cuts: Vec<usize> = (69..=full.len()).step_by(5).collect();
    cuts.extend(ends.iter().flat_map(|&e| [e as usize - 1, e as usize, e as usize + 1]));
    cuts.retain(|&c| (69..=full.len()).contains(&c));
    for cut in cuts {
        let sub = dir.path().join(format!("cut-{cut}"));
        let shared = Shared::open(StateRoot::at(&sub).unwrap()).unwrap();
        let wal = shared.wal_path(&key());
        fs::write(&wal, &full[..cut]).unwrap();
        let complete = ends.iter().filter(|&&e| e as usize <= cut).count() as u64 - 1;
        let l = shared.open_lineage(&key()).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let sealed = u64::from(l.open_report().sealed_orphan.is_some());
        // Sealing appends unknown-outcome results and a RunFinished after the surviving frames.
        assert!(l.durable_seq() >= complete && (sealed == 1 || l.durable_seq() == complete), "cut {cut}");
        let prompt_len = l.state().prompt_len;
        drop(l);
        let kept = ends[complete as usize] as usize;
        assert_eq!(fs::read(&wal).unwrap()[..kept], full[..kept], "cut {cut}: complete frames unchanged");
        let page = read::transcript(&Reader::at(&shared, &key(), (wal).to_path_buf()), 0, 1000).unwrap();
        assert_eq!(page.prompt_len, prompt_len);
        assert!(page.messages.iter().enumerate().all(|(i, (o, _))| *o == i as u64), "cut {cut}: gap-free");
        assert_eq!(page.messages.len() as u64, prompt_len);
        fs::remove_dir_all(&sub).unwrap();
    }
}

/// A scripted session for the storage-seam faults: two finished episodes with a tool batch
/// each, and a queued send retracted between them (every kind of run-index flush: run start
/// and end, queue changes, the checkpoint at close).
fn faulted_script(l: &mut Lineage) {
    episode(l, "run-1", None);
    l.enqueue("sub-x", Message::user_text("later"), RequestIdentity::default()).unwrap();
    assert_eq!(l.retract("sub-x").unwrap().0, RetractOutcome::Retracted);
    episode(l, "run-2", None);
}

/// What a reader gets of the session: its messages, durable head and resolution.
fn reads(l: &Lineage) -> (Vec<(u64, Message)>, Option<Cursor>, Resolution) {
    let page = l.transcript(0, u64::MAX).unwrap();
    (page.messages, page.head, page.resolution)
}

/// `run-index.db` fails (an I/O error at commit) at each of the script's flushes in turn:
/// nothing durable is lost (every read answers from the WAL as without the fault), the store
/// keeps an older consistent checkpoint, and reopening the session rebuilds its rows.
#[test]
fn io_fault_at_every_run_index_flush_loses_nothing_and_the_reopen_rebuilds_the_rows() {
    let addr = key().addr();
    let run_through = |dir: &Path, fault: Option<u64>| {
        let s = shared(dir);
        if let Some(nth) = fault {
            s.store.fail_flush(nth);
        }
        let mut l = s.open_lineage(&key()).unwrap();
        faulted_script(&mut l);
        l.settle();
        let read = (reads(&l), l.state().clone(), l.store_current(), s.store.flushes());
        drop(l);
        s.settle();
        (read, s.store.flushes())
    };
    let base = tempfile::tempdir().unwrap();
    let ((want_page, want_state, current, before_close), flushes) = run_through(base.path(), None);
    assert!(current && before_close >= 4 && flushes >= before_close, "every barrier kind flushes ({flushes})");
    let want_rows = shared(base.path()).store.messages(&addr, 0, u64::MAX).unwrap();
    for nth in 1..=flushes {
        let dir = tempfile::tempdir().unwrap();
        let ((page, state, current, _), _) = run_through(dir.path(), Some(nth));
        // (The last flushes are the close's checkpoint, after the lineage could say.)
        assert_eq!(current, nth > before_close, "flush {nth}: the failed flush is known to the lineage");
        assert_eq!(page, want_page, "flush {nth}: the transcript reads from the WAL as without the fault");
        let facts =
            |r: &broca::replay::Replay| (r.last_seq, r.episodes, r.prompt_len, r.queue.len(), r.session_usage.clone());
        assert_eq!(facts(&state), facts(&want_state), "flush {nth}");
        let s = shared(dir.path());
        let stale = s.store.checkpoint(&addr).unwrap().map_or(0, |c| c.watermark_seq);
        assert!(stale < want_state.last_seq, "flush {nth}: the store kept an older checkpoint");
        let l = s.open_lineage(&key()).unwrap();
        assert_eq!(reads(&l), want_page, "flush {nth}: reopened");
        drop(l);
        s.settle();
        let rebuilt = s.store.checkpoint(&addr).unwrap().expect("a checkpoint");
        assert_eq!(rebuilt.watermark_seq, want_state.last_seq, "flush {nth}: the reopen rebuilt the checkpoint");
        assert_eq!(s.store.messages(&addr, 0, u64::MAX).unwrap(), want_rows, "flush {nth}: and the rows");
    }
}

/// A session whose WAL a crash cut inside its never-fsynced header (empty, or part of the
/// header) reads as no session, and its next writer starts it afresh: nothing in it was ever
/// acknowledged.
#[test]
fn a_wal_cut_inside_its_unsynced_header_reads_as_no_session_and_starts_afresh() {
    for kept in [0usize, 30] {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path());
        let mut l = shared.open_lineage(&key()).unwrap();
        episode(&mut l, "run-old", None);
        drop(l);
        let path = shared.wal_path(&key());
        let header = fs::read(&path).unwrap()[..69].to_vec();
        // What a power loss before the first fsync leaves of a new WAL.
        fs::write(&path, &header[..kept]).unwrap();
        assert!(read::snapshot(&shared, &key()).unwrap().is_none(), "kept {kept}");
        // Every op that asks whether the session exists (sends, driver ops, subscribe) asks this.
        assert!(!shared.has_record(&key()), "kept {kept}");
        let mut l = shared.open_lineage(&key()).unwrap();
        assert!(l.state().last.is_none(), "kept {kept}: the session starts with no episode");
        episode(&mut l, "run-new", None);
        drop(l);
        assert!(shared.has_record(&key()));
        let page = read::snapshot(&shared, &key()).unwrap().expect("the new record reads");
        assert_eq!(page.state.last.as_ref().map(|r| r.run_id.as_str()), Some("run-new"), "kept {kept}");
    }
}
