//! A provider's answer as the call's result (llm-runner 0.8.0 §8.3, §8.5; tool-provider §7):
//! a bare legacy body becomes the model's text (a JSON string) or JSON (anything else); a body
//! over the 65,536-byte model-visible limit is discarded whole for a `tool_result_too_large`
//! error; refusals and delivery failures become `owned-broca` error outputs naming the module.

use cortexkit_role_llm_runner::serializer_profile::error_output::{self, ErrorOutput};
use cortexkit_role_llm_runner::tool_result_limit::{self, OUTPUT_DISCARDED};
use cortexkit_role_tool_provider::result::{ContentPart, ToolResult};
use serde_json::{json, Value};
use subc_protocol::ErrorBody;

use crate::agent::ToolOutput;
use crate::message::{ContentOutput, OutputPart};

/// The code of the result that replaces an oversized one.
pub use cortexkit_role_llm_runner::errors::tool_result_reasons::TOOL_RESULT_TOO_LARGE;
/// The code of a held reply on a route that never declared `held-reply/v1`.
pub const MALFORMED_HELD_REPLY: &str = "malformed_provider_held_reply";
/// The code of an answer that is not JSON.
pub const INVALID_ANSWER: &str = "invalid_answer";

/// How a call's answer is read, as its route and its tool's frozen catalog negotiated it
/// (tool-provider §7.1, §8.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Terms {
    /// The route declared `tool-result/v1` and the tool opted in: a `tool-result/v1` body.
    pub tool_result_v1: bool,
    /// Every held-reply prerequisite holds (both capabilities on the bind, the tool's format,
    /// a `call_key` on the call, the provider's `late_results`): the provider may hold it.
    pub may_hold: bool,
}

/// A provider's first answer to a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Answered {
    /// The call's result.
    Result(ToolOutput),
    /// The provider holds the call; its result arrives as a late result. The interim content is
    /// never shown to the model.
    Held { reason: String },
}

/// The first answer of a call its provider answered with `body`, under `terms`.
pub fn first_answer(module: &str, body: &[u8], terms: Terms) -> Answered {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Answered::Result(not_json(module, body.len()));
    };
    if let Some(held) = value.get("held") {
        let decoded = terms.may_hold.then(|| serde_json::from_value::<ToolResult>(value.clone()).ok()).flatten();
        return match decoded.as_ref().and_then(|r| r.held().map(|h| (r, h))) {
            Some((r, h)) if h.validate().is_ok() && r.is_error != Some(true) => {
                Answered::Held { reason: h.reason.clone() }
            }
            _ => {
                let _ = held;
                let message = format!("the tool provider {module} held the call on terms that do not allow it");
                Answered::Result(error(
                    ErrorOutput::new(message).with_module(module).with_code(MALFORMED_HELD_REPLY),
                    false,
                ))
            }
        };
    }
    Answered::Result(result_value(module, value, terms.tool_result_v1))
}

/// The result of a call its provider answered with `body` (a legacy body, no held reply).
pub fn answered(module: &str, body: &[u8]) -> ToolOutput {
    match first_answer(module, body, Terms::default()) {
        Answered::Result(out) => out,
        Answered::Held { .. } => unreachable!("no held reply without may_hold"),
    }
}

/// A late result's `result` payload (spec §19): read by the same rules as a first answer.
pub fn late_result(module: &str, value: Value, tool_result_v1: bool) -> ToolOutput {
    if value.get("held").is_some() {
        let message = format!("the tool provider {module} sent a held body as a late result");
        return error(ErrorOutput::new(message).with_module(module).with_code(MALFORMED_HELD_REPLY), false);
    }
    result_value(module, value, tool_result_v1)
}

/// The text of the result of a held call whose provider reports it never started.
pub fn never_started_text(reason: &str) -> String {
    format!("The tool call never ran: its provider reports it was not started ({reason}). Nothing was executed.")
}

/// The text of the result of a held call whose late answer expired at its provider.
pub const EXPIRED_TEXT: &str = "The tool's late answer expired at its provider before broca collected it; whether and how the call ran is unknown. It must not be repeated just to see the answer.";

/// The result of a held call its provider reports never started: an error result, `refused`.
pub fn never_started(module: &str, reason: &str) -> ToolOutput {
    error(ErrorOutput::new(never_started_text(reason)).with_module(module).with_code("not_started"), true)
}

/// The result of a held call whose late answer expired.
pub fn expired(module: &str) -> ToolOutput {
    error(ErrorOutput::new(EXPIRED_TEXT).with_module(module).with_code("expired"), false)
}

fn not_json(module: &str, bytes: usize) -> ToolOutput {
    let message = format!("the tool provider {module} answered something that is not JSON ({bytes} bytes)");
    error(ErrorOutput::new(message).with_module(module).with_code(INVALID_ANSWER), false)
}

/// A completed answer's value, by the negotiated format.
fn result_value(module: &str, value: Value, tool_result_v1: bool) -> ToolOutput {
    if tool_result_v1 {
        return match serde_json::from_value::<ToolResult>(value) {
            Ok(result) => tool_result(module, result),
            Err(e) => {
                let message = format!("the tool provider {module} answered a malformed tool-result/v1 body: {e}");
                error(ErrorOutput::new(message).with_module(module).with_code(INVALID_ANSWER), false)
            }
        };
    }
    legacy(module, value)
}

