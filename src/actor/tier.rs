//! The service level a send's run takes (llm-runner §9.3.2), decided on the session's actor where
//! the route and any running run are known, before anything is written or sent.
//!
//! - A send joining a running run (a steer or a queued send behind it) takes the run's level
//!   when it names none; naming another one is refused `run_tier_fixed`.
//! - A steer or an interrupt takes the session's frozen level when it names none (spec §4
//!   line 152); any other send without one runs at standard.
//! - A non-standard level the route's family does not declare (`provider::tier`) is refused
//!   `unsupported_tier`: never silently downgraded.

use cortexkit_role_llm_runner::service_tier::{check_send, ServiceTier, TierProblem};

use crate::frozen::{Family, FrozenConfig};
use crate::provider::tier;
use crate::wire::send::{Delivery, SendParams};
use crate::wire::{Refusal, RefusalCode};

/// The level the send's run is admitted at: `None` for standard (what the frozen config keeps).
pub(super) fn run_tier(
    send: &SendParams,
    running: bool,
    frozen: Option<&FrozenConfig>,
    family: Family,
) -> Result<Option<ServiceTier>, Refusal> {
    let frozen_level = frozen.and_then(|c| c.service_tier).unwrap_or_default();
    let joins = running && send.delivery != Delivery::Interrupt;
    let fixed = joins.then_some(frozen_level);
    let inherits = !joins && matches!(send.delivery, Delivery::Steer | Delivery::Interrupt);
    let requested = send.service_tier.or(inherits.then_some(frozen_level));
    let wire = tier::wire_api(family);
    match check_send(requested, fixed, wire, Some(&tier::declared())) {
        Ok(level) => Ok((!level.is_standard()).then_some(level)),
        Err(problem) => Err(refusal(problem, requested.or(fixed).unwrap_or_default(), wire)),
    }
}

fn refusal(problem: TierProblem, level: ServiceTier, wire: &str) -> Refusal {
    let message = match problem {
        TierProblem::RunTierFixed => {
            "invalid params: service_tier: the running run's level is fixed; a send joining it cannot change it".into()
        }
        _ => format!("invalid params: service_tier: {} is not served on this route ({wire})", level.as_str()),
    };
    let detail = crate::detail!("field" => "service_tier", "reason" => problem.reason());
    Refusal::new(RefusalCode::InvalidParams, message, Some(detail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::send::parse;

    /// A parsed send: the base params with `extra`'s members (a JSON object) added.
    fn send(extra: impl serde::Serialize) -> SendParams {
        let extra = serde_json::to_value(extra).unwrap();
        let mut params = serde_json::json!({"prompt": "hi", "model": {"provider": "mock", "model": "m"}});
        params.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let key = crate::session_key::SessionKey::new("/p", "h", "s");
        parse(&params, &key).unwrap()
    }

    fn frozen(level: Option<ServiceTier>) -> FrozenConfig {
        let mut config = crate::frozen::test_route("mock", Family::AnthropicMessages, "m");
        config.service_tier = level;
        config
    }

    fn reason(result: Result<Option<ServiceTier>, Refusal>) -> String {
        let refusal = result.unwrap_err();
        refusal.detail.as_ref().and_then(|d| d.get("reason")).and_then(|r| r.as_str()).unwrap_or_default().to_owned()
    }

    #[test]
    fn levels_are_checked_against_the_routes_family() {
        let fast = send(serde_json::json!({"service_tier": "fast"}));
        assert_eq!(run_tier(&fast, false, None, Family::AnthropicMessages).unwrap(), Some(ServiceTier::Fast));
        assert_eq!(run_tier(&fast, false, None, Family::OpenaiResponses).unwrap(), Some(ServiceTier::Fast));
        assert_eq!(reason(run_tier(&fast, false, None, Family::GoogleGenerateContent)), "unsupported_tier");
        let ultra = send(serde_json::json!({"service_tier": "ultrafast"}));
        assert_eq!(reason(run_tier(&ultra, false, None, Family::OpenaiChat)), "unsupported_tier");
        let standard = send(serde_json::json!({"service_tier": "standard"}));
        assert_eq!(run_tier(&standard, false, None, Family::AwsBedrockConverse).unwrap(), None);
    }

    #[test]
    fn a_running_run_fixes_its_level_and_steers_inherit_it() {
        let fast = frozen(Some(ServiceTier::Fast));
        let anthropic = Family::AnthropicMessages;
        let queued_standard = send(serde_json::json!({"service_tier": "standard"}));
        assert_eq!(reason(run_tier(&queued_standard, true, Some(&fast), anthropic)), "run_tier_fixed");
        let queued = send(serde_json::json!({}));
        assert_eq!(run_tier(&queued, true, Some(&fast), anthropic).unwrap(), Some(ServiceTier::Fast));
        // Idle: a plain send takes defaults, a steer or an interrupt the frozen level.
        assert_eq!(run_tier(&queued, false, Some(&fast), anthropic).unwrap(), None);
        let steer = send(serde_json::json!({"delivery": "steer"}));
        assert_eq!(run_tier(&steer, false, Some(&fast), anthropic).unwrap(), Some(ServiceTier::Fast));
        // An interrupt ends the running run: it may name another level.
        let interrupt = send(serde_json::json!({"delivery": "interrupt", "service_tier": "standard"}));
        assert_eq!(run_tier(&interrupt, true, Some(&fast), anthropic).unwrap(), None);
        // An inherited level the new route cannot apply is refused, not dropped.
        assert_eq!(reason(run_tier(&steer, false, Some(&fast), Family::GoogleGenerateContent)), "unsupported_tier");
    }
}
