//! The WAL reader over the golden WALs (`testdata/wal/`): every byte damaged and every
//! truncation point (exhaustive, with an exact oracle: what the frame layer must answer at each
//! position), then random cases — records mutated as JSON and re-framed with a valid checksum
//! (so they reach the record decoder and the replay), frames re-framed with unknown features,
//! other seqs or kinds, frames spliced from the other WAL, and byte-level damage.
//!
//! Every case goes through the frame scan (`wal::read`), the record decoder, the lineage reader
//! (control units, transcript, replay state) and the writer's open (which cuts a torn tail:
//! the file must then read back clean). Each answers or fails with its typed error.
//!
//! A sweep visits its positions in a spread order and, like a random target, stops when its
//! share of the budget is spent (a debug build reads a golden WAL in milliseconds);
//! `BROCA_FUZZ_SWEEP=full` (`make fuzz`) visits every position.

use std::path::Path;

use broca::lineage::read;
use broca::lineage::reader::{Reader, Start, StateOnly};
use broca::lineage::{LineageError, Shared};
use broca::record::{Record, KNOWN_FEATURES};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wal::frame::{self, FrameKind};
use broca::wal::{self, FileStorage, ScannedFrame, Wal, WalError, WalOpen};
use serde_json::Value;

use crate::{corpus, fuzz, sweep, Gen};

/// A golden WAL split into its frames.
struct Golden {
    name: String,
    bytes: Vec<u8>,
    /// Length of the header frame.
    header_len: usize,
    /// `(offset, len, seq, payload)` of each record frame.
    frames: Vec<(usize, usize, u64, Vec<u8>)>,
}

fn goldens() -> Vec<Golden> {
    let dir = crate::scratch_dir();
    corpus("wal", ".wal")
        .into_iter()
        .map(|(name, bytes)| {
            let path = dir.path().join(&name);
            std::fs::write(&path, &bytes).unwrap();
            let mut frames = Vec::new();
            wal::read::<WalError>(&path, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
                frames.push((f.offset as usize, f.len as usize, f.seq, f.payload.to_vec()));
                Ok(())
            })
            .unwrap();
            let header_len = frames.first().map_or(bytes.len(), |f| f.0);
            assert!(frames.len() > 10, "{name}: a golden WAL with records");
            Golden { name, bytes, header_len, frames }
        })
        .collect()
}

/// Every member name the golden records use (mutations add and remove these).
fn record_names(goldens: &[Golden]) -> Vec<String> {
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for g in goldens {
        for (_, _, _, payload) in &g.frames {
            walk(&serde_json::from_slice(payload).unwrap(), &mut names);
        }
    }
    names.into_iter().collect()
}

/// What the frame layer answered: the seqs it visited, or its error.
type FrameAnswer = Result<Vec<u64>, WalError>;

/// Reads `path` the ways broca reads a WAL and checks each answer is typed: the frame scan and
/// the writer's open always; with `deep`, also the record decoder and the lineage reader
/// (replay state, control units, a transcript page). Returns the frame scan's answer.
fn read_every_way(path: &Path, deep: bool) -> FrameAnswer {
    let mut seqs = Vec::new();
    let scanned = wal::read::<WalError>(path, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        seqs.push(f.seq);
        // A payload either decodes (an unknown record type is `Unknown`) or is a typed error.
        if deep {
            // (`Unknown` is never re-encoded: only records this build builds are appended.)
            if let Ok(record) = Record::decode(f.payload) {
                let _ = (record.features(), record.run_id());
                if !matches!(record, Record::Unknown(_)) {
                    assert_eq!(Record::decode(&record.encode()).ok().as_ref(), Some(&record), "a record re-encodes");
                }
            }
        }
        Ok(())
    });
    if deep {
        let reader = Reader::file(path);
        let outcomes = [
            reader.scan(Start::Beginning, &mut StateOnly).err(),
            read::control_units(&reader, None, usize::MAX).err(),
            read::transcript(&reader, 0, u64::MAX).err(),
        ];
        if scanned.is_ok() {
            // The frames read, so the reader fails only on what they carry: a record that
            // does not decode, or may not follow its predecessors.
            for e in outcomes.into_iter().flatten() {
                assert!(matches!(e, LineageError::Decode { .. } | LineageError::Replay(_)), "{e}");
            }
        }
    }
    if scanned.is_ok() {
        // The writer's open cuts a torn tail; the file then reads back clean, to the same seqs.
        let len = std::fs::metadata(path).unwrap().len();
        let opts =
            WalOpen { known_features: KNOWN_FEATURES, resume_at: None, epoch: 1, floor: None, truncate_to: None };
        let opened = Wal::open::<WalError>(&FileStorage, path, opts, &mut |_| Ok(()));
        let end = opened.unwrap_or_else(|e| panic!("a WAL that reads does not open: {e}")).next_offset();
        assert_eq!(std::fs::metadata(path).unwrap().len(), end, "open leaves the file at its last whole frame");
        if end != len {
            let mut again = Vec::new();
            wal::read::<WalError>(path, KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
                again.push(f.seq);
                Ok(())
            })
            .unwrap();
            assert_eq!(again, seqs, "the cut WAL reads the same frames");
        }
    }
    scanned.map(|_| seqs)
}

