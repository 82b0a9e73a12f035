//! Admission-time resolution: a requested `provider/model` (+ variant) and the catalog become a
//! frozen [`RenderConfig`], or a typed refusal that writes nothing.
//!
//! Routing reads only the row's `wire.npm`, `wire.api` and optional `wire.shape`: no guessed
//! URLs, no local model lists. `BROCA_PROVIDER_BASE_URL` (passed in as `base_url_override`)
//! replaces the base URL for mock providers and needs no credential.

use std::path::PathBuf;

use super::variant::{self, Setting};
use super::{Catalog, ModelRow};
use crate::provider::config::{AuthSource, RenderConfig, ToolSpec};
use crate::provider::event::Family;
use crate::wire::{Refusal, RefusalCode};

/// What the caller asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelRequest {
    /// `provider/model`.
    pub model: String,
    pub variant: Option<String>,
    pub system: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub max_steps: Option<u64>,
    pub tools: Vec<ToolSpec>,
}

/// Where the route and credential come from beyond the catalog.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteOverrides {
    pub base_url_override: Option<String>,
    pub auth: AuthSource,
    /// broca has a vault route (a subc consumer connection): a catalog route with no other
    /// credential freezes `AuthSource::Vault {credential_id: "apikey:<provider>"}` (spec §1b).
    pub vault: bool,
    /// Keep vault auth on `base_url_override` routes too (debug builds' `BROCA_TEST_VAULT_AUTH=1`,
    /// so the e2e rig checks vault credentials against the mock provider); off, a mock route
    /// is credential-free.
    pub vault_on_override: bool,
    /// The auth method a provider's routes use (`broca.jsonc` `auth_methods`, `broca-run
    /// --auth-method`); a provider not named uses its API key.
    pub auth_methods: std::collections::BTreeMap<String, AuthMethod>,
}

/// The vault credential a provider's catalog routes read: its API key record.
pub fn credential_id(provider: &str) -> String {
    credential_id_for(provider, AuthMethod::ApiKey)
}

/// The vault credential of `provider` under `method` (`<method>:<provider>`, the claustrum
/// record ids: `apikey:openai`, `chatgpt:openai`, `antigravity:google`).
pub fn credential_id_for(provider: &str, method: AuthMethod) -> String {
    format!("{}:{provider}", method.as_str())
}

pub use crate::frozen::AuthMethod;

/// The Code Assist backend an `antigravity` credential requires (its route's endpoint; a
/// mock's base URL override replaces it).
pub const CODE_ASSIST: &str = "https://cloudcode-pa.googleapis.com";

/// The ChatGPT/Codex backend a `chatgpt` credential requires (its route's endpoint; a mock's
/// base URL override replaces it).
pub const CHATGPT_BACKEND: &str = "https://chatgpt.com/backend-api/codex";

/// Why a model cannot be admitted. Each maps to a typed refusal.
#[derive(Debug, Clone, PartialEq)]
pub enum AdmissionError {
    /// No in-memory catalog. Names the LKG path to seed.
    CatalogUnavailable {
        lkg_path: PathBuf,
        cause: String,
    },
    ModelUnknown {
        model: String,
    },
    NotAChatModel {
        model: String,
        kind: Option<String>,
    },
    Retired {
        model: String,
    },
    /// A routing fact is missing (`wire.api`, `wire.npm`).
    RouteFactMissing {
        model: String,
        fact: &'static str,
    },
    /// The package or shape is not one broca drives.
    RouteUnsupported {
        model: String,
        what: String,
    },
    VariantUnsupported {
        model: String,
        variant: String,
        defined: Vec<String>,
    },
    /// A level the row defines but the Code Assist route has no tier for (`tiers`: the route's).
    TierUnsupported {
        model: String,
        variant: String,
        defined: Vec<String>,
        tiers: Vec<String>,
    },
    /// A budget variant whose budget is not below the output cap.
    BudgetExceedsOutput {
        model: String,
        budget: u64,
        output: u64,
    },
    /// A real provider needs a credential and none was configured.
    CredentialUnavailable {
        model: String,
    },
}

const PREFIX: &str = "open failed: run resolution failed: ";

