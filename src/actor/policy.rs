//! The session policy a send runs under (spec §4): the facts frozen by the session's first
//! episode (class, context management, conversation key) are checked, the input-token cap may
//! only fall, and whatever a send omits is inherited. Nothing is written when it refuses.

use serde_json::{json, Value};

use crate::config::BrocaConfig;
use crate::lineage::Lineage;
use crate::provider::config::{RenderConfig, RunPolicy};
use crate::record::Delivery;
use crate::wire::send::SendParams;
use crate::wire::{invalid_params, Refusal, RefusalCode};

/// The session policy a new send runs under: frozen facts checked, omitted ones inherited.
/// The module and `broca-run` admit through it alike (nothing is written when it refuses).
pub fn session_policy(
    broca_config: &BrocaConfig,
    lineage: &Lineage,
    send: &SendParams,
    frozen: Option<&RenderConfig>,
) -> Result<RunPolicy, Refusal> {
    let state = lineage.state();
    let had_episode = state.last.is_some();
    let prior = frozen.map(|c| c.policy.clone()).unwrap_or_default();
    // The class is frozen by the first send, its absence included.
    let session_class = match (&send.session_class, had_episode) {
        (Some(c), true) if prior.session_class.as_ref() != Some(c) => {
            return Err(invalid_params("session_class", "the session's class was frozen by its first send"))
        }
        (c, true) => c.clone().or(prior.session_class.clone()),
        (c, false) => c.clone(),
    };
    // Context management binds on the first episode; a session without a recorded value is "none".
    let bound =
        if had_episode { Some(prior.context_management.clone().unwrap_or_else(|| json!("none"))) } else { None };
    let context_management = match (&send.context_management, bound) {
        (Some(sent), Some(bound)) if *sent != bound => {
            let message = format!("context_management is bound to {bound} for this session; {sent} differs");
            let detail = crate::detail!("frozen" => bound, "sent" => sent, "class" => "permanent");
            return Err(Refusal::new(RefusalCode::ContextManagementChanged, message, Some(detail)));
        }
        (_, Some(bound)) => bound,
        (Some(sent), None) => sent.clone(),
        (None, None) => json!(broca_config.context_default_for(&lineage.key().project_root).unwrap_or("none")),
    };
    if context_management != "none" {
        // Bound (by an older build) to a mode this build does not serve: never run it as "none".
        return Err(context_unavailable(&context_management));
    }
    let max_input_tokens = match (send.max_input_tokens, state.input_cap) {
        (Some(new), Some(cap)) if new > cap => {
            return Err(invalid_params("budget.max_input_tokens", "the session's input-token cap can only decrease"))
        }
        (new, cap) => new.or(cap),
    };
    let retention = retention(send.retention, prior.retention, had_episode)?;
    let inherits = matches!(send.delivery, Delivery::Steer | Delivery::Interrupt);
    let (conversation_key, source) = match (&send.conversation_key, &prior.conversation_key) {
        (Some(k), _) => (k.clone(), "caller"),
        (None, Some(k)) => (k.clone(), "inherited"),
        (None, None) => (lineage.key().addr(), "session"),
    };
    Ok(RunPolicy {
        context_management: Some(context_management),
        session_class,
        on_restart: send.on_restart.clone(),
        max_input_tokens,
        cache: send.cache.or(if inherits { prior.cache } else { None }),
        conversation_key: Some(conversation_key),
        conversation_key_source: Some(source.into()),
        retention,
        route_decision_id: send.route_decision_id.clone(),
        // Spec §4 line 152: a steer or interrupt takes what it omits from the frozen config.
        work_class: send.work_class.clone().or(if inherits { prior.work_class } else { None }),
        context_limit: send.context_limit.or(if inherits { prior.context_limit } else { None }),
    })
}

/// The session's retention after this send (llm-runner §9.1): the first send freezes it (its
/// absence means kept forever); a later send may only shorten it, and omitting it keeps it.
fn retention(sent: Option<u64>, frozen: Option<u64>, had_episode: bool) -> Result<Option<u64>, Refusal> {
    match (sent, frozen) {
        (Some(_), None) if had_episode => {
            Err(invalid_params("retention", "the session was first sent without retention: it is kept forever"))
        }
        (Some(new), Some(old)) if new > old => {
            Err(invalid_params("retention", &format!("the session's retention is {old} s and can only be shortened")))
        }
        (sent, frozen) => Ok(sent.or(frozen)),
    }
}

pub(super) fn context_unavailable(mode: &Value) -> Refusal {
    let name = match mode {
        Value::Object(m) => m.get("transform").and_then(Value::as_str).unwrap_or("").to_string(),
        other => other.as_str().unwrap_or("").to_string(),
    };
    let message = format!("context management {name:?} is not available in this build");
    let detail = crate::detail!("mode" => mode, "class" => "permanent");
    Refusal::new(RefusalCode::ContextManagementUnavailable, message, Some(detail))
}
