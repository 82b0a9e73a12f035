//! Streams providers really sent, through broca's framer and decoder for their family (#46).
//!
//! The fixtures are `testdata/real-streams/<family>/` (its README names their sources; none was
//! written from broca's own reading of the docs). Each is framed as its provider sends it and fed
//! whole, one byte at a time, and in 7- and 64-byte pieces; every split must give the same
//! outcome. The outcome is assembled as an attempt assembles it (`provider::client` and
//! `agent::attempt`): content parts in stream order (a text delta after a `TextPartStart` opens a
//! part of its own, a signature closes the reasoning before it), tool calls by their index, usage
//! merged field by field, the first in-stream error ends the attempt, and nothing is decoded after
//! the read in which the decoder reached the stream's terminal event.
//!
//! Each case states what a careful reader of the provider's documentation expects of that
//! stream, written by reading the fixture (not by printing what broca produces): the text, the
//! reasoning with its signature, opaque reasoning, each tool call's id, name and complete
//! arguments, the usage in broca's normalized form (fresh input excludes cache reads and writes;
//! reasoning is inside output), the finish reason (normalized as the role's table says, with the
//! raw value), and an in-stream error's class. A failure names the fixture and every field that
//! differs.
//!
//! `real_streams/synthetic.rs` adds the shapes providers document that no fixture shows, each
//! case written from the document it names.

#[path = "real_streams/synthetic.rs"]
mod synthetic;

use std::path::PathBuf;

use base64::Engine as _;
use broca::frozen::Family;
use broca::message::StepUsage;
use broca::provider::event::StreamEvent;
use broca::provider::wire;
use broca::record::{ErrorClass, ProviderError};
use serde_json::Value;

/// The piece sizes every stream is fed in (0: whole).
const SPLITS: [usize; 4] = [0, 1, 7, 64];

/// A content part as the attempt assembles it.
#[derive(Clone, Debug, PartialEq)]
pub enum Got {
    Text(String),
    Reasoning { text: String, signature: Option<String> },
    Opaque(String),
}

/// What one attempt made of a stream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub parts: Vec<Got>,
    /// Tool calls by index: (id, name, argument text as streamed).
    pub calls: Vec<(usize, String, String, String)>,
    pub usage: StepUsage,
    /// (normalized, raw) of the last `Finish`.
    pub finish: Option<(String, String)>,
    /// The first in-stream error (it ends the attempt).
    pub error: Option<ProviderError>,
    /// The decoder reached the stream's terminal event (else the attempt reads as truncated).
    pub finished: bool,
}

/// The attempt's assembly (`agent::attempt::Assembler`'s rules).
#[derive(Default)]
struct Assembly {
    outcome: Outcome,
    text_break: bool,
}

impl Assembly {
    /// Takes one event; returns false once the attempt has ended on an error.
    fn push(&mut self, event: StreamEvent) -> bool {
        let o = &mut self.outcome;
        match event {
            StreamEvent::TextDelta { text } => {
                match o.parts.last_mut() {
                    Some(Got::Text(t)) if !self.text_break => t.push_str(&text),
                    _ => o.parts.push(Got::Text(text)),
                }
                self.text_break = false;
            }
            StreamEvent::TextPartStart => self.text_break = true,
            StreamEvent::ReasoningDelta { text } => match o.parts.last_mut() {
                Some(Got::Reasoning { text: t, signature: None }) => t.push_str(&text),
                _ => o.parts.push(Got::Reasoning { text, signature: None }),
            },
            StreamEvent::ReasoningSignature { signature } => match o.parts.last_mut() {
                Some(Got::Reasoning { signature: s @ None, .. }) => *s = Some(signature),
                _ => o.parts.push(Got::Reasoning { text: String::new(), signature: Some(signature) }),
            },
            StreamEvent::ReasoningOpaque { data } => o.parts.push(Got::Opaque(data)),
            StreamEvent::ToolCallStart { index, id, name } => o.calls.push((index, id, name, String::new())),
            StreamEvent::ToolCallArgsDelta { index, delta } => {
                if let Some(call) = o.calls.iter_mut().rev().find(|c| c.0 == index) {
                    call.3.push_str(&delta);
                }
            }
            StreamEvent::Usage { usage } => {
                let merge = |into: &mut Option<u64>, from: Option<u64>| {
                    if from.is_some() {
                        *into = from;
                    }
                };
                merge(&mut o.usage.input_tokens, usage.input_tokens);
                merge(&mut o.usage.cached_input_tokens, usage.cached_input_tokens);
                merge(&mut o.usage.cache_write_tokens, usage.cache_write_tokens);
                merge(&mut o.usage.output_tokens, usage.output_tokens);
                merge(&mut o.usage.reasoning_tokens, usage.reasoning_tokens);
            }
            StreamEvent::ServedTier { .. } => {}
            StreamEvent::Finish { reason, raw } => o.finish = Some((reason, raw)),
            StreamEvent::Error { error } => {
                o.error = Some(error);
                return false;
            }
        }
        true
    }
}

