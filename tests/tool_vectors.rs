//! The published `cortexkit-role-tool-provider` 0.15.0 test vectors that apply to a consumer,
//! run through broca's own code (`vectors::FILES`, the `test-vectors` feature of the role crate,
//! a dev-dependency): the vectors' bytes are the crate's, every check goes through the function
//! broca itself calls on that path.
//!
//! | vector file | broca's path |
//! |---|---|
//! | `schema-pin.json` | [`fetch::spec`]: the pin broca freezes with a fetched tool and sends on every call |
//! | `composition-digest.json` | [`broca::wire::plan::digest`], and [`broca::wire::plan::decode`]'s `composition_digest` check |
//! | `reply-deadline.json` | a fetched tool ([`fetch::check_catalog`], [`fetch::spec`]) frozen in a run's config, driven through the agent loop ([`agent::drive`]) with broca-mock as the model; the wait broca gives the call ([`ToolCall::wait`]) is what the vector expects |
//! | `model-visible-size.json` | [`output::answered`]: a provider's body as the call's result, oversize → `tool_result_too_large` |
//! | `reply-shape.json` | [`output::answered`] (bare answers) and [`output::refused`] (refusal bodies) |
//! | `catalog-answers.json` | decoded as broca's fetch decodes a `tool.catalog` answer (the crate's [`CatalogAnswer`]), then [`fetch::check_catalog`] and [`fetch::spec`] |
//!
//! Deviations, by case:
//!
//! - `schema-pin` `refused`: broca never decodes a pin (it sends the one it froze, verbatim; the
//!   provider parses it). Each refused string is checked not to be anything [`fetch::spec`]
//!   produces from its own components, and that the crate's parser (the provider's) refuses it.
//!   For `too long`, broca freezes the tool **without** a pin (calls go unpinned) rather than
//!   refusing the catalog.
//! - `model-visible-size` `results`: not applicable. These are `tool-result/v1` replies, and
//!   broca's consumer declares no `tool-result/v1` on its binds, so every body it receives is a
//!   legacy body (a `tool-result/v1`-shaped object would be counted by its JCS length). Only
//!   `legacy` and `boundary` run. broca reports no size for results within the limit, so a
//!   `legacy` case's exact byte count is checked by padding the body to one byte past the
//!   limit (then just to the limit) and reading the `bytes` of the `tool_result_too_large`
//!   detail.
//! - `reply-shape` `replies`: broca sends no `tool.withdraw`. The case's body is checked as a
//!   tool call's bare answer: kept whole as the result's JSON, never unwrapped from `result`.
//! - `reply-deadline` `valid` / `invalid` / `malformed`: checked at catalog time (broca refuses
//!   an invalid declaration as `plan_stale` and cannot decode a malformed one), so no call is
//!   made for them.
//! - `catalog-answers` `full`: the unknown `future_member` is dropped by the decoder (the
//!   crate's types), so broca freezes nothing of it.

use broca_mock::mock;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca::agent::{self, Cancel, LoopOptions, ToolCall, ToolDispatcher, ToolOutcome, ToolOutput};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::lineage::Shared;
use broca::message::Message;
use broca::provider::client::HttpClient;
use broca::provider::config::RenderConfig;
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::tools::{fetch, output};
use broca::wire::plan::{self, ToolItem};
use cortexkit_role_tool_provider::call::SchemaPin;
use cortexkit_role_tool_provider::catalog::{CatalogAnswer, CatalogTool};
use cortexkit_role_tool_provider::vectors;
use mock::{MockServer, Script};
use serde_json::{json, Map, Value};
use subc_protocol::ErrorBody;

const MODULE: &str = "vector-tools";

