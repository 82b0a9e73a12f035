//! Synthetic streams: shapes the providers document that no fixture in `testdata/real-streams/`
//! shows. Each case is written from the provider document it names (its `doc`), not captured, and
//! checked as the fixtures are (every split, the attempt's assembly).

use broca::frozen::Family;
use broca::provider::eventstream::encode;
use broca::record::ErrorClass;

use super::{check_all, exact, text, Call, Case, Reasoning, Source};

/// SSE events, each `(event name, data)`; an empty name writes no `event:` line.
fn sse(events: &[(&str, &str)]) -> Vec<u8> {
    let mut out = String::new();
    for (name, data) in events {
        if !name.is_empty() {
            out += &format!("event: {name}\n");
        }
        out += &format!("data: {data}\n\n");
    }
    out.into_bytes()
}

/// Anthropic events: each named by its data's `type`, as Messages names them.
fn anthropic_sse(datas: &[&str]) -> Vec<u8> {
    let named: Vec<(String, &str)> = datas
        .iter()
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).expect("an event is JSON");
            (v["type"].as_str().expect("an event has a type").to_string(), *d)
        })
        .collect();
    sse(&named.iter().map(|(n, d)| (n.as_str(), *d)).collect::<Vec<_>>())
}

/// `data:`-only events (Chat, Gemini).
fn data_sse(datas: &[&str]) -> Vec<u8> {
    sse(&datas.iter().map(|d| ("", *d)).collect::<Vec<_>>())
}

/// Bedrock event-stream messages: `("exception:<type>", payload)` is an exception message, any
/// other name an event of that `:event-type`.
fn eventstream(messages: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, payload) in messages {
        let headers = match name.strip_prefix("exception:") {
            Some(kind) => {
                vec![(":exception-type", kind), (":content-type", "application/json"), (":message-type", "exception")]
            }
            None => {
                vec![(":event-type", *name), (":content-type", "application/json"), (":message-type", "event")]
            }
        };
        out.extend(encode(&headers, payload.as_bytes()));
    }
    out
}

fn synthetic(name: impl Into<String>, family: Family, doc: &'static str, bytes: Vec<u8>) -> Case {
    Case::new(name, family, Source::Synthetic { doc, bytes })
}

const ANTHROPIC_STREAMING: &str = "platform.claude.com/docs/build-with-claude/streaming";
const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}"#;
const TEXT_START_0: &str = r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
const TEXT_DELTA_0: &str =
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"The three causes are"}}"#;

fn anthropic() -> Vec<Case> {
    let error = |kind: &str| {
        let error = format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"m"}},"request_id":"req_s"}}"#);
        anthropic_sse(&[MESSAGE_START, TEXT_START_0, TEXT_DELTA_0, &error])
    };
    let end = |reason: &str| {
        format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"{reason}","stop_sequence":null}},"usage":{{"output_tokens":7}}}}"#
        )
    };
    let stop = r#"{"type":"message_stop"}"#;
    let partial = text("The three causes are");
    vec![
        // The error types of the SDK's `types/shared`: a malformed request is permanent, the
        // service's own failure transient (overloaded_error is fixture a11).
        synthetic(
            "anthropic: invalid_request_error mid-stream",
            Family::AnthropicMessages,
            ANTHROPIC_STREAMING,
            error("invalid_request_error"),
        )
        .parts([partial])
        .usage([Some(10), Some(0), Some(0), Some(1), None])
        .error(ErrorClass::Permanent, "invalid_request_error"),
        synthetic(
            "anthropic: api_error mid-stream",
            Family::AnthropicMessages,
            ANTHROPIC_STREAMING,
            error("api_error"),
        )
        .parts([partial])
        .usage([Some(10), Some(0), Some(0), Some(1), None])
        .error(ErrorClass::Transient, "api_error"),
        // "We may occasionally add new event types, and your code should handle unknown event
        // types gracefully": an unknown event, delta and block type are skipped; an empty text
        // block adds no part; the text blocks around it stay two parts.
        synthetic(
            "anthropic: unknown event, delta and block types; an empty text block",
            Family::AnthropicMessages,
            ANTHROPIC_STREAMING,
            anthropic_sse(&[
                MESSAGE_START,
                r#"{"type":"message_annotation","note":"a later event type"}"#,
                TEXT_START_0,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"One."}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"future_delta","x":1}}"#,
                r#"{"type":"content_block_stop","index":0}"#,
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"future_block","data":{}}}"#,
                r#"{"type":"content_block_stop","index":1}"#,
                r#"{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}"#,
                r#"{"type":"content_block_stop","index":2}"#,
                r#"{"type":"content_block_start","index":3,"content_block":{"type":"text","text":""}}"#,
                r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"Two."}}"#,
                r#"{"type":"content_block_stop","index":3}"#,
                &end("end_turn"),
                stop,
            ]),
        )
        .parts([text("One."), text("Two.")])
        .usage([Some(10), Some(0), Some(0), Some(7), None])
        .finish("stop", "end_turn"),
        // stop_reason `refusal` (the SDK's stop_reason.py): broca's `refusal`, which run.result
        // reports as the role's content_filter.
        synthetic(
            "anthropic: refusal",
            Family::AnthropicMessages,
            ANTHROPIC_STREAMING,
            anthropic_sse(&[MESSAGE_START, TEXT_START_0, TEXT_DELTA_0, &end("refusal"), stop]),
        )
        .parts([partial])
        .usage([Some(10), Some(0), Some(0), Some(7), None])
        .finish("refusal", "refusal"),
    ]
}

