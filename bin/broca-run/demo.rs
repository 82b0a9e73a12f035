//! `broca-run --demo`: the scripted provider in-process on a loopback port, a temp state root
//! seeded with the testdata catalog, and one turn that streams reasoning and text and reports
//! usage. Nothing leaves the machine.

use crate::mock::{MockServer, Script};

use super::cli::Args;

/// The seeded catalog, built into the binary so the demo runs from anywhere.
const LKG: &str = include_str!("../../testdata/catalog/fusiform-lkg.json");

const DEMO_MODEL: &str = "mock/echo-messages";
const DEMO_PROMPT: &str = "What is broca, in two sentences?";

/// Keeps the demo's temp state root and mock provider alive for the turn.
pub struct Demo {
    _root: tempfile::TempDir,
    _mock: MockServer,
}

fn script() -> Script {
    let words = [
        "broca runs agentic LLM loops ",
        "for other programs, ",
        "recording every turn ",
        "in an append-only write-ahead log. ",
        "A crash loses nothing and repeats nothing: ",
        "reopen the session and the conversation is all there.",
    ];
    let mut events = vec![
        serde_json::json!({"reasoning": "The user asks what broca is. Keep it to two sentences.", "signature": "demo-signature"}),
    ];
    for w in words {
        events.push(serde_json::json!({"delay_ms": 60}));
        events.push(serde_json::json!({"text": w}));
    }
    events.push(serde_json::json!({"usage": {"input": 42, "cached": 0, "output": 51}}));
    events.push(serde_json::json!({"finish": "stop"}));
    serde_json::from_value(serde_json::json!({"responses": [{"events": events, "write": {"split_every": 9}}]}))
        .expect("the demo script decodes")
}

/// Sets up the demo and points `args` at it.
pub fn prepare(args: &mut Args) -> Result<Demo, String> {
    let root = tempfile::Builder::new().prefix("broca-demo-").tempdir().map_err(|e| e.to_string())?;
    let catalog = root.path().join("catalog");
    std::fs::create_dir_all(&catalog).map_err(|e| e.to_string())?;
    std::fs::write(catalog.join("fusiform-lkg.json"), LKG).map_err(|e| e.to_string())?;
    let mock = MockServer::start("127.0.0.1:0").map_err(|e| format!("starting the mock provider: {e}"))?;
    mock.install("default", script());
    args.state_root = Some(root.path().to_path_buf());
    args.base_url = Some(mock.base_url(None));
    args.model.get_or_insert_with(|| DEMO_MODEL.to_string());
    args.prompt.get_or_insert_with(|| DEMO_PROMPT.to_string());
    Ok(Demo { _root: root, _mock: mock })
}
