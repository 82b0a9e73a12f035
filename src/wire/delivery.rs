//! `delivery` on `session.send` (spec §4, llm-runner §9.7): a legacy mode string, or an ordered
//! list of delivery modes with the members only a list may carry (`dedupe_key`,
//! `expires_at_ms`, `template`). Decided before anything is written; the sender's grants and the
//! template's rendering are decided on the session's actor, where the frozen plan is known.

use cortexkit_role_llm_runner::delivery_order::{DeliveryOrder, Mode, MEMBERS, TEMPLATE_FIELD};
use serde_json::{Map, Value};

use super::{invalid_params, Refusal, RefusalCode};
use crate::record::Delivery;

/// The list modes broca can deliver (`role.describe.delivery_order_modes`). `turn_system` is
/// not among them: no route broca renders to confirms a turn-scoped system message, so a
/// template's text always goes out at user authority (llm-runner §9.7, "A runner that can
/// never land `turn_system` should advertise `delivery_order_modes` without it").
pub const DECLARED_MODES: &[Mode] = &[Mode::ToolResult, Mode::Steer, Mode::IdleStart];

/// How a send asks to be delivered.
#[derive(Clone, Debug, PartialEq)]
pub enum SendDelivery {
    /// A legacy string (or none: `queue`).
    Mode(Delivery),
    /// An ordered list with its members.
    Order(DeliveryOrder),
}

impl SendDelivery {
    /// The legacy mode the send's record keeps: a list is recorded as `queue` beside its list.
    pub fn legacy(&self) -> Delivery {
        match self {
            SendDelivery::Mode(d) => *d,
            SendDelivery::Order(_) => Delivery::Queue,
        }
    }

    pub fn order(&self) -> Option<&DeliveryOrder> {
        match self {
            SendDelivery::Order(o) => Some(o),
            SendDelivery::Mode(_) => None,
        }
    }

    /// The list this delivery stands for, for a sender's grants (`interrupt` has none).
    pub fn modes(&self) -> Option<Vec<Mode>> {
        match self {
            SendDelivery::Order(o) => Some(o.modes.clone()),
            SendDelivery::Mode(d) => cortexkit_role_llm_runner::delivery_order::legacy_equivalent(match d {
                Delivery::Queue => cortexkit_role_llm_runner::send::Delivery::Queue,
                Delivery::Steer => cortexkit_role_llm_runner::send::Delivery::Steer,
                Delivery::Interrupt => cortexkit_role_llm_runner::send::Delivery::Interrupt,
            }),
        }
    }
}

/// Decodes `delivery` and the list members beside it. A malformed list (not modes, empty, a
/// mode twice) is refused naming `delivery`; a list member without a list, or malformed,
/// naming that member; a list of only modes broca does not declare is refused
/// `delivery_unsupported` with the list as sent.
pub fn parse(obj: &Map<String, Value>) -> Result<SendDelivery, Refusal> {
    let modes = match obj.get("delivery") {
        None => None,
        Some(Value::String(s)) => {
            let mode = match s.as_str() {
                "queue" => Delivery::Queue,
                "steer" => Delivery::Steer,
                "interrupt" => Delivery::Interrupt,
                _ => return Err(invalid_params("delivery", "\"queue\", \"steer\", \"interrupt\" or a list of modes")),
            };
            if let Some(member) = MEMBERS.iter().find(|m| obj.contains_key(**m)) {
                return Err(invalid_params(member, "valid only beside a list in delivery"));
            }
            return Ok(SendDelivery::Mode(mode));
        }
        Some(list @ Value::Array(_)) => Some(list_modes(list)?),
        Some(_) => return Err(invalid_params("delivery", "a mode string or a list of modes")),
    };
    let order = match DeliveryOrder::decode(modes.as_deref(), obj) {
        Ok(Some(order)) => order,
        Ok(None) => return Ok(SendDelivery::Mode(Delivery::Queue)),
        Err(member) if modes.is_none() => return Err(invalid_params(member, "valid only beside a list in delivery")),
        Err(member) => return Err(invalid_params(member, "malformed")),
    };
    if !order.modes.iter().any(|m| DECLARED_MODES.contains(m)) {
        let list = obj.get("delivery").cloned().unwrap_or(Value::Null);
        let message = "delivery_unsupported: this runner delivers none of the list's modes (it declares tool_result, steer and idle_start)";
        return Err(Refusal::new(RefusalCode::DeliveryUnsupported, message, Some(crate::detail!("delivery" => list))));
    }
    Ok(SendDelivery::Order(order))
}

