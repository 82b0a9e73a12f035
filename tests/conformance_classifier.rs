//! The published classifier/v1 conformance suite (`cortexkit-role-classifier-conformance`
//! 0.7.0) against the real broca binary under the real subc daemon (issue #31).
//!
//! `make conformance-classifier` runs it (`BROCA_CONFORMANCE_CLASSIFIER=1`); a plain `cargo
//! test` says how to and runs nothing. The suite runs twice, each time on a fresh rig and a
//! fresh stand-in: first on a catalog whose only decision row is Workers AI's clef (so every
//! check goes over Workers AI's wire), then on the full catalog, where the suite's main model
//! is TypeSafe's Jev and the priced checks apply. It ends with one line per pass, counted from
//! the suite's own report, the full catalog's last:
//!
//! ```text
//! CONFORMANCE-CLASSIFIER-WORKERS-AI passed=<n> failed=<n> not_applicable=<n> verdict=<v>
//! CONFORMANCE-CLASSIFIER passed=<n> failed=<n> not_applicable=<n> verdict=<passed|passed_except_not_applicable|failed>
//! ```
//!
//! Before them, stderr names every failed check with its reason and every not-applicable check
//! with the suite's reason, and how many provider calls the stand-in received (none may lack
//! the vault's credentials); the whole report (one line per check, the suite's narrowings, the
//! verdict, per pass) is written to `conformance-classifier-report.txt` under the target's tmp
//! directory. The exit status is non-zero when any check failed.
//!
//! The pieces: `conformance_classifier/rig.rs` (the daemon process, this binary re-executed
//! with `--daemon RIG_DIR`, supervising broca, the vault and the scope authority),
//! `catalog.rs` (the seeded catalog and the models it serves), `route.rs` (the scoped
//! classifier route), `subject.rs` (the suite's subject over broca-mock's classifier stand-in).

#[path = "conformance_classifier/catalog.rs"]
mod catalog;
#[path = "conformance/process.rs"]
mod process;
#[path = "conformance_classifier/rig.rs"]
mod rig;
#[path = "conformance_classifier/route.rs"]
mod route;
#[path = "conformance_classifier/subject.rs"]
mod subject;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use broca_mock::mock::MockServer;
use catalog::Rows;
use cortexkit_role_classifier_conformance::{
    run_suite, CheckOutcome, ClassifierRoute, Reply, SuiteReport, SuiteVerdict,
};

