//! Rendering per family: the bytes frame with broca's own SSE framer, and the events match the
//! examples of `provider-streams.md` member for member (generated ids and clocks aside).

use serde_json::{json, Value};

use super::super::script::{default_reply, StreamError, ToolCall, DEFAULT_REPLY_TEXT};
use super::examples::*;
use super::*;
use broca::provider::sse::SseEvent;

/// The SSE families (Bedrock's event stream has its own test below).
const ALL: [Family; 4] =
    [Family::AnthropicMessages, Family::OpenaiChat, Family::OpenaiResponses, Family::GoogleGenerateContent];

fn ctx() -> RenderCtx {
    RenderCtx { model: "mock-model".into(), id: "7".into(), created: 1_767_225_600, served_tier: None }
}

fn frame(family: Family, bytes: &[u8]) -> (Vec<SseEvent>, u64) {
    let mut framer = broca::provider::wire(family).framer();
    let mut pushed = framer.push(bytes).unwrap();
    let rest = framer.finish().unwrap();
    pushed.events.extend(rest.events);
    (pushed.events, pushed.comments)
}

fn events(family: Family, steps: &[Step]) -> Vec<SseEvent> {
    frame(family, &bytes(&render(family, steps, &ctx()))).0
}

fn data(e: &SseEvent) -> Value {
    serde_json::from_str(&e.data).unwrap_or(Value::Null)
}

/// The event name, else the data's `type` or `object`, `error` for an error chunk, else the
/// raw data (`[DONE]`).
fn kind(e: &SseEvent) -> String {
    let d = data(e);
    let named = e.event.as_deref().or(d["type"].as_str()).or(d["object"].as_str());
    let named = named.or(d.get("error").map(|_| "error"));
    named.unwrap_or(&e.data).to_string()
}

/// Members whose values are generated (ids, clocks, padding) or that the mock leaves out.
const GENERATED: &[&str] = &[
    "id",
    "item_id",
    "model",
    "created",
    "created_at",
    "completed_at",
    "obfuscation",
    "request_id",
    "system_fingerprint",
    "service_tier",
    "audio_tokens",
    "accepted_prediction_tokens",
    "rejected_prediction_tokens",
];

/// Every member `expected` shows is in `actual` with the same value; `ignored` members need
/// only be present (or, for those the mock leaves out, nothing).
fn assert_subset(expected: &Value, actual: &Value, at: &str, ignored: &[&str]) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, ev) in e {
                let path = format!("{at}.{k}");
                if ignored.contains(&k.as_str()) {
                    continue;
                }
                let av = a.get(k).unwrap_or_else(|| panic!("{path} missing in {actual}"));
                assert_subset(ev, av, &path, ignored);
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(e.len(), a.len(), "{at}: {expected} vs {actual}");
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                assert_subset(ev, av, &format!("{at}[{i}]"), ignored);
            }
        }
        _ => assert_eq!(expected, actual, "{at}"),
    }
}

/// The rendered events match the example's, in order, member for member.
fn assert_like(example: &str, actual: &[SseEvent], skip: &[&str], ignored: &[&str]) {
    let keep = |e: &&SseEvent| !skip.contains(&kind(e).as_str());
    let framed = frame(Family::AnthropicMessages, example.as_bytes()).0;
    let expected: Vec<&SseEvent> = framed.iter().filter(keep).collect();
    let actual: Vec<&SseEvent> = actual.iter().filter(keep).collect();
    let names = |v: &[&SseEvent]| v.iter().map(|e| kind(e)).collect::<Vec<_>>();
    assert_eq!(names(&actual), names(&expected));
    for (i, (e, a)) in expected.iter().zip(&actual).enumerate() {
        assert_eq!(e.event, a.event, "event {i}");
        match serde_json::from_str::<Value>(&e.data) {
            Ok(ev) => assert_subset(&ev, &data(a), &format!("event {i} ({})", kind(e)), ignored),
            Err(_) => assert_eq!(e.data, a.data, "event {i}"),
        }
    }
}

