//! The script format (documented with an example in `broca-mock-model`, `mock/model/src/lib.rs`): types, JSON decoding and
//! validation. Decoding goes through permissive `Raw*` structs and then checks the shape, so a
//! bad script is refused with a message naming the problem rather than serde's untagged-enum
//! "did not match any variant".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The text of the reply a lane gives when its FIFO is empty.
pub const DEFAULT_REPLY_TEXT: &str = "Hello from broca-mock.";

/// A list of scripted responses, popped one per model request, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub responses: Vec<ScriptedResponse>,
    /// The `Authorization` header every model request of the lane must carry from now on
    /// (e.g. `"Bearer sk-…"`, the scripted vault credential); a request without it, or with
    /// another value, is answered 401 with the family's own error document and pops nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<String>,
    /// How the lane answers its next warms (Anthropic zero-output requests, `super::warm`),
    /// one per warm, in order; a warm past them is answered at once. Warms never pop
    /// `responses`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warms: Vec<WarmScript>,
    /// Provider rules ([`crate::rules`] ids, e.g. `"anthropic.text_non_empty"`) the lane's
    /// model requests may break from now on: a test that sends a bad request on purpose names
    /// the rules it breaks. Such a request is answered as if it kept them, and counted as
    /// allowed, not as a violation. An unknown id is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "known_rules")]
    pub allow_rules: Vec<String>,
    /// The Google account behind the lane's Code Assist requests (`loadCodeAssist`,
    /// `onboardUser`, the project a request must name); absent: a set-up account whose project
    /// is [`CodeAssistAccount::DEFAULT_PROJECT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_assist: Option<CodeAssistAccount>,
    /// The AWS region of the lane's Bedrock endpoint: a SigV4-signed request whose credential
    /// scope names another region is refused 403 `InvalidSignatureException`, "Credential
    /// should be scoped to a valid region." (as AWS answers a request signed for the wrong
    /// region).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_region: Option<String>,
}

/// A Code Assist account as the backend sees it (gemini-cli `setup.ts` meets each of these).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeAssistAccount {
    pub state: CodeAssistState,
    /// The account's project (`standard`), or the managed one onboarding assigns (`free`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// How many reads of the onboarding operation it takes to see it `done` (0: `onboardUser`
    /// answers it done at once).
    #[serde(default)]
    pub onboard_polls: u32,
}

impl CodeAssistAccount {
    pub const DEFAULT_PROJECT: &'static str = "broca-mock-project";

    pub fn project(&self) -> &str {
        self.project.as_deref().unwrap_or(Self::DEFAULT_PROJECT)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeAssistState {
    /// Set up (`currentTier`), `loadCodeAssist` names its project.
    Standard,
    /// Set up without a project (a Workspace account): the caller must name one.
    Workspace,
    /// Not set up: onboarded to the free tier, whose project Google manages.
    Free,
    /// Set up, no project, and ineligible (`ineligibleTiers` says why).
    Ineligible,
}

fn known_rules<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let ids = Vec::<String>::deserialize(d)?;
    match ids.iter().find(|id| crate::rules::find(id).is_none()) {
        Some(id) => Err(serde::de::Error::custom(format!("`allow_rules`: no provider rule `{id}`"))),
        None => Ok(ids),
    }
}

/// One warm's answer: after `delay_ms`, the measured usage, or `status`'s error document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmScript {
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

impl Script {
    /// Decodes and validates a script.
    pub fn from_json(text: &str) -> Result<Script, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a script always serializes")
    }

    /// A script of one response.
    pub fn one(response: ScriptedResponse) -> Script {
        Script { responses: vec![response], ..Script::default() }
    }
}

/// One answer to one model request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawResponse", into = "RawResponse")]
pub enum ScriptedResponse {
    /// A plain HTTP response with a JSON body (an error before any stream byte).
    Http(HttpReply),
    /// A 200 `text/event-stream` rendered from family-neutral steps.
    Stream(StreamReply),
}

#[derive(Clone, Debug, PartialEq)]
pub struct HttpReply {
    pub status: u16,
    /// `None`: the family's own error document for `status`.
    pub body: Option<Value>,
    pub headers: BTreeMap<String, String>,
    /// Wait this long before the status line.
    pub delay_ms: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamReply {
    pub events: Vec<Step>,
    pub write: WriteMode,
    /// Extra response headers.
    pub headers: BTreeMap<String, String>,
    /// Wait this long before the status line.
    pub delay_ms: u64,
}

/// The write-time timestamp token: every occurrence in a stream's bytes is replaced, as each
/// piece is written, by the current Unix time in microseconds as exactly 16 decimal digits.
pub const NOW_US_TOKEN: &str = "{{now_us}}";

impl StreamReply {
    pub fn new(events: Vec<Step>) -> StreamReply {
        StreamReply { events, ..StreamReply::default() }
    }

