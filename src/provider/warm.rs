//! `session.warm`'s provider side (spec §4a): which requests can be warmed, the warm body (the
//! base request changed only so the provider generates nothing), and the provider's answer.
//!
//! Only first-party Anthropic Messages documents a zero-output request: the base body with
//! `max_tokens: 0` and no `stream`. Everything else (system, tools, messages, `cache_control`
//! markers and their TTLs, thinking, effort) keeps its bytes: the body is edited in place
//! (serde_json keeps member order), so the prefix the provider caches is the one the step sent.
//!
//! The answer is Messages' non-streaming JSON: its `usage` (cache reads and writes apart from
//! fresh input) and the raw `anthropic-ratelimit-unified-*` headers, kept verbatim.

use std::collections::BTreeMap;

use serde_json::Value;

use super::config::RenderConfig;
use crate::message::StepUsage;
use crate::record::ProviderError;

/// The response headers a warm keeps (by prefix, lowercase).
pub const RATELIMIT_HEADER_PREFIX: &str = "anthropic-ratelimit-unified-";
/// The most header values kept from one answer (a provider cannot grow the record).
pub const RATELIMIT_HEADERS_MAX: usize = 32;

/// Why a session's request cannot be warmed (`warm_unsupported`'s `detail.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmUnsupported {
    /// Any route but first-party Anthropic Messages.
    Provider,
    /// Bedrock Converse has no documented zero-output request.
    BedrockConverse,
    /// Manual thinking needs `max_tokens` above its budget.
    ManualThinking,
    /// A forced `tool_choice` must produce a call.
    ForcedToolChoice,
    /// A structured output format must produce output.
    StructuredOutput,
}

impl WarmUnsupported {
    pub fn as_str(self) -> &'static str {
        match self {
            WarmUnsupported::Provider => "provider",
            WarmUnsupported::BedrockConverse => "bedrock_converse",
            WarmUnsupported::ManualThinking => "manual_thinking",
            WarmUnsupported::ForcedToolChoice => "forced_tool_choice",
            WarmUnsupported::StructuredOutput => "structured_output",
        }
    }
}

/// A warm to send: the route, the exact warm body, and the credential (memory only).
#[derive(Clone)]
pub struct WarmCall {
    pub config: RenderConfig,
    pub body: Vec<u8>,
    pub bearer: Option<String>,
}

/// What the provider answered a warm with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WarmAnswer {
    pub usage: StepUsage,
    pub ratelimit: BTreeMap<String, String>,
}

/// Why `config`'s request, rendered as the bytes `base`, cannot be warmed; `None` when it can
/// (a body that is not JSON is no request a warm could re-send: `Provider`).
pub fn unsupported_bytes(config: &RenderConfig, base: &[u8]) -> Option<WarmUnsupported> {
    match serde_json::from_slice::<Value>(base) {
        Ok(body) => unsupported(config, &body),
        Err(_) => Some(WarmUnsupported::Provider),
    }
}

/// Why `config`'s request, rendered as `base`, cannot be warmed; `None` when it can.
pub fn unsupported(config: &RenderConfig, base: &Value) -> Option<WarmUnsupported> {
    if config.family == crate::frozen::Family::AwsBedrockConverse {
        return Some(WarmUnsupported::BedrockConverse);
    }
    if !config.first_party_anthropic() {
        return Some(WarmUnsupported::Provider);
    }
    if base.pointer("/thinking/type").and_then(Value::as_str) == Some("enabled") {
        return Some(WarmUnsupported::ManualThinking);
    }
    let forced = base.pointer("/tool_choice/type").and_then(Value::as_str).is_some_and(|t| t == "any" || t == "tool");
    if forced {
        return Some(WarmUnsupported::ForcedToolChoice);
    }
    if base.get("output_format").is_some() || base.pointer("/output_config/format").is_some() {
        return Some(WarmUnsupported::StructuredOutput);
    }
    None
}

/// [`warm_body`] of the request bytes `base`.
pub fn warm_body_bytes(base: &[u8]) -> Option<Vec<u8>> {
    warm_body(&serde_json::from_slice(base).ok()?)
}

/// The warm body of a Messages request: `max_tokens: 0` in its place, `stream` removed, every
/// other member as it was. `None` when `base` is not a JSON object.
pub fn warm_body(base: &Value) -> Option<Vec<u8>> {
    let mut body = base.as_object()?.clone();
    body.insert("max_tokens".into(), Value::from(0u64));
    body.shift_remove("stream");
    serde_json::to_vec(&body).ok()
}

