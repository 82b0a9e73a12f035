//! OpenAI Chat Completions and compatibles (`POST {api}/chat/completions`, `"stream": true`):
//! request rendering and the stream decoder.
//!
//! Transcript mapping (owned-broca → Chat):
//! - the route's system prompt → a first `{"role":"system"}` message; a system-role transcript
//!   message stays a system message in place;
//! - user text → `content` as a string when the message is one text part, else an array of
//!   `text` / `image_url` (data URL) parts;
//! - assistant: text parts joined → `content` (`null` when there is none), tool calls →
//!   `tool_calls[{id, type: function, function: {name, arguments}}]` with `arguments` a JSON
//!   string; reasoning (plain or redacted) is DROPPED: Chat has no field to send reasoning back, and compatibles
//!   that stream `reasoning_content` reject or ignore it on input;
//! - a tool-role message → one `{"role":"tool","tool_call_id","content"}` message per result, in
//!   order (Chat has no error flag: an error output is its rendered text);
//! - a message left empty is omitted.
//!
//! The output cap is `max_completion_tokens` for OpenAI's own API (provider `openai` or
//! `azure`), where `max_tokens` is deprecated and refused by reasoning models, and `max_tokens`
//! for every other provider, since it is the field all compatible servers understand.

use crate::frozen::ToolChoice;
use serde_json::{json, Value};

use super::chat_chunk::{self, CallView, ChoiceView, ChunkView};
use super::common::{
    arguments_text, class, data_object, data_url, finish, is_done, push_text, reasoning_delta, str_at, text_delta,
    tool_output, u64_at, usage_from_total, with_description,
};
use super::config::{RenderConfig, ToolSpec};
use super::errors::stream_error_with_status;
use super::event::{DecodeError, EventClass, StreamDecoder, StreamEvent};
use super::render_context::RenderContext;
use super::sse::SseEvent;
use crate::message::{Message, Part, Role, StepUsage};

/// One transcript message's elements of `messages` (none, one, or one per tool result). They
/// depend on the message alone.
pub(crate) fn render_message(_config: &RenderConfig, _context: &RenderContext, m: &Message) -> Vec<Value> {
    let mut out = Vec::new();
    push_message(m, &mut out);
    out
}

/// The request body around the transcript's rendered `messages` (the system prompt first):
/// `model`, `stream`, `stream_options.include_usage`, `messages`, `tools`?, the output cap?,
/// then the variant's members merged on top (e.g. `reasoning_effort`).
pub(crate) fn body_around(config: &RenderConfig, _context: &RenderContext, transcript_messages: Vec<Value>) -> Value {
    let mut messages = Vec::with_capacity(transcript_messages.len() + 1);
    if let Some(system) = config.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(transcript_messages);
    let mut body = json!({
        "model": config.wire_model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": messages,
    });
    if !config.tools.is_empty() {
        body["tools"] = config.tools.iter().map(tool).collect();
        if let Some(choice) = &config.tool_choice {
            body["tool_choice"] = match choice {
                ToolChoice::Mode(mode) => json!(mode),
                ToolChoice::Named { tool } => json!({"type": "function", "function": {"name": tool}}),
            };
        }
    }
    if let Some(cap) = config.max_output_tokens {
        body[max_tokens_field(config)] = json!(cap);
    }
    super::tier::render_openai(config.service_tier, &mut body);
    body
}

fn max_tokens_field(config: &RenderConfig) -> &'static str {
    match config.provider.as_str() {
        "openai" | "azure" => "max_completion_tokens",
        _ => "max_tokens",
    }
}

fn tool(spec: &ToolSpec) -> Value {
    let function = with_description(json!({"name": spec.name, "parameters": spec.input_schema}), spec);
    json!({"type": "function", "function": function})
}

fn push_message(m: &Message, out: &mut Vec<Value>) {
    match m.role {
        Role::User => out.extend(user_like("user", m)),
        Role::System => out.extend(user_like("system", m)),
        Role::Assistant => out.extend(assistant(m)),
        Role::Tool => out.extend(m.content.iter().filter_map(tool_result)),
    }
}

