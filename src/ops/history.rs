//! `session.history` (llm-runner/v1 §4.6 `host_history`, §4.7 `history_display`): the same
//! entries `session.read` serves, paged backward and forward with opaque older/newer cursors,
//! raw or as display rows. broca is its own host: the history is the whole append-only lineage,
//! its version 0.

use cortexkit_role_llm_runner::display::{DisplayPart, DisplayRow, Limits, OtherPart, TextPart, ToolCallPart};
use cortexkit_role_llm_runner::display::{FilePart, ToolResultPart};
use serde::Serialize;
use serde_json::Value;

use super::read::{frame_fits, role_name, within_bytes};
use super::Ops;
use crate::lineage::projection::{mid, served_ordinal};
use crate::lineage::read::{self, Entry};
use crate::lineage::reader::Reader;
use crate::message::{Message, Part};
use crate::op::Op;
use crate::session_key::SessionKey;
use crate::wire::history::{newer_cursor, older_cursor, HistoryRequest, HistorySeek, Named};
use crate::wire::read::UNWRITTEN_INCARNATION;
use crate::wire::requests::unknown_mid;
use crate::wire::{Refusal, RefusalCode};

/// A raw history entry: the read envelope with its required write time.
#[derive(Serialize)]
struct RawEntry<'a> {
    ordinal: u64,
    mid: String,
    /// The body exactly as `session.read` serves it (never what broca keeps beside it).
    message: crate::wire::read::MessageBody<'a>,
    role: &'static str,
    written_at: u64,
}

/// A display entry: the canonical row in place of the body.
#[derive(Serialize)]
struct DisplayEntry {
    ordinal: u64,
    mid: String,
    written_at: u64,
    row: DisplayRow,
}

#[derive(Serialize)]
struct HistoryPage<T> {
    messages: Vec<T>,
    history_version: u64,
    incarnation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    older: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    newer: Option<String>,
}

pub(super) fn session_history(
    ops: &Ops,
    key: &SessionKey,
    request: HistoryRequest,
    version: u64,
) -> Result<Value, Refusal> {
    let lineage_id = key.addr();
    let Some(reader) = Reader::open(ops.registry.shared(), key) else {
        super::read::history_reachable(ops, key)?;
        if request.named != Named::Newest {
            return Err(missing(&request, 1));
        }
        let page = HistoryPage::<RawEntry> {
            messages: Vec::new(),
            history_version: version,
            incarnation: UNWRITTEN_INCARNATION.into(),
            older: None,
            newer: None,
        };
        return Ok(super::body(page));
    };
    let len = read::transcript(&reader, u64::MAX, 0).map_err(|e| e.refusal())?.prompt_len;
    // The served range [first, end) before the byte cap; `forward` pages keep their first
    // entries under the cap, backward ones their last.
    let (first, end, forward) = match request.seek {
        HistorySeek::Newest => (len.saturating_sub(request.limit) + 1, len + 1, false),
        HistorySeek::From(n) if n > len => return Err(missing(&request, n)),
        HistorySeek::From(n) => (n, (n + request.limit).min(len + 1), true),
        HistorySeek::Before(n) if n > len && !(request.named == Named::Cursor && n == len + 1) => {
            return Err(missing(&request, n))
        }
        HistorySeek::Before(n) => (n.saturating_sub(request.limit).max(1), n, false),
    };
    let (entries, page) = read::entries(&reader, first - 1, end - first).map_err(|e| e.refusal())?;
    // Every entry needs its creation time; one without it makes the whole page unrepresentable.
    if let Some(e) = entries.iter().find(|e| e.written_at.is_none()) {
        return Err(unrepresentable(served_ordinal(e.ordinal)));
    }
    let sizes: Vec<usize> = entries.iter().map(|e| serde_json::to_vec(&raw(e)).map_or(0, |b| b.len() + 1)).collect();
    let (skip, take) = within_bytes(&sizes, request.max_bytes, !forward);
    let kept = &entries[skip..skip + take];
    let (lo, hi) = match (kept.first(), kept.last()) {
        (Some(a), Some(b)) => (served_ordinal(a.ordinal), served_ordinal(b.ordinal) + 1),
        _ => (first, first),
    };
    let older = (lo > 1).then(|| older_cursor(&lineage_id, lo));
    let newer = (hi <= len).then(|| newer_cursor(&lineage_id, hi));
    let incarnation = page.incarnation.clone();
    let body = if request.display {
        let ordinals: Vec<u64> = kept.iter().map(|e| e.ordinal).collect();
        let mut refs = super::refs::descriptors(&reader, key, &page, &ordinals)?;
        let messages = kept
            .iter()
            .map(|e| DisplayEntry {
                ordinal: served_ordinal(e.ordinal),
                mid: mid(e.ordinal),
                written_at: e.written_at.unwrap_or_default(),
                row: with_descriptors(row(&e.message, request.limits.as_ref()), refs.remove(&e.ordinal)),
            })
            .collect();
        let page = HistoryPage { messages, history_version: version, incarnation, older, newer };
        super::body(page)
    } else {
        let messages = kept.iter().map(raw).collect();
        super::body(HistoryPage { messages, history_version: version, incarnation, older, newer })
    };
    frame_fits(Op::SessionHistory.name(), &body, key, lo)?;
    Ok(body)
}

