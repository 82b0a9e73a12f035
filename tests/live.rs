//! The live test (#46): a two-step tool loop on a real provider in every wire family this
//! machine has a credential for. It runs only with `BROCA_LIVE_TESTS=1` (checked before any
//! handle is loaded or credential read); otherwise it passes as skipped, saying so.
//! `BROCA_LIVE_TESTS=1 make live` runs it.
//!
//! - the daemon: the connection file `BROCA_LIVE_SUBC` or `SUBC_SOCKET` names (its claustrum
//!   holds the credentials, its fusiform serves the catalog);
//! - the credentials: dev-tools handles, `BROCA_DEVTOOLS_HANDLES` or
//!   `~/.config/cortexkit/broca/dev-tools-handles.json` (`<auth method>:<provider>`);
//! - the models: `BROCA_LIVE_MODEL` (one `provider/model`, optionally `@<auth method>`), else
//!   one model per wire family ([`FAMILY_MODELS`]) whose credential has a handle; a family
//!   without one is skipped by name. `BROCA_LIVE_CODE_ASSIST_PROJECT` (or
//!   `GOOGLE_CLOUD_PROJECT`) names a Workspace account's Code Assist project.
//!
//! Each loop runs in-process on the real HTTP client, with the catalog fetched through the
//! daemon: the model is asked to call `add` (a tool this test serves) and then to answer with
//! its result; the run must complete in two or more steps with the tool called and its result
//! (`1234 + 5678 = 6912`) in the answer.

mod skip;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca::agent::{self, Cancel, LoopOptions, Output, ToolCall, ToolDispatcher, ToolOutcome, ToolOutput};
use broca::catalog::route::{self, AuthMethod, ModelRequest, RouteOverrides};
use broca::catalog::{lkg, poller, Catalog};
use broca::frozen::{AuthSource, ToolSpec};
use broca::lineage::Shared;
use broca::message::Message;
use broca::provider::client::HttpClient;
use broca::record::FinishReason;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::subc::consumer::Consumer;
use broca::vault::{HandleSource, SubcVault};
use serde_json::json;

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

