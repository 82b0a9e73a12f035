//! The render cache gives a whole render's bytes in every family, over transcripts that
//! exercise what ties one message's render to others: tool calls and their results (Gemini
//! names a result by its call), consecutive messages of one role (Converse merges them), the
//! tail's cache marks (Anthropic, Converse), images, reasoning (signed, redacted, unsigned,
//! another provider's), messages that render to nothing, a result before its call, a call id
//! reused under another name.

use serde_json::{json, Value};

use super::config::RenderConfig;
use super::event::Family;
use super::render_cache::RenderCache;
use super::render_request;
use super::tests::{config, stat_tool};
use crate::frozen::{CachePolicy, CacheRole, CacheTtl};
use crate::message::{Message, Part, Role};

fn msg(role: Role, content: Vec<Part>) -> Message {
    Message { role, content, origin: None, delivered_as: None, sender: None, client_message_id: None }
}

fn call(id: &str, name: &str, input: Value) -> Part {
    Part::ToolCall { tool_call_id: id.into(), tool_name: name.into(), input }
}

fn result(id: &str, output: Value, is_error: bool) -> Part {
    Part::ToolResult { tool_call_id: id.into(), output, is_error }
}

fn text(t: &str) -> Part {
    Part::Text { text: t.into() }
}

fn image() -> Part {
    Part::Image { media_type: "image/png".into(), data: "iVBORw0KGgo=".into() }
}

/// Messages of every kind the families treat apart, in an order a session could hold them.
fn pool() -> Vec<Message> {
    let shot = json!({"kind": "content", "content": [
        {"type": "text", "text": "a shot"},
        {"type": "image", "media_type": "image/png", "data": "AAAA", "width": 2, "height": 3},
    ]});
    let mut foreign = msg(
        Role::Assistant,
        vec![
            Part::Reasoning { text: "other provider's".into(), signature: Some("c2lnLW90aGVy".into()) },
            text("From elsewhere."),
        ],
    );
    foreign.origin = Some(json!({"provider": "somewhere-else"}));
    vec![
        Message::user_text("How big are the logs?"),
        msg(Role::User, vec![text("And this picture:"), image()]),
        msg(Role::System, vec![text("Steer: be terse.")]),
        msg(
            Role::Assistant,
            vec![
                Part::Reasoning { text: "Stat them.".into(), signature: Some("EqQBbW9ja1NpZw==".into()) },
                text("Checking."),
                call("call_1", "stat_file", json!({"path": "build.log"})),
                call("gemini:g-2", "read_file", json!("not an object")),
            ],
        ),
        msg(
            Role::Tool,
            vec![
                result("call_1", json!({"kind": "text", "text": "4096 bytes"}), false),
                result("gemini:g-2", json!({"kind": "error", "message": "no such file", "code": "not_found"}), true),
            ],
        ),
        Message::user_text("(steered while the tools ran)"),
        msg(
            Role::Assistant,
            vec![Part::Reasoning { text: "only thinking".into(), signature: Some("dGhpbmtpbmc=".into()) }],
        ),
        msg(
            Role::Assistant,
            vec![
                Part::Reasoning { text: "summary".into(), signature: None },
                Part::RedactedReasoning { data: "EmwKbW9ja1JlZGFjdGVk".into() },
                text("Looking at the screen."),
                call("call_3", "screenshot", json!({})),
            ],
        ),
        msg(Role::Tool, vec![result("call_3", shot, false)]),
        foreign,
        msg(Role::User, vec![text("")]),
        msg(Role::Assistant, vec![]),
        // A result before its call, and a call id reused under another name.
        msg(Role::Tool, vec![result("late", json!({"kind": "text", "text": "early"}), false)]),
        msg(Role::Assistant, vec![call("late", "stat_file", json!({"path": "x"}))]),
        msg(Role::Assistant, vec![call("call_1", "renamed", json!({}))]),
        msg(Role::Tool, vec![result("call_1", json!("plain string output"), false)]),
        msg(Role::Assistant, vec![text("Done: 4 KiB.")]),
    ]
}

