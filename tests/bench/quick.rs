//! `BROCA_BENCH_QUICK=1` (`make bench-smoke`, which `make test` runs): every bench runs a
//! handful of rounds instead of its full size, so its code paths stay exercised and `make bench`
//! cannot break unnoticed. Its figures mean nothing then; nobody judges them.
#![allow(dead_code)]

/// Whether this run is a smoke run (`BROCA_BENCH_QUICK` set, not empty, not `0`).
pub fn on() -> bool {
    std::env::var("BROCA_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `full`, or `quick` (never more than `full`) in a smoke run.
pub fn n<T: Ord + Copy>(full: T, quick: T) -> T {
    if on() {
        quick.min(full)
    } else {
        full
    }
}
