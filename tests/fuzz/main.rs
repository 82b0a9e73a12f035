//! Structure-aware fuzzing on the stable toolchain: every decoder of untrusted bytes broca has —
//! the subc frame decoder, the connection file and the handshake, the WAL reader, the three SSE
//! decoders, `session.send` and every strict op's params, the catalog pages and LKG — fed
//! inputs made by mutating real ones (the published frame vectors, the golden WALs, the recorded
//! SSE transcripts, the op goldens' requests, the seeded LKG). Each target asserts that nothing
//! panics and that every failure is the decoder's typed error (a refusal with its code and
//! `detail.field`), never a silent acceptance of what the decoder must refuse.
//!
//! A target runs for `BROCA_FUZZ_SECS` seconds (default 2; `make fuzz` runs longer) from the
//! seed `BROCA_FUZZ_SEED` (default [`DEFAULT_SEED`]). Case `k` of a target draws from its own
//! generator seeded by (seed, target, k), so a failure printed as `FUZZ-FAIL <target>
//! seed=<s> case=<k>` replays alone with `BROCA_FUZZ_SEED=<s> BROCA_FUZZ_CASE=<k>`. Each
//! target prints `FUZZ <target> seed=<s> cases=<n> panics=<n> secs=<t>` (see `--nocapture`).
//!
//! Sweeps (every byte and every truncation point of the golden WALs) visit positions in a
//! spread order within the budget; `BROCA_FUZZ_SWEEP=full` visits all of them.

mod catalog;
mod eventstream;
mod gen;
mod moves;
mod ops;
mod sse;
mod subc;
mod wal;

// The in-process rig and broca-mock, as the ops tests use them.
#[path = "../inproc/mod.rs"]
mod inproc;
use broca_mock::mock;

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

pub use gen::Gen;

/// The largest single allocation made since [`take_largest_allocation`] last looked: no
/// decoder may allocate in proportion to a length an input merely declares.
static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, noting the largest request.
struct Noting;

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Noting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Noting = Noting;

/// The largest allocation since the last call (and resets it).
pub fn take_largest_allocation() -> usize {
    LARGEST_ALLOCATION.swap(0, Ordering::Relaxed)
}

/// The seed when `BROCA_FUZZ_SEED` is not set (fixed, so `make test` is reproducible).
pub const DEFAULT_SEED: u64 = 0x0b5c_a0f2_2026_0014;
/// Seconds per target when `BROCA_FUZZ_SECS` is not set.
pub const DEFAULT_SECS: f64 = 2.0;
/// Failing cases a target reports before it stops (the first one is what matters).
const MAX_FAILURES: usize = 3;

