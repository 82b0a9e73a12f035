//! `session.read` and `session.head`: strict reads that never open the session's actor. The
//! transcript is the store prefix ⊕ the WAL tail (`lineage::read::entries`); internal ordinals
//! count from 0 and are served from 1 (`projection::mid`).

use cortexkit_role_llm_runner::read::MediaMode;
use serde_json::{json, Value};

use super::Ops;
use crate::lineage::projection::{mid, served_ordinal};
use crate::lineage::read::{self, Entry, TranscriptPage};
use crate::lineage::reader::Reader;
use crate::message::{Message, Role};
use crate::op::Op;
use crate::record::FinishReason;
use crate::replay::{EpisodeStatus, Resolution};
use crate::session_key::SessionKey;
use crate::wire::descriptors;
use crate::wire::read::{
    EntryMessage, HeadCache, HeadMeta, HeadModel, LastRunError, LastRunState, ReadEntry, ReadPage, ReadTool,
    ReadToolCall, RunAttribution, SessionUsage, UNWRITTEN_INCARNATION,
};
use crate::wire::requests::{unknown_mid, ReadCursor, ReadRequest, READ_MAX_BYTES};
use crate::wire::status::RunState;
use crate::wire::{Refusal, RefusalCode};

/// The page byte cap (spec §4: default and maximum 3 MiB of serialized reply body).
pub const MAX_BYTES: u64 = READ_MAX_BYTES;
/// Bytes reserved for the page's envelope (`result`, state, cursors) within the byte cap.
const PAGE_OVERHEAD: usize = 512;

fn state_name(r: &Resolution) -> &'static str {
    match r {
        Resolution::Empty => "empty",
        Resolution::Idle { .. } => "idle",
        Resolution::Paused { .. } => "paused",
        Resolution::Resume { .. } => "active",
    }
}

pub(super) fn role_name(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::System => "system",
    }
}

/// Refuses `history_unreachable` when the run index proves the session has history (its
/// checkpoint row) and no WAL here holds it (spec §15): an empty page would deny that history.
pub(super) fn history_reachable(ops: &Ops, key: &SessionKey) -> Result<(), Refusal> {
    let addr = key.addr();
    match ops.registry.shared().store.checkpoint(&addr) {
        Ok(Some(_)) => Err(Refusal::new(
            RefusalCode::HistoryUnreachable,
            "the run index records history for this session that no WAL on this host holds",
            Some(crate::detail!("class" => "permanent", "session_ref" => addr)),
        )),
        // An unreadable index proves nothing: the read answers what the WALs hold.
        Ok(None) | Err(_) => Ok(()),
    }
}

