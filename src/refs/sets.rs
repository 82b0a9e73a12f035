//! A message's output-reference sets (llm-runner §9.13), derived from the durable transcript.
//!
//! A set is a function of what was durable when its message was: the transcript before it (the
//! writing request showed all of it, numbered by [`super::tags::numbers`], and numbers never
//! change), the message itself, the calls' keys and the session's frozen tools. broca never
//! rewrites a transcript, so deriving the records at read time gives the bytes a write-time
//! copy would hold; the snapshots are the stored tool results themselves, which live exactly
//! as long as the session (retention removes both).

use std::collections::{BTreeMap, HashMap};

use cortexkit_role_llm_runner::output_refs::{Descriptor, Record, Resolution, Target};

use super::ids::{RefId, SetId, SetSalt};
use super::DIALECT;
use crate::frozen::ToolSpec;
use crate::lineage::projection::mid;
use crate::message::{tool_result_content, Message, Part, Role};

/// One immutable set: its descriptor, records and the retained snapshot bytes by SHA-256.
#[derive(Debug)]
pub struct Set {
    pub descriptor: Descriptor,
    pub records: Vec<Record>,
    pub snapshots: BTreeMap<String, Vec<u8>>,
}

/// What deriving a session's sets needs besides its transcript.
pub struct Inputs<'a> {
    pub salt: &'a SetSalt,
    /// The session's frozen tools (the plan items' opt-ins and reference slots).
    pub tools: &'a [ToolSpec],
    /// Each call's key, by the ordinal of the message that asked for it and its tool call id
    /// (a model may reuse an id in a later turn).
    pub call_keys: &'a HashMap<(u64, String), String>,
}

/// The sets of the assistant message at `history[at]` (ordinal `ordinal`): its reply set, then
/// one set per call of an opted-in tool, in part order with the part's index. Any other message
/// has none.
pub fn message_sets(history: &[Message], at: usize, ordinal: u64, inputs: &Inputs<'_>) -> Vec<(Option<usize>, Set)> {
    let Some(message) = history.get(at).filter(|m| m.role == Role::Assistant) else { return Vec::new() };
    let targets = targets(&history[..at], ordinal.saturating_sub(at as u64), inputs);
    let calls = message.content.iter().enumerate().filter(|(_, p)| matches!(p, Part::ToolCall { .. }));
    std::iter::once(None)
        .chain(calls.map(|(index, _)| Some(index)))
        .filter_map(|part| one_set(message, ordinal, part, &targets, inputs).map(|set| (part, set)))
        .collect()
}

/// One set of the assistant message `message` (ordinal `ordinal`): its reply set (`part`
/// `None`), or the call set of the call at `part` when the call's tool is opted in; `targets`
/// holds (at least) every numbered part the set names, as the message's request showed them.
pub fn one_set(
    message: &Message,
    ordinal: u64,
    part: Option<usize>,
    targets: &BTreeMap<u64, Target>,
    inputs: &Inputs<'_>,
) -> Option<Set> {
    let (id, key, resolution) = resolve(message, ordinal, part, targets, inputs)?;
    Some(set(id, &mid(ordinal), key, resolution))
}

/// The numbers the set [`one_set`] would derive names, in encounter order (the references'
/// tags; the rest of its records need no target).
pub fn named_numbers(message: &Message, part: Option<usize>, inputs: &Inputs<'_>) -> Option<Vec<u64>> {
    let (_, _, resolution) = resolve(message, 0, part, &BTreeMap::new(), inputs)?;
    Some(resolution.records.iter().filter_map(|r| r.tag.as_deref()?.parse().ok()).collect())
}