/// Whether a sweep position also gets the deep reads (frame boundaries, and a stride between).
fn deep_at(g: &Golden, at: usize) -> bool {
    at.is_multiple_of(61) || at == g.header_len || g.frames.iter().any(|(o, l, _, _)| o + l == at)
}

/// The seqs of the frames that lie wholly in `bytes[..end]`.
fn seqs_before(g: &Golden, end: usize) -> Vec<u64> {
    g.frames.iter().filter(|(o, l, _, _)| o + l <= end).map(|f| f.2).collect()
}

#[test]
fn fuzz_wal_every_byte_and_every_cut() {
    let goldens = goldens();
    let dir = crate::scratch_dir();
    for g in &goldens {
        let path = dir.path().join(&g.name);
        // Every truncation point: a cut inside the header is not a WAL; any other cut is a torn
        // tail, and the frames wholly before it read back.
        sweep(&format!("wal.cut.{}", g.name), g.bytes.len() + 1, 0.25, |cut| {
            std::fs::write(&path, &g.bytes[..cut]).unwrap();
            match read_every_way(&path, deep_at(g, cut)) {
                Ok(seqs) => {
                    assert!(cut >= g.header_len, "cut {cut} inside the header read");
                    assert_eq!(seqs, seqs_before(g, cut), "cut {cut}");
                }
                Err(e) => {
                    assert!(cut < g.header_len, "cut {cut}: {e}");
                    assert!(matches!(e, WalError::NotAWal { .. }), "cut {cut}: {e}");
                }
            }
        });
        // Every byte damaged: the frame holding it is corrupt (a damaged last frame may read as
        // a torn tail); the frames before it are intact.
        sweep(&format!("wal.byte.{}", g.name), g.bytes.len(), 0.25, |at| {
            let mut bytes = g.bytes.clone();
            bytes[at] ^= 1 + (at % 255) as u8;
            std::fs::write(&path, &bytes).unwrap();
            let answer = read_every_way(&path, deep_at(g, at));
            if at < g.header_len {
                assert!(answer.is_err(), "damage at {at} in the header read as {answer:?}");
                return;
            }
            let hit = g.frames.iter().position(|(o, l, _, _)| (*o..o + l).contains(&at)).unwrap();
            let before: Vec<u64> = g.frames[..hit].iter().map(|f| f.2).collect();
            match answer {
                Ok(seqs) => {
                    assert_eq!(hit, g.frames.len() - 1, "damage at {at} in frame {hit} read");
                    assert_eq!(seqs, before);
                }
                Err(WalError::Corrupt { offset, .. }) => assert_eq!(offset as usize, g.frames[hit].0, "at {at}"),
                Err(e) => panic!("damage at {at}: {e}"),
            }
        });
    }
}

/// One frame re-encoded from parts (valid length, check and checksum).
fn framed(kind: FrameKind, seq: u64, features: &[&str], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(&mut out, kind, seq, 1, features, payload);
    out
}

