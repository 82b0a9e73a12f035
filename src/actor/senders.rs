//! Who may send to a session besides its owner, and what a `delivery_order` send says
//! (llm-runner §9.7): the plan's senders admit named modules, matched on the route's attested
//! principal, never on a request field; a template send's text is rendered here from the plan's
//! template, every slot checked; a keyed list send replaces its sender's waiting send with the
//! same `dedupe_key`. Everything is decided before anything is written.

use cortexkit_role_llm_runner::delivery_order::{self, DeliveryOrder, Mode, PartRef, PlanSender};

use crate::frozen::FrozenConfig;
use crate::lineage::Lineage;
use crate::owner::{Caller, Owner, RESERVED_PREFIX};
use crate::record::Delivery;
use crate::replay::Replay;
use crate::wire::send::SendParams;
use crate::wire::{invalid_params, Refusal, RefusalCode};

/// Who a send comes from, once admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sender {
    /// The session's owner (or anyone before the first episode, whose send records the owner).
    Owner,
    /// A module the frozen plan names in `senders`, by its module id.
    Named(String),
}

impl Sender {
    /// The principal a send record keeps (`RequestIdentity.principal`): only a named sender's,
    /// so the owner's sends are recorded as they always were.
    pub fn principal(&self) -> Option<String> {
        match self {
            Sender::Owner => None,
            Sender::Named(module) => Some(module.clone()),
        }
    }
}

/// The module id of an attested local caller (`reserved:<module>`).
pub fn caller_module(caller: &Caller) -> Option<&str> {
    if caller.via.is_some() {
        return None;
    }
    caller.attested().and_then(|p| p.strip_prefix(RESERVED_PREFIX))
}

/// The module id an owner's attested principal names.
fn owner_module(owner: Option<&Owner>) -> Option<&str> {
    owner.and_then(|o| o.principal.as_deref()).and_then(|p| p.strip_prefix(RESERVED_PREFIX))
}

/// The frozen plan's senders of the session's latest episode.
pub fn plan_senders(config: Option<&FrozenConfig>) -> &[PlanSender] {
    config.and_then(|c| c.plan.as_ref()).map_or(&[], |p| p.senders.as_slice())
}

/// The send's admission against the session's durable owner and plan: the owner (or anyone
/// before the first episode) with any delivery; a named sender with the grants its entry holds
/// (`idle_start`, `interrupt`); anyone else `scope_owner_mismatch`, writing nothing.
pub fn admit(lineage: &Lineage, send: &SendParams, caller: &Caller) -> Result<Sender, Refusal> {
    let Some(last) = lineage.state().last.as_ref() else { return Ok(Sender::Owner) };
    if crate::owner::admits(last.owner.as_ref(), caller) {
        return Ok(Sender::Owner);
    }
    let mismatch = || crate::wire::scope_owner_mismatch(crate::op::Op::SessionSend.name(), caller);
    let module = caller_module(caller).ok_or_else(mismatch)?;
    let senders = plan_senders(last.config.config());
    let owner = last.owner.as_ref().and_then(|o| o.principal.as_deref()).unwrap_or_default();
    let admitted = match &send.order {
        Some(order) => delivery_order::admit(module, Some(owner), senders, &order.modes),
        None => delivery_order::admit_delivery(module, Some(owner), senders, role_delivery(send.delivery)),
    };
    match admitted {
        Ok(()) => Ok(Sender::Named(module.to_owned())),
        Err((_, Some(field))) => Err(invalid_params(field, "the sender's plan entry does not grant this delivery")),
        Err((_, None)) => Err(mismatch()),
    }
}

fn role_delivery(delivery: Delivery) -> cortexkit_role_llm_runner::send::Delivery {
    use cortexkit_role_llm_runner::send::Delivery as Role;
    match delivery {
        Delivery::Queue => Role::Queue,
        Delivery::Steer => Role::Steer,
        Delivery::Interrupt => Role::Interrupt,
    }
}

/// A template send's one text, rendered from the plan's template for its sender (the owner's
/// templates are an entry naming the owner's module) and checked slot by slot. `Ok(None)` for a
/// send without a template. A template that cannot render refuses the send: `invalid_params
/// {field: "template"}`, or `template_part_gone {slot}` when a `part_tag` names a part the
/// session does not show.
pub fn render(lineage: &Lineage, order: Option<&DeliveryOrder>, sender: &Sender) -> Result<Option<String>, Refusal> {
    let Some(used) = order.and_then(|o| o.template.as_ref()) else { return Ok(None) };
    let last = lineage.state().last.as_ref();
    let config = last.and_then(|e| e.config.config());
    let module = match sender {
        Sender::Named(m) => Some(m.as_str()),
        Sender::Owner => owner_module(last.and_then(|e| e.owner.as_ref())),
    };
    let templates = plan_senders(config)
        .iter()
        .find(|s| Some(s.module.as_str()) == module)
        .map_or(&[][..], |s| s.templates.as_slice());
    let numbers = PartNumbers::of(lineage, config, templates, used)?;
    match delivery_order::render(templates, used, |part| numbers.shown(part)) {
        Ok(text) => Ok(Some(text)),
        Err(problem) => {
            let (code, detail) = problem.refusal();
            let (code, message) = if code == cortexkit_role_llm_runner::errors::TEMPLATE_PART_GONE {
                (
                    RefusalCode::TemplatePartGone,
                    "template_part_gone: a part_tag slot names a part the session does not show",
                )
            } else {
                (
                    RefusalCode::InvalidParams,
                    "invalid params: template: it does not render from the sender's plan template",
                )
            };
            let detail = crate::wire::Detail(
                detail
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| slot_key(k).map(|k| (k, v.clone())))
                    .collect(),
            );
            Err(Refusal::new(code, message, Some(detail)))
        }
    }
}

