//! The published llm-runner/v1 conformance suite (`cortexkit-role-llm-runner-conformance`
//! 0.17.0) against the real broca binary under the real subc daemon, with broca-mock as the
//! scripted model and tool provider (issue #13, "The suite in the project").
//!
//! `make conformance` runs it (`BROCA_CONFORMANCE=1`); a plain `cargo test` says how to and
//! runs nothing. It ends with one line taken from the suite's own report:
//!
//! ```text
//! CONFORMANCE passed=<n> failed=<n> skipped=<n> not_applicable=<n> real_kills=<n> held_calls=<n> verdict=<passed|failed>
//! ```
//!
//! Before it, stderr names every failed case with its message and every skipped case with the
//! capabilities it needs; the full report (one line per case, the kills, the suite's narrowings)
//! is written to `conformance-report.txt` under the target's tmp directory.
//!
//! The pieces: `conformance/rig.rs` (one daemon process per runner instance: this binary
//! re-executed with `--daemon RIG_DIR`), `route.rs` (the SDK route), `model.rs` (the scripted
//! model, keyed per session), `tools.rs` (the scripted tool provider), `kill.rs` (`kill_at` by
//! broca's fail points and a real SIGKILL), `subject.rs` (the suite's traits), `report.rs`.

use broca_mock::mock;
use broca_mock::tools::call_log;

#[allow(dead_code)]
#[path = "nats/mod.rs"]
mod nats;

#[path = "conformance/bus.rs"]
mod bus;
#[path = "conformance/decode.rs"]
mod decode;
#[path = "conformance/host.rs"]
mod host;
#[path = "conformance/kill.rs"]
mod kill;
#[path = "conformance/model.rs"]
mod model;
#[path = "conformance/process.rs"]
mod process;
#[path = "conformance/report.rs"]
mod report;
#[path = "conformance/retention.rs"]
mod retention;
#[path = "conformance/rig.rs"]
mod rig;
#[path = "conformance/route.rs"]
mod route;
#[path = "conformance/selfcheck.rs"]
mod selfcheck;
#[path = "conformance/subject.rs"]
mod subject;
#[path = "conformance/tools.rs"]
mod tools;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use cortexkit_role_llm_runner_conformance::{progress, run_suite_with, RunnerRoute, SuiteOptions};
use serde_json::{json, Value};

