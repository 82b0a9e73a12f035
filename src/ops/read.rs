//! `session.read` and `run.status`: strict reads that never open the session's actor. The
//! transcript is the store prefix ⊕ the WAL tail; run-keyed status comes from the durable run
//! index, then from the WAL.

use serde_json::{json, Value};

use super::Ops;
use crate::lineage::read;
use crate::lineage::reader::{Reader, Sink, Start};
use crate::record::{Frozen, Record};
use crate::replay::Resolution;
use crate::session_key::SessionKey;
use crate::wire::requests::ReadRequest;
use crate::wire::status::{PageItem, ReadPage, ReadToolCall};
use crate::wire::{Refusal, RefusalCode};

/// The page byte cap (spec §4: default and maximum 3 MiB of serialized reply body).
pub const MAX_BYTES: u64 = 3 << 20;
/// Bytes reserved for the page's envelope (`result`, state, cursors) within `MAX_BYTES`.
const PAGE_OVERHEAD: usize = 512;

fn state_name(r: &Resolution) -> &'static str {
    match r {
        Resolution::Empty => "empty",
        Resolution::Idle { .. } => "idle",
        Resolution::Paused { .. } => "paused",
        Resolution::Resume { .. } => "active",
    }
}

pub(super) fn session_read(ops: &Ops, key: &SessionKey, request: ReadRequest) -> Result<Value, Refusal> {
    let ReadRequest { from_ordinal: from, limit } = request;
    let Some(reader) = Reader::open(ops.registry.shared(), key) else {
        return Ok(super::body(ReadPage {
            messages: Vec::new(),
            lineage_state: "empty",
            next_from_ordinal: None,
            head: None,
        }));
    };
    // The newest page needs the length first; a forward page does not.
    let start = match from {
        Some(f) => f,
        None => {
            let len = read::transcript(&reader, u64::MAX, 0).map_err(|e| e.refusal())?.prompt_len;
            len.saturating_sub(limit)
        }
    };
    let page = read::transcript(&reader, start, limit).map_err(|e| e.refusal())?;
    let mut calls = dispatch_facts(&reader, &page.messages)?;
    let items: Vec<PageItem> = page
        .messages
        .iter()
        .map(|(o, m)| PageItem { ordinal: *o, mid: format!("m{o}"), message: m, tool_calls: calls.remove(o) })
        .collect();
    // The byte cap: a forward page keeps its first messages, the newest page its last ones; one
    // message always stays whole.
    let sizes: Vec<usize> = items.iter().map(|i| serde_json::to_vec(i).map_or(0, |b| b.len() + 1)).collect();
    let fits = |order: &mut dyn Iterator<Item = usize>| {
        let mut total = 0usize;
        order
            .take_while(|&i| {
                total += sizes[i];
                total <= MAX_BYTES as usize - PAGE_OVERHEAD || total == sizes[i]
            })
            .count()
    };
    let (skip, take) = match from {
        Some(_) => (0, fits(&mut (0..items.len()))),
        None => {
            let n = fits(&mut (0..items.len()).rev());
            (items.len() - n, n)
        }
    };
    let first = start + skip as u64;
    let end = first + take as u64;
    let answer = ReadPage {
        messages: items.into_iter().skip(skip).take(take).collect(),
        lineage_state: state_name(&page.resolution),
        next_from_ordinal: (end < page.prompt_len).then_some(end),
        head: page.head,
    };
    // An indivisible message whose frame would cross the transport limit is refused by name.
    let frame = serde_json::to_vec(&json!({"result": &answer})).map_or(0, |b| b.len()) + subc_protocol::HEADER_LEN;
    if frame > subc_protocol::MAX_DELIVERED_FRAME_LEN {
        let subject = json!({"kind": "message", "session": key.session, "ordinal": first});
        let detail =
            crate::detail!("bytes" => frame, "limit" => subc_protocol::MAX_DELIVERED_FRAME_LEN, "subject" => subject);
        let message =
            format!("session.read: message m{first} alone makes a {frame}-byte reply, over the transport limit");
        return Err(Refusal::new(RefusalCode::ReplyTooLarge, message, Some(detail)));
    }
    Ok(super::body(answer))
}

