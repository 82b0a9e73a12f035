//! The live smoke test: one `broca-run` turn on a real provider, through a real subc daemon,
//! with a dev-tools handle (spec §1b, `catalog-and-vault.md` Part E.2). It runs only with
//! `BROCA_LIVE_TESTS=1` (checked before any handle is loaded or credential read); otherwise it
//! passes as skipped, saying so. `BROCA_LIVE_TESTS=1 make live` runs it.
//!
//! - the daemon: the connection file `BROCA_LIVE_SUBC` or `SUBC_SOCKET` names (its claustrum
//!   holds the credential, its fusiform serves the catalog);
//! - the handle: `BROCA_DEVTOOLS_HANDLES` or `~/.config/cortexkit/broca/dev-tools-handles.json`;
//! - the model: `BROCA_LIVE_MODEL` (default [`DEFAULT_MODEL`]).

mod skip;

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_broca-run");
const DEFAULT_MODEL: &str = "openai/gpt-4.1-mini";

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[test]
fn one_turn_on_a_real_provider() {
    if var("BROCA_LIVE_TESTS").as_deref() != Some("1") {
        skip::skip("one_turn_on_a_real_provider", "set BROCA_LIVE_TESTS=1 to run one turn on a real provider");
        return;
    }
    let connection = var("BROCA_LIVE_SUBC")
        .or_else(|| var("SUBC_SOCKET"))
        .expect("live: BROCA_LIVE_SUBC or SUBC_SOCKET must name the subc daemon's connection file");
    let model = var("BROCA_LIVE_MODEL").unwrap_or_else(|| DEFAULT_MODEL.to_owned());
    let root = tempfile::tempdir().expect("a temp state root");
    let out = Command::new(BIN)
        .args(["--subc", &connection, "--model", &model, "--json", "--max-steps", "1"])
        .arg("--state-root")
        .arg(root.path())
        .arg("Reply with the single word: pong")
        .env_remove("BROCA_PROVIDER_BASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("broca-run starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "live turn on {model} failed\nstdout: {stdout}\nstderr: {stderr}");
    let completed = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["kind"] == "control")
        .any(|l| l["unit"]["type"] == "run_finished" && l["unit"]["reason"] == "completed");
    assert!(completed, "the turn did not finish completed: {stdout}");
    eprintln!("live: one turn on {model} completed");
}
