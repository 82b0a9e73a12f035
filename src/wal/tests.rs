use super::*;

const KNOWN: &[&str] = &["known/v1"];

fn fresh() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.wal");
    create(&FileStorage, &path, [7; 16]).unwrap();
    (dir, path)
}

type Seen = Vec<(u64, Vec<u8>)>;

fn open_collect(path: &Path) -> Result<(Wal, Seen), WalError> {
    let mut seen = Vec::new();
    let opts = WalOpen { known_features: KNOWN, resume_at: None, epoch: 1, floor: None, truncate_to: None };
    let wal = Wal::open(&FileStorage, path, opts, &mut |f: ScannedFrame<'_>| -> Result<(), WalError> {
        seen.push((f.seq, f.payload.to_vec()));
        Ok(())
    })?;
    Ok((wal, seen))
}

fn accepted(o: RecordOutcome) -> u64 {
    match o {
        RecordOutcome::Accepted(seq) => seq,
        RecordOutcome::Refused(e) => panic!("refused: {e}"),
    }
}

#[test]
fn header_is_69_bytes_and_carries_identity() {
    let (_d, path) = fresh();
    assert_eq!(fs::metadata(&path).unwrap().len(), 69);
    let h = read_header_of(&FileStorage, &path, KNOWN).unwrap();
    assert_eq!(h.lineage, [7; 16]);
    assert_eq!(uuid::Uuid::from_bytes(h.incarnation).get_version_num(), 4);
    // Reading never mints a new incarnation.
    assert_eq!(read_header_of(&FileStorage, &path, KNOWN).unwrap(), h);
}

#[test]
fn appends_are_durable_only_after_sync_and_seqs_continue_across_reopen() {
    let (_d, path) = fresh();
    let (mut wal, _) = open_collect(&path).unwrap();
    assert_eq!(accepted(wal.append(&[], b"a", false)), 1);
    assert_eq!(accepted(wal.append(&[], b"b", false)), 2);
    assert_eq!(wal.synced_seq(), 0);
    assert_eq!(fs::metadata(&path).unwrap().len(), 69, "nothing reaches the file before sync");
    assert_eq!(wal.sync().unwrap(), 2);
    assert_eq!(accepted(wal.append(&[], b"c", true)), 3);
    drop(wal);
    let (mut wal, seen) = open_collect(&path).unwrap();
    assert_eq!(seen, vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())]);
    assert_eq!(accepted(wal.append(&[], b"d", true)), 4);
}

#[test]
fn torn_tails_are_truncated_and_nothing_else_changes() {
    let (_d, path) = fresh();
    let (mut wal, _) = open_collect(&path).unwrap();
    accepted(wal.append(&[], b"first", false));
    accepted(wal.append(&[], b"second", true));
    drop(wal);
    let good = fs::read(&path).unwrap();
    let mut frame_bytes = Vec::new();
    frame::encode(&mut frame_bytes, FrameKind::Record, 3, 1, &[], b"third, torn");
    // Every strict prefix of a frame, a checksum-failing whole frame, and a zero-filled tail.
    let mut bad_crc = frame_bytes.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    let mut tails: Vec<Vec<u8>> = (1..frame_bytes.len()).map(|n| frame_bytes[..n].to_vec()).collect();
    tails.push(bad_crc);
    tails.push(vec![0; 4096]);
    for tail in tails {
        let mut bytes = good.clone();
        bytes.extend_from_slice(&tail);
        fs::write(&path, &bytes).unwrap();
        let (wal, seen) = open_collect(&path).unwrap();
        assert_eq!(seen.len(), 2, "tail of {} bytes", tail.len());
        assert_eq!(fs::read(&path).unwrap(), good, "tail of {} bytes", tail.len());
        assert_eq!(wal.appended_seq(), 2);
    }
}

