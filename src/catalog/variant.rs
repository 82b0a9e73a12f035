//! Reasoning variants (`session.send.model.variant`): which names a model defines, derived from
//! its `capability.reasoning_options` as OpenCode derives them, and what each name renders to
//! per wire family (spec §4, the variant table).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde_json::Value;

use super::ModelRow;
use crate::provider::event::Family;
use crate::provider::wire::wire;
pub use crate::provider::wire::Setting;

/// The largest thinking budget a `max` variant asks for.
const BUDGET_CEILING: u64 = 31_999;

fn log_unknown_once(kind: &str) {
    static SEEN: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    if SEEN.get_or_init(Default::default).lock().insert(kind.to_string()) {
        log::warn!(target: "broca.catalog", "reasoning option type {kind:?} is not known to this build; it defines no variant");
    }
}

/// The model's variants in order, each with its setting.
pub fn variants(row: &ModelRow, family: Family) -> Vec<(String, Setting)> {
    let options = row.reasoning_options.as_deref().unwrap_or(&[]);
    let of_type = |t: &str| options.iter().find(|o| o.get("type").and_then(Value::as_str) == Some(t));
    for o in options {
        match o.get("type").and_then(Value::as_str) {
            Some("effort" | "budget_tokens" | "toggle") => {}
            other => log_unknown_once(other.unwrap_or("<none>")),
        }
    }
    if let Some(effort) = of_type("effort") {
        let mut out = Vec::new();
        if of_type("toggle").is_some() && wire(family).has_toggle_mapping() {
            out.push(("none".to_string(), Setting::ToggleOff));
        }
        for v in effort.get("values").and_then(Value::as_array).into_iter().flatten() {
            if let Some(name) = v.as_str() {
                out.push((name.to_string(), Setting::Effort(name.to_string())));
            }
        }
        return out;
    }
    if let Some(budget) = of_type("budget_tokens") {
        let min = budget.get("min").and_then(Value::as_u64).unwrap_or(0);
        let published_max = budget.get("max").and_then(Value::as_u64).unwrap_or(u64::MAX);
        let output_cap = row.limit_output.map_or(u64::MAX, |o| o.saturating_sub(1));
        let max = published_max.min(output_cap).min(BUDGET_CEILING);
        let high = (max / 2).max(min);
        return vec![("high".into(), Setting::Budget(high)), ("max".into(), Setting::Budget(max))];
    }
    if of_type("toggle").is_some() {
        return vec![("none".into(), Setting::ToggleOff), ("thinking".into(), Setting::ToggleOn)];
    }
    Vec::new()
}

/// The request members a setting renders to for `family` (`Value::Null` when the family sends
/// nothing for it).
pub fn render(setting: &Setting, family: Family, wire_model: &str) -> Value {
    wire(family).render_variant(setting, wire_model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(options: Value, output: Option<u64>) -> ModelRow {
        ModelRow { reasoning_options: options.as_array().cloned(), limit_output: output, ..ModelRow::default() }
    }

    fn names(v: &[(String, Setting)]) -> Vec<&str> {
        v.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn derivation_follows_the_spec() {
        let effort = row(json!([{"type": "effort", "values": ["low", null, "high"]}]), None);
        assert_eq!(names(&variants(&effort, Family::OpenaiResponses)), ["low", "high"]);
        let both = row(json!([{"type": "toggle"}, {"type": "effort", "values": ["low", "max"]}]), None);
        assert_eq!(names(&variants(&both, Family::OpenaiChat)), ["low", "max"], "chat has no toggle mapping");
        assert_eq!(names(&variants(&both, Family::AnthropicMessages)), ["none", "low", "max"]);
        let budget = row(json!([{"type": "budget_tokens", "min": 1024}]), Some(64000));
        assert_eq!(
            variants(&budget, Family::AnthropicMessages),
            [("high".into(), Setting::Budget(15_999)), ("max".into(), Setting::Budget(31_999))]
        );
        let small = row(json!([{"type": "budget_tokens", "min": 1024, "max": 1500}]), Some(8000));
        assert_eq!(variants(&small, Family::AnthropicMessages)[0].1, Setting::Budget(1024), "at least the minimum");
        let toggle = row(json!([{"type": "toggle"}]), None);
        assert_eq!(names(&variants(&toggle, Family::AnthropicMessages)), ["none", "thinking"]);
        assert!(variants(&row(json!([]), None), Family::OpenaiChat).is_empty());
        assert!(variants(&row(Value::Null, None), Family::OpenaiChat).is_empty());
        assert!(variants(&row(json!([{"type": "future"}]), None), Family::OpenaiChat).is_empty());
    }

    #[test]
    fn rendering_per_family() {
        let e = Setting::Effort("high".into());
        assert_eq!(render(&e, Family::OpenaiChat, "m"), json!({"reasoning_effort": "high"}));
        assert_eq!(render(&e, Family::OpenaiResponses, "m")["reasoning"]["summary"], "auto");
        assert!(render(&e, Family::AnthropicMessages, "claude-opus-4-6").get("thinking").is_some());
        assert!(render(&e, Family::AnthropicMessages, "claude-sonnet-4-5").get("thinking").is_none());
        assert_eq!(render(&Setting::Budget(9), Family::OpenaiChat, "m"), Value::Null);
    }
}
