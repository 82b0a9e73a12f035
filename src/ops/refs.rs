//! `session.output_refs` and `session.output_ref_read` (llm-runner §9.13): a set's records a
//! page at a time, and a record's snapshot a range at a time. Both read only what is durable
//! and write nothing; an id that is not this session's answers `unknown_ref` before any
//! content is looked up, exactly like one that never existed.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use cortexkit_role_llm_runner::output_refs::{Descriptor, ListRequest, Page, ReadReply, ReadRequest};
use serde_json::Value;

use super::Ops;
use crate::lineage::read;
use crate::lineage::reader::Reader;
use crate::refs::cache::Lookup;
use crate::refs::ids::{RefId, SetId, SetSalt};
use crate::refs::sets::{message_sets, Inputs, Set};
use crate::session_key::SessionKey;
use crate::wire::{invalid_params, Refusal, RefusalCode};

pub(super) fn session_output_refs(ops: &Ops, key: &SessionKey, request: ListRequest) -> Result<Value, Refusal> {
    let set = find(ops, key, ("set_id", &request.set_id), |salt| SetId::parse(&request.set_id, salt))?;
    match Page::from_records(&set.records, request.after.as_deref()) {
        Ok(page) => Ok(super::body(page)),
        Err("unknown_ref") => Err(unknown_ref("after", request.after.as_deref().unwrap_or_default())),
        Err(_) => Err(Refusal::new(
            RefusalCode::ReplyTooLarge,
            "one output reference record does not fit a page",
            Some(crate::detail!("limit" => cortexkit_role_llm_runner::output_refs::MAX_PAGE_BYTES)),
        )),
    }
}

pub(super) fn session_output_ref_read(ops: &Ops, key: &SessionKey, request: ReadRequest) -> Result<Value, Refusal> {
    let mut index = 0;
    let set = find(ops, key, ("ref_id", &request.ref_id), |salt| {
        RefId::parse(&request.ref_id, salt).map(|r| {
            index = r.index as usize;
            r.set
        })
    })?;
    let record = set.records.get(index).ok_or_else(|| unknown_ref("ref_id", &request.ref_id))?;
    let content = record
        .sha256
        .as_ref()
        .and_then(|digest| set.snapshots.get(digest))
        .ok_or_else(|| unknown_ref("ref_id", &request.ref_id))?;
    let size = content.len() as u64;
    if let Err(field) = request.check(size) {
        return Err(invalid_params(field, &format!("the snapshot holds {size} bytes")));
    }
    let end = request.offset.saturating_add(request.length).min(size);
    let data = base64::engine::general_purpose::STANDARD.encode(&content[request.offset as usize..end as usize]);
    let mut reply = ReadReply::new(data, size, record.format.clone().unwrap_or_else(|| "text".into()));
    reply.mime.clone_from(&record.mime);
    Ok(super::body(reply))
}

/// The set `id` names in this session: parsed against the session's salt, then taken from the
/// process's [`crate::refs::cache::RefCache`] (derived from only the messages it needs), or, when the cache cannot
/// answer, derived from the whole durable transcript. A session that never rendered part
/// numbers has no sets.
fn find(
    ops: &Ops,
    key: &SessionKey,
    (field, id): (&str, &str),
    parse: impl FnOnce(&SetSalt) -> Option<SetId>,
) -> Result<Arc<Set>, Refusal> {
    let missing = || unknown_ref(field, id);
    let reader = Reader::open(ops.registry.shared(), key).ok_or_else(missing)?;
    let mut parse = Some(parse);
    let cached = ops.refs.set(&reader, |salt| parse.take().and_then(|p| p(salt))).map_err(|e| e.refusal())?;
    match cached {
        Lookup::Set(set) => Ok(set),
        Lookup::Unknown => Err(missing()),
        Lookup::Uncovered => match parse.take() {
            Some(parse) => derive_whole(&reader, key, parse)?.map(Arc::new).ok_or_else(missing),
            None => Err(missing()),
        },
    }
}

