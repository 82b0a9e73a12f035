//! The three SSE decoders (Anthropic Messages, OpenAI Chat, OpenAI Responses) behind the real
//! SSE framer, over the recorded transcripts (`testdata/sse/`) mutated per event: an event's
//! JSON data mutated with the member names the family's streams use, events dropped, repeated,
//! swapped or taken from another family's stream, `event:` names changed, comments and CRLF
//! inserted, and byte-level damage; fed in random pieces as a socket delivers them. Also each
//! family's classifier of non-2xx bodies, over mutated error documents and any status.
//!
//! Each stream is decoded as the streamer does (the first error ends it) and checked: no panic,
//! errors typed and non-empty, every `ToolCallStart` index is the call's position and every
//! argument delta names a started call, finish reasons normalized, usage never negative.

use std::collections::BTreeSet;

use broca::provider::event::{Family, StreamEvent};
use broca::provider::wire;
use broca::record::ErrorClass;
use serde_json::{json, Value};

use crate::{corpus, fuzz, Gen};

/// The families whose recorded streams are SSE (`testdata/sse/`); Bedrock's event stream has
/// its own target (`eventstream`).
const FAMILIES: [(Family, &str); 5] = [
    (Family::AnthropicMessages, "anthropic_messages."),
    (Family::OpenaiChat, "openai_chat."),
    (Family::OpenaiResponses, "openai_responses."),
    (Family::GoogleGenerateContent, "google_generate_content."),
    (Family::GoogleCodeAssist, "google_code_assist."),
];

/// One recorded stream, as its events (the text between blank lines).
struct Transcript {
    family: Family,
    events: Vec<String>,
}

fn transcripts() -> Vec<Transcript> {
    corpus("sse", ".sse")
        .into_iter()
        .map(|(name, bytes)| {
            let family = FAMILIES.iter().find(|(_, p)| name.starts_with(p)).expect("a family prefix").0;
            let text = String::from_utf8(bytes).expect("recorded streams are UTF-8").replace("\r\n", "\n");
            let events = text.split("\n\n").filter(|e| !e.trim().is_empty()).map(str::to_owned).collect();
            Transcript { family, events }
        })
        .collect()
}