/// Set by `make conformance`: without it the target only says how to run it.
const SWITCH: &str = "BROCA_CONFORMANCE";
/// Runs the adapter's own check of its kills and route instead of the suite (`conformance/selfcheck.rs`).
const SELFCHECK: &str = "BROCA_CONFORMANCE_SELFCHECK";
/// Exit 0 when the suite failed for the listed deviations alone (`report::DEVIATIONS`); CI sets
/// it. The `CONFORMANCE` line still carries the suite's own verdict.
const ACCEPT_DEVIATIONS: &str = "BROCA_CONFORMANCE_ACCEPT_DEVIATIONS";
/// Groups to run as if declared (diagnostic runs only; see [`assumed_groups`]).
const ASSUME: &str = "BROCA_CONFORMANCE_ASSUME";

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
        println!("conformance: not run (set {SWITCH}=1, or run `make conformance`)");
        return ExitCode::SUCCESS;
    }
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("conformance: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(passed) => {
            if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("conformance: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config(model: &model::Model, tools: &tools::Tools, bus: Option<&bus::Bus>) -> Result<rig::RigConfig, String> {
    let canonical = |p: &str| std::fs::canonicalize(p).map_err(|e| format!("{p}: {e}"));
    Ok(rig::RigConfig {
        broca: canonical(env!("CARGO_BIN_EXE_broca"))?,
        broca_mock: broca_mock::exe(),
        model_url: model.base_url(),
        tool_script: tools.script.clone(),
        call_log: tools.call_log.clone(),
        lkg: Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json"),
        broca_jsonc: bus.map(bus::Bus::broca_jsonc),
    })
}

/// Groups to treat as declared although broca does not declare them (`BROCA_CONFORMANCE_ASSUME=
/// transcript_reads,run_ops`), for whoever is about to declare one and wants to see its cases run
/// first. A run with any prints no `CONFORMANCE` line.
fn assumed_groups() -> Result<Vec<cortexkit_role_llm_runner_conformance::Capability>, String> {
    let text = std::env::var(ASSUME).unwrap_or_default();
    text.split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(|g| {
            cortexkit_role_llm_runner_conformance::Capability::from_group(g)
                .ok_or_else(|| format!("{ASSUME}: {g:?} is not a group the suite knows"))
        })
        .collect()
}

/// broca's `role.describe`, from a throwaway instance of the real binary.
async fn describe(config: &rig::RigConfig, root: &Path) -> Result<Value, String> {
    let rig = rig::Rig::start(config, root, None).await?;
    let instance = Arc::new(subject::Instance::new(root.to_owned(), rig));
    let route = route::Route {
        instance: Arc::clone(&instance),
        identity: subc_protocol::BindIdentity::new(subject::HARNESS, "describe-probe"),
        via: None,
    };
    let reply = route.request("role.describe", json!({})).await.map_err(|e| e.message)?;
    if let Some(mut rig) = instance.take_rig() {
        rig.stop();
    }
    match reply {
        cortexkit_role_llm_runner_conformance::Reply::Response(v) => Ok(v),
        cortexkit_role_llm_runner_conformance::Reply::Error(e) => Err(format!("role.describe was refused: {e:?}")),
    }
}

async fn run() -> Result<bool, String> {
    let started = Instant::now();
    // Every run's state roots and rig logs live under the target's tmp directory; a failed run's
    // are kept there for whoever fixes it, until the next run starts.
    let runs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-runs");
    if runs.exists() {
        std::fs::remove_dir_all(&runs).map_err(|e| format!("clearing {}: {e}", runs.display()))?;
    }
    std::fs::create_dir_all(&runs).map_err(|e| format!("{}: {e}", runs.display()))?;
    let base = tempfile::Builder::new().prefix("run-").tempdir_in(&runs).map_err(|e| format!("a work dir: {e}"))?;
    let model = model::Model::start().map_err(|e| format!("the model front: {e}"))?;
    let tools = tools::Tools::create(base.path())?;
    let bus = bus::Bus::start(&runs).map(Arc::new);
    let config = config(&model, &tools, bus.as_deref())?;
    let describe = describe(&config, &base.path().join("probe")).await?;
    let (mut groups, unknown) = subject::declared_groups(&describe);
    let assumed = assumed_groups()?;
    if !assumed.is_empty() {
        let names: Vec<String> = assumed.iter().map(|c| c.name()).collect();
        eprintln!(
            "conformance: {ASSUME} adds groups broca does not declare: {}; this run says nothing about \
             broca's conformance, and its line is marked so",
            names.join(", ")
        );
        groups.extend(assumed.iter().copied());
    }
    let names: Vec<String> = groups.iter().map(|c| c.name()).collect();
    eprintln!("conformance: broca declares {}", names.join(", "));
    if !unknown.is_empty() {
        eprintln!("conformance: groups the suite does not know: {}", unknown.join(", "));
    }
    let subject = subject::Subject::new(config, model, tools, groups, bus);
    if std::env::var_os(SELFCHECK).is_some_and(|v| !v.is_empty()) {
        let ok = selfcheck::run(&subject, base.path()).await;
        if !ok {
            let kept = base.keep();
            eprintln!("conformance: the rigs' logs are kept under {}", kept.display());
        }
        return Ok(ok);
    }
    let work = base.path().join("suite");
    let options = SuiteOptions::new().with_progress(progress::stderr_lines());
    let report = run_suite_with(&subject, &work, options).await.map_err(|e| format!("the suite: {e}"))?;
    let elapsed = started.elapsed();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-report.txt");
    let summary = report::summarize(&report);
    let written = std::fs::write(&out, format!("{}\n{}", report.render(), summary.details()));
    match written {
        Ok(()) => eprintln!("conformance: the full report is {}", out.display()),
        Err(e) => eprintln!("conformance: cannot write {}: {e}", out.display()),
    }
    eprint!("{}", summary.details());
    eprintln!("conformance: {} cases in {:.0?}", report.cases.len(), elapsed);
    if !summary.passed() {
        // Keep the rigs' logs (daemon, broca, provider) for whoever fixes the failures.
        let kept = base.keep();
        eprintln!("conformance: the rigs' logs are kept under {}", kept.display());
    }
    let ledger = summary.ledger();
    if assumed.is_empty() {
        println!("{}", ledger.line());
        println!("{}", summary.line());
    } else {
        // Never the CONFORMANCE line: a reader grepping for it must not find an assumed run.
        println!("ASSUMED-GROUPS {}", summary.line());
    }
    let accept_listed = std::env::var_os(ACCEPT_DEVIATIONS).is_some_and(|v| !v.is_empty()) && assumed.is_empty();
    Ok(summary.passed() || (accept_listed && ledger.only_listed()))
}
