//! Anthropic Messages (`POST {api}/messages`, `"stream": true`): request rendering and the
//! stream decoder.
//!
//! Transcript mapping (owned-broca → Messages):
//! - user and system-role messages → `user` messages (Messages has no system role inside
//!   `messages`; the route's system prompt is the top-level `system`);
//! - assistant parts, in order: reasoning with a signature → `thinking` block sent back unchanged
//!   (`{thinking, signature}`, even with empty text: "omitted" thinking display); redacted
//!   reasoning → `redacted_thinking {data}`; reasoning without a signature is dropped (the API
//!   rejects unsigned thinking); text → `text` (empty text is dropped: the API rejects empty
//!   text blocks); tool call → `tool_use` (a non-object input is sent as `{}`);
//! - a tool-role message → ONE `user` message of `tool_result` blocks, in order; an error output
//!   is its rendered text with `is_error: true`;
//! - a message left with no blocks is omitted (the API rejects empty content).
//!
//! Signatures are only replayed to the provider that minted them (see
//! [`replays_reasoning`](super::common::replays_reasoning)).

use crate::frozen::{ToolChoice, ToolChoiceMode};
use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::common::{
    class, data_object, event_type, finish, is_done, merge_usage, push_text, reasoning_delta, replays_reasoning,
    str_at, text_delta, tool_images, tool_output, u64_at, with_description,
};
use super::config::{RenderConfig, ToolSpec};
use super::errors::stream_error;
use super::event::{DecodeError, EventClass, StreamDecoder, StreamEvent};
use super::render_context::RenderContext;
use super::sse::SseEvent;
use crate::message::{Message, OutputPart, Part, Role, StepUsage};

/// `max_tokens` is required by the Messages API; this is sent when the config sets no cap.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// One transcript message's element of `messages` (none when it has no block). It depends on
/// the message and the config alone.
pub(crate) fn render_message(config: &RenderConfig, _context: &RenderContext, m: &Message) -> Vec<Value> {
    message(m, config).into_iter().collect()
}

/// The request body around the transcript's rendered `messages`: `model`, `max_tokens`,
/// `stream`, `system`?, `tools`?, `messages` (the variant's members and the cache marks are
/// added by [`super::wire::WireFamily::render`]).
pub(crate) fn body_around(config: &RenderConfig, _context: &RenderContext, messages: Vec<Value>) -> Value {
    let mut body = json!({
        "model": config.wire_model,
        "max_tokens": config.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "stream": true,
        "messages": messages,
    });
    if let Some(system) = config.system.as_deref().filter(|s| !s.is_empty()) {
        body["system"] = json!(system);
    }
    if !config.tools.is_empty() {
        body["tools"] = config.tools.iter().map(tool).collect();
        if let Some(choice) = &config.tool_choice {
            body["tool_choice"] = match choice {
                ToolChoice::Mode(ToolChoiceMode::Auto) => json!({"type": "auto"}),
                ToolChoice::Mode(ToolChoiceMode::None) => json!({"type": "none"}),
                ToolChoice::Mode(ToolChoiceMode::Required) => json!({"type": "any"}),
                ToolChoice::Named { tool } => json!({"type": "tool", "name": tool}),
            };
        }
    }
    super::tier::render_anthropic(config.service_tier, &mut body);
    body
}

fn tool(spec: &ToolSpec) -> Value {
    with_description(json!({"name": spec.name, "input_schema": spec.input_schema}), spec)
}

fn message(m: &Message, config: &RenderConfig) -> Option<Value> {
    let assistant = m.role == Role::Assistant;
    let replay = assistant && replays_reasoning(m, config);
    let blocks: Vec<Value> = m.content.iter().filter_map(|p| block(p, assistant, replay)).collect();
    if blocks.is_empty() {
        return None;
    }
    Some(json!({"role": if assistant { "assistant" } else { "user" }, "content": blocks}))
}

