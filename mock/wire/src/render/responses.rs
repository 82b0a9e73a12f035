//! OpenAI Responses: `response.created`, `response.in_progress`, output items (messages with
//! `output_text`/`refusal` parts, `reasoning` items with a summary, `function_call` items),
//! each event with `event:` = `type` and a `sequence_number` from 0, then
//! `response.completed` (or `response.incomplete` for `length`/`content_filter`) carrying the
//! full response object and usage. An error is an `error` event then `response.failed`
//! (provider-streams.md, Examples E, F).
//!
//! A reasoning `signature` and redacted reasoning become the item's `encrypted_content`.

use serde_json::{json, Value};

use super::super::script::{Step, ToolCall, Usage};
use super::{put, sum, typed, Envelope, Piece, RenderCtx};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Text,
    Refusal,
}

/// The output item being streamed.
enum Open {
    Message { id: String, index: usize, parts: Vec<Value>, part: Option<(Part, String)> },
    Reasoning { id: String, index: usize, summary: Option<String>, encrypted: Option<String> },
}

/// Numbers events from 0.
struct Seq(u64);

impl Seq {
    fn event(&mut self, kind: &str, mut data: Value) -> Piece {
        data["sequence_number"] = json!(self.0);
        self.0 += 1;
        typed(kind, data)
    }
}

pub(super) struct Responses<'a> {
    ctx: &'a RenderCtx,
    usage: Option<Usage>,
    seq: Seq,
    started: bool,
    items: usize,
    output: Vec<Value>,
    open: Option<Open>,
}

