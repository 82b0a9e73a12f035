//! Media descriptors on `session.read` (llm-runner 0.8.0 §4.1–§4.2, issue #47), end to end: the
//! real subc daemon supervises broca (debug build, `tool-result/v1` declared on its tool routes
//! by `BROCA_TEST_DECLARE_HELD_REPLY_V1=1`) and broca-mock as a tool provider whose `shot` tool
//! answers a `tool-result/v1` body with an image; the harness's MockServer plays the model.
//!
//! - broca stores the image inside the call's `tool_result` (`{kind: "content"}`), a Chat model
//!   reads its one-line note and a Messages model the image block itself;
//! - `media: "descriptors"` serves it as a `media_ref` over the decoded bytes (size, SHA-256,
//!   the PNG header's dimensions), with no part key of its own; large arguments an `args_ref`
//!   beside the call's id and name, a large answer a top-level `text_ref` keyed like its display
//!   part; every entry carries `digest` and `part_digests` over the stored (inline) message;
//! - an inline read (the default) is unchanged, `media: "blocks"` and unknown modes are refused
//!   `invalid_params` naming `media` (pinned), and a message whose structure alone is over the
//!   descriptor budget is refused `reply_too_large` naming its ordinal (pinned).

use broca_mock::mock;
mod pin;
mod support;

use std::fs;

use base64::Engine;
use cortexkit_role_llm_runner::content_digest::{content_digest, sha256_hex};
use cortexkit_role_llm_runner::read::descriptors::PartDigest;
use cortexkit_role_llm_runner::read::ReadPage;
use cortexkit_role_llm_runner::serializer_profile::OWNED_BROCA;
use serde_json::{json, Value};
use support::{Harness, Options, Session};

const HARNESS: &str = "media-e2e";
const TOOLS: &str = "mock-tools";
/// The suite's 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+ip1sAAAAASUVORK5CYII=";
/// Over `PART_INLINE_MAX` (262,144): always described.
const LARGE: usize = 300_000;

fn png() -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(PNG).unwrap()
}

fn tools_script() -> Value {
    json!({
        "builtins": true,
        "tools": [{
            "name": "shot",
            "description": "Takes a screenshot.",
            "input_schema": {"type": "object"},
            "result_format": "tool-result/v1",
            "behaviour": {"result": {"content": [
                {"type": "text", "text": "a shot"},
                // The provider claims 9x9: descriptors read the header's 1x1.
                {"type": "image", "mimeType": "image/png", "data": PNG, "width": 9, "height": 9},
            ]}},
        }],
    })
}

fn plan_send(prompt: &str, model: &str) -> Value {
    json!({"prompt": prompt, "model": {"provider": "mock", "model": model},
           "plan": {"tool_items": [{"provider": TOOLS, "params": {}}]}})
}

/// A run that calls `shot` with a large argument and answers a large text; its last page.
fn shot_run(h: &Harness, s: &Session, model: &str) {
    let oversize = "x".repeat(LARGE);
    h.install_alone(json!({"responses": [
        {"events": [{"tool_call": {"id": "c1", "name": "shot", "arguments": {"id": "arg-id", "oversize": oversize}}},
                    {"finish": "tool_calls"}]},
        {"events": [{"text": "z".repeat(LARGE)}, {"finish": "stop"}]},
    ]}));
    let run = s.ok("session.send", plan_send("take a shot", model))["run_id"].as_str().unwrap().to_owned();
    s.wait_run(&run, "completed");
}

fn read(s: &Session, params: Value) -> ReadPage {
    serde_json::from_value(s.ok("session.read", params)).expect("a page the role crate decodes")
}