/// The modes of a list: known, at least one, none twice.
fn list_modes(list: &Value) -> Result<Vec<Mode>, Refusal> {
    let why = "a non-empty list of distinct modes: tool_result, turn_system, steer, idle_start";
    let modes: Vec<Mode> = serde_json::from_value(list.clone()).map_err(|_| invalid_params("delivery", why))?;
    let mut seen = modes.clone();
    seen.sort_unstable();
    seen.dedup();
    if modes.is_empty() || seen.len() != modes.len() {
        return Err(invalid_params("delivery", why));
    }
    Ok(modes)
}

/// The send's text shape (llm-runner §9.7, `SendRequest::check_prompt`): a template send carries
/// no `prompt` member at all (refused naming `template`); any other send a non-empty one.
/// `Ok(None)` for a template send, whose text the actor renders.
pub fn prompt(obj: &Map<String, Value>, delivery: &SendDelivery) -> Result<Option<String>, Refusal> {
    let template = delivery.order().is_some_and(|o| o.template.is_some());
    match (template, obj.get("prompt")) {
        (true, None) => Ok(None),
        (true, Some(_)) => Err(invalid_params(TEMPLATE_FIELD, "a template send carries no prompt")),
        (false, Some(Value::String(p))) if !p.trim().is_empty() => Ok(Some(p.clone())),
        (false, _) if delivery.order().is_some() => {
            Err(invalid_params(TEMPLATE_FIELD, "a send without a template needs a non-empty prompt"))
        }
        (false, _) => Err(invalid_params("prompt", "a non-empty string is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn field(r: Refusal) -> (String, Option<Value>) {
        let detail = serde_json::to_value(&r).unwrap();
        (r.code.as_str().to_owned(), detail.get("detail").and_then(|d| d.get("field")).cloned())
    }

    #[test]
    fn strings_keep_their_meaning_and_lists_decode_with_their_members() {
        assert_eq!(parse(&obj(json!({}))).unwrap(), SendDelivery::Mode(Delivery::Queue));
        assert_eq!(parse(&obj(json!({"delivery": "steer"}))).unwrap(), SendDelivery::Mode(Delivery::Steer));
        let listed = parse(&obj(json!({"delivery": ["tool_result", "steer"], "dedupe_key": "k", "expires_at_ms": 5})));
        let order = listed.unwrap().order().cloned().unwrap();
        assert_eq!(order.modes, vec![Mode::ToolResult, Mode::Steer]);
        assert_eq!((order.dedupe_key.as_deref(), order.expires_at_ms), (Some("k"), Some(5)));
    }

    #[test]
    fn malformed_lists_and_stray_members_are_refused_by_name() {
        for (params, code, named) in [
            (json!({"delivery": []}), "invalid_params", "delivery"),
            (json!({"delivery": ["steer", "steer"]}), "invalid_params", "delivery"),
            (json!({"delivery": ["later"]}), "invalid_params", "delivery"),
            (json!({"delivery": "steer", "dedupe_key": "k"}), "invalid_params", "dedupe_key"),
            (json!({"expires_at_ms": 1}), "invalid_params", "expires_at_ms"),
            (json!({"delivery": ["steer"], "dedupe_key": ""}), "invalid_params", "dedupe_key"),
        ] {
            let (c, f) = field(parse(&obj(params.clone())).unwrap_err());
            assert_eq!((c.as_str(), f), (code, Some(json!(named))), "{params}");
        }
        let r = parse(&obj(json!({"delivery": ["turn_system"]}))).unwrap_err();
        assert_eq!(r.code, RefusalCode::DeliveryUnsupported);
        assert_eq!(serde_json::to_value(&r).unwrap()["detail"]["delivery"], json!(["turn_system"]));
    }

    #[test]
    fn a_template_send_has_no_prompt_and_any_other_send_one() {
        let template = json!({"id": "t", "digest": "d", "slots": {}});
        let d = parse(&obj(json!({"delivery": ["steer"], "template": template}))).unwrap();
        assert_eq!(prompt(&obj(json!({})), &d).unwrap(), None);
        assert_eq!(field(prompt(&obj(json!({"prompt": ""})), &d).unwrap_err()).1, Some(json!("template")));
        let plain = parse(&obj(json!({"delivery": ["steer"]}))).unwrap();
        assert_eq!(field(prompt(&obj(json!({})), &plain).unwrap_err()).1, Some(json!("template")));
        let legacy = parse(&obj(json!({}))).unwrap();
        assert_eq!(field(prompt(&obj(json!({"prompt": " "})), &legacy).unwrap_err()).1, Some(json!("prompt")));
    }
}