/// Routes of every family, with the options that change what a message renders to or where
/// the marks go.
fn configs() -> Vec<(String, RenderConfig)> {
    let mut out = Vec::new();
    let routes = [
        (Family::AnthropicMessages, "anthropic", "claude-sonnet-4-5"),
        (Family::OpenaiChat, "openai", "o4-mini"),
        (Family::OpenaiResponses, "openai", "gpt-5"),
        (Family::OpenaiChatgptResponses, "openai", "gpt-5"),
        (Family::GoogleGenerateContent, "google", "gemini-2.5-flash"),
        (Family::GoogleCodeAssist, "google", "gemini-3.8-flash-high"),
        (Family::AwsBedrockConverse, "amazon-bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
        (Family::AwsBedrockConverse, "amazon-bedrock", "amazon.nova-pro-v1:0"),
        (Family::AwsBedrockConverse, "amazon-bedrock", "meta.llama3-70b-instruct-v1:0"),
    ];
    for (family, provider, model) in routes {
        let name = |case: &str| format!("{} {model} {case}", family.as_str());
        let plain = config(family, provider, model);
        let mut tools = plain.clone();
        tools.tools = vec![stat_tool()];
        tools.max_output_tokens = Some(2048);
        tools.policy.cache = Some(CachePolicy { role: Some(CacheRole::Primary), ttl: None });
        tools.policy.conversation_key = Some("project-42/session-7".into());
        let mut bare = plain.clone();
        bare.system = None;
        bare.variant_params = json!({"some_member": true});
        if family == Family::AnthropicMessages {
            bare.policy.cache = Some(CachePolicy { role: None, ttl: Some(CacheTtl::OneHour) });
        }
        out.extend([(name("plain"), plain), (name("tools"), tools), (name("bare"), bare)]);
    }
    out
}

/// A deterministic sequence of pool indices (a linear congruential generator).
fn shuffled(seed: u64, len: usize, pool: usize) -> Vec<usize> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % pool as u64) as usize
        })
        .collect()
}

/// Transcripts: the pool in order, and mixes of it with repeats.
fn transcripts() -> Vec<Vec<Message>> {
    let pool = pool();
    let mut out = vec![pool.clone()];
    for seed in 0..12 {
        out.push(shuffled(seed, 24, pool.len()).into_iter().map(|i| pool[i].clone()).collect());
    }
    out
}

#[test]
fn the_loops_render_gives_a_whole_renders_bytes_in_every_family() {
    for (name, config) in configs() {
        for (t, transcript) in transcripts().iter().enumerate() {
            // One message a step, and steps of a few messages (a tool result, a steer, ...).
            for stride in [1, 3] {
                let mut cache = RenderCache::default();
                let mut n = 0;
                while n < transcript.len() {
                    n = (n + stride).min(transcript.len());
                    let want = render_request(&config, &transcript[..n]);
                    let got = cache.render_appended(&config, &transcript[..n]);
                    assert_eq!(
                        String::from_utf8_lossy(&got),
                        String::from_utf8_lossy(&want),
                        "{name}, transcript {t}, {n} messages by {stride}"
                    );
                    assert_eq!(cache.cached(), n, "{name}: every message is cached");
                }
            }
        }
    }
}

#[test]
fn the_cache_keeps_only_the_tail_open() {
    // A session alternating as a loop's does: a bounded number of elements stays open, so a
    // step renders what is new and the tail, not the session.
    let pool = pool();
    let step = [pool[3].clone(), pool[4].clone()];
    for (name, config) in configs() {
        let mut transcript = vec![pool[0].clone()];
        let mut cache = RenderCache::default();
        for _ in 0..50 {
            transcript.extend(step.iter().cloned());
            cache.render_appended(&config, &transcript);
            assert!(cache.open() <= 2, "{name}: {} elements open", cache.open());
        }
        assert_eq!(cache.render_appended(&config, &transcript), render_request(&config, &transcript), "{name}");
    }
}

#[test]
fn an_edited_transcript_or_another_config_renders_afresh() {
    let configs = configs();
    for (name, config) in &configs {
        for transcript in transcripts().iter().take(4) {
            let mut cache = RenderCache::default();
            for n in 0..=transcript.len() {
                assert_eq!(cache.render(config, &transcript[..n]), render_request(config, &transcript[..n]), "{name}");
            }
            let mut edited = transcript.clone();
            edited[2] = Message::user_text("Something else entirely.");
            assert_eq!(cache.render(config, &edited), render_request(config, &edited), "{name}, edited");
            let shorter = &edited[..edited.len() / 2];
            assert_eq!(cache.render(config, shorter), render_request(config, shorter), "{name}, shorter");
            let (_, other) = configs.iter().find(|(_, c)| c.family == config.family && c != config).unwrap();
            assert_eq!(cache.render(other, shorter), render_request(other, shorter), "{name}, another config");
            assert_eq!(cache.render_appended(other, &edited), render_request(other, &edited), "{name}, appended");
        }
    }
}

#[test]
fn a_variant_that_replaces_the_transcript_is_rendered_whole() {
    // The placeholder is then not in the body: the whole render's bytes, not a splice.
    let mut config = config(Family::GoogleGenerateContent, "google", "gemini-2.5-flash");
    config.variant_params = json!({"contents": []});
    let transcript = pool();
    let mut cache = RenderCache::default();
    for n in 0..=transcript.len() {
        assert_eq!(cache.render_appended(&config, &transcript[..n]), render_request(&config, &transcript[..n]));
    }
}
