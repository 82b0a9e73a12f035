//! `archive-bench`: a month in a minute, behind `make bench`. [`sessions`] sessions of a few
//! turns each (text that compresses like prose, a tool call per turn) are written into a fresh
//! state root, aged on the clock seam (a `ManualClock` a month ahead), folded, and read back.
//! Prints `BENCH <name> <value> <unit>`; nothing is asserted.
//!
//! - `archive.bytes_ratio`: container bytes / live WAL bytes over every session.
//! - `archive.fold_mb_per_s`: live WAL megabytes folded per second (one sweep over all).
//! - `archive.read_ms_p99` / `_p50`: `session.read`'s first page of a folded session (the read
//!   unfolds it), over [`reads`] sessions.
//! - `archive.boot_ms.live` / `archive.boot_ms.folded`: opening the module core over the state
//!   root (store, catalog, recovery, the fold tidy) with every session live, then folded.
//! - `archive.raw_fsync_us`: the disk's floor, for reading the rest.

use broca_mock::mock;
#[path = "../inproc/mod.rs"]
mod inproc;
#[path = "../bench/quick.rs"]
mod quick;

use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::clock::ManualClock;
use broca::lineage::fold::{self, FoldPolicy, Folded};
use broca::lineage::Shared;
use broca::record::{FinishReason, Record};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca_testkit as testkit;
use serde_json::json;

fn sessions() -> usize {
    quick::n(10_000, 50)
}
const TURNS: u64 = 3;
fn reads() -> usize {
    quick::n(300, 10)
}

const WORDS: [&str; 24] = [
    "the", "session", "reads", "a", "file", "and", "writes", "its", "summary", "of", "changes", "to", "module",
    "tests", "pass", "after", "refactor", "while", "durable", "logs", "record", "each", "step", "broca",
];

fn text(seed: &mut u64, words: usize) -> String {
    let mut out = String::with_capacity(words * 7);
    for _ in 0..words {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        out.push_str(WORDS[(*seed % WORDS.len() as u64) as usize]);
        out.push(if seed.is_multiple_of(11) { '.' } else { ' ' });
    }
    out
}

fn key(i: usize) -> SessionKey {
    SessionKey::new("/tmp", "archive-bench", &format!("s{i}"))
}

fn main() {
    let base = std::env::var_os("BROCA_BENCH_DIR").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new().prefix("barch").tempdir_in(&base).expect("a bench directory");
    let root = dir.path().to_path_buf();
    println!("BENCH archive.raw_fsync_us {:.1} us", testkit::raw_fsync_p50_us(&root, 200));
    let clock = Arc::new(ManualClock::now());
    let shared = Arc::new(
        Shared::open_clocked(
            StateRoot::at(&root).expect("a state root"),
            Arc::new(broca::wal::FileStorage),
            clock.clone(),
        )
        .expect("the state root opens"),
    );
    let written = Instant::now();
    std::thread::scope(|scope| {
        for lane in 0..2 {
            let shared = Arc::clone(&shared);
            scope.spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ lane as u64;
                for i in (lane..sessions()).step_by(2) {
                    let mut lineage = shared.open_lineage(&key(i)).expect("a lineage");
                    for turn in 0..TURNS {
                        let run = format!("run-{i}-{turn}");
                        let mut append = |r: Record| lineage.append(&r).expect("an append");
                        append(testkit::run_started(&run, None, &text(&mut seed, 40)));
                        append(testkit::step_started(&run, 1));
                        append(testkit::model_step(&run, 1, &text(&mut seed, 30), &[("c1", "read_file")]));
                        append(testkit::intent(&run, 1, "c1", "read_file"));
                        append(testkit::tool_result(&run, 1, "c1", &text(&mut seed, 80)));
                        append(testkit::step_started(&run, 2));
                        append(testkit::model_step(&run, 2, &text(&mut seed, 120), &[]));
                        lineage.finish_run(&run, FinishReason::Completed, None, vec![]).expect("a finish");
                    }
                    lineage.commit().expect("a commit");
                }
            });
        }
    });
    shared.settle();
    eprintln!("archive-bench: {} sessions written in {:.1} s", sessions(), written.elapsed().as_secs_f64());

    let boot_live = boot(&root);
    clock.advance(Duration::from_secs(31 * 24 * 3600));
    let policy = FoldPolicy { max_per_pass: usize::MAX, ..FoldPolicy::default() };
    let folding = Instant::now();
    let results = fold::sweep(&shared, &policy);
    let took = folding.elapsed().as_secs_f64();
    let (mut wal, mut sealed, mut n) = (0u64, 0u64, 0usize);
    for r in &results {
        if let Ok(Folded::Sealed { wal_bytes, container_bytes }) = r {
            wal += wal_bytes;
            sealed += container_bytes;
            n += 1;
        }
    }
    eprintln!("archive-bench: {n} of {} folded, {wal} WAL bytes into {sealed}", sessions());
    println!("BENCH archive.sessions_folded {n} sessions");
    println!("BENCH archive.bytes_ratio {:.3} ratio", sealed as f64 / wal.max(1) as f64);
    println!("BENCH archive.fold_mb_per_s {:.1} MB/s", wal as f64 / 1e6 / took);
    drop(shared);
    let boot_folded = boot(&root);
    println!("BENCH archive.boot_ms.live {boot_live:.1} ms");
    println!("BENCH archive.boot_ms.folded {boot_folded:.1} ms");

    let ops = inproc::ops_over(&root, "http://127.0.0.1:9".into(), Duration::from_secs(30));
    let mut reads: Vec<f64> = (0..reads())
        .map(|r| {
            let k = key(r * (sessions() / reads()));
            let (tx, rx) = crossbeam_channel::bounded(1);
            let t = Instant::now();
            ops.handle(&k, "session.read", json!({"limit": 20}), Box::new(move |a| tx.send(a).unwrap()));
            let page = rx.recv().expect("an answer").expect("a page");
            assert!(!page["messages"].as_array().expect("messages").is_empty());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    reads.sort_by(f64::total_cmp);
    println!("BENCH archive.read_ms_p50 {:.2} ms", reads[reads.len() / 2]);
    println!("BENCH archive.read_ms_p99 {:.2} ms", reads[(reads.len() - 1) * 99 / 100]);
}

/// Opening the module core over `root` and recovering it: the median of five, milliseconds.
fn boot(root: &std::path::Path) -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let ops = inproc::ops_over(root, "http://127.0.0.1:9".into(), Duration::from_secs(30));
            ops.registry.recover();
            fold::tidy(ops.registry.shared());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}
