//! OpenAI Responses (`POST {api}/responses`, `"stream": true`, `"store": false`): request
//! rendering and the stream decoder.
//!
//! Transcript mapping (owned-broca → `input` items):
//! - the route's system prompt → top-level `instructions`; a system-role transcript message →
//!   a `system` message item in place;
//! - user parts → one `message` item of `input_text` / `input_image` (data URL) parts;
//! - assistant parts, in order: the `encrypted_content` blob (streamed as
//!   [`StreamEvent::ReasoningOpaque`]) is sent back as a `reasoning` item
//!   `{summary, encrypted_content}`. It may be stored either as a redacted-reasoning part
//!   (`data` = blob; a directly preceding unsigned reasoning part supplies its summary text) or
//!   as the signature of a reasoning part (its text is the summary). With `store: false` no item
//!   id can be referenced, so reasoning without a blob is DROPPED. Consecutive text parts → one
//!   assistant `message` item of `output_text` parts; tool call → a `function_call` item
//!   `{call_id, name, arguments}` with `arguments` a JSON string;
//! - a tool-role message → one `function_call_output` item per result `{call_id, output}`
//!   (the Responses API has no error flag: an error output is its rendered text);
//! - a message left empty is omitted.
//!
//! Tools are sent with `strict: false`: the API otherwise holds schemas to its strict subset
//! (every property required, `additionalProperties: false`), which arbitrary tool schemas break.

use crate::frozen::ToolChoice;
use serde_json::{json, Value};

use super::common::{
    arguments_text, class, data_object, data_url, event_type, finish, is_done, push_text, reasoning_delta,
    replays_reasoning, str_at, tool_output, u64_at, usage_from_total, with_description,
};
use super::config::{RenderConfig, ToolSpec};
use super::errors::stream_error;
use super::event::{DecodeError, EventClass, StreamDecoder, StreamEvent};
use super::render_context::RenderContext;
use super::sse::SseEvent;
use crate::message::{Message, Part, Role, StepUsage};

/// One transcript message's `input` items (none, one, or several). They depend on the message
/// and the config alone.
pub(crate) fn render_message(config: &RenderConfig, _context: &RenderContext, m: &Message) -> Vec<Value> {
    let mut items = Vec::new();
    push_items(m, config, &mut items);
    items
}

/// The request body around the transcript's rendered `input`: `model`, `stream`, `store:
/// false`, `instructions`?, `max_output_tokens`?, `tools`?, `input`, then the variant's members
/// merged on top (e.g. `reasoning`, `include`).
pub(crate) fn body_around(config: &RenderConfig, _context: &RenderContext, input: Vec<Value>) -> Value {
    let mut body = json!({"model": config.wire_model, "stream": true, "store": false, "input": input});
    if let Some(system) = config.system.as_deref().filter(|s| !s.is_empty()) {
        body["instructions"] = json!(system);
    }
    if let Some(cap) = config.max_output_tokens {
        body["max_output_tokens"] = json!(cap);
    }
    if !config.tools.is_empty() {
        body["tools"] = config.tools.iter().map(tool).collect();
        if let Some(choice) = &config.tool_choice {
            body["tool_choice"] = match choice {
                ToolChoice::Mode(mode) => json!(mode),
                ToolChoice::Named { tool } => json!({"type": "function", "name": tool}),
            };
        }
    }
    super::tier::render_openai(config.service_tier, &mut body);
    body
}

/// The ChatGPT/Codex backend's items: [`render_message`]'s, a system-role transcript message
/// sent as a `developer` input item: the backend refuses a `system` one ("System messages are
/// not allowed"), as OpenAI's own Codex client never sends it (#46).
pub(crate) fn chatgpt_render_message(config: &RenderConfig, context: &RenderContext, m: &Message) -> Vec<Value> {
    let mut items = render_message(config, context, m);
    for item in items.iter_mut().filter(|i| i.get("role").and_then(Value::as_str) == Some("system")) {
        item["role"] = json!("developer");
    }
    items
}

/// The ChatGPT/Codex backend's body: the Responses body without `max_output_tokens` (the
/// backend rejects the field; an explicit cap is accepted and not rendered, spec §4), with
/// `instructions` always present (the backend requires it; empty without a system prompt).
pub(crate) fn chatgpt_body_around(config: &RenderConfig, context: &RenderContext, input: Vec<Value>) -> Value {
    let mut body = body_around(config, context, input);
    if let Value::Object(top) = &mut body {
        top.shift_remove("max_output_tokens");
        if !top.contains_key("instructions") {
            top.insert("instructions".into(), json!(""));
        }
    }
    body
}