/// The set `parse` names, derived from the whole durable transcript and a WAL pass for call
/// keys (what every read did before the cache; kept for a session its index cannot cover).
fn derive_whole(
    reader: &Reader,
    key: &SessionKey,
    parse: impl FnOnce(&SetSalt) -> Option<SetId>,
) -> Result<Option<Set>, Refusal> {
    let page = read::transcript(reader, 0, u64::MAX).map_err(|e| e.refusal())?;
    let salt = SetSalt::new(&key.addr(), &page.incarnation);
    let (Some(set_id), Some(config)) = (parse(&salt), numbering_config(&page)) else { return Ok(None) };
    let Some(at) = page.messages.iter().position(|(ordinal, _)| *ordinal == set_id.ordinal) else { return Ok(None) };
    let history: Vec<_> = page.messages[..=at].iter().map(|(_, m)| m.clone()).collect();
    let call_keys = call_keys(reader, set_id.ordinal)?;
    let inputs = Inputs { salt: &salt, tools: &config.tools, call_keys: &call_keys };
    let sets = message_sets(&history, at, set_id.ordinal, &inputs);
    Ok(sets.into_iter().find(|(part, _)| *part == set_id.part).map(|(_, set)| set))
}

/// One message's set descriptors: the reply set's under `None`, a call set's under its part.
pub(super) type MessageDescriptors = Vec<(Option<usize>, Descriptor)>;

/// The descriptors of the sets of the messages at `ordinals` (display rows' `output_refs`),
/// by ordinal: the reply set's under `None`, each call set's under its part index. Empty
/// unless the session renders part numbers.
pub(super) fn descriptors(
    reader: &Reader,
    key: &SessionKey,
    page: &read::TranscriptPage,
    ordinals: &[u64],
) -> Result<HashMap<u64, MessageDescriptors>, Refusal> {
    let mut out = HashMap::new();
    let Some(config) = numbering_config(page) else { return Ok(out) };
    let Some(&last) = ordinals.iter().max() else { return Ok(out) };
    let history: Vec<_> =
        read::transcript(reader, 0, last + 1).map_err(|e| e.refusal())?.messages.into_iter().map(|(_, m)| m).collect();
    let salt = SetSalt::new(&key.addr(), &page.incarnation);
    let call_keys = call_keys(reader, last)?;
    let inputs = Inputs { salt: &salt, tools: &config.tools, call_keys: &call_keys };
    for &ordinal in ordinals {
        // The transcript through `last` holds every ordinal asked about (durable only grows);
        // an ordinal past it gets no descriptor rather than a panic.
        let Some(through) = history.get(..=ordinal as usize) else { continue };
        let sets = message_sets(through, ordinal as usize, ordinal, &inputs);
        let descriptors: Vec<_> = sets.into_iter().map(|(part, set)| (part, set.descriptor)).collect();
        if !descriptors.is_empty() {
            out.insert(ordinal, descriptors);
        }
    }
    Ok(out)
}

/// The session's frozen config, if its requests show part numbers (its plan is frozen on its
/// first episode, so the last episode's config is every episode's).
fn numbering_config(page: &read::TranscriptPage) -> Option<&crate::frozen::FrozenConfig> {
    match page.state.last.as_ref().map(|e| &e.config) {
        Some(crate::record::Frozen::Config(c)) if c.renders_part_numbers() => Some(c),
        _ => None,
    }
}

/// Every call's key through the message at `ordinal`, by the asking message's ordinal and the
/// call's id.
fn call_keys(reader: &Reader, through: u64) -> Result<HashMap<(u64, String), String>, Refusal> {
    let facts = crate::lineage::calls::facts(reader, None, Some(through)).map_err(|e| e.refusal())?;
    Ok(facts.into_iter().map(|f| ((f.ordinal, f.tool_call_id), f.call_key)).collect())
}

/// `unknown_ref` naming the member whose id is not this session's.
fn unknown_ref(field: &str, id: &str) -> Refusal {
    Refusal::new(
        RefusalCode::UnknownRef,
        format!("{field} {id:?} names no output reference of this session"),
        Some(crate::detail!("field" => field)),
    )
}