const PROMPT: &str = "Use the add tool to add 1234 and 5678, then reply with just the sum.";

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[test]
fn a_tool_loop_on_each_real_provider() {
    if var("BROCA_LIVE_TESTS").as_deref() != Some("1") {
        skip::skip("a_tool_loop_on_each_real_provider", "set BROCA_LIVE_TESTS=1 to run a tool loop on real providers");
        return;
    }
    let connection = var("BROCA_LIVE_SUBC")
        .or_else(|| var("SUBC_SOCKET"))
        .expect("live: BROCA_LIVE_SUBC or SUBC_SOCKET must name the subc daemon's connection file");
    let consumer = Consumer::connect(std::path::Path::new(&connection), None).expect("live: the subc daemon answers");
    let models: Vec<(String, String)> = match var("BROCA_LIVE_MODEL") {
        Some(m) => {
            let (model, auth) = m.split_once('@').unwrap_or((&m, "apikey"));
            vec![(model.to_owned(), auth.to_owned())]
        }
        None => with_handles(),
    };
    assert!(!models.is_empty(), "live: the handles file holds no credential of any family's model");
    let root = tempfile::tempdir().expect("a temp state root");
    let shared = Shared::open(StateRoot::at(root.path()).unwrap()).unwrap();
    let catalog = fetch_catalog(&consumer, &shared);
    let mut failures = Vec::new();
    for (model, auth) in models {
        match tool_loop(&consumer, &shared, &catalog, &model, &auth) {
            Ok(steps) => eprintln!("live: {model} ({auth}): a tool loop of {steps} steps completed"),
            Err(e) => failures.push(format!("{model} ({auth}): {e}")),
        }
    }
    assert!(failures.is_empty(), "live tool loops failed:\n{}", failures.join("\n"));
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

/// The catalog, fetched through the daemon's fusiform as the module's poller does.
fn fetch_catalog(consumer: &Consumer, shared: &Shared) -> Catalog {
    let path = shared.root.catalog_path();
    let poller = poller::Poller {
        source: Arc::new(consumer.clone()),
        catalog: Arc::new(parking_lot::RwLock::new(Catalog::load_lkg(&path))),
        lkg: path.clone(),
        health: Default::default(),
        interval: poller::POLL_INTERVAL,
        clock: Arc::clone(&shared.clock),
    };
    poller.poll_once().expect("live: the catalog is fetched through fusiform");
    assert!(lkg::written_at_ms(&path).is_some());
    Catalog::load_lkg(&path).expect("live: the fetched catalog loads")
}

/// Serves `add {a, b}` and counts its calls.
#[derive(Default)]
struct Adder {
    calls: Mutex<Vec<ToolCall>>,
}

impl ToolDispatcher for Adder {
    fn call(&self, call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
        self.calls.lock().unwrap().push(call.clone());
        let n = |k: &str| call.arguments.get(k).and_then(|v| v.as_f64());
        match (call.name.as_str(), n("a"), n("b")) {
            ("add", Some(a), Some(b)) => ToolOutcome::Completed(ToolOutput::text(format!("{}", a + b))),
            _ => ToolOutcome::Error(format!("add takes numbers a and b, not {}", call.arguments)),
        }
    }
}

fn add_tool() -> ToolSpec {
    serde_json::from_value(json!({
        "name": "add",
        "description": "Adds two numbers and returns the sum.",
        "input_schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                         "required": ["a", "b"], "additionalProperties": false}
    }))
    .expect("a tool spec")
}

/// One two-step loop; the number of steps it took.
fn tool_loop(consumer: &Consumer, shared: &Shared, catalog: &Catalog, model: &str, auth: &str) -> Result<u64, String> {
    let method = AuthMethod::parse(auth).ok_or_else(|| format!("unknown auth method {auth}"))?;
    let provider = model.split_once('/').map_or(model, |(p, _)| p);
    let id = route::credential_id_for(provider, method);
    let path = broca::vault::handles::devtools_handles_path(|k| std::env::var(k).ok()).expect("a handles path");
    let handles = broca::vault::handles::load(&path).handles;
    let handle = handles.get(&id).ok_or_else(|| format!("no dev-tools handle for {id}"))?;
    let credential = SubcVault::new(consumer.clone()).get_handle(handle).map_err(|e| format!("vault: {e}"))?;
    let req = ModelRequest {
        model: model.into(),
        max_output_tokens: Some(1024),
        max_steps: Some(4),
        tools: vec![add_tool()],
        ..Default::default()
    };
    let overrides = RouteOverrides {
        auth: AuthSource::Bearer,
        auth_methods: [(provider.to_owned(), method)].into(),
        ..Default::default()
    };
    let config =
        route::resolve(Ok(catalog), shared.root.catalog_path(), &req, &overrides).map_err(|e| e.refusal().message)?;
    let key = SessionKey::new("/live", "broca-live", model);
    let mut lineage = shared.open_lineage(&key).map_err(|e| e.to_string())?;
    agent::admit(&mut lineage, "run-1", None, &config, Message::user_text(PROMPT), None, None)
        .map_err(|e| e.to_string())?;
    let opts = LoopOptions {
        bearer: Some(credential.secret.expose().to_owned()),
        code_assist_project: var("BROCA_LIVE_CODE_ASSIST_PROJECT").or_else(|| var("GOOGLE_CLOUD_PROJECT")),
        idle_timeout: Duration::from_secs(120),
        ..LoopOptions::default()
    };
    let adder = Arc::new(Adder::default());
    let tools: Arc<dyn ToolDispatcher> = adder.clone();
    let (_tx, commands) = crossbeam_channel::unbounded();
    let mut answer = String::new();
    let outcome = agent::drive(&mut lineage, &HttpClient::default(), &tools, &commands, &opts, &mut |o| {
        if let Output::Display(agent::DisplayEvent::TextDelta { text, .. }) = o {
            answer.push_str(&text);
        }
    })
    .map_err(|e| e.to_string())?;
    if outcome.reason != Some(FinishReason::Completed) {
        return Err(format!("the run ended {:?} ({:?}): {:?}", outcome.reason, outcome.paused, outcome.error));
    }
    let calls = adder.calls.lock().unwrap().len();
    if calls == 0 {
        return Err(format!("the model never called the tool; it answered {answer:?}"));
    }
    if !answer.replace(',', "").contains("6912") {
        return Err(format!("the answer lacks the tool's result 6912: {answer:?}"));
    }
    Ok(lineage.state().last.as_ref().map_or(0, |e| e.step))
}