impl AdmissionError {
    pub fn refusal(&self) -> Refusal {
        let permanent = Some(crate::detail!("class" => "permanent"));
        match self {
            AdmissionError::CatalogUnavailable { lkg_path, cause } => Refusal::new(RefusalCode::OpenFailed,
                format!(
                    "{PREFIX}model catalog unavailable: no in-memory catalog ({cause}; seed {} or let broca reach fusiform over subc once)",
                    lkg_path.display()
                ),
                Some(crate::detail!("class" => "transient")),
            ),
            AdmissionError::ModelUnknown { model } => {
                Refusal::new(RefusalCode::ModelUnknown, format!("{PREFIX}model '{model}' is not in the catalog"), permanent)
            }
            AdmissionError::NotAChatModel { model, kind } => Refusal::new(RefusalCode::OpenFailed,
                format!("{PREFIX}model '{model}' is a {} model, not a chat model", kind.as_deref().unwrap_or("unstated-kind")),
                permanent,
            ),
            AdmissionError::Retired { model } => {
                Refusal::new(RefusalCode::OpenFailed, format!("{PREFIX}model '{model}' is retired in the catalog"), permanent)
            }
            AdmissionError::RouteFactMissing { model, fact } => Refusal::new(RefusalCode::OpenFailed,
                format!("{PREFIX}model '{model}' cannot be routed: the catalog states no {fact}"),
                permanent,
            ),
            AdmissionError::RouteUnsupported { model, what } => {
                Refusal::new(RefusalCode::OpenFailed, format!("{PREFIX}model '{model}' cannot be routed: {what}"), permanent)
            }
            AdmissionError::VariantUnsupported { model, variant, defined } => Refusal::new(RefusalCode::VariantUnsupported,
                format!("{PREFIX}model '{model}' does not define variant '{variant}'; its variants are [{}]", defined.join(", ")),
                Some(crate::detail!("model" => model, "variant" => variant, "defined" => defined)),
            ),
            AdmissionError::TierUnsupported { model, variant, defined, tiers } => Refusal::new(RefusalCode::VariantUnsupported,
                format!(
                    "{PREFIX}model '{model}' defines variant '{variant}', but its Code Assist route has no tier for it; the route's tiers are [{}]",
                    tiers.join(", ")
                ),
                Some(crate::detail!("model" => model, "variant" => variant, "defined" => defined)),
            ),
            AdmissionError::BudgetExceedsOutput { model, budget, output } => Refusal::new(RefusalCode::OpenFailed,
                format!("{PREFIX}model '{model}': the thinking budget {budget} does not fit under the output cap {output}"),
                permanent,
            ),
            AdmissionError::CredentialUnavailable { model } => Refusal::new(RefusalCode::OpenFailed,
                format!(
                    "{PREFIX}model '{model}' needs a provider credential: pass --auth-bearer, or point --base-url (BROCA_PROVIDER_BASE_URL) at a mock provider"
                ),
                Some(crate::detail!("class" => "auth_required")),
            ),
        }
    }
}

/// The wire family a row routes to, from `wire.npm` and `wire.shape`.
fn family_of(row: &ModelRow) -> Result<Family, AdmissionError> {
    let model = row.key.clone();
    let npm =
        row.wire_npm.as_deref().ok_or(AdmissionError::RouteFactMissing { model: model.clone(), fact: "wire.npm" })?;
    let shape = row.wire_shape.as_deref();
    let unsupported = |what: String| AdmissionError::RouteUnsupported { model: model.clone(), what };
    match (npm, shape) {
        ("@ai-sdk/anthropic", None | Some("messages")) => Ok(Family::AnthropicMessages),
        ("@ai-sdk/openai", None | Some("responses")) => Ok(Family::OpenaiResponses),
        ("@ai-sdk/openai" | "@ai-sdk/openai-compatible", Some("chat")) => Ok(Family::OpenaiChat),
        ("@ai-sdk/openai-compatible", None) => Ok(Family::OpenaiChat),
        ("@ai-sdk/openai-compatible", Some("responses")) => Ok(Family::OpenaiResponses),
        ("@ai-sdk/google", None | Some("generate_content")) => Ok(Family::GoogleGenerateContent),
        ("@ai-sdk/amazon-bedrock", None | Some("converse")) => Ok(Family::AwsBedrockConverse),
        (npm, Some(shape)) if ["@ai-sdk/anthropic", "@ai-sdk/openai", "@ai-sdk/openai-compatible"].contains(&npm) => {
            Err(unsupported(format!("wire.shape {shape:?} is not supported for wire.npm {npm:?}")))
        }
        (npm, _) => Err(unsupported(format!("wire.npm {npm:?} is not a package broca drives"))),
    }
}

