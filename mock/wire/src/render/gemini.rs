//! Google Gemini `streamGenerateContent?alt=sse`: `data:`-only events, each a whole
//! `GenerateContentResponse` with one candidate: its `content` (`role: "model"`, the chunk's
//! parts), `index: 0`; the last chunk adds `finishReason`; every chunk carries the cumulative
//! `usageMetadata` when the script reports usage, and `modelVersion` and `responseId`. No
//! sentinel follows the last chunk. Code Assist wraps each as `{response, traceId}` (an error
//! stays unwrapped).
//!
//! Steps: text → a `{text}` part; reasoning → a `{text, thought: true}` part, its signature as
//! `thoughtSignature` on the next part (an empty text part when none follows); a tool call → a
//! whole `{functionCall: {name, args, id}}` part in one chunk (its fragments joined; arguments
//! that are not a JSON object are sent as they are, as a string); a refusal → text with
//! `finishReason: SAFETY`; redacted reasoning renders nothing. Finish: stop → `STOP`,
//! tool_calls → `STOP`, length → `MAX_TOKENS`, content_filter / refusal → `SAFETY`, anything
//! else raw. An error is `{"error": {code, message, status}}` and ends the stream.

use serde_json::{json, Value};

use super::super::script::{Step, Usage};
use super::{put, sse, sum, Envelope, Piece, RenderCtx};

pub(super) struct Gemini<'a> {
    ctx: &'a RenderCtx,
    usage: Option<Usage>,
    /// A signature waiting for the next part.
    signature: Option<String>,
    refused: bool,
    /// Code Assist: each response wrapped as `{response, traceId}`.
    wrapped: bool,
}

impl<'a> Gemini<'a> {
    pub(super) fn new(ctx: &'a RenderCtx, usage: Option<Usage>, wrapped: bool) -> Gemini<'a> {
        Gemini { ctx, usage, signature: None, refused: false, wrapped }
    }

    fn chunk(&self, parts: Vec<Value>, finish: Option<&str>, out: &mut Vec<Piece>) {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(reason) = finish {
            candidate["finishReason"] = json!(reason);
        }
        let mut response = json!({"candidates": [candidate]});
        if let Some(u) = &self.usage {
            // promptTokenCount includes the cached tokens; candidates exclude thoughts.
            let mut usage = json!({});
            let prompt = sum(&[u.input, u.cached, u.cache_write]);
            put(&mut usage, "promptTokenCount", prompt);
            let thoughts = u.reasoning;
            put(&mut usage, "candidatesTokenCount", u.output.map(|o| o.saturating_sub(thoughts.unwrap_or(0))));
            put(&mut usage, "totalTokenCount", sum(&[prompt, u.output]));
            put(&mut usage, "cachedContentTokenCount", u.cached.filter(|c| *c > 0));
            put(&mut usage, "thoughtsTokenCount", thoughts);
            response["usageMetadata"] = usage;
        }
        response["modelVersion"] = json!(self.ctx.model);
        response["responseId"] = json!(format!("mock{}", self.ctx.id));
        if self.wrapped {
            response = json!({"response": response, "traceId": format!("trace{}", self.ctx.id)});
        }
        out.push(sse(None, &response.to_string()));
    }

    /// One part, with the waiting signature if any.
    fn part(&mut self, mut part: Value, out: &mut Vec<Piece>) {
        if let Some(sig) = self.signature.take() {
            part["thoughtSignature"] = json!(sig);
        }
        self.chunk(vec![part], None, out);
    }
}

impl Envelope for Gemini<'_> {
    fn content(&mut self, step: &Step, out: &mut Vec<Piece>) {
        match step {
            Step::Text(t) | Step::TextBlock(t) => self.part(json!({"text": t}), out),
            Step::Refusal(t) => {
                self.refused = true;
                self.part(json!({"text": t}), out)
            }
            Step::Reasoning { text, signature } => {
                if !text.is_empty() {
                    self.part(json!({"text": text, "thought": true}), out);
                }
                if let Some(sig) = signature {
                    self.signature = Some(sig.clone());
                }
            }
            Step::RedactedReasoning(_) => {}
            Step::ToolCall(call) => {
                let raw = call.fragments.concat();
                let args = match serde_json::from_str::<Value>(&raw) {
                    Ok(v @ Value::Object(_)) => v,
                    _ if raw.is_empty() => json!({}),
                    _ => Value::String(raw),
                };
                self.part(json!({"functionCall": {"name": call.name, "args": args, "id": call.id}}), out);
            }
            Step::Finish(reason) => {
                let raw = match reason.as_str() {
                    "stop" | "tool_calls" if self.refused => "SAFETY",
                    "stop" | "tool_calls" => "STOP",
                    "length" => "MAX_TOKENS",
                    "content_filter" | "refusal" => "SAFETY",
                    other => other,
                };
                let parts = match self.signature.take() {
                    Some(sig) => vec![json!({"text": "", "thoughtSignature": sig})],
                    None => vec![json!({"text": ""})],
                };
                self.chunk(parts, Some(raw), out);
            }
            Step::Error(e) => {
                let (code, status) = match e.kind.as_str() {
                    "overloaded_error" | "server_error" | "api_error" => (503, "UNAVAILABLE"),
                    "rate_limit_error" | "rate_limit_exceeded" => (429, "RESOURCE_EXHAUSTED"),
                    "invalid_request_error" => (400, "INVALID_ARGUMENT"),
                    other => (500, other),
                };
                out.push(sse(
                    None,
                    &json!({"error": {"code": code, "message": e.message, "status": status}}).to_string(),
                ));
            }
            _ => {}
        }
    }
}