/// `version` is the session's history version (`super::expiry::record_version`).
pub(super) fn session_read(ops: &Ops, key: &SessionKey, request: ReadRequest, version: u64) -> Result<Value, Refusal> {
    let lineage_id = key.addr();
    let Some(reader) = Reader::open(ops.registry.shared(), key) else {
        history_reachable(ops, key)?;
        if let ReadCursor::After(o) = request.cursor {
            return Err(unknown_mid(&format!("m{o}")));
        }
        return Ok(super::body(ReadPage {
            messages: Vec::new(),
            history_version: version,
            incarnation: UNWRITTEN_INCARNATION.into(),
            next_from_ordinal: None,
            head: None,
            lineage_id,
            lineage_state: "empty",
            tools: None,
            tools_run_id: None,
        }));
    };
    // Internal (0-based) start of the range; the newest page needs the length first.
    let start = match request.cursor {
        ReadCursor::From(served) => served - 1,
        ReadCursor::After(served) => served,
        ReadCursor::Tail => {
            let len = read::transcript(&reader, u64::MAX, 0).map_err(|e| e.refusal())?.prompt_len;
            len.saturating_sub(request.limit)
        }
    };
    // One entry past the page tells whether its last entry is its run's last message.
    let (mut entries, page) = read::entries(&reader, start, request.limit + 1).map_err(|e| e.refusal())?;
    if let ReadCursor::After(served) = request.cursor {
        if served > page.prompt_len {
            return Err(unknown_mid(&format!("m{served}")));
        }
    }
    let peek = (entries.len() as u64 > request.limit).then(|| entries.pop()).flatten();
    let mut calls = dispatch_facts(&reader, &entries)?;
    let items = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let next = entries.get(i + 1).or(peek.as_ref());
            let entry = ReadEntry {
                ordinal: served_ordinal(e.ordinal),
                mid: mid(e.ordinal),
                message: EntryMessage::Stored(&e.message),
                run: attribution(e, next, &page),
                tool_calls: calls.remove(&e.ordinal),
                role: role_name(e.message.role),
                written_at: e.written_at,
                delivered_as: e.message.delivered_as.as_ref(),
                digest: None,
                part_digests: None,
            };
            match request.media {
                MediaMode::Descriptors => described(entry, &e.message, key),
                _ => Ok(entry),
            }
        })
        .collect::<Result<Vec<ReadEntry>, Refusal>>()?;
    let sizes: Vec<usize> = items.iter().map(|i| serde_json::to_vec(i).map_or(0, |b| b.len() + 1)).collect();
    let (skip, take) = within_bytes(&sizes, request.max_bytes, request.cursor == ReadCursor::Tail);
    let end = start + (skip + take) as u64;
    let first = start + skip as u64;
    let (tools, tools_run_id) = match (request.include_tools, page.state.last.as_ref()) {
        (true, Some(e)) => {
            let tools = e.config.config().map(|c| {
                c.tools
                    .iter()
                    .map(|t| ReadTool {
                        name: &t.name,
                        description: &t.description,
                        input_schema: &t.input_schema,
                        module: t.module.as_deref(),
                    })
                    .collect()
            });
            (tools, Some(e.run_id.clone()))
        }
        _ => (None, None),
    };
    let answer = ReadPage {
        messages: items.into_iter().skip(skip).take(take).collect(),
        history_version: version,
        incarnation: page.incarnation.clone(),
        next_from_ordinal: (end < page.prompt_len).then_some(served_ordinal(end)),
        head: page.head,
        lineage_id,
        lineage_state: state_name(&page.resolution),
        tools,
        tools_run_id,
    };
    // An indivisible message whose frame would cross the transport limit is refused by name.
    frame_fits(Op::SessionRead.name(), &answer, key, served_ordinal(first))?;
    Ok(super::body(answer))
}

/// `entry` in descriptors mode (llm-runner §4.2): its stored identities beside it and its
/// message described within the fixed per-message budget, whatever the page. A message whose
/// structure alone is over that budget is refused `reply_too_large`, naming its ordinal.
fn described<'a>(mut entry: ReadEntry<'a>, message: &'a Message, key: &SessionKey) -> Result<ReadEntry<'a>, Refusal> {
    let ids = descriptors::identities(message);
    entry.digest = Some(ids.digest);
    entry.part_digests = Some(ids.part_digests);
    // The entry's bytes besides its message: encoded with a `null` message, less those 4 bytes.
    entry.message = EntryMessage::Described(Value::Null);
    let envelope = serde_json::to_vec(&entry).map_or(0, |b| b.len()).saturating_sub(4);
    match descriptors::describe(message, &ids.inline, envelope) {
        Ok(body) => {
            entry.message = EntryMessage::Described(body);
            Ok(entry)
        }
        Err(e) => {
            let subject = json!({"kind": "message", "session": key.session, "ordinal": entry.ordinal});
            let detail = crate::detail!("ordinal" => entry.ordinal, "limit" => e.limit, "subject" => subject);
            let message = format!(
                "session.read: message {} is over the {}-byte descriptor budget with every payload described",
                entry.mid, e.limit
            );
            Err(Refusal::new(RefusalCode::ReplyTooLarge, message, Some(detail)))
        }
    }
}

