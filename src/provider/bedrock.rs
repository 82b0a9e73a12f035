//! Amazon Bedrock Converse (`aws.bedrock_converse`): `POST {api}/model/{modelId}/converse-stream`
//! (`{api}` is the regional runtime endpoint, e.g. `https://bedrock-runtime.us-east-1.amazonaws.com`;
//! the model id is percent-encoded), authenticated with a Bedrock API key as `Authorization:
//! Bearer`. The answer is an `application/vnd.amazon.eventstream` ([`super::eventstream`]),
//! each message a JSON event. Request rendering and the event decoder.
//!
//! # Request
//!
//! `{messages, system?, toolConfig?, inferenceConfig?}`:
//! - the route's system prompt → `system: [{text}]`;
//! - user (and system-role) messages → `{role: "user", content: [{text} | {image: {format,
//!   source: {bytes}}}]}`;
//! - assistant → `{role: "assistant", content}`: reasoning with its signature →
//!   `{reasoningContent: {reasoningText: {text, signature}}}`, redacted reasoning →
//!   `{reasoningContent: {redactedContent}}` (both only back to the provider that minted
//!   them; reasoning without a signature is dropped), text → `{text}`, a call → `{toolUse:
//!   {toolUseId, name, input}}`;
//! - a tool-role message → `{role: "user", content: [{toolResult: {toolUseId, content: [{text}],
//!   status: "success" | "error"}}]}`;
//! - consecutive messages of one role are merged into one (Converse requires turns to
//!   alternate: tool results and a steered message travel together);
//! - tools → `toolConfig: {tools: [{toolSpec: {name, description?, inputSchema: {json}}}]}`;
//! - the output cap → `inferenceConfig.maxTokens`. Variants render nothing (spec §4 table).
//! - Prompt caching (`mark_cache`): a `{cachePoint: {type: "default"}}` block after the system
//!   prompt, after the tools and at the end of the last message, on the model families
//!   Bedrock caches (Anthropic Claude, Amazon Nova).
//!
//! # Stream
//!
//! Events by `:event-type`: `messageStart {role}`; `contentBlockStart {contentBlockIndex, start:
//! {toolUse: {toolUseId, name}}}`; `contentBlockDelta {contentBlockIndex, delta}` with `delta`
//! one of `text`, `toolUse.input` (argument JSON fragments), `reasoningContent.text`,
//! `reasoningContent.signature`, `reasoningContent.redactedContent`; `contentBlockStop`;
//! `messageStop {stopReason}`; then `metadata {usage: {inputTokens, outputTokens,
//! cacheReadInputTokens?, cacheWriteInputTokens?}, metrics}`, the terminal event. An
//! exception message (`throttlingException`, `modelStreamErrorException`,
//! `internalServerException`, `serviceUnavailableException`, `validationException`) is an
//! in-stream error.
//!
//! Finish reasons: `end_turn`, `stop_sequence` → stop; `max_tokens`,
//! `model_context_window_exceeded` → length; `tool_use` → tool_calls; `guardrail_intervened`,
//! `content_filtered` → content_filter; `malformed_model_output`, `malformed_tool_use` → error;
//! anything else → other (the role's own table, llm-runner §6.6).

use crate::frozen::{ToolChoice, ToolChoiceMode};
use std::collections::HashMap;

use serde_json::{json, Value};

use super::common::{
    class, data_object, replays_reasoning, str_at, tool_images, tool_output, u64_at, with_description,
};
use super::config::{RenderConfig, ToolSpec};
use super::errors::stream_error;
use super::event::{DecodeError, EventClass, StreamDecoder, StreamEvent};
use super::render_context::RenderContext;
use super::sse::SseEvent;
use crate::message::{Message, OutputPart, Part, Role, StepUsage};

/// The request path after the base URL for `wire_model` (percent-encoded: Bedrock ids hold
/// `:` and inference-profile ARNs hold `/`).
pub fn path(wire_model: &str) -> String {
    let mut id = String::with_capacity(wire_model.len());
    for b in wire_model.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => id.push(b as char),
            other => id.push_str(&format!("%{other:02X}")),
        }
    }
    format!("/model/{id}/converse-stream")
}

