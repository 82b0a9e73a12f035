//! `run.tool_calls {run_id, after?, limit?}` (spec §4; llm-runner 0.8.0 `run_tool_calls`): a
//! run's durable calls in dispatch order, paged by count and by the read byte cap. `after` is the
//! opaque `next` of an earlier page (`c<index>`); results are never returned, only their stored
//! size. One WAL pass finds the run's calls.

use cortexkit_role_llm_runner::tool_calls::{RunToolCall, ToolCallsPage, AFTER_FIELD};
use serde_json::{json, Value};

use super::read::MAX_BYTES;
use super::Ops;
use crate::lineage::calls::{self, CallFact};
use crate::lineage::ledger;
use crate::lineage::read;
use crate::lineage::reader::Reader;
use crate::session_key::SessionKey;
use crate::wire::requests::ToolCallsRequest;
use crate::wire::{invalid_params, Refusal, RefusalCode};

/// Bytes reserved for the page's envelope within [`MAX_BYTES`].
const PAGE_OVERHEAD: usize = 512;

pub(super) fn run_tool_calls(ops: &Ops, key: &SessionKey, request: ToolCallsRequest) -> Result<Value, Refusal> {
    let ToolCallsRequest { run_id, after, limit } = request;
    let unknown = || {
        let detail = Some(crate::detail!("class" => "permanent"));
        Refusal::new(RefusalCode::UnknownRun, format!("no run {run_id} in this session"), detail)
    };
    let shared = ops.registry.shared();
    let Some(page) = read::snapshot(shared, key).map_err(|e| e.refusal())? else { return Err(unknown()) };
    if ledger::run(&shared.store, &key.addr(), &page, &run_id).map_err(|e| e.refusal())?.is_none() {
        return Err(unknown());
    }
    let reader = Reader::open(shared, key).ok_or_else(unknown)?;
    let facts = calls::facts(&reader, Some(&run_id), None).map_err(|e| e.refusal())?;
    let first = match after.as_deref() {
        None => 0,
        Some(cursor) => cursor
            .strip_prefix('c')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= facts.len())
            .ok_or_else(|| invalid_params(AFTER_FIELD, "not a cursor this run's pages gave"))?,
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for fact in facts.iter().skip(first).take(usize::try_from(limit).unwrap_or(usize::MAX)) {
        let call = run_tool_call(fact);
        let size = serde_json::to_vec(&call).map_or(0, |b| b.len() + 1);
        if !out.is_empty() && bytes + size > MAX_BYTES as usize - PAGE_OVERHEAD {
            break;
        }
        bytes += size;
        out.push(call);
    }
    let end = first + out.len();
    let mut answer = ToolCallsPage::new(&run_id, out);
    if end < facts.len() {
        answer = answer.with_next(format!("c{end}"));
    }
    // One call too large for a transport frame on its own is refused by name.
    let frame = serde_json::to_vec(&json!({"result": &answer})).map_or(0, |b| b.len()) + subc_protocol::HEADER_LEN;
    if frame > subc_protocol::MAX_DELIVERED_FRAME_LEN {
        let fact = &facts[first];
        let subject = json!({"kind": "tool_call", "run_id": run_id, "tool_call_id": fact.tool_call_id, "call_key": fact.call_key});
        let limit = subc_protocol::MAX_DELIVERED_FRAME_LEN;
        let detail = crate::detail!("bytes" => frame, "limit" => limit, "subject" => subject);
        let message = format!(
            "run.tool_calls: call {} alone makes a {frame}-byte reply, over the transport limit",
            fact.tool_call_id
        );
        return Err(Refusal::new(RefusalCode::ReplyTooLarge, message, Some(detail)));
    }
    Ok(super::body(answer))
}

fn run_tool_call(fact: &CallFact) -> RunToolCall {
    let args = serde_json::from_str(&fact.arguments).unwrap_or_else(|_| Value::String(fact.arguments.clone()));
    use crate::lineage::projection::served_ordinal;
    let ordinal = served_ordinal(fact.ordinal);
    let mut call = RunToolCall::new(&fact.tool_call_id, &fact.name, args, fact.role_outcome(), ordinal)
        .with_call_key(&fact.call_key)
        .with_position(fact.position);
    if let Some(module) = &fact.dispatched_to {
        call = call.with_dispatched_to(module);
    }
    if let Some(result) = &fact.result {
        call = call.with_result_bytes(result.bytes);
        if let Some(ordinal) = result.ordinal {
            call = call.with_result_ordinal(served_ordinal(ordinal));
        }
    }
    call
}
