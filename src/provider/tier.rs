//! Provider service levels (llm-runner §9.3.2, the `service_tier` group): which abstract levels
//! each wire family can apply, how a family spells them on a request, and how a provider's
//! statement of the tier it served reads back.
//!
//! The declaration (`role.describe.service_tiers`) is keyed by routing's wire spellings and is
//! the one table admission checks a send against, so what broca says it serves and what it
//! accepts cannot drift. Mappings (from the providers' public docs):
//!
//! - Anthropic Messages: `fast` is `speed: "fast"` (fast mode) with the `fast-mode-2026-02-01`
//!   beta header that its research-preview models ask for. The response states no speed broca
//!   reads, so the wire's served policy is `unknown`: broca applies the level and never claims
//!   what was served.
//! - OpenAI Responses and Chat Completions: `fast` is `service_tier: "priority"` (OpenAI's fast
//!   mode, which also accepts the newer spelling `"fast"`). The response's `service_tier`
//!   states what ran (`reported`): `priority`/`fast` read `fast`, `default` reads `standard`,
//!   `ultrafast` reads `ultrafast`, anything else (`flex`, `scale`, …) is kept verbatim.
//! - The other families (Gemini, Code Assist, Bedrock Converse, the ChatGPT backend) declare
//!   no level: a non-standard send on them is refused `unsupported_tier`, never downgraded.
//!
//! `ultrafast` is declared nowhere: no provider's public docs give broca a request value it
//! can apply on every model of a route.

use cortexkit_role_llm_runner::service_tier::{Served, ServiceTier, ServiceTiers, Support};

use crate::frozen::Family;

/// The beta header Anthropic's fast mode asks for on its research-preview models.
const ANTHROPIC_FAST_BETA: (&str, &str) = ("anthropic-beta", "fast-mode-2026-02-01");

/// Routing's spelling of a family's wire API (the declaration's keys).
pub fn wire_api(family: Family) -> &'static str {
    match family {
        Family::AnthropicMessages => "anthropic.messages",
        Family::OpenaiChat => "openai.chat_completions",
        Family::OpenaiResponses => "openai.responses",
        Family::OpenaiChatgptResponses => "openai.chatgpt_responses",
        Family::GoogleGenerateContent => "google.generate_content",
        Family::GoogleCodeAssist => "google.code_assist",
        Family::AwsBedrockConverse => "aws.bedrock_converse",
    }
}

/// The levels each family applies and whether it reads the served tier back.
fn support(family: Family) -> Option<Support> {
    match family {
        Family::AnthropicMessages => Some(Support::new(vec![ServiceTier::Fast], Served::Unknown)),
        Family::OpenaiChat | Family::OpenaiResponses => Some(Support::new(vec![ServiceTier::Fast], Served::Reported)),
        Family::OpenaiChatgptResponses
        | Family::GoogleGenerateContent
        | Family::GoogleCodeAssist
        | Family::AwsBedrockConverse => None,
    }
}

/// `role.describe.service_tiers`: every family that applies a non-standard level.
pub fn declared() -> ServiceTiers {
    Family::ALL.iter().filter_map(|f| Some((wire_api(*f).to_owned(), support(*f)?))).collect()
}

/// Whether `family` reads the served tier from its responses (`served: "reported"`).
pub fn reports_served(family: Family) -> bool {
    support(family).is_some_and(|s| matches!(s.served, Served::Reported))
}

/// The abstract level an OpenAI response's `service_tier` names; an unmapped value verbatim.
pub fn openai_served(raw: &str) -> String {
    match raw {
        "priority" | "fast" => ServiceTier::Fast.as_str().into(),
        "default" | "standard" => ServiceTier::Standard.as_str().into(),
        "ultrafast" => ServiceTier::Ultrafast.as_str().into(),
        other => other.into(),
    }
}

/// Adds the level's request members to an OpenAI (Responses or Chat) body.
pub fn render_openai(tier: Option<ServiceTier>, body: &mut serde_json::Value) {
    if tier == Some(ServiceTier::Fast) {
        body["service_tier"] = serde_json::json!("priority");
    }
}

/// The request header a level needs on `family`, beside its body members.
pub fn request_header(family: Family, tier: Option<ServiceTier>) -> Option<(&'static str, &'static str)> {
    (family == Family::AnthropicMessages && tier == Some(ServiceTier::Fast)).then_some(ANTHROPIC_FAST_BETA)
}

/// Adds the level's request members to an Anthropic Messages body.
pub fn render_anthropic(tier: Option<ServiceTier>, body: &mut serde_json::Value) {
    if tier == Some(ServiceTier::Fast) {
        body["speed"] = serde_json::json!("fast");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_passes_the_role_crates_check_and_names_real_wires() {
        let declared = declared();
        cortexkit_role_llm_runner::service_tier::check_service_tiers(&declared).unwrap();
        assert_eq!(
            declared.keys().collect::<Vec<_>>(),
            ["anthropic.messages", "openai.chat_completions", "openai.responses"]
        );
        for family in Family::ALL {
            assert!(cortexkit_role_llm_runner::service_tier::WIRE_APIS.contains(&wire_api(family)));
        }
        assert!(reports_served(Family::OpenaiResponses) && !reports_served(Family::AnthropicMessages));
        assert_eq!(request_header(Family::AnthropicMessages, Some(ServiceTier::Fast)), Some(ANTHROPIC_FAST_BETA));
        assert_eq!(request_header(Family::OpenaiChat, Some(ServiceTier::Fast)), None);
    }

    #[test]
    fn openai_served_values_read_back_as_levels_or_verbatim() {
        assert_eq!(openai_served("priority"), "fast");
        assert_eq!(openai_served("fast"), "fast");
        assert_eq!(openai_served("default"), "standard");
        assert_eq!(openai_served("flex"), "flex");
    }
}