/// The set's id, its call's key and its resolution against `targets`.
fn resolve(
    message: &Message,
    ordinal: u64,
    part: Option<usize>,
    targets: &BTreeMap<u64, Target>,
    inputs: &Inputs<'_>,
) -> Option<(SetId, Option<String>, Resolution)> {
    if message.role != Role::Assistant {
        return None;
    }
    let mut resolution = Resolution::new();
    let Some(index) = part else {
        let reply_id = SetId::reply(inputs.salt, ordinal);
        let mut mint = minter(&reply_id);
        for part in &message.content {
            if let Part::Text { text } = part {
                resolution.reply(text, targets, &mut mint);
            }
        }
        drop(mint);
        return Some((reply_id, None, resolution));
    };
    let Some(Part::ToolCall { tool_call_id, tool_name, input }) = message.content.get(index) else { return None };
    let tool = inputs.tools.iter().find(|t| t.name == *tool_name && t.output_refs)?;
    let id = SetId::call(inputs.salt, ordinal, index);
    resolution.call(input, &tool.reference_slots, true, targets, &mut minter(&id));
    let key = inputs.call_keys.get(&(ordinal, tool_call_id.clone())).cloned();
    Some((id, key, resolution))
}

fn set(id: SetId, mid: &str, call_key: Option<String>, resolution: Resolution) -> Set {
    let mut descriptor = Descriptor::new(id.to_string(), mid, DIALECT, &resolution.records);
    if let Some(key) = call_key {
        descriptor = descriptor.with_call_key(key);
    }
    Set { descriptor, records: resolution.records, snapshots: resolution.snapshots }
}

/// Record ids `<set id>.r<n>`, counting from 0 in encounter order.
fn minter(set: &SetId) -> impl FnMut() -> String + '_ {
    let mut n = 0u32;
    move || {
        let id = RefId { set: set.clone(), index: n }.to_string();
        n += 1;
        id
    }
}

/// The numbered parts `history` showed, by number: texts as non-tool parts, answered calls as
/// their stored result (`first_ordinal` is `history[0]`'s ordinal, for part keys).
fn targets(history: &[Message], first_ordinal: u64, inputs: &Inputs<'_>) -> BTreeMap<u64, Target> {
    let numbers = super::tags::numbers(history);
    let mut out = BTreeMap::new();
    for (i, (m, ns)) in history.iter().zip(&numbers).enumerate() {
        let ordinal = first_ordinal + i as u64;
        for (p, n) in ns.iter().enumerate() {
            let Some(n) = n else { continue };
            if let Some(target) = target_at(m, history.get(i + 1), ordinal, p, inputs) {
                out.insert(*n, target);
            }
        }
    }
    out
}

/// The target a numbered part names: the part at `part` of `message` (ordinal `ordinal`), a
/// text as a non-tool part, an answered call as its stored result in `next`.
pub fn target_at(
    message: &Message,
    next: Option<&Message>,
    ordinal: u64,
    part: usize,
    inputs: &Inputs<'_>,
) -> Option<Target> {
    match message.content.get(part)? {
        Part::Text { text } => Some(Target::text(part_key(ordinal, part), text.clone().into_bytes())),
        Part::ToolCall { tool_call_id, tool_name, .. } => {
            let Some((q, Part::ToolResult { output, .. })) = super::tags::result_in(next, tool_call_id) else {
                return None;
            };
            let mut target = Target::text(part_key(ordinal + 1, q), tool_result_content(output).into_bytes());
            // Every call broca dispatched has a key; the call's id stands in for one that has
            // none, so the target still reads as a tool output.
            let key = inputs.call_keys.get(&(ordinal, tool_call_id.clone())).cloned();
            target.call_key = Some(key.unwrap_or_else(|| tool_call_id.clone()));
            target.tool = Some(tool_name.clone());
            target.provider = inputs.tools.iter().find(|t| t.name == *tool_name).and_then(|t| t.module.clone());
            Some(target)
        }
        _ => None,
    }
}

