//! Helpers the wire families share: reading SSE data as JSON, usage shapes, tool-output
//! text, and finishing a request body (variant merge, compact deterministic bytes).
//!
//! Invariants: nothing here panics on provider input; a number the provider did not send (or sent
//! as something other than a non-negative integer) reads as `None`, never as 0.

use serde_json::{json, Map, Value};

use super::config::{RenderConfig, ToolSpec};
use super::event::{DecodeError, EventClass, StreamEvent};
use super::sse::SseEvent;
use crate::message::{ContentOutput, Message, OutputPart, StepUsage};

/// Whether the event is the `data: [DONE]` sentinel (Chat's terminator; tolerated elsewhere).
pub(crate) fn is_done(event: &SseEvent) -> bool {
    event.data.trim() == "[DONE]"
}

/// Reads an event's data as a JSON object. Empty data reads as `{}` (an `event:` line alone);
/// data that is not JSON, or JSON that is not an object, is a [`DecodeError`].
pub(crate) fn data_object(event: &SseEvent) -> Result<Value, DecodeError> {
    if event.data.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(&event.data) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(DecodeError("event data is JSON but not an object".into())),
        Err(e) => Err(DecodeError(format!("event data is not JSON: {e}"))),
    }
}

/// The event's type: the data's `type` member, else the `event:` name, else `message` (the SSE
/// default event name).
pub(crate) fn event_type(data: &Value, event: &SseEvent) -> String {
    str_at(data, &["type"]).or(event.event.as_deref()).unwrap_or("message").to_string()
}

pub(crate) fn class(event_type: impl Into<String>, content: bool, unknown: bool) -> EventClass {
    EventClass { event_type: event_type.into(), content, unknown }
}

/// The value at `path` (object keys), if every step exists.
pub(crate) fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, key| v.get(key))
}

pub(crate) fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

/// A token count: a non-negative integer (an integral float is accepted); anything else is absent.
pub(crate) fn u64_at(v: &Value, path: &[&str]) -> Option<u64> {
    let n = at(v, path)?;
    n.as_u64().or_else(|| n.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 1e18).map(|f| f as u64))
}

/// Pushes a non-empty text delta built by `make`; returns whether it pushed (i.e. real content).
pub(crate) fn push_text(out: &mut Vec<StreamEvent>, text: Option<&str>, make: fn(String) -> StreamEvent) -> bool {
    match text {
        Some(t) if !t.is_empty() => {
            out.push(make(t.to_string()));
            true
        }
        _ => false,
    }
}

pub(crate) fn text_delta(text: String) -> StreamEvent {
    StreamEvent::TextDelta { text }
}

pub(crate) fn reasoning_delta(text: String) -> StreamEvent {
    StreamEvent::ReasoningDelta { text }
}

pub(crate) fn finish(reason: &str, raw: &str) -> StreamEvent {
    StreamEvent::Finish { reason: reason.to_string(), raw: raw.to_string() }
}

/// Replaces, field by field, the measurements `from` reports.
pub(crate) fn merge_usage(into: &mut StepUsage, from: &StepUsage) {
    fn put(a: &mut Option<u64>, b: Option<u64>) {
        if b.is_some() {
            *a = b;
        }
    }
    put(&mut into.input_tokens, from.input_tokens);
    put(&mut into.cached_input_tokens, from.cached_input_tokens);
    put(&mut into.cache_write_tokens, from.cache_write_tokens);
    put(&mut into.output_tokens, from.output_tokens);
    put(&mut into.reasoning_tokens, from.reasoning_tokens);
}

/// Usage from an OpenAI-style report whose input total INCLUDES cache reads and writes: fresh
/// input is the total minus both (saturating). Absent parts stay absent.
pub(crate) fn usage_from_total(
    total_input: Option<u64>,
    cached: Option<u64>,
    cache_write: Option<u64>,
    output: Option<u64>,
    reasoning: Option<u64>,
) -> StepUsage {
    StepUsage {
        input_tokens: total_input
            .map(|t| t.saturating_sub(cached.unwrap_or(0)).saturating_sub(cache_write.unwrap_or(0))),
        cached_input_tokens: cached,
        cache_write_tokens: cache_write,
        output_tokens: output,
        reasoning_tokens: reasoning,
    }
}