/// The dispatch facts of the page's assistant messages that asked for tools, by ordinal (one
/// WAL pass, only when the page has such a message).
fn dispatch_facts(
    reader: &Reader,
    messages: &[(u64, crate::message::Message)],
) -> Result<std::collections::HashMap<u64, Vec<ReadToolCall>>, Refusal> {
    use crate::message::{Part, Role};
    let asks = |m: &crate::message::Message| {
        m.role == Role::Assistant && m.content.iter().any(|p| matches!(p, Part::ToolCall { .. }))
    };
    let wanted: Vec<u64> = messages.iter().filter(|(_, m)| asks(m)).map(|(o, _)| *o).collect();
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

/// `session.baseline` (spec §4): the first episode's frozen plan — one item per fetched
/// provider (its catalog digest), the optional items admitted absent, the composition digest —
/// and the tool names it runs with; both generations are 0 (no mid-session change is served).
/// A plan-less session has no items and no composition digest. `not_yet` until the session has
/// an episode.
pub(super) fn session_baseline(ops: &Ops, key: &SessionKey) -> Result<Value, Refusal> {
    use cortexkit_role_llm_runner::baseline::BaselineReply;
    let not_yet = || serde_json::to_value(BaselineReply::not_yet()).expect("baselines serialize");
    let Some(reader) = Reader::open(ops.registry.shared(), key) else { return Ok(not_yet()) };
    let Some(frozen) = first_episode_config(&reader).map_err(|e| e.refusal())? else { return Ok(not_yet()) };
    let baseline = match &frozen {
        Frozen::Config(c) => baseline_of(c),
        Frozen::Unreadable(v) => {
            let tool_names = v
                .get("tools")
                .and_then(Value::as_array)
                .map(|tools| {
                    tools.iter().filter_map(|t| t.get("name").and_then(Value::as_str).map(String::from)).collect()
                })
                .unwrap_or_default();
            cortexkit_role_llm_runner::baseline::Baseline::plan_less(tool_names)
        }
    };
    Ok(serde_json::to_value(BaselineReply::ready(baseline)).expect("baselines serialize"))
}

/// The baseline a frozen config describes.
pub fn baseline_of(config: &crate::frozen::FrozenConfig) -> cortexkit_role_llm_runner::baseline::Baseline {
    use cortexkit_role_llm_runner::baseline::{AbsentItem, Baseline, BaselineItem};
    let tool_names: Vec<String> = config.tools.iter().map(|t| t.name.clone()).collect();
    let Some(plan) = &config.plan else { return Baseline::plan_less(tool_names) };
    let tool_items = plan.items.iter().map(|i| BaselineItem::new(&i.provider, &i.catalog_digest).with_item("tools"));
    let text_items = plan.texts.iter().map(|t| {
        BaselineItem::new(&t.provider, &t.item_digest)
            .with_item("system_text")
            .with_preflight_digest(&t.preflight_digest)
    });
    let items = tool_items.chain(text_items).collect();
    let absent = plan
        .absent
        .iter()
        .map(|a| AbsentItem {
            provider: a.provider.clone(),
            kind: a.kind.clone(),
            reason: a.reason.clone(),
            provider_code: a.provider_code.clone(),
        })
        .filter(|a| a.check().is_ok())
        .collect();
    let mut baseline = Baseline::plan_less(tool_names).with_absent_items(absent);
    baseline.items = items;
    baseline.composition_digest = plan.composition_digest.clone();
    baseline
}

/// The frozen config of the session's first durable `RunStarted`, reading only as far as it.
fn first_episode_config(reader: &Reader) -> Result<Option<Frozen>, crate::lineage::LineageError> {
    struct FirstConfig(Option<Frozen>);
    impl Sink for FirstConfig {
        fn record(&mut self, _seq: u64, record: &Record) -> bool {
            if let Record::RunStarted(r) = record {
                self.0 = Some(r.config.clone());
            }
            // Stop the scan at the first episode: it is all this needs.
            self.0.is_none()
        }
    }
    let mut sink = FirstConfig(None);
    reader.scan(Start::Beginning, &mut sink)?;
    Ok(sink.0)
}