/// Set by `make conformance-classifier`: without it the target only says how to run it.
const SWITCH: &str = "BROCA_CONFORMANCE_CLASSIFIER";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, dir] = args.as_slice() {
        if flag == "--daemon" {
            return rig::daemon_main(Path::new(dir));
        }
    }
    if args.iter().any(|a| a == "--list") {
        // libtest's listing protocol: this target has no libtest tests.
        return ExitCode::SUCCESS;
    }
    if std::env::var_os(SWITCH).is_none_or(|v| v.is_empty()) {
        println!("conformance-classifier: not run (set {SWITCH}=1, or run `make conformance-classifier`)");
        return ExitCode::SUCCESS;
    }
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("conformance-classifier: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("conformance-classifier: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The counts and the verdict's name, from the suite's report.
fn counts(report: &SuiteReport) -> String {
    let count = |f: fn(&CheckOutcome) -> bool| report.checks.iter().filter(|c| f(&c.outcome)).count();
    let verdict = match report.verdict {
        SuiteVerdict::Passed => "passed",
        SuiteVerdict::PassedExceptNotApplicable { .. } => "passed_except_not_applicable",
        SuiteVerdict::Failed { .. } => "failed",
    };
    format!(
        "passed={} failed={} not_applicable={} verdict={verdict}",
        count(|o| matches!(o, CheckOutcome::Passed)),
        count(|o| matches!(o, CheckOutcome::Failed { .. })),
        count(|o| matches!(o, CheckOutcome::NotApplicable { .. })),
    )
}

/// What one pass found: the suite's report and the stand-in's credential audit.
struct Pass {
    rows: Rows,
    report: SuiteReport,
    audit: Vec<subject::Audit>,
}

impl Pass {
    fn passed(&self) -> bool {
        !matches!(self.report.verdict, SuiteVerdict::Failed { .. }) && self.audit.iter().all(|a| a.uncredentialed == 0)
    }
}

/// One whole suite run on a fresh rig whose catalog states `rows`, with a stand-in of its own.
async fn pass(rows: Rows, root: &Path) -> Result<Pass, String> {
    let mock = Arc::new(MockServer::start("127.0.0.1:0").map_err(|e| format!("the stand-in provider: {e}"))?);
    let broca = env!("CARGO_BIN_EXE_broca");
    let config = rig::RigConfig {
        broca: std::fs::canonicalize(broca).map_err(|e| format!("{broca}: {e}"))?,
        broca_mock: broca_mock::exe(),
        provider_url: mock.url(),
    };
    let mut rig = rig::Rig::start(&config, rows, root).await?;
    let consumer = rig.consumer().ok_or("the rig has no consumer connection")?;
    let subject = subject::Subject::new(consumer, Arc::clone(&mock), rows);
    // What broca describes on the scoped route, for the record (the suite checks it).
    let probe = subject.open().await.map_err(|e| format!("{e}{}", rig.tail()))?;
    let name = rows.name();
    match probe.request("role.describe", "{}").await {
        Ok(Reply::Response(text)) => eprintln!("conformance-classifier [{name}]: role.describe {text}"),
        Ok(Reply::Error(body)) => {
            eprintln!("conformance-classifier [{name}]: role.describe refused {}: {}", body.code, body.message)
        }
        Err(e) => return Err(format!("role.describe: {}{}", e.message, rig.tail())),
    }
    let report = run_suite(&subject).await;
    let audit = subject.credential_audit();
    rig.stop();
    Ok(Pass { rows, report, audit })
}

async fn run() -> Result<bool, String> {
    let started = Instant::now();
    // The runs' state roots and rig logs live under the target's tmp directory; a failed run's
    // are kept there for whoever fixes it, until the next run starts.
    let runs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-classifier-runs");
    if runs.exists() {
        std::fs::remove_dir_all(&runs).map_err(|e| format!("clearing {}: {e}", runs.display()))?;
    }
    std::fs::create_dir_all(&runs).map_err(|e| format!("{}: {e}", runs.display()))?;
    let base = tempfile::Builder::new().prefix("run-").tempdir_in(&runs).map_err(|e| format!("a work dir: {e}"))?;
    let mut passes = Vec::new();
    for (i, rows) in [Rows::ClefOnly, Rows::Both].into_iter().enumerate() {
        passes.push(pass(rows, &base.path().join(format!("pass-{}", i + 1))).await?);
    }
    let elapsed = started.elapsed();

    let mut text = String::new();
    for p in &passes {
        text.push_str(&format!("# catalog: {}\n{}\n", p.rows.name(), p.report.render()));
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-classifier-report.txt");
    match std::fs::write(&out, text) {
        Ok(()) => eprintln!("conformance-classifier: the full report is {}", out.display()),
        Err(e) => eprintln!("conformance-classifier: cannot write {}: {e}", out.display()),
    }
    for p in &passes {
        let name = p.rows.name();
        for a in &p.audit {
            eprintln!(
                "conformance-classifier [{name}]: the stand-in received {} {} calls, {} without the vault's credentials",
                a.calls, a.provider, a.uncredentialed
            );
        }
        for check in &p.report.checks {
            match &check.outcome {
                CheckOutcome::Failed { reason } => eprintln!("FAIL [{name}] {}: {reason}", check.check),
                CheckOutcome::NotApplicable { reason } => eprintln!("N/A  [{name}] {}: {reason}", check.check),
                CheckOutcome::Passed => {}
            }
        }
    }
    let checks: usize = passes.iter().map(|p| p.report.checks.len()).sum();
    eprintln!("conformance-classifier: {checks} checks in {} passes in {:.0?}", passes.len(), elapsed);
    let passed = passes.iter().all(Pass::passed);
    if passes.iter().any(|p| p.audit.iter().any(|a| a.uncredentialed > 0)) {
        eprintln!("conformance-classifier: provider calls without the vault's credentials fail the run");
    }
    if !passed {
        let kept = base.keep();
        eprintln!("conformance-classifier: the rigs' logs are kept under {}", kept.display());
    }
    // The catalog as broca ships it last: its line is the run's, the other pass's before it.
    for p in &passes {
        match p.rows {
            Rows::Both => println!("CONFORMANCE-CLASSIFIER {}", counts(&p.report)),
            other => println!("CONFORMANCE-CLASSIFIER-{} {}", other.name().to_uppercase(), counts(&p.report)),
        }
    }
    Ok(passed)
}
