//! `session.read {media: "descriptors"}` (llm-runner 0.8.0 §4.1–§4.2): an `owned-broca` message
//! with its byte-backed media and its large payloads replaced by refs, and the identities of
//! what is stored. This module only says where broca's schema keeps a payload
//! ([`payloads`]); the role crate's `read::descriptors` builds the refs and picks which
//! payloads to replace ([`describe`]), and its `content_digest` gives the digests.
//!
//! - Part keys are the display rows' (`p<index>`), one per top-level `content` part.
//! - A text part is replaced whole by a top-level `text_ref` carrying its key, and a top-level
//!   image by a `media_ref` carrying its key. Everything else is a nested ref without one: a
//!   call's `input` (`args_ref`, its id and name stay beside it), reasoning's `text` or `data`
//!   (`reasoning_ref`, its signature stays), and inside a tool result's `output` its text, JSON,
//!   error message or content parts (`text_ref`, an image `media_ref`); the call id and
//!   `is_error` stay.
//! - A media ref hashes the decoded image bytes; its dimensions come from the image's own
//!   header ([`image_size`]), never from what the provider claimed.

use base64::Engine;
use cortexkit_role_llm_runner::content_digest::content_digest;
use cortexkit_role_llm_runner::read::descriptors::{self, PartDigest, Payload, Reference, DESCRIPTOR_MESSAGE_MAX};
use serde_json::Value;

use crate::message::{ContentOutput, Message, OutputPart, Part};

/// The key of a message's `index`th top-level part, as display rows and `part_digests` name it.
pub fn part_key(index: usize) -> String {
    format!("p{index}")
}

/// A stored message's identities: its inline body, its `digest` and one `part_digests` row per
/// top-level part, in order (llm-runner §4.2: over the full stored message and parts).
pub struct Identities {
    pub inline: Value,
    pub digest: String,
    pub part_digests: Vec<PartDigest>,
}

/// The identities of `message`, over its served body: its role, content and origin, exactly
/// what an inline read serves as `message` (never a member the envelope carries instead).
pub fn identities(message: &Message) -> Identities {
    let inline = serde_json::to_value(super::read::MessageBody::of(message)).unwrap_or(Value::Null);
    let digest = content_digest(&inline);
    let parts = inline.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let part_digests = parts.iter().enumerate().map(|(i, part)| PartDigest::new(part_key(i), part)).collect();
    Identities { inline, digest, part_digests }
}

/// Why a message cannot be described within [`DESCRIPTOR_MESSAGE_MAX`]: what is left once
/// every payload is a ref (ids, names, keys, the envelope) is over the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StructureTooLarge {
    pub limit: usize,
}

/// `inline` (the stored `message`, [`identities`]) described: every byte-backed image and
/// every payload over `PART_INLINE_MAX` a ref, then more payloads, largest first, until the
/// whole encoded entry (`envelope` bytes besides its `message`) fits [`DESCRIPTOR_MESSAGE_MAX`].
/// The same message and envelope always give the same bytes.
pub fn describe(message: &Message, inline: &Value, envelope: usize) -> Result<Value, StructureTooLarge> {
    let budget = DESCRIPTOR_MESSAGE_MAX.saturating_sub(envelope);
    descriptors::describe(inline, &payloads(message), budget)
        .map_err(|_| StructureTooLarge { limit: DESCRIPTOR_MESSAGE_MAX })
}

/// Where `message`'s payloads are, in part order, each with its ref.
pub fn payloads(message: &Message) -> Vec<Payload> {
    let mut out = Vec::new();
    let optional = |pointer: String, reference: Reference| Payload { pointer, reference, required: false };
    for (i, part) in message.content.iter().enumerate() {
        let at = format!("/content/{i}");
        match part {
            Part::Text { text } => out.push(optional(at, Reference::text(Some(part_key(i)), text))),
            Part::Reasoning { text, .. } => {
                out.push(optional(format!("{at}/text"), Reference::reasoning(None, text.as_bytes())));
            }
            Part::RedactedReasoning { data } => {
                out.push(optional(format!("{at}/data"), Reference::reasoning(None, data.as_bytes())));
            }
            Part::ToolCall { tool_name, input, .. } => {
                let bytes = serde_json::to_vec(input).unwrap_or_default();
                out.push(optional(format!("{at}/input"), Reference::arguments(None, tool_name.as_str(), &bytes)));
            }
            Part::ToolResult { output, .. } => output_payloads(&format!("{at}/output"), output, &mut out),
            Part::Image { media_type, data } => {
                if let Some(reference) = media(Some(part_key(i)), media_type, data) {
                    out.push(Payload { pointer: at, reference, required: true });
                }
            }
        }
    }
    out
}

