//! The live smoke test: one `broca-run` turn on a real provider, through a real subc daemon,
//! with a dev-tools handle (spec §1b, `catalog-and-vault.md` Part E.2). It runs only with
//! `BROCA_LIVE_TESTS=1` (checked before any handle is loaded or credential read); otherwise it
//! passes as skipped, saying so. `BROCA_LIVE_TESTS=1 make live` runs it.
//!
//! - the daemon: the connection file `BROCA_LIVE_SUBC` or `SUBC_SOCKET` names (its claustrum
//!   holds the credential, its fusiform serves the catalog);
//! - the handle: `BROCA_DEVTOOLS_HANDLES` or `~/.config/cortexkit/broca/dev-tools-handles.json`;
//! - the models: `BROCA_LIVE_MODEL` (one `provider/model`, optionally `@<auth method>`), else
//!   one model per wire family ([`FAMILY_MODELS`]) for which the handles file holds the
//!   credential (`<auth method>:<provider>`); a family without one is skipped by name.

mod skip;

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_broca-run");

/// One model per wire family, with the auth method that routes it there.
const FAMILY_MODELS: [(&str, &str, &str); 7] = [
    ("anthropic_messages", "anthropic/claude-sonnet-4-5", "apikey"),
    ("openai_chat", "deepseek/deepseek-chat", "apikey"),
    ("openai_responses", "openai/gpt-4.1-mini", "apikey"),
    ("openai_chatgpt_responses", "openai/gpt-5", "chatgpt"),
    ("google_generate_content", "google/gemini-2.5-flash", "apikey"),
    ("google_code_assist", "google/antigravity-gemini-3.8-flash", "antigravity"),
    ("aws_bedrock_converse", "amazon-bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0", "apikey"),
];

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
    let models: Vec<(String, String)> = match var("BROCA_LIVE_MODEL") {
        Some(m) => {
            let (model, auth) = m.split_once('@').unwrap_or((&m, "apikey"));
            vec![(model.to_owned(), auth.to_owned())]
        }
        None => with_handles(),
    };
    assert!(!models.is_empty(), "live: the handles file holds no credential of any family's model");
    for (model, auth) in models {
        one_turn(&connection, &model, &auth);
    }
}

/// The families' models whose credential has a dev-tools handle; the others are skipped by name.
fn with_handles() -> Vec<(String, String)> {
    let path = broca::vault::handles::devtools_handles_path(|k| std::env::var(k).ok()).expect("a handles path");
    let handles = broca::vault::handles::load(&path).handles;
    let mut out = Vec::new();
    for (family, model, auth) in FAMILY_MODELS {
        let provider = model.split_once('/').map_or(model, |(p, _)| p);
        if handles.get(&format!("{auth}:{provider}")).is_some() {
            out.push((model.to_owned(), auth.to_owned()));
        } else {
            eprintln!("SKIP live.{family}: no dev-tools handle for {auth}:{provider} in {}", path.display());
        }
    }
    out
}

fn one_turn(connection: &str, model: &str, auth: &str) {
    let root = tempfile::tempdir().expect("a temp state root");
    let out = Command::new(BIN)
        .args(["--subc", connection, "--model", model, "--auth-method", auth, "--json", "--max-steps", "1"])
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