fn seed() -> u64 {
    match std::env::var("BROCA_FUZZ_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("BROCA_FUZZ_SEED={s:?} is not a u64"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

fn budget() -> Duration {
    let secs = std::env::var("BROCA_FUZZ_SECS").ok().and_then(|s| s.trim().parse::<f64>().ok());
    Duration::from_secs_f64(secs.filter(|s| s.is_finite() && *s >= 0.0).unwrap_or(DEFAULT_SECS))
}

/// The one case to replay (`BROCA_FUZZ_CASE`), if any.
fn only_case() -> Option<u64> {
    std::env::var("BROCA_FUZZ_CASE").ok().and_then(|s| s.trim().parse().ok())
}

/// FNV-1a of a target's name: its generators differ from every other target's.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Panics on threads other than the targets' own (an actor, a store writer, a worker), counted
/// by a hook installed before the first case: a case fails when the count moved, even if the
/// panic was on a thread the case never joined (with targets running in parallel, such a panic
/// may be blamed on a neighbour's case; its message names its thread).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A panic on a target's own thread is caught and attributed by `catch_unwind`;
            // any other thread's (named by broca, or unnamed) is counted here.
            if !std::thread::current().name().is_some_and(|n| n.contains("::fuzz_")) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// No case may make a single allocation larger than this: every input is far smaller, so a
/// larger one is a buffer sized by a length the input only declares.
pub const MAX_CASE_ALLOCATION: usize = 32 << 20;

/// Runs `case` and says whether it failed: it panicked, something else panicked meanwhile, or
/// something allocated more than [`MAX_CASE_ALLOCATION`] at once.
fn case_failed(case: impl FnOnce()) -> bool {
    count_panics();
    let before = PANICS.load(Ordering::SeqCst);
    take_largest_allocation();
    let failed = catch_unwind(AssertUnwindSafe(case)).is_err() || PANICS.load(Ordering::SeqCst) != before;
    let largest = take_largest_allocation();
    if largest > MAX_CASE_ALLOCATION {
        println!("FUZZ-ALLOC one allocation of {largest} bytes (limit {MAX_CASE_ALLOCATION})");
        return true;
    }
    failed
}

/// Runs `case` with a fresh generator per case until the budget is spent (at least `min_cases`
/// cases), counting cases that panic (a failed assertion is a panic). Fails the test naming
/// the first failing case so it can be replayed alone.
pub fn fuzz(target: &str, min_cases: u64, mut case: impl FnMut(&mut Gen)) {
    let seed = seed();
    let started = Instant::now();
    let budget = budget();
    let cases: Box<dyn Iterator<Item = u64>> = match only_case() {
        Some(k) => Box::new(std::iter::once(k)),
        None => Box::new(0..),
    };
    let (mut ran, mut failed) = (0u64, Vec::new());
    for k in cases {
        if only_case().is_none() && k >= min_cases && started.elapsed() >= budget {
            break;
        }
        let mut g = Gen::new(seed ^ name_hash(target), k);
        ran += 1;
        if case_failed(|| case(&mut g)) {
            println!(
                "FUZZ-FAIL {target} seed={seed:#x} case={k}: replay with BROCA_FUZZ_SEED={seed:#x} BROCA_FUZZ_CASE={k}"
            );
            failed.push(k);
            if failed.len() >= MAX_FAILURES {
                break;
            }
        }
    }
    report(target, seed, ran, failed.len(), started.elapsed());
    assert!(failed.is_empty(), "{target}: cases {failed:?} failed (seed {seed:#x}); see FUZZ-FAIL lines above");
}

/// A deterministic sweep (every byte, every cut) over positions `0..n`, visited in a spread
/// order (a stride coprime with `n`) so that a budgeted run samples the whole input: it stops
/// once `share` of the budget is spent (after at least 64 positions), unless
/// `BROCA_FUZZ_SWEEP=full` asks for every position. Same failure accounting as [`fuzz`];
/// `BROCA_FUZZ_CASE=<position>` replays one position.
pub fn sweep(target: &str, n: usize, share: f64, mut case: impl FnMut(usize)) {
    let started = Instant::now();
    let full = std::env::var("BROCA_FUZZ_SWEEP").is_ok_and(|v| v == "full");
    let budget = budget().mul_f64(share);
    let stride = (7919..).step_by(2).find(|p| gcd(*p, n.max(1)) == 1).unwrap_or(1);
    let positions: Box<dyn Iterator<Item = usize>> = match only_case() {
        Some(k) => Box::new(std::iter::once(k as usize)),
        None => Box::new((0..n).map(|k| (k * stride) % n)),
    };
    let (mut ran, mut failed) = (0usize, Vec::new());
    for i in positions {
        if !full && only_case().is_none() && ran >= 64 && started.elapsed() >= budget {
            break;
        }
        ran += 1;
        if case_failed(|| case(i)) {
            println!("FUZZ-FAIL {target} position={i}: replay with BROCA_FUZZ_CASE={i}");
            failed.push(i);
            if failed.len() >= MAX_FAILURES {
                break;
            }
        }
    }
    report(&format!("{target} positions={n}"), seed(), ran as u64, failed.len(), started.elapsed());
    assert!(failed.is_empty(), "{target}: positions {failed:?} failed; see FUZZ-FAIL lines above");
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A temp directory for inputs a target writes per case: on tmpfs when the host has one (the
/// readers are what is fuzzed, not the disk), else the default temp dir.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("a temp dir")
}

fn report(target: &str, seed: u64, cases: u64, panics: usize, took: Duration) {
    let secs = took.as_secs_f64();
    let rate = if secs > 0.0 { cases as f64 / secs } else { 0.0 };
    println!("FUZZ {target} seed={seed:#x} cases={cases} panics={panics} secs={secs:.2} cases_per_sec={rate:.0}");
}

pub fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

/// The files under `testdata/<dir>` whose names end with `suffix`, sorted, with their bytes.
pub fn corpus(dir: &str, suffix: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(testdata().join(dir))
        .unwrap_or_else(|e| panic!("testdata/{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(suffix)))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no testdata/{dir}/*{suffix}");
    out
}