    /// Whether a usage step asks for measured input (`{"usage": {"measured": true}}`).
    pub fn wants_measure(&self) -> bool {
        self.events.iter().any(|s| matches!(s, Step::Usage(u) if u.measured))
    }

    /// Fills each measured usage step's input, cache reads and writes from `measured` (what
    /// the lane's prompt-cache model says of the request); its scripted output stays.
    pub fn measure_with(&mut self, measured: &Usage) {
        for step in &mut self.events {
            if let Step::Usage(u) = step {
                if u.measured {
                    u.input = measured.input;
                    u.cached = measured.cached;
                    u.cache_write = measured.cache_write;
                }
            }
        }
    }

    /// Whether any step's text holds [`NOW_US_TOKEN`]; only then are the written bytes scanned.
    /// A token split between two steps or two tool-call fragments is none: each renders into
    /// its own SSE event.
    pub fn uses_now_token(&self) -> bool {
        self.events.iter().any(|step| match step {
            Step::Text(s)
            | Step::TextBlock(s)
            | Step::RedactedReasoning(s)
            | Step::Refusal(s)
            | Step::Finish(s)
            | Step::Comment(s) => s.contains(NOW_US_TOKEN),
            Step::Reasoning { text, signature } => {
                text.contains(NOW_US_TOKEN) || signature.as_deref().is_some_and(|s| s.contains(NOW_US_TOKEN))
            }
            Step::ToolCall(tc) => [&tc.id, &tc.name].into_iter().chain(&tc.fragments).any(|s| s.contains(NOW_US_TOKEN)),
            Step::Error(e) => e.kind.contains(NOW_US_TOKEN) || e.message.contains(NOW_US_TOKEN),
            Step::UnknownEvent { name, data } => name.contains(NOW_US_TOKEN) || data.to_string().contains(NOW_US_TOKEN),
            Step::Usage(_) | Step::DelayMs(_) | Step::Disconnect => false,
        })
    }
}

/// How the rendered bytes are written to the socket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawWrite", into = "RawWrite")]
pub enum WriteMode {
    /// One write (and flush) per SSE event.
    #[default]
    PerEvent,
    /// The bytes between delays in `every`-byte pieces, each flushed, `pause_ms` apart.
    Split { every: usize, pause_ms: u64 },
    /// The bytes between delays in one write.
    Coalesce,
}

/// One family-neutral stream step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawStep", into = "RawStep")]
pub enum Step {
    Text(String),
    /// Text that begins a block of its own where the family has blocks (Anthropic: a new
    /// `text` content block even right after another); elsewhere plain text.
    TextBlock(String),
    Reasoning {
        text: String,
        signature: Option<String>,
    },
    RedactedReasoning(String),
    Refusal(String),
    ToolCall(ToolCall),
    Usage(Usage),
    /// `stop | length | tool_calls | content_filter | refusal`, or any other string, which is
    /// sent as the family's raw stop reason.
    Finish(String),
    Error(StreamError),
    DelayMs(u64),
    Comment(String),
    UnknownEvent {
        name: String,
        data: Value,
    },
    Disconnect,
}

impl Step {
    /// Steps that put content or a terminal on the wire (the rest are timing and noise).
    fn is_content(&self) -> bool {
        matches!(
            self,
            Step::Text(_)
                | Step::TextBlock(_)
                | Step::Reasoning { .. }
                | Step::RedactedReasoning(_)
                | Step::Refusal(_)
                | Step::ToolCall(_)
                | Step::Finish(_)
                | Step::Error(_)
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The argument JSON (need not be valid, e.g. for truncation tests) in the fragments it is
    /// streamed in; every family also sends an empty first fragment or its equivalent.
    pub fragments: Vec<String>,
}

impl ToolCall {
    /// `arguments` cut into `chunks` fragments of about equal length in characters (fewer when
    /// shorter), anywhere: inside keys, strings and escapes.
    pub fn new(id: &str, name: &str, arguments: &str, chunks: usize) -> ToolCall {
        let chars: Vec<char> = arguments.chars().collect();
        let per = chars.len().div_ceil(chunks.max(1)).max(1);
        let fragments = chars.chunks(per).map(|c| c.iter().collect()).collect();
        ToolCall { id: id.into(), name: name.into(), fragments }
    }

    /// The whole argument string.
    pub fn arguments(&self) -> String {
        self.fragments.concat()
    }
}

/// Usage in broca's normalized terms: `input` excludes cache reads (`cached`) and writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<u64>,
    /// Take `input`, `cached` and `cache_write` from the lane's prompt-cache model of the
    /// request (`prompt_cache`), as the provider would report them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured: bool,
}

impl Usage {
    /// Field by field, `later` wins where it reports a value.
    pub fn merge(&mut self, later: &Usage) {
        fn take(a: &mut Option<u64>, b: Option<u64>) {
            if b.is_some() {
                *a = b;
            }
        }
        take(&mut self.input, later.input);
        take(&mut self.cached, later.cached);
        take(&mut self.cache_write, later.cache_write);
        take(&mut self.output, later.output);
        take(&mut self.reasoning, later.reasoning);
        self.measured |= later.measured;
    }
}

/// An error reported inside a 200 stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamError {
    /// Anthropic `error.type`, OpenAI Chat `error.type`, Responses `code`.
    #[serde(rename = "type", default = "default_error_type")]
    pub kind: String,
    #[serde(default = "default_error_message")]
    pub message: String,
    /// Chat only: send `data: [DONE]` after the error chunk (servers differ).
    #[serde(default, skip_serializing_if = "is_false")]
    pub done: bool,
}

fn default_error_type() -> String {
    "api_error".into()
}

fn default_error_message() -> String {
    "broca-mock scripted in-stream error".into()
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The reply of a lane whose FIFO is empty: a short text in three deltas, usage, stop.
pub fn default_reply() -> StreamReply {
    let usage = Usage { input: Some(12), output: Some(6), ..Usage::default() };
    StreamReply::new(vec![
        Step::Text("Hello".into()),
        Step::Text(" from".into()),
        Step::Text(" broca-mock.".into()),
        Step::Usage(usage),
        Step::Finish("stop".into()),
    ])
}

/// Checks step order: content may not follow a `finish` or `error`; nothing follows a
/// `disconnect`.
fn check_order(steps: &[Step]) -> Result<(), String> {
    let mut ended: Option<&str> = None;
    for (i, step) in steps.iter().enumerate() {
        match ended {
            Some("disconnect") => return Err(format!("event {i} follows a disconnect")),
            Some(end) if step.is_content() => return Err(format!("event {i} puts content after `{end}`")),
            _ => {}
        }
        match step {
            Step::Finish(_) => ended = Some("finish"),
            Step::Error(_) => ended = Some("error"),
            Step::Disconnect => ended = Some("disconnect"),
            _ => {}
        }
    }
    Ok(())
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    events: Option<Vec<Step>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    write: Option<WriteMode>,
    #[serde(default, skip_serializing_if = "is_zero")]
    delay_ms: u64,
}

impl TryFrom<RawResponse> for ScriptedResponse {
    type Error = String;

    fn try_from(raw: RawResponse) -> Result<ScriptedResponse, String> {
        match (raw.status, raw.events) {
            (Some(_), Some(_)) => Err("a scripted response has `status` or `events`, not both".into()),
            (None, None) => Err("a scripted response needs `status` (HTTP reply) or `events` (stream)".into()),
            (Some(status), None) => {
                if !(100..=599).contains(&status) {
                    return Err(format!("status {status} is not an HTTP status"));
                }
                if raw.write.is_some() {
                    return Err("`write` applies to streams only".into());
                }
                Ok(ScriptedResponse::Http(HttpReply {
                    status,
                    body: raw.body,
                    headers: raw.headers,
                    delay_ms: raw.delay_ms,
                }))
            }
            (None, Some(events)) => {
                if raw.body.is_some() {
                    return Err("`body` applies to HTTP replies only; a stream has `events`".into());
                }
                check_order(&events)?;
                Ok(ScriptedResponse::Stream(StreamReply {
                    events,
                    write: raw.write.unwrap_or_default(),
                    headers: raw.headers,
                    delay_ms: raw.delay_ms,
                }))
            }
        }
    }
}

impl From<ScriptedResponse> for RawResponse {
    fn from(r: ScriptedResponse) -> RawResponse {
        match r {
            ScriptedResponse::Http(h) => RawResponse {
                status: Some(h.status),
                body: h.body,
                headers: h.headers,
                delay_ms: h.delay_ms,
                ..RawResponse::default()
            },
            ScriptedResponse::Stream(s) => RawResponse {
                events: Some(s.events),
                write: (s.write != WriteMode::PerEvent).then_some(s.write),
                headers: s.headers,
                delay_ms: s.delay_ms,
                ..RawResponse::default()
            },
        }
    }
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split_every: Option<usize>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pause_ms: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    coalesce: bool,
}

impl TryFrom<RawWrite> for WriteMode {
    type Error = String;

    fn try_from(raw: RawWrite) -> Result<WriteMode, String> {
        match (raw.split_every, raw.coalesce) {
            (Some(_), true) => Err("`write` is `split_every` or `coalesce`, not both".into()),
            (Some(0), _) => Err("`split_every` must be at least 1".into()),
            (Some(every), false) => Ok(WriteMode::Split { every, pause_ms: raw.pause_ms }),
            (None, _) if raw.pause_ms != 0 => Err("`pause_ms` needs `split_every`".into()),
            (None, true) => Ok(WriteMode::Coalesce),
            (None, false) => Ok(WriteMode::PerEvent),
        }
    }
}

impl From<WriteMode> for RawWrite {
    fn from(w: WriteMode) -> RawWrite {
        match w {
            WriteMode::PerEvent => RawWrite::default(),
            WriteMode::Split { every, pause_ms } => RawWrite { split_every: Some(every), pause_ms, coalesce: false },
            WriteMode::Coalesce => RawWrite { coalesce: true, ..RawWrite::default() },
        }
    }
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolCall {
    id: String,
    name: String,
    /// A string as sent; an object or array is serialized for convenience.
    #[serde(default)]
    arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunks: Option<usize>,
    /// Explicit fragments, instead of `chunks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fragments: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnknownEvent {
    #[serde(default)]
    name: String,
    #[serde(default)]
    data: Value,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text_block: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signature: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redacted_reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refusal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_call: Option<RawToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finish: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<StreamError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    comment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unknown_event: Option<RawUnknownEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disconnect: Option<bool>,
}

impl TryFrom<RawStep> for Step {
    type Error = String;

    fn try_from(raw: RawStep) -> Result<Step, String> {
        let mut found: Vec<Step> = Vec::new();
        if let Some(t) = raw.text {
            found.push(Step::Text(t));
        }
        if let Some(t) = raw.text_block {
            found.push(Step::TextBlock(t));
        }
        if let Some(text) = raw.reasoning {
            found.push(Step::Reasoning { text, signature: raw.signature.clone() });
        } else if raw.signature.is_some() {
            return Err("`signature` belongs on a `reasoning` event".into());
        }
        if let Some(d) = raw.redacted_reasoning {
            found.push(Step::RedactedReasoning(d));
        }
        if let Some(t) = raw.refusal {
            found.push(Step::Refusal(t));
        }
        if let Some(tc) = raw.tool_call {
            found.push(Step::ToolCall(tool_call(tc)?));
        }
        if let Some(u) = raw.usage {
            found.push(Step::Usage(u));
        }
        if let Some(f) = raw.finish {
            if f.is_empty() {
                return Err("`finish` is empty".into());
            }
            found.push(Step::Finish(f));
        }
        if let Some(e) = raw.error {
            found.push(Step::Error(e));
        }
        if let Some(ms) = raw.delay_ms {
            found.push(Step::DelayMs(ms));
        }
        if let Some(c) = raw.comment {
            if c.contains(['\n', '\r']) {
                return Err("a `comment` is one line".into());
            }
            found.push(Step::Comment(c));
        }
        if let Some(u) = raw.unknown_event {
            if u.name.contains(['\n', '\r']) {
                return Err("an `unknown_event` name is one line".into());
            }
            found.push(Step::UnknownEvent { name: u.name, data: u.data });
        }
        match raw.disconnect {
            Some(true) => found.push(Step::Disconnect),
            Some(false) => return Err("`disconnect` must be true".into()),
            None => {}
        }
        match found.len() {
            1 => Ok(found.pop().expect("one step")),
            0 => Err("an event needs one of text, reasoning, redacted_reasoning, refusal, tool_call, usage, finish, \
                      error, delay_ms, comment, unknown_event, disconnect"
                .into()),
            _ => Err("an event has exactly one kind (one key, plus `signature` on `reasoning`)".into()),
        }
    }
}

fn tool_call(raw: RawToolCall) -> Result<ToolCall, String> {
    let arguments = match raw.arguments {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => Some(other.to_string()),
    };
    match (raw.fragments, raw.chunks) {
        (Some(_), Some(_)) => Err("`tool_call` has `chunks` or `fragments`, not both".into()),
        (Some(fragments), None) => {
            if arguments.is_some_and(|a| a != fragments.concat()) {
                return Err("`tool_call.arguments` differs from its joined `fragments`".into());
            }
            Ok(ToolCall { id: raw.id, name: raw.name, fragments })
        }
        (None, Some(0)) => Err("`tool_call.chunks` must be at least 1".into()),
        (None, chunks) => Ok(ToolCall::new(&raw.id, &raw.name, &arguments.unwrap_or_default(), chunks.unwrap_or(2))),
    }
}

impl From<Step> for RawStep {
    fn from(step: Step) -> RawStep {
        let mut raw = RawStep::default();
        match step {
            Step::Text(t) => raw.text = Some(t),
            Step::TextBlock(t) => raw.text_block = Some(t),
            Step::Reasoning { text, signature } => {
                raw.reasoning = Some(text);
                raw.signature = signature;
            }
            Step::RedactedReasoning(d) => raw.redacted_reasoning = Some(d),
            Step::Refusal(t) => raw.refusal = Some(t),
            Step::ToolCall(tc) => {
                raw.tool_call = Some(RawToolCall {
                    arguments: Value::String(tc.arguments()),
                    id: tc.id,
                    name: tc.name,
                    chunks: None,
                    fragments: Some(tc.fragments),
                })
            }
            Step::Usage(u) => raw.usage = Some(u),
            Step::Finish(f) => raw.finish = Some(f),
            Step::Error(e) => raw.error = Some(e),
            Step::DelayMs(ms) => raw.delay_ms = Some(ms),
            Step::Comment(c) => raw.comment = Some(c),
            Step::UnknownEvent { name, data } => raw.unknown_event = Some(RawUnknownEvent { name, data }),
            Step::Disconnect => raw.disconnect = Some(true),
        }
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{"responses": [
        {"status": 429, "headers": {"retry-after": "1"}},
        {"status": 200, "body": {"ok": true}, "delay_ms": 5},
        {"events": [
            {"reasoning": "Let me think.", "signature": "sig=="},
            {"redacted_reasoning": "opaque"},
            {"text": "Hi "},
            {"comment": "keepalive"},
            {"delay_ms": 10},
            {"unknown_event": {"name": "mystery", "data": {"x": 1}}},
            {"tool_call": {"id": "call_1", "name": "stat_file", "arguments": "{\"path\":\"a\"}", "chunks": 3}},
            {"tool_call": {"id": "call_2", "name": "ls", "arguments": {"dir": "."}}},
            {"tool_call": {"id": "call_3", "name": "ls", "fragments": ["{\"a", "\":1}"]}},
            {"usage": {"input": 10, "cached": 5, "output": 7}},
            {"finish": "tool_calls"}
        ], "write": {"split_every": 7, "pause_ms": 1}},
        {"events": [{"text": "partial"}, {"error": {"type": "overloaded_error", "message": "Overloaded"}}]},
        {"events": [{"refusal": "no"}, {"finish": "refusal"}, {"disconnect": true}], "write": {"coalesce": true}}
    ]}"#;

    #[test]
    fn decodes_every_kind() {
        let script = Script::from_json(EXAMPLE).unwrap();
        assert_eq!(script.responses.len(), 5);
        let ScriptedResponse::Http(h) = &script.responses[0] else { panic!("http") };
        assert_eq!((h.status, h.body.is_none(), h.headers["retry-after"].as_str()), (429, true, "1"));
        let ScriptedResponse::Stream(s) = &script.responses[2] else { panic!("stream") };
        assert_eq!(s.write, WriteMode::Split { every: 7, pause_ms: 1 });
        assert_eq!(s.events[0], Step::Reasoning { text: "Let me think.".into(), signature: Some("sig==".into()) });
        let Step::ToolCall(tc) = &s.events[6] else { panic!("tool call") };
        assert_eq!(tc.fragments, ["{\"pa", "th\":", "\"a\"}"]);
        let Step::ToolCall(tc) = &s.events[7] else { panic!("tool call") };
        assert_eq!((tc.arguments(), tc.fragments.len()), ("{\"dir\":\".\"}".to_string(), 2));
        let Step::ToolCall(tc) = &s.events[8] else { panic!("tool call") };
        assert_eq!(tc.fragments, ["{\"a", "\":1}"]);
        assert_eq!(
            s.events[9],
            Step::Usage(Usage { input: Some(10), cached: Some(5), output: Some(7), ..Usage::default() })
        );
        let ScriptedResponse::Stream(s) = &script.responses[3] else { panic!("stream") };
        assert_eq!(
            s.events[1],
            Step::Error(StreamError { kind: "overloaded_error".into(), message: "Overloaded".into(), done: false })
        );
        let ScriptedResponse::Stream(s) = &script.responses[4] else { panic!("stream") };
        assert_eq!((s.write.clone(), s.events.last()), (WriteMode::Coalesce, Some(&Step::Disconnect)));
    }

    #[test]
    fn round_trips_through_json() {
        let script = Script::from_json(EXAMPLE).unwrap();
        assert_eq!(Script::from_json(&script.to_json()).unwrap(), script);
    }

    #[test]
    fn refuses_malformed_scripts() {
        let bad = [
            r#"{"responses":[{}]}"#,
            r#"{"responses":[{"status":429,"events":[]}]}"#,
            r#"{"responses":[{"status":42}]}"#,
            r#"{"responses":[{"events":[{"text":"a","comment":"b"}]}]}"#,
            r#"{"responses":[{"events":[{}]}]}"#,
            r#"{"responses":[{"events":[{"signature":"s"}]}]}"#,
            r#"{"responses":[{"events":[{"txt":"a"}]}]}"#,
            r#"{"responses":[{"events":[{"finish":"stop"},{"text":"late"}]}]}"#,
            r#"{"responses":[{"events":[{"disconnect":true},{"delay_ms":1}]}]}"#,
            r#"{"responses":[{"events":[{"disconnect":false}]}]}"#,
            r#"{"responses":[{"events":[], "write":{"split_every":0}}]}"#,
            r#"{"responses":[{"events":[], "write":{"split_every":3,"coalesce":true}}]}"#,
            r#"{"responses":[{"events":[{"tool_call":{"id":"a","name":"b","chunks":0}}]}]}"#,
            r#"{"responses":[{"events":[{"comment":"two\nlines"}]}]}"#,
            r#"{"responses":[{"events":[{"tool_call":{"id":"a","name":"b","chunks":2,"fragments":["x"]}}]}]}"#,
            r#"{"responses":[{"events":[{"tool_call":{"id":"a","name":"b","arguments":"y","fragments":["x"]}}]}]}"#,
            r#"{"response":[]}"#,
        ];
        for text in bad {
            assert!(Script::from_json(text).is_err(), "accepted {text}");
        }
    }

    #[test]
    fn timing_and_usage_may_follow_a_finish() {
        let text = r#"{"responses":[{"events":[{"finish":"stop"},{"usage":{"output":1}},{"delay_ms":1},{"comment":"x"},{"disconnect":true}]}]}"#;
        assert!(Script::from_json(text).is_ok());
    }

    #[test]
    fn the_now_token_is_noticed_in_any_string() {
        let uses = |events: &str| {
            let script = Script::from_json(&format!(r#"{{"responses":[{{"events":{events}}}]}}"#)).unwrap();
            let ScriptedResponse::Stream(s) = &script.responses[0] else { panic!("stream") };
            s.uses_now_token()
        };
        assert!(!uses(r#"[{"text":"now_us {now_us}"},{"delay_ms":5},{"finish":"stop"}]"#));
        let ScriptedResponse::Stream(example) = &Script::from_json(EXAMPLE).unwrap().responses[2] else { panic!() };
        assert!(!example.uses_now_token());
        assert!(uses(r#"[{"text":"a"},{"delay_ms":5},{"text":"t={{now_us}};"}]"#));
        assert!(uses(r#"[{"tool_call":{"id":"c","name":"n","arguments":{"at":"{{now_us}}"},"chunks":1}}]"#));
        // Cut between two fragments (two events), it is no token.
        assert!(!uses(r#"[{"tool_call":{"id":"c","name":"n","fragments":["{{now", "_us}}"]}}]"#));
        assert!(uses(r#"[{"unknown_event":{"name":"x","data":{"{{now_us}}":1}}}]"#));
        assert!(uses(r#"[{"comment":"sent {{now_us}}"}]"#));
    }

    #[test]
    fn usage_merges_field_by_field() {
        let mut u = Usage { input: Some(1), output: Some(2), ..Usage::default() };
        u.merge(&Usage { output: Some(5), reasoning: Some(3), ..Usage::default() });
        assert_eq!(u, Usage { input: Some(1), output: Some(5), reasoning: Some(3), ..Usage::default() });
    }
}