fn tool(id: &str, name: &str, fragments: &[&str]) -> Step {
    Step::ToolCall(ToolCall {
        id: id.into(),
        name: name.into(),
        fragments: fragments.iter().map(|f| f.to_string()).collect(),
    })
}

fn error(kind: &str, message: &str) -> Step {
    Step::Error(StreamError { kind: kind.into(), message: message.into(), done: false })
}

fn usage(input: u64, cached: u64, output: u64, reasoning: Option<u64>) -> Step {
    Step::Usage(Usage { input: Some(input), cached: Some(cached), output: Some(output), reasoning, ..Usage::default() })
}

#[test]
fn anthropic_matches_example_a() {
    let steps = [
        Step::Reasoning { text: "The user wants the size of build.log; ".into(), signature: None },
        Step::Reasoning {
            text: "I should stat the file first.".into(),
            signature: Some("EqQBCkYIBhgCKkD3mockSignatureBase64==".into()),
        },
        Step::Text("Let me check ".into()),
        Step::Text("that file.".into()),
        tool("toolu_01MockStat9xYz", "stat_file", &["{\"pa", "th\": \"build.log\"}"]),
        Step::Usage(Usage {
            input: Some(812),
            cached: Some(4096),
            cache_write: Some(0),
            output: Some(87),
            reasoning: None,
            measured: false,
        }),
        Step::Finish("tool_calls".into()),
    ];
    assert_like(EXAMPLE_A, &events(Family::AnthropicMessages, &steps), &[], GENERATED);
}

#[test]
fn anthropic_matches_example_b() {
    let steps = [
        Step::Usage(Usage { input: Some(40), output: Some(1), ..Usage::default() }),
        Step::Text("The three causes are".into()),
        error("overloaded_error", "Overloaded"),
    ];
    assert_like(EXAMPLE_B, &events(Family::AnthropicMessages, &steps), &["ping"], GENERATED);
}

#[test]
fn chat_matches_example_c() {
    let steps = [
        tool("call_MockA1", "stat_file", &["{\"path\": \"bu", "ild.log\"}"]),
        tool("call_MockB2", "stat_file", &["{\"path\": \"test.log\"}"]),
        usage(128, 384, 38, Some(0)),
    ];
    assert_like(EXAMPLE_C, &events(Family::OpenaiChat, &steps), &[], GENERATED);
}

#[test]
fn chat_matches_example_d() {
    let steps =
        [Step::Text("Hello".into()), error("server_error", "The server had an error while processing your request.")];
    assert_like(EXAMPLE_D, &events(Family::OpenaiChat, &steps), &[], GENERATED);
}

#[test]
fn responses_matches_example_e() {
    let steps = [
        Step::Text("Checking ".into()),
        Step::Text("the log.".into()),
        tool("call_MockC3", "stat_file", &["{\"path\":\"bu", "ild.log\"}"]),
        usage(128, 512, 45, Some(16)),
    ];
    assert_like(EXAMPLE_E, &events(Family::OpenaiResponses, &steps), &[], GENERATED);
}

#[test]
fn responses_matches_example_f() {
    let steps = [error("server_error", "The server had an error processing your request.")];
    let ignored: Vec<&str> = GENERATED.iter().copied().chain(["sequence_number"]).collect();
    assert_like(EXAMPLE_F, &events(Family::OpenaiResponses, &steps), &["response.in_progress"], &ignored);
}

/// A script touching every kind of step.
fn rich() -> Vec<Step> {
    vec![
        Step::Comment("keepalive".into()),
        Step::Reasoning { text: "Think ".into(), signature: None },
        Step::Reasoning { text: "more.".into(), signature: Some("sig==".into()) },
        Step::RedactedReasoning("opaque==".into()),
        Step::Text("héllo ".into()),
        Step::DelayMs(1),
        Step::Text("wörld 🎉".into()),
        Step::UnknownEvent { name: "mystery".into(), data: json!({"type": "mystery", "x": 1}) },
        Step::Refusal("no.".into()),
        Step::ToolCall(ToolCall::new("call_1", "stat_file", "{\"path\":\"a\\\"b\"}", 4)),
        Step::ToolCall(ToolCall::new("call_2", "ls", "{}", 1)),
        usage(10, 5, 20, Some(3)),
    ]
}

