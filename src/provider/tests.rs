//! Golden tests of the wire families.
//!
//! Parse goldens: every `testdata/sse/<family>.<case>.sse` is framed and decoded, one JSON line
//! per SSE event (`event_type`, `content`, `unknown`, the stream events it produced), then an
//! `end` line (`finished`, keep-alive comments seen); a decode error ends the run with an
//! `error` line. Compared byte for byte with `testdata/golden/parse.<family>.<case>.jsonl`, fed
//! whole, one byte at a time, and (for the multibyte cases) split in two at every byte.
//!
//! Request goldens: `testdata/golden/request.<family>.<case>.json` hold the exact body bytes
//! (plus a final newline). `BROCA_BLESS=1` rewrites all goldens instead of comparing.

use crate::frozen::{CachePolicy, CacheRole, CacheTtl};
use crate::frozen::{ToolChoice, ToolChoiceMode};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::config::{AuthSource, RenderConfig, ToolSpec};
use super::event::{Family, StreamDecoder};
use super::sse::{Pushed, SseError, SseFramer};

use super::{classify_http_error, render_request, wire};
use crate::message::{Message, Part, Role};
use crate::record::ErrorClass;

/// The families with a stream decoder of their own (the ChatGPT backend streams Responses).
const FAMILIES: [Family; 6] = [
    Family::AnthropicMessages,
    Family::OpenaiChat,
    Family::OpenaiResponses,
    Family::GoogleGenerateContent,
    Family::AwsBedrockConverse,
    Family::GoogleCodeAssist,
];

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

fn blessing() -> bool {
    std::env::var("BROCA_BLESS").as_deref() == Ok("1")
}

fn check_golden(path: &Path, actual: &[u8]) {
    if blessing() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        std::fs::write(path, actual).expect("write golden");
        return;
    }
    let expected =
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e} (run with BROCA_BLESS=1 to create it)", path.display()));
    assert!(
        expected == actual,
        "{} differs from its golden\n--- golden\n{}\n--- actual\n{}",
        path.display(),
        String::from_utf8_lossy(&expected),
        String::from_utf8_lossy(actual)
    );
}

/// One stream run: framer output in, golden lines out.
struct Run {
    decoder: Box<dyn StreamDecoder>,
    lines: String,
    comments: u64,
    stopped: bool,
}

impl Run {
    fn new(family: Family) -> Run {
        Run { decoder: wire(family).decoder(), lines: String::new(), comments: 0, stopped: false }
    }

    fn take(&mut self, pushed: Result<Pushed, SseError>) {
        if self.stopped {
            return;
        }
        let pushed = match pushed {
            Ok(p) => p,
            Err(e) => return self.stop(format!("framing: {}", e.0)),
        };
        self.comments += pushed.comments;
        for event in &pushed.events {
            let mut out = Vec::new();
            match self.decoder.decode(event, &mut out) {
                Ok(c) => {
                    self.lines += &format!(
                        "{{\"event_type\":{},\"content\":{},\"unknown\":{},\"out\":{}}}\n",
                        json!(c.event_type),
                        c.content,
                        c.unknown,
                        serde_json::to_string(&out).expect("events serialize")
                    );
                }
                Err(e) => return self.stop(e.to_string()),
            }
        }
    }

    fn stop(&mut self, error: String) {
        self.lines += &format!("{}\n", json!({ "error": error }));
        self.stopped = true;
    }

    fn end(mut self, framer: &mut dyn super::sse::Framer) -> String {
        self.take(framer.finish());
        let end = json!({"end": {"finished": self.decoder.finished(), "comments": self.comments}});
        self.lines + &format!("{end}\n")
    }
}

fn decode_chunks<'a>(family: Family, chunks: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut framer = wire(family).framer();
    let mut run = Run::new(family);
    for chunk in chunks {
        run.take(framer.push(chunk));
    }
    run.end(framer.as_mut())
}

fn family_of(name: &str) -> Family {
    FAMILIES
        .into_iter()
        .find(|f| name.starts_with(&format!("{}.", f.as_str())))
        .expect("file named <family>.<case>.sse")
}

