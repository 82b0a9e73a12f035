//! Anthropic Messages: `message_start`, sequential content blocks (`content_block_start`,
//! deltas, `content_block_stop`, a `ping` after the first block starts), `message_delta`
//! with the stop reason and output usage, `message_stop`. An error is `event: error` and
//! the stream ends without `message_delta`/`message_stop` (provider-streams.md, Examples A, B).

use serde_json::{json, Value};

use super::super::script::{Step, Usage};
use super::{put, typed, Envelope, Piece, RenderCtx};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Thinking,
}

pub(super) struct Anthropic<'a> {
    ctx: &'a RenderCtx,
    usage: Option<Usage>,
    started: bool,
    pinged: bool,
    next_index: usize,
    open: Open,
}

impl<'a> Anthropic<'a> {
    pub(super) fn new(ctx: &'a RenderCtx, usage: Option<Usage>) -> Anthropic<'a> {
        Anthropic { ctx, usage, started: false, pinged: false, next_index: 0, open: Open::None }
    }

    fn start_message(&mut self, out: &mut Vec<Piece>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut message = json!({
            "id": format!("msg_mock{}", self.ctx.id),
            "type": "message",
            "role": "assistant",
            "model": self.ctx.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
        });
        if let Some(u) = &self.usage {
            // Fresh input excludes cache reads and writes, as on the real wire.
            let mut usage = json!({});
            put(&mut usage, "input_tokens", u.input);
            put(&mut usage, "cache_creation_input_tokens", u.cache_write);
            put(&mut usage, "cache_read_input_tokens", u.cached);
            put(&mut usage, "output_tokens", u.output.map(|o| o.min(1)));
            message["usage"] = usage;
        }
        out.push(typed("message_start", json!({ "message": message })));
    }

    fn index(&self) -> usize {
        self.next_index - 1
    }

    fn start_block(&mut self, block: Value, out: &mut Vec<Piece>) {
        self.close_block(out);
        let index = self.next_index;
        self.next_index += 1;
        out.push(typed("content_block_start", json!({"index": index, "content_block": block})));
        if !self.pinged {
            self.pinged = true;
            // The real server sends exactly this (with its space) after the first block starts.
            out.push(Piece::Bytes(b"event: ping\ndata: {\"type\": \"ping\"}\n\n".to_vec()));
        }
    }

    fn stop_block(&mut self, out: &mut Vec<Piece>) {
        out.push(typed("content_block_stop", json!({ "index": self.index() })));
        self.open = Open::None;
    }

    fn close_block(&mut self, out: &mut Vec<Piece>) {
        if self.open != Open::None {
            self.stop_block(out);
        }
    }

    fn delta(&self, delta: Value, out: &mut Vec<Piece>) {
        out.push(typed("content_block_delta", json!({"index": self.index(), "delta": delta})));
    }

    fn text(&mut self, text: &str, out: &mut Vec<Piece>) {
        if self.open != Open::Text {
            self.start_block(json!({"type": "text", "text": ""}), out);
            self.open = Open::Text;
        }
        self.delta(json!({"type": "text_delta", "text": text}), out);
    }

    fn finish(&mut self, reason: &str, out: &mut Vec<Piece>) {
        self.close_block(out);
        let stop_reason = match reason {
            "stop" => "end_turn",
            "length" => "max_tokens",
            "tool_calls" => "tool_use",
            "content_filter" | "refusal" => "refusal",
            raw => raw,
        };
        let mut data = json!({"delta": {"stop_reason": stop_reason, "stop_sequence": null}});
        if let Some(output) = self.usage.and_then(|u| u.output) {
            data["usage"] = json!({ "output_tokens": output });
        }
        out.push(typed("message_delta", data));
        out.push(typed("message_stop", json!({})));
    }
}

impl Envelope for Anthropic<'_> {
    fn content(&mut self, step: &Step, out: &mut Vec<Piece>) {
        if let Step::Error(e) = step {
            // No block stop, no message_delta: the stream just ends (Example B).
            let error = json!({"type": e.kind, "message": e.message});
            let request_id = format!("req_mock{}", self.ctx.id);
            out.push(typed("error", json!({"error": error, "request_id": request_id})));
            return;
        }
        self.start_message(out);
        match step {
            // Anthropic refusals arrive as ordinary text with `stop_reason: "refusal"`.
            Step::Text(t) | Step::Refusal(t) => self.text(t, out),
            Step::TextBlock(t) => {
                self.close_block(out);
                self.text(t, out);
            }
            Step::Reasoning { text, signature } => {
                if self.open != Open::Thinking {
                    self.start_block(json!({"type": "thinking", "thinking": ""}), out);
                    self.open = Open::Thinking;
                }
                if !text.is_empty() {
                    self.delta(json!({"type": "thinking_delta", "thinking": text}), out);
                }
                if let Some(sig) = signature {
                    // The signature comes just before the block stops.
                    self.delta(json!({"type": "signature_delta", "signature": sig}), out);
                    self.stop_block(out);
                }
            }
            Step::RedactedReasoning(data) => {
                self.start_block(json!({"type": "redacted_thinking", "data": data}), out);
                self.stop_block(out);
            }
            Step::ToolCall(call) => {
                self.start_block(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}), out);
                self.delta(json!({"type": "input_json_delta", "partial_json": ""}), out);
                for fragment in &call.fragments {
                    self.delta(json!({"type": "input_json_delta", "partial_json": fragment}), out);
                }
                self.stop_block(out);
            }
            Step::Finish(reason) => self.finish(reason, out),
            _ => {}
        }
    }
}