#[test]
fn a_bad_frame_before_the_tail_fails_the_open_and_rewrites_nothing() {
    let (_d, path) = fresh();
    let (mut wal, _) = open_collect(&path).unwrap();
    for p in [b"one", b"two", b"thr"] {
        accepted(wal.append(&[], p, false));
    }
    wal.sync().unwrap();
    drop(wal);
    let good = fs::read(&path).unwrap();
    // Damage a payload byte and, separately, a length byte of the first record frame.
    for at in [69 + 32, 69] {
        let mut bytes = good.clone();
        bytes[at] ^= 0x01;
        fs::write(&path, &bytes).unwrap();
        let err = open_collect(&path).err().expect("corruption must fail the open");
        assert!(matches!(err, WalError::Corrupt { offset: 69, .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "nothing is rewritten");
    }
}

#[test]
fn unknown_required_features_are_refused_by_name() {
    let (_d, path) = fresh();
    let (mut wal, _) = open_collect(&path).unwrap();
    accepted(wal.append(&["known/v1"], b"fine", true));
    accepted(wal.append(&["probe-unknown/v1", "known/v1"], b"newer", true));
    drop(wal);
    let err = open_collect(&path).err().unwrap();
    match &err {
        WalError::NewerWriter { version, offset, missing } => {
            assert_eq!((*version, *offset), (FRAME_VERSION, 69 + 32 + 9 + 4));
            assert_eq!(missing, &vec!["probe-unknown/v1".to_string()]);
        }
        other => panic!("{other}"),
    }
    // The read-only path refuses the same way.
    let r = read(&path, KNOWN, None, &mut |_f: ScannedFrame<'_>| -> Result<(), WalError> { Ok(()) });
    assert!(matches!(r, Err(WalError::NewerWriter { .. })));
}

#[test]
fn a_stale_writer_is_refused_and_stays_refused() {
    let (_d, path) = fresh();
    let (mut a, _) = open_collect(&path).unwrap();
    let (mut b, _) = open_collect(&path).unwrap();
    accepted(b.append(&[], b"from b", true));
    match a.append(&[], b"from a", true) {
        RecordOutcome::Refused(WalError::Stale { expected_len: 69, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(a.append(&[], b"again", true), RecordOutcome::Refused(WalError::Poisoned { .. })));
    let (_, seen) = open_collect(&path).unwrap();
    assert_eq!(seen, vec![(1, b"from b".to_vec())]);
}

#[test]
fn the_feature_floor_is_raised_durably_before_the_frame() {
    let (dir, path) = fresh();
    let floor = Arc::new(FeatureFloor::load(&dir.path().join("floor")).unwrap());
    let opts =
        WalOpen { known_features: KNOWN, resume_at: None, epoch: 1, floor: Some(floor.clone()), truncate_to: None };
    let mut wal =
        Wal::open(&FileStorage, &path, opts, &mut |_f: ScannedFrame<'_>| -> Result<(), WalError> { Ok(()) }).unwrap();
    accepted(wal.append(&[], b"plain", true));
    assert!(!dir.path().join("floor").exists());
    accepted(wal.append(&["known/v1"], b"gated", false));
    assert_eq!(fs::read_to_string(dir.path().join("floor")).unwrap(), "known/v1\n");
    assert_eq!(FeatureFloor::load(&dir.path().join("floor")).unwrap().features(), vec!["known/v1"]);
}

#[test]
fn a_checkpoint_resume_reads_only_the_tail() {
    let (_d, path) = fresh();
    let (mut wal, _) = open_collect(&path).unwrap();
    accepted(wal.append(&[], b"one", true));
    let offset = wal.next_offset();
    accepted(wal.append(&[], b"two", true));
    drop(wal);
    let mut seen = Vec::new();
    let opts =
        WalOpen { known_features: KNOWN, resume_at: Some((offset, 2)), epoch: 2, floor: None, truncate_to: None };
    let wal = Wal::open(&FileStorage, &path, opts, &mut |f: ScannedFrame<'_>| -> Result<(), WalError> {
        seen.push(f.seq);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, vec![2]);
    assert_eq!(wal.appended_seq(), 2);
    // A checkpoint that does not land on the frame it names is refused, not trusted.
    let opts =
        WalOpen { known_features: KNOWN, resume_at: Some((offset + 1, 2)), epoch: 2, floor: None, truncate_to: None };
    assert!(
        Wal::open(&FileStorage, &path, opts, &mut |_f: ScannedFrame<'_>| -> Result<(), WalError> { Ok(()) }).is_err()
    );
}

#[test]
fn leases_admit_one_holder_and_count_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lease");
    let a = Lease::acquire(&path).unwrap();
    assert_eq!(a.epoch(), 1);
    match Lease::acquire(&path) {
        Err(LeaseError::Busy { pid: Some(pid), epoch: 1 }) => assert_eq!(pid, std::process::id()),
        other => panic!("{other:?}"),
    }
    drop(a);
    assert_eq!(Lease::acquire(&path).unwrap().epoch(), 2);
}

/// A lease this process holds is waited for (briefly: a sweep or a closing session is about to
/// let it go), and still refused once the wait is over.
#[test]
fn an_open_waits_for_a_lease_its_own_process_releases_and_not_longer() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.lease");
    let held = Lease::acquire(&path).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
    });
    let lease = Lease::acquire_waiting_for_own(&path, Duration::from_secs(10)).expect("taken once released");
    assert_eq!(lease.epoch(), 2);
    release.join().unwrap();
    let started = Instant::now();
    match Lease::acquire_waiting_for_own(&path, Duration::from_millis(30)) {
        Err(LeaseError::Busy { pid: Some(pid), .. }) => assert_eq!(pid, std::process::id()),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(30), "refused before its wait was over");
}

/// A creation is durable only with its first fsync: a power loss before it leaves an empty file
/// or a torn header, which `discard_unfinished` removes; after it, header and record survive.
#[test]
fn a_creation_cut_before_its_first_fsync_is_discarded_and_one_after_it_is_kept() {
    use super::storage::crash::{CrashStorage, Loss};
    for loss in [Loss::Clean, Loss::KeepPrefix(30)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.wal");
        let storage = CrashStorage::new();
        create(&storage, &path, [7; 16]).unwrap();
        storage.power_loss(loss).unwrap();
        assert!(matches!(read_header_of(&storage, &path, KNOWN), Err(WalError::NotAWal { .. })), "{loss:?}");
        assert!(discard_unfinished(&storage, &path).unwrap(), "{loss:?}");
        assert!(!path.exists());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.wal");
    let storage = std::sync::Arc::new(CrashStorage::new());
    let mut wal = Wal::create_on_first_write(storage.clone(), &path, [7; 16], 1, None);
    accepted(wal.append(&[], b"first", true));
    drop(wal);
    storage.power_loss(Loss::Clean).unwrap();
    assert!(!discard_unfinished(storage.as_ref(), &path).unwrap());
    let (_, seen) = open_collect(&path).unwrap();
    assert_eq!(seen, vec![(1, b"first".to_vec())]);
}

/// A writer of a new WAL writes nothing until its first frame: dropped before one (a refused
/// first send), it leaves no file; its first sync writes header and frame and reopens whole.
#[test]
fn a_new_wal_has_no_file_until_its_first_frame_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.wal");
    let storage: std::sync::Arc<dyn Storage> = std::sync::Arc::new(FileStorage);
    let mut wal = Wal::create_on_first_write(storage.clone(), &path, [7; 16], 1, None);
    assert_eq!(wal.sync().unwrap(), 0, "nothing to sync");
    assert!(!path.exists() && !wal.created(), "no frame, no file");
    drop(wal);
    assert!(!path.exists());
    let mut wal = Wal::create_on_first_write(storage, &path, [7; 16], 1, None);
    let incarnation = wal.header().incarnation;
    accepted(wal.append(&[], b"first", false));
    assert!(!path.exists(), "an unsynced append stays in memory");
    assert_eq!(wal.sync().unwrap(), 1);
    assert_eq!(wal.synced_end(), fs::metadata(&path).unwrap().len());
    drop(wal);
    assert_eq!(read_header_of(&FileStorage, &path, KNOWN).unwrap().incarnation, incarnation);
    let (_, seen) = open_collect(&path).unwrap();
    assert_eq!(seen, vec![(1, b"first".to_vec())]);
}

/// Only a file no longer than a header is an unfinished creation: a broken header with bytes
/// after it is damage, kept for the open to refuse.
#[test]
fn a_broken_header_with_records_after_it_is_not_discarded() {
    let (_d, path) = fresh();
    let (mut wal, _) = open_collect(&path).unwrap();
    accepted(wal.append(&[], b"a", true));
    drop(wal);
    let mut bytes = fs::read(&path).unwrap();
    bytes[10] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    assert!(!discard_unfinished(&FileStorage, &path).unwrap());
    assert!(path.exists());
    assert!(open_collect(&path).is_err());
}
