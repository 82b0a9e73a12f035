//! Amazon Bedrock `ConverseStream`: an `application/vnd.amazon.eventstream` of JSON events
//! (`broca::provider::eventstream` frames them, CRCs included): `messageStart`, per content
//! block `contentBlockStart` (tool use only) / `contentBlockDelta` / `contentBlockStop`, then
//! `messageStop {stopReason}` and `metadata {usage, metrics}`. An error is an exception message
//! (`:message-type: exception`) and ends the stream.
//!
//! Steps: text → text deltas of one block; reasoning → `reasoningContent.text` deltas and its
//! `signature` in one block; redacted reasoning → `reasoningContent.redactedContent`; a tool
//! call → a `toolUse` block start and `toolUse.input` deltas (its fragments); a refusal → text
//! with `stopReason: content_filtered`. Finish: stop → `end_turn`, tool_calls → `tool_use`,
//! length → `max_tokens`, content_filter / refusal → `content_filtered`, anything else raw.

use serde_json::{json, Value};

use super::super::script::{Step, Usage};
use super::{put, Envelope, Piece, RenderCtx};
use broca::provider::eventstream::encode;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Reasoning,
}

pub(super) struct Bedrock {
    usage: Option<Usage>,
    started: bool,
    next_index: u64,
    open: Open,
    refused: bool,
}

/// One event message.
pub(crate) fn event(kind: &str, data: &Value) -> Piece {
    let headers = [(":event-type", kind), (":content-type", "application/json"), (":message-type", "event")];
    Piece::Bytes(encode(&headers, data.to_string().as_bytes()))
}

impl Bedrock {
    pub(super) fn new(_ctx: &RenderCtx, usage: Option<Usage>) -> Bedrock {
        Bedrock { usage, started: false, next_index: 0, open: Open::None, refused: false }
    }

    fn index(&self) -> u64 {
        self.next_index.saturating_sub(1)
    }

    fn close(&mut self, out: &mut Vec<Piece>) {
        if self.open != Open::None {
            out.push(event("contentBlockStop", &json!({"contentBlockIndex": self.index()})));
            self.open = Open::None;
        }
    }

    fn open_block(&mut self, kind: Open, out: &mut Vec<Piece>) {
        if self.open != kind {
            self.close(out);
            self.next_index += 1;
            self.open = kind;
        }
    }

    fn delta(&self, delta: Value, out: &mut Vec<Piece>) {
        out.push(event("contentBlockDelta", &json!({"contentBlockIndex": self.index(), "delta": delta})));
    }
}

impl Envelope for Bedrock {
    fn content(&mut self, step: &Step, out: &mut Vec<Piece>) {
        if let Step::Error(e) = step {
            let kind = match e.kind.as_str() {
                "overloaded_error" | "server_error" | "api_error" => "modelStreamErrorException",
                "rate_limit_error" | "rate_limit_exceeded" => "throttlingException",
                "invalid_request_error" => "validationException",
                other => other,
            };
            let headers =
                [(":exception-type", kind), (":content-type", "application/json"), (":message-type", "exception")];
            out.push(Piece::Bytes(encode(&headers, json!({"message": e.message}).to_string().as_bytes())));
            return;
        }
        if !self.started {
            self.started = true;
            out.push(event("messageStart", &json!({"role": "assistant"})));
        }
        match step {
            Step::Text(t) | Step::TextBlock(t) | Step::Refusal(t) => {
                self.refused |= matches!(step, Step::Refusal(_));
                self.open_block(Open::Text, out);
                self.delta(json!({"text": t}), out);
            }
            Step::Reasoning { text, signature } => {
                self.open_block(Open::Reasoning, out);
                if !text.is_empty() {
                    self.delta(json!({"reasoningContent": {"text": text}}), out);
                }
                if let Some(sig) = signature {
                    self.delta(json!({"reasoningContent": {"signature": sig}}), out);
                    self.close(out);
                }
            }
            Step::RedactedReasoning(data) => {
                self.close(out);
                self.next_index += 1;
                self.delta(json!({"reasoningContent": {"redactedContent": data}}), out);
                out.push(event("contentBlockStop", &json!({"contentBlockIndex": self.index()})));
            }
            Step::ToolCall(call) => {
                self.close(out);
                self.next_index += 1;
                let start = json!({"toolUse": {"toolUseId": call.id, "name": call.name}});
                out.push(event("contentBlockStart", &json!({"contentBlockIndex": self.index(), "start": start})));
                for fragment in call.fragments.iter().filter(|f| !f.is_empty()) {
                    self.delta(json!({"toolUse": {"input": fragment}}), out);
                }
                out.push(event("contentBlockStop", &json!({"contentBlockIndex": self.index()})));
            }
            Step::Finish(reason) => {
                self.close(out);
                let stop = match reason.as_str() {
                    "stop" | "tool_calls" if self.refused => "content_filtered",
                    "stop" => "end_turn",
                    "tool_calls" => "tool_use",
                    "length" => "max_tokens",
                    "content_filter" | "refusal" => "content_filtered",
                    other => other,
                };
                out.push(event("messageStop", &json!({"stopReason": stop})));
                let mut usage = json!({});
                if let Some(u) = &self.usage {
                    put(&mut usage, "inputTokens", u.input);
                    put(&mut usage, "outputTokens", u.output);
                    put(&mut usage, "cacheReadInputTokens", u.cached);
                    put(&mut usage, "cacheWriteInputTokens", u.cache_write);
                }
                out.push(event("metadata", &json!({"usage": usage, "metrics": {"latencyMs": 42}})));
            }
            _ => {}
        }
    }
}