fn tool(spec: &ToolSpec) -> Value {
    with_description(
        json!({"type": "function", "name": spec.name, "parameters": spec.input_schema, "strict": false}),
        spec,
    )
}

fn push_items(m: &Message, config: &RenderConfig, out: &mut Vec<Value>) {
    match m.role {
        Role::User => out.extend(input_message("user", m)),
        Role::System => out.extend(input_message("system", m)),
        Role::Assistant => assistant_items(m, replays_reasoning(m, config), out),
        Role::Tool => out.extend(m.content.iter().filter_map(function_call_output)),
    }
}

fn input_message(role: &str, m: &Message) -> Option<Value> {
    let parts: Vec<Value> = m
        .content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.is_empty() => Some(json!({"type": "input_text", "text": text})),
            Part::Image { media_type, data } => {
                Some(json!({"type": "input_image", "image_url": data_url(media_type, data)}))
            }
            _ => None,
        })
        .collect();
    (!parts.is_empty()).then(|| json!({"type": "message", "role": role, "content": parts}))
}

fn assistant_items(m: &Message, replay: bool, out: &mut Vec<Value>) {
    let mut texts: Vec<Value> = Vec::new();
    // The text of an unsigned reasoning part, waiting for the redacted blob that may follow it.
    let mut summary: Option<&str> = None;
    let flush = |texts: &mut Vec<Value>, out: &mut Vec<Value>| {
        if !texts.is_empty() {
            out.push(json!({"type": "message", "role": "assistant", "content": std::mem::take(texts)}));
        }
    };
    for part in &m.content {
        let pending = summary.take();
        match part {
            Part::Text { text } if !text.is_empty() => texts.push(json!({"type": "output_text", "text": text})),
            Part::Reasoning { text, signature: None } => summary = Some(text),
            Part::Reasoning { text, signature: Some(blob) } if replay && !blob.is_empty() => {
                flush(&mut texts, out);
                out.push(reasoning_item(text, blob));
            }
            Part::RedactedReasoning { data } if replay && !data.is_empty() => {
                flush(&mut texts, out);
                out.push(reasoning_item(pending.unwrap_or_default(), data));
            }
            Part::ToolCall { tool_call_id, tool_name, input } => {
                flush(&mut texts, out);
                out.push(json!({
                    "type": "function_call",
                    "call_id": tool_call_id,
                    "name": tool_name,
                    "arguments": arguments_text(input),
                }));
            }
            _ => {}
        }
    }
    flush(&mut texts, out);
}

fn reasoning_item(summary: &str, blob: &str) -> Value {
    let summary: Vec<Value> =
        if summary.is_empty() { vec![] } else { vec![json!({"type": "summary_text", "text": summary})] };
    json!({"type": "reasoning", "summary": summary, "encrypted_content": blob})
}

fn function_call_output(part: &Part) -> Option<Value> {
    match part {
        Part::ToolResult { tool_call_id, output, is_error } => {
            let (text, _) = tool_output(output, *is_error);
            Some(json!({"type": "function_call_output", "call_id": tool_call_id, "output": text}))
        }
        _ => None,
    }
}

/// Usage as Responses reports it: `input_tokens` INCLUDES cached (and cache-write) tokens.
fn usage(u: &Value) -> StepUsage {
    usage_from_total(
        u64_at(u, &["input_tokens"]),
        u64_at(u, &["input_tokens_details", "cached_tokens"]),
        u64_at(u, &["input_tokens_details", "cache_write_tokens"]),
        u64_at(u, &["output_tokens"]),
        u64_at(u, &["output_tokens_details", "reasoning_tokens"]),
    )
}

/// `incomplete_details.reason` normalized: `max_output_tokens` → length, `content_filter` →
/// content_filter, anything else → other.
pub fn normalize_incomplete_reason(raw: &str) -> &'static str {
    match raw {
        "max_output_tokens" => "length",
        "content_filter" => "content_filter",
        _ => "other",
    }
}

/// The output item an event belongs to: its `output_index`, else its `item_id` (ids are not
/// stable on every endpoint: see [`ResponsesDecoder::find_call`]).
fn item_key(data: &Value) -> String {
    match u64_at(data, &["output_index"]) {
        Some(at) => format!("#{at}"),
        None => str_at(data, &["item_id"]).unwrap_or_default().to_string(),
    }
}

/// One `function_call` output item seen in the stream.
#[derive(Debug)]
struct Call {
    item_id: String,
    output_index: Option<u64>,
    /// Whether argument deltas arrived (else the `.done` snapshot supplies them once).
    args_seen: bool,
}