const CHAT_STREAMING: &str = "platform.openai.com/docs/api-reference/chat-streaming";

/// A Chat chunk whose choice 0 has `delta` and `finish_reason`.
fn chunk(delta: &str, finish: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}],"usage":null}}"#
    )
}

fn openai_chat() -> Vec<Case> {
    let usage_chunk = r#"{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":38,"total_tokens":550,"prompt_tokens_details":{"cached_tokens":384},"completion_tokens_details":{"reasoning_tokens":0}}}"#;
    vec![
        // Two calls interleaved by `index`, the usage-only chunk with `choices: []`, `[DONE]`.
        synthetic(
            "openai_chat: parallel tool calls and the usage-only chunk",
            Family::OpenaiChat,
            CHAT_STREAMING,
            data_sse(&[
                &chunk(
                    r#"{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"stat_file","arguments":""}}]}"#,
                    "null",
                ),
                &chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"bu"}}]}"#, "null"),
                &chunk(
                    r#"{"tool_calls":[{"index":1,"id":"call_B","type":"function","function":{"name":"stat_file","arguments":""}}]}"#,
                    "null",
                ),
                &chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"ild.log\"}"}}]}"#, "null"),
                &chunk(r#"{"tool_calls":[{"index":1,"function":{"arguments":"{\"path\": \"test.log\"}"}}]}"#, "null"),
                &chunk("{}", r#""tool_calls""#),
                usage_chunk,
                "[DONE]",
            ]),
        )
        .calls([Call("call_A", "stat_file", r#"{"path":"build.log"}"#), Call("call_B", "stat_file", r#"{"path":"test.log"}"#)])
        .usage([Some(128), Some(384), None, Some(38), Some(0)])
        .finish("tool_calls", "tool_calls"),
        // `finish_reason: content_filter`, content omitted by the filter.
        synthetic(
            "openai_chat: content_filter",
            Family::OpenaiChat,
            CHAT_STREAMING,
            data_sse(&[
                &chunk(r#"{"role":"assistant","content":"Here is"}"#, "null"),
                &chunk("{}", r#""content_filter""#),
                "[DONE]",
            ]),
        )
        .parts([text("Here is")])
        .finish("content_filter", "content_filter"),
        // `delta.refusal` then `stop`: the model refused.
        synthetic(
            "openai_chat: refusal",
            Family::OpenaiChat,
            CHAT_STREAMING,
            data_sse(&[
                &chunk(r#"{"role":"assistant","content":null,"refusal":"I can't help with that."}"#, "null"),
                &chunk("{}", r#""stop""#),
                "[DONE]",
            ]),
        )
        .parts([text("I can't help with that.")])
        .finish("refusal", "stop"),
        // A chunk with an `error` member and no choices (openai-python's `_streaming.py` raises
        // APIError on it): server_error is transient.
        synthetic(
            "openai_chat: server_error mid-stream",
            Family::OpenaiChat,
            CHAT_STREAMING,
            data_sse(&[
                &chunk(r#"{"role":"assistant","content":"Hello"}"#, "null"),
                r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#,
            ]),
        )
        .parts([text("Hello")])
        .error(ErrorClass::Transient, "server_error"),
    ]
}

const RESPONSES_STREAMING: &str = "platform.openai.com/docs/api-reference/responses-streaming";

fn openai_responses() -> Vec<Case> {
    let created = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_s","object":"response","status":"in_progress","output":[],"usage":null}}"#;
    let text_delta = |output: u32, item: &str, delta: &str| {
        format!(
            r#"{{"type":"response.output_text.delta","item_id":"{item}","output_index":{output},"content_index":0,"delta":"{delta}","logprobs":[]}}"#
        )
    };
    let message_added = |output: u32, item: &str| {
        format!(
            r#"{{"type":"response.output_item.added","output_index":{output},"item":{{"id":"{item}","type":"message","role":"assistant","status":"in_progress","content":[]}}}}"#
        )
    };
    let usage = r#""usage":{"input_tokens":20,"input_tokens_details":{"cached_tokens":0},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":29}"#;
    let incomplete = |reason: &str| {
        format!(
            r#"{{"type":"response.incomplete","response":{{"id":"resp_s","object":"response","status":"incomplete","incomplete_details":{{"reason":"{reason}"}},{usage}}}}}"#
        )
    };
    let completed =
        format!(r#"{{"type":"response.completed","response":{{"id":"resp_s","status":"completed",{usage}}}}}"#);
    let named = |datas: &[&str]| {
        let events: Vec<(String, &str)> = datas
            .iter()
            .map(|d| {
                let v: serde_json::Value = serde_json::from_str(d).expect("an event is JSON");
                (v["type"].as_str().expect("a type").to_string(), *d)
            })
            .collect();
        sse(&events.iter().map(|(n, d)| (n.as_str(), *d)).collect::<Vec<_>>())
    };
    vec![
        // `response.incomplete` with `incomplete_details.reason`: content_filter and
        // max_output_tokens (the role's `incomplete:<reason>` rows).
        synthetic(
            "openai_responses: incomplete, content_filter",
            Family::OpenaiResponses,
            RESPONSES_STREAMING,
            named(&[created, &message_added(0, "msg_1"), &text_delta(0, "msg_1", "Sure, here"), &incomplete("content_filter")]),
        )
        .parts([text("Sure, here")])
        .usage([Some(20), Some(0), None, Some(9), Some(0)])
        .finish("content_filter", "content_filter"),
        synthetic(
            "openai_responses: incomplete, max_output_tokens",
            Family::OpenaiResponses,
            RESPONSES_STREAMING,
            named(&[created, &message_added(0, "msg_1"), &text_delta(0, "msg_1", "Sure, here"), &incomplete("max_output_tokens")]),
        )
        .parts([text("Sure, here")])
        .usage([Some(20), Some(0), None, Some(9), Some(0)])
        .finish("length", "max_output_tokens"),
        // `response.failed` alone (no `error` event before it): its `response.error`.
        synthetic(
            "openai_responses: failed, server_error",
            Family::OpenaiResponses,
            RESPONSES_STREAMING,
            named(&[
                created,
                r#"{"type":"response.failed","response":{"id":"resp_s","status":"failed","error":{"code":"server_error","message":"The server had an error."},"usage":null}}"#,
            ]),
        )
        .error(ErrorClass::Transient, "server_error"),
        // Two message items (a commentary message, then the final answer) stay two text parts;
        // an event type this reader does not know is skipped.
        synthetic(
            "openai_responses: two message items, an unknown event",
            Family::OpenaiResponses,
            RESPONSES_STREAMING,
            named(&[
                created,
                &message_added(0, "msg_1"),
                &text_delta(0, "msg_1", "Let me look."),
                r#"{"type":"response.future_event","sequence_number":3}"#,
                &message_added(1, "msg_2"),
                &text_delta(1, "msg_2", "It is 3."),
                &completed,
            ]),
        )
        .parts([text("Let me look."), text("It is 3.")])
        .usage([Some(20), Some(0), None, Some(9), Some(0)])
        .finish("stop", "completed"),
        // GitHub Copilot's endpoint gives each event of one item a new `item_id` (fixture r05, on
        // reasoning and message items); the same rotation on a function call and on two summary
        // parts. `output_index` names the item throughout.
        synthetic(
            "openai_responses: rotating item ids on a function call and summary parts",
            Family::OpenaiResponses,
            "platform.openai.com/docs/api-reference/responses-streaming (output_index); fixture r05",
            named(&[
                created,
                r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"id-1","type":"reasoning","summary":[]}}"#,
                r#"{"type":"response.reasoning_summary_part.added","item_id":"id-2","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}"#,
                r#"{"type":"response.reasoning_summary_text.delta","item_id":"id-3","output_index":0,"summary_index":0,"delta":"**One**"}"#,
                r#"{"type":"response.reasoning_summary_part.added","item_id":"id-4","output_index":0,"summary_index":1,"part":{"type":"summary_text","text":""}}"#,
                r#"{"type":"response.reasoning_summary_text.delta","item_id":"id-5","output_index":0,"summary_index":1,"delta":"**Two**"}"#,
                r#"{"type":"response.output_item.done","output_index":0,"item":{"id":"id-6","type":"reasoning","summary":[]}}"#,
                r#"{"type":"response.output_item.added","output_index":1,"item":{"id":"id-7","type":"function_call","call_id":"call_R","name":"get_capital","arguments":"","status":"in_progress"}}"#,
                r#"{"type":"response.function_call_arguments.delta","item_id":"id-8","output_index":1,"delta":"{\"country\":"}"#,
                r#"{"type":"response.function_call_arguments.delta","item_id":"id-9","output_index":1,"delta":"\"France\"}"}"#,
                r#"{"type":"response.function_call_arguments.done","item_id":"id-10","output_index":1,"arguments":"{\"country\":\"France\"}"}"#,
                r#"{"type":"response.output_item.done","output_index":1,"item":{"id":"id-11","type":"function_call","call_id":"call_R","name":"get_capital","arguments":"{\"country\":\"France\"}","status":"completed"}}"#,
                &completed,
            ]),
        )
        .parts([Reasoning(exact("**One**\n\n**Two**"), None)])
        .calls([Call("call_R", "get_capital", r#"{"country":"France"}"#)])
        .usage([Some(20), Some(0), None, Some(9), Some(0)])
        .finish("tool_calls", "completed"),
    ]
}

const GEMINI_API: &str = "ai.google.dev/api/generate-content (FinishReason, UsageMetadata)";

/// A Gemini chunk: candidate 0's parts and finish reason (JSON fragments), usage.
fn gemini_chunk(parts: &str, finish: Option<&str>, usage: &str) -> String {
    let finish = finish.map(|f| format!(r#","finishReason":"{f}""#)).unwrap_or_default();
    format!(
        r#"{{"candidates":[{{"content":{{"parts":{parts},"role":"model"}}{finish},"index":0}}],"usageMetadata":{usage},"modelVersion":"gemini-2.5-flash","responseId":"r_s"}}"#
    )
}

fn gemini() -> Vec<Case> {
    let usage = r#"{"promptTokenCount":1000,"cachedContentTokenCount":800,"candidatesTokenCount":12,"thoughtsTokenCount":30,"totalTokenCount":1042}"#;
    let stopped = |reason: &str| {
        synthetic(
            format!("gemini: {reason} after text"),
            Family::GoogleGenerateContent,
            GEMINI_API,
            data_sse(&[
                &gemini_chunk(r#"[{"text":"The lyrics go"}]"#, None, usage),
                &gemini_chunk("[]", Some(reason), usage),
            ]),
        )
        .parts([text("The lyrics go")])
        .usage([Some(200), Some(800), None, Some(42), Some(30)])
    };
    let error = |body: &str| {
        data_sse(&[&gemini_chunk(r#"[{"text":"Partial"}]"#, None, usage), &format!(r#"{{"error":{body}}}"#)])
    };
    vec![
        // The safety family of FinishReason is the role's content_filter, after partial text;
        // cachedContentTokenCount is inside promptTokenCount.
        stopped("RECITATION").finish("content_filter", "RECITATION"),
        stopped("SAFETY").finish("content_filter", "SAFETY"),
        stopped("PROHIBITED_CONTENT").finish("content_filter", "PROHIBITED_CONTENT"),
        stopped("MALFORMED_FUNCTION_CALL").finish("error", "MALFORMED_FUNCTION_CALL"),
        // Parts of kinds this reader does not act on (executableCode, codeExecutionResult) and
        // empty text parts add nothing.
        synthetic(
            "gemini: parts of other kinds, empty text",
            Family::GoogleGenerateContent,
            GEMINI_API,
            data_sse(&[
                &gemini_chunk(
                    r#"[{"executableCode":{"language":"PYTHON","code":"print(1)"}},{"codeExecutionResult":{"outcome":"OUTCOME_OK","output":"1\n"}},{"text":""}]"#,
                    None,
                    usage,
                ),
                &gemini_chunk(r#"[{"text":"It printed 1."},{"text":""}]"#, Some("STOP"), usage),
            ]),
        )
        .parts([text("It printed 1.")])
        .usage([Some(200), Some(800), None, Some(42), Some(30)])
        .finish("stop", "STOP"),
        // An error document mid-stream (the Gemini API's troubleshooting page lists each status
        // with its HTTP code): 429 RESOURCE_EXHAUSTED is transient; 400 FAILED_PRECONDITION (e.g.
        // the free tier unavailable in the caller's country) is permanent.
        synthetic(
            "gemini: RESOURCE_EXHAUSTED mid-stream",
            Family::GoogleGenerateContent,
            "ai.google.dev/gemini-api/docs/troubleshooting",
            error(r#"{"code":429,"message":"Resource has been exhausted.","status":"RESOURCE_EXHAUSTED"}"#),
        )
        .parts([text("Partial")])
        .usage([Some(200), Some(800), None, Some(42), Some(30)])
        .error(ErrorClass::Transient, "RESOURCE_EXHAUSTED"),
        synthetic(
            "gemini: FAILED_PRECONDITION mid-stream",
            Family::GoogleGenerateContent,
            "ai.google.dev/gemini-api/docs/troubleshooting",
            error(r#"{"code":400,"message":"User location is not supported for the API use.","status":"FAILED_PRECONDITION"}"#),
        )
        .parts([text("Partial")])
        .usage([Some(200), Some(800), None, Some(42), Some(30)])
        .error(ErrorClass::Permanent, "FAILED_PRECONDITION"),
    ]
}

const CONVERSE_STREAM: &str = "docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html";

fn bedrock() -> Vec<Case> {
    let start = ("messageStart", r#"{"role":"assistant"}"#);
    let delta = ("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":"Starting"}}"#);
    let exception = |kind: &str| {
        let name = format!("exception:{kind}");
        synthetic(
            format!("bedrock: {kind} mid-stream"),
            Family::AwsBedrockConverse,
            CONVERSE_STREAM,
            eventstream(&[start, delta, (&name, r#"{"message":"m"}"#)]),
        )
        .parts([text("Starting")])
    };
    vec![
        // The exception events ConverseStream documents: throttling, the model's stream failing
        // and the service's own faults are transient; a validation failure is permanent.
        exception("throttlingException").error(ErrorClass::Transient, "throttlingException"),
        exception("modelStreamErrorException").error(ErrorClass::Transient, "modelStreamErrorException"),
        exception("internalServerException").error(ErrorClass::Transient, "internalServerException"),
        exception("serviceUnavailableException").error(ErrorClass::Transient, "serviceUnavailableException"),
        exception("validationException").error(ErrorClass::Permanent, "validationException"),
        // Two text blocks stay two parts, an empty text delta adds nothing, an event type this
        // reader does not know is skipped; metadata.usage with the cache counts (inputTokens
        // excludes them: the prompt-caching guide).
        synthetic(
            "bedrock: two text blocks, an unknown event, cache usage",
            Family::AwsBedrockConverse,
            CONVERSE_STREAM,
            eventstream(&[
                start,
                delta,
                ("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":""}}"#),
                ("contentBlockStop", r#"{"contentBlockIndex":0}"#),
                ("futureEvent", r#"{"x":1}"#),
                ("contentBlockDelta", r#"{"contentBlockIndex":1,"delta":{"text":"Done."}}"#),
                ("contentBlockStop", r#"{"contentBlockIndex":1}"#),
                ("messageStop", r#"{"stopReason":"end_turn"}"#),
                (
                    "metadata",
                    r#"{"usage":{"inputTokens":12,"outputTokens":5,"cacheReadInputTokens":1000,"cacheWriteInputTokens":200,"totalTokens":1217},"metrics":{"latencyMs":9}}"#,
                ),
            ]),
        )
        .parts([text("Starting"), text("Done.")])
        .usage([Some(12), Some(1000), Some(200), Some(5), None])
        .finish("stop", "end_turn"),
        // stopReason guardrail_intervened is the role's content_filter (PF-42).
        synthetic(
            "bedrock: guardrail_intervened",
            Family::AwsBedrockConverse,
            CONVERSE_STREAM,
            eventstream(&[
                start,
                delta,
                ("messageStop", r#"{"stopReason":"guardrail_intervened"}"#),
                ("metadata", r#"{"usage":{"inputTokens":12,"outputTokens":1,"totalTokens":13}}"#),
            ]),
        )
        .parts([text("Starting")])
        .usage([Some(12), None, None, Some(1), None])
        .finish("content_filter", "guardrail_intervened"),
    ]
}

#[test]
fn anthropic_messages_documented_shapes() {
    check_all(anthropic());
}

#[test]
fn openai_chat_documented_shapes() {
    check_all(openai_chat());
}

#[test]
fn openai_responses_documented_shapes() {
    check_all(openai_responses());
}

#[test]
fn google_generate_content_documented_shapes() {
    check_all(gemini());
}

#[test]
fn aws_bedrock_converse_documented_shapes() {
    check_all(bedrock());
}