/// One part as a content block, or `None` when it has no place in a message of this role.
fn block(part: &Part, assistant: bool, replay: bool) -> Option<Value> {
    match part {
        Part::Text { text } if text.is_empty() => None,
        Part::Text { text } => Some(json!({"type": "text", "text": text})),
        Part::Reasoning { text, signature: Some(sig) } if replay && !sig.is_empty() => {
            Some(json!({"type": "thinking", "thinking": text, "signature": sig}))
        }
        Part::RedactedReasoning { data } if replay && !data.is_empty() => {
            Some(json!({"type": "redacted_thinking", "data": data}))
        }
        Part::ToolCall { tool_call_id, tool_name, input } if assistant => {
            let input = if input.is_object() { input.clone() } else { json!({}) };
            Some(json!({"type": "tool_use", "id": tool_call_id, "name": tool_name, "input": input}))
        }
        Part::ToolResult { tool_call_id, output, is_error } if !assistant => {
            let (text, is_error) = tool_output(output, *is_error);
            // A result with images is its blocks in order (Messages takes text and image blocks
            // in a tool_result); any other result keeps its plain string content.
            let content = match tool_images(output) {
                Some(parts) => Value::Array(parts.iter().filter_map(result_block).collect()),
                None => json!(text),
            };
            let mut b = json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content});
            if is_error {
                b["is_error"] = json!(true);
            }
            Some(b)
        }
        Part::Image { media_type, data } if !assistant => Some(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        })),
        Part::Reasoning { .. }
        | Part::RedactedReasoning { .. }
        | Part::ToolCall { .. }
        | Part::ToolResult { .. }
        | Part::Image { .. } => None,
    }
}

/// One part of a tool result with images as a Messages block (an empty text part has none).
fn result_block(part: &OutputPart) -> Option<Value> {
    match part {
        OutputPart::Text { text } if text.is_empty() => None,
        OutputPart::Text { text } => Some(json!({"type": "text", "text": text})),
        OutputPart::Image { media_type, data, .. } => Some(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        })),
    }
}

/// `stop_reason` normalized: `end_turn`/`stop_sequence` → stop, `max_tokens` and
/// `model_context_window_exceeded` → length, `tool_use` → tool_calls, `refusal` → refusal,
/// anything else (`pause_turn`, future reasons) → other.
pub fn normalize_stop_reason(raw: &str) -> &'static str {
    match raw {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "refusal",
        _ => "other",
    }
}

/// Usage as Messages reports it: `input_tokens` already excludes cache reads
/// (`cache_read_input_tokens`) and writes (`cache_creation_input_tokens`); the reasoning inside
/// `output_tokens` is `output_tokens_details.thinking_tokens` (the SDK's `OutputTokensDetails`;
/// real streams send it in `message_delta`, `testdata/real-streams/anthropic_messages/a05`, `a09`).
pub(crate) fn usage(u: &Value) -> StepUsage {
    StepUsage {
        input_tokens: u64_at(u, &["input_tokens"]),
        cached_input_tokens: u64_at(u, &["cache_read_input_tokens"]),
        cache_write_tokens: u64_at(u, &["cache_creation_input_tokens"]),
        output_tokens: u64_at(u, &["output_tokens"]),
        reasoning_tokens: u64_at(u, &["output_tokens_details", "thinking_tokens"]),
    }
}

/// What a content block is, by its `index`.
#[derive(Clone, Copy, Debug)]
enum Block {
    Text,
    Thinking,
    /// A client tool call, `call` its position among this message's calls; `input_in_start`
    /// when its `content_block_start` already carried the whole input (deltas then ignored).
    ToolUse {
        call: usize,
        input_in_start: bool,
    },
    /// Server tools, results, redacted thinking, and block types this parser does not know.
    Other,
}

/// Decodes a Messages stream.
///
/// Invariants: a `ToolCallStart` index counts only `tool_use` blocks (block `index` counts every
/// block); the usage emitted is the merge of `message_start` and every `message_delta` so far
/// (later values replace earlier ones per field); `finished` once `message_stop` or `error`.
#[derive(Debug, Default)]
pub struct AnthropicDecoder {
    blocks: BTreeMap<u64, Block>,
    /// The last started block: deltas without an `index` belong to it.
    current: Option<u64>,
    calls: usize,
    usage: StepUsage,
    finished: bool,
}

impl AnthropicDecoder {
    pub fn new() -> AnthropicDecoder {
        AnthropicDecoder::default()
    }

    fn index(&self, data: &Value) -> Option<u64> {
        u64_at(data, &["index"]).or(self.current)
    }

    fn report_usage(&mut self, u: Option<&Value>, out: &mut Vec<StreamEvent>) {
        let Some(u) = u else { return };
        let reported = usage(u);
        if !reported.is_unreported() {
            merge_usage(&mut self.usage, &reported);
            out.push(StreamEvent::Usage { usage: self.usage.clone() });
        }
    }

