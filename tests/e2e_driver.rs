//! The driver surface through the real subc daemon: one harness ([`support::Harness`]: the
//! daemon in process, the real broca binary, broca-mock, the consumer SDK) and a list of
//! scenarios run one after another on it.
//!
//! One test fn, because stopping the in-process daemon means SIGTERM to this process. To add a
//! scenario: write `fn my_scenario(h: &Harness)` using its own session id (or `h.unique(..)`)
//! and append it to [`SCENARIOS`]. Every wait is bounded.

mod support;

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use serde_json::json;
use support::{send_params, Harness};

/// The bind harness of every scenario's sessions.
const HARNESS: &str = "driver-e2e";

/// A named scenario: it runs against the shared harness and panics on a failed check.
type Scenario = (&'static str, fn(&Harness));

/// Run in order, on one harness; each prints its name before it runs.
const SCENARIOS: &[Scenario] = &[
    ("idle send starts a run that completes", idle_send_runs_to_completion),
    ("removed ops answer unknown_method and write nothing", removed_ops_are_unknown),
    ("sessions bind their project root and harness", sessions_bind_root_and_harness),
];

/// An idle `session.send` answers `{state: "active", run_id}`; `run.status` reaches `completed`.
fn idle_send_runs_to_completion(h: &Harness) {
    let s = h.session(HARNESS, "idle-send", None);
    let reply = s.ok("session.send", send_params("Hello?"));
    assert_eq!(reply["state"], "active", "{reply}");
    let run_id = reply["run_id"].as_str().unwrap_or_else(|| panic!("a run_id: {reply}"));
    s.wait_run(run_id, "completed");
}

/// `cap.install`, `spend.delta` and `usage.export` are gone: each is `unknown_method`, and the
/// session's WAL was never created.
fn removed_ops_are_unknown(h: &Harness) {
    let s = h.session(HARNESS, "removed-ops", None);
    for method in ["cap.install", "spend.delta", "usage.export"] {
        let (code, body) = s.refused(method, json!({}));
        assert_eq!(code, "unknown_method", "{method}: {body}");
    }
    assert!(!s.wal_path().exists(), "a refused op wrote {}", s.wal_path().display());
}

/// The harness itself: one `{harness, session}` under two project roots (relayed connections),
/// under root `/` and under another harness name are four sessions with four WALs, each at the
/// address `broca session ROOT HARNESS SESSION` prints; a second connection reaches the same
/// session as the first.
fn sessions_bind_root_and_harness(h: &Harness) {
    let (a, b) = (h.project_dir("alpha"), h.project_dir("beta"));
    let sessions = [
        h.session(HARNESS, "rooted", Some(&a)),
        h.session(HARNESS, "rooted", Some(&b)),
        h.session(HARNESS, "rooted", None),
        h.session("driver-e2e-other", "rooted", None),
    ];
    let mut wals = Vec::new();
    for s in &sessions {
        let reply = s.send(&format!("Where is {}?", s.project_root()));
        s.wait_run(reply["run_id"].as_str().unwrap(), "completed");
        let printed = std::process::Command::new(env!("CARGO_BIN_EXE_broca"))
            .args(["session", s.project_root(), &s.harness, &s.id])
            .env("BROCA_STATE_ROOT", h.state_root())
            .output()
            .unwrap();
        let printed: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
        assert_eq!(printed["wal"], json!(s.wal_path()), "{printed}");
        assert!(s.wal_path().exists(), "{}", s.wal_path().display());
        let page = s.ok("session.read", json!({}));
        assert_eq!(page["messages"].as_array().map(Vec::len), Some(2), "one turn per session: {page}");
        wals.push(s.wal_path());
    }
    wals.sort();
    wals.dedup();
    assert_eq!(wals.len(), sessions.len(), "four distinct sessions");
    assert_eq!(sessions[0].project_root(), a.to_str().unwrap());
    let again = h.connect().session(HARNESS, "rooted");
    assert_eq!(again.ok("session.read", json!({}))["messages"], sessions[2].ok("session.read", json!({}))["messages"]);
    assert!(h.broca_pid().is_some(), "broca runs as this process's child");
}

#[test]
fn driver_surface() {
    let h = Harness::start();
    for (name, scenario) in SCENARIOS {
        eprintln!("scenario: {name}");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| scenario(&h))) {
            eprintln!("scenario failed: {name}");
            resume_unwind(panic);
        }
    }
    h.stop();
    let exit = h.last_exit().unwrap_or_else(|| panic!("no exit of broca in the journal: {:?}", h.journal()));
    assert_eq!(exit["exit_code"], 0, "{exit}\nbroca's log:\n{}", h.broca_log());
    assert_eq!(exit["disposition"], "daemon_shutdown", "{exit}");
}
