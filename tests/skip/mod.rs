//! A test that cannot run on this machine says so, by name: `SKIP <test>: <why>` on stderr,
//! and the same line appended to `skips.log` in cargo's target tmp directory, which `make test`
//! prints and counts at its end (libtest hides a passing test's stderr).

use std::io::Write;

/// Reports `test` as skipped because of `why`.
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIP {test}: {why}");
    eprintln!("{line}");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skips.log");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "{line}");
    }
}
