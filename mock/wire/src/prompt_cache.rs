//! A lane's model of provider prompt caching, so a script step `{"usage": {"measured": true}}`
//! reports what a provider would: the request's input tokens, and of them the cache reads (and,
//! on Anthropic, writes) that its prefix really earns. A missing or misplaced breakpoint, a
//! changed prefix or an expired entry shows up as zero cached tokens.
//!
//! Tokens are estimated as a quarter of the canonical JSON bytes of each block (the request
//! without its cache markers), at least one per block. A prefix is identified by a hash chain
//! over the model and its blocks in order, so any byte that changes a block changes every
//! prefix through it.
//!
//! - **Anthropic Messages**: blocks are the tools, the system blocks, then each message's content
//!   blocks (its role included). A request writes the prefix at each `cache_control` breakpoint
//!   (TTL 5 min, or `ttl: "1h"`) when the last breakpoint's prefix reaches
//!   [`MIN_CACHEABLE_TOKENS`]; it reads the longest written prefix found looking back at most
//!   [`ANTHROPIC_LOOKBACK`] blocks from any breakpoint (a read refreshes that entry's TTL).
//!   `cached` is the read prefix's tokens, `cache_write` those from there to the last
//!   breakpoint, `input` the rest.
//! - **Gemini** (implicit caching) is modelled as OpenAI without a key: blocks are the
//!   `systemInstruction`, the tools, then each `contents` item; `cached` is reported as
//!   `cachedContentTokenCount`.
//! - **OpenAI** (Chat and Responses): blocks are the system/instructions, the tools, then each
//!   message or input item. Every request caches its prefixes of [`MIN_CACHEABLE_TOKENS`] or
//!   more under its `prompt_cache_key` (none is a key too) for ten minutes, or 24 hours with
//!   `prompt_cache_retention: "24h"`; `cached` is the longest such prefix seen before, in
//!   128-token steps as OpenAI reports it; there are no write tokens.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use broca::provider::event::Family;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::script::Usage;

/// The shortest prefix a provider caches (Anthropic's Sonnet minimum; OpenAI's).
pub const MIN_CACHEABLE_TOKENS: u64 = 1024;
/// How many blocks before a breakpoint Anthropic checks for an earlier cached prefix.
pub const ANTHROPIC_LOOKBACK: usize = 20;
/// The most prefixes one lane remembers; the oldest expiring go first.
pub const MAX_ENTRIES: usize = 4096;

const FIVE_MINUTES: Duration = Duration::from_secs(300);
const ONE_HOUR: Duration = Duration::from_secs(3600);
const OPENAI_IN_MEMORY: Duration = Duration::from_secs(600);
const OPENAI_EXTENDED: Duration = Duration::from_secs(86_400);

type PrefixId = [u8; 32];

/// One lane's cached prefixes (keyed by the provider's cache key and the prefix's hash), each
/// with when it expires and the lifetime a read renews.
#[derive(Default)]
pub struct PromptCache {
    entries: HashMap<(String, PrefixId), (Instant, Duration)>,
}

/// One block of a request's prefix: its hash chain so far, its tokens so far, and the TTL its
/// marker asks for (Anthropic; `None`: no breakpoint here).
struct Block {
    prefix: PrefixId,
    tokens: u64,
    breakpoint: Option<Duration>,
}

impl PromptCache {
    /// What `body` (a `family` request) reads from and writes to this cache at `now`, with its
    /// input tokens; the cache learns the request's prefixes.
    pub fn measure(&mut self, family: Family, body: &Value, now: Instant) -> Usage {
        self.entries.retain(|_, (expires, _)| *expires > now);
        match family {
            Family::AnthropicMessages => self.breakpoints(anthropic_blocks(body), now),
            Family::AwsBedrockConverse => self.breakpoints(bedrock_blocks(body), now),
            Family::OpenaiChat
            | Family::OpenaiResponses
            | Family::OpenaiChatgptResponses
            | Family::GoogleGenerateContent => self.openai(family, body, now),
            Family::GoogleCodeAssist => self.openai(Family::GoogleGenerateContent, &body["request"], now),
        }
    }