/// A part's key: its message's mid and its place, as display rows number parts.
pub fn part_key(ordinal: u64, part: usize) -> String {
    format!("{}/p{part}", mid(ordinal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, opted_in: bool) -> ToolSpec {
        let slots = vec![
            cortexkit_role_llm_runner::output_refs::ReferenceSlot::new("data", "token"),
            cortexkit_role_llm_runner::output_refs::ReferenceSlot::new("program", "source:rich-ui/1"),
        ];
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            reply: None,
            module: Some("fs".into()),
            preset: None,
            pin: None,
            result_format: None,
            output_refs: opted_in,
            reference_slots: if opted_in { slots } else { Vec::new() },
        }
    }

    /// user text (1), the model's text (2) and its call (3, answered "OUTPUT"), then `reply`.
    fn history(reply: Vec<Part>) -> Vec<Message> {
        vec![
            Message::user_text("list it"),
            Message {
                role: Role::Assistant,
                content: vec![
                    Part::Text { text: "listing".into() },
                    Part::ToolCall { tool_call_id: "t1".into(), tool_name: "ls".into(), input: json!({}) },
                ],
                origin: None,
                delivered_as: None,
                sender: None,
                client_message_id: None,
            },
            Message {
                role: Role::Tool,
                content: vec![Part::ToolResult {
                    tool_call_id: "t1".into(),
                    output: json!({"kind": "text", "text": "OUTPUT"}),
                    is_error: false,
                }],
                origin: None,
                delivered_as: None,
                sender: None,
                client_message_id: None,
            },
            Message::of(Role::Assistant, reply),
        ]
    }

    fn sets_of(reply: Vec<Part>) -> Vec<(Option<usize>, Set)> {
        let salt = SetSalt::new("s", "i");
        let keys =
            HashMap::from([((1, "t1".to_owned()), "ck-1".to_owned()), ((3, "t2".to_owned()), "ck-2".to_owned())]);
        let tools = [tool("ls", true), tool("plain", false)];
        let inputs = Inputs { salt: &salt, tools: &tools, call_keys: &keys };
        message_sets(&history(reply), 3, 3, &inputs)
    }

    fn text(t: &str) -> Part {
        Part::Text { text: t.into() }
    }

    #[test]
    fn a_reply_resolves_a_shown_tool_output_to_its_stored_bytes() {
        let sets = sets_of(vec![text("see $$tc(3)")]);
        assert_eq!(sets.len(), 1);
        let (_, set) = &sets[0];
        let r = &set.records[0];
        assert_eq!((r.state.as_str(), r.tag.as_deref(), r.call_key.as_deref()), ("resolved", Some("3"), Some("ck-1")));
        assert_eq!(
            (r.tool.as_deref(), r.provider.as_deref(), r.part.as_deref()),
            (Some("ls"), Some("fs"), Some("m3/p0"))
        );
        assert_eq!(set.snapshots.get(r.sha256.as_deref().unwrap()).map(Vec::as_slice), Some(&b"OUTPUT"[..]));
        assert!(set.descriptor.check(&set.records));
        assert_eq!(set.descriptor.mid, "m4", "the served mid of the fourth message");
        assert_eq!(set.descriptor.call_key, None);
    }

    #[test]
    fn texts_and_unknown_numbers_keep_their_reasons_and_code_copies_nothing() {
        let sets = sets_of(vec![text("$$tc(1) $$tc(2) $$tc(99999999999999999999999)"), text("`$$tc(3)` \\$$tc(3)")]);
        let reasons: Vec<_> = sets[0].1.records.iter().map(|r| r.reason.as_deref()).collect();
        assert_eq!(reasons, [Some("not_a_tool_output"), Some("not_a_tool_output"), Some("unknown_tag")]);
        assert!(sets[0].1.snapshots.is_empty());
    }

    #[test]
    fn occurrences_after_64_are_too_many_across_the_message() {
        let sets = sets_of(vec![text(&"$$tc(3) ".repeat(40)), text(&"$$tc(3) ".repeat(25))]);
        let records = &sets[0].1.records;
        assert_eq!(records.len(), 65);
        assert_eq!(records[64].reason.as_deref(), Some("too_many_refs"));
        assert_eq!(records[63].state, "resolved");
    }

    #[test]
    fn only_opted_in_calls_get_a_set_scanned_from_their_slots() {
        let call =
            |id: &str, name: &str, input| Part::ToolCall { tool_call_id: id.into(), tool_name: name.into(), input };
        let sets = sets_of(vec![
            text("calling"),
            call(
                "t2",
                "ls",
                json!({"data": "extra $$tc(3)", "program": "export const x = $$tc(3)", "other": "$$tc(3)"}),
            ),
            call("t3", "plain", json!({"data": "$$tc(3)"})),
        ]);
        assert_eq!(sets.len(), 2, "the reply set and the opted-in call's");
        let (part, set) = &sets[1];
        assert_eq!(*part, Some(1));
        assert_eq!(set.descriptor.call_key.as_deref(), Some("ck-2"));
        let states: Vec<_> = set.records.iter().map(|r| (r.state.as_str(), r.reason.as_deref())).collect();
        assert_eq!(states, [("unresolved", Some("not_a_reference")), ("resolved", None)]);
        assert_ne!(set.descriptor.set_id, sets[0].1.descriptor.set_id);
    }

    /// The published samples, each reply sample its own text part and each program or token
    /// sample its own call: the records carry exactly the samples' references, in order.
    #[test]
    fn the_published_scanner_samples_scan_as_published() {
        let mut reply = Vec::new();
        let (mut expected_reply, mut expected_calls) = (Vec::new(), Vec::new());
        for file in
            [cortexkit_rich_ui_syntax::vectors::ORIGINAL_SAMPLES, cortexkit_rich_ui_syntax::vectors::EXTENDED_SAMPLES]
        {
            let samples: serde_json::Value = serde_json::from_str(file).unwrap();
            for (i, sample) in samples["cases"].as_array().unwrap().iter().enumerate() {
                let tags: Vec<String> = sample["references"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["n"].as_str().map_or_else(|| r["n"].to_string(), str::to_owned))
                    .collect();
                let source = sample["source"].clone();
                match sample["mode"].as_str().unwrap() {
                    "reply" => {
                        reply.push(Part::Text { text: source.as_str().unwrap().to_owned() });
                        expected_reply.extend(tags);
                    }
                    mode => {
                        let slot = if mode == "token_slot" { "data" } else { "program" };
                        let id = format!("s{}-{i}", expected_calls.len());
                        reply.push(Part::ToolCall {
                            tool_call_id: id,
                            tool_name: "ls".into(),
                            input: json!({slot: source}),
                        });
                        expected_calls.push(tags);
                    }
                }
            }
        }
        let sets = sets_of(reply);
        let tags = |set: &Set| -> Vec<String> { set.records.iter().filter_map(|r| r.tag.clone()).collect() };
        assert_eq!(tags(&sets[0].1), expected_reply);
        let calls: Vec<Vec<String>> = sets[1..].iter().map(|(_, set)| tags(set)).collect();
        assert_eq!(calls, expected_calls);
    }

    /// A stored output of exactly 1 MiB resolves four times in one message; the fifth
    /// occurrence would pass 4 MiB and keeps only its size and digest. One byte more is
    /// `too_large` at once.
    #[test]
    fn snapshot_budgets_keep_size_and_digest_without_content() {
        for (size, resolved) in [(1_048_576, 4), (1_048_577, 0)] {
            let mut h = history(vec![text(&"$$tc(3) ".repeat(5))]);
            let big = "x".repeat(size);
            h[2].content[0] = Part::ToolResult {
                tool_call_id: "t1".into(),
                output: json!({"kind": "text", "text": big}),
                is_error: false,
            };
            let salt = SetSalt::new("s", "i");
            let keys = HashMap::from([((1, "t1".to_owned()), "ck-1".to_owned())]);
            let tools = [tool("ls", true)];
            let inputs = Inputs { salt: &salt, tools: &tools, call_keys: &keys };
            let sets = message_sets(&h, 3, 3, &inputs);
            let records = &sets[0].1.records;
            let states: Vec<&str> = records.iter().map(|r| r.state.as_str()).collect();
            assert_eq!(states.iter().filter(|s| **s == "resolved").count(), resolved, "{size}: {states:?}");
            assert!(records.iter().all(|r| r.bytes == Some(size as u64) && r.sha256.is_some()));
            assert_eq!(sets[0].1.snapshots.len(), usize::from(resolved > 0), "content is kept once, by digest");
        }
    }
}
