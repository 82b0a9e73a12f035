//! `session.baseline` (spec §4, llm-runner/v1 §10): the first episode's frozen plan.

use serde_json::Value;

use super::Ops;
use crate::frozen::SessionBaseline;
use crate::lineage::reader::Reader;
use crate::record::Frozen;
use crate::session_key::SessionKey;
use crate::wire::Refusal;

/// `session.baseline` (spec §4): the first episode's frozen plan — one item per fetched
/// provider (its catalog digest), the optional items admitted absent, the composition digest —
/// and the tool names it runs with; both generations are 0 (no mid-session change is served).
/// A plan-less session has no items and no composition digest. Beside them, the `cache`
/// declaration (spec §4a; absent for a config this build cannot read). `not_yet` until the
/// session has an episode. Owner only: the caller was authorized before (`super::owners`).
pub(super) fn session_baseline(ops: &Ops, key: &SessionKey) -> Result<Value, Refusal> {
    use cortexkit_role_llm_runner::baseline::{states, BaselineReply};
    let not_yet = || serde_json::to_value(BaselineReply::not_yet()).expect("baselines serialize");
    let Some(reader) = Reader::open(ops.registry.shared(), key) else { return Ok(not_yet()) };
    let first = super::owners::first_run_started(&reader).map_err(|e| e.refusal())?;
    let Some(first) = first else { return Ok(not_yet()) };
    let baseline = match &first.config {
        Frozen::Config(c) => c.baseline(),
        Frozen::Unreadable(v) => {
            let tool_names = v
                .get("tools")
                .and_then(Value::as_array)
                .map(|tools| {
                    tools.iter().filter_map(|t| t.get("name").and_then(Value::as_str).map(String::from)).collect()
                })
                .unwrap_or_default();
            let role = cortexkit_role_llm_runner::baseline::Baseline::plan_less(tool_names);
            SessionBaseline { role, cache: None }
        }
    };
    Ok(super::body(Ready { state: states::READY, baseline }))
}

/// `{state: "ready", baseline}`: the role's `BaselineReply`, with broca's baseline (its `cache`
/// declaration beside the role's members).
#[derive(serde::Serialize)]
struct Ready {
    state: &'static str,
    baseline: SessionBaseline,
}