#[test]
fn any_byte_split_frames_the_same_events() {
    for family in ALL {
        let all = bytes(&render(family, &rich(), &ctx()));
        let (whole, comments) = frame(family, &all);
        assert_eq!(comments, 1);
        for cut in (0..all.len()).step_by(7) {
            let mut framer = broca::provider::wire(family).framer();
            let mut got = framer.push(&all[..cut]).unwrap().events;
            got.extend(framer.push(&all[cut..]).unwrap().events);
            got.extend(framer.finish().unwrap().events);
            assert_eq!(got, whole, "{family:?} cut {cut}");
        }
    }
}

#[test]
fn anthropic_envelope_is_well_formed() {
    let evs = events(Family::AnthropicMessages, &rich());
    let names: Vec<String> = evs.iter().map(kind).collect();
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    assert_eq!(names.iter().filter(|n| *n == "ping").count(), 1);
    assert_eq!(names[names.iter().position(|n| n == "ping").unwrap() - 1], "content_block_start");
    // Blocks do not interleave; indexes count up from 0.
    let mut open: Option<u64> = None;
    let mut next = 0;
    let mut blocks = Vec::new();
    for e in &evs {
        let d = data(e);
        if e.event.as_deref() != Some("mystery") {
            assert_eq!(e.event.as_deref(), d["type"].as_str(), "event name = type");
        }
        match kind(e).as_str() {
            "content_block_start" => {
                assert_eq!((open, d["index"].as_u64()), (None, Some(next)));
                open = Some(next);
                next += 1;
                blocks.push(d["content_block"]["type"].as_str().unwrap().to_string());
            }
            "content_block_delta" => assert_eq!(d["index"].as_u64(), open),
            "content_block_stop" => assert_eq!(d["index"].as_u64(), open.take()),
            _ => {}
        }
    }
    assert_eq!(blocks, ["thinking", "redacted_thinking", "text", "tool_use", "tool_use"]);
    let deltas = |t: &str, field: &str| -> String {
        evs.iter()
            .map(data)
            .filter(|d| d["delta"]["type"] == t)
            .map(|d| d["delta"][field].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(deltas("thinking_delta", "thinking"), "Think more.");
    assert_eq!(deltas("signature_delta", "signature"), "sig==");
    assert_eq!(deltas("text_delta", "text"), "héllo wörld 🎉no.");
    assert_eq!(deltas("input_json_delta", "partial_json"), "{\"path\":\"a\\\"b\"}{}");
    let start = data(&evs[0]);
    assert_eq!(
        start["message"]["usage"],
        json!({"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1})
    );
    let delta = data(&evs[evs.len() - 2]);
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"], json!({"output_tokens": 20}));
}

#[test]
fn chat_chunks_are_consistent() {
    let evs = events(Family::OpenaiChat, &rich());
    assert_eq!(evs.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = evs.iter().filter(|e| e.event.is_none()).map(data).filter(|d| d.is_object()).collect();
    for c in &chunks {
        assert_eq!(
            (c["id"].as_str(), c["created"].as_u64(), c["model"].as_str()),
            (Some("chatcmpl-mock7"), Some(1_767_225_600), Some("mock-model"))
        );
        assert_eq!(c["object"], "chat.completion.chunk");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let concat =
        |field: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][field].as_str()).collect() };
    assert_eq!(concat("reasoning_content"), "Think more.");
    assert_eq!(concat("content"), "héllo wörld 🎉");
    assert_eq!(concat("refusal"), "no.");
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert_eq!(calls[0]["function"], json!({"name": "stat_file", "arguments": ""}));
    assert_eq!(calls.iter().filter(|c| c["index"] == 0).count(), 5, "start + 4 fragments");
    assert_eq!(calls.iter().filter(|c| c["index"] == 1).count(), 2);
    let finish: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null() && c["choices"].get(0).is_some())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "tool_calls");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 15, "completion_tokens": 20, "total_tokens": 35,
            "prompt_tokens_details": {"cached_tokens": 5}, "completion_tokens_details": {"reasoning_tokens": 3}})
    );
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["usage"].is_null() && c.get("usage").is_some()));
}

