//! `broca-run --demo`: a scripted model in-process (no socket: [`ScriptedClient`]), a temp
//! state root seeded with the testdata catalog, and one turn that streams reasoning and text
//! and reports usage. Nothing leaves the machine.

use std::time::Duration;

use broca::message::StepUsage;
use broca::provider::event::StreamEvent;
use broca::provider::scripted::{ScriptedClient, Step};

use super::cli::Args;

/// The seeded catalog, built into the binary so the demo runs from anywhere.
const LKG: &str = include_str!("../../testdata/catalog/fusiform-lkg.json");

const DEMO_MODEL: &str = "mock/echo-messages";
const DEMO_PROMPT: &str = "What is broca, in two sentences?";
const SCRIPTED_URL: &str = "scripted://broca-run-demo/v1";

/// Keeps the demo's temp state root alive for the turn, and answers its model.
pub struct Demo {
    _root: tempfile::TempDir,
    pub client: ScriptedClient,
}

/// The demo's one answer: reasoning with its signature, text word by word, usage, a finish.
fn response() -> Vec<Step> {
    let words = [
        "broca runs agentic LLM loops ",
        "for other programs, ",
        "recording every turn ",
        "in an append-only write-ahead log. ",
        "A crash loses nothing and repeats nothing: ",
        "reopen the session and the conversation is all there.",
    ];
    let reasoning = "The user asks what broca is. Keep it to two sentences.";
    let mut steps = vec![
        Step::Event(StreamEvent::ReasoningDelta { text: reasoning.into() }),
        Step::Event(StreamEvent::ReasoningSignature { signature: "demo-signature".into() }),
    ];
    for w in words {
        steps.push(Step::Pause(Duration::from_millis(60)));
        steps.push(Step::Event(StreamEvent::TextDelta { text: w.into() }));
    }
    let usage = StepUsage {
        input_tokens: Some(42),
        cached_input_tokens: Some(0),
        output_tokens: Some(51),
        ..StepUsage::default()
    };
    steps.push(Step::Event(StreamEvent::Usage { usage }));
    steps.push(Step::Event(StreamEvent::Finish { reason: "stop".into(), raw: "end_turn".into() }));
    steps
}

/// Sets up the demo and points `args` at it.
pub fn prepare(args: &mut Args) -> Result<Demo, String> {
    let root = tempfile::Builder::new().prefix("broca-demo-").tempdir().map_err(|e| e.to_string())?;
    let catalog = root.path().join("catalog");
    std::fs::create_dir_all(&catalog).map_err(|e| e.to_string())?;
    std::fs::write(catalog.join("fusiform-lkg.json"), LKG).map_err(|e| e.to_string())?;
    let client = ScriptedClient::new([response()]).map_err(|_| "the demo script is too long".to_string())?;
    args.state_root = Some(root.path().to_path_buf());
    // The route is mocked (credential-free); its URL names the scripted client, never dialled.
    args.base_url = Some(SCRIPTED_URL.to_string());
    args.model.get_or_insert_with(|| DEMO_MODEL.to_string());
    args.prompt.get_or_insert_with(|| DEMO_PROMPT.to_string());
    Ok(Demo { _root: root, client })
}