/// Resolves a request against the catalog into the config to freeze into `RunStarted`.
pub fn resolve(
    catalog: Result<&Catalog, &super::CatalogError>,
    lkg_path: PathBuf,
    req: &ModelRequest,
    overrides: &RouteOverrides,
) -> Result<RenderConfig, AdmissionError> {
    let catalog = catalog.map_err(|e| AdmissionError::CatalogUnavailable { lkg_path, cause: e.to_string() })?;
    let model = req.model.clone();
    let Some(row) = catalog.row(&req.model) else {
        // A variant on an unknown model is refused as a variant (its variants cannot be known).
        if let Some(variant) = &req.variant {
            return Err(AdmissionError::VariantUnsupported { model, variant: variant.clone(), defined: vec![] });
        }
        return Err(AdmissionError::ModelUnknown { model });
    };
    if row.kind.as_deref().is_some_and(|k| k != "chat") {
        return Err(AdmissionError::NotAChatModel { model, kind: row.kind.clone() });
    }
    if row.existence != "present" {
        return Err(AdmissionError::Retired { model });
    }
    let method = overrides.auth_methods.get(&row.provider).copied().unwrap_or_default();
    let (family, endpoint) = match (family_of(row)?, method) {
        (Family::OpenaiResponses, AuthMethod::Chatgpt) => (Family::OpenaiChatgptResponses, Some(CHATGPT_BACKEND)),
        (_, AuthMethod::Chatgpt) => {
            let what = "a chatgpt credential serves only OpenAI Responses models".to_string();
            return Err(AdmissionError::RouteUnsupported { model, what });
        }
        (Family::GoogleGenerateContent, AuthMethod::Antigravity) => (Family::GoogleCodeAssist, Some(CODE_ASSIST)),
        (_, AuthMethod::Antigravity) => {
            let what = "an antigravity credential serves only Gemini models (Code Assist)".to_string();
            return Err(AdmissionError::RouteUnsupported { model, what });
        }
        (family, AuthMethod::Sigv4) if family != Family::AwsBedrockConverse => {
            let what = "a sigv4 credential (an AWS access key) serves only Bedrock Converse models".to_string();
            return Err(AdmissionError::RouteUnsupported { model, what });
        }
        (family, _) => (family, None),
    };
    let base_url = match (&overrides.base_url_override, endpoint, &row.wire_api) {
        (Some(url), _, _) => url.clone(),
        (None, Some(endpoint), _) => endpoint.to_string(),
        (None, None, Some(api)) => api.clone(),
        (None, None, None) => return Err(AdmissionError::RouteFactMissing { model, fact: "wire.api" }),
    };
    let mocked = overrides.base_url_override.is_some() && !overrides.vault_on_override;
    let auth = match &overrides.auth {
        AuthSource::None if mocked => AuthSource::None,
        AuthSource::None if overrides.vault => {
            AuthSource::Vault { credential_id: credential_id_for(&row.provider, method) }
        }
        AuthSource::None => return Err(AdmissionError::CredentialUnavailable { model }),
        other => other.clone(),
    };
    let max_output_tokens = match (req.max_output_tokens, row.limit_output) {
        (Some(asked), Some(limit)) => Some(asked.min(limit)),
        (asked, limit) => asked.or(limit),
    };
    if family == Family::GoogleCodeAssist {
        let defined: Vec<String> = variant::variants(row, family).into_iter().map(|(n, _)| n).collect();
        if let Some(name) = req.variant.as_ref().filter(|v| !defined.contains(v)) {
            return Err(AdmissionError::VariantUnsupported { model, variant: name.clone(), defined });
        }
        let (wire_model, variant_params) = super::tiers::resolve(row, req.variant.as_deref()).map_err(|e| match e {
            super::tiers::TierError::Missing { fact } => {
                AdmissionError::RouteFactMissing { model: model.clone(), fact }
            }
            super::tiers::TierError::NoTier { variant, tiers } => {
                AdmissionError::TierUnsupported { model: model.clone(), variant, defined: defined.clone(), tiers }
            }
        })?;
        return Ok(RenderConfig {
            wire_model,
            variant: req.variant.clone(),
            variant_params,
            ..config_of(row, family, base_url, (auth, method), req, max_output_tokens)
        });
    }
    let (variant_params, variant) = match &req.variant {
        None if family == Family::AnthropicMessages && auth != AuthSource::None && method == AuthMethod::Oauth => {
            (oauth_default_thinking(max_output_tokens), None)
        }
        None => (serde_json::Value::Null, None),
        Some(name) => {
            let defined = variant::variants(row, family);
            let Some((_, setting)) = defined.iter().find(|(n, _)| n == name) else {
                let defined = defined.into_iter().map(|(n, _)| n).collect();
                return Err(AdmissionError::VariantUnsupported { model, variant: name.clone(), defined });
            };
            let thinks_in_budget = matches!(family, Family::AnthropicMessages | Family::AwsBedrockConverse);
            if let (true, Setting::Budget(budget)) = (thinks_in_budget, setting) {
                let output = max_output_tokens.unwrap_or(0);
                if output <= *budget {
                    return Err(AdmissionError::BudgetExceedsOutput { model, budget: *budget, output });
                }
            }
            (variant::render(setting, family, &row.model), Some(name.clone()))
        }
    };
    Ok(RenderConfig {
        variant,
        variant_params,
        ..config_of(row, family, base_url, (auth, method), req, max_output_tokens)
    })
}

