//! Every rule: one request that breaks it (and is refused for it) and one that keeps it (and
//! breaks no rule of its family at all).

use super::*;

const CLAUDE_PATH: &str = "/v1/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse-stream";
const NOVA_PATH: &str = "/v1/model/amazon.nova-pro-v1%3A0/converse-stream";

fn path(family: Family) -> &'static str {
    match family {
        Family::AnthropicMessages => "/v1/messages",
        Family::OpenaiChat => "/v1/chat/completions",
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => "/v1/responses",
        Family::GoogleGenerateContent => "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        Family::GoogleCodeAssist => "/v1/v1internal:streamGenerateContent?alt=sse",
        Family::AwsBedrockConverse => CLAUDE_PATH,
    }
}

/// A valid request of the family with a tool loop in it.
fn base(family: Family) -> Value {
    match family {
        Family::AnthropicMessages => json!({
            "model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "How big is build.log?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "stat_file", "input": {"path": "build.log"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4096"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "4 KiB."}]},
                {"role": "user", "content": [{"type": "text", "text": "Thanks."}]}],
            "tools": [{"name": "stat_file", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}]
        }),
        Family::OpenaiChat => json!({
            "model": "o4-mini", "stream": true, "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "How big is build.log?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "stat_file", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "stat_file", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "4096"},
                {"role": "tool", "tool_call_id": "c2", "content": "8192"},
                {"role": "user", "content": "Thanks."}],
            "tools": [{"type": "function", "function": {"name": "stat_file", "parameters": {"type": "object"}}}]
        }),
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => json!({
            "model": "gpt-5", "stream": true, "store": false, "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "How big is build.log?"}]},
                {"type": "reasoning", "summary": [], "encrypted_content": "ZW5j"},
                {"type": "function_call", "call_id": "c1", "name": "stat_file", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "4096"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4 KiB."}]},
                {"role": "developer", "content": "Answer in English."}],
            "tools": [{"type": "function", "name": "stat_file", "parameters": {"type": "object"}}]
        }),
        Family::GoogleGenerateContent => json!({
            "contents": [
                {"role": "user", "parts": [{"text": "How big are the logs?"}]},
                {"role": "model", "parts": [
                    {"functionCall": {"name": "stat_file", "args": {"path": "a.log"}}},
                    {"functionCall": {"name": "stat_file", "args": {"path": "b.log"}}}]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "stat_file", "response": {"output": "1"}}},
                    {"functionResponse": {"name": "stat_file", "response": {"output": "2"}}}]},
                {"role": "model", "parts": [{"text": "Small."}]},
                {"parts": [{"text": "Thanks."}]}],
            "tools": [{"functionDeclarations": [
                {"name": "stat_file", "parametersJsonSchema": {"type": "object", "additionalProperties": false}},
                {"name": "mcp.read:file-2", "parameters": {"type": "OBJECT", "properties": {
                    "path": {"type": "STRING", "default": "x"},
                    "n": {"anyOf": [{"type": "INTEGER"}, {"type": "NULL"}]},
                    "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["a"]}}}}}]}]
        }),
        Family::GoogleCodeAssist => {
            json!({"model": "gemini-3.8-flash-high", "project": "p-1", "request": base(Family::GoogleGenerateContent)})
        }
        Family::AwsBedrockConverse => json!({
            "system": [{"text": "Be brief."}, {"cachePoint": {"type": "default"}}],
            "messages": [
                {"role": "user", "content": [{"text": "How big is build.log?"}]},
                {"role": "assistant", "content": [
                    {"text": "Checking."},
                    {"toolUse": {"toolUseId": "t1", "name": "stat_file", "input": {}}}]},
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "t1", "content": [{"text": "4096"}], "status": "success"}}]},
                {"role": "assistant", "content": [{"text": "4 KiB."}]},
                {"role": "user", "content": [{"text": "Thanks."}, {"cachePoint": {"type": "default"}}]}],
            "toolConfig": {"tools": [
                {"toolSpec": {"name": "stat_file", "inputSchema": {"json": {"type": "object"}}}},
                {"cachePoint": {"type": "default"}}]}
        }),
    }
}

/// `base` changed by `f`.
fn with(family: Family, f: impl FnOnce(&mut Value)) -> Value {
    let mut v = base(family);
    f(&mut v);
    v
}