/// A structure-aware mutant of a golden WAL.
fn mutant(g: &mut Gen, goldens: &[Golden], names: &[&str]) -> Vec<u8> {
    let w = g.pick(goldens);
    let other = g.pick(goldens);
    let mut frames: Vec<Vec<u8>> = w.frames.iter().map(|(o, l, _, _)| w.bytes[*o..o + l].to_vec()).collect();
    let mut out = w.bytes[..w.header_len].to_vec();
    for _ in 0..g.range(1, 4) {
        let i = g.below(frames.len());
        // The golden frame at this place (frames may have been dropped or repeated above).
        let (_, _, seq, payload) = &w.frames[i.min(w.frames.len() - 1)];
        let seq = *seq;
        match g.below(8) {
            // A record mutated as JSON, re-framed: it reaches the record decoder and the replay.
            0..=3 => {
                let mut v: Value = serde_json::from_slice(payload).unwrap();
                if g.chance(2) {
                    // Same-typed values: the record still decodes, its values reach the replay.
                    for _ in 0..g.range(1, 4) {
                        g.mutate_json_typed(&mut v);
                    }
                } else {
                    g.mutate_json(&mut v, names);
                }
                frames[i] = framed(FrameKind::Record, seq, &[], &serde_json::to_vec(&v).unwrap());
            }
            // Raw payload damage under a valid checksum.
            4 => {
                let mut p = payload.clone();
                let j = g.below(other.frames.len());
                g.mutate_bytes(&mut p, &other.frames[j].3);
                frames[i] = framed(FrameKind::Record, seq, &[], &p);
            }
            // Another frame shape: unknown or odd features, a header kind, another seq.
            5 => {
                let choices: [&[&str]; 3] = [&["future/v9"], &["x"; 3], &KNOWN_FEATURES[..1]];
                let features = *g.pick(&choices);
                let kind = if g.chance(3) { FrameKind::Header } else { FrameKind::Record };
                let seq = *g.pick(&[seq, 0, seq + 1, u64::MAX, seq.saturating_sub(1)]);
                frames[i] = framed(kind, seq, features, payload);
            }
            // A record of the other WAL spliced in under this seq (foreign run ids, ordinals).
            6 => {
                let (_, _, _, payload) = &other.frames[g.below(other.frames.len())];
                frames[i] = framed(FrameKind::Record, seq, &[], payload);
            }
            // A frame dropped, or repeated.
            _ => {
                if g.chance(2) {
                    frames.remove(i);
                } else {
                    let f = frames[i].clone();
                    frames.insert(i, f);
                }
                if frames.is_empty() {
                    break;
                }
            }
        }
    }
    out.extend(frames.concat());
    if g.chance(5) {
        g.mutate_bytes(&mut out, &other.bytes);
    }
    if g.chance(6) {
        // A zero-filled extension, as a crash during a file extension leaves.
        out.extend(std::iter::repeat_n(0u8, g.range(1, 5000)));
    }
    out
}

#[test]
fn fuzz_wal_structured_mutants() {
    let goldens = goldens();
    let names = record_names(&goldens);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let dir = crate::scratch_dir();
    let path = dir.path().join("mutant.wal");
    // A state root whose sessions are opened for writing from the mutants (one per case).
    let root = crate::scratch_dir();
    let shared = Shared::open(StateRoot::at(root.path()).unwrap()).unwrap();
    let (mut session, mut opened) = (0u64, 0u64);
    fuzz("wal.structured", 100, |g| {
        let bytes = mutant(g, &goldens, &names);
        std::fs::write(&path, &bytes).unwrap();
        if read_every_way(&path, true).is_ok() {
            session += 1;
            opened += u64::from(open_for_writing(&shared, &format!("s{session}"), &bytes));
        }
    });
    println!("FUZZ wal.structured opened_for_writing={opened} of {session} readable mutants");
}

/// Opens a session whose WAL holds `bytes` the way its actor does (lease, scan, replay, store
/// rebuild, orphan sealing), reads it, closes it and opens it again (from the store checkpoint
/// the first open left). Each open succeeds or fails with a typed error.
fn open_for_writing(shared: &Shared, session: &str, bytes: &[u8]) -> bool {
    let key = SessionKey::new("/fuzz", "fuzz", session);
    let path = shared.wal_path(&key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let mut opened = true;
    for _ in 0..2 {
        match shared.open_lineage(&key) {
            Ok(lineage) => {
                let _ = (lineage.head(), lineage.transcript(0, u64::MAX).map(|p| p.messages.len()));
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                opened = false;
            }
        }
        shared.settle();
    }
    opened
}

/// A hostile length prefix: a valid (length, check) pair declaring the largest body a frame may
/// carry, after the golden frames, in a file that holds only a few bytes of it. The reader must
/// see a torn tail without allocating the declared 64 MiB (it once sized its buffer to the
/// declared frame before reading a byte of it).
#[test]
fn fuzz_wal_hostile_length_prefix_allocates_only_what_the_file_holds() {
    let goldens = goldens();
    let dir = crate::scratch_dir();
    let path = dir.path().join("hostile.wal");
    crate::fuzz("wal.hostile_length", 20, |g| {
        let w = g.pick(&goldens);
        let mut bytes = w.bytes.clone();
        let len = *g.pick(&[frame::MAX_BODY_LEN as u32, (frame::MAX_BODY_LEN / 2) as u32, 1 << 24, 1 << 20]);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&(!len).to_le_bytes());
        let tail = g.below(64);
        bytes.extend(g.bytes(4 + tail));
        std::fs::write(&path, &bytes).unwrap();
        let seqs = read_every_way(&path, false).unwrap_or_else(|e| panic!("declared {len}, tail {tail}: {e}"));
        assert_eq!(seqs, w.frames.iter().map(|f| f.2).collect::<Vec<_>>());
        let largest = crate::take_largest_allocation();
        assert!(largest <= 16 << 20, "reading a {}-byte WAL allocated {largest} bytes at once", bytes.len());
    });
}