fn user_like(role: &str, m: &Message) -> Option<Value> {
    let parts: Vec<Value> = m
        .content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.is_empty() => Some(json!({"type": "text", "text": text})),
            Part::Image { media_type, data } => {
                Some(json!({"type": "image_url", "image_url": {"url": data_url(media_type, data)}}))
            }
            _ => None,
        })
        .collect();
    match parts.as_slice() {
        [] => None,
        [only] if only["type"] == "text" => Some(json!({"role": role, "content": only["text"]})),
        _ => Some(json!({"role": role, "content": parts})),
    }
}

fn assistant(m: &Message) -> Option<Value> {
    let text = m.text();
    let calls: Vec<Value> = m
        .content
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall { tool_call_id, tool_name, input } => Some(json!({
                "id": tool_call_id,
                "type": "function",
                "function": {"name": tool_name, "arguments": arguments_text(input)},
            })),
            _ => None,
        })
        .collect();
    if text.is_empty() && calls.is_empty() {
        return None;
    }
    let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
    if !calls.is_empty() {
        msg["tool_calls"] = json!(calls);
    }
    Some(msg)
}

fn tool_result(part: &Part) -> Option<Value> {
    match part {
        Part::ToolResult { tool_call_id, output, is_error } => {
            let (text, _) = tool_output(output, *is_error);
            Some(json!({"role": "tool", "tool_call_id": tool_call_id, "content": text}))
        }
        _ => None,
    }
}

/// `finish_reason` normalized: `stop`, `length`, `tool_calls` (and the deprecated
/// `function_call`), `content_filter`; anything else → other. A `stop` after refusal deltas is
/// `refusal`; a `stop` after tool calls is `tool_calls` (some compatibles report `stop` there).
pub fn normalize_finish_reason(raw: &str, refused: bool, called: bool) -> &'static str {
    match raw {
        "stop" if refused => "refusal",
        "stop" if called => "tool_calls",
        "stop" => "stop",
        "length" => "length",
        "tool_calls" | "function_call" => "tool_calls",
        "content_filter" => "content_filter",
        _ => "other",
    }
}

/// One tool call seen in the stream: its wire `index` and `id` as first sent.
#[derive(Debug)]
struct Call {
    wire_index: Option<u64>,
    id: Option<String>,
}

/// Decodes a Chat Completions stream.
///
/// Only choice 0 is read (broca never asks for `n > 1`). Tool-call fragments are keyed by their
/// wire `index`; a fragment carrying a new `id` under an index already used starts a new call
/// (compatibles that send every parallel call at index 0), so a `ToolCallStart` index is always
/// the call's position in the message. `finished` once `[DONE]` or an error chunk.
#[derive(Debug)]
pub struct ChatDecoder {
    calls: Vec<Call>,
    refused: bool,
    finished: bool,
    /// Whether chunks of the common shape are read without a JSON tree ([`chat_chunk::fast`]);
    /// off only to compare the two readings.
    fast: bool,
    /// The last `service_tier` a chunk stated (each chunk repeats it; it is reported once).
    served: Option<String>,
}

impl Default for ChatDecoder {
    fn default() -> ChatDecoder {
        ChatDecoder { calls: Vec::new(), refused: false, finished: false, fast: true, served: None }
    }
}

impl ChatDecoder {
    pub fn new() -> ChatDecoder {
        ChatDecoder::default()
    }

    /// A decoder that reads every chunk through its JSON tree (tests compare it with the
    /// fast reading).
    #[cfg(test)]
    pub(crate) fn tree_only() -> ChatDecoder {
        ChatDecoder { fast: false, ..ChatDecoder::default() }
    }

    /// The call position a tool-call fragment belongs to, starting a call when it is new.
    fn call_for(&mut self, tc: &CallView<'_>, out: &mut Vec<StreamEvent>) -> usize {
        let wire_index = tc.index;
        let id = tc.id.as_deref().filter(|s| !s.is_empty());
        let known = self.calls.iter().rposition(|c| {
            (wire_index.is_none() || c.wire_index == wire_index) && (id.is_none() || c.id.as_deref() == id)
        });
        if let Some(i) = known {
            return i;
        }
        let index = self.calls.len();
        self.calls.push(Call { wire_index, id: id.map(String::from) });
        out.push(StreamEvent::ToolCallStart {
            index,
            id: id.unwrap_or_default().to_string(),
            name: tc.name.as_deref().unwrap_or_default().to_string(),
        });
        index
    }

