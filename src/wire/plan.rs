//! A session's fetch plan: `session.send.plan` (spec §4; llm-runner 0.8.0 §10.1). Decoded and
//! checked before anything is fetched or written; every fault names its member.
//!
//! - tool items come from `tool_items` (the fetch-plan shape) or `items` (the role vectors'
//!   shape), never both; each names its provider module, an optional preset (an omission is
//!   kept, never turned into an empty string), its params (passed to the provider verbatim) and
//!   optionally `optional: true` (literal `false` is refused);
//! - system-text items require a preset (spec §4: tool-provider has no default selector);
//! - `compaction_item` and `step_transform_items` are refused by name: this build serves
//!   neither;
//! - an item's `output_refs` (llm-runner §9.13) is a boolean, absent meaning false; anything
//!   else is refused naming the item list's `[].output_refs` field;
//! - the plan's identity is the SHA-256 of its canonical (JCS) bytes as sent: `plan_drift`
//!   compares identities, never content.

use cortexkit_role_llm_runner::{capabilities, delivery_order, delivery_order::PlanSender, sender_succession};
use cortexkit_role_tool_provider::catalog;
use serde_json::{Map, Value};

use super::{invalid_params, Refusal};

/// How many tool items (and system-text items) one plan may name.
pub const MAX_PLAN_ITEMS: usize = 32;

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub tool_items: Vec<ToolItem>,
    pub system_text_items: Vec<SystemTextItem>,
    /// The session's composition, passed to providers verbatim.
    pub composition: Option<Map<String, Value>>,
    pub composition_digest: Option<String>,
    /// SHA-256 (lowercase hex) of the plan's JCS bytes.
    pub identity: String,
    /// The modules besides the owner whose sends the session admits, with their grants and
    /// templates (llm-runner §9.7 `senders`).
    pub senders: Vec<PlanSender>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ToolItem {
    /// The tool-provider module's id.
    pub provider: String,
    pub preset: Option<String>,
    pub params: Map<String, Value>,
    /// Absent rather than refused when its provider cannot be fetched.
    pub optional: bool,
    /// The item opts its tools' reference slots into output references (§9.13).
    pub output_refs: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SystemTextItem {
    pub provider: String,
    pub preset: String,
    pub params: Map<String, Value>,
    /// The item opts into output references (§9.13): its session renders part numbers.
    pub output_refs: bool,
}

/// Decodes and checks `plan`.
pub fn decode(plan: &Value) -> Result<Plan, Refusal> {
    let obj = plan.as_object().ok_or_else(|| invalid_params("plan", "an object is required"))?;
    if let Some(item) = obj.get("compaction_item") {
        // A compaction item names its role preset explicitly (llm-runner §10.1) before the
        // item itself is refused as unserved.
        if item.get("preset").is_none() {
            return Err(invalid_params("plan.compaction_item.preset", "a compaction item names its preset"));
        }
    }
    for refused in ["compaction_item", "step_transform_items"] {
        if obj.contains_key(refused) {
            return Err(invalid_params(&format!("plan.{refused}"), "not served by this build"));
        }
    }
    // `output_refs` is checked on every list before any item (llm-runner §9.13); `items` is
    // the role vectors' spelling of `tool_items`.
    for (list_key, place) in
        [("tool_items", "tool_items"), ("items", "tool_items"), ("system_text_items", "system_text_items")]
    {
        let malformed = obj
            .get(list_key)
            .and_then(Value::as_array)
            .is_some_and(|items| items.iter().any(|i| i.get("output_refs").is_some_and(|v| !v.is_boolean())));
        if malformed {
            return Err(invalid_params(&format!("plan.{place}[].output_refs"), "output_refs is true or false"));
        }
    }
    let (key, items) = match (obj.get("tool_items"), obj.get("items")) {
        (Some(_), Some(_)) => return Err(invalid_params("plan.items", "give tool_items or items, not both")),
        (Some(t), None) => ("tool_items", Some(t)),
        (None, Some(i)) => ("items", Some(i)),
        (None, None) => ("tool_items", None),
    };
    let tool_items = match items {
        None => Vec::new(),
        Some(v) => list(v, &format!("plan.{key}"))?
            .iter()
            .enumerate()
            .map(|(i, item)| tool_item(item, &format!("plan.{key}[{i}]")))
            .collect::<Result<_, _>>()?,
    };
    let system_text_items = match obj.get("system_text_items") {
        None => Vec::new(),
        Some(v) => list(v, "plan.system_text_items")?
            .iter()
            .enumerate()
            .map(|(i, item)| system_text_item(item, &format!("plan.system_text_items[{i}]")))
            .collect::<Result<_, _>>()?,
    };
    let composition = match obj.get("composition") {
        None => None,
        Some(Value::Object(c)) => Some(c.clone()),
        Some(_) => return Err(invalid_params("plan.composition", "an object is required")),
    };
    let composition_digest = match obj.get("composition_digest") {
        None => None,
        Some(Value::String(d)) if catalog::is_schema_digest(d) => Some(d.clone()),
        Some(_) => return Err(invalid_params("plan.composition_digest", "64 lowercase hex characters are required")),
    };
    if let (Some(c), Some(d)) = (&composition, &composition_digest) {
        if digest(&Value::Object(c.clone())) != *d {
            return Err(invalid_params("plan.composition_digest", "does not match the composition's JCS digest"));
        }
    }
    let mut providers: Vec<&str> = tool_items.iter().map(|t: &ToolItem| t.provider.as_str()).collect();
    providers.sort_unstable();
    if let Some(w) = providers.windows(2).find(|w| w[0] == w[1]) {
        return Err(invalid_params(&format!("plan.{key}"), &format!("provider {:?} is named twice", w[0])));
    }
    let senders = senders(obj)?;
    Ok(Plan { tool_items, system_text_items, composition, composition_digest, identity: digest(plan), senders })
}

/// `senders` (llm-runner §9.7): each succession checked first (`plan.senders[<i>].succeeds`),
/// then the list (`plan.senders`: a module twice, a template's placeholders and slots apart, an
/// unknown member or slot type).
fn senders(obj: &Map<String, Value>) -> Result<Vec<PlanSender>, Refusal> {
    // The groups these checks ask about, both declared (`ops::GROUPS`).
    let groups = [capabilities::DELIVERY_ORDER, capabilities::SENDER_SUCCESSION];
    if obj.get("senders").and_then(Value::as_array).is_some_and(|s| s.len() > MAX_PLAN_ITEMS) {
        return Err(invalid_params("plan.senders", &format!("at most {MAX_PLAN_ITEMS} senders")));
    }
    sender_succession::check_plan(obj, &groups)
        .map_err(|field| invalid_params(&field, "a module other than the sender's own, named by one sender only"))?;
    delivery_order::check_plan(obj, &groups).map_err(|field| invalid_params(field, "malformed senders"))?;
    delivery_order::plan_senders(obj).map_err(|field| invalid_params(field, "malformed senders"))
}

/// SHA-256 (lowercase hex) of a value's JCS bytes (RFC 8785), as tool-provider computes a
/// `composition_digest`.
pub fn digest(value: &Value) -> String {
    catalog::composition_digest(value).unwrap_or_default()
}

fn list<'a>(v: &'a Value, field: &str) -> Result<&'a Vec<Value>, Refusal> {
    let items = v.as_array().ok_or_else(|| invalid_params(field, "an array is required"))?;
    if items.len() > MAX_PLAN_ITEMS {
        return Err(invalid_params(field, &format!("at most {MAX_PLAN_ITEMS} items")));
    }
    Ok(items)
}