/// One transcript message's turn (none when it has no block): `{role, content}` for the
/// message and the config alone; [`merge_turn`] joins it to a turn of its role before it.
pub(crate) fn render_message(config: &RenderConfig, _context: &RenderContext, m: &Message) -> Vec<Value> {
    let (role, content) = match m.role {
        Role::User | Role::System => ("user", user_content(m)),
        Role::Assistant => ("assistant", assistant_content(m, replays_reasoning(m, config))),
        Role::Tool => {
            let status = result_status(&config.wire_model);
            ("user", m.content.iter().filter_map(|p| tool_result(p, status)).collect())
        }
    };
    if content.is_empty() {
        return Vec::new();
    }
    vec![json!({"role": role, "content": content})]
}

/// Merges `next` into `last` when both are turns of one role (`None`: merged): Converse
/// requires turns to alternate.
pub(crate) fn merge_turn(last: &mut Value, mut next: Value) -> Option<Value> {
    let role = last.get("role");
    let blocks = |turn: &Value| turn.get("content").is_some_and(Value::is_array);
    if role.is_none() || role != next.get("role") || !blocks(last) || !blocks(&next) {
        return Some(next);
    }
    let more = next.get_mut("content").map(Value::take);
    if let (Some(blocks), Some(Value::Array(more))) = (last.get_mut("content").and_then(Value::as_array_mut), more) {
        blocks.extend(more);
    }
    None
}

/// The request body around the transcript's rendered turns. A run offered no tools declares
/// the tools the transcript called (`context.called()`).
pub(crate) fn body_around(config: &RenderConfig, context: &RenderContext, messages: Vec<Value>) -> Value {
    let mut body = json!({"messages": messages});
    if let Some(system) = config.system.as_deref().filter(|s| !s.is_empty()) {
        body["system"] = json!([{"text": system}]);
    }
    if config.tools.is_empty() {
        // Converse refuses toolUse/toolResult blocks without a toolConfig ("The toolConfig
        // field must be defined when using toolUse and toolResult content blocks"): a run
        // offered no tools over a history that called some declares those names, open (#46).
        let called = context.called();
        if !called.is_empty() {
            let open = |name: &str| json!({"toolSpec": {"name": name, "inputSchema": {"json": {"type": "object"}}}});
            body["toolConfig"] = json!({"tools": called.iter().map(|n| open(n)).collect::<Vec<_>>()});
        }
    } else {
        body["toolConfig"] = json!({"tools": config.tools.iter().map(tool).collect::<Vec<_>>()});
        // Converse has no "none" (admission refuses it on this family by name).
        let choice = match &config.tool_choice {
            Some(ToolChoice::Mode(ToolChoiceMode::Auto)) => Some(json!({"auto": {}})),
            Some(ToolChoice::Mode(ToolChoiceMode::Required)) => Some(json!({"any": {}})),
            Some(ToolChoice::Named { tool }) => Some(json!({"tool": {"name": tool}})),
            Some(ToolChoice::Mode(ToolChoiceMode::None)) | None => None,
        };
        if let Some(choice) = choice {
            body["toolConfig"]["toolChoice"] = choice;
        }
    }
    if let Some(cap) = config.max_output_tokens {
        body["inferenceConfig"] = json!({"maxTokens": cap});
    }
    body
}

/// Whether a model takes `toolResult.status`: Converse documents the member for Anthropic
/// Claude models only (`ToolResultBlock.status`); other models get the error in the text.
fn result_status(wire_model: &str) -> bool {
    wire_model.contains("anthropic.claude")
}

/// Whether Bedrock caches prompts for this model (a `cachePoint` elsewhere is a validation
/// error).
fn caches(wire_model: &str) -> bool {
    ["anthropic.claude", "amazon.nova"].iter().any(|family| wire_model.contains(family))
}

/// Marks the prefix with `cachePoint` blocks where the model caches.
pub fn mark_cache(config: &RenderConfig, body: &mut Value) {
    if !caches(&config.wire_model) {
        return;
    }
    let point = json!({"cachePoint": {"type": "default"}});
    if let Some(system) = body.get_mut("system").and_then(Value::as_array_mut) {
        system.push(point.clone());
    }
    // Nova caches system and messages but refuses a cachePoint among its tools (#46; Bedrock's
    // "Prompt caching" supported-fields table).
    let tools_cache = !config.wire_model.contains("amazon.nova");
    if let Some(tools) = body.pointer_mut("/toolConfig/tools").and_then(Value::as_array_mut).filter(|_| tools_cache) {
        tools.push(point.clone());
    }
    if let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) {
        mark_tail(config, messages);
    }
}

