//! `session.baseline` (spec §4, llm-runner/v1 §10): the first episode's frozen plan.

use serde_json::Value;

use super::Ops;
use crate::lineage::reader::{Reader, Sink, Start};
use crate::record::{Frozen, Record};
use crate::session_key::SessionKey;
use crate::wire::Refusal;

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
        Frozen::Config(c) => c.baseline(),
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