fn provider(obj: &Map<String, Value>, at: &str) -> Result<String, Refusal> {
    match obj.get("provider") {
        Some(Value::String(p)) if !p.is_empty() && p.len() <= 255 && !p.chars().any(char::is_control) => Ok(p.clone()),
        _ => Err(invalid_params(&format!("{at}.provider"), "a module id is required")),
    }
}

fn params(obj: &Map<String, Value>, at: &str) -> Result<Map<String, Value>, Refusal> {
    match obj.get("params") {
        None => Ok(Map::new()),
        Some(Value::Object(p)) => Ok(p.clone()),
        Some(_) => Err(invalid_params(&format!("{at}.params"), "an object is required")),
    }
}

fn preset(obj: &Map<String, Value>, at: &str) -> Result<Option<String>, Refusal> {
    match obj.get("preset") {
        None => Ok(None),
        Some(Value::String(p)) if subc_protocol::tool_call::validate_preset(p).is_ok() => Ok(Some(p.clone())),
        Some(_) => Err(invalid_params(&format!("{at}.preset"), "a preset name ([a-z0-9_-], 1-32 bytes) is required")),
    }
}

fn tool_item(item: &Value, at: &str) -> Result<ToolItem, Refusal> {
    let obj = item.as_object().ok_or_else(|| invalid_params(at, "an object is required"))?;
    let optional = match obj.get("optional") {
        None => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(invalid_params(&format!("{at}.optional"), "only true is accepted")),
    };
    let (provider, preset, params) = (provider(obj, at)?, preset(obj, at)?, params(obj, at)?);
    Ok(ToolItem { provider, preset, params, optional, output_refs: output_refs(obj) })
}

