//! A provider's answer as the call's result (llm-runner 0.8.0 §8.3, §8.5; tool-provider §7):
//! a bare legacy body becomes the model's text (a JSON string) or JSON (anything else); a body
//! over the 65,536-byte model-visible limit is discarded whole for a `tool_result_too_large`
//! error; refusals and delivery failures become `owned-broca` error outputs naming the module.

use cortexkit_role_llm_runner::serializer_profile::error_output::ErrorOutput;
use cortexkit_role_llm_runner::tool_result_limit::{self, OUTPUT_DISCARDED};
use serde_json::{json, Value};
use subc_protocol::ErrorBody;

use crate::agent::ToolOutput;

/// The code of the result that replaces an oversized one.
pub use cortexkit_role_llm_runner::errors::tool_result_reasons::TOOL_RESULT_TOO_LARGE;
/// The code of a held reply on a route that never declared `held-reply/v1`.
pub const MALFORMED_HELD_REPLY: &str = "malformed_provider_held_reply";
/// The code of an answer that is not JSON.
pub const INVALID_ANSWER: &str = "invalid_answer";

/// The result of a call its provider answered with `body`.
pub fn answered(module: &str, body: &[u8]) -> ToolOutput {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        let message = format!("the tool provider {module} answered something that is not JSON ({} bytes)", body.len());
        return error(ErrorOutput::new(message).with_module(module).with_code(INVALID_ANSWER), false);
    };
    if value.get("held").is_some() {
        // broca declares no held replies: a provider holding the call broke the bind's terms.
        let message = format!("the tool provider {module} held the call on a route that does not take held replies");
        return error(ErrorOutput::new(message).with_module(module).with_code(MALFORMED_HELD_REPLY), false);
    }
    if let Some(size) = tool_result_limit::legacy_size_error(&value) {
        let detail = serde_json::to_string(&size).unwrap_or_default();
        return error(
            ErrorOutput::new(OUTPUT_DISCARDED).with_module(module).with_code(TOOL_RESULT_TOO_LARGE).with_detail(detail),
            false,
        );
    }
    let output = match value {
        Value::String(text) => json!({"kind": "text", "text": text}),
        other => json!({"kind": "json", "json": other}),
    };
    ToolOutput { output, is_error: false, refused: Some(false) }
}

/// The provider refused the call (it may have acted): its code, message and detail verbatim,
/// an oversized message replaced.
pub fn refused(module: &str, body: &ErrorBody) -> ToolOutput {
    let message = if tool_result_limit::refusal_oversized(&body.message) {
        OUTPUT_DISCARDED.to_string()
    } else {
        body.message.clone()
    };
    let mut out = ErrorOutput::new(message).with_module(module);
    if cortexkit_role_llm_runner::serializer_profile::error_output::is_valid_code(&body.code) {
        out = out.with_code(body.code.clone());
    }
    if let Some(detail) = one_line_detail(body) {
        out = out.with_detail(detail);
    }
    error(out, true)
}

/// The call never reached the provider (its route could not open, the daemon refused to
/// forward it, the connection's queue was full): `nothing_sent`, with the code verbatim.
pub fn not_sent(module: &str, code: &str, message: &str, detail: Option<String>) -> ToolOutput {
    let mut out = ErrorOutput::new(format!("the tool provider {module} could not be reached: {message}"))
        .with_module(module)
        .with_nothing_sent()
        .with_retry("the call was not sent; it may be tried again");
    if cortexkit_role_llm_runner::serializer_profile::error_output::is_valid_code(code) {
        out = out.with_code(code);
    }
    if let Some(d) = detail {
        out = out.with_detail(d);
    }
    error(out, true)
}

/// The daemon's or provider's detail on one line (compact JSON), if it fits the profile.
pub fn one_line_detail(body: &ErrorBody) -> Option<String> {
    let detail = body.detail.as_ref()?;
    let text = serde_json::to_string(detail).ok()?;
    (text.len() <= cortexkit_role_llm_runner::serializer_profile::error_output::DETAIL_MAX).then_some(text)
}

/// A provider call's error result; `refused`: the call never ran (llm-runner's `refused`).
fn error(out: ErrorOutput, refused: bool) -> ToolOutput {
    let output = serde_json::to_value(&out).unwrap_or_else(|_| json!({"kind": "error", "message": out.message}));
    ToolOutput { output, is_error: true, refused: Some(refused) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_body_is_text_and_other_json_stays_json() {
        assert_eq!(answered("m", br#""hi""#).output, ToolOutput::text("hi").output);
        let out = answered("m", br#"{"rows": 3}"#);
        assert_eq!(out.output, json!({"kind": "json", "json": {"rows": 3}}));
    }

    #[test]
    fn an_oversized_body_is_discarded_whole() {
        let limit = cortexkit_role_tool_provider::result::MAX_MODEL_VISIBLE_BYTES;
        let at = serde_json::to_vec(&"x".repeat(limit)).unwrap();
        assert!(!answered("m", &at).is_error, "the limit is inclusive");
        let over = serde_json::to_vec(&"x".repeat(limit + 1)).unwrap();
        let out = answered("m", &over);
        assert!(out.is_error);
        assert_eq!(out.output["code"], TOOL_RESULT_TOO_LARGE);
        let detail: Value = serde_json::from_str(out.output["detail"].as_str().unwrap()).unwrap();
        assert_eq!(detail, json!({"reason": "tool_result_too_large", "bytes": limit + 1, "limit": limit}));
        assert!(!out.output.to_string().contains("xxxx"), "nothing of the output is kept");
    }

    #[test]
    fn refusals_and_unsent_calls_name_their_module() {
        let body = ErrorBody::new("unknown_tool", "no such tool");
        let out = refused("tools", &body);
        assert_eq!(out.refused, Some(true));
        assert_eq!(
            out.output,
            json!({"kind": "error", "message": "no such tool", "module": "tools", "code": "unknown_tool"})
        );
        let out = not_sent("tools", "unknown_module", "no module", None);
        assert_eq!((out.output["nothing_sent"].clone(), out.refused), (json!(true), Some(true)));
        let junk = answered("m", b"not json");
        assert_eq!((junk.is_error, junk.refused), (true, Some(false)), "the provider ran the call");
        assert_eq!(answered("m", br#"{"held": {"reason": "consent"}}"#).output["code"], MALFORMED_HELD_REPLY);
    }
}