impl<'a> Responses<'a> {
    pub(super) fn new(ctx: &'a RenderCtx, usage: Option<Usage>) -> Responses<'a> {
        Responses { ctx, usage, seq: Seq(0), started: false, items: 0, output: Vec::new(), open: None }
    }

    fn response(&self, status: &str) -> Value {
        let mut response = json!({
            "id": format!("resp_mock{}", self.ctx.id),
            "object": "response",
            "created_at": self.ctx.created,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": null,
            "model": self.ctx.model,
            "output": self.output,
            "previous_response_id": null,
            "usage": null,
        });
        if let Some(tier) = &self.ctx.served_tier {
            response["service_tier"] = json!(tier);
        }
        response
    }

    fn usage_json(&self) -> Value {
        let Some(u) = &self.usage else { return Value::Null };
        // input_tokens includes cache reads and writes.
        let input = sum(&[u.input, u.cached, u.cache_write]);
        let mut usage = json!({});
        put(&mut usage, "input_tokens", input);
        if u.cached.is_some() || u.cache_write.is_some() {
            let mut details = json!({});
            put(&mut details, "cached_tokens", u.cached);
            put(&mut details, "cache_write_tokens", u.cache_write);
            usage["input_tokens_details"] = details;
        }
        put(&mut usage, "output_tokens", u.output);
        if let Some(r) = u.reasoning {
            usage["output_tokens_details"] = json!({ "reasoning_tokens": r });
        }
        put(&mut usage, "total_tokens", sum(&[input, u.output]));
        usage
    }

    fn start(&mut self, out: &mut Vec<Piece>) {
        if !self.started {
            self.started = true;
            let response = self.response("in_progress");
            out.push(self.seq.event("response.created", json!({ "response": response })));
            out.push(self.seq.event("response.in_progress", json!({ "response": response })));
        }
    }

    /// Announces a new output item; returns its `output_index` and id.
    fn add_item(&mut self, prefix: &str, mut item: Value, out: &mut Vec<Piece>) -> (usize, String) {
        self.close_item(out);
        let index = self.items;
        self.items += 1;
        let id = format!("{prefix}_mock{}_{index}", self.ctx.id);
        item["id"] = json!(id);
        out.push(self.seq.event("response.output_item.added", json!({"output_index": index, "item": item})));
        (index, id)
    }

    fn item_done(&mut self, index: usize, item: Value, out: &mut Vec<Piece>) {
        out.push(self.seq.event("response.output_item.done", json!({"output_index": index, "item": item})));
        self.output.push(item);
    }

    fn close_item(&mut self, out: &mut Vec<Piece>) {
        match self.open.take() {
            None => {}
            Some(Open::Message { id, index, mut parts, part }) => {
                if let Some((kind, text)) = part {
                    close_part(&mut self.seq, &id, index, &mut parts, kind, text, out);
                }
                let item =
                    json!({"id": id, "type": "message", "role": "assistant", "status": "completed", "content": parts});
                self.item_done(index, item, out);
            }
            Some(Open::Reasoning { id, index, summary, encrypted }) => {
                let mut summaries = Vec::new();
                if let Some(text) = summary {
                    let at = json!({"item_id": id, "output_index": index, "summary_index": 0});
                    let mut done = at.clone();
                    done["text"] = json!(text);
                    out.push(self.seq.event("response.reasoning_summary_text.done", done));
                    let part = json!({"type": "summary_text", "text": text});
                    let mut done = at;
                    done["part"] = part.clone();
                    out.push(self.seq.event("response.reasoning_summary_part.done", done));
                    summaries.push(part);
                }
                let mut item = json!({"id": id, "type": "reasoning", "summary": summaries});
                if let Some(e) = encrypted {
                    item["encrypted_content"] = json!(e);
                }
                self.item_done(index, item, out);
            }
        }
    }

    fn message(&mut self, kind: Part, delta: &str, out: &mut Vec<Piece>) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            let item = json!({"type": "message", "role": "assistant", "status": "in_progress", "content": []});
            let (index, id) = self.add_item("msg", item, out);
            self.open = Some(Open::Message { id, index, parts: Vec::new(), part: None });
        }
        let Some(Open::Message { id, index, parts, part }) = &mut self.open else { unreachable!("message is open") };
        if part.as_ref().map(|(k, _)| *k) != Some(kind) {
            if let Some((k, text)) = part.take() {
                close_part(&mut self.seq, id, *index, parts, k, text, out);
            }
            let empty = match kind {
                Part::Text => json!({"type": "output_text", "text": "", "annotations": []}),
                Part::Refusal => json!({"type": "refusal", "refusal": ""}),
            };
            let added = json!({"item_id": id, "output_index": index, "content_index": parts.len(), "part": empty});
            out.push(self.seq.event("response.content_part.added", added));
            *part = Some((kind, String::new()));
        }
        if let Some((_, text)) = part {
            text.push_str(delta);
        }
        let mut data = json!({"item_id": id, "output_index": index, "content_index": parts.len(), "delta": delta});
        let event = match kind {
            Part::Text => {
                data["logprobs"] = json!([]);
                data["obfuscation"] = json!(obfuscation(delta));
                "response.output_text.delta"
            }
            Part::Refusal => "response.refusal.delta",
        };
        out.push(self.seq.event(event, data));
    }

    fn reasoning(&mut self, text: &str, signature: Option<&str>, out: &mut Vec<Piece>) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            let (index, id) = self.add_item("rs", json!({"type": "reasoning", "summary": []}), out);
            self.open = Some(Open::Reasoning { id, index, summary: None, encrypted: None });
        }
        let Some(Open::Reasoning { id, index, summary, encrypted }) = &mut self.open else {
            unreachable!("reasoning is open")
        };
        if !text.is_empty() {
            let at = json!({"item_id": id, "output_index": index, "summary_index": 0});
            if summary.is_none() {
                let mut added = at.clone();
                added["part"] = json!({"type": "summary_text", "text": ""});
                out.push(self.seq.event("response.reasoning_summary_part.added", added));
            }
            summary.get_or_insert_with(String::new).push_str(text);
            let mut delta = at;
            delta["delta"] = json!(text);
            delta["obfuscation"] = json!(obfuscation(text));
            out.push(self.seq.event("response.reasoning_summary_text.delta", delta));
        }
        if let Some(sig) = signature {
            *encrypted = Some(sig.to_string());
            self.close_item(out);
        }
    }

    fn tool_call(&mut self, call: &ToolCall, out: &mut Vec<Piece>) {
        let mut item = json!({"type": "function_call", "status": "in_progress", "call_id": call.id,
            "name": call.name, "arguments": ""});
        let (index, id) = self.add_item("fc", item.clone(), out);
        for fragment in &call.fragments {
            let data = json!({"item_id": id, "output_index": index, "delta": fragment,
                "obfuscation": obfuscation(fragment)});
            out.push(self.seq.event("response.function_call_arguments.delta", data));
        }
        let done = json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments()});
        out.push(self.seq.event("response.function_call_arguments.done", done));
        item["id"] = json!(id);
        item["status"] = json!("completed");
        item["arguments"] = json!(call.arguments());
        self.item_done(index, item, out);
    }

    fn finish(&mut self, reason: &str, out: &mut Vec<Piece>) {
        self.close_item(out);
        let incomplete = match reason {
            "stop" | "tool_calls" | "refusal" => None,
            "length" => Some("max_output_tokens"),
            other => Some(other),
        };
        let (kind, mut response) = match incomplete {
            None => {
                let mut r = self.response("completed");
                r["completed_at"] = json!(self.ctx.created);
                ("response.completed", r)
            }
            Some(why) => {
                let mut r = self.response("incomplete");
                r["incomplete_details"] = json!({ "reason": why });
                ("response.incomplete", r)
            }
        };
        response["usage"] = self.usage_json();
        out.push(self.seq.event(kind, json!({ "response": response })));
    }
}