/// The model-facing text of a tool result and whether it reports an error.
///
/// `{"kind":"text","text":…}` gives its text, `{"kind":"json","json":…}` its compact JSON.
/// `{"kind":"error",…}` is rendered as the
/// llm-runner contract §8.3 prescribes: `message`, then one line per present member in the order
/// `module: …`, `code: …`, `detail: …`, `nothing was sent`, `retry: …`, joined by `\n`. A bare
/// string is itself; any other value is its compact JSON.
pub(crate) fn tool_output(output: &Value, is_error: bool) -> (String, bool) {
    match str_at(output, &["kind"]) {
        Some("text") => (str_at(output, &["text"]).unwrap_or_default().to_string(), is_error),
        Some("error") => (error_output_text(output), true),
        // A result with images, for a family that takes none in a tool result: its text, each
        // image as its note (`tool_images` gives the parts to a family that takes them).
        Some("content") => match ContentOutput::of(output) {
            Some(content) => (content.text(), is_error),
            None => (compact(output), is_error),
        },
        // A provider's non-string legacy body, kept as the JSON it sent.
        Some("json") => (at(output, &["json"]).map(compact).unwrap_or_default(), is_error),
        _ => match output {
            Value::String(s) => (s.clone(), is_error),
            other => (compact(other), is_error),
        },
    }
}

/// The parts of a tool result that carries images (`{"kind":"content"}`), for a family whose
/// provider takes images in a tool result; `None` for any other result, which renders as text.
pub(crate) fn tool_images(output: &Value) -> Option<Vec<OutputPart>> {
    ContentOutput::of(output).map(|c| c.content)
}

fn error_output_text(output: &Value) -> String {
    let mut lines = vec![str_at(output, &["message"]).unwrap_or("tool error").to_string()];
    for key in ["module", "code", "detail"] {
        match at(output, &[key]) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => lines.push(format!("{key}: {s}")),
            Some(other) => lines.push(format!("{key}: {}", compact(other))),
        }
    }
    if at(output, &["nothing_sent"]).and_then(Value::as_bool) == Some(true) {
        lines.push("nothing was sent".into());
    }
    if let Some(retry) = str_at(output, &["retry"]) {
        lines.push(format!("retry: {retry}"));
    }
    lines.join("\n")
}

/// Compact JSON. `Value` always serializes (its keys are strings).
pub(crate) fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A tool call's input as the arguments string OpenAI families send back: an object is its
/// compact JSON; `null` (no arguments) is `{}`; a string is taken as raw argument text the model
/// sent that did not parse, and is sent back verbatim.
pub(crate) fn arguments_text(input: &Value) -> String {
    match input {
        Value::Null => "{}".into(),
        Value::String(raw) => raw.clone(),
        other => compact(other),
    }
}

/// `data:` URL of an inline image.
pub(crate) fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

/// A tool's description member, omitted when empty.
pub(crate) fn with_description(mut tool: Value, spec: &ToolSpec) -> Value {
    if !spec.description.is_empty() {
        tool["description"] = json!(spec.description);
    }
    tool
}

/// A raw finish reason normalized by the role's own table (llm-runner §6.6,
/// `cortexkit_role_llm_runner::finish`) for the routing `source` (`google.generate_content`,
/// `aws.bedrock_converse`, …); `called`: the answer called a tool (a `stop` then reads
/// `tool_calls`). An unknown source reads `other`.
pub(crate) fn role_finish(source: &str, raw: &str, called: bool) -> String {
    match cortexkit_role_llm_runner::finish::normalize(source, Some(raw), called) {
        Ok(Some(finish)) => finish.as_str().to_owned(),
        Ok(None) | Err(_) => "other".to_owned(),
    }
}

/// Whether an assistant message's opaque reasoning (signatures, encrypted blobs) may be sent to
/// this route. A blob is only valid for the provider that minted it, so when the message's
/// `origin` names a provider (`provider` or `provider_module_id`) it must equal
/// `config.provider`; a message without one is assumed to be this route's.
pub(crate) fn replays_reasoning(message: &Message, config: &RenderConfig) -> bool {
    let Some(origin) = &message.origin else { return true };
    let named = str_at(origin, &["provider"]).or_else(|| str_at(origin, &["provider_module_id"]));
    named.is_none_or(|p| p == config.provider)
}

/// Merges `config.variant_params` (an object; `null` adds nothing) into the top level of a
/// request body, the variant's members replacing same-named ones.
pub(crate) fn merge_variant(body: &mut Value, config: &RenderConfig) {
    match (body, &config.variant_params) {
        (Value::Object(top), Value::Object(extra)) => {
            for (k, v) in extra {
                top.insert(k.clone(), v.clone());
            }
        }
        (_, Value::Null) => {}
        (_, _) => log::warn!(target: "broca.provider", "variant_params is not an object; ignored"),
    }
}
