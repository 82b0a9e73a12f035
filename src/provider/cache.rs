//! Prompt caching per family (spec §4 `send.cache`, §4a): where each family marks the prefix a
//! provider may cache, resolved from the run's frozen [`CachePolicy`] when the request renders
//! ([`super::wire::WireFamily::mark_cache`]), and which requests a route cannot honour
//! ([`unsupported`], refused at admission).
//!
//! The rules (decisions listed in the README, "Prompt caching"):
//! - **Anthropic Messages** caches a prefix up to a `cache_control` breakpoint, at most four per
//!   request, and a later request reads it when its own prefix up to a breakpoint (looking back
//!   up to 20 blocks) was written before. broca marks the last tool, the system prompt, and the
//!   last markable block of each of the last two messages: the tail slides with the loop, so
//!   each step reads what the step before it wrote (and the second tail anchor keeps a read
//!   possible when the last one moved past the look-back). Thinking blocks take no marker.
//!   Markers are rendered whether or not the send asked: a loop's next step always rereads
//!   the prefix. TTL: one hour for `ttl: "1h"`, or `role: "primary"` without a ttl; else the
//!   provider's five-minute default (`{"type": "ephemeral"}`).
//! - **OpenAI's own routes** (provider `openai`, Responses and Chat) cache automatically by
//!   prefix; `prompt_cache_key` routes a conversation's requests to the same cache. broca sends
//!   a digest of the frozen conversation key (stable per session, shared by sessions that share
//!   the key; the key itself never leaves), and `prompt_cache_retention: "24h"` for `ttl: "24h"`.
//! - **OpenAI Chat compatibles** (any other provider): nothing is rendered; their endpoints
//!   cache on their own or not at all, and may refuse a member they do not know.
//! - A `ttl` a route cannot honour is refused at admission (`open_failed`, permanent): `24h` off
//!   OpenAI's own routes, `1h` off Anthropic, any ttl on a Chat compatible. `role` is a
//!   preference and is never refused.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::config::RenderConfig;
use super::event::Family;
use crate::frozen::{CachePolicy, CacheTtl};

/// Anthropic's limit of `cache_control` breakpoints per request.
pub const ANTHROPIC_BREAKPOINTS: usize = 4;

/// Why `config`'s route cannot honour `policy` (`None`: it can).
pub fn unsupported(config: &RenderConfig, policy: &CachePolicy) -> Option<String> {
    let openai = config.openai_own_route();
    match (policy.ttl?, config.family) {
        (CacheTtl::OneDay, _) if !openai => {
            Some("cache ttl \"24h\" is served only on OpenAI's own API-key routes".into())
        }
        (CacheTtl::OneHour, family) if family != Family::AnthropicMessages => {
            Some("cache ttl \"1h\" is served only on Anthropic Messages routes".into())
        }
        (_, family) if family != Family::AnthropicMessages && !openai => {
            Some(format!("provider {} caches on its own: a cache ttl cannot be honoured", config.provider))
        }
        _ => None,
    }
}

/// The `cache_control` an Anthropic breakpoint carries under `config`'s policy.
fn anthropic_control(config: &RenderConfig) -> Value {
    match CachePolicy::anthropic_ttl(config.policy.cache.as_ref()) {
        CacheTtl::OneHour => json!({"type": "ephemeral", "ttl": "1h"}),
        CacheTtl::FiveMinutes | CacheTtl::OneDay => json!({"type": "ephemeral"}),
    }
}

/// The breakpoints the transcript's tail takes: the tools and the system prompt take one each.
const ANTHROPIC_TAIL_BREAKPOINTS: usize = ANTHROPIC_BREAKPOINTS - 2;

/// Anthropic: the breakpoints ([`ANTHROPIC_BREAKPOINTS`]) on a rendered Messages body.
pub fn mark_anthropic(config: &RenderConfig, body: &mut Value) {
    let control = anthropic_control(config);
    if let Some(last) = body.get_mut("tools").and_then(Value::as_array_mut).and_then(|t| t.last_mut()) {
        last["cache_control"] = control.clone();
    }
    if let Some(Value::String(system)) = body.get("system") {
        let system = system.clone();
        body["system"] = json!([{"type": "text", "text": system, "cache_control": control.clone()}]);
    }
    if let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) {
        mark_anthropic_tail(config, messages);
    }
}