    /// Prefix caching at explicit breakpoints (Anthropic `cache_control`, Bedrock `cachePoint`).
    fn breakpoints(&mut self, blocks: Vec<Block>, now: Instant) -> Usage {
        let total = blocks.last().map_or(0, |b| b.tokens);
        let key = String::new();
        let mut read: Option<usize> = None;
        for (bp, _) in blocks.iter().enumerate().filter(|(_, b)| b.breakpoint.is_some()) {
            let from = bp.saturating_sub(ANTHROPIC_LOOKBACK - 1);
            if let Some(j) = (from..=bp).rev().find(|j| self.entries.contains_key(&(key.clone(), blocks[*j].prefix))) {
                read = Some(read.map_or(j, |r| r.max(j)));
            }
        }
        let cached = read.map_or(0, |j| blocks[j].tokens);
        if let Some(entry) = read.and_then(|j| self.entries.get_mut(&(key.clone(), blocks[j].prefix))) {
            entry.0 = now + entry.1;
        }
        let last = blocks.iter().rposition(|b| b.breakpoint.is_some());
        let mut written = 0;
        if let Some(last) = last.filter(|l| blocks[*l].tokens >= MIN_CACHEABLE_TOKENS) {
            for b in blocks.iter().filter(|b| b.breakpoint.is_some() && b.tokens >= MIN_CACHEABLE_TOKENS) {
                self.remember(&key, b.prefix, now, b.breakpoint.unwrap_or(FIVE_MINUTES));
            }
            written = blocks[last].tokens.saturating_sub(cached);
        }
        Usage {
            input: Some(total - cached - written),
            cached: Some(cached),
            cache_write: Some(written),
            ..Usage::default()
        }
    }

    fn openai(&mut self, family: Family, body: &Value, now: Instant) -> Usage {
        let blocks = openai_blocks(family, body);
        let total = blocks.last().map_or(0, |b| b.tokens);
        let key = body["prompt_cache_key"].as_str().unwrap_or_default().to_string();
        let hit = blocks
            .iter()
            .rev()
            .find(|b| b.tokens >= MIN_CACHEABLE_TOKENS && self.entries.contains_key(&(key.clone(), b.prefix)));
        let cached = hit.map_or(0, |b| b.tokens / 128 * 128);
        let ttl = if body["prompt_cache_retention"] == "24h" { OPENAI_EXTENDED } else { OPENAI_IN_MEMORY };
        for b in blocks.iter().filter(|b| b.tokens >= MIN_CACHEABLE_TOKENS) {
            self.remember(&key, b.prefix, now, ttl);
        }
        Usage { input: Some(total - cached), cached: Some(cached), ..Usage::default() }
    }

    fn remember(&mut self, key: &str, prefix: PrefixId, now: Instant, ttl: Duration) {
        if self.entries.len() >= MAX_ENTRIES {
            if let Some(oldest) = self.entries.iter().min_by_key(|(_, (e, _))| *e).map(|(k, _)| k.clone()) {
                self.entries.remove(&oldest);
            }
        }
        let entry = self.entries.entry((key.to_string(), prefix)).or_insert((now + ttl, ttl));
        if now + ttl >= entry.0 {
            *entry = (now + ttl, ttl);
        }
    }
}

/// The hash chain and token count over `parts` (each a canonical block), started by `model`.
fn chain(model: &Value, parts: Vec<(Value, Option<Duration>)>) -> Vec<Block> {
    let mut prefix: PrefixId = Sha256::digest(model.to_string().as_bytes()).into();
    let mut tokens = 0;
    parts
        .into_iter()
        .map(|(canonical, breakpoint)| {
            let bytes = canonical.to_string();
            tokens += (bytes.len() as u64 / 4).max(1);
            let mut h = Sha256::new();
            h.update(prefix);
            h.update(bytes.as_bytes());
            prefix = h.finalize().into();
            Block { prefix, tokens, breakpoint }
        })
        .collect()
}

/// A block without its marker, and the TTL the marker asked for.
fn unmarked(block: &Value) -> (Value, Option<Duration>) {
    let mut block = block.clone();
    let marker = block.as_object_mut().and_then(|o| o.remove("cache_control"));
    let ttl = marker.map(|m| if m["ttl"] == "1h" { ONE_HOUR } else { FIVE_MINUTES });
    (block, ttl)
}

fn anthropic_blocks(body: &Value) -> Vec<Block> {
    let mut parts = Vec::new();
    for tool in body["tools"].as_array().into_iter().flatten() {
        parts.push(unmarked(tool));
    }
    match &body["system"] {
        Value::String(text) => parts.push((serde_json::json!({"type": "text", "text": text}), None)),
        Value::Array(blocks) => parts.extend(blocks.iter().map(unmarked)),
        _ => {}
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = &message["role"];
        match &message["content"] {
            Value::Array(blocks) => {
                for block in blocks {
                    let (block, ttl) = unmarked(block);
                    parts.push((serde_json::json!([role, block]), ttl));
                }
            }
            other => parts.push((serde_json::json!([role, other]), None)),
        }
    }
    chain(&body["model"], parts)
}