fn load(name: &str) -> Value {
    let (_, text) = vectors::FILES
        .iter()
        .find(|(file, _)| *file == name)
        .unwrap_or_else(|| panic!("{name} is not among the crate's vector files"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn item() -> ToolItem {
    ToolItem { provider: MODULE.into(), preset: None, params: Map::new(), optional: false, output_refs: false }
}

fn name(case: &Value) -> &str {
    case["name"].as_str().unwrap_or("<unnamed>")
}

/// A catalog answer holding one tool, as a provider would send it.
fn answer_with(tool: Value) -> Value {
    json!({"generation": "g1", "catalog_digest": "d1", "tools": [tool]})
}

// ---- schema-pin.json

#[test]
fn schema_pin_canonical_pins_are_the_ones_broca_freezes() {
    let v = load("schema-pin.json");
    let canonical = v["canonical"].as_array().unwrap();
    assert!(!canonical.is_empty());
    for case in canonical {
        let tool = CatalogTool::new(
            case["tool"].as_str().unwrap(),
            case["schema_digest"].as_str().unwrap(),
            case["semantics"].as_u64().unwrap(),
            json!({"type": "object"}),
        );
        let spec = fetch::spec(&item(), &tool);
        assert_eq!(spec.pin.as_deref(), case["pin"].as_str(), "{}", name(case));
        assert_eq!(spec.module.as_deref(), Some(MODULE), "{}", name(case));
    }
}

#[test]
fn schema_pin_refused_strings_are_never_frozen() {
    let v = load("schema-pin.json");
    let refused = v["refused"].as_array().unwrap();
    assert!(!refused.is_empty());
    for case in refused {
        let pin = case["pin"].as_str().unwrap();
        // The provider's parser refuses it…
        assert!(SchemaPin::parse(pin).is_err(), "{}: the crate's parser accepts {pin:?}", name(case));
        // …and broca, freezing a tool named by the string's own components, never sends it.
        let parts: Vec<&str> = pin.splitn(4, ':').collect();
        if let [_, tool, digest, semantics] = parts.as_slice() {
            if let Ok(semantics) = semantics.parse::<u64>() {
                let frozen =
                    fetch::spec(&item(), &CatalogTool::new(*tool, *digest, semantics, json!({"type": "object"})));
                assert_ne!(frozen.pin.as_deref(), Some(pin), "{}", name(case));
                if name(case) == "too long" {
                    assert_eq!(frozen.pin, None, "too long: the tool is frozen without a pin");
                }
            }
        }
    }
}

// ---- composition-digest.json

#[test]
fn composition_digests_are_broca_plan_digests() {
    let v = load("composition-digest.json");
    let digests = v["digests"].as_array().unwrap();
    assert!(!digests.is_empty());
    for case in digests {
        let composition = &case["composition"];
        let expected = case["composition_digest"].as_str().unwrap();
        assert_eq!(plan::digest(composition), expected, "{}", name(case));
        // A plan naming this composition with its digest is admitted; a wrong digest is not.
        let sent = json!({"tool_items": [], "composition": composition, "composition_digest": expected});
        let decoded = plan::decode(&sent).unwrap_or_else(|r| panic!("{}: {r:?}", name(case)));
        assert_eq!(decoded.composition_digest.as_deref(), Some(expected), "{}", name(case));
        let wrong = json!({"tool_items": [], "composition": composition, "composition_digest": "0".repeat(64)});
        assert!(plan::decode(&wrong).is_err(), "{}: a wrong digest was admitted", name(case));
    }
    for case in v["same_digest"].as_array().unwrap() {
        assert_eq!(plan::digest(&case["a"]), plan::digest(&case["b"]), "{}", name(case));
    }
}

// ---- reply-deadline.json

/// Records each call's wait and answers at once.
struct Waits(Mutex<Vec<(Value, Duration)>>);

impl ToolDispatcher for Waits {
    fn call(&self, call: &ToolCall, _deadline: Instant, _cancel: &Cancel) -> ToolOutcome {
        self.0.lock().unwrap().push((call.arguments.clone(), call.wait));
        ToolOutcome::Completed(ToolOutput::text("ok"))
    }
}

fn vector_tool(case: &Value, v: &Value) -> Value {
    let schema = case.get("input_schema").unwrap_or(&v["input_schema"]);
    let digest = cortexkit_role_tool_provider::catalog::schema_digest(schema).unwrap();
    let mut tool = json!({"name": "wait_for", "schema_digest": digest, "semantics": 1, "input_schema": schema});
    if !case["reply"].is_null() {
        tool["reply"] = case["reply"].clone();
    }
    tool
}

#[test]
fn reply_deadlines_are_the_waits_broca_gives_its_calls() {
    let v = load("reply-deadline.json");
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap();
    let model = MockServer::start("127.0.0.1:0").unwrap();
    let lkg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let catalog = Catalog::load_lkg(&lkg).unwrap();
    let overrides = RouteOverrides { base_url_override: Some(model.base_url(Some("rd"))), ..Default::default() };
    let request = ModelRequest { model: "mock/echo-chat".into(), ..Default::default() };
    let base: RenderConfig = route::resolve(Ok(&catalog), lkg, &request, &overrides).unwrap();
    let client = HttpClient::default();

    let deadlines = v["deadlines"].as_array().unwrap();
    assert!(!deadlines.is_empty());
    for (i, case) in deadlines.iter().enumerate() {
        // The tool as fetched: decoded, checked and frozen as broca's fetch does.
        let answer: CatalogAnswer = serde_json::from_value(answer_with(vector_tool(case, &v))).unwrap();
        fetch::check_catalog(&answer).unwrap_or_else(|e| panic!("{}: {e}", name(case)));
        let mut config = base.clone();
        config.tools = vec![fetch::spec(&item(), &answer.tools[0])];
        // broca's default wait is the runner fallback.
        let fallback = case.get("runner_fallback_ms").unwrap_or(&v["runner_fallback_ms"]).as_u64().unwrap();
        let opts = LoopOptions {
            idle_timeout: Duration::from_secs(10),
            tool_wait: Duration::from_millis(fallback),
            ..LoopOptions::default()
        };
        let arguments = serde_json::to_string(&case["arguments"]).unwrap();
        let script = json!({"responses": [
            {"events": [{"tool_call": {"id": "c1", "name": "wait_for", "arguments": arguments}}, {"finish": "tool_calls"}]},
            {"events": [{"text": "done"}, {"finish": "stop"}]},
        ]});
        model.install("rd", Script::from_json(&script.to_string()).unwrap());
        let mut lineage =
            shared.open_lineage(&SessionKey::new("/vectors", "reply-deadline", &format!("s{i}"))).unwrap();
        agent::admit(&mut lineage, "run-1", None, &config, Message::user_text("go"), None, None).unwrap();
        let waits = Arc::new(Waits(Mutex::new(Vec::new())));
        let tools: Arc<dyn ToolDispatcher> = waits.clone();
        let (_tx, rx) = crossbeam_channel::unbounded();
        agent::drive(&mut lineage, &client, &tools, &rx, &opts, &mut |_| {}).unwrap();
        let seen = waits.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{}: one call", name(case));
        assert_eq!(seen[0].0, case["arguments"], "{}: the call's arguments as the model sent them", name(case));
        let expected = Duration::from_millis(case["expected_ms"].as_u64().unwrap());
        assert_eq!(seen[0].1, expected, "{}: reply={} arguments={}", name(case), case["reply"], case["arguments"]);
        model.reset("rd");
    }
}

#[test]
fn reply_declarations_are_checked_at_catalog_time() {
    let v = load("reply-deadline.json");
    for case in v["valid"].as_array().unwrap() {
        let answer: CatalogAnswer = serde_json::from_value(answer_with(vector_tool(case, &v))).unwrap();
        assert_eq!(fetch::check_catalog(&answer), Ok(()), "{}", name(case));
    }
    for case in v["invalid"].as_array().unwrap() {
        let answer: CatalogAnswer = serde_json::from_value(answer_with(vector_tool(case, &v))).unwrap();
        let why = fetch::check_catalog(&answer).expect_err(name(case));
        let member = case["member"].as_str().unwrap();
        assert!(why.contains(member), "{}: {why:?} does not name {member}", name(case));
    }
    for case in v["malformed"].as_array().unwrap() {
        let e = serde_json::from_value::<CatalogAnswer>(answer_with(vector_tool(case, &v)))
            .expect_err(name(case))
            .to_string();
        if let Some(member) = case["member"].as_str() {
            assert!(e.contains(member), "{}: {e:?} does not name {member}", name(case));
        }
    }
}

// ---- model-visible-size.json

/// The `bytes` of a `tool_result_too_large` result, or `None` for a kept result.
fn oversize_bytes(out: &ToolOutput) -> Option<u64> {
    if !out.is_error {
        return None;
    }
    assert_eq!(out.output["code"], output::TOOL_RESULT_TOO_LARGE, "{}", out.output);
    let detail: Value = serde_json::from_str(out.output["detail"].as_str().unwrap()).unwrap();
    assert_eq!(detail["reason"], output::TOOL_RESULT_TOO_LARGE);
    detail["bytes"].as_u64()
}

fn answered(body: &Value) -> ToolOutput {
    output::answered(MODULE, &serde_json::to_vec(body).unwrap())
}

#[test]
fn model_visible_sizes_are_what_broca_measures() {
    let v = load("model-visible-size.json");
    let limit = v["limit"].as_u64().unwrap();
    assert_eq!(limit as usize, cortexkit_role_tool_provider::result::MAX_MODEL_VISIBLE_BYTES);
    let legacy = v["legacy"].as_array().unwrap();
    assert!(!legacy.is_empty());
    for case in legacy {
        let body = &case["body"];
        let bytes = case["bytes"].as_u64().unwrap();
        // Within the limit the body is the result, whole.
        let kept = answered(body);
        assert!(!kept.is_error, "{}: {}", name(case), kept.output);
        match body {
            Value::String(s) => assert_eq!(kept.output, json!({"kind": "text", "text": s}), "{}", name(case)),
            other => assert_eq!(kept.output, json!({"kind": "json", "json": other}), "{}", name(case)),
        }
        // Padded to one byte past the limit, broca reports the size the vector gives plus the
        // padding: a string counts its text ("<body><n × x>"), anything else its JCS bytes
        // (`[<body>,"<n × x>"]` is the body's bytes + n + 5).
        let padded = |over: u64| match body {
            Value::String(s) => json!(format!("{s}{}", "x".repeat((limit + over - bytes) as usize))),
            other => json!([other, "x".repeat((limit + over - bytes - 5) as usize)]),
        };
        assert_eq!(oversize_bytes(&answered(&padded(1))), Some(limit + 1), "{}", name(case));
        assert_eq!(oversize_bytes(&answered(&padded(0))), None, "{}: exactly at the limit", name(case));
    }
    for case in v["boundary"].as_array().unwrap() {
        let text = case["text_unit"].as_str().unwrap().repeat(case["repeat"].as_u64().unwrap() as usize);
        let out = answered(&json!(text));
        let over = case["over"].as_bool().unwrap();
        if over {
            assert_eq!(oversize_bytes(&out), case["bytes"].as_u64(), "{}", name(case));
            assert!(!out.output.to_string().contains(&text[..64]), "{}: nothing of the output is kept", name(case));
        } else {
            assert_eq!(oversize_bytes(&out), None, "{}", name(case));
            assert_eq!(out.output, json!({"kind": "text", "text": text}), "{}", name(case));
        }
    }
}

// ---- reply-shape.json

#[test]
fn replies_are_bare_answers_and_refusals_keep_detail_inside() {
    let v = load("reply-shape.json");
    for case in v["replies"].as_array().unwrap() {
        let out = answered(&case["body"]);
        assert!(!out.is_error, "{}", name(case));
        assert_eq!(out.output, json!({"kind": "json", "json": case["body"]}), "{}: kept whole", name(case));
    }
    for case in v["refusals"].as_array().unwrap() {
        let body: ErrorBody = serde_json::from_value(case["body"].clone()).unwrap();
        let out = output::refused(MODULE, &body);
        assert!(out.is_error, "{}", name(case));
        let expected = json!({
            "kind": "error",
            "message": case["body"]["message"],
            "module": MODULE,
            "code": case["body"]["code"],
            "detail": serde_json::to_string(&case["body"]["detail"]).unwrap(),
        });
        assert_eq!(out.output, expected, "{}", name(case));
    }
}

// ---- catalog-answers.json

#[test]
fn catalog_answers_decode_check_and_freeze() {
    let v = load("catalog-answers.json");
    let full: CatalogAnswer = serde_json::from_value(v["full"].clone()).unwrap();
    assert_eq!(fetch::check_catalog(&full), Ok(()));
    let frozen: Vec<_> = full.tools.iter().map(|t| fetch::spec(&item(), t)).collect();
    let names: Vec<&str> = frozen.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["read", "grep"]);
    for (spec, wire) in frozen.iter().zip(v["full"]["tools"].as_array().unwrap()) {
        assert_eq!(spec.input_schema, wire["input_schema"], "{}", spec.name);
        assert_eq!(spec.description, wire["description"].as_str().unwrap_or_default(), "{}", spec.name);
        let pin = SchemaPin::parse(spec.pin.as_deref().unwrap()).unwrap();
        assert_eq!(pin.tool, spec.name);
        assert_eq!(pin.schema_digest, wire["schema_digest"].as_str().unwrap());
        assert_eq!(pin.semantics, wire["semantics"].as_u64().unwrap());
        assert!(!serde_json::to_string(spec).unwrap().contains("future_member"));
    }
    let digest_only: CatalogAnswer = serde_json::from_value(v["digest_only"].clone()).unwrap();
    assert_eq!(fetch::check_catalog(&digest_only), Ok(()));
    assert_eq!(digest_only.catalog_digest, full.catalog_digest);
    assert!(digest_only.tools.is_empty());
    for case in v["refused_tools"].as_array().unwrap() {
        assert!(
            serde_json::from_value::<CatalogAnswer>(answer_with(case["tool"].clone())).is_err(),
            "{}: decoded",
            name(case)
        );
    }
    // broca's own checks on top of decoding: a name listed twice, a malformed schema digest.
    let mut twice = v["full"].clone();
    twice["tools"][1]["name"] = json!("read");
    let twice: CatalogAnswer = serde_json::from_value(twice).unwrap();
    assert!(fetch::check_catalog(&twice).unwrap_err().contains("listed twice"));
    let mut bad_digest = v["full"].clone();
    bad_digest["tools"][0]["schema_digest"] = json!("sha256:abc");
    let bad_digest: CatalogAnswer = serde_json::from_value(bad_digest).unwrap();
    assert!(fetch::check_catalog(&bad_digest).unwrap_err().contains("schema_digest"));
}