/// The detail keys a template refusal carries (`Detail` holds static keys).
fn slot_key(key: &str) -> Option<&'static str> {
    match key {
        "slot" => Some("slot"),
        "field" => Some("field"),
        _ => None,
    }
}

/// The part numbers the session's next request shows (`refs::tags`), read only when the
/// template has a `part_tag` slot and the session renders numbers at all.
struct PartNumbers(Vec<(String, Vec<Option<u64>>)>);

impl PartNumbers {
    fn of(
        lineage: &Lineage,
        config: Option<&FrozenConfig>,
        templates: &[delivery_order::Template],
        used: &delivery_order::TemplateUse,
    ) -> Result<PartNumbers, Refusal> {
        let tagged = templates
            .iter()
            .find(|t| t.id == used.id)
            .is_some_and(|t| t.slots.values().any(|s| *s == delivery_order::Slot::PartTag));
        if !tagged || !config.is_some_and(FrozenConfig::renders_part_numbers) {
            return Ok(PartNumbers(Vec::new()));
        }
        let page = lineage.transcript(0, u64::MAX).map_err(|e| e.refusal())?;
        let history: Vec<_> = page.messages.iter().map(|(_, m)| m.clone()).collect();
        let numbers = crate::refs::tags::numbers(&history);
        let mids = page.messages.iter().map(|(ordinal, _)| crate::lineage::projection::mid(*ordinal));
        Ok(PartNumbers(mids.zip(numbers).collect()))
    }

    fn shown(&self, part: &PartRef) -> Option<u64> {
        let (_, parts) = self.0.iter().find(|(mid, _)| *mid == part.mid)?;
        // A part is keyed as reads and display rows key it, `p<index>`.
        let index: usize = part.part.strip_prefix('p')?.parse().ok()?;
        parts.get(index).copied().flatten()
    }
}

/// The waiting list sends a keyed send from `sender` replaces (llm-runner §9.7 `dedupe_key`):
/// same sender, same key, still queued.
pub fn superseded(lineage: &Lineage, order: Option<&DeliveryOrder>, sender: &Sender) -> Vec<String> {
    let Some(key) = order.and_then(|o| o.dedupe_key.as_deref()) else { return Vec::new() };
    let principal = sender.principal();
    lineage
        .state()
        .queue
        .iter()
        .filter(|p| p.request.order.is_some() && p.request.principal == principal)
        .filter(|p| p.request.dedupe_key.as_deref() == Some(key))
        .map(|p| p.submission_id.clone())
        .collect()
}

/// Whether a list may be delivered now on an idle session: its first possible mode there is
/// `idle_start` (the only mode possible with no run).
pub fn starts_now(modes: &[Mode]) -> bool {
    let idle = delivery_order::Boundary::default().with_idle();
    delivery_order::choose(modes, &idle) == Some(Mode::IdleStart)
}

/// The send namespaces a sender's keyed send (or `session.send_status`) looks in, in order
/// (llm-runner §9.7 `sender_succession`): a successor's predecessor's first, then its own. A
/// namespace is the `principal` its sends record (`None`: the owner's).
pub fn namespaces(state: &Replay, sender: &Sender) -> Vec<Option<String>> {
    let Sender::Named(module) = sender else { return vec![None] };
    let senders = plan_senders(state.last.as_ref().and_then(|e| e.config.config()));
    let predecessor = cortexkit_role_llm_runner::sender_succession::predecessor(senders, module);
    predecessor.map(|p| Some(p.to_owned())).into_iter().chain([Some(module.clone())]).collect()
}

/// Who `caller` sends as on a session in `state`, for reading its own sends: the owner (or
/// anyone the session admits as the owner, or a stranger, who reads the owner's), or a named
/// sender.
pub fn reader_of(state: &Replay, caller: &Caller) -> Sender {
    let Some(last) = state.last.as_ref() else { return Sender::Owner };
    if crate::owner::admits(last.owner.as_ref(), caller) {
        return Sender::Owner;
    }
    let named = caller_module(caller).filter(|m| plan_senders(last.config.config()).iter().any(|s| s.module == *m));
    named.map_or(Sender::Owner, |m| Sender::Named(m.to_owned()))
}