/// Anthropic: the tail's breakpoints on the last `messages` (the last markable block of each
/// of the last two messages that have one).
pub fn mark_anthropic_tail(config: &RenderConfig, messages: &mut [Value]) {
    let control = anthropic_control(config);
    let tail = messages.iter_mut().rev().filter_map(markable_block).take(ANTHROPIC_TAIL_BREAKPOINTS);
    for block in tail.collect::<Vec<_>>() {
        block["cache_control"] = control.clone();
    }
}

/// How many of the last `messages` [`mark_anthropic_tail`] may mark as the transcript grows:
/// from the second-last that has a markable block (all of them when fewer have one).
pub fn anthropic_marked_tail(messages: &[Value]) -> usize {
    let mut found = 0;
    for (from_end, message) in messages.iter().rev().enumerate() {
        if is_markable(message) {
            found += 1;
            if found == ANTHROPIC_TAIL_BREAKPOINTS {
                return from_end + 1;
            }
        }
    }
    messages.len()
}

/// A message's last block that may carry a marker (thinking blocks may not).
fn markable_block(message: &mut Value) -> Option<&mut Value> {
    let blocks = message.get_mut("content")?.as_array_mut()?;
    blocks.iter_mut().rev().find(|b| !matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
}

/// Whether [`markable_block`] finds a block in `message`.
fn is_markable(message: &Value) -> bool {
    let Some(blocks) = message.get("content").and_then(Value::as_array) else { return false };
    blocks.iter().any(|b| !matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
}

/// OpenAI's own routes: `prompt_cache_key`, and the long retention when asked.
pub fn mark_openai(config: &RenderConfig, body: &mut Value) {
    let Value::Object(top) = body else { return };
    if config.provider != "openai" {
        return;
    }
    if let Some(key) = &config.policy.conversation_key {
        top.insert("prompt_cache_key".into(), Value::String(prompt_cache_key(key)));
    }
    if config.policy.cache.and_then(|c| c.ttl) == Some(CacheTtl::OneDay) {
        top.insert("prompt_cache_retention".into(), Value::String("24h".into()));
    }
}

/// The ChatGPT/Codex backend: `prompt_cache_key` as on OpenAI's own routes (the Codex client
/// sends one per conversation); never `prompt_cache_retention`, which the backend refuses with
/// HTTP 400 (a `24h` request is refused at admission instead).
pub fn mark_chatgpt(config: &RenderConfig, body: &mut Value) {
    let Value::Object(top) = body else { return };
    if let Some(key) = &config.policy.conversation_key {
        top.insert("prompt_cache_key".into(), Value::String(prompt_cache_key(key)));
    }
}

/// `broca-` and the first 32 hex digits of the conversation key's SHA-256.
pub fn prompt_cache_key(conversation_key: &str) -> String {
    let digest = Sha256::digest(conversation_key.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("broca-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frozen::CacheRole;

    fn route(provider: &str, family: Family) -> RenderConfig {
        crate::frozen::test_route(provider, family, "m")
    }

    #[test]
    fn a_named_lifetime_is_honoured_only_where_a_route_renders_one() {
        let policy = |ttl| CachePolicy { role: Some(CacheRole::Primary), ttl: Some(ttl) };
        let cases = [
            ("anthropic", Family::AnthropicMessages, CacheTtl::OneHour, true),
            ("openai", Family::OpenaiResponses, CacheTtl::OneDay, true),
            ("openai", Family::OpenaiChat, CacheTtl::OneDay, true),
            // The ChatGPT backend refuses prompt_cache_retention with HTTP 400.
            ("openai", Family::OpenaiChatgptResponses, CacheTtl::OneDay, false),
            ("openai", Family::OpenaiChatgptResponses, CacheTtl::FiveMinutes, false),
            // Gemini caches implicitly: no lifetime can be asked for.
            ("google", Family::GoogleGenerateContent, CacheTtl::FiveMinutes, false),
            ("openrouter", Family::OpenaiChat, CacheTtl::FiveMinutes, false),
        ];
        for (provider, family, ttl, served) in cases {
            let refused = unsupported(&route(provider, family), &policy(ttl));
            assert_eq!(refused.is_none(), served, "{provider} {family:?} {ttl:?}: {refused:?}");
        }
        assert_eq!(unsupported(&route("google", Family::GoogleGenerateContent), &CachePolicy::default()), None);
    }
}
