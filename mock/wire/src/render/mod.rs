//! Renders family-neutral steps into one family's SSE bytes.
//!
//! Shared rules (the per-family files hold the envelopes):
//! - The envelope (`message_start`, the Chat role chunk, `response.created`) opens lazily before
//!   the first content step, so leading `delay_ms`/`comment` steps come before any event.
//! - `usage` steps merge field by field (later wins) and are rendered where the family reports
//!   usage, whatever their position.
//! - Without an explicit `finish`, `error` or `disconnect`, the stream finishes with `stop`, or
//!   `tool_calls` when it had tool calls.
//! - `comment` renders `: text`, `unknown_event` renders `event: name` (omitted when the name is
//!   empty) and `data: <json>`, verbatim in every family.

mod anthropic;
mod bedrock;
mod chat;
mod gemini;
mod responses;

#[cfg(test)]
mod examples;
#[cfg(test)]
mod tests;

use serde_json::{json, Value};

use super::script::{Step, Usage};
use broca::provider::event::Family;

/// One unit of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// One SSE event or comment, blank line included.
    Bytes(Vec<u8>),
    Delay(u64),
    /// Close the connection now.
    Disconnect,
}

/// The identity of one rendered response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderCtx {
    /// The model echoed back (the request's `model`).
    pub model: String,
    /// A unique suffix for message, response, item and request ids.
    pub id: String,
    /// Unix seconds for `created` / `created_at`.
    pub created: u64,
    /// The `service_tier` an OpenAI stream states (the one its request asked for), if any.
    pub served_tier: Option<String>,
}

/// What each family renders: content steps and the terminal. Timing, comments, unknown events
/// and usage are handled once in [`render`].
trait Envelope {
    fn content(&mut self, step: &Step, out: &mut Vec<Piece>);
}

/// Renders `steps` for `family`.
pub fn render(family: Family, steps: &[Step], ctx: &RenderCtx) -> Vec<Piece> {
    let usage = merged_usage(steps);
    let mut renderer: Box<dyn Envelope + '_> = match family {
        Family::AnthropicMessages => Box::new(anthropic::Anthropic::new(ctx, usage)),
        Family::OpenaiChat => Box::new(chat::Chat::new(ctx, usage)),
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => Box::new(responses::Responses::new(ctx, usage)),
        Family::GoogleGenerateContent => Box::new(gemini::Gemini::new(ctx, usage, false)),
        Family::GoogleCodeAssist => Box::new(gemini::Gemini::new(ctx, usage, true)),
        Family::AwsBedrockConverse => Box::new(bedrock::Bedrock::new(ctx, usage)),
    };
    let binary = family == Family::AwsBedrockConverse;
    let mut out = Vec::new();
    for step in with_implicit_finish(steps) {
        match &step {
            Step::DelayMs(ms) => out.push(Piece::Delay(*ms)),
            // An event stream has no comments.
            Step::Comment(_) if binary => {}
            Step::Comment(text) => out.push(Piece::Bytes(format!(": {text}\n\n").into_bytes())),
            Step::UnknownEvent { name, data } if binary => out.push(bedrock::event(name, data)),
            Step::UnknownEvent { name, data } => {
                out.push(sse((!name.is_empty()).then_some(name.as_str()), &data.to_string()))
            }
            Step::Disconnect => {
                out.push(Piece::Disconnect);
                break;
            }
            Step::Usage(_) => {}
            content => renderer.content(content, &mut out),
        }
    }
    out
}

/// The bytes a client would receive, ignoring delays, up to a disconnect (for decoder tests
/// that need no socket).
pub fn bytes(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Bytes(b) => out.extend_from_slice(b),
            Piece::Delay(_) => {}
            Piece::Disconnect => break,
        }
    }
    out
}

/// The steps, plus a trailing `finish` when nothing ends the stream.
fn with_implicit_finish(steps: &[Step]) -> Vec<Step> {
    let ended = steps.iter().any(|s| matches!(s, Step::Finish(_) | Step::Error(_) | Step::Disconnect));
    let mut all = steps.to_vec();
    if !ended {
        let tools = steps.iter().any(|s| matches!(s, Step::ToolCall(_)));
        all.push(Step::Finish(if tools { "tool_calls" } else { "stop" }.into()));
    }
    all
}