/// Decodes a Responses stream.
///
/// Invariants: a `ToolCallStart` index counts `function_call` items only, and its `id` is the
/// item's `call_id` (what `function_call_output` must reference); argument text is emitted once,
/// from the deltas or, when none arrived, from the `.done` / `output_item.done` snapshot;
/// consecutive reasoning-summary parts of one item are separated by a blank line; at most one
/// `Error` is emitted (an `error` event and the `response.failed` that follows report the same
/// failure); `finished` once `response.completed`, `.incomplete`, `.failed` or `error`.
#[derive(Debug, Default)]
pub struct ResponsesDecoder {
    calls: Vec<Call>,
    /// The (item id, summary index) the last summary delta belonged to.
    summary_at: Option<(String, u64)>,
    refused: bool,
    errored: bool,
    finished: bool,
    /// The (output item, content part) the last text delta belonged to.
    text_at: Option<(String, u64)>,
}

impl ResponsesDecoder {
    pub fn new() -> ResponsesDecoder {
        ResponsesDecoder::default()
    }

    /// The call an event belongs to. `output_index` names an item on every event of it, while
    /// item ids are not stable everywhere: GitHub Copilot's endpoint gives each event of one item
    /// a new `item_id` (`testdata/real-streams/openai_responses/r05`). So the id decides only
    /// where an event or the call has no `output_index`.
    fn find_call(&self, data: &Value, item_id: Option<&str>) -> Option<usize> {
        let output_index = u64_at(data, &["output_index"]);
        self.calls.iter().position(|c| match (output_index, c.output_index) {
            (Some(at), Some(call_at)) => at == call_at,
            _ => item_id.is_some_and(|id| !id.is_empty() && c.item_id == id),
        })
    }

    /// The call an item starts or continues; a new one emits `ToolCallStart`.
    fn call_for_item(&mut self, data: &Value, item: &Value, out: &mut Vec<StreamEvent>) -> usize {
        if let Some(i) = self.find_call(data, str_at(item, &["id"])) {
            return i;
        }
        let index = self.calls.len();
        self.calls.push(Call {
            item_id: str_at(item, &["id"]).unwrap_or_default().to_string(),
            output_index: u64_at(data, &["output_index"]),
            args_seen: false,
        });
        out.push(StreamEvent::ToolCallStart {
            index,
            id: str_at(item, &["call_id"]).unwrap_or_default().to_string(),
            name: str_at(item, &["name"]).unwrap_or_default().to_string(),
        });
        index
    }

    /// Emits a call's whole argument text from a snapshot, unless deltas already carried it.
    fn args_snapshot(&mut self, index: usize, arguments: Option<&str>, out: &mut Vec<StreamEvent>) {
        let Some(call) = self.calls.get_mut(index) else { return };
        if let Some(args) = arguments.filter(|a| !a.is_empty() && !call.args_seen) {
            call.args_seen = true;
            out.push(StreamEvent::ToolCallArgsDelta { index, delta: args.to_string() });
        }
    }

    fn item_done(&mut self, data: &Value, out: &mut Vec<StreamEvent>) {
        let item = data.get("item").unwrap_or(&Value::Null);
        match str_at(item, &["type"]) {
            Some("function_call") => {
                let index = self.call_for_item(data, item, out);
                self.args_snapshot(index, str_at(item, &["arguments"]), out);
            }
            Some("reasoning") => {
                if let Some(blob) = str_at(item, &["encrypted_content"]).filter(|b| !b.is_empty()) {
                    out.push(StreamEvent::ReasoningOpaque { data: blob.to_string() });
                }
            }
            _ => {}
        }
    }