/// The cache point at the end of the last of `messages`, where the model caches.
pub fn mark_tail(config: &RenderConfig, messages: &mut [Value]) {
    if !caches(&config.wire_model) {
        return;
    }
    let last = messages.last_mut().and_then(|m| m.get_mut("content")).and_then(Value::as_array_mut);
    if let Some(content) = last {
        content.push(json!({"cachePoint": {"type": "default"}}));
    }
}

fn tool(spec: &ToolSpec) -> Value {
    json!({"toolSpec": with_description(json!({"name": spec.name, "inputSchema": {"json": spec.input_schema}}), spec)})
}

fn user_content(m: &Message) -> Vec<Value> {
    m.content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.is_empty() => Some(json!({"text": text})),
            Part::Image { media_type, data } => {
                let format = media_type.strip_prefix("image/").unwrap_or(media_type);
                Some(json!({"image": {"format": format, "source": {"bytes": data}}}))
            }
            _ => None,
        })
        .collect()
}

fn assistant_content(m: &Message, replay: bool) -> Vec<Value> {
    m.content
        .iter()
        .filter_map(|p| match p {
            Part::Reasoning { text, signature: Some(signature) } if replay => {
                Some(json!({"reasoningContent": {"reasoningText": {"text": text, "signature": signature}}}))
            }
            Part::RedactedReasoning { data } if replay => Some(json!({"reasoningContent": {"redactedContent": data}})),
            Part::Text { text } if !text.is_empty() => Some(json!({"text": text})),
            Part::ToolCall { tool_call_id, tool_name, input } => {
                let input = if input.is_object() { input.clone() } else { json!({}) };
                Some(json!({"toolUse": {"toolUseId": tool_call_id, "name": tool_name, "input": input}}))
            }
            _ => None,
        })
        .collect()
}

fn tool_result(p: &Part, with_status: bool) -> Option<Value> {
    let Part::ToolResult { tool_call_id, output, is_error } = p else { return None };
    let (text, is_error) = tool_output(output, *is_error);
    // A result with images is its blocks in order where the model takes an image in a
    // toolResult (Converse documents image blocks there for Claude models); elsewhere its text.
    let content = match tool_images(output).filter(|_| with_status) {
        Some(parts) => parts.iter().filter_map(result_block).collect(),
        None => vec![json!({"text": text})],
    };
    let mut result = json!({"toolUseId": tool_call_id, "content": content});
    if with_status {
        result["status"] = json!(if is_error { "error" } else { "success" });
    }
    Some(json!({"toolResult": result}))
}

/// One part of a tool result with images as a Converse content block (empty text has none).
fn result_block(part: &OutputPart) -> Option<Value> {
    match part {
        OutputPart::Text { text } if text.is_empty() => None,
        OutputPart::Text { text } => Some(json!({"text": text})),
        OutputPart::Image { media_type, data, .. } => {
            let format = media_type.strip_prefix("image/").unwrap_or(media_type);
            Some(json!({"image": {"format": format, "source": {"bytes": data}}}))
        }
    }
}

/// The stop reason normalized by the role's table for `aws.bedrock_converse`.
pub fn normalize_stop_reason(raw: &str) -> String {
    super::common::role_finish("aws.bedrock_converse", raw, false)
}

fn usage(u: &Value) -> StepUsage {
    StepUsage {
        input_tokens: u64_at(u, &["inputTokens"]),
        cached_input_tokens: u64_at(u, &["cacheReadInputTokens"]),
        cache_write_tokens: u64_at(u, &["cacheWriteInputTokens"]),
        output_tokens: u64_at(u, &["outputTokens"]),
        reasoning_tokens: None,
    }
}