struct Case {
    rule: &'static str,
    path: &'static str,
    headers: Vec<(String, String)>,
    bad: Value,
    /// Headers of the good request when they differ from the bad one's.
    good_headers: Option<Vec<(String, String)>>,
    good: Value,
    good_path: &'static str,
}

fn case(rule: &'static str, bad: Value, good: Value) -> Case {
    let family = find(rule).unwrap_or_else(|| panic!("no rule {rule}")).family;
    Case { rule, path: path(family), headers: Vec::new(), bad, good_headers: None, good, good_path: path(family) }
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn cases() -> Vec<Case> {
    use Family::*;
    let a = AnthropicMessages;
    let ok = base;
    let mut out = vec![
        // Anthropic Messages.
        case(
            "code_assist.project_required",
            with(GoogleCodeAssist, |v| drop(v.as_object_mut().unwrap().remove("project"))),
            ok(GoogleCodeAssist),
        ),
        case("anthropic.model_required", with(a, |v| drop(v.as_object_mut().unwrap().remove("model"))), ok(a)),
        case(
            "anthropic.max_tokens_required",
            with(a, |v| drop(v.as_object_mut().unwrap().remove("max_tokens"))),
            ok(a),
        ),
        case("anthropic.messages_non_empty", with(a, |v| v["messages"] = json!([])), ok(a)),
        case(
            "anthropic.first_message_user",
            with(a, |v| {
                v["messages"] = json!([{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Hi"}])
            }),
            ok(a),
        ),
        case("anthropic.roles", with(a, |v| v["messages"][4]["role"] = json!("system")), ok(a)),
        case(
            "anthropic.content_non_empty",
            with(a, |v| v["messages"][3]["content"] = json!([])),
            // A final assistant message (a prefill) may be empty.
            with(a, |v| v["messages"][4] = json!({"role": "assistant", "content": []})),
        ),
        case("anthropic.text_non_empty", with(a, |v| v["messages"][4]["content"][0]["text"] = json!("")), ok(a)),
        case("anthropic.text_non_empty", with(a, |v| v["system"][0]["text"] = json!(" \n")), ok(a)),
        case(
            "anthropic.tool_result_answers_tool_use",
            with(a, |v| {
                v["messages"][2]["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"type": "tool_result", "tool_use_id": "t9", "content": "?"}))
            }),
            ok(a),
        ),
        case(
            "anthropic.tool_use_answered",
            with(a, |v| v["messages"][2]["content"] = json!([{"type": "text", "text": "go on"}])),
            // An assistant tool_use that ends the request awaits nothing yet.
            with(a, |v| {
                let m = v["messages"].as_array_mut().unwrap();
                m.truncate(2);
            }),
        ),
        case(
            "anthropic.tool_name_pattern",
            with(a, |v| v["tools"][0]["name"] = json!("mcp.stat file")),
            with(a, |v| v["tools"][0]["name"] = json!("a".repeat(128))),
        ),
        case(
            "anthropic.thinking_budget_below_max_tokens",
            with(a, |v| v["thinking"] = json!({"type": "enabled", "budget_tokens": v["max_tokens"].clone()})),
            with(a, |v| {
                v["max_tokens"] = json!(2048);
                v["thinking"] = json!({"type": "enabled", "budget_tokens": 1024})
            }),
        ),
        case(
            "anthropic.thinking_not_with_forced_tool",
            with(a, |v| {
                v["max_tokens"] = json!(2048);
                v["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
                v["tool_choice"] = json!({"type": "any"})
            }),
            with(a, |v| {
                v["max_tokens"] = json!(2048);
                v["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
                v["tool_choice"] = json!({"type": "auto"})
            }),
        ),
        Case {
            headers: h(&[("Authorization", "Bearer sk-ant-api-key")]),
            good_headers: Some(h(&[
                ("authorization", "Bearer tok"),
                ("anthropic-beta", "fast-mode-2026-02-01,oauth-2025-04-20"),
            ])),
            ..case("anthropic.bearer_needs_oauth_beta", ok(a), ok(a))
        },
        // OpenAI Chat.
        case("openai_chat.model_required", with(OpenaiChat, |v| v["model"] = json!("")), ok(OpenaiChat)),
        case("openai_chat.messages_non_empty", with(OpenaiChat, |v| v["messages"] = json!([])), ok(OpenaiChat)),
        case("openai_chat.roles", with(OpenaiChat, |v| v["messages"][0]["role"] = json!("model")), ok(OpenaiChat)),
        case(
            "openai_chat.tool_message_answers_call",
            with(OpenaiChat, |v| {
                let again = json!({"role": "tool", "tool_call_id": "c1", "content": "again"});
                v["messages"].as_array_mut().unwrap().push(again)
            }),
            ok(OpenaiChat),
        ),
        case(
            "openai_chat.tool_message_answers_call",
            with(OpenaiChat, |v| v["messages"][4]["tool_call_id"] = json!("c9")),
            ok(OpenaiChat),
        ),
        case(
            "openai_chat.tool_calls_answered",
            with(OpenaiChat, |v| drop(v["messages"].as_array_mut().unwrap().remove(4))),
            with(OpenaiChat, |v| v["messages"].as_array_mut().unwrap().truncate(3)),
        ),
        case(
            "openai_chat.stream_options_needs_stream",
            with(OpenaiChat, |v| v["stream"] = json!(false)),
            with(OpenaiChat, |v| {
                v["stream"] = json!(false);
                v.as_object_mut().unwrap().remove("stream_options");
            }),
        ),
        case(
            "openai_chat.tool_name_pattern",
            with(OpenaiChat, |v| v["tools"][0]["function"]["name"] = json!("a".repeat(65))),
            with(OpenaiChat, |v| v["tools"][0]["function"]["name"] = json!("a".repeat(64))),
        ),
        // OpenAI Responses.
        case(
            "openai_responses.model_required",
            with(OpenaiResponses, |v| drop(v.as_object_mut().unwrap().remove("model"))),
            ok(OpenaiResponses),
        ),
        case(
            "openai_responses.input_roles",
            with(OpenaiResponses, |v| v["input"][0]["role"] = json!("tool")),
            ok(OpenaiResponses),
        ),
        case(
            "openai_responses.function_call_output_answers_call",
            with(OpenaiResponses, |v| v["input"][3]["call_id"] = json!("c9")),
            with(OpenaiResponses, |v| {
                // The call is in the previous response.
                v["previous_response_id"] = json!("resp_1");
                v["input"] = json!([{"type": "function_call_output", "call_id": "c0", "output": "1"}]);
            }),
        ),
        case(
            "openai_responses.function_call_answered",
            with(OpenaiResponses, |v| drop(v["input"].as_array_mut().unwrap().remove(3))),
            ok(OpenaiResponses),
        ),
        case(
            "openai_responses.tool_name_pattern",
            with(OpenaiResponses, |v| v["tools"][0]["name"] = json!("stat file")),
            with(OpenaiResponses, |v| v["tools"][0]["name"] = json!("stat-file_2")),
        ),
        // The ChatGPT/Codex backend.
        case(
            "chatgpt.input_roles",
            with(OpenaiChatgptResponses, |v| v["input"][0]["role"] = json!("tool")),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.function_call_output_answers_call",
            with(OpenaiChatgptResponses, |v| v["input"][3]["call_id"] = json!("c9")),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.function_call_answered",
            with(OpenaiChatgptResponses, |v| drop(v["input"].as_array_mut().unwrap().remove(3))),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.tool_name_pattern",
            with(OpenaiChatgptResponses, |v| v["tools"][0]["name"] = json!("")),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.no_system_message",
            with(OpenaiChatgptResponses, |v| v["input"][5]["role"] = json!("system")),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.instructions_required",
            with(OpenaiChatgptResponses, |v| drop(v.as_object_mut().unwrap().remove("instructions"))),
            with(OpenaiChatgptResponses, |v| v["instructions"] = json!("")),
        ),
        case(
            "chatgpt.max_output_tokens",
            with(OpenaiChatgptResponses, |v| v["max_output_tokens"] = json!(4096)),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.prompt_cache_retention",
            with(OpenaiChatgptResponses, |v| v["prompt_cache_retention"] = json!("24h")),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.store_false",
            with(OpenaiChatgptResponses, |v| v["store"] = json!(true)),
            ok(OpenaiChatgptResponses),
        ),
        case(
            "chatgpt.stream_true",
            with(OpenaiChatgptResponses, |v| drop(v.as_object_mut().unwrap().remove("stream"))),
            ok(OpenaiChatgptResponses),
        ),
        // Bedrock Converse.
        case(
            "bedrock.first_message_user",
            with(AwsBedrockConverse, |v| drop(v["messages"].as_array_mut().unwrap().remove(0))),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.first_message_user",
            with(AwsBedrockConverse, |v| v["messages"] = json!([])),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.roles",
            with(AwsBedrockConverse, |v| v["messages"][4]["role"] = json!("system")),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.roles_alternate",
            with(AwsBedrockConverse, |v| {
                v["messages"].as_array_mut().unwrap().push(json!({"role": "user", "content": [{"text": "?"}]}))
            }),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.text_non_empty",
            with(AwsBedrockConverse, |v| v["messages"][3]["content"][0]["text"] = json!("  ")),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.text_non_empty",
            with(AwsBedrockConverse, |v| v["system"][0]["text"] = json!("")),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.tool_config_required",
            with(AwsBedrockConverse, |v| drop(v.as_object_mut().unwrap().remove("toolConfig"))),
            with(AwsBedrockConverse, |v| {
                v.as_object_mut().unwrap().remove("toolConfig");
                v["messages"] = json!([{"role": "user", "content": [{"text": "Hi"}]}]);
            }),
        ),
        case(
            "bedrock.tool_results_match_tool_uses",
            with(AwsBedrockConverse, |v| v["messages"][2]["content"] = json!([{"text": "never mind"}])),
            ok(AwsBedrockConverse),
        ),
        case(
            "bedrock.tool_results_match_tool_uses",
            with(AwsBedrockConverse, |v| {
                let extra = json!({"toolResult": {"toolUseId": "t2", "content": [{"text": "?"}]}});
                v["messages"][2]["content"].as_array_mut().unwrap().push(extra)
            }),
            ok(AwsBedrockConverse),
        ),
        Case {
            path: NOVA_PATH,
            good_path: NOVA_PATH,
            ..case(
                "bedrock.nova_no_tool_cache_point",
                with(AwsBedrockConverse, |v| {
                    drop(v["messages"][2]["content"][0]["toolResult"].as_object_mut().unwrap().remove("status"))
                }),
                with(AwsBedrockConverse, |v| {
                    v["toolConfig"]["tools"].as_array_mut().unwrap().pop();
                    v["messages"][2]["content"][0]["toolResult"].as_object_mut().unwrap().remove("status");
                }),
            )
        },
        Case {
            path: NOVA_PATH,
            ..case(
                "bedrock.tool_result_status_claude_only",
                with(AwsBedrockConverse, |v| v["toolConfig"]["tools"].as_array_mut().unwrap().truncate(1)),
                // Claude (the default path) takes it.
                ok(AwsBedrockConverse),
            )
        },
    ];
    // Gemini and Code Assist: the same checks, the same cases.
    for (family, prefix) in [(GoogleGenerateContent, "gemini"), (GoogleCodeAssist, "code_assist")] {
        let g = move |f: &dyn Fn(&mut Value)| {
            let mut v = base(family);
            let inner = if family == GoogleCodeAssist { &mut v["request"] } else { &mut v };
            f(inner);
            v
        };
        let id = |name: &str| -> &'static str { find(&format!("{prefix}.{name}")).unwrap().id };
        out.extend([
            case(id("contents_non_empty"), g(&|v| v["contents"] = json!([])), ok(family)),
            case(id("roles"), g(&|v| v["contents"][3]["role"] = json!("assistant")), ok(family)),
            case(
                id("function_response_follows_call"),
                g(&|v| drop(v["contents"].as_array_mut().unwrap().remove(1))),
                ok(family),
            ),
            case(
                id("function_response_count"),
                g(&|v| drop(v["contents"][2]["parts"].as_array_mut().unwrap().pop())),
                ok(family),
            ),
            case(
                id("function_response_name"),
                g(&|v| drop(v["contents"][2]["parts"][1]["functionResponse"].as_object_mut().unwrap().remove("name"))),
                ok(family),
            ),
            case(
                id("function_name_pattern"),
                g(&|v| v["tools"][0]["functionDeclarations"][0]["name"] = json!("2stat")),
                g(&|v| v["tools"][0]["functionDeclarations"][0]["name"] = json!(format!("_{}", "a".repeat(63)))),
            ),
            case(
                id("function_name_pattern"),
                g(&|v| v["tools"][0]["functionDeclarations"][0]["name"] = json!("a".repeat(65))),
                ok(family),
            ),
            case(
                id("parameters_exclusive"),
                g(&|v| v["tools"][0]["functionDeclarations"][0]["parameters"] = json!({"type": "OBJECT"})),
                ok(family),
            ),
            case(
                id("parameters_schema_subset"),
                g(&|v| v["tools"][0]["functionDeclarations"][1]["parameters"]["additionalProperties"] = json!(false)),
                ok(family),
            ),
            case(
                id("parameters_schema_subset"),
                g(&|v| {
                    v["tools"][0]["functionDeclarations"][1]["parameters"]["properties"]["tags"]["items"]["const"] =
                        json!("a")
                }),
                ok(family),
            ),
        ]);
    }
    out
}

#[test]
fn every_rule_has_a_breaking_and_a_keeping_request() {
    let cases = cases();
    for rule in all() {
        assert!(cases.iter().any(|c| c.rule == rule.id), "rule {} has no case", rule.id);
    }
    for c in &cases {
        let rule = find(c.rule).unwrap();
        let got = check_value(rule.family, c.path, &c.headers, &c.bad);
        assert!(got.iter().any(|v| v.rule == c.rule), "{}: the bad request is not refused for it: {got:?}", c.rule);
        let headers = c.good_headers.as_ref().unwrap_or(&c.headers);
        let got = check_value(rule.family, c.good_path, headers, &c.good);
        assert_eq!(got, Vec::new(), "{}: the good request breaks rules", c.rule);
    }
}

#[test]
fn the_bases_keep_every_rule() {
    for family in Family::ALL {
        let body = serde_json::to_vec(&base(family)).unwrap();
        assert_eq!(check(family, path(family), &[], &body), Vec::new(), "{family:?}");
    }
}

#[test]
fn ids_are_unique_prefixed_and_sourced() {
    let mut seen = std::collections::BTreeSet::new();
    for family in Family::ALL {
        for rule in rules(family) {
            assert!(seen.insert(rule.id), "duplicate {}", rule.id);
            assert_eq!(rule.family, family, "{}", rule.id);
            assert!(!rule.source.is_empty() && !rule.what.is_empty(), "{}", rule.id);
            assert!(rule.id.split_once('.').is_some_and(|(p, n)| !p.is_empty() && !n.is_empty()), "{}", rule.id);
        }
    }
}

#[test]
fn refusals_are_the_providers_documents() {
    let v = |status| Violation { rule: "x.y", status, message: "m".into() };
    let body = |f, status| -> (u16, Value, Vec<(String, String)>) {
        let r = refusal(f, &v(status));
        (r.status, serde_json::from_slice(&r.body).unwrap(), r.headers)
    };
    assert_eq!(
        body(Family::AnthropicMessages, 400).1,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "m"}})
    );
    assert_eq!(body(Family::AnthropicMessages, 401).1["error"]["type"], "authentication_error");
    assert_eq!(
        body(Family::OpenaiChat, 400).1,
        json!({"error": {"message": "m", "type": "invalid_request_error", "param": null, "code": null}})
    );
    assert_eq!(body(Family::OpenaiChatgptResponses, 400).1, json!({"detail": "m"}));
    assert_eq!(
        body(Family::GoogleCodeAssist, 400).1,
        json!({"error": {"code": 400, "message": "m", "status": "INVALID_ARGUMENT"}})
    );
    let (status, doc, headers) = body(Family::AwsBedrockConverse, 400);
    assert_eq!((status, doc), (400, json!({"message": "m"})));
    assert_eq!(headers, h(&[("x-amzn-ErrorType", "ValidationException")]));
}

#[test]
fn models_come_from_the_path() {
    let m = |p| path_model(p);
    assert_eq!(m(CLAUDE_PATH).as_deref(), Some("anthropic.claude-sonnet-4-5-20250929-v1:0"));
    assert_eq!(
        m("/lane/x/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse").as_deref(),
        Some("gemini-2.5-flash")
    );
    assert_eq!(m("/v1/messages"), None);
    // Model-dependent rules do not apply when the model is unknown (a golden body).
    let body = base(Family::AwsBedrockConverse);
    assert_eq!(check_value(Family::AwsBedrockConverse, "", &[], &body), Vec::new());
}

#[test]
fn a_body_that_is_not_json_breaks_no_rule() {
    assert_eq!(check(Family::AnthropicMessages, "/v1/messages", &[], b"{not json"), Vec::new());
}