/// The byte cap of a page (`session.read`, `session.history`): `(skip, take)` of the entries
/// whose encoded `sizes` fit `max_bytes`. A forward page keeps its first entries, a backward one
/// (the newest page, a page before a position) its last; one entry always stays whole.
pub(super) fn within_bytes(sizes: &[usize], max_bytes: u64, backward: bool) -> (usize, usize) {
    let budget = (max_bytes as usize).saturating_sub(PAGE_OVERHEAD);
    let fits = |order: &mut dyn Iterator<Item = usize>| {
        let mut total = 0usize;
        order
            .take_while(|&i| {
                total += sizes[i];
                total <= budget || total == sizes[i]
            })
            .count()
    };
    if backward {
        let n = fits(&mut (0..sizes.len()).rev());
        (sizes.len() - n, n)
    } else {
        (0, fits(&mut (0..sizes.len())))
    }
}

/// `reply_too_large` when a page's complete frame would cross the transport limit, naming its
/// indivisible first message by session and served ordinal, never its content.
pub(super) fn frame_fits(
    op: &str,
    body: &impl serde::Serialize,
    key: &SessionKey,
    ordinal: u64,
) -> Result<(), Refusal> {
    let frame = serde_json::to_vec(&json!({"result": body})).map_or(0, |b| b.len()) + subc_protocol::HEADER_LEN;
    if frame <= subc_protocol::MAX_DELIVERED_FRAME_LEN {
        return Ok(());
    }
    let subject = json!({"kind": "message", "session": key.session, "ordinal": ordinal});
    let detail =
        crate::detail!("bytes" => frame, "limit" => subc_protocol::MAX_DELIVERED_FRAME_LEN, "subject" => subject);
    let message = format!("{op}: message m{ordinal} alone makes a {frame}-byte reply, over the transport limit");
    Err(Refusal::new(RefusalCode::ReplyTooLarge, message, Some(detail)))
}

/// The run an entry belongs to, and whether it is that run's last message: the next message
/// belongs to another run, or it is the transcript's last and its run has ended durably.
fn attribution(entry: &Entry, next: Option<&Entry>, page: &TranscriptPage) -> Option<RunAttribution> {
    if entry.run_id.is_empty() {
        return None;
    }
    let is_final = match next {
        Some(n) => n.run_id != entry.run_id,
        None if entry.ordinal + 1 < page.prompt_len => false,
        None => page.state.last.as_ref().is_some_and(|e| e.run_id == entry.run_id && e.status != EpisodeStatus::Open),
    };
    Some(RunAttribution { run_id: entry.run_id.clone(), episode: entry.run_id.clone(), is_final })
}

/// The dispatch facts of the page's assistant messages that asked for tools, by internal
/// ordinal (one WAL pass, only when the page has such a message).
fn dispatch_facts(
    reader: &Reader,
    entries: &[Entry],
) -> Result<std::collections::HashMap<u64, Vec<ReadToolCall>>, Refusal> {
    use crate::message::Part;
    let asks = |e: &&Entry| {
        e.message.role == Role::Assistant && e.message.content.iter().any(|p| matches!(p, Part::ToolCall { .. }))
    };
    let wanted: Vec<u64> = entries.iter().filter(asks).map(|e| e.ordinal).collect();
    let mut out = std::collections::HashMap::new();
    let Some(&last) = wanted.last() else { return Ok(out) };
    for fact in crate::lineage::calls::facts(reader, None, Some(last)).map_err(|e| e.refusal())? {
        if !wanted.contains(&fact.ordinal) {
            continue;
        }
        let call = ReadToolCall {
            indeterminate: fact.indeterminate(),
            tool_call_id: fact.tool_call_id,
            call_key: fact.call_key,
            dispatched_to: fact.dispatched_to,
        };
        out.entry(fact.ordinal).or_insert_with(Vec::new).push(call);
    }
    Ok(out)
}