/// A `tool-result/v1` body, measured (an oversized one is discarded whole), then validated on
/// receipt (`result::validate`: image data, types, dimensions, error code coupling, the 3 MiB
/// reply bound): its content parts in order. A
/// result with images is stored with them ([`ContentOutput`]: each family renders them where
/// its provider takes an image in a tool result, else as a one-line note); one without is the
/// model's text. Unknown parts are one-line notes; `isError` an error result with its code.
fn tool_result(module: &str, result: ToolResult) -> ToolOutput {
    let bytes = cortexkit_role_tool_provider::result::model_visible_bytes(&result);
    if bytes > tool_result_limit::MAX_MODEL_VISIBLE_BYTES {
        // Discarded whole, never shortened (llm-runner §11.3.1), with the same detail a legacy
        // body's size error carries.
        let detail = serde_json::to_string(&tool_result_limit::SizeError::new(bytes)).unwrap_or_default();
        return error(
            ErrorOutput::new(OUTPUT_DISCARDED).with_module(module).with_code(TOOL_RESULT_TOO_LARGE).with_detail(detail),
            false,
        );
    }
    if let Err(problem) = cortexkit_role_tool_provider::result::validate(&result) {
        let message = format!("the tool provider {module} answered a malformed tool-result/v1 body: {problem}");
        return error(ErrorOutput::new(message).with_module(module).with_code(INVALID_ANSWER), false);
    }
    let parts: Vec<OutputPart> = result
        .content
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => OutputPart::Text { text: text.clone() },
            ContentPart::Image(image) => OutputPart::Image {
                media_type: image.mime_type.clone(),
                data: image.data.clone(),
                width: image.width,
                height: image.height,
                alt: image.alt.clone(),
            },
            other => OutputPart::Text {
                text: format!("[unsupported content: {}]", serde_json::to_string(other).unwrap_or_default()),
            },
        })
        .collect();
    let content = ContentOutput { content: parts };
    if result.is_error == Some(true) {
        // An error result is the profile's error output: text, its images as notes.
        let mut out = ErrorOutput::new(content.text()).with_module(module);
        if let Some(code) = result.error_code.filter(|c| error_output::is_valid_code(c)) {
            out = out.with_code(code);
        }
        return error(out, false);
    }
    let has_image = content.content.iter().any(|p| matches!(p, OutputPart::Image { .. }));
    let output = if has_image { content.to_value() } else { json!({"kind": "text", "text": content.text()}) };
    ToolOutput { output, is_error: false, refused: Some(false) }
}

/// A legacy body: a JSON string is the model's text, anything else JSON.
fn legacy(module: &str, value: Value) -> ToolOutput {
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

    /// The 1x1 PNG the conformance suite's media cases use.
    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+ip1sAAAAASUVORK5CYII=";

    fn v1(body: Value) -> ToolOutput {
        match first_answer("m", &serde_json::to_vec(&body).unwrap(), Terms { tool_result_v1: true, may_hold: false }) {
            Answered::Result(out) => out,
            Answered::Held { .. } => unreachable!(),
        }
    }

    #[test]
    fn an_image_result_is_stored_with_its_bytes_in_order() {
        let image =
            json!({"type": "image", "mimeType": "image/png", "data": PNG, "width": 1, "height": 1, "alt": "dot"});
        let out = v1(json!({"content": [{"type": "text", "text": "before"}, image, {"type": "chart", "n": 1}]}));
        assert!(!out.is_error);
        assert_eq!(
            out.output,
            json!({"kind": "content", "content": [
                {"type": "text", "text": "before"},
                {"type": "image", "media_type": "image/png", "data": PNG, "width": 1, "height": 1, "alt": "dot"},
                {"type": "text", "text": "[unsupported content: {\"type\":\"chart\",\"n\":1}]"},
            ]})
        );
        // Shown as text (display, families without images in tool results) exactly as before.
        let shown = crate::message::tool_result_content(&out.output);
        assert_eq!(
            shown,
            "before\n[image not shown: mime=image/png 1x1]\n[unsupported content: {\"type\":\"chart\",\"n\":1}]"
        );
        // A result without images keeps its text shape.
        assert_eq!(
            v1(json!({"content": [{"type": "text", "text": "hi"}]})).output,
            json!({"kind": "text", "text": "hi"})
        );
    }

    #[test]
    fn a_malformed_image_is_refused_on_receipt_and_nothing_of_it_is_kept() {
        for bad in [
            json!({"type": "image", "mimeType": "image/png", "data": "data:AAAA", "width": 1, "height": 1}),
            json!({"type": "image", "mimeType": "image/png", "data": "A", "width": 1, "height": 1}),
            json!({"type": "image", "mimeType": "image/tiff", "data": PNG, "width": 1, "height": 1}),
            json!({"type": "image", "mimeType": "image/png", "data": PNG, "width": 0, "height": 1}),
        ] {
            let out = v1(json!({"content": [bad]}));
            assert!(out.is_error, "{out:?}");
            assert_eq!(out.output["code"], INVALID_ANSWER);
            assert!(!out.output.to_string().contains("iVBOR"), "{out:?}");
        }
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