#[test]
fn responses_stream_is_numbered_and_complete() {
    let evs = events(Family::OpenaiResponses, &rich());
    let seqs: Vec<u64> = evs.iter().filter_map(|e| data(e)["sequence_number"].as_u64()).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(seqs.len(), evs.len() - 1, "all but the scripted unknown event");
    let done = data(evs.last().unwrap());
    assert_eq!(done["type"], "response.completed");
    let output = &done["response"]["output"];
    let types: Vec<&str> = output.as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["reasoning", "reasoning", "message", "function_call", "function_call"]);
    assert_eq!(output[0]["summary"], json!([{"type": "summary_text", "text": "Think more."}]));
    assert_eq!(output[0]["encrypted_content"], "sig==");
    assert_eq!((output[1]["summary"].clone(), output[1]["encrypted_content"].clone()), (json!([]), json!("opaque==")));
    assert_eq!(
        output[2]["content"],
        json!([{"type": "output_text", "text": "héllo wörld 🎉", "annotations": []}, {"type": "refusal", "refusal": "no."}])
    );
    assert_eq!(
        (output[3]["call_id"].as_str(), output[3]["arguments"].as_str()),
        (Some("call_1"), Some("{\"path\":\"a\\\"b\"}"))
    );
    assert_eq!(
        done["response"]["usage"],
        json!({"input_tokens": 15, "input_tokens_details": {"cached_tokens": 5}, "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 35})
    );
    // Each item's output_index is its position in the final output.
    for e in evs.iter().filter(|e| kind(e) == "response.output_item.done") {
        let d = data(e);
        assert_eq!(output[d["output_index"].as_u64().unwrap() as usize], d["item"]);
    }
}

#[test]
fn no_usage_step_means_no_usage_anywhere() {
    let steps = [Step::Text("hi".into())];
    for family in ALL {
        for e in events(family, &steps) {
            let d = data(&e);
            let usage = [&d["message"]["usage"], &d["usage"], &d["response"]["usage"]];
            assert!(usage.iter().all(|u| u.is_null()), "{family:?}: {}", e.data);
        }
    }
    let chat = events(Family::OpenaiChat, &steps);
    assert!(chat.iter().all(|e| !e.data.contains("usage")));
}

#[test]
fn usage_fields_render_natively_and_absent_ones_are_omitted() {
    let steps = [Step::Usage(Usage { input: Some(3), cache_write: Some(4), output: Some(5), ..Usage::default() })];
    let a = events(Family::AnthropicMessages, &steps);
    assert_eq!(
        data(&a[0])["message"]["usage"],
        json!({"input_tokens": 3, "cache_creation_input_tokens": 4, "output_tokens": 1})
    );
    let c = events(Family::OpenaiChat, &steps);
    assert_eq!(
        data(&c[c.len() - 2])["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12, "prompt_tokens_details": {"cache_write_tokens": 4}})
    );
    let r = events(Family::OpenaiResponses, &steps);
    assert_eq!(
        data(r.last().unwrap())["response"]["usage"],
        json!({"input_tokens": 7, "input_tokens_details": {"cache_write_tokens": 4}, "output_tokens": 5, "total_tokens": 12})
    );
    let only_output = [Step::Usage(Usage { output: Some(2), ..Usage::default() })];
    let c = events(Family::OpenaiChat, &only_output);
    assert_eq!(data(&c[c.len() - 2])["usage"], json!({"completion_tokens": 2, "total_tokens": 2}));
}

/// The native terminal of each family for a finish reason: (Anthropic stop_reason, Chat
/// finish_reason, Responses terminal event and incomplete reason).
#[test]
fn finish_reasons_map_natively() {
    let cases = [
        ("stop", "end_turn", "stop", "response.completed", Value::Null),
        ("length", "max_tokens", "length", "response.incomplete", json!("max_output_tokens")),
        ("tool_calls", "tool_use", "tool_calls", "response.completed", Value::Null),
        ("content_filter", "refusal", "content_filter", "response.incomplete", json!("content_filter")),
        ("refusal", "refusal", "stop", "response.completed", Value::Null),
        ("pause_turn", "pause_turn", "pause_turn", "response.incomplete", json!("pause_turn")),
    ];
    for (reason, anthropic, chat, terminal, why) in cases {
        let steps = [Step::Text("x".into()), Step::Finish(reason.into())];
        let a = events(Family::AnthropicMessages, &steps);
        assert_eq!(data(&a[a.len() - 2])["delta"]["stop_reason"], anthropic);
        let c = events(Family::OpenaiChat, &steps);
        assert_eq!(data(&c[c.len() - 2])["choices"][0]["finish_reason"], chat);
        let r = events(Family::OpenaiResponses, &steps);
        let last = data(r.last().unwrap());
        assert_eq!(last["type"], terminal);
        assert_eq!(last["response"]["incomplete_details"]["reason"], why);
    }
}

#[test]
fn implicit_finish_is_stop_or_tool_calls() {
    let text = [Step::Text("x".into())];
    let call = [Step::ToolCall(ToolCall::new("c", "f", "{}", 1))];
    let a = events(Family::AnthropicMessages, &text);
    assert_eq!(data(&a[a.len() - 2])["delta"]["stop_reason"], "end_turn");
    let a = events(Family::AnthropicMessages, &call);
    assert_eq!(data(&a[a.len() - 2])["delta"]["stop_reason"], "tool_use");
    let c = events(Family::OpenaiChat, &call);
    assert_eq!(data(&c[c.len() - 2])["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn errors_and_disconnects_end_without_a_terminal() {
    let terminal = ["message_stop", "[DONE]", "response.completed"];
    for family in ALL {
        let cut = render(family, &[Step::Text("partial".into()), Step::Disconnect], &ctx());
        assert_eq!(cut.last(), Some(&Piece::Disconnect));
        let evs = frame(family, &bytes(&cut)).0;
        assert!(evs.iter().all(|e| !terminal.contains(&kind(e).as_str())), "{family:?}");
        let failed = events(family, &[Step::Text("partial".into()), error("overloaded_error", "Overloaded")]);
        assert!(failed.iter().all(|e| !terminal.contains(&kind(e).as_str())), "{family:?}");
        // Gemini names the failure by its status, the others by the scripted type.
        let named = if family == Family::GoogleGenerateContent { "UNAVAILABLE" } else { "overloaded_error" };
        assert!(failed.iter().any(|e| e.data.contains(named)), "{family:?}");
    }
    let done = Step::Error(StreamError { kind: "server_error".into(), message: "m".into(), done: true });
    let chat = events(Family::OpenaiChat, &[done]);
    assert_eq!(chat.iter().map(|e| e.data.as_str()).next_back(), Some("[DONE]"));
    assert_eq!(data(&chat[0])["error"]["type"], "server_error");
    let r = events(Family::OpenaiResponses, &[Step::Text("a".into()), error("server_error", "m")]);
    let last = data(r.last().unwrap());
    assert_eq!((last["type"].as_str(), last["response"]["status"].as_str()), (Some("response.failed"), Some("failed")));
}

#[test]
fn leading_timing_steps_come_before_the_envelope() {
    for family in ALL {
        let pieces = render(family, &[Step::DelayMs(5), Step::Text("x".into())], &ctx());
        assert_eq!(pieces[0], Piece::Delay(5), "{family:?}");
        let pieces = render(family, &[Step::Disconnect], &ctx());
        assert_eq!(pieces, vec![Piece::Disconnect], "{family:?}");
    }
}

#[test]
fn comments_and_unknown_events_are_verbatim() {
    let steps =
        [Step::Comment("keepalive".into()), Step::UnknownEvent { name: String::new(), data: json!({"odd": true}) }];
    for family in ALL {
        let all = bytes(&render(family, &steps, &ctx()));
        let text = String::from_utf8(all).unwrap();
        assert!(text.starts_with(": keepalive\n\ndata: {\"odd\":true}\n\n"), "{family:?}: {text}");
    }
}

#[test]
fn redacted_reasoning_is_dropped_in_chat() {
    let evs = events(Family::OpenaiChat, &[Step::RedactedReasoning("x".into()), Step::Text("t".into())]);
    assert!(evs.iter().all(|e| !e.data.contains("\"x\"")));
}

#[test]
fn default_reply_says_hello_in_every_family() {
    let reply = default_reply();
    for family in ALL {
        let evs = events(family, &reply.events);
        let text: String = evs
            .iter()
            .map(data)
            .filter_map(|d| {
                d["delta"]["text"]
                    .as_str()
                    .or(d["choices"][0]["delta"]["content"].as_str())
                    .or(if d["type"] == "response.output_text.delta" { d["delta"].as_str() } else { None })
                    .or(d["candidates"][0]["content"]["parts"][0]["text"].as_str())
                    .map(str::to_string)
            })
            .collect();
        assert_eq!(text, DEFAULT_REPLY_TEXT, "{family:?}");
        assert!(evs.iter().any(|e| ["\"output_tokens\":6", "\"completion_tokens\":6", "\"candidatesTokenCount\":6"]
            .iter()
            .any(|n| e.data.contains(n))));
    }
}

#[test]
fn error_documents_have_each_family_shape() {
    let a = error_document(Family::AnthropicMessages, 529, "req_1");
    assert_eq!(
        a,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_1"})
    );
    assert_eq!(error_document(Family::AnthropicMessages, 401, "r")["error"]["type"], "authentication_error");
    let o = error_document(Family::OpenaiChat, 429, "r");
    assert_eq!(
        (o["error"]["type"].as_str(), o["error"]["code"].as_str()),
        (Some("requests"), Some("rate_limit_exceeded"))
    );
    assert_eq!(error_document(Family::OpenaiResponses, 401, "r")["error"]["code"], "invalid_api_key");
}

/// Bedrock: the rendered event stream frames (CRCs checked) and decodes, through broca's own
/// decoder, to the script's text, reasoning and signature, call, finish and usage; a split
/// anywhere frames the same; an error is an exception message and no `metadata` follows it.
#[test]
fn bedrock_renders_a_checked_event_stream_broca_decodes() {
    use broca::provider::event::StreamEvent;
    let family = Family::AwsBedrockConverse;
    let all = bytes(&render(family, &rich(), &ctx()));
    let (whole, comments) = frame(family, &all);
    assert_eq!(comments, 0, "an event stream has no comments");
    for cut in (0..all.len()).step_by(5) {
        let mut framer = broca::provider::wire(family).framer();
        let mut got = framer.push(&all[..cut]).unwrap().events;
        got.extend(framer.push(&all[cut..]).unwrap().events);
        assert_eq!(got, whole, "cut {cut}");
    }
    let mut decoder = broca::provider::wire(family).decoder();
    let mut out = Vec::new();
    for event in &whole {
        decoder.decode(event, &mut out).unwrap();
    }
    assert!(decoder.finished(), "metadata ends the stream");
    assert!(out.iter().any(|e| matches!(e, StreamEvent::TextDelta { .. })), "{out:?}");
    assert!(out.iter().any(|e| matches!(e, StreamEvent::ToolCallStart { .. })), "{out:?}");
    assert!(out.iter().any(|e| matches!(e, StreamEvent::Finish { .. })), "{out:?}");
    let failed = events(family, &[Step::Text("partial".into()), error("overloaded_error", "Overloaded")]);
    assert_eq!(failed.last().unwrap().event.as_deref(), Some("exception:modelStreamErrorException"));
    assert!(failed.iter().all(|e| e.event.as_deref() != Some("metadata")));
}

#[test]
fn a_text_block_opens_an_anthropic_block_of_its_own_and_is_plain_text_elsewhere() {
    let steps = [Step::TextBlock("one".into()), Step::Text(" more".into()), Step::TextBlock("two".into())];
    let starts = |family| {
        events(family, &steps)
            .iter()
            .filter(|e| kind(e) == "content_block_start" && data(e)["content_block"]["type"] == "text")
            .count()
    };
    assert_eq!(starts(Family::AnthropicMessages), 2);
    let chat: String = events(Family::OpenaiChat, &steps)
        .iter()
        .filter_map(|e| data(e)["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(chat, "one moretwo");
}