/// The recorded streams: `testdata/sse/*.sse` as they were sent, and the event-stream cases
/// `testdata/eventstream/*.json` (each message's string headers and JSON payload, or a raw
/// `bytes_hex` message), framed here as the service frames them.
fn sse_cases() -> Vec<(String, Family, Vec<u8>)> {
    let mut cases: Vec<_> = std::fs::read_dir(testdata().join("sse"))
        .expect("testdata/sse")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sse"))
        .map(|p| {
            let stem = p.file_stem().expect("stem").to_string_lossy().into_owned();
            (stem.clone(), family_of(&stem), std::fs::read(&p).expect("read sse"))
        })
        .collect();
    for p in std::fs::read_dir(testdata().join("eventstream")).expect("testdata/eventstream") {
        let p = p.expect("dir entry").path();
        let stem = p.file_stem().expect("stem").to_string_lossy().into_owned();
        let messages: Vec<Value> = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("JSON");
        cases.push((stem.clone(), family_of(&stem), messages.iter().flat_map(event_stream_message).collect()));
    }
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    cases
}

/// One described event-stream message as bytes (see [`sse_cases`]).
fn event_stream_message(m: &Value) -> Vec<u8> {
    if let Some(cut) = m.get("truncated_bytes").and_then(Value::as_u64) {
        let whole = event_stream_message(&m["message"]);
        return whole[..cut as usize].to_vec();
    }
    let headers: Vec<(&str, &str)> = m["headers"]
        .as_object()
        .expect("headers")
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().expect("string")))
        .collect();
    super::eventstream::encode(&headers, m["payload"].to_string().as_bytes())
}

/// Cases also split in two at every byte boundary (they hold multibyte UTF-8).
const SPLIT_EVERYWHERE: [&str; 3] =
    ["anthropic_messages.redacted_thinking", "openai_chat.no_usage", "openai_responses.reasoning_summary"];

#[test]
fn recorded_streams_decode_to_their_goldens() {
    let cases = sse_cases();
    for family in FAMILIES {
        assert!(cases.iter().filter(|c| c.1 == family).count() >= 5, "{} has too few cases", family.as_str());
    }
    for (name, family, bytes) in &cases {
        let whole = decode_chunks(*family, [bytes.as_slice()]);
        check_golden(&testdata().join("golden").join(format!("parse.{name}.jsonl")), whole.as_bytes());
        assert_tool_arguments_complete(name, &whole);
        let bytewise = decode_chunks(*family, bytes.chunks(1));
        assert_eq!(bytewise, whole, "{name}: fed one byte at a time");
        if SPLIT_EVERYWHERE.contains(&name.as_str()) {
            for cut in 0..=bytes.len() {
                let (a, b) = bytes.split_at(cut);
                assert_eq!(decode_chunks(*family, [a, b]), whole, "{name}: split at byte {cut}");
            }
        }
    }
}

/// The chat decoder's fast reading of common chunks gives, event by event, what reading every
/// chunk through its JSON tree gives (`chat_chunk`'s invariant), and reads most recorded chunks.
#[test]
fn the_chat_decoders_fast_reading_is_its_tree_reading() {
    let (mut events, mut fast) = (0, 0);
    for (name, family, bytes) in sse_cases() {
        if family != Family::OpenaiChat {
            continue;
        }
        let sse = SseFramer::new().push(&bytes).expect("frames").events;
        let (mut quick, mut tree) =
            (super::openai_chat::ChatDecoder::new(), super::openai_chat::ChatDecoder::tree_only());
        for event in &sse {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let got = (quick.decode(event, &mut a), a);
            assert_eq!(got, (tree.decode(event, &mut b), b), "{name}: {}", event.data);
            events += 1;
            fast += usize::from(super::chat_chunk::fast(&event.data).is_some());
        }
    }
    assert!(fast * 2 > events, "only {fast} of {events} recorded chunks were read fast");
}

