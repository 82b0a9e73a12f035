//! A test that cannot run on this machine says so, by name: `SKIP <test>: <why>` on stderr,
//! and the same line appended to `skips.log` in cargo's target tmp directory, which `make test`
//! prints and counts at its end (libtest hides a passing test's stderr).

use std::io::Write;

/// Reports `test` as skipped because of `why`.
#[allow(dead_code)] // not every test crate that includes this module skips
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIP {test}: {why}");
    eprintln!("{line}");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skips.log");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "{line}");
    }
}

/// Records a check's closing line (`API-SCHEMA ...`, `PROVIDER-RULES ...`): printed as it is,
/// and appended to `reports.log` beside `skips.log`, which `make test` prints above its `TESTS`
/// line (libtest hides a passing test's output).
#[allow(dead_code)] // not every test crate that includes this module reports a line
pub fn report(line: &str) {
    println!("{line}");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reports.log");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "{line}");
    }
}