/// The budget of the thinking an Anthropic OAuth (subscription) request carries when the send
/// names no variant, as the subscription's own client sends it (spec §4: "A variant replaces
/// the Anthropic OAuth default thinking: {type: enabled, budget_tokens: 1024}").
pub const OAUTH_DEFAULT_THINKING_BUDGET: u64 = 1024;

/// The Anthropic OAuth default thinking (PF-24), or nothing where the Messages API would refuse
/// it: an output cap not above the budget ("`max_tokens` must be greater than
/// `thinking.budget_tokens`"). A default gives way; a variant the caller named is refused
/// instead (`BudgetExceedsOutput`). [`yield_default_thinking`] drops it under a forced tool.
fn oauth_default_thinking(max_output_tokens: Option<u64>) -> serde_json::Value {
    if max_output_tokens.is_none_or(|cap| cap <= OAUTH_DEFAULT_THINKING_BUDGET) {
        return serde_json::Value::Null;
    }
    serde_json::json!({"thinking": {"type": "enabled", "budget_tokens": OAUTH_DEFAULT_THINKING_BUDGET}})
}

/// Drops the OAuth default thinking from a config whose `tool_choice` forces a tool, which the
/// Messages API refuses with thinking on ("Thinking may not be enabled when tool_choice forces
/// tool use"); a named variant stays (the caller asked for both).
pub fn yield_default_thinking(config: &mut RenderConfig) {
    use crate::frozen::{ToolChoice, ToolChoiceMode};
    let forced =
        matches!(config.tool_choice, Some(ToolChoice::Mode(ToolChoiceMode::Required) | ToolChoice::Named { .. }));
    if forced && config.variant.is_none() && config.family == Family::AnthropicMessages {
        config.variant_params = serde_json::Value::Null;
    }
}