/// When a stream finishes with `tool_calls`, each call's fragments concatenate to a JSON object.
fn assert_tool_arguments_complete(name: &str, lines: &str) {
    let mut args: Vec<String> = Vec::new();
    let mut tool_finish = false;
    for line in lines.lines() {
        let line: Value = serde_json::from_str(line).expect("golden line is JSON");
        for event in line["out"].as_array().into_iter().flatten() {
            let index = event["index"].as_u64().unwrap_or(0) as usize;
            match event["type"].as_str() {
                Some("tool_call_start") => {
                    assert_eq!(index, args.len(), "{name}: calls start in order");
                    args.push(String::new());
                }
                Some("tool_call_args_delta") => args[index] += event["delta"].as_str().unwrap_or_default(),
                Some("finish") => tool_finish = event["reason"] == "tool_calls",
                _ => {}
            }
        }
    }
    if tool_finish {
        assert!(!args.is_empty(), "{name}: tool_calls finish without calls");
        for a in &args {
            assert!(serde_json::from_str::<Value>(a).is_ok_and(|v| v.is_object()), "{name}: arguments {a:?}");
        }
    }
}

#[test]
fn hostile_shapes_never_panic() {
    let shapes = [
        "{}",
        "[]",
        "42",
        "\"text\"",
        "null",
        "{\"type\":5}",
        "{\"type\":\"content_block_delta\",\"delta\":5}",
        "{\"type\":\"content_block_delta\",\"index\":-1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":7}}",
        "{\"type\":\"content_block_start\",\"index\":99999999999999999999,\"content_block\":[]}",
        "{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-3,\"input_tokens\":1.5}}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"x\",\"function\":null}]},\"finish_reason\":7}]}",
        "{\"choices\":\"no\",\"usage\":[1]}",
        "{\"error\":\"just text\"}",
        "{\"type\":\"response.function_call_arguments.delta\",\"item_id\":1,\"delta\":\"x\"}",
        "{\"type\":\"response.completed\",\"response\":\"done\"}",
        "{\"type\":\"response.output_item.done\",\"item\":{\"type\":\"function_call\"}}",
        "{\"type\":\"error\"}",
        "{\"truncated\":",
    ];
    for family in FAMILIES {
        let mut d = wire(family).decoder();
        for shape in shapes {
            let event = super::sse::SseEvent { event: None, data: shape.into() };
            let result = d.decode(&event, &mut Vec::new());
            let is_object = serde_json::from_str::<Value>(shape).is_ok_and(|v| v.is_object());
            assert_eq!(result.is_ok(), is_object, "{} on {shape}", family.as_str());
        }
    }
}

// ---- request bodies ----

pub(super) fn config(family: Family, provider: &str, wire_model: &str) -> RenderConfig {
    RenderConfig {
        provider: provider.into(),
        model: wire_model.into(),
        family,
        base_url: "http://127.0.0.1:9".into(),
        wire_model: wire_model.into(),
        variant: None,
        variant_params: Value::Null,
        system: Some("You are a careful coding assistant.".into()),
        max_output_tokens: None,
        max_steps: None,
        directives: Vec::new(),
        tools: vec![],
        auth: AuthSource::None,
        auth_method: Default::default(),
        policy: Default::default(),
        plan: None,
        tool_choice: None,
        service_tier: None,
        // What the loop sets on a Code Assist run (`provider::code_assist`).
        code_assist: (family == Family::GoogleCodeAssist).then(|| crate::frozen::CodeAssistIds {
            project: "broca-mock-project".into(),
            user_prompt_id: "run-1".into(),
            session_id: "s-1".into(),
        }),
    }
}

pub(super) fn stat_tool() -> ToolSpec {
    ToolSpec {
        name: "stat_file".into(),
        description: "Report a file's size in bytes.".into(),
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        reply: None,
        module: None,
        preset: None,
        pin: None,
        result_format: None,
        output_refs: false,
        reference_slots: Vec::new(),
    }
}

fn read_tool() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: String::new(),
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}),
        reply: None,
        module: None,
        preset: None,
        pin: None,
        result_format: None,
        output_refs: false,
        reference_slots: Vec::new(),
    }
}

fn msg(role: Role, content: Vec<Part>) -> Message {
    Message::of(role, content)
}