/// Feeds `bytes` in pieces of `piece` bytes (0: whole) as the client reads a response. A framing
/// or decode error is returned as text (the client fails the attempt as undecodable there).
pub fn run(family: Family, bytes: &[u8], piece: usize) -> Result<Outcome, String> {
    let mut framer = wire(family).framer();
    let mut decoder = wire(family).decoder();
    let mut assembly = Assembly::default();
    let pieces: Vec<&[u8]> = if piece == 0 { vec![bytes] } else { bytes.chunks(piece).collect() };
    let reads = pieces.into_iter().map(Some).chain([None]);
    'reads: for read in reads {
        let pushed = match read {
            Some(bytes) => framer.push(bytes),
            None => framer.finish(),
        };
        let pushed = pushed.map_err(|e| format!("framing: {}", e.0))?;
        for event in &pushed.events {
            let mut out = Vec::new();
            decoder.decode(event, &mut out).map_err(|e| format!("{e} (event {:?})", event.event))?;
            for e in out {
                if !assembly.push(e) {
                    break 'reads;
                }
            }
        }
        // The client stops reading once the stream reached its terminal event.
        if decoder.finished() {
            break;
        }
    }
    assembly.outcome.finished = decoder.finished();
    Ok(assembly.outcome)
}

/// Expected text: exact, or (when long) its length in characters and both ends.
#[derive(Clone, Copy, Debug)]
pub enum Txt {
    Exact(&'static str),
    Long { chars: usize, starts: &'static str, ends: &'static str },
}

pub fn exact(s: &'static str) -> Txt {
    Txt::Exact(s)
}

pub fn long(chars: usize, starts: &'static str, ends: &'static str) -> Txt {
    Txt::Long { chars, starts, ends }
}

impl Txt {
    fn matches(&self, s: &str) -> bool {
        match self {
            Txt::Exact(e) => s == *e,
            Txt::Long { chars, starts, ends } => {
                s.chars().count() == *chars && s.starts_with(starts) && s.ends_with(ends)
            }
        }
    }
}

/// An expected content part.
#[derive(Clone, Copy, Debug)]
pub enum Part {
    Text(Txt),
    /// Reasoning text and its signature.
    Reasoning(Txt, Option<Txt>),
    /// Reasoning the provider returned only as an opaque blob.
    Opaque(Txt),
}

impl Part {
    fn matches(&self, got: &Got) -> bool {
        match (self, got) {
            (Part::Text(e), Got::Text(g)) => e.matches(g),
            (Part::Reasoning(e, sig), Got::Reasoning { text, signature }) => {
                e.matches(text)
                    && match (sig, signature) {
                        (None, None) => true,
                        (Some(e), Some(g)) => e.matches(g),
                        _ => false,
                    }
            }
            (Part::Opaque(e), Got::Opaque(g)) => e.matches(g),
            _ => false,
        }
    }
}

/// An expected tool call: id, name, and its arguments as JSON (no arguments at all: `{}`).
#[derive(Clone, Copy, Debug)]
pub struct Call(pub &'static str, pub &'static str, pub &'static str);

/// Where a case's bytes come from.
pub enum Source {
    /// A fixture under `testdata/real-streams/`.
    Fixture(&'static str),
    /// Written from the provider document named.
    Synthetic { doc: &'static str, bytes: Vec<u8> },
}

/// One case: a stream and what it means.
pub struct Case {
    pub name: String,
    pub family: Family,
    pub source: Source,
    pub parts: Vec<Part>,
    pub calls: Vec<Call>,
    /// `[input, cache read, cache write, output, reasoning]`, normalized.
    pub usage: [Option<u64>; 5],
    /// (normalized, raw).
    pub finish: Option<(&'static str, &'static str)>,
    /// The class and provider code of the in-stream error that ends the attempt.
    pub error: Option<(ErrorClass, &'static str)>,
    pub finished: bool,
}

/// A fixture case; `path` is `<family>/<file>` under `testdata/real-streams/`.
pub fn fixture(path: &'static str) -> Case {
    let (dir, _) = path.split_once('/').expect("<family>/<file>");
    let family = Family::ALL.into_iter().find(|f| f.as_str() == dir).expect("a family directory");
    Case::new(path, family, Source::Fixture(path))
}

impl Case {
    pub fn new(name: impl Into<String>, family: Family, source: Source) -> Case {
        Case {
            name: name.into(),
            family,
            source,
            parts: Vec::new(),
            calls: Vec::new(),
            usage: [None; 5],
            finish: None,
            error: None,
            finished: true,
        }
    }
    pub fn parts(mut self, parts: impl IntoIterator<Item = Part>) -> Case {
        self.parts = parts.into_iter().collect();
        self
    }
    pub fn calls(mut self, calls: impl IntoIterator<Item = Call>) -> Case {
        self.calls = calls.into_iter().collect();
        self
    }
    pub fn usage(mut self, usage: [Option<u64>; 5]) -> Case {
        self.usage = usage;
        self
    }
    pub fn finish(mut self, reason: &'static str, raw: &'static str) -> Case {
        self.finish = Some((reason, raw));
        self
    }
    pub fn error(mut self, class: ErrorClass, code: &'static str) -> Case {
        self.error = Some((class, code));
        self
    }
    pub fn unfinished(mut self) -> Case {
        self.finished = false;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        match &self.source {
            Source::Synthetic { bytes, .. } => bytes.clone(),
            Source::Fixture(path) => framed(self.family, path),
        }
    }

    /// Every way this case's outcome differs from what is expected.
    fn differences(&self, got: &Outcome) -> Vec<String> {
        let mut diffs = Vec::new();
        let parts_match =
            self.parts.len() == got.parts.len() && self.parts.iter().zip(&got.parts).all(|(e, g)| e.matches(g));
        if !parts_match {
            diffs.push(format!("parts: expected {:?}\n  got {:?}", self.parts, got.parts));
        }
        let calls_match = self.calls.len() == got.calls.len()
            && self.calls.iter().zip(&got.calls).enumerate().all(|(i, (e, g))| {
                let args = if g.3.trim().is_empty() {
                    Ok(Value::Object(Default::default()))
                } else {
                    serde_json::from_str(&g.3)
                };
                let expected: Value = serde_json::from_str(e.2).expect("expected arguments are JSON");
                g.0 == i && g.1 == e.0 && g.2 == e.1 && args.ok() == Some(expected)
            });
        if !calls_match {
            diffs.push(format!("calls: expected {:?}\n  got {:?}", self.calls, got.calls));
        }
        let u = &got.usage;
        let usage = [u.input_tokens, u.cached_input_tokens, u.cache_write_tokens, u.output_tokens, u.reasoning_tokens];
        if usage != self.usage {
            diffs.push(format!(
                "usage [input, cache read, cache write, output, reasoning]: expected {:?}, got {usage:?}",
                self.usage
            ));
        }
        let finish = got.finish.as_ref().map(|(r, raw)| (r.as_str(), raw.as_str()));
        if finish != self.finish {
            diffs.push(format!("finish: expected {:?}, got {finish:?}", self.finish));
        }
        let error = got.error.as_ref().map(|e| (e.class, e.provider_code.as_deref().unwrap_or_default()));
        if error != self.error || got.error.as_ref().is_some_and(|e| e.message.is_empty()) {
            diffs.push(format!("error: expected {:?}, got {:?}", self.error, got.error));
        }
        if got.finished != self.finished {
            diffs.push(format!("finished: expected {}, got {}", self.finished, got.finished));
        }
        diffs
    }

    /// Runs the case at every split; the failures, each naming the case.
    fn check(&self) -> Vec<String> {
        let bytes = self.bytes();
        let mut failures = Vec::new();
        let mut whole = None;
        for piece in SPLITS {
            let label = if piece == 0 { "whole".to_string() } else { format!("{piece}-byte pieces") };
            match run(self.family, &bytes, piece) {
                Err(e) => failures.push(format!("{} ({label}): the stream does not decode: {e}", self.name)),
                Ok(got) => {
                    let diffs = self.differences(&got);
                    if !diffs.is_empty() {
                        failures.push(format!("{} ({label}):\n  {}", self.name, diffs.join("\n  ")));
                    } else if whole.as_ref().is_some_and(|w| *w != got) {
                        failures.push(format!("{} ({label}): differs from the whole stream's outcome", self.name));
                    }
                    whole.get_or_insert(got);
                }
            }
        }
        failures
    }
}

/// Runs every case; fails naming each case that does not hold.
pub fn check_all(cases: Vec<Case>) {
    assert!(!cases.is_empty());
    for case in &cases {
        if let Source::Synthetic { doc, .. } = &case.source {
            assert!(!doc.is_empty(), "{}: a synthetic case names its document", case.name);
        }
    }
    let failures: Vec<(&str, Vec<String>)> =
        cases.iter().map(|c| (c.name.as_str(), c.check())).filter(|(_, f)| !f.is_empty()).collect();
    let named: Vec<&str> = failures.iter().map(|(name, _)| *name).collect();
    let details: Vec<String> = failures.into_iter().flat_map(|(_, f)| f).collect();
    assert!(named.is_empty(), "{} of {} cases fail: {named:?}\n{}", named.len(), cases.len(), details.join("\n"));
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/real-streams")
}

/// A fixture's bytes as the provider sends them on the wire.
fn framed(family: Family, path: &str) -> Vec<u8> {
    let file = root().join(path);
    let raw = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let text = || String::from_utf8(raw.clone()).expect("a text fixture is UTF-8");
    let base64 = |s: &str| {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        base64::engine::general_purpose::STANDARD.decode(s).expect("base64")
    };
    if path.ends_with(".chunks.txt") {
        frame_chunks(family, &text())
    } else if path.ends_with(".response.json") {
        // streamGenerateContent sends the whole response as one event; its lines as `data:` lines.
        let mut sse: String = text().lines().map(|line| format!("data: {line}\n")).collect();
        sse.push('\n');
        sse.into_bytes()
    } else if path.ends_with(".eventstream.base64.txt") {
        base64(&text())
    } else if path.ends_with(".live.json") {
        let live: Value = serde_json::from_str(&text()).expect("live.json");
        base64(live["response"]["bodyBase64"].as_str().expect("response.bodyBase64"))
    } else {
        raw
    }
}

/// One JSON event per line, framed as the family's wire frames it: Anthropic and Responses name
/// each event in an `event:` line (its `type`); Chat ends with `data: [DONE]`.
fn frame_chunks(family: Family, text: &str) -> Vec<u8> {
    let mut sse = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if matches!(family, Family::AnthropicMessages | Family::OpenaiResponses) {
            let event: Value = serde_json::from_str(line).expect("a chunk is JSON");
            sse += &format!("event: {}\n", event["type"].as_str().expect("a chunk has a type"));
        }
        sse += &format!("data: {line}\n\n");
    }
    if family == Family::OpenaiChat {
        sse += "data: [DONE]\n\n";
    }
    sse.into_bytes()
}

pub use Part::{Opaque, Reasoning, Text};

/// Whole text, no signature.
pub fn text(s: &'static str) -> Part {
    Text(exact(s))
}

#[test]
fn every_fixture_has_its_source_and_one_case() {
    let cases: Vec<Case> =
        [anthropic(), openai_chat(), openai_responses(), gemini(), bedrock()].into_iter().flatten().collect();
    let mut named: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    named.sort_unstable();
    let mut fixtures = Vec::new();
    let mut sources = Vec::new();
    for dir in std::fs::read_dir(root()).expect("testdata/real-streams").map(|d| d.expect("entry").path()) {
        if !dir.is_dir() {
            continue;
        }
        let family = dir.file_name().and_then(|n| n.to_str()).expect("a UTF-8 name").to_string();
        for file in std::fs::read_dir(&dir).expect("a family directory") {
            let name = file.expect("entry").file_name().into_string().expect("a UTF-8 name");
            match name.strip_suffix(".source.json") {
                Some(stem) => sources.push(format!("{family}/{stem}")),
                None => fixtures.push(format!("{family}/{name}")),
            }
        }
    }
    fixtures.sort_unstable();
    sources.sort_unstable();
    let stems: Vec<&str> = fixtures.iter().map(|f| f.split_once('.').map_or(f.as_str(), |(stem, _)| stem)).collect();
    assert_eq!(stems, sources, "every fixture has one source.json beside it, and every source.json a fixture");
    assert_eq!(named, fixtures, "every fixture has one case");
}

/// Anthropic Messages: `platform.claude.com/docs/build-with-claude/streaming`. Usage is the merge
/// of `message_start` and the cumulative `message_delta`; `input_tokens` already excludes cache
/// reads and writes; `output_tokens_details.thinking_tokens` is the reasoning inside output.
fn anthropic() -> Vec<Case> {
    vec![
        fixture("anthropic_messages/a01-text.chunks.txt")
            .parts([text(
                "Hello! I'm doing well, thank you for asking. How are you doing today? Is there anything I can help you with?",
            )])
            .usage([Some(12), Some(0), Some(0), Some(30), None])
            .finish("stop", "end_turn"),
        fixture("anthropic_messages/a02-thinking-text.chunks.txt")
            .parts([
                Reasoning(
                    exact("The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185"),
                    Some(long(332, "EvQBCkYICxgCKkAxhD4NUKFz", "/oPr/4yzNgvi/EhT6Ca17BgB")),
                ),
                text("925 ÷ 5 = 185"),
            ])
            .usage([Some(69), Some(0), Some(0), Some(53), None])
            .finish("stop", "end_turn"),
        // The tool_use block's only input_json_delta is "": the call has no arguments, `{}`.
        fixture("anthropic_messages/a03-text-then-tool-no-args.chunks.txt")
            .parts([text("I'll update the issue list for you.")])
            .calls([Call("toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList", "{}")])
            .usage([Some(565), Some(0), Some(0), Some(48), None])
            .finish("tool_calls", "tool_use"),
        fixture("anthropic_messages/a04-text-then-tool-args.chunks.txt")
            .parts([text("I'll invoke the JSON response tool.")])
            .calls([Call(
                "toolu_01KFbKqPYSuAKujiL6mTfzYA",
                "json",
                r#"{"elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]}"#,
            )])
            .usage([Some(849), Some(0), Some(0), Some(47), None])
            .finish("tool_calls", "tool_use"),
        // server_tool_use and bash_code_execution_tool_result blocks run on Anthropic's side: no
        // client call. message_delta revises every count (cache write 3068 → 3337, read 0 →
        // 6289) and reports thinking_tokens 0.
        fixture("anthropic_messages/a05-cache-read-write-server-tools.chunks.txt")
            .parts([text("The sum of the squares of the numbers 1 through 12 is **650**.")])
            .usage([Some(6), Some(6289), Some(3337), Some(198), Some(0)])
            .finish("stop", "end_turn"),
        // message_delta's input_tokens (61) replaces message_start's (43).
        fixture("anthropic_messages/a06-message-delta-revises-input.chunks.txt")
            .parts([text("pong")])
            .usage([Some(61), None, None, Some(2), None])
            .finish("stop", "end_turn"),
        fixture("anthropic_messages/a07-redacted-thinking.sse")
            .parts([
                Opaque(long(744, "EqkECkYIBxgCKkA8AZ4noDfV", "AhDIXXjpot45vnBd4ewJ/hgB")),
                Opaque(long(296, "EtgBCkYIBxgCKkDQfGkwzflE", "jRRFuab/DBV3yRYdZ1J0GAE=")),
                Text(long(359, "I notice that you've sen", "timate task or question?")),
            ])
            .usage([Some(92), Some(0), Some(0), Some(189), None])
            .finish("stop", "end_turn"),
        fixture("anthropic_messages/a08-thinking-long-text.sse")
            .parts([
                Reasoning(
                    long(202, "This is a straightforwar", " help prevent accidents."),
                    Some(long(504, "EvMCCkYICxgCKkCHP2cSuEdc", "eb1vgb7wwzDvP/UhjfQYAQ==")),
                ),
                Text(long(1021, "Here are the basic steps", "d when crossing streets.")),
            ])
            .usage([Some(43), Some(0), Some(0), Some(282), None])
            .finish("stop", "end_turn"),
        // Three text blocks between server web_search blocks stay three parts; pause_turn is
        // "other" in the role's table; thinking_tokens 261 of the 943 output tokens.
        fixture("anthropic_messages/a09-pause-turn-web-search.sse")
            .parts([
                Reasoning(
                    long(1051, "The user wants me to run", "requested. Let me start."),
                    Some(long(1688, "EuwJCm4IDxgCKkBjID0+egpR", "5h/n+3fwB2JU3RNwqNCIGAE=")),
                ),
                text("I'll run these searches one at a time as requested. Let me start:"),
                text("Let me continue with the remaining searches you requested:"),
                text("Now continuing with the remaining searches:"),
            ])
            .usage([Some(404500), Some(0), Some(0), Some(943), Some(261)])
            .finish("other", "pause_turn"),
        // mcp_tool_use / mcp_tool_result run on Anthropic's side; input_tokens 589 → 1250.
        fixture("anthropic_messages/a10-mcp-server-tool.chunks.txt")
            .parts([text(
                "The echo tool responded back with: **hello world**\n\nIt simply echoed back the exact message that was sent to it.",
            )])
            .usage([Some(1250), Some(0), Some(0), Some(83), None])
            .finish("stop", "end_turn"),
        // An `error` event after partial text, then the connection closes: overloaded is
        // transient (a retry may succeed), never a clean end with partial text.
        fixture("anthropic_messages/a11-spliced-overloaded-error.sse")
            .parts([text("Hello! I'm doing well, thank you for asking")])
            .usage([Some(12), Some(0), Some(0), Some(1), None])
            .error(ErrorClass::Transient, "overloaded_error"),
    ]
}

/// OpenAI Chat Completions and compatibles: `platform.openai.com/docs/api-reference/chat-streaming`.
/// `prompt_tokens` includes `cached_tokens` (DeepSeek: `prompt_cache_hit_tokens`);
/// `completion_tokens` includes reasoning, except where the compatible's `total_tokens` shows it
/// does not (xAI).
fn openai_chat() -> Vec<Case> {
    vec![
        // The usage-only final chunk (`choices: []`, stream_options.include_usage).
        fixture("openai_chat/c01-openai-text-usage.chunks.txt")
            .parts([Text(long(1724, "**Holiday Name:** Harmon", "nces and mutual respect."))])
            .usage([Some(16), Some(0), None, Some(300), Some(0)])
            .finish("stop", "stop"),
        // A moderation chunk with `choices: []` after the usage chunk changes nothing.
        fixture("openai_chat/c02-openai-trailing-moderation-chunk.sse")
            .parts([text("Paris.")])
            .usage([Some(13), Some(0), None, Some(11), Some(0)])
            .finish("stop", "stop"),
        fixture("openai_chat/c03-openai-tool-call.sse")
            .calls([Call("call_ZR5UUuTt3pf61kjwAJIYdVMj", "get_capital", r#"{"country":"UK"}"#)])
            .usage([Some(53), Some(0), None, Some(15), Some(0)])
            .finish("tool_calls", "tool_calls"),
        // Usage rides on the finishing chunk; 320 of the 339 prompt tokens were cache hits.
        fixture("openai_chat/c04-deepseek-reasoning-tool-cache.chunks.txt")
            .parts([Reasoning(long(191, "The user is asking for t", " set to \"San Francisco\"."), None)])
            .calls([Call("call_00_ioIn7yN9p1ZOMNpDLwd4MgAF", "weather", r#"{"location": "San Francisco"}"#)])
            .usage([Some(19), Some(320), None, Some(83), Some(39)])
            .finish("tool_calls", "tool_calls"),
        fixture("openai_chat/c05-deepseek-length.chunks.txt")
            .parts([Text(long(1855, "## **Holiday Name:** Sta", "tes of silent looking at"))])
            .usage([Some(13), Some(0), None, Some(400), None])
            .finish("length", "length"),
        fixture("openai_chat/c06-groq-tool-call.chunks.txt")
            .calls([Call("tk85n1k4m", "weather", "{}")])
            .usage([Some(210), None, None, Some(15), None])
            .finish("tool_calls", "tool_calls"),
        // Groq's `event: error` after reasoning: an invalid_request_error (HTTP 400) is permanent.
        fixture("openai_chat/c07-groq-in-stream-error.sse")
            .parts([Reasoning(long(412, "We need to call the tool", ": \"test\". Let's do that."), None)])
            .error(ErrorClass::Permanent, "tool_use_failed"),
        // OpenRouter reports finish `length`, then an error chunk whose numeric code is the HTTP
        // status (OpenRouter's error docs): 400 is permanent, not a transient failure to retry.
        fixture("openai_chat/c08-openrouter-error-chunk.sse")
            .parts([Reasoning(exact("We need to respond to a greeting. The user"), None)])
            .finish("length", "length")
            .error(ErrorClass::Permanent, "400"),
        // total_tokens 513 = 291 + 26 + 196: xAI's completion_tokens leaves the 196 reasoning
        // tokens out, so output is 222 (reasoning stays inside output).
        fixture("openai_chat/c09-xai-tool-call-reasoning-usage.chunks.txt")
            .parts([Reasoning(exact("First, the user is"), None)])
            .calls([Call("call_55117580", "weather", r#"{"location":"San Francisco"}"#)])
            .usage([Some(1), Some(290), None, Some(222), Some(196)])
            .finish("tool_calls", "tool_calls"),
        // Anthropic's OpenAI-compatible endpoint numbers the first call 1; no usage chunk. The
        // capture's last line, `data: [DONE]`, has no blank line after it: by the SSE
        // specification an event the stream ends inside is discarded, so the terminator is never
        // seen and the attempt reads as truncated although every content event arrived.
        fixture("openai_chat/c10-anthropic-compat-tool-index-1.sse")
            .parts([text("Reading it.")])
            .calls([Call("toolu_sanitized", "read_file", r#"{"path": "a.txt"}"#)])
            .finish("tool_calls", "tool_calls")
            .unfinished(),
        // Keep-alive comments; reasoning only as encrypted reasoning_details (not read); usage
        // after the finishing chunk.
        fixture("openai_chat/c11-openrouter-reasoning-cached.sse")
            .parts([Text(long(284, "I'm Grok, an AI built by", "y). What's on your mind?"))])
            .usage([Some(8), Some(679), None, Some(187), Some(118)])
            .finish("stop", "stop"),
    ]
}

/// OpenAI Responses: `platform.openai.com/docs/api-reference/responses-streaming`. The call id
/// is the item's `call_id`; usage from the terminal `response`, `input_tokens` including cached.
fn openai_responses() -> Vec<Case> {
    vec![
        fixture("openai_responses/r01-function-call.sse")
            .calls([Call("call_kL0PCQV7M2WMoVX8V8OtYSAL", "get_capital", r#"{"country":"France"}"#)])
            .usage([Some(255), Some(0), None, Some(16), Some(0)])
            .finish("tool_calls", "completed"),
        fixture("openai_responses/r02-reasoning-message-function-call.sse")
            .parts([
                Opaque(long(1080, "gAAAAABqaR3-pGgSyJcPT3y2", "-QScqnYrFieJls_UcqGK8PU=")),
                text("I’ll check the capital lookup tool for “PotatoLand.”"),
            ])
            .calls([Call("call_LabG58Uhrq9kZvR52BYKjToD", "get_capital", r#"{"country":"PotatoLand"}"#)])
            .usage([Some(63), Some(0), Some(0), Some(69), Some(26)])
            .finish("tool_calls", "completed"),
        fixture("openai_responses/r03-reasoning-function-call.sse")
            .parts([Opaque(long(3896, "gAAAAABoyXvxI6jwG5j6rvTG", "ztUnIVgXKYQko02bg-rk3VE="))])
            .calls([Call("call_CWXgs68YprAjp6t0371hiPOI", "final_result", r#"{"result":6666}"#)])
            .usage([Some(53), Some(0), None, Some(469), Some(448)])
            .finish("tool_calls", "completed"),
        // An `error` event then `response.failed` report one failure: insufficient_quota is a
        // billing state, permanent.
        fixture("openai_responses/r04-error-then-failed.chunks.txt").error(ErrorClass::Permanent, "insufficient_quota"),
        // GitHub Copilot rotates item ids between events of one item.
        fixture("openai_responses/r05-copilot-item-id-rotation.chunks.txt")
            .parts([
                Reasoning(exact("**Counting character occurrences**"), None),
                Text(long(138, "There are **3** letter *", "sitions **3, 8, and 9**.")),
            ])
            .usage([Some(19), Some(0), Some(0), Some(105), Some(44)])
            .finish("stop", "completed"),
        // Four summary parts, separated by a blank line, then the encrypted reasoning.
        fixture("openai_responses/r06-reasoning-summary-long.sse")
            .parts([
                Reasoning(long(2028, "**Providing street cross", " and easy to understand!"), None),
                Opaque(long(440, "gAAAAABoxC0m_QWpOlSt8wyP", "16P3dgWwgP5AtWmQ30zeXDs=")),
                Text(long(1251, "I'm not a road safety pr", "to your area. Stay safe!")),
            ])
            .usage([Some(13), Some(0), None, Some(1680), Some(1408)])
            .finish("stop", "completed"),
        // A server-side web_search_call item (its events are not content); 8320 cached.
        fixture("openai_responses/r07-web-search-cached.sse")
            .parts([
                Opaque(long(2616, "gAAAAABoydMADQ6HaJB8mYQX", "IrQyfBGZzhv8OB0H3cj9mBs=")),
                Opaque(long(2552, "gAAAAABoydMLww_4DcIPiCy5", "T-uv49Yp9cAfFBG23sC9lUQ=")),
                Text(long(212, "San Francisco weather to", "for the cooler evening. ")),
            ])
            .usage([Some(1143), Some(8320), None, Some(582), Some(512)])
            .finish("stop", "completed"),
        fixture("openai_responses/r08-xai-reasoning-cached.chunks.txt")
            .parts([
                Reasoning(long(766, "First, the question is: ", "features systematically."), None),
                Text(long(2849, "### Overview of Sonoran ", "r markets in Hermosillo.")),
            ])
            .usage([Some(24), Some(192), None, Some(923), Some(323)])
            .finish("stop", "completed"),
    ]
}

/// Gemini `streamGenerateContent?alt=sse`: `ai.google.dev/api/generate-content`. Output is
/// `candidatesTokenCount` plus `thoughtsTokenCount`; input is `promptTokenCount` plus
/// `toolUsePromptTokenCount` (tool results fed back to the model) less `cachedContentTokenCount`.
/// A call Gemini gave no id gets broca's `call_<responseId>_<n>`. A signature on a part closes
/// the reasoning before it (an empty reasoning part when none came before).
fn gemini() -> Vec<Case> {
    vec![
        // The signature arrives on an empty text part after the answer.
        fixture("google_generate_content/g01-text-signature-part.chunks.txt")
            .parts([
                text("There are **3** \"r\"s in strawberry.\n\nst**r**awbe**rr**y"),
                Reasoning(exact(""), Some(long(916, "EqsFCqgFAb4+9vvtAF5n87lB", "gy4xaNqwew3FwAG37eeWcow="))),
            ])
            .usage([Some(9), None, None, Some(208), Some(185)])
            .finish("stop", "STOP"),
        // STOP after a call is tool_calls; the empty text part in the last chunk adds nothing.
        fixture("google_generate_content/g02-tool-call.chunks.txt")
            .parts([Reasoning(exact(""), Some(long(396, "EqUCCqICAb4+9vsh8Pd5taZV", "1bEnpl4bPG5JUtm2yAMkHj4=")))])
            .calls([Call("call_b36LacjwM668nsEP2tbsgQQ_0", "weather", r#"{"location": "San Francisco"}"#)])
            .usage([Some(29), None, None, Some(60), Some(45)])
            .finish("tool_calls", "STOP"),
        fixture("google_generate_content/g03-tool-call-gemini3.chunks.txt")
            .parts([Reasoning(exact(""), Some(long(5488, "EpEgCo4gAb4+9vvWwdN+NkNi", "0hWS5rge8opgKivQw3YcJ1FX")))])
            .calls([Call("call_QHiLaa6LBrb8vdIPoNztsAg_0", "weather", r#"{"location": "San Francisco"}"#)])
            .usage([Some(29), None, None, Some(819), Some(804)])
            .finish("tool_calls", "STOP"),
        // promptTokenCount 15 in the early chunks, 13 in the last: the last report stands.
        fixture("google_generate_content/g04-usage-changes.sse")
            .parts([text("The capital of France is Paris.\n")])
            .usage([Some(13), None, None, Some(8), None])
            .finish("stop", "STOP"),
        fixture("google_generate_content/g05-thought-summaries.sse")
            .parts([
                Reasoning(
                    long(1575, "**Clarifying User Goals*", "stances or locations.\n\n\n"),
                    Some(long(6152, "CiIB0e2Kb6Syj1a961EfbWv4", "rw7oTiOIFZ1EgMKlqm/dH8k=")),
                ),
                Text(long(1938, "This is a great question", "river might not see you.")),
            ])
            .usage([Some(34), None, None, Some(1256), Some(787)])
            .finish("stop", "STOP"),
        fixture("google_generate_content/g06-tool-call-empty-args.sse")
            .parts([Reasoning(exact(""), Some(long(1408, "EpwICpkIAXLI2nxlU6gsWZaZ", "7NoL5owonoBDAXOk15QuFyU=")))])
            .calls([Call("call_QUVVadTSNJ6_qtsPvN7J8Q0_0", "get_country", "{}")])
            .usage([Some(29), None, None, Some(212), Some(202)])
            .finish("tool_calls", "STOP"),
        // totalTokenCount 772 = 17 prompt + 102 tool-use prompt + 241 candidates + 412 thoughts:
        // the search results fed back to the model are input too.
        fixture("google_generate_content/g07-search-grounding-tooluse-tokens.sse")
            .parts([Text(long(926, "### Weather in San Franc", " low throughout the day."))])
            .usage([Some(119), None, None, Some(653), Some(412)])
            .finish("stop", "STOP"),
        fixture("google_generate_content/g08-finish-safety.response.json")
            .usage([Some(14), None, None, None, None])
            .finish("content_filter", "SAFETY"),
        // A prompt blocked by Vertex's Model Armor: no candidates, a content-filter finish.
        fixture("google_generate_content/g09-prompt-blocked.response.json").finish("content_filter", "MODEL_ARMOR"),
        fixture("google_generate_content/g10-prompt-blocked-streamed.sse")
            .usage([Some(13), None, None, None, None])
            .finish("content_filter", "PROHIBITED_CONTENT"),
    ]
}

/// Bedrock ConverseStream: `docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html`
/// (event types, `metadata.usage`, the exception events) and the role's finish table (PF-42).
fn bedrock() -> Vec<Case> {
    vec![
        fixture("aws_bedrock_converse/b01-live-text.live.json")
            .parts([text("OK.")])
            .usage([Some(12), None, None, Some(5), None])
            .finish("stop", "end_turn"),
        // modelStreamErrorException ("the model stream failed", originally a 500): transient.
        fixture("aws_bedrock_converse/b02-model-stream-error.eventstream.base64.txt")
            .error(ErrorClass::Transient, "modelStreamErrorException"),
        fixture("aws_bedrock_converse/b03-nova-text.eventstream")
            .parts([Text(long(375, "The capital of France is", "\" or \"The City of Love.\""))])
            .usage([Some(13), None, None, Some(82), None])
            .finish("stop", "end_turn"),
        // Nova writes its thinking as tagged text: text, not reasoning.
        fixture("aws_bedrock_converse/b04-nova-tool-call.eventstream")
            .parts([Text(long(283, "<thinking> To find the t", "re in Paris.</thinking>\n"))])
            .calls([Call("tooluse_lAG_zP8QRHmSYOwZzzaCqA", "get_temperature", r#"{"city":"Paris"}"#)])
            .usage([Some(471), None, None, Some(91), None])
            .finish("tool_calls", "tool_use"),
        fixture("aws_bedrock_converse/b05-claude-redacted-reasoning.eventstream")
            .parts([
                Opaque(long(1080, "RXRrRUNrZ0lCeEFCR0FJcVFK", "MmpONnVpT1BPcDhuc0JnQg==")),
                Opaque(long(752, "RXFBRENrZ0lCeEFCR0FJcVFC", "K1FsSTNPSWh3ZUo4SVlBUT09")),
                Text(long(359, "I notice you've sent wha", "ike to talk about today?")),
            ])
            .usage([Some(92), None, None, Some(253), None])
            .finish("stop", "end_turn"),
        fixture("aws_bedrock_converse/b06-claude-reasoning.eventstream")
            .parts([
                Reasoning(
                    long(193, "The user has greeted me ", "w I can help them today."),
                    Some(long(496, "Eu0CCkgIBxABGAIqQJDccbDQ", "EXWJGtiQLMIm1o471iEYAQ==")),
                ),
                text("Hello! It's nice to meet you. How can I help you today?"),
            ])
            .usage([Some(36), None, None, Some(73), None])
            .finish("stop", "end_turn"),
    ]
}

#[test]
fn anthropic_messages_fixtures() {
    check_all(anthropic());
}

#[test]
fn openai_chat_fixtures() {
    check_all(openai_chat());
}

#[test]
fn openai_responses_fixtures() {
    check_all(openai_responses());
}

#[test]
fn google_generate_content_fixtures() {
    check_all(gemini());
}

#[test]
fn aws_bedrock_converse_fixtures() {
    check_all(bedrock());
}
