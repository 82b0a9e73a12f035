//! Bedrock's event-stream decoding (#29): the AWS event-stream framer and the Converse decoder
//! over mutants of the recorded cases in `testdata/eventstream/` (payload JSON mutated with its
//! CRCs recomputed, so the decoder sees it; bytes flipped, cut, spliced and repeated, so the
//! framer's CRC and size checks see them) and over random bytes. No input may panic, and
//! every event the decoder yields keeps the stream invariants (`sse::decode_stream`).

use broca::provider::event::Family;
use broca::provider::eventstream::encode;
use serde_json::Value;

use crate::sse::{decode_stream, fuzz_classifier};
use crate::{corpus, fuzz, Gen};

/// One message: its string headers and JSON payload.
type Message = (Vec<(String, String)>, Value);

/// The recorded cases: each a list of messages.
fn cases() -> Vec<Vec<Message>> {
    corpus("eventstream", ".json")
        .into_iter()
        .map(|(_, bytes)| {
            let messages: Vec<Value> = serde_json::from_slice(&bytes).expect("a case is JSON");
            messages
                .iter()
                .map(|m| m.get("message").unwrap_or(m))
                .map(|m| {
                    let headers = m["headers"].as_object().expect("headers");
                    let headers =
                        headers.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned())).collect();
                    (headers, m["payload"].clone())
                })
                .collect()
        })
        .collect()
}

const NAMES: &[&str] = &[
    "contentBlockIndex",
    "delta",
    "text",
    "toolUse",
    "input",
    "toolUseId",
    "name",
    "reasoningContent",
    "signature",
    "redactedContent",
    "stopReason",
    "usage",
    "inputTokens",
    "outputTokens",
    "cacheReadInputTokens",
    "start",
    "message",
];

fn mutant(g: &mut Gen, cases: &[Vec<Message>]) -> Vec<u8> {
    if g.chance(10) {
        let n = g.below(400);
        return g.bytes(n);
    }
    let case = g.pick(cases);
    let mut bytes = Vec::new();
    for (headers, payload) in case {
        let mut headers = headers.clone();
        if g.chance(12) {
            let kinds = ["messageStop", "metadata", "contentBlockStart", "exception", "", "contentBlockDelta"];
            headers[0].1 = (*g.pick(&kinds)).to_owned();
        }
        let mut payload = payload.clone();
        if g.chance(3) {
            g.mutate_json(&mut payload, NAMES);
        }
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let message = encode(&h, payload.to_string().as_bytes());
        let repeats = if g.chance(10) { 2 } else { 1 };
        for _ in 0..repeats {
            bytes.extend_from_slice(&message);
        }
    }
    if g.chance(6) {
        g.mutate_bytes(&mut bytes, b"");
    }
    bytes
}

#[test]
fn fuzz_eventstream_aws_bedrock_converse() {
    let cases = cases();
    assert!(cases.len() >= 5, "the Bedrock corpus");
    fuzz("eventstream.aws_bedrock_converse", 200, |g| {
        let bytes = mutant(g, &cases);
        decode_stream(g, Family::AwsBedrockConverse, &bytes);
        fuzz_classifier(g, Family::AwsBedrockConverse);
    });
}