/// `session.head` (llm-runner §4.3, spec §4): where the transcript stands, without bodies.
pub(super) fn session_head(ops: &Ops, route: &super::Route, version: u64) -> Result<Value, Refusal> {
    let key = &route.key;
    let lineage_id = key.addr();
    let Some(reader) = Reader::open(ops.registry.shared(), key) else {
        return Ok(super::body(HeadMeta {
            last_ordinal: None,
            first_ordinal: None,
            history_version: version,
            incarnation: UNWRITTEN_INCARNATION.into(),
            head: None,
            last_run_state: None,
            last_run_error: None,
            updated_at: None,
            model: None,
            usage: None,
            title: None,
            lineage_id: None,
            sender: super::owners::sender_grant(None, &[], &route.caller),
            cache: None,
        }));
    };
    // The last run's status as `run.status` serves it (an orphan a previous process left is
    // sealed first), so the head and `run.status` never disagree.
    let status = super::status::status_of(ops, key, None)?;
    let page = read::transcript(&reader, u64::MAX, 0).map_err(|e| e.refusal())?;
    let last = page.state.last.as_ref();
    let last_run_error = match (&status.state, &status.error) {
        // The same recorded error `run.status` serves (llm-runner §4.3: never a separate
        // derivation); a wait that is not a finite non-negative number is left off the head.
        (RunState::Finished(FinishReason::Error), Some(error)) => Some(LastRunError {
            class: error.class_name(),
            retry_after_secs: error.retry_after_secs.filter(|s| s.is_finite() && *s >= 0.0),
            resets_at_ms: error.resets_at_ms,
        }),
        _ => None,
    };
    let last_run_state = status.run_id.clone().map(|run_id| LastRunState {
        run_id,
        state: status.state.as_str().to_owned(),
        reason: status.reason.map(str::to_owned),
    });
    // A retained session's activity is what its expiry counts from (llm-runner §9.1): its
    // recorded send, step and terminal times, never a maintenance write.
    let retained = last.and_then(|e| e.config.config()).is_some_and(|c| c.policy.retention.is_some());
    // The WAL's write time; a WAL folded since this read began keeps it in its container.
    let wal_mtime = || {
        std::fs::metadata(reader.path())
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
    };
    // (And one unfolded again since: the WAL once more.)
    let mtime = || {
        wal_mtime()
            .or_else(|| crate::lineage::fold::folded_mtime_ms(ops.registry.shared(), &key.addr()))
            .or_else(wal_mtime)
    };
    let updated_at = if retained { page.state.last_activity_ms } else { mtime() };
    let model = last.and_then(|e| e.config.config()).map(|c| HeadModel {
        provider: c.provider.clone(),
        model: c.model.clone(),
        variant: c.variant.clone(),
    });
    let answer = HeadMeta {
        last_ordinal: page.prompt_len.checked_sub(1).map(served_ordinal),
        first_ordinal: Some(1),
        history_version: version,
        incarnation: page.incarnation.clone(),
        head: page.head,
        last_run_state,
        last_run_error,
        updated_at,
        model,
        usage: page
            .state
            .usage_since
            .clone()
            .map(|since| SessionUsage { usage: page.state.session_usage.clone(), since }),
        title: page.state.last_title.clone().or_else(|| last.and_then(|e| e.title.clone())),
        sender: super::owners::sender_grant(
            last.map(|e| e.owner.as_ref()),
            crate::actor::senders::plan_senders(last.and_then(|e| e.config.config())),
            &route.caller,
        ),
        cache: ops.registry.cache_clocks().get(&lineage_id).map(|c| HeadCache {
            last_sent_at_ms: c.last_sent_at_ms,
            ttl_ms: c.ttl_ms,
            expires_at_ms: c.expires_at_ms(),
            expiry_basis: "estimated",
        }),
        lineage_id: Some(lineage_id),
    };
    Ok(super::body(answer))
}
