//! The wire-family seam: everything that differs between provider wire families sits behind
//! one trait. A new family is a [`Family`] variant, one implementation (its module: rendering,
//! its stream decoder, its quirks) with its arm in [`wire`], and broca-mock's renderer plus its
//! goldens (`testdata/golden/request.*`, `parse.*`).

use serde_json::{json, Value};

use super::common::merge_variant;
use super::config::RenderConfig;
use super::event::{Family, StreamDecoder};
use super::render_context::RenderContext;
use super::sse::{Framer, SseFramer};
use super::{anthropic, bedrock, cache, errors, gemini, openai_chat, openai_responses};
use crate::message::Message;
use crate::record::ProviderError;

/// What a variant name means, before it is rendered for a family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    Effort(String),
    ToggleOff,
    ToggleOn,
    Budget(u64),
}

/// One provider wire family.
pub trait WireFamily: Sync {
    fn family(&self) -> Family;

    /// The request path under the route's base URL (`wire.api`); a family whose path names the
    /// model gives its shape here and the whole URL in [`WireFamily::url`].
    fn path(&self) -> &'static str;

    /// The request URL for `config`'s route.
    fn url(&self, config: &RenderConfig) -> String {
        format!("{}{}", config.base_url, self.path())
    }

    /// The header naming the credential's account, for a backend that routes by it.
    fn account_header(&self) -> Option<&'static str> {
        None
    }

    /// Headers the family's requests carry besides content negotiation and authorization.
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The request body as JSON, before the variant's members and the cache marks: the
    /// transcript's elements ([`WireFamily::render_message`] under the whole transcript's
    /// context, merged by [`WireFamily::merge_element`]) in [`WireFamily::body_around`]. The
    /// render cache ([`super::render_cache`]) renders from the same pieces.
    fn body(&self, config: &RenderConfig, transcript: &[Message]) -> Value {
        let context = RenderContext::of(transcript);
        let mut elements = Vec::new();
        for m in transcript {
            for element in self.render_message(config, &context, m) {
                push_element(self, &mut elements, element);
            }
        }
        self.body_around(config, &context, elements)
    }

    /// One message's elements of the request's transcript array (none, one, or several), given
    /// what `context` gathered from the whole transcript.
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value>;

    /// The body around rendered elements: `body(config, t)` is `body_around(config,
    /// context of t, elements of t)`. It may read `context.called()`, nothing else of it.
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value;

    /// Merges `next` into the element before it, where the family merges neighbours (`None`:
    /// merged); by default elements stand apart (`Some(next)`). A family that merges keeps its
    /// last element open ([`WireFamily::open_tail`] ≥ 1).
    fn merge_element(&self, _last: &mut Value, next: Value) -> Option<Value> {
        Some(next)
    }

    /// How many of the last rendered elements a later message or [`WireFamily::mark_tail`] may
    /// still change (by default none).
    fn open_tail(&self, _elements: &[Value]) -> usize {
        0
    }

    /// Marks the prompt cache on the transcript's last elements (at least the
    /// [`WireFamily::open_tail`] ones), as [`WireFamily::mark_cache`] marks them in a whole
    /// body. Default: nothing.
    fn mark_tail(&self, _config: &RenderConfig, _tail: &mut [Value]) {}

    /// Marks the prompt cache on a rendered body, from the run's frozen cache policy (spec §4
    /// `send.cache`; [`super::cache`]): the body's own members, then the transcript's tail
    /// ([`WireFamily::mark_tail`]). Default: nothing (a family without prompt caching).
    fn mark_cache(&self, _config: &RenderConfig, _body: &mut Value) {}

    /// The request body's bytes: [`WireFamily::body`], the variant's members merged on top,
    /// then [`WireFamily::mark_cache`]. Deterministic (same config and transcript, same bytes).
    fn render(&self, config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
        self.finish(config, self.body(config, transcript))
    }

    /// Merges the variant's members into a body (default: at its top level, replacing).
    fn merge_variant(&self, body: &mut Value, config: &RenderConfig) {
        merge_variant(body, config);
    }

    /// Finishes a body: the variant's members, the cache marks, compact bytes.
    fn finish(&self, config: &RenderConfig, mut body: Value) -> Vec<u8> {
        self.merge_variant(&mut body, config);
        self.mark_cache(config, &mut body);
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// A fresh decoder for one response stream.
    fn decoder(&self) -> Box<dyn StreamDecoder>;

    /// A fresh framing for one response stream (SSE by default).
    fn framer(&self) -> Box<dyn Framer> {
        Box::new(SseFramer::new())
    }

    /// The `accept` a streamed request sends.
    fn accept(&self) -> &'static str {
        "text/event-stream"
    }

    /// A non-2xx answer, classified (transient, permanent, auth, context overflow).
    fn classify_error(&self, status: u16, body: &[u8]) -> ProviderError {
        errors::classify_http_error(self.family(), status, body)
    }

    /// The request members a variant's setting renders to (`Value::Null`: nothing).
    fn render_variant(&self, setting: &Setting, wire_model: &str) -> Value;

    /// Whether the family maps a thinking on/off toggle (so `none` is a variant).
    fn has_toggle_mapping(&self) -> bool {
        false
    }
}