fn descriptors_are_served(h: &Harness) {
    let s = h.session(HARNESS, &h.unique("chat"), None);
    shot_run(h, &s, "echo-chat");
    // The Chat model read the image's note, never its bytes.
    let requests = h.mock.requests("default");
    let second = String::from_utf8_lossy(&requests[1].body).to_string();
    assert!(second.contains("a shot\\n[image not shown: mime=image/png 9x9]"), "{second}");
    assert!(!second.contains(PNG), "Chat takes no image in a tool message");

    let inline = read(&s, json!({"from_ordinal": 1}));
    let default = read(&s, json!({"from_ordinal": 1, "media": "inline"}));
    assert_eq!(inline.messages, default.messages, "inline is the default");
    assert!(inline.messages.iter().all(|m| m.digest.is_none() && m.part_digests.is_none()));
    let tool = inline.messages.iter().find(|m| m.message["role"] == "tool").expect("the tool message");
    assert_eq!(
        tool.message["content"][0]["output"],
        json!({"kind": "content", "content": [
            {"type": "text", "text": "a shot"},
            {"type": "image", "media_type": "image/png", "data": PNG, "width": 9, "height": 9},
        ]}),
        "broca stores what the provider sent"
    );

    let described = read(&s, json!({"from_ordinal": 1, "media": "descriptors"}));
    assert_eq!(described.messages.len(), inline.messages.len());
    for (old, new) in inline.messages.iter().zip(&described.messages) {
        assert_eq!((old.ordinal, &old.mid), (new.ordinal, &new.mid));
        new.check_descriptor_rows(OWNED_BROCA).unwrap_or_else(|e| panic!("{}: {e}", new.mid));
        let parts = old.message["content"].as_array().unwrap();
        let keys: Vec<String> = (0..parts.len()).map(|i| format!("p{i}")).collect();
        new.check_descriptors(&keys).unwrap_or_else(|e| panic!("{}: {e}", new.mid));
        assert_eq!(new.digest.as_deref(), Some(content_digest(&old.message).as_str()), "{}", new.mid);
        let rows: Vec<PartDigest> = parts.iter().zip(&keys).map(|(p, k)| PartDigest::new(k.as_str(), p)).collect();
        assert_eq!(new.part_digests.as_ref(), Some(&rows), "{}", new.mid);
    }
    let by_role = |role: &str| described.messages.iter().find(|m| m.message["role"] == role).unwrap();
    let bytes = png();
    assert_eq!(
        by_role("tool").message["content"][0],
        json!({"type": "tool_result", "tool_call_id": "c1", "is_error": false, "output": {"kind": "content", "content": [
            {"type": "text", "text": "a shot"},
            {"type": "media_ref", "kind": "image", "mime": "image/png", "byte_size": bytes.len(),
             "sha256": sha256_hex(&bytes), "width": 1, "height": 1},
        ]}})
    );
    let call = &by_role("assistant").message["content"][0];
    assert_eq!((call["tool_call_id"].as_str(), call["tool_name"].as_str()), (Some("c1"), Some("shot")), "{call}");
    assert_eq!((call["input"]["type"].as_str(), call["input"]["name"].as_str()), (Some("args_ref"), Some("shot")));
    assert!(call["input"]["byte_size"].as_u64().is_some_and(|n| n > LARGE as u64), "{call}");
    let answer = &described.messages.last().unwrap().message["content"][0];
    let text = "z".repeat(LARGE);
    assert_eq!(
        *answer,
        json!({"type": "text_ref", "part": "p0", "byte_size": LARGE, "sha256": sha256_hex(text.as_bytes()),
               "char_count": LARGE, "head": "z".repeat(4096)})
    );
    // One message a page, whatever the byte cap: the same bytes.
    for m in &described.messages {
        let page = read(&s, json!({"from_ordinal": m.ordinal, "limit": 1, "max_bytes": 1, "media": "descriptors"}));
        assert_eq!(page.messages, std::slice::from_ref(m), "{}", m.mid);
    }
    // The modes broca does not serve are refused by name, pinned.
    for (golden, media) in [("read.media_blocks_undeclared", "blocks"), ("read.media_unknown", "bogus")] {
        let (code, body) = s.refused("session.read", json!({"media": media}));
        assert_eq!((code.as_str(), body["detail"]["field"].as_str()), ("invalid_params", Some("media")), "{body}");
        pin::assert_golden(&format!("{golden}.json"), &body.to_string(), None);
    }
}

/// A Messages model takes the image itself, inside the `tool_result`.
fn messages_model_sees_the_image(h: &Harness) {
    let s = h.session(HARNESS, &h.unique("messages"), None);
    shot_run(h, &s, "echo-messages");
    let requests = h.mock.requests("default");
    let body: Value = serde_json::from_slice(&requests[1].body).unwrap();
    let result = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result")
        .expect("the tool_result block");
    assert_eq!(
        result["content"],
        json!([{"type": "text", "text": "a shot"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}])
    );
}

/// Non-payload structure alone over the budget: a reply of 800 text blocks of 4,000 bytes
/// (3.2 MB), each of which a `text_ref` (its 4,096-byte head and its identities) would only make
/// longer.
fn structure_over_the_budget_is_refused(h: &Harness) {
    let s = h.session(HARNESS, &h.unique("blocks"), None);
    let block = "a".repeat(4000);
    let events: Vec<Value> =
        (0..800).map(|_| json!({"text_block": block})).chain([json!({"finish": "stop"})]).collect();
    h.install_alone(json!({"responses": [{"events": events}]}));
    let params = json!({"prompt": "many blocks", "model": {"provider": "mock", "model": "echo-messages"}});
    let run = s.ok("session.send", params)["run_id"].as_str().unwrap().to_owned();
    s.wait_run(&run, "completed");
    let inline = s.ok("session.read", json!({"from_ordinal": 2, "limit": 1}));
    assert_eq!(inline["messages"][0]["message"]["content"].as_array().map(Vec::len), Some(800));
    let (code, body) = s.refused("session.read", json!({"from_ordinal": 2, "media": "descriptors"}));
    assert_eq!((code.as_str(), body["detail"]["ordinal"].as_u64()), ("reply_too_large", Some(2)), "{body}");
    let pinned = body.to_string().replace(&s.id, "<session>");
    pin::assert_golden("read.descriptor_structure_too_large.json", &pinned, None);
    // The messages before it are served.
    let first = read(&s, json!({"from_ordinal": 1, "limit": 1, "media": "descriptors"}));
    assert_eq!(first.messages.len(), 1);
}

#[test]
fn media_descriptors_end_to_end() {
    let base = tempfile::Builder::new().prefix("bme").tempdir_in("/tmp").unwrap();
    let script = base.path().join("tools.json");
    fs::write(&script, tools_script().to_string()).unwrap();
    let tools = json!({"program": broca_mock::exe(), "args": ["--tools", script],
                       "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true});
    let opts = Options {
        modules: vec![(TOOLS.to_string(), tools)],
        env: vec![("BROCA_TEST_DECLARE_HELD_REPLY_V1".into(), "1".into())],
        ck_log: "info".into(),
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    support::wait_tool_provider(&h, TOOLS);
    descriptors_are_served(&h);
    messages_model_sees_the_image(&h);
    structure_over_the_budget_is_refused(&h);
}
