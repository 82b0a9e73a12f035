//! OpenAI Chat Completions: `data:`-only `chat.completion.chunk` objects sharing one id,
//! `created` and model; the role first (alone, or with the first tool call); tool calls keyed by `index`; a finish chunk with an
//! empty delta; with usage, `"usage": null` on every chunk and a last `choices: []` usage chunk
//! (as with `stream_options.include_usage`); then `data: [DONE]` (Examples C, D).
//!
//! Reasoning renders as DeepSeek-style `reasoning_content` deltas (signatures have no Chat form
//! and are dropped); redacted reasoning has no Chat form and renders nothing. Chat has no
//! `refusal` finish reason: refusal text is `delta.refusal` and `finish: refusal` sends `stop`.

use serde_json::{json, Value};

use super::super::script::{Step, Usage};
use super::{put, sse, sum, Envelope, Piece, RenderCtx};

pub(super) struct Chat<'a> {
    ctx: &'a RenderCtx,
    usage: Option<Usage>,
    started: bool,
    next_tool: usize,
}

impl<'a> Chat<'a> {
    pub(super) fn new(ctx: &'a RenderCtx, usage: Option<Usage>) -> Chat<'a> {
        Chat { ctx, usage, started: false, next_tool: 0 }
    }

    fn envelope(&self, choices: Value) -> Value {
        let mut chunk = json!({
            "id": format!("chatcmpl-mock{}", self.ctx.id),
            "object": "chat.completion.chunk",
            "created": self.ctx.created,
            "model": self.ctx.model,
            "system_fingerprint": "fp_mock",
            "choices": choices,
        });
        if let Some(tier) = &self.ctx.served_tier {
            chunk["service_tier"] = json!(tier);
        }
        if self.usage.is_some() {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>, out: &mut Vec<Piece>) {
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason});
        out.push(sse(None, &self.envelope(json!([choice])).to_string()));
    }

    fn usage_chunk(&self, u: &Usage, out: &mut Vec<Piece>) {
        // prompt_tokens includes cache reads and writes.
        let prompt = sum(&[u.input, u.cached, u.cache_write]);
        let mut usage = json!({});
        put(&mut usage, "prompt_tokens", prompt);
        put(&mut usage, "completion_tokens", u.output);
        put(&mut usage, "total_tokens", sum(&[prompt, u.output]));
        if u.cached.is_some() || u.cache_write.is_some() {
            let mut details = json!({});
            put(&mut details, "cached_tokens", u.cached);
            put(&mut details, "cache_write_tokens", u.cache_write);
            usage["prompt_tokens_details"] = details;
        }
        if let Some(r) = u.reasoning {
            usage["completion_tokens_details"] = json!({ "reasoning_tokens": r });
        }
        let mut chunk = self.envelope(json!([]));
        chunk["usage"] = usage;
        out.push(sse(None, &chunk.to_string()));
    }

    fn done(out: &mut Vec<Piece>) {
        out.push(sse(None, "[DONE]"));
    }
}

impl Envelope for Chat<'_> {
    fn content(&mut self, step: &Step, out: &mut Vec<Piece>) {
        if let Step::Error(e) = step {
            let error = json!({"message": e.message, "type": e.kind, "param": null, "code": null});
            out.push(sse(None, &json!({ "error": error }).to_string()));
            if e.done {
                Chat::done(out);
            }
            return;
        }
        // The role comes first: alone, or with the first tool call (Examples C, D).
        let first = !self.started;
        self.started = true;
        if first && !matches!(step, Step::ToolCall(_)) {
            self.chunk(json!({"role": "assistant", "content": ""}), None, out);
        }
        match step {
            Step::Text(t) | Step::TextBlock(t) => self.chunk(json!({ "content": t }), None, out),
            Step::Reasoning { text, .. } if !text.is_empty() => {
                self.chunk(json!({ "reasoning_content": text }), None, out)
            }
            Step::Refusal(t) => self.chunk(json!({ "refusal": t }), None, out),
            Step::ToolCall(call) => {
                let index = self.next_tool;
                self.next_tool += 1;
                let start = json!({"index": index, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}});
                let mut delta = json!({ "tool_calls": [start] });
                if first {
                    delta["role"] = json!("assistant");
                    delta["content"] = Value::Null;
                }
                self.chunk(delta, None, out);
                for fragment in &call.fragments {
                    let next = json!({"index": index, "function": {"arguments": fragment}});
                    self.chunk(json!({ "tool_calls": [next] }), None, out);
                }
            }
            Step::Finish(reason) => {
                let native = if reason == "refusal" { "stop" } else { reason.as_str() };
                self.chunk(json!({}), Some(native), out);
                if let Some(u) = &self.usage {
                    self.usage_chunk(u, out);
                }
                Chat::done(out);
            }
            _ => {}
        }
    }
}