/// The payloads of a tool result's stored `output` at `at`.
fn output_payloads(at: &str, output: &Value, out: &mut Vec<Payload>) {
    let optional = |pointer: String, reference: Reference| Payload { pointer, reference, required: false };
    if let Some(content) = ContentOutput::of(output) {
        for (j, part) in content.content.iter().enumerate() {
            let at = format!("{at}/content/{j}");
            match part {
                OutputPart::Text { text } => out.push(optional(format!("{at}/text"), Reference::text(None, text))),
                OutputPart::Image { media_type, data, .. } => {
                    if let Some(reference) = media(None, media_type, data) {
                        out.push(Payload { pointer: at, reference, required: true });
                    }
                }
            }
        }
        return;
    }
    let member = match output.get("kind").and_then(Value::as_str) {
        Some("text") => "text",
        Some("error") => "message",
        Some("json") => "json",
        _ => return,
    };
    match output.get(member) {
        Some(Value::String(text)) => out.push(optional(format!("{at}/{member}"), Reference::text(None, text))),
        // A legacy JSON body: the text the model reads is its compact JSON.
        Some(json) if member == "json" => {
            let text = serde_json::to_string(json).unwrap_or_default();
            out.push(optional(format!("{at}/{member}"), Reference::text(None, &text)));
        }
        _ => {}
    }
}

/// A stored image as a `media_ref` over its decoded bytes; `None` when its data is not
/// standard base64 (never stored by broca's own paths: such an image stays inline).
fn media(part: Option<String>, media_type: &str, data: &str) -> Option<Reference> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(data).ok()?;
    Some(Reference::media(part, "image", media_type, &bytes, image_size(&bytes)))
}

/// An image's pixel dimensions, read from its header: PNG (IHDR), GIF (logical screen), JPEG
/// (the first start-of-frame marker) and WebP (VP8, VP8L, VP8X); `None` for anything else.
pub fn image_size(bytes: &[u8]) -> Option<(u64, u64)> {
    let le16 = |at: usize| Some(u64::from(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?)));
    let be32 = |at: usize| Some(u64::from(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?)));
    let le24 = |at: usize| {
        let b = bytes.get(at..at + 3)?;
        Some(u64::from(b[0]) | u64::from(b[1]) << 8 | u64::from(b[2]) << 16)
    };
    let size = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.get(12..16) == Some(b"IHDR") {
        (be32(16)?, be32(20)?)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        (le16(6)?, le16(8)?)
    } else if bytes.starts_with(&[0xFF, 0xD8]) {
        jpeg_size(bytes)?
    } else if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        match bytes.get(12..16)? {
            b"VP8 " if bytes.get(23..26) == Some(&[0x9D, 0x01, 0x2A]) => (le16(26)? & 0x3FFF, le16(28)? & 0x3FFF),
            b"VP8L" if bytes.get(20) == Some(&0x2F) => {
                let bits = u64::from(u32::from_le_bytes(bytes.get(21..25)?.try_into().ok()?));
                ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
            }
            b"VP8X" => (le24(24)? + 1, le24(27)? + 1),
            _ => return None,
        }
    } else {
        return None;
    };
    (size.0 > 0 && size.1 > 0).then_some(size)
}