/// Member names and `event:`/`type` names the family's recorded streams use.
fn names_of(ts: &[Transcript], family: Family) -> Vec<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::String(s) if s.contains('.') || s.contains('_') => {
                out.insert(s.clone());
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for t in ts.iter().filter(|t| t.family == family) {
        for e in &t.events {
            for line in e.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    if let Ok(v) = serde_json::from_str::<Value>(data) {
                        walk(&v, &mut out);
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

/// One event mutated: its JSON data (the structure), its `event:` name, or its lines.
fn mutate_event(g: &mut Gen, event: &str, names: &[&str]) -> String {
    let mut lines: Vec<String> = event.lines().map(str::to_owned).collect();
    match g.below(6) {
        0..=2 => {
            for line in lines.iter_mut() {
                if let Some(data) = line.strip_prefix("data: ") {
                    if let Ok(mut v) = serde_json::from_str::<Value>(data) {
                        if g.chance(3) {
                            g.mutate_json_typed(&mut v);
                        } else {
                            g.mutate_json(&mut v, names);
                        }
                        // Type names are swapped too, so a mutant reaches other arms.
                        if g.chance(3) {
                            if let Some(obj) = v.as_object_mut() {
                                obj.insert("type".into(), json!(g.pick(names)));
                            }
                        }
                        *line = format!("data: {v}");
                    }
                }
            }
        }
        3 => {
            let name = if g.chance(2) { g.pick(names).to_string() } else { String::new() };
            lines.retain(|l| !l.starts_with("event:"));
            lines.insert(0, format!("event: {name}"));
        }
        4 => {
            let at = g.below(lines.len() + 1);
            let extra = g.pick(&[": keepalive", "data:", "data: [DONE]", "id: 7", "retry: NaN", "data: {", ":"]);
            lines.insert(at, (*extra).to_owned());
        }
        _ => {
            let mut bytes = event.as_bytes().to_vec();
            g.mutate_bytes(&mut bytes, b"data: {\"type\":\"x\"}\n");
            return String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    lines.join("\n")
}

/// A mutated stream of `family` as bytes.
fn mutant_stream(g: &mut Gen, ts: &[Transcript], family: Family, names: &[&str]) -> Vec<u8> {
    let own: Vec<&Transcript> = ts.iter().filter(|t| t.family == family).collect();
    let mut events = g.pick(&own).events.clone();
    for _ in 0..g.range(1, 5) {
        if events.is_empty() {
            break;
        }
        let i = g.below(events.len());
        match g.below(7) {
            0..=3 => events[i] = mutate_event(g, &events[i], names),
            4 => {
                events.remove(i);
            }
            5 => {
                let e = events[i].clone();
                let j = g.below(events.len() + 1);
                events.insert(j, e);
            }
            _ => {
                let other = g.pick(ts);
                if !other.events.is_empty() {
                    let e = g.pick(&other.events).clone();
                    events.insert(i, e);
                }
            }
        }
    }
    let sep = if g.chance(5) { "\r\n" } else { "\n" };
    let mut text = events.iter().map(|e| e.replace('\n', sep)).collect::<Vec<_>>().join(&format!("{sep}{sep}"));
    if !g.chance(6) {
        text.push_str(sep);
        text.push_str(sep);
    }
    let mut bytes = text.into_bytes();
    if g.chance(8) {
        g.mutate_bytes(&mut bytes, b"");
    }
    bytes
}

const FINISH_REASONS: [&str; 7] = ["stop", "length", "tool_calls", "content_filter", "refusal", "error", "other"];

/// Decodes `bytes` as the streamer does (the family's own framing) and checks every event the
/// decoder produced.
pub(crate) fn decode_stream(g: &mut Gen, family: Family, bytes: &[u8]) {
    let mut framer = wire::wire(family).framer();
    let mut decoder = wire::wire(family).decoder();
    let mut starts = 0usize;
    let mut fed = 0;
    let mut out = Vec::new();
    loop {
        let pushed = if fed == bytes.len() {
            framer.finish()
        } else {
            let n = g.range(1, (bytes.len() - fed).min(300) + 1);
            fed += n;
            framer.push(&bytes[fed - n..fed])
        };
        let pushed = match pushed {
            Ok(p) => p,
            Err(e) => return assert!(!e.0.is_empty()),
        };
        for sse in &pushed.events {
            out.clear();
            match decoder.decode(sse, &mut out) {
                Ok(_class) => {}
                Err(e) => return assert!(!e.0.is_empty()),
            }
            for ev in &out {
                match ev {
                    StreamEvent::ToolCallStart { index, .. } => {
                        assert_eq!(*index, starts, "a ToolCallStart index is the call's position");
                        starts += 1;
                    }
                    StreamEvent::ToolCallArgsDelta { index, .. } => {
                        assert!(*index < starts, "arguments for call {index} of {starts} started")
                    }
                    StreamEvent::Finish { reason, .. } => {
                        assert!(FINISH_REASONS.contains(&reason.as_str()), "{reason}")
                    }
                    StreamEvent::Error { error } => assert!(!error.message.is_empty()),
                    _ => {}
                }
                // Every event is a value the attempt record can carry.
                serde_json::to_vec(ev).expect("stream events serialize");
            }
        }
        if fed == bytes.len() && pushed.events.is_empty() {
            let _ = decoder.finished();
            return;
        }
    }
}

/// The family's non-2xx classifier over a mutated error document and any status.
pub(crate) fn fuzz_classifier(g: &mut Gen, family: Family) {
    let doc = match family {
        Family::AnthropicMessages => {
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        }
        Family::AwsBedrockConverse => json!({"message": "Too many requests, please wait before trying again."}),
        _ => {
            json!({"error": {"type": "requests", "code": "rate_limit_exceeded", "message": "slow down", "param": null}})
        }
    };
    let body = if g.chance(2) {
        g.mutant_bytes(&doc, &["error", "type", "code", "message"])
    } else {
        let n = g.below(64);
        g.bytes(n)
    };
    let status = *g.pick(&[400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 529, 0, 999, u16::MAX]);
    let error = wire::wire(family).classify_error(status, &body);
    assert_eq!(error.http_status, Some(status));
    assert!(!error.message.is_empty(), "{error:?}");
    if status == 401 {
        assert_eq!(error.class, ErrorClass::AuthRequired);
    } else if (500..=599).contains(&status) {
        assert_eq!(error.class, ErrorClass::Transient, "{error:?}");
    }
}

fn fuzz_family(target: &str, family: Family) {
    let ts = transcripts();
    let names = names_of(&ts, family);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    fuzz(target, 200, |g| {
        let bytes = mutant_stream(g, &ts, family, &names);
        decode_stream(g, family, &bytes);
        fuzz_classifier(g, family);
    });
}

#[test]
fn fuzz_sse_anthropic_messages() {
    fuzz_family("sse.anthropic_messages", Family::AnthropicMessages);
}

#[test]
fn fuzz_sse_openai_chat() {
    fuzz_family("sse.openai_chat", Family::OpenaiChat);
}

#[test]
fn fuzz_sse_openai_responses() {
    fuzz_family("sse.openai_responses", Family::OpenaiResponses);
}

#[test]
fn fuzz_sse_google_code_assist() {
    fuzz_family("sse.google_code_assist", Family::GoogleCodeAssist);
}

#[test]
fn fuzz_sse_google_generate_content() {
    fuzz_family("sse.google_generate_content", Family::GoogleGenerateContent);
}