/// Closes a message content part: its `.done` event, then `content_part.done`.
fn close_part(
    seq: &mut Seq,
    id: &str,
    index: usize,
    parts: &mut Vec<Value>,
    kind: Part,
    text: String,
    out: &mut Vec<Piece>,
) {
    let at = json!({"item_id": id, "output_index": index, "content_index": parts.len()});
    let mut done = at.clone();
    let part = match kind {
        Part::Text => {
            done["text"] = json!(text);
            done["logprobs"] = json!([]);
            out.push(seq.event("response.output_text.done", done));
            json!({"type": "output_text", "text": text, "annotations": []})
        }
        Part::Refusal => {
            done["refusal"] = json!(text);
            out.push(seq.event("response.refusal.done", done));
            json!({"type": "refusal", "refusal": text})
        }
    };
    let mut done = at;
    done["part"] = part.clone();
    out.push(seq.event("response.content_part.done", done));
    parts.push(part);
}

/// A deterministic stand-in for the padding OpenAI adds to deltas by default.
fn obfuscation(delta: &str) -> String {
    let n = 1 + (16 - delta.len() % 16) % 16;
    "Zq3xK9mPb2Lw7nRv0"[..n].to_string()
}

impl Envelope for Responses<'_> {
    fn content(&mut self, step: &Step, out: &mut Vec<Piece>) {
        self.start(out);
        match step {
            Step::Text(t) | Step::TextBlock(t) => self.message(Part::Text, t, out),
            Step::Refusal(t) => self.message(Part::Refusal, t, out),
            Step::Reasoning { text, signature } => self.reasoning(text, signature.as_deref(), out),
            Step::RedactedReasoning(data) => {
                let item = json!({"type": "reasoning", "summary": [], "encrypted_content": data});
                let (index, id) = self.add_item("rs", item.clone(), out);
                let mut item = item;
                item["id"] = json!(id);
                self.item_done(index, item, out);
            }
            Step::ToolCall(call) => self.tool_call(call, out),
            Step::Finish(reason) => self.finish(reason, out),
            Step::Error(e) => {
                // Open items stay open: the response failed mid-item (Example F).
                let error = json!({"code": e.kind, "message": e.message, "param": null});
                out.push(self.seq.event("error", error));
                let mut response = self.response("failed");
                response["error"] = json!({"code": e.kind, "message": e.message});
                out.push(self.seq.event("response.failed", json!({ "response": response })));
            }
            _ => {}
        }
    }
}