/// A JPEG's dimensions from its first SOF marker (any of C0–CF but C4, C8 and CC).
fn jpeg_size(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut at = 2;
    loop {
        while bytes.get(at) == Some(&0xFF) && bytes.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        if bytes.get(at) != Some(&0xFF) {
            return None;
        }
        let marker = *bytes.get(at + 1)?;
        let length = usize::from(u16::from_be_bytes(bytes.get(at + 2..at + 4)?.try_into().ok()?));
        if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
            let height = u16::from_be_bytes(bytes.get(at + 5..at + 7)?.try_into().ok()?);
            let width = u16::from_be_bytes(bytes.get(at + 7..at + 9)?.try_into().ok()?);
            return Some((u64::from(width), u64::from(height)));
        }
        at = at.checked_add(2 + length)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;
    use cortexkit_role_llm_runner::content_digest::sha256_hex;
    use cortexkit_role_llm_runner::read::descriptors::PART_INLINE_MAX;
    use cortexkit_role_llm_runner::read::ReadMessage;
    use serde_json::json;

    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+ip1sAAAAASUVORK5CYII=";

    fn png() -> Vec<u8> {
        base64::engine::general_purpose::STANDARD.decode(PNG).unwrap()
    }

    fn served(message: &Message) -> ReadMessage {
        let ids = identities(message);
        let mut read = ReadMessage::new(1, "m1", describe(message, &ids.inline, 200).unwrap());
        read.digest = Some(ids.digest);
        read.part_digests = Some(ids.part_digests);
        read
    }

    #[test]
    fn a_nested_image_is_a_media_ref_over_decoded_bytes_and_keys_are_display_keys() {
        let output = json!({"kind": "content", "content": [
            {"type": "text", "text": "shot"},
            {"type": "image", "media_type": "image/png", "data": PNG, "width": 9, "height": 9},
        ]});
        let message =
            Message::of(Role::Tool, vec![Part::ToolResult { tool_call_id: "c1".into(), output, is_error: false }]);
        let read = served(&message);
        let keys = vec!["p0".to_owned()];
        read.check_descriptors(&keys).unwrap();
        read.check_descriptor_rows(cortexkit_role_llm_runner::serializer_profile::OWNED_BROCA).unwrap();
        let bytes = png();
        assert_eq!(
            read.message["content"][0],
            json!({"type": "tool_result", "tool_call_id": "c1", "is_error": false, "output": {"kind": "content", "content": [
                {"type": "text", "text": "shot"},
                {"type": "media_ref", "kind": "image", "mime": "image/png", "byte_size": bytes.len(),
                 "sha256": sha256_hex(&bytes), "width": 1, "height": 1},
            ]}})
        );
        assert_eq!(read.digest.as_deref(), Some(content_digest(&serde_json::to_value(&message).unwrap()).as_str()));
    }

    #[test]
    fn large_payloads_become_refs_in_place_keeping_ids_names_and_signatures() {
        let big = "x".repeat(PART_INLINE_MAX + 1);
        let message = Message {
            role: Role::Assistant,
            content: vec![
                Part::Reasoning { text: big.clone(), signature: Some("sig".into()) },
                Part::Text { text: big.clone() },
                Part::ToolCall { tool_call_id: "c1".into(), tool_name: "echo".into(), input: json!({"a": big}) },
                Part::Image { media_type: "image/png".into(), data: PNG.into() },
            ],
            origin: None,
            delivered_as: None,
            sender: None,
            client_message_id: None,
        };
        let read = served(&message);
        let content = &read.message["content"];
        assert_eq!(content[0]["signature"], "sig");
        assert_eq!(content[0]["text"]["type"], "reasoning_ref");
        assert_eq!((content[1]["type"].as_str(), content[1]["part"].as_str()), (Some("text_ref"), Some("p1")));
        assert_eq!((content[2]["tool_call_id"].as_str(), content[2]["tool_name"].as_str()), (Some("c1"), Some("echo")));
        assert_eq!(
            (content[2]["input"]["type"].as_str(), content[2]["input"]["name"].as_str()),
            (Some("args_ref"), Some("echo"))
        );
        assert_eq!((content[3]["type"].as_str(), content[3]["part"].as_str()), (Some("media_ref"), Some("p3")));
        read.check_descriptors(&["p0", "p1", "p2", "p3"].map(String::from)).unwrap();
    }

    #[test]
    fn structure_over_the_budget_is_refused_by_name() {
        let message = Message::user_text("hi");
        let ids = identities(&message);
        assert_eq!(
            describe(&message, &ids.inline, DESCRIPTOR_MESSAGE_MAX),
            Err(StructureTooLarge { limit: DESCRIPTOR_MESSAGE_MAX })
        );
    }

    #[test]
    fn dimensions_come_from_the_image_header_only() {
        assert_eq!(image_size(&png()), Some((1, 1)));
        let gif = b"GIF89a\x03\x00\x02\x00";
        assert_eq!(image_size(gif), Some((3, 2)));
        let jpeg = [0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0, 0xFF, 0xC0, 0, 11, 8, 0, 5, 0, 7];
        assert_eq!(image_size(&jpeg), Some((7, 5)));
        let mut webp = b"RIFF\0\0\0\0WEBPVP8X\0\0\0\0\0\0\0\0".to_vec();
        webp.extend_from_slice(&[9, 0, 0, 4, 0, 0]);
        assert_eq!(image_size(&webp), Some((10, 5)));
        for junk in [&b""[..], b"\x89PNG", b"GIF89a\x00\x00\x01\x00", &[0xFF, 0xD8, 0xFF], b"not an image"] {
            assert_eq!(image_size(junk), None, "{junk:?}");
        }
    }
}