/// Reads a warm's 2xx answer: Messages' JSON `usage`, and the rate-limit headers kept.
pub fn decode_answer(body: &[u8], headers: &[(String, String)]) -> Result<WarmAnswer, ProviderError> {
    let undecodable = |why: String| {
        ProviderError::new(
            crate::record::ErrorClass::Transient,
            Some("undecodable_answer".into()),
            format!("the warm's answer is not a Messages response: {why}"),
            None,
        )
    };
    let answer: Value = serde_json::from_slice(body).map_err(|e| undecodable(e.to_string()))?;
    let usage = answer.get("usage").ok_or_else(|| undecodable("it has no usage".into()))?;
    let ratelimit = headers
        .iter()
        .filter(|(name, _)| name.to_ascii_lowercase().starts_with(RATELIMIT_HEADER_PREFIX))
        .take(RATELIMIT_HEADERS_MAX)
        .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
        .collect();
    Ok(WarmAnswer { usage: super::anthropic::usage(usage), ratelimit })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frozen::Family;
    use serde_json::json;

    fn config(provider: &str, family: Family) -> RenderConfig {
        crate::frozen::test_route(provider, family, "claude-sonnet-4-5")
    }

    #[test]
    fn the_warm_body_changes_only_max_tokens_and_stream() {
        let base = json!({"model": "m", "max_tokens": 4096, "stream": true, "system": [{"type": "text", "text": "s",
            "cache_control": {"type": "ephemeral", "ttl": "1h"}}], "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "adaptive"}});
        let warm = String::from_utf8(warm_body(&base).unwrap()).unwrap();
        assert_eq!(
            warm,
            r#"{"model":"m","max_tokens":0,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"adaptive"}}"#
        );
        assert_eq!(warm_body(&json!([1])), None);
    }

    #[test]
    fn only_first_party_anthropic_without_forced_output_warms() {
        let ok = config("anthropic", Family::AnthropicMessages);
        assert_eq!(unsupported(&ok, &json!({})), None);
        assert_eq!(unsupported(&ok, &json!({"thinking": {"type": "adaptive"}})), None);
        assert_eq!(unsupported(&ok, &json!({"tool_choice": {"type": "auto"}})), None);
        let cases = [
            (config("mock", Family::AnthropicMessages), json!({}), WarmUnsupported::Provider),
            (config("anthropic", Family::OpenaiChat), json!({}), WarmUnsupported::Provider),
            (
                ok.clone(),
                json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
                WarmUnsupported::ManualThinking,
            ),
            (ok.clone(), json!({"tool_choice": {"type": "any"}}), WarmUnsupported::ForcedToolChoice),
            (ok.clone(), json!({"tool_choice": {"type": "tool", "name": "x"}}), WarmUnsupported::ForcedToolChoice),
            (
                ok.clone(),
                json!({"output_config": {"format": {"type": "json_schema"}}}),
                WarmUnsupported::StructuredOutput,
            ),
        ];
        for (config, base, want) in cases {
            assert_eq!(unsupported(&config, &base), Some(want), "{base}");
        }
    }

    #[test]
    fn an_answer_gives_its_usage_and_rate_limit_headers() {
        let body = br#"{"id":"msg_1","type":"message","content":[],"stop_reason":"max_tokens",
            "usage":{"input_tokens":3,"cache_read_input_tokens":2048,"cache_creation_input_tokens":10,"output_tokens":0}}"#;
        let headers = vec![
            ("Anthropic-Ratelimit-Unified-Status".to_string(), "allowed".to_string()),
            ("request-id".to_string(), "req_1".to_string()),
        ];
        let answer = decode_answer(body, &headers).unwrap();
        assert_eq!(answer.usage.cached_input_tokens, Some(2048));
        assert_eq!(answer.usage.cache_write_tokens, Some(10));
        assert_eq!(answer.usage.input_tokens, Some(3));
        assert_eq!(
            answer.ratelimit.into_iter().collect::<Vec<_>>(),
            [("anthropic-ratelimit-unified-status".to_string(), "allowed".to_string())]
        );
        assert!(decode_answer(b"not json", &[]).is_err());
        assert!(decode_answer(b"{}", &[]).is_err());
    }
}