    /// Choice 0's delta and finish reason; returns whether it carried content.
    fn choice(&mut self, choice: &ChoiceView<'_>, out: &mut Vec<StreamEvent>) -> bool {
        let mut content = push_text(out, choice.content.as_deref(), text_delta);
        content |= push_text(out, choice.reasoning.as_deref(), reasoning_delta);
        if push_text(out, choice.refusal.as_deref(), text_delta) {
            self.refused = true;
            content = true;
        }
        for tc in &choice.tool_calls {
            let index = self.call_for(tc, out);
            if let Some(args) = tc.arguments.as_deref().filter(|a| !a.is_empty()) {
                out.push(StreamEvent::ToolCallArgsDelta { index, delta: args.to_string() });
                content = true;
            }
        }
        if let Some(raw) = choice.finish_reason.as_deref() {
            out.push(finish(normalize_finish_reason(raw, self.refused, !self.calls.is_empty()), raw));
        }
        content
    }

    /// A chunk's choice: its events, and the event's class (`unknown` when it had neither
    /// choices nor usage).
    fn chunk(&mut self, view: &ChunkView<'_>, usage: bool, out: &mut Vec<StreamEvent>) -> EventClass {
        if let Some(tier) = view.service_tier.as_deref().filter(|t| self.served.as_deref() != Some(*t)) {
            self.served = Some(tier.to_owned());
            out.push(StreamEvent::ServedTier { tier: super::tier::openai_served(tier) });
        }
        let content = match &view.choice {
            Some(choice) => self.choice(choice, out),
            None => false,
        };
        let kind = view.object.as_deref().unwrap_or("chat.completion.chunk");
        class(kind, content, !view.has_choices && !usage)
    }
}

/// Usage as Chat reports it: `prompt_tokens` INCLUDES cached and cache-write tokens. DeepSeek's
/// `prompt_cache_hit_tokens` stands in for `cached_tokens` when that is absent.
///
/// `completion_tokens` includes the reasoning tokens on OpenAI, but not on every compatible: xAI
/// counts them apart, its `total_tokens` being prompt + completion + reasoning
/// (`testdata/real-streams/openai_chat/c09`: 291 + 26 + 196 = 513). When the total says so, the
/// reasoning is added to the output, where broca's usage keeps it.
fn usage(u: &Value) -> StepUsage {
    let cached =
        u64_at(u, &["prompt_tokens_details", "cached_tokens"]).or_else(|| u64_at(u, &["prompt_cache_hit_tokens"]));
    let prompt = u64_at(u, &["prompt_tokens"]);
    let completion = u64_at(u, &["completion_tokens"]);
    let reasoning = u64_at(u, &["completion_tokens_details", "reasoning_tokens"]);
    let total = u64_at(u, &["total_tokens"]);
    let output = match (prompt, completion, reasoning, total) {
        (Some(p), Some(c), Some(r), Some(t))
            if r > 0 && p.checked_add(c).and_then(|pc| pc.checked_add(r)) == Some(t) =>
        {
            Some(c + r)
        }
        _ => completion,
    };
    usage_from_total(prompt, cached, u64_at(u, &["prompt_tokens_details", "cache_write_tokens"]), output, reasoning)
}

impl StreamDecoder for ChatDecoder {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<EventClass, DecodeError> {
        if is_done(event) {
            self.finished = true;
            return Ok(class("[DONE]", false, false));
        }
        if self.fast {
            if let Some(view) = chat_chunk::fast(&event.data) {
                return Ok(self.chunk(&view, false, out));
            }
        }
        let data = data_object(event)?;
        if let Some(err) = data.get("error").filter(|e| !e.is_null()) {
            let message = str_at(err, &["message"]).or(err.as_str());
            // OpenRouter's code is the HTTP status, a number (`testdata/real-streams/openai_chat/c08`).
            let status = u64_at(err, &["code"]);
            out.push(stream_error_with_status(str_at(err, &["code"]), str_at(err, &["type"]), status, message));
            self.finished = true;
            return Ok(class("error", false, false));
        }
        let reported = data.get("usage").filter(|u| u.is_object());
        let class = self.chunk(&chat_chunk::from_value(&data), reported.is_some(), out);
        if let Some(usage) = reported.map(usage).filter(|u| !u.is_unreported()) {
            out.push(StreamEvent::Usage { usage });
        }
        Ok(class)
    }

    fn finished(&self) -> bool {
        self.finished
    }
}
