//! How a request carries its credential: one typed decision per (family, credential kind)
//! (#46), each row with its public source. A provider refuses a credential in the wrong place
//! (Anthropic answers an API key sent as `Authorization: Bearer` with 401), so the header is
//! never a family-wide default.
//!
//! | family | kind | carried as | source |
//! |---|---|---|---|
//! | Anthropic Messages | API key | `x-api-key: <key>` | Anthropic API reference, "Authentication" |
//! | Anthropic Messages | OAuth | `Authorization: Bearer <token>`, `anthropic-beta: oauth-2025-04-20` | Claude Code's client; the API's 401 "OAuth authentication is currently not supported" without the beta |
//! | OpenAI Chat / Responses | API key | `Authorization: Bearer <key>` | OpenAI API reference, "Authentication" |
//! | ChatGPT/Codex backend | chatgpt OAuth | `Authorization: Bearer <token>` (+ `chatgpt-account-id`) | OpenAI's Codex CLI |
//! | Gemini GenerateContent | API key | `x-goog-api-key: <key>` | Gemini API reference, "API keys" |
//! | Gemini GenerateContent | OAuth | `Authorization: Bearer <token>` | Google OAuth for the Gemini API |
//! | Code Assist | antigravity OAuth | `Authorization: Bearer <token>` | Gemini CLI's Code Assist client |
//! | Bedrock Converse | API key | `Authorization: Bearer <key>` | AWS "Use an Amazon Bedrock API key" |

use crate::frozen::{AuthMethod, Family};

/// The beta an Anthropic OAuth access token needs on the Messages API.
pub const ANTHROPIC_OAUTH_BETA: &str = "oauth-2025-04-20";
/// The header Anthropic reads betas from (comma-separated when several apply).
pub const ANTHROPIC_BETA: &str = "anthropic-beta";

/// Where a credential goes on a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The token alone in the named header.
    Header(&'static str),
}

/// How one (family, kind) authenticates: the credential's carrier and the betas it requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub carrier: Carrier,
    /// Values of [`ANTHROPIC_BETA`] the credential requires (merged with the request's own).
    pub betas: &'static [&'static str],
}

/// The decision for a credential of `kind` on `family`.
pub fn decide(family: Family, kind: AuthMethod) -> Decision {
    let carrier = match (family, kind) {
        (Family::AnthropicMessages, AuthMethod::ApiKey) => Carrier::Header("x-api-key"),
        (Family::GoogleGenerateContent, AuthMethod::ApiKey) => Carrier::Header("x-goog-api-key"),
        _ => Carrier::Bearer,
    };
    let betas: &'static [&'static str] = match (family, kind) {
        (Family::AnthropicMessages, AuthMethod::Oauth) => &[ANTHROPIC_OAUTH_BETA],
        _ => &[],
    };
    Decision { carrier, betas }
}

impl Decision {
    /// The header carrying `token`.
    pub fn header(&self, token: &str) -> (&'static str, String) {
        match self.carrier {
            Carrier::Bearer => ("authorization", format!("Bearer {token}")),
            Carrier::Header(name) => (name, token.to_owned()),
        }
    }
}

/// One `anthropic-beta` value from the betas a request needs, each once, in order.
pub fn merge_betas<'a>(betas: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for beta in betas.into_iter().flat_map(|b| b.split(',')).map(str::trim).filter(|b| !b.is_empty()) {
        if !seen.contains(&beta) {
            seen.push(beta);
        }
    }
    (!seen.is_empty()).then(|| seen.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_takes_an_api_key_in_x_api_key_and_an_oauth_token_as_a_bearer_with_its_beta() {
        let key = decide(Family::AnthropicMessages, AuthMethod::ApiKey);
        assert_eq!(key.header("sk-ant"), ("x-api-key", "sk-ant".to_owned()));
        assert!(key.betas.is_empty());
        let oauth = decide(Family::AnthropicMessages, AuthMethod::Oauth);
        assert_eq!(oauth.header("tok"), ("authorization", "Bearer tok".to_owned()));
        assert_eq!(oauth.betas, [ANTHROPIC_OAUTH_BETA]);
    }

    #[test]
    fn every_other_family_carries_its_credential_where_its_provider_reads_it() {
        assert_eq!(decide(Family::GoogleGenerateContent, AuthMethod::ApiKey).header("k").0, "x-goog-api-key");
        assert_eq!(decide(Family::GoogleGenerateContent, AuthMethod::Oauth).header("k").0, "authorization");
        for family in [Family::OpenaiChat, Family::OpenaiResponses, Family::AwsBedrockConverse] {
            assert_eq!(decide(family, AuthMethod::ApiKey).header("k"), ("authorization", "Bearer k".to_owned()));
        }
        assert_eq!(decide(Family::OpenaiChatgptResponses, AuthMethod::Chatgpt).carrier, Carrier::Bearer);
        assert_eq!(decide(Family::GoogleCodeAssist, AuthMethod::Antigravity).carrier, Carrier::Bearer);
    }

    #[test]
    fn betas_merge_into_one_header_each_once() {
        assert_eq!(merge_betas([]), None);
        assert_eq!(merge_betas(["a"]), Some("a".into()));
        assert_eq!(
            merge_betas(["fast-mode-2026-02-01", "oauth-2025-04-20"]).unwrap(),
            "fast-mode-2026-02-01,oauth-2025-04-20"
        );
        assert_eq!(merge_betas(["a,b", "b", " c "]).unwrap(), "a,b,c");
    }
}
