//! Anthropic's zero-output request, as broca's `session.warm` sends it: a Messages request with
//! `max_tokens: 0` and no `stream`. The provider reads (or writes) the prompt cache for the
//! request's prefix exactly as for a streamed one, generates nothing, and answers the
//! non-streaming Message JSON: empty `content`, `stop_reason: "max_tokens"`, and the usage its
//! cache earned. Its `anthropic-ratelimit-unified-*` headers come with it. A warm never pops a
//! scripted response; the script's `warms` may delay one or make it an HTTP error.
//!
//! As the API does, a zero-output request with manual thinking is refused 400: the budget
//! must be below `max_tokens`.

use serde_json::{json, Value};

use super::http::Reply;
use super::script::Usage;

/// Whether `body` is a zero-output Messages request (a warm).
pub fn is_warm(body: &Value) -> bool {
    body.get("max_tokens").and_then(Value::as_u64) == Some(0)
        && body.get("stream").and_then(Value::as_bool) != Some(true)
}

/// Why the API would refuse this warm, if it would.
pub fn refused(body: &Value) -> Option<&'static str> {
    (body.pointer("/thinking/type").and_then(Value::as_str) == Some("enabled"))
        .then_some("max_tokens must be greater than thinking.budget_tokens")
}

/// The Message a warm is answered with, its usage from the lane's prompt cache.
pub(crate) fn answer(model: &str, id: &str, usage: &Usage) -> Reply {
    let body = json!({
        "id": format!("msg_mock{id}"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": "max_tokens",
        "stop_sequence": null,
        "usage": {
            "input_tokens": usage.input.unwrap_or(0),
            "cache_creation_input_tokens": usage.cache_write.unwrap_or(0),
            "cache_read_input_tokens": usage.cached.unwrap_or(0),
            "output_tokens": 0,
        },
    });
    let mut reply = Reply::json(200, &body);
    reply.headers.push(("request-id".into(), format!("req_mock{id}")));
    reply.headers.push(("anthropic-ratelimit-unified-status".into(), "allowed".into()));
    reply.headers.push(("anthropic-ratelimit-unified-5h-utilization".into(), "0.01".into()));
    reply
}

/// The 400 the API answers a warm it refuses.
pub(crate) fn refusal(message: &str, id: &str) -> Reply {
    let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message},
                      "request_id": format!("req_mock{id}")});
    Reply::json(400, &body)
}