fn merged_usage(steps: &[Step]) -> Option<Usage> {
    let mut merged: Option<Usage> = None;
    for step in steps {
        if let Step::Usage(u) = step {
            merged.get_or_insert_with(Usage::default).merge(u);
        }
    }
    merged
}

/// One SSE event: an optional `event:` line, one `data:` line, a blank line.
pub(crate) fn sse(event: Option<&str>, data: &str) -> Piece {
    let mut s = String::with_capacity(data.len() + 32);
    if let Some(name) = event {
        s.push_str("event: ");
        s.push_str(name);
        s.push('\n');
    }
    s.push_str("data: ");
    s.push_str(data);
    s.push_str("\n\n");
    Piece::Bytes(s.into_bytes())
}

/// An event whose `event:` name equals the `type` inside its data (Anthropic, Responses).
/// `type` is written first, as the real servers do (the other members follow in key order).
pub(crate) fn typed(kind: &str, data: Value) -> Piece {
    debug_assert!(data.get("type").is_none(), "the type is added here");
    let rest = data.to_string();
    let tag = format!("{{\"type\":{}", json!(kind));
    let json = match rest.strip_prefix('{') {
        Some("}") | None => format!("{tag}}}"),
        Some(members) => format!("{tag},{members}"),
    };
    sse(Some(kind), &json)
}

/// A present value as a JSON member; absent ones are left out.
pub(crate) fn put(obj: &mut Value, key: &str, value: Option<u64>) {
    if let Some(v) = value {
        obj[key] = json!(v);
    }
}

/// The sum of the present values, or absent when none is present.
pub(crate) fn sum(values: &[Option<u64>]) -> Option<u64> {
    values.iter().flatten().copied().reduce(|a, b| a.saturating_add(b))
}

/// The JSON body of a non-2xx reply in the family's own error shape.
pub fn error_document(family: Family, status: u16, request_id: &str) -> Value {
    match family {
        Family::AnthropicMessages => {
            let (kind, message) = match status {
                400 => ("invalid_request_error", "Invalid request."),
                401 => ("authentication_error", "invalid x-api-key"),
                402 => ("billing_error", "Your credit balance is too low."),
                403 => ("permission_error", "Your API key does not have permission to use the specified resource."),
                404 => ("not_found_error", "Not found."),
                413 => ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
                429 => ("rate_limit_error", "Number of request tokens has exceeded your rate limit."),
                504 => ("timeout_error", "Request timed out."),
                529 => ("overloaded_error", "Overloaded"),
                _ => ("api_error", "Internal server error"),
            };
            json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id})
        }
        Family::OpenaiChat | Family::OpenaiResponses | Family::OpenaiChatgptResponses => {
            let (kind, code, message) = match status {
                400 => ("invalid_request_error", Value::Null, "Invalid request."),
                401 => ("invalid_request_error", json!("invalid_api_key"), "Incorrect API key provided."),
                403 => ("invalid_request_error", json!("unsupported_country_region_territory"), "Forbidden."),
                404 => ("invalid_request_error", json!("model_not_found"), "The model does not exist."),
                429 => ("requests", json!("rate_limit_exceeded"), "Rate limit reached for requests."),
                503 => ("server_error", Value::Null, "The engine is currently overloaded, please try again later."),
                _ => ("server_error", Value::Null, "The server had an error while processing your request."),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        Family::GoogleGenerateContent | Family::GoogleCodeAssist => {
            let (status_name, message) = match status {
                400 => ("INVALID_ARGUMENT", "Request contains an invalid argument."),
                401 => ("UNAUTHENTICATED", "API key not valid. Please pass a valid API key."),
                403 => ("PERMISSION_DENIED", "The caller does not have permission."),
                404 => ("NOT_FOUND", "models/unknown is not found for API version v1beta."),
                429 => ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
                503 => ("UNAVAILABLE", "The model is overloaded. Please try again later."),
                504 => ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
                _ => ("INTERNAL", "An internal error has occurred."),
            };
            let _ = request_id;
            json!({"error": {"code": status, "message": message, "status": status_name}})
        }
        Family::AwsBedrockConverse => {
            let message = match status {
                400 => "The provided request is not valid.",
                403 => "The security token included in the request is invalid.",
                404 => "The specified model could not be found.",
                429 => "Too many requests, please wait before trying again.",
                503 => "The service is temporarily unavailable.",
                _ => "The server encountered an internal error.",
            };
            json!({"message": message})
        }
    }
}