/// The implementation of `family`.
pub fn wire(family: Family) -> &'static dyn WireFamily {
    match family {
        Family::AnthropicMessages => &AnthropicMessages,
        Family::OpenaiChat => &OpenaiChat,
        Family::OpenaiResponses => &OpenaiResponses,
        Family::GoogleGenerateContent => &GoogleGenerateContent,
        Family::OpenaiChatgptResponses => &OpenaiChatgptResponses,
        Family::AwsBedrockConverse => &AwsBedrockConverse,
        Family::GoogleCodeAssist => &GoogleCodeAssist,
    }
}

struct AnthropicMessages;

/// Adaptive thinking and `output_config.effort` arrived with Claude 4.6.
fn claude_at_least_4_6(model: &str) -> bool {
    let digits: Vec<u32> = model
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty() && s.len() <= 2)
        .filter_map(|s| s.parse().ok())
        .collect();
    model.starts_with("claude") && matches!(digits.as_slice(), [major, minor, ..] if (*major, *minor) >= (4, 6))
}

impl WireFamily for AnthropicMessages {
    fn family(&self) -> Family {
        Family::AnthropicMessages
    }
    fn path(&self) -> &'static str {
        "/messages"
    }
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("anthropic-version", "2023-06-01")]
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        anthropic::render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        anthropic::body_around(config, context, elements)
    }
    fn mark_cache(&self, config: &RenderConfig, body: &mut Value) {
        cache::mark_anthropic(config, body);
    }
    /// Open: the elements from the second-last that takes a mark on (the tail's breakpoints).
    fn open_tail(&self, elements: &[Value]) -> usize {
        cache::anthropic_marked_tail(elements)
    }
    fn mark_tail(&self, config: &RenderConfig, tail: &mut [Value]) {
        cache::mark_anthropic_tail(config, tail);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(anthropic::AnthropicDecoder::new())
    }
    fn render_variant(&self, setting: &Setting, wire_model: &str) -> Value {
        match setting {
            Setting::Effort(e) if claude_at_least_4_6(wire_model) => {
                json!({"output_config": {"effort": e}, "thinking": {"type": "adaptive", "display": "summarized"}})
            }
            Setting::Effort(e) => json!({"output_config": {"effort": e}}),
            Setting::ToggleOff => json!({"thinking": {"type": "disabled"}}),
            Setting::ToggleOn => json!({"thinking": {"type": "adaptive", "display": "summarized"}}),
            Setting::Budget(n) => json!({"thinking": {"type": "enabled", "budget_tokens": n}}),
        }
    }
    fn has_toggle_mapping(&self) -> bool {
        true
    }
}

struct OpenaiChat;

