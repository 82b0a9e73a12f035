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