fn multi_step_transcript() -> Vec<Message> {
    let call = |id: &str, path: &str| Part::ToolCall {
        tool_call_id: id.into(),
        tool_name: "stat_file".into(),
        input: json!({ "path": path }),
    };
    vec![
        Message::user_text("How big are build.log and test.log?"),
        msg(
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: "I should stat both files.".into(),
                    signature: Some("EqQBbW9ja1NpZw==".into()),
                },
                Part::Text { text: "Let me check both.".into() },
                call("call_1", "build.log"),
                call("call_2", "test.log"),
            ],
        ),
        msg(
            Role::Tool,
            vec![
                Part::ToolResult {
                    tool_call_id: "call_1".into(),
                    output: json!({"kind": "text", "text": "build.log: 4096 bytes"}),
                    is_error: false,
                },
                Part::ToolResult {
                    tool_call_id: "call_2".into(),
                    output: json!({"kind": "error", "message": "no such file: test.log", "code": "not_found",
                                   "retry": "check the path and call again"}),
                    is_error: true,
                },
            ],
        ),
        msg(
            Role::Assistant,
            vec![
                Part::RedactedReasoning { data: "EmwKbW9ja1JlZGFjdGVk".into() },
                Part::Text { text: "build.log is 4 KiB; test.log does not exist (é).".into() },
            ],
        ),
        Message::user_text("Thanks. Now read build.log."),
    ]
}