    /// `content_block_start`: returns (content, unknown).
    fn block_start(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> (bool, bool) {
        let index = self.index(data).unwrap_or(0);
        self.current = Some(index);
        let block = data.get("content_block").unwrap_or(&Value::Null);
        let (kind, content, unknown) = match str_at(block, &["type"]) {
            Some("text") => {
                // Each text block is a part of its own (citations split an answer into several).
                out.push(StreamEvent::TextPartStart);
                (Block::Text, push_text(out, str_at(block, &["text"]), text_delta), false)
            }
            Some("thinking") => {
                let content = push_text(out, str_at(block, &["thinking"]), reasoning_delta);
                self.signature(str_at(block, &["signature"]), out);
                (Block::Thinking, content, false)
            }
            Some("redacted_thinking") => {
                if let Some(data) = str_at(block, &["data"]).filter(|d| !d.is_empty()) {
                    out.push(StreamEvent::ReasoningOpaque { data: data.to_string() });
                }
                (Block::Other, false, false)
            }
            Some("tool_use") => {
                let call = self.calls;
                self.calls += 1;
                out.push(StreamEvent::ToolCallStart {
                    index: call,
                    id: str_at(block, &["id"]).unwrap_or_default().to_string(),
                    name: str_at(block, &["name"]).unwrap_or_default().to_string(),
                });
                let input = block.get("input").filter(|i| i.as_object().is_some_and(|o| !o.is_empty()));
                if let Some(input) = input {
                    out.push(StreamEvent::ToolCallArgsDelta { index: call, delta: input.to_string() });
                }
                (Block::ToolUse { call, input_in_start: input.is_some() }, false, false)
            }
            // Known server-side blocks: not content broca acts on.
            Some("server_tool_use" | "web_search_tool_result" | "web_fetch_tool_result") => {
                (Block::Other, false, false)
            }
            _ => (Block::Other, false, true),
        };
        self.blocks.insert(index, kind);
        (content, unknown)
    }

    fn signature(&self, signature: Option<&str>, out: &mut Vec<StreamEvent>) {
        if let Some(sig) = signature.filter(|s| !s.is_empty()) {
            out.push(StreamEvent::ReasoningSignature { signature: sig.to_string() });
        }
    }

    /// `content_block_delta`: returns (content, unknown).
    fn block_delta(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> (bool, bool) {
        let block = self.index(data).and_then(|i| self.blocks.get(&i).copied());
        let delta = data.get("delta").unwrap_or(&Value::Null);
        match str_at(delta, &["type"]) {
            Some("text_delta") => (push_text(out, str_at(delta, &["text"]), text_delta), false),
            Some("thinking_delta") => (push_text(out, str_at(delta, &["thinking"]), reasoning_delta), false),
            Some("signature_delta") => {
                self.signature(str_at(delta, &["signature"]), out);
                (false, false)
            }
            Some("input_json_delta") => {
                let fragment = str_at(delta, &["partial_json"]).unwrap_or_default();
                if let Some(Block::ToolUse { call, input_in_start: false }) = block {
                    if !fragment.is_empty() {
                        out.push(StreamEvent::ToolCallArgsDelta { index: call, delta: fragment.to_string() });
                    }
                }
                (!fragment.is_empty(), false)
            }
            Some("citations_delta") => (false, false),
            _ => (false, true),
        }
    }
}

impl StreamDecoder for AnthropicDecoder {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<EventClass, DecodeError> {
        if is_done(event) {
            return Ok(class("[DONE]", false, false));
        }
        let data = data_object(event)?;
        let kind = event_type(&data, event);
        let (content, unknown) = match kind.as_str() {
            "message_start" => {
                self.report_usage(data.get("message").and_then(|m| m.get("usage")), out);
                (false, false)
            }
            "content_block_start" => self.block_start(&data, out),
            "content_block_delta" => self.block_delta(&data, out),
            "content_block_stop" | "ping" => (false, false),
            "message_delta" => {
                self.report_usage(data.get("usage"), out);
                if let Some(raw) = str_at(&data, &["delta", "stop_reason"]) {
                    out.push(finish(normalize_stop_reason(raw), raw));
                }
                (false, false)
            }
            "message_stop" => {
                self.finished = true;
                (false, false)
            }
            "error" => {
                let err = data.get("error").unwrap_or(&Value::Null);
                out.push(stream_error(None, str_at(err, &["type"]), str_at(err, &["message"])));
                self.finished = true;
                (false, false)
            }
            _ => (false, true),
        };
        Ok(class(kind, content, unknown))
    }

    fn finished(&self) -> bool {
        self.finished
    }
}