/// The render config of `row` on `family` before its variant (none, with the row's own id).
fn config_of(
    row: &ModelRow,
    family: Family,
    base_url: String,
    (auth, method): (AuthSource, AuthMethod),
    req: &ModelRequest,
    max_output_tokens: Option<u64>,
) -> RenderConfig {
    // The kind is recorded only with a credential: a credential-free (mock) route has none.
    let auth_method = if auth == AuthSource::None { AuthMethod::ApiKey } else { method };
    RenderConfig {
        provider: row.provider.clone(),
        model: row.model.clone(),
        family,
        base_url: base_url.trim_end_matches('/').to_string(),
        wire_model: row.model.clone(),
        variant: None,
        variant_params: serde_json::Value::Null,
        system: req.system.clone(),
        max_output_tokens,
        max_steps: req.max_steps,
        directives: Vec::new(),
        tools: req.tools.clone(),
        auth,
        auth_method,
        policy: Default::default(),
        plan: None,
        tool_choice: None,
        service_tier: None,
        code_assist: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog() -> Catalog {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        Catalog::load_lkg(&path).unwrap()
    }

    fn mock() -> RouteOverrides {
        RouteOverrides { base_url_override: Some("http://127.0.0.1:9/v1/".into()), ..Default::default() }
    }

    fn resolve_model(model: &str, variant: Option<&str>) -> Result<RenderConfig, AdmissionError> {
        let req = ModelRequest { model: model.into(), variant: variant.map(String::from), ..Default::default() };
        resolve(Ok(&catalog()), PathBuf::from("/lkg"), &req, &mock())
    }

    #[test]
    fn rows_route_by_package_and_shape() {
        assert_eq!(resolve_model("mock/echo-chat", None).unwrap().family, Family::OpenaiChat);
        assert_eq!(resolve_model("mock/echo-messages", None).unwrap().family, Family::AnthropicMessages);
        let r = resolve_model("mock/echo-responses", None).unwrap();
        assert_eq!((r.family, r.base_url.as_str()), (Family::OpenaiResponses, "http://127.0.0.1:9/v1"));
        assert_eq!(r.max_output_tokens, Some(4096), "limit.output is the default cap");
        assert!(matches!(resolve_model("mock/odd-package", None), Err(AdmissionError::RouteUnsupported { .. })));
        assert!(matches!(resolve_model("nope/nothing", None), Err(AdmissionError::ModelUnknown { .. })));
        assert!(matches!(resolve_model("anthropic/claude-opus-4-1", None), Err(AdmissionError::Retired { .. })));
        let clef = resolve_model("cloudflare-workers-ai/@cf/cloudflare/clef", None);
        assert!(matches!(clef, Err(AdmissionError::NotAChatModel { .. })));
    }

    #[test]
    fn a_missing_endpoint_is_named_and_never_guessed() {
        let req = ModelRequest { model: "mock/no-route".into(), ..Default::default() };
        let auth = RouteOverrides { base_url_override: None, auth: AuthSource::Bearer, ..Default::default() };
        let err = resolve(Ok(&catalog()), PathBuf::from("/lkg"), &req, &auth).unwrap_err();
        assert_eq!(err, AdmissionError::RouteFactMissing { model: "mock/no-route".into(), fact: "wire.api" });
        assert!(err.refusal().message.contains("mock/no-route") && err.refusal().message.contains("wire.api"));
    }

    #[test]
    fn variants_are_checked_and_frozen() {
        let r = resolve_model("mock/think-messages", Some("high")).unwrap();
        assert_eq!(r.variant_params["thinking"]["budget_tokens"], 15_999);
        let err = resolve_model("mock/echo-chat", Some("high")).unwrap_err();
        assert_eq!(
            err.refusal().to_json(),
            r#"{"code":"variant_unsupported","message":"open failed: run resolution failed: model 'mock/echo-chat' does not define variant 'high'; its variants are []","detail":{"model":"mock/echo-chat","variant":"high","defined":[]}}"#
        );
        let err = resolve_model("mock/effort-responses", Some("max")).unwrap_err();
        assert_eq!(err.refusal().detail.unwrap().get("defined"), Some(&json!(["low", "medium", "high"])));
        assert_eq!(resolve_model("mock/echo-chat", None).unwrap().variant_params, serde_json::Value::Null);
    }

    /// PF-24: an Anthropic OAuth send without a variant thinks with the subscription client's
    /// default budget; a variant replaces it; an API key, a cap not above the budget and a
    /// forced tool send none.
    #[test]
    fn anthropic_oauth_sends_default_thinking_that_a_variant_replaces() {
        let oauth = |model: &str, variant: Option<&str>, cap: Option<u64>| {
            let req = ModelRequest {
                model: model.into(),
                variant: variant.map(String::from),
                max_output_tokens: cap,
                ..Default::default()
            };
            let overrides = RouteOverrides {
                auth: AuthSource::Bearer,
                auth_methods: [("mock".to_owned(), AuthMethod::Oauth)].into(),
                ..mock()
            };
            resolve(Ok(&catalog()), PathBuf::from("/lkg"), &req, &overrides).unwrap()
        };
        let default = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
        assert_eq!(oauth("mock/echo-messages", None, None).variant_params, default);
        assert_eq!(
            oauth("mock/think-messages", Some("high"), None).variant_params["thinking"]["budget_tokens"],
            15_999
        );
        assert_eq!(oauth("mock/echo-messages", None, Some(1024)).variant_params, serde_json::Value::Null);
        assert_eq!(oauth("mock/echo-chat", None, None).variant_params, serde_json::Value::Null, "Anthropic only");
        assert_eq!(resolve_model("mock/echo-messages", None).unwrap().variant_params, serde_json::Value::Null);
        let mut forced = oauth("mock/echo-messages", None, None);
        forced.tool_choice = Some(crate::frozen::ToolChoice::Named { tool: "t".into() });
        yield_default_thinking(&mut forced);
        assert_eq!(forced.variant_params, serde_json::Value::Null);
        let mut named = oauth("mock/think-messages", Some("high"), None);
        named.tool_choice = Some(crate::frozen::ToolChoice::Named { tool: "t".into() });
        yield_default_thinking(&mut named);
        assert_ne!(named.variant_params, serde_json::Value::Null, "a named variant stays");
    }

    #[test]
    fn no_catalog_names_the_cause_and_the_remedy() {
        let missing = super::super::CatalogError::Missing { path: "/root/catalog/fusiform-lkg.json".into() };
        let req = ModelRequest { model: "mock/echo-chat".into(), ..Default::default() };
        let err = resolve(Err(&missing), "/root/catalog/fusiform-lkg.json".into(), &req, &mock()).unwrap_err();
        let msg = err.refusal().message;
        assert!(msg.contains("model catalog unavailable: no in-memory catalog"), "{msg}");
        assert!(msg.contains("seed /root/catalog/fusiform-lkg.json"), "{msg}");
    }
}