fn raw(e: &Entry) -> RawEntry<'_> {
    RawEntry {
        ordinal: served_ordinal(e.ordinal),
        mid: mid(e.ordinal),
        message: crate::wire::read::MessageBody::of(&e.message),
        role: role_name(e.message.role),
        written_at: e.written_at.unwrap_or_default(),
    }
}

/// The refusal for a position that names no entry, by how it was named.
fn missing(request: &HistoryRequest, ordinal: u64) -> Refusal {
    match request.named {
        Named::Mid => unknown_mid(&format!("m{ordinal}")),
        Named::Cursor => Refusal::new(
            RefusalCode::CursorExpired,
            "the cursor names an entry this session no longer holds",
            Some(crate::detail!("field" => "cursor")),
        ),
        Named::Ordinal | Named::Newest => Refusal::new(
            RefusalCode::UnknownOrdinal,
            format!("no entry with ordinal {ordinal} in this session"),
            Some(crate::detail!("ordinal" => ordinal)),
        ),
    }
}

/// `history_unrepresentable` (spec §4): an entry has no recorded creation time.
fn unrepresentable(ordinal: u64) -> Refusal {
    let message = format!(
        "session.history cannot represent entry {ordinal}: no creation time was recorded for it (session.read serves it)"
    );
    let detail = crate::detail!("ordinal" => ordinal, "field" => "written_at", "class" => "permanent");
    Refusal::new(RefusalCode::HistoryUnrepresentable, message, Some(detail))
}

/// `row` with its message's output-reference descriptors (llm-runner §9.13): the reply set on
/// the row, each call set on its tool-call part. Display rows alone carry them.
fn with_descriptors(mut row: DisplayRow, sets: Option<super::refs::MessageDescriptors>) -> DisplayRow {
    for (part, descriptor) in sets.into_iter().flatten() {
        match part {
            None => row.output_refs = Some(descriptor),
            Some(i) => {
                if let Some(DisplayPart::ToolCall(call)) = row.parts.get_mut(i) {
                    call.output_refs = Some(descriptor);
                }
            }
        }
    }
    row
}

/// The display row of a broca message (its own profile: the contract leaves the projection of
/// a runner-owned profile to the runner). Parts keep stored order, keyed `p<index>`; an
/// assistant row names the model its origin recorded.
pub fn row(message: &Message, limits: Option<&Limits>) -> DisplayRow {
    let parts = message
        .content
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let key = format!("p{i}");
            match part {
                Part::Text { text } => DisplayPart::Text(TextPart::new(key, text.as_str())),
                Part::Reasoning { text, .. } => DisplayPart::Reasoning(TextPart::new(key, text.as_str())),
                Part::RedactedReasoning { .. } => DisplayPart::Other(OtherPart::new(key, "redacted_reasoning")),
                Part::ToolCall { tool_call_id, tool_name, input } => {
                    DisplayPart::ToolCall(ToolCallPart::new(key, tool_call_id, tool_name, input, limits))
                }
                Part::ToolResult { tool_call_id, output, is_error } => {
                    let content = crate::message::tool_result_content(output);
                    let files: Vec<FilePart> = Vec::new();
                    DisplayPart::ToolResult(ToolResultPart::new(key, tool_call_id, *is_error, &content, files, limits))
                }
                Part::Image { .. } => DisplayPart::Other(OtherPart::new(key, "image")),
            }
        })
        .collect();
    let mut row = DisplayRow::new(role_name(message.role), parts);
    if let Some(sender) = &message.sender {
        row = row.with_sender(sender.as_str());
    }
    if let Some(id) = &message.client_message_id {
        row = row.with_client_message_id(id.as_str());
    }
    if let Some(origin) = &message.origin {
        let provider = origin.get("provider_module_id").and_then(Value::as_str);
        let model = origin.get("model_id").and_then(Value::as_str);
        if let (Some(provider), Some(model)) = (provider, model) {
            row = row.with_model(format!("{provider}/{model}"));
        }
    }
    row
}