impl WireFamily for OpenaiChat {
    fn family(&self) -> Family {
        Family::OpenaiChat
    }
    fn path(&self) -> &'static str {
        "/chat/completions"
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        openai_chat::render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        openai_chat::body_around(config, context, elements)
    }
    fn mark_cache(&self, config: &RenderConfig, body: &mut Value) {
        cache::mark_openai(config, body);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(openai_chat::ChatDecoder::new())
    }
    fn render_variant(&self, setting: &Setting, _wire_model: &str) -> Value {
        match setting {
            Setting::Effort(e) => json!({"reasoning_effort": e}),
            _ => Value::Null,
        }
    }
}

struct OpenaiResponses;

fn responses_variant(setting: &Setting) -> Value {
    match setting {
        Setting::Effort(e) => {
            json!({"reasoning": {"effort": e, "summary": "auto"}, "include": ["reasoning.encrypted_content"]})
        }
        _ => Value::Null,
    }
}

/// The ChatGPT/Codex backend: Responses as the Codex client speaks it to a ChatGPT
/// subscription (`openai_responses::chatgpt_body`).
struct OpenaiChatgptResponses;

impl WireFamily for OpenaiChatgptResponses {
    fn family(&self) -> Family {
        Family::OpenaiChatgptResponses
    }
    fn path(&self) -> &'static str {
        "/responses"
    }
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("openai-beta", "responses=experimental"), ("originator", "codex_cli_rs")]
    }
    fn account_header(&self) -> Option<&'static str> {
        Some("chatgpt-account-id")
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        openai_responses::chatgpt_render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        openai_responses::chatgpt_body_around(config, context, elements)
    }
    fn mark_cache(&self, config: &RenderConfig, body: &mut Value) {
        cache::mark_chatgpt(config, body);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(openai_responses::ResponsesDecoder::new())
    }
    fn render_variant(&self, setting: &Setting, _wire_model: &str) -> Value {
        responses_variant(setting)
    }
}

impl WireFamily for OpenaiResponses {
    fn family(&self) -> Family {
        Family::OpenaiResponses
    }
    fn path(&self) -> &'static str {
        "/responses"
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        openai_responses::render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        openai_responses::body_around(config, context, elements)
    }
    fn mark_cache(&self, config: &RenderConfig, body: &mut Value) {
        cache::mark_openai(config, body);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(openai_responses::ResponsesDecoder::new())
    }
    fn render_variant(&self, setting: &Setting, _wire_model: &str) -> Value {
        responses_variant(setting)
    }
}

struct GoogleGenerateContent;

impl WireFamily for GoogleGenerateContent {
    fn family(&self) -> Family {
        Family::GoogleGenerateContent
    }
    /// The path's shape: `/models/<model>` then this (`gemini::path`).
    fn path(&self) -> &'static str {
        ":streamGenerateContent"
    }
    fn url(&self, config: &RenderConfig) -> String {
        format!("{}{}", config.base_url, gemini::path(&config.wire_model))
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        gemini::render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        gemini::body_around(config, context, elements)
    }
    fn merge_variant(&self, body: &mut Value, config: &RenderConfig) {
        gemini::merge_variant(body, config);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(gemini::GeminiDecoder::new())
    }
    fn render_variant(&self, setting: &Setting, _wire_model: &str) -> Value {
        let thinking = match setting {
            Setting::Effort(e) => json!({"includeThoughts": true, "thinkingLevel": e}),
            Setting::ToggleOff => json!({"includeThoughts": false, "thinkingBudget": 0}),
            Setting::ToggleOn => json!({"includeThoughts": true, "thinkingBudget": -1}),
            Setting::Budget(n) => json!({"includeThoughts": true, "thinkingBudget": n}),
        };
        json!({"generationConfig": {"thinkingConfig": thinking}})
    }
    fn has_toggle_mapping(&self) -> bool {
        true
    }
}

struct AwsBedrockConverse;