/// Bedrock Converse: blocks are the tool specs, the system blocks, then each message's content
/// blocks (role included); a `cachePoint` block marks a five-minute breakpoint on the block
/// before it.
fn bedrock_blocks(body: &Value) -> Vec<Block> {
    let mut parts: Vec<(Value, Option<Duration>)> = Vec::new();
    let push = |block: &Value, role: Option<&Value>, parts: &mut Vec<(Value, Option<Duration>)>| {
        if block.get("cachePoint").is_some() {
            if let Some(last) = parts.last_mut() {
                last.1 = Some(FIVE_MINUTES);
            }
        } else {
            parts.push((role.map_or_else(|| block.clone(), |r| serde_json::json!([r, block])), None));
        }
    };
    for tool in body.pointer("/toolConfig/tools").and_then(Value::as_array).into_iter().flatten() {
        push(tool, None, &mut parts);
    }
    for block in body["system"].as_array().into_iter().flatten() {
        push(block, None, &mut parts);
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        for block in message["content"].as_array().into_iter().flatten() {
            push(block, Some(&message["role"]), &mut parts);
        }
    }
    chain(&body["modelId"], parts)
}

fn openai_blocks(family: Family, body: &Value) -> Vec<Block> {
    let mut parts = Vec::new();
    if let Some(instructions) = body.get("instructions").or_else(|| body.get("systemInstruction")) {
        parts.push((instructions.clone(), None));
    }
    if let Some(tools) = body.get("tools") {
        parts.push((tools.clone(), None));
    }
    let items = match family {
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => &body["input"],
        Family::GoogleGenerateContent => &body["contents"],
        _ => &body["messages"],
    };
    parts.extend(items.as_array().into_iter().flatten().map(|item| (item.clone(), None)));
    chain(&body["model"], parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn long(text: &str) -> String {
        text.repeat(2000)
    }

    fn anthropic(system: &str, messages: Value, mark: bool) -> Value {
        let mut body = json!({"model": "claude", "system": [{"type": "text", "text": system}], "messages": messages});
        if mark {
            body["system"][0]["cache_control"] = json!({"type": "ephemeral"});
            let n = body["messages"].as_array().unwrap().len();
            body["messages"][n - 1]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
        }
        body
    }

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": text}]})
    }

    #[test]
    fn an_anthropic_prefix_is_written_then_read_and_a_missing_marker_reads_nothing() {
        let mut cache = PromptCache::default();
        let now = Instant::now();
        let system = long("rules ");
        let first = anthropic(&system, json!([user("one")]), true);
        let u1 = cache.measure(Family::AnthropicMessages, &first, now);
        assert_eq!(u1.cached, Some(0));
        assert!(u1.cache_write.unwrap() >= MIN_CACHEABLE_TOKENS, "{u1:?}");
        let second = anthropic(
            &system,
            json!([user("one"), {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, user("two")]),
            true,
        );
        let u2 = cache.measure(Family::AnthropicMessages, &second, now);
        assert_eq!(u2.cached, u1.cache_write, "the whole first prefix is read: {u2:?}");
        let unmarked = anthropic(&system, json!([user("one"), user("three")]), false);
        assert_eq!(PromptCache::default().measure(Family::AnthropicMessages, &unmarked, now).cached, Some(0));
        let u3 = cache.measure(Family::AnthropicMessages, &unmarked, now);
        assert_eq!((u3.cached, u3.cache_write), (Some(0), Some(0)), "no breakpoint: no read, no write");
        let later = cache.measure(Family::AnthropicMessages, &second, now + Duration::from_secs(301 + 300));
        assert_eq!(later.cached, Some(0), "expired after its TTL: {later:?}");
    }

    #[test]
    fn openai_reads_the_longest_prefix_seen_under_the_same_key() {
        let mut cache = PromptCache::default();
        let now = Instant::now();
        let body = |key: &str, n: usize| {
            let input: Vec<Value> = (0..n).map(|i| json!({"role": "user", "content": format!("turn {i}")})).collect();
            json!({"model": "gpt", "instructions": long("rules "), "input": input, "prompt_cache_key": key})
        };
        assert_eq!(cache.measure(Family::OpenaiResponses, &body("a", 1), now).cached, Some(0));
        let hit = cache.measure(Family::OpenaiResponses, &body("a", 2), now);
        assert!(hit.cached.unwrap() >= MIN_CACHEABLE_TOKENS && hit.cached.unwrap() % 128 == 0, "{hit:?}");
        assert_eq!(cache.measure(Family::OpenaiResponses, &body("b", 2), now).cached, Some(0), "another key");
    }
}