fn system_text_item(item: &Value, at: &str) -> Result<SystemTextItem, Refusal> {
    let obj = item.as_object().ok_or_else(|| invalid_params(at, "an object is required"))?;
    if obj.contains_key("optional") {
        return Err(invalid_params(&format!("{at}.optional"), "system text cannot be optional"));
    }
    let provider = provider(obj, at)?;
    let preset = preset(obj, at)?.ok_or_else(|| {
        invalid_params(&format!("{at}.preset"), "required: tool-provider has no default system-text selector")
    })?;
    Ok(SystemTextItem { provider, preset, params: params(obj, at)?, output_refs: output_refs(obj) })
}

/// An item's `output_refs` (checked to be a boolean before any item is decoded).
fn output_refs(obj: &Map<String, Value>) -> bool {
    obj.get("output_refs") == Some(&Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(e: Refusal) -> String {
        e.detail.and_then(|d| d.get("field").and_then(|f| f.as_str().map(String::from))).unwrap_or_default()
    }

    #[test]
    fn both_item_shapes_decode_and_an_omitted_preset_stays_omitted() {
        let a = decode(&json!({"tool_items": [{"provider": "aft", "params": {"x": 1}}]})).unwrap();
        assert_eq!(a.tool_items[0].preset, None);
        assert_eq!(a.tool_items[0].params["x"], 1);
        let b = decode(&json!({"items": [{"provider": "aft", "preset": "default", "params": {}}]})).unwrap();
        assert_eq!(b.tool_items[0].preset.as_deref(), Some("default"));
        assert_ne!(a.identity, b.identity);
        let refs = decode(
            &json!({"tool_items": [{"provider": "a", "output_refs": true}, {"provider": "b", "output_refs": false}]}),
        );
        let refs = refs.unwrap();
        assert!(refs.tool_items[0].output_refs && !refs.tool_items[1].output_refs && !a.tool_items[0].output_refs);
    }

    #[test]
    fn every_fault_names_its_member() {
        let cases = [
            (json!([]), "plan"),
            (json!({"tool_items": [{"provider": ""}]}), "plan.tool_items[0].provider"),
            (json!({"tool_items": [{"provider": "a", "optional": false}]}), "plan.tool_items[0].optional"),
            (json!({"tool_items": [{"provider": "a", "preset": "Bad!"}]}), "plan.tool_items[0].preset"),
            (json!({"system_text_items": [{"provider": "a", "params": {}}]}), "plan.system_text_items[0].preset"),
            (json!({"compaction_item": {"provider": "mc", "preset": "head"}}), "plan.compaction_item"),
            (json!({"tool_items": [{"provider": "a"}, {"provider": "a"}]}), "plan.tool_items"),
            (json!({"composition": {"a": 1}, "composition_digest": "0".repeat(64)}), "plan.composition_digest"),
            (json!({"tool_items": [{"provider": "a", "output_refs": "yes"}]}), "plan.tool_items[].output_refs"),
            (json!({"items": [{"provider": "a", "output_refs": 1}]}), "plan.tool_items[].output_refs"),
            (
                json!({"system_text_items": [{"provider": "a", "output_refs": null}]}),
                "plan.system_text_items[].output_refs",
            ),
        ];
        for (plan, expected) in cases {
            assert_eq!(field(decode(&plan).unwrap_err()), expected, "{plan}");
        }
    }

    #[test]
    fn the_identity_is_the_jcs_digest_so_member_order_does_not_matter() {
        let a =
            decode(&json!({"tool_items": [{"provider": "a", "params": {}}], "composition": {"b": 1, "a": 2}})).unwrap();
        let b =
            decode(&json!({"composition": {"a": 2, "b": 1}, "tool_items": [{"params": {}, "provider": "a"}]})).unwrap();
        assert_eq!(a.identity, b.identity);
        let composition = json!({"a": 2, "b": 1});
        let with_digest = json!({"composition": composition, "composition_digest": digest(&composition)});
        assert!(decode(&with_digest).is_ok());
    }
}