impl WireFamily for AwsBedrockConverse {
    fn family(&self) -> Family {
        Family::AwsBedrockConverse
    }
    /// The path's shape: `/model/<model>` then this (`bedrock::path`).
    fn path(&self) -> &'static str {
        "/converse-stream"
    }
    fn url(&self, config: &RenderConfig) -> String {
        format!("{}{}", config.base_url, bedrock::path(&config.wire_model))
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        bedrock::render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        bedrock::body_around(config, context, elements)
    }
    fn mark_cache(&self, config: &RenderConfig, body: &mut Value) {
        bedrock::mark_cache(config, body);
    }
    /// Consecutive messages of one role are one turn.
    fn merge_element(&self, last: &mut Value, next: Value) -> Option<Value> {
        bedrock::merge_turn(last, next)
    }
    /// Open: the last turn (the next message may merge into it; it takes the cache point).
    fn open_tail(&self, elements: &[Value]) -> usize {
        elements.len().min(1)
    }
    fn mark_tail(&self, config: &RenderConfig, tail: &mut [Value]) {
        bedrock::mark_tail(config, tail);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(bedrock::BedrockDecoder::new())
    }
    fn framer(&self) -> Box<dyn Framer> {
        Box::new(super::eventstream::EventStreamFramer::new())
    }
    fn accept(&self) -> &'static str {
        "application/vnd.amazon.eventstream"
    }
    /// Claude on Bedrock thinks through `additionalModelRequestFields` (the model's own
    /// Messages members, passed through): a budget → `thinking: {type: enabled, budget_tokens}`,
    /// the toggle → `thinking: {type: disabled}` / adaptive. Other models render nothing (the
    /// spec's table row for Converse).
    fn render_variant(&self, setting: &Setting, wire_model: &str) -> Value {
        if !wire_model.contains("anthropic.claude") {
            return Value::Null;
        }
        let thinking = match setting {
            Setting::Budget(n) => json!({"type": "enabled", "budget_tokens": n}),
            Setting::ToggleOff => json!({"type": "disabled"}),
            Setting::ToggleOn => json!({"type": "adaptive"}),
            Setting::Effort(_) => return Value::Null,
        };
        json!({"additionalModelRequestFields": {"thinking": thinking}})
    }
}

/// Google Code Assist: Gemini in Code Assist's envelope, to the backend an Antigravity
/// credential selects; its OAuth token as `Authorization: Bearer`.
struct GoogleCodeAssist;

impl WireFamily for GoogleCodeAssist {
    fn family(&self) -> Family {
        Family::GoogleCodeAssist
    }
    fn path(&self) -> &'static str {
        gemini::CODE_ASSIST_PATH
    }
    /// The Antigravity client's identity, which the backend checks (`code_assist::CLIENT_HEADERS`).
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        super::code_assist::CLIENT_HEADERS
    }
    fn render_message(&self, config: &RenderConfig, context: &RenderContext, message: &Message) -> Vec<Value> {
        gemini::render_message(config, context, message)
    }
    fn body_around(&self, config: &RenderConfig, context: &RenderContext, elements: Vec<Value>) -> Value {
        gemini::code_assist_body_around(config, context, elements)
    }
    fn merge_variant(&self, body: &mut Value, config: &RenderConfig) {
        gemini::code_assist_merge_variant(body, config);
    }
    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(gemini::CodeAssistDecoder::default())
    }
    /// A level selects a backend tier at admission (`crate::catalog::tiers`), which also
    /// freezes its thinking settings; nothing is rendered per setting here.
    fn render_variant(&self, _setting: &Setting, _wire_model: &str) -> Value {
        Value::Null
    }
    fn has_toggle_mapping(&self) -> bool {
        true
    }
}

/// `element` appended to a transcript's rendered `elements`, merged into the last one where
/// `family` merges it.
pub(crate) fn push_element<F: WireFamily + ?Sized>(family: &F, elements: &mut Vec<Value>, element: Value) {
    let left = match elements.last_mut() {
        Some(last) => family.merge_element(last, element),
        None => Some(element),
    };
    elements.extend(left);
}