    /// A reasoning-summary delta, prefixed with a blank line when it opens a later summary part
    /// of the same item (named by `output_index`, else its id: see [`Self::find_call`]).
    fn summary_delta(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> bool {
        let Some(delta) = str_at(data, &["delta"]).filter(|d| !d.is_empty()) else { return false };
        let at = (item_key(data), u64_at(data, &["summary_index"]).unwrap_or(0));
        let separate = matches!(&self.summary_at, Some((item, index)) if *item == at.0 && *index != at.1);
        self.summary_at = Some(at);
        let text = if separate { format!("\n\n{delta}") } else { delta.to_string() };
        out.push(StreamEvent::ReasoningDelta { text });
        true
    }

    /// A text (or refusal) delta. Each message item's content part is a text part of its own: a
    /// delta of another part than the last text's starts one (`TextPartStart`), so a commentary
    /// message (`phase: commentary`, as in real stream r02) and the final answer after it are not
    /// run together.
    fn text(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> bool {
        let Some(delta) = str_at(data, &["delta"]).filter(|d| !d.is_empty()) else { return false };
        let at = (item_key(data), u64_at(data, &["content_index"]).unwrap_or(0));
        if self.text_at.as_ref().is_some_and(|last| *last != at) {
            out.push(StreamEvent::TextPartStart);
        }
        self.text_at = Some(at);
        out.push(StreamEvent::TextDelta { text: delta.to_string() });
        true
    }

    fn args_delta(&mut self, data: &Value, out: &mut Vec<StreamEvent>) -> bool {
        let Some(delta) = str_at(data, &["delta"]).filter(|d| !d.is_empty()) else { return false };
        if let Some(index) = self.find_call(data, str_at(data, &["item_id"])) {
            self.calls[index].args_seen = true;
            out.push(StreamEvent::ToolCallArgsDelta { index, delta: delta.to_string() });
        }
        true
    }

    fn error(&mut self, err: StreamEvent, out: &mut Vec<StreamEvent>) {
        if !self.errored {
            self.errored = true;
            out.push(err);
        }
        self.finished = true;
    }

    /// A terminal `response.*` event: usage, then the finish reason or the failure.
    fn terminal(&mut self, kind: &str, data: &Value, out: &mut Vec<StreamEvent>) {
        let response = data.get("response").unwrap_or(&Value::Null);
        if let Some(tier) = str_at(response, &["service_tier"]) {
            out.push(StreamEvent::ServedTier { tier: super::tier::openai_served(tier) });
        }
        if let Some(u) = response.get("usage").filter(|u| u.is_object()).map(usage).filter(|u| !u.is_unreported()) {
            out.push(StreamEvent::Usage { usage: u });
        }
        match kind {
            "response.completed" => {
                let raw = str_at(response, &["status"]).unwrap_or("completed");
                let reason = if !self.calls.is_empty() {
                    "tool_calls"
                } else if self.refused {
                    "refusal"
                } else {
                    "stop"
                };
                out.push(finish(reason, raw));
            }
            "response.incomplete" => {
                let raw = str_at(response, &["incomplete_details", "reason"]).unwrap_or("incomplete");
                out.push(finish(normalize_incomplete_reason(raw), raw));
            }
            _ => {
                let err = response.get("error").unwrap_or(&Value::Null);
                let message = str_at(err, &["message"]).or(Some("the response failed"));
                self.error(stream_error(str_at(err, &["code"]), str_at(err, &["type"]), message), out);
            }
        }
        self.finished = true;
    }
}

impl StreamDecoder for ResponsesDecoder {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<EventClass, DecodeError> {
        if is_done(event) {
            return Ok(class("[DONE]", false, false));
        }
        let data = data_object(event)?;
        let kind = event_type(&data, event);
        let (content, unknown) = match kind.as_str() {
            "response.created"
            | "response.in_progress"
            | "response.queued"
            | "response.content_part.added"
            | "response.content_part.done"
            | "response.output_text.done"
            | "response.output_text.annotation.added"
            | "response.refusal.done"
            | "response.reasoning_summary_part.added"
            | "response.reasoning_summary_part.done"
            | "response.reasoning_summary_text.done"
            | "response.reasoning_text.done" => (false, false),
            "response.output_item.added" => {
                let item = data.get("item").unwrap_or(&Value::Null);
                if str_at(item, &["type"]) == Some("function_call") {
                    self.call_for_item(&data, item, out);
                }
                (false, false)
            }
            "response.output_item.done" => {
                self.item_done(&data, out);
                (false, false)
            }
            "response.output_text.delta" => (self.text(&data, out), false),
            "response.refusal.delta" => {
                let content = self.text(&data, out);
                self.refused |= content;
                (content, false)
            }
            "response.reasoning_summary_text.delta" => (self.summary_delta(&data, out), false),
            "response.reasoning_text.delta" => (push_text(out, str_at(&data, &["delta"]), reasoning_delta), false),
            "response.function_call_arguments.delta" => (self.args_delta(&data, out), false),
            "response.function_call_arguments.done" => {
                if let Some(index) = self.find_call(&data, str_at(&data, &["item_id"])) {
                    self.args_snapshot(index, str_at(&data, &["arguments"]), out);
                }
                (false, false)
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.terminal(&kind, &data, out);
                (false, false)
            }
            "error" => {
                let err = data.get("error").filter(|e| e.is_object()).unwrap_or(&data);
                let e = stream_error(
                    str_at(err, &["code"]),
                    str_at(err, &["type"]).filter(|t| *t != "error"),
                    str_at(err, &["message"]),
                );
                self.error(e, out);
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