/// Decodes a `ConverseStream` event stream (framed by [`super::eventstream`]).
///
/// Invariants: a `ToolCallStart` index counts this answer's tool-use blocks in order, and each
/// block index maps to at most one call; `finished` is set by `metadata` (the last event), so
/// the usage after `messageStop` is read before the stream counts as ended.
#[derive(Default)]
pub struct BedrockDecoder {
    /// Content block index → call index.
    calls: HashMap<u64, usize>,
    /// The content block the last text delta belonged to.
    text_block: Option<u64>,
    finished: bool,
}

impl BedrockDecoder {
    pub fn new() -> BedrockDecoder {
        BedrockDecoder::default()
    }

    fn delta(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> bool {
        let Some(delta) = data.get("delta") else { return false };
        let block = data.get("contentBlockIndex").and_then(Value::as_u64).unwrap_or(0);
        if let Some(text) = str_at(delta, &["text"]).filter(|t| !t.is_empty()) {
            // Each content block is a text part of its own, as in Anthropic's stream: Converse
            // sends no start event for a text block, so a text delta of another block than the
            // last text's starts the part.
            if self.text_block.is_some_and(|last| last != block) {
                out.push(StreamEvent::TextPartStart);
            }
            self.text_block = Some(block);
            out.push(StreamEvent::TextDelta { text: text.to_owned() });
            return true;
        }
        if let Some(input) = str_at(delta, &["toolUse", "input"]) {
            let Some(&index) = self.calls.get(&block) else { return false };
            out.push(StreamEvent::ToolCallArgsDelta { index, delta: input.to_owned() });
            return !input.is_empty();
        }
        let Some(reasoning) = delta.get("reasoningContent") else { return false };
        if let Some(text) = str_at(reasoning, &["text"]).filter(|t| !t.is_empty()) {
            out.push(StreamEvent::ReasoningDelta { text: text.to_owned() });
            return true;
        }
        if let Some(signature) = str_at(reasoning, &["signature"]) {
            out.push(StreamEvent::ReasoningSignature { signature: signature.to_owned() });
        }
        if let Some(data) = str_at(reasoning, &["redactedContent"]) {
            out.push(StreamEvent::ReasoningOpaque { data: data.to_owned() });
        }
        false
    }
}

impl StreamDecoder for BedrockDecoder {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<EventClass, DecodeError> {
        let name = event.event.as_deref().unwrap_or("unknown");
        let data = data_object(event)?;
        if let Some(kind) = name.strip_prefix("exception:") {
            let message = str_at(&data, &["message"]).or_else(|| str_at(&data, &["Message"]));
            let retryable = matches!(
                kind,
                "throttlingException"
                    | "modelStreamErrorException"
                    | "internalServerException"
                    | "serviceUnavailableException"
                    | "modelNotReadyException"
            );
            let category = if retryable { "server_error" } else { "invalid_request_error" };
            out.push(stream_error(Some(kind), Some(category), message));
            self.finished = true;
            return Ok(class(name, false, false));
        }
        let content = match name {
            "messageStart" | "contentBlockStop" => false,
            "contentBlockStart" => {
                let block = data.get("contentBlockIndex").and_then(Value::as_u64).unwrap_or(0);
                // A block starts once: a repeated start is not a second call.
                if let Some(call) = data.pointer("/start/toolUse").filter(|_| !self.calls.contains_key(&block)) {
                    let index = self.calls.len();
                    self.calls.insert(block, index);
                    let id = str_at(call, &["toolUseId"]).unwrap_or_default().to_owned();
                    let name = str_at(call, &["name"]).unwrap_or_default().to_owned();
                    out.push(StreamEvent::ToolCallStart { index, id, name });
                }
                false
            }
            "contentBlockDelta" => self.delta(&data, out),
            "messageStop" => {
                let raw = str_at(&data, &["stopReason"]).unwrap_or("end_turn");
                out.push(StreamEvent::Finish { reason: normalize_stop_reason(raw), raw: raw.into() });
                false
            }
            "metadata" => {
                if let Some(u) = data.get("usage") {
                    out.push(StreamEvent::Usage { usage: usage(u) });
                }
                self.finished = true;
                false
            }
            _ => return Ok(class(name, false, true)),
        };
        Ok(class(name, content, false))
    }

    fn finished(&self) -> bool {
        self.finished
    }
}