/// Every request golden: (golden name, config, transcript).
fn request_cases() -> Vec<(String, RenderConfig, Vec<Message>)> {
    let plain = vec![Message::user_text("What is 2 + 2?")];
    let proof = vec![Message::user_text("Prove that the square root of 2 is irrational.")];
    let families = [
        (
            Family::AnthropicMessages,
            "anthropic",
            "claude-sonnet-4-5",
            json!({"thinking": {"type": "enabled", "budget_tokens": 8192}}),
        ),
        (Family::OpenaiChat, "openai", "o4-mini", json!({"reasoning_effort": "high"})),
        (
            Family::OpenaiResponses,
            "openai",
            "gpt-5",
            json!({"reasoning": {"effort": "high", "summary": "auto"}, "include": ["reasoning.encrypted_content"]}),
        ),
        (
            Family::OpenaiChatgptResponses,
            "openai",
            "gpt-5",
            json!({"reasoning": {"effort": "high", "summary": "auto"}, "include": ["reasoning.encrypted_content"]}),
        ),
        (
            Family::GoogleGenerateContent,
            "google",
            "gemini-2.5-flash",
            json!({"generationConfig": {"thinkingConfig": {"includeThoughts": true, "thinkingBudget": 8192}}}),
        ),
        (
            Family::AwsBedrockConverse,
            "amazon-bedrock",
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            json!({"additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 8192}}}),
        ),
        (
            Family::GoogleCodeAssist,
            "google",
            "gemini-3.8-flash-high",
            json!({"generationConfig": {"thinkingConfig": {"includeThoughts": true, "thinkingLevel": "high"}}}),
        ),
    ];
    let mut cases = Vec::new();
    for (family, provider, model, variant_params) in families {
        let name = |case: &str| format!("request.{}.{case}", family.as_str());
        // Chat's plain and multi-step cases go to a compatible server (`max_tokens`).
        let compat = if family == Family::OpenaiChat { "openrouter" } else { provider };
        cases.push((name("plain"), config(family, compat, model), plain.clone()));
        let mut multi = config(family, compat, model);
        multi.tools = vec![stat_tool(), read_tool()];
        multi.max_output_tokens = Some(2048);
        cases.push((name("multi_step"), multi, multi_step_transcript()));
        let mut variant = config(family, provider, model);
        variant.variant = Some("high".into());
        variant.variant_params = variant_params;
        variant.max_output_tokens = Some(16000);
        variant.tools = vec![stat_tool()];
        cases.push((name("variant"), variant, proof.clone()));
        // The cache policies each family renders (`provider::cache`), on a tool loop's request.
        let policies: &[(&str, CachePolicy)] = match family {
            Family::AnthropicMessages => &[
                ("cache.1h", CachePolicy { role: None, ttl: Some(CacheTtl::OneHour) }),
                ("cache.primary", CachePolicy { role: Some(CacheRole::Primary), ttl: None }),
                ("cache.ephemeral", CachePolicy { role: Some(CacheRole::Ephemeral), ttl: None }),
            ],
            Family::OpenaiChat | Family::OpenaiResponses => &[
                ("cache.24h", CachePolicy { role: Some(CacheRole::Primary), ttl: Some(CacheTtl::OneDay) }),
                ("cache.key", CachePolicy::default()),
            ],
            // The backend refuses retention; the key is rendered.
            Family::OpenaiChatgptResponses => &[("cache.key", CachePolicy::default())],
            // Implicit caching: nothing is rendered.
            Family::GoogleGenerateContent => &[],
            // cachePoint blocks, whatever the policy (the lifetime is the provider's).
            Family::AwsBedrockConverse => &[("cache.points", CachePolicy::default())],
            Family::GoogleCodeAssist => &[],
        };
        for (case, policy) in policies {
            let mut cached = config(family, provider, model);
            cached.tools = vec![stat_tool(), read_tool()];
            cached.policy.cache = Some(*policy);
            cached.policy.conversation_key = Some("project-42/session-7".into());
            cases.push((name(case), cached, multi_step_transcript()));
        }
        // `tool_choice` as each family spells it (Bedrock Converse has no "none": admission
        // refuses it there by name, so no golden).
        let choices = [
            ("tool_choice.required", ToolChoice::Mode(ToolChoiceMode::Required)),
            ("tool_choice.named", ToolChoice::Named { tool: "read_file".into() }),
            ("tool_choice.none", ToolChoice::Mode(ToolChoiceMode::None)),
        ];
        for (case, choice) in choices {
            if family == Family::AwsBedrockConverse && choice == ToolChoice::Mode(ToolChoiceMode::None) {
                continue;
            }
            let mut chosen = config(family, provider, model);
            chosen.tools = vec![stat_tool(), read_tool()];
            chosen.tool_choice = Some(choice);
            cases.push((name(case), chosen, plain.clone()));
        }
        // A fast run as each family that declares the level spells it (`provider::tier`).
        if crate::provider::tier::declared().contains_key(crate::provider::tier::wire_api(family)) {
            let mut fast = config(family, provider, model);
            fast.service_tier = Some(cortexkit_role_llm_runner::service_tier::ServiceTier::Fast);
            cases.push((name("service_tier.fast"), fast, plain.clone()));
        }
        if family == Family::OpenaiChat {
            // A compatible server caches on its own: nothing is rendered for it.
            let mut compat = config(family, "openrouter", model);
            compat.policy.cache = Some(CachePolicy { role: Some(CacheRole::Primary), ttl: None });
            compat.policy.conversation_key = Some("project-42/session-7".into());
            cases.push((name("cache.compat"), compat, plain.clone()));
        }
    }
    cases
}

#[test]
fn request_bodies_match_their_goldens() {
    for (name, config, transcript) in request_cases() {
        let mut body = render_request(&config, &transcript);
        serde_json::from_slice::<Value>(&body).expect("a request body is JSON");
        body.push(b'\n');
        check_golden(&testdata().join("golden").join(format!("{name}.json")), &body);
    }
}

#[test]
fn rendering_is_deterministic() {
    for (name, config, transcript) in request_cases() {
        let first = render_request(&config, &transcript);
        let again = render_request(&config.clone(), &transcript.clone());
        assert_eq!(first, again, "{name}");
    }
}

#[test]
fn signatures_are_not_replayed_to_another_provider() {
    let mut transcript = multi_step_transcript();
    transcript[1].origin = Some(json!({"provider": "elsewhere", "model": "m"}));
    transcript[3].origin = Some(json!({"provider_module_id": "elsewhere"}));
    for family in FAMILIES {
        let body = render_request(&config(family, "anthropic", "m"), &transcript);
        let body = String::from_utf8(body).expect("utf-8");
        assert!(!body.contains("mockSig") && !body.contains("mockRedacted"), "{}: {body}", family.as_str());
    }
}

#[test]
fn http_errors_classify() {
    let anthropic = |t: &str, m: &str| json!({"type": "error", "error": {"type": t, "message": m}}).to_string();
    let openai =
        |t: &str, c: &str, m: &str| json!({"error": {"message": m, "type": t, "param": null, "code": c}}).to_string();
    let google =
        |code: u16, status: &str| json!({"error": {"code": code, "message": "m", "status": status}}).to_string();
    let cases: Vec<(Family, u16, String, ErrorClass, Option<&str>)> = vec![
        (
            Family::AnthropicMessages,
            401,
            anthropic("authentication_error", "invalid x-api-key"),
            ErrorClass::AuthRequired,
            Some("authentication_error"),
        ),
        (
            Family::AnthropicMessages,
            403,
            anthropic("permission_error", "no access"),
            ErrorClass::Permanent,
            Some("permission_error"),
        ),
        (
            Family::AnthropicMessages,
            529,
            anthropic("overloaded_error", "Overloaded"),
            ErrorClass::Transient,
            Some("overloaded_error"),
        ),
        (
            Family::AnthropicMessages,
            429,
            anthropic("rate_limit_error", "slow down"),
            ErrorClass::Transient,
            Some("rate_limit_error"),
        ),
        (
            Family::AnthropicMessages,
            400,
            anthropic("invalid_request_error", "prompt is too long: 208000 tokens > 200000 maximum"),
            ErrorClass::ContextOverflow,
            Some("invalid_request_error"),
        ),
        (
            Family::AnthropicMessages,
            400,
            anthropic("invalid_request_error", "messages: bad role"),
            ErrorClass::Permanent,
            Some("invalid_request_error"),
        ),
        (
            Family::OpenaiChat,
            400,
            openai(
                "invalid_request_error",
                "context_length_exceeded",
                "This model's maximum context length is 128000 tokens.",
            ),
            ErrorClass::ContextOverflow,
            Some("context_length_exceeded"),
        ),
        (
            Family::OpenaiChat,
            401,
            openai("invalid_request_error", "invalid_api_key", "Incorrect API key provided"),
            ErrorClass::AuthRequired,
            Some("invalid_api_key"),
        ),
        (
            Family::OpenaiChat,
            403,
            openai("invalid_request_error", "invalid_api_key", "key revoked"),
            ErrorClass::AuthRequired,
            Some("invalid_api_key"),
        ),
        (
            Family::OpenaiChat,
            429,
            openai("insufficient_quota", "insufficient_quota", "You exceeded your current quota"),
            ErrorClass::Permanent,
            Some("insufficient_quota"),
        ),
        (Family::OpenaiResponses, 500, openai("server_error", "", "boom"), ErrorClass::Transient, Some("server_error")),
        (
            Family::OpenaiResponses,
            404,
            openai("invalid_request_error", "model_not_found", "no such model"),
            ErrorClass::Permanent,
            Some("model_not_found"),
        ),
        (Family::OpenaiChat, 502, "<html>Bad Gateway</html>".into(), ErrorClass::Transient, None),
        (Family::OpenaiChat, 418, String::new(), ErrorClass::Permanent, None),
        (
            Family::GoogleGenerateContent,
            429,
            google(429, "RESOURCE_EXHAUSTED"),
            ErrorClass::Transient,
            Some("RESOURCE_EXHAUSTED"),
        ),
        (
            Family::GoogleGenerateContent,
            401,
            google(401, "UNAUTHENTICATED"),
            ErrorClass::AuthRequired,
            Some("UNAUTHENTICATED"),
        ),
        (
            Family::GoogleGenerateContent,
            400,
            google(400, "INVALID_ARGUMENT"),
            ErrorClass::Permanent,
            Some("INVALID_ARGUMENT"),
        ),
        (Family::GoogleGenerateContent, 503, google(503, "UNAVAILABLE"), ErrorClass::Transient, Some("UNAVAILABLE")),
    ];
    for (family, status, body, class, code) in cases {
        let e = classify_http_error(family, status, body.as_bytes());
        assert_eq!(
            (e.class, e.provider_code.as_deref(), e.http_status),
            (class, code, Some(status)),
            "{status} {body}"
        );
        assert!(!e.message.is_empty());
    }
    let e = classify_http_error(Family::OpenaiChat, 418, b"");
    assert_eq!(e.message, "openai_chat returned HTTP 418");
}

#[test]
fn stop_reasons_normalize() {
    use super::{anthropic, openai_chat, openai_responses};
    let table = [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "refusal"),
        ("pause_turn", "other"),
        ("something_new", "other"),
    ];
    for (raw, reason) in table {
        assert_eq!(anthropic::normalize_stop_reason(raw), reason, "{raw}");
    }
    assert_eq!(openai_chat::normalize_finish_reason("function_call", false, false), "tool_calls");
    assert_eq!(openai_chat::normalize_finish_reason("stop", false, true), "tool_calls");
    assert_eq!(openai_chat::normalize_finish_reason("content_filter", false, false), "content_filter");
    assert_eq!(openai_responses::normalize_incomplete_reason("content_filter"), "content_filter");
    assert_eq!(openai_responses::normalize_incomplete_reason("max_output_tokens"), "length");
    for (raw, called, reason) in [
        ("STOP", false, "stop"),
        ("STOP", true, "tool_calls"),
        ("MAX_TOKENS", false, "length"),
        ("SAFETY", false, "content_filter"),
        ("IMAGE_SAFETY", false, "content_filter"),
        ("MALFORMED_FUNCTION_CALL", true, "error"),
        ("MISSING_THOUGHT_SIGNATURE", false, "error"),
        ("FINISH_REASON_UNSPECIFIED", false, "other"),
    ] {
        assert_eq!(super::gemini::normalize_finish_reason(raw, called), reason, "{raw}");
    }
    for (raw, reason) in [
        ("end_turn", "stop"),
        ("tool_use", "tool_calls"),
        ("model_context_window_exceeded", "length"),
        ("guardrail_intervened", "content_filter"),
        ("malformed_tool_use", "error"),
        ("something_new", "other"),
    ] {
        assert_eq!(super::bedrock::normalize_stop_reason(raw), reason, "{raw}");
    }
}

#[test]
fn the_render_cache_gives_the_bytes_of_a_whole_render() {
    for (name, mut config, transcript) in request_cases() {
        for system in [None, Some(String::new()), Some("Be brief.".to_string())] {
            config.system = system;
            let mut cache = super::render_cache::RenderCache::default();
            // Growing as a loop's transcript does, from empty, with one cache.
            for n in 0..=transcript.len() {
                let want = render_request(&config, &transcript[..n]);
                assert_eq!(cache.render(&config, &transcript[..n]), want, "{name}, {n} messages");
                assert_eq!(cache.cached(), n, "{name}: the cache was used");
            }
            // An earlier message that changed is rendered again, not reused.
            let mut edited = transcript.clone();
            edited[0] = Message::user_text("Something else entirely.");
            assert_eq!(cache.render(&config, &edited), render_request(&config, &edited), "{name}, edited");
            // Another config (its shell) is rendered again, not reused.
            let mut other = config.clone();
            other.system = Some("Another system text.".into());
            assert_eq!(cache.render(&other, &edited), render_request(&other, &edited), "{name}, other config");
        }
    }
}

#[test]
fn the_loops_render_of_a_growing_transcript_gives_the_bytes_of_a_whole_render() {
    for (name, config, transcript) in request_cases() {
        let mut cache = super::render_cache::RenderCache::default();
        for n in 0..=transcript.len() {
            let want = render_request(&config, &transcript[..n]);
            assert_eq!(cache.render_appended(&config, &transcript[..n]), want, "{name}, {n} messages");
        }
        // A shorter transcript (a new cache's caller, say) is rendered afresh.
        assert_eq!(
            cache.render_appended(&config, &transcript[..1]),
            render_request(&config, &transcript[..1]),
            "{name}"
        );
    }
}
