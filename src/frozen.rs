//! The frozen config (records layer): everything a run's requests depend on besides the
//! transcript, and the admission policy it ran under. Resolved at admission, written typed into
//! `RunStarted.config` and `Queued.request.config`, and the only input a resume renders from (a
//! resume never re-reads the catalog). Its serde form is the record bytes: members are only ever
//! added, each absent when unset, so WALs written before a member existed read the same.

use cortexkit_role_tool_provider::catalog::Reply;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The wire families broca speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Anthropic Messages (`POST {api}/messages`).
    AnthropicMessages,
    /// OpenAI Chat Completions and compatibles (`POST {api}/chat/completions`).
    OpenaiChat,
    /// OpenAI Responses (`POST {api}/responses`).
    OpenaiResponses,
    /// Google Gemini (`POST {api}/models/{model}:streamGenerateContent?alt=sse`).
    GoogleGenerateContent,
    /// The ChatGPT/Codex backend (`POST {backend}/responses`): Responses as a ChatGPT
    /// subscription's credential speaks it.
    OpenaiChatgptResponses,
    /// Amazon Bedrock Converse (`POST {api}/model/{model}/converse-stream`, an AWS event
    /// stream).
    AwsBedrockConverse,
    /// Google Code Assist (`POST {backend}/v1internal:streamGenerateContent?alt=sse`): Gemini
    /// in Code Assist's envelope, as an Antigravity credential speaks it.
    GoogleCodeAssist,
}

impl Family {
    /// Every family, in declaration order.
    pub const ALL: [Family; 7] = [
        Family::AnthropicMessages,
        Family::OpenaiChat,
        Family::OpenaiResponses,
        Family::OpenaiChatgptResponses,
        Family::GoogleGenerateContent,
        Family::GoogleCodeAssist,
        Family::AwsBedrockConverse,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Family::AnthropicMessages => "anthropic_messages",
            Family::OpenaiChat => "openai_chat",
            Family::OpenaiResponses => "openai_responses",
            Family::GoogleGenerateContent => "google_generate_content",
            Family::OpenaiChatgptResponses => "openai_chatgpt_responses",
            Family::AwsBedrockConverse => "aws_bedrock_converse",
            Family::GoogleCodeAssist => "google_code_assist",
        }
    }
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: Value,
    /// `{max_ms, hold_argument?}` (tool-provider's `Reply`): the longest one call may take to
    /// answer (frozen with the tool; never rendered into a provider request or sent to the
    /// tool). Absent: the default wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
    /// The tool-provider module that serves this tool (set by a fetch plan); absent for a
    /// send's own tools. Frozen with the tool, never rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The plan item's preset, forwarded on every call of this tool (absent: none sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// The tool's `schema_pin` (`tp1:<tool>:<schema_digest>:<semantics>`) as fetched: a call
    /// carries it, so a provider whose definition changed refuses instead of running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
    /// The tool's catalog `result_format` as fetched (`tool-result/v1`): with the capability on
    /// the route, its answers are `tool-result/v1` bodies and it may hold a call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_format: Option<cortexkit_role_tool_provider::result::ResultFormat>,
    /// Its plan item opted into output references (llm-runner §9.13): each call of it gets a
    /// call set scanned from `reference_slots`. Frozen with the tool, never rendered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_refs: bool,
    /// The catalog's reference-bearing arguments, as fetched (only for an opted-in tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_slots: Vec<cortexkit_role_llm_runner::output_refs::ReferenceSlot>,
}

impl ToolSpec {
    /// How long broca waits for one call of this tool: its `reply.max_ms`, never less than
    /// the `default` wait.
    pub fn wait(&self, default: std::time::Duration) -> std::time::Duration {
        let asked = self.reply.as_ref().map_or(0, |r| r.max_ms);
        std::time::Duration::from_millis(asked).max(default)
    }
}

/// How the request authenticates. The secret itself is never frozen, logged or written: the
/// frozen config names only where it comes from, and the process supplies it at request time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AuthSource {
    /// No credential (mock and loopback providers).
    #[default]
    None,
    /// A bearer token the running process holds (`broca-run --auth-bearer`).
    Bearer,
    /// A credential read from the claustrum vault by id.
    Vault { credential_id: String },
}

/// How a provider's requests authenticate (the catalog's `auth_method` values). A subscription
/// credential selects its own client protocol and endpoint (spec §1a): `chatgpt` on an OpenAI
/// Responses row routes to the ChatGPT/Codex backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMethod {
    /// The provider's API key (every catalog route's default).
    #[default]
    ApiKey,
    /// A ChatGPT subscription's OAuth token: the ChatGPT/Codex backend.
    Chatgpt,
    /// The provider's own OAuth (e.g. a Claude subscription): the provider's API.
    Oauth,
    /// A Google Antigravity OAuth token: the Code Assist backend.
    Antigravity,
    /// An AWS access key (`{access_key_id, secret_access_key, session_token?, region?}` as
    /// JSON): Bedrock requests signed with Signature Version 4 (`provider::sigv4`).
    Sigv4,
}

impl AuthMethod {
    pub const ALL: [AuthMethod; 5] =
        [AuthMethod::ApiKey, AuthMethod::Chatgpt, AuthMethod::Oauth, AuthMethod::Antigravity, AuthMethod::Sigv4];

    pub fn as_str(self) -> &'static str {
        match self {
            AuthMethod::ApiKey => "apikey",
            AuthMethod::Chatgpt => "chatgpt",
            AuthMethod::Oauth => "oauth",
            AuthMethod::Antigravity => "antigravity",
            AuthMethod::Sigv4 => "sigv4",
        }
    }

    pub fn parse(name: &str) -> Option<AuthMethod> {
        AuthMethod::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

fn is_api_key(method: &AuthMethod) -> bool {
    *method == AuthMethod::ApiKey
}

impl FrozenConfig {
    /// The kind of credential the run's requests carry: the frozen one, else (a session frozen
    /// before it was recorded) the kind its vault credential id names (`<method>:<provider>`).
    pub fn credential_kind(&self) -> AuthMethod {
        match (&self.auth_method, &self.auth) {
            (AuthMethod::ApiKey, AuthSource::Vault { credential_id }) => {
                credential_id.split_once(':').and_then(|(method, _)| AuthMethod::parse(method)).unwrap_or_default()
            }
            (method, _) => *method,
        }
    }
}

/// A bare route (no system prompt, tools or policy) for unit tests.
#[cfg(test)]
pub(crate) fn test_route(provider: &str, family: Family, wire_model: &str) -> FrozenConfig {
    serde_json::from_value(serde_json::json!({"provider": provider, "model": wire_model, "family": family.as_str(),
                                              "base_url": "http://127.0.0.1:9", "wire_model": wire_model}))
    .expect("a bare route decodes")
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenConfig {
    /// Catalog identity, `provider/model` split.
    pub provider: String,
    pub model: String,
    pub family: Family,
    /// The route's base URL (`wire.api`, or `BROCA_PROVIDER_BASE_URL`), without a trailing `/`.
    pub base_url: String,
    /// The model id sent on the wire.
    pub wire_model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Family-specific members the variant renders to, merged into the request body's top
    /// level (e.g. `{"reasoning_effort":"high"}`); empty object when no variant.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub variant_params: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The output cap sent to the provider (bounded by the catalog's `limit.output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// The trailing directives the run reports (llm-runner §9.9), frozen at its admission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directives: Vec<cortexkit_role_llm_runner::directives::DirectiveName>,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub auth: AuthSource,
    /// The kind of credential `auth` holds: how a request carries it
    /// (`provider::auth`). Absent: an API key, or the kind a vault credential id names.
    #[serde(default, skip_serializing_if = "is_api_key")]
    pub auth_method: AuthMethod,
    /// The session's admission policy, frozen with the render config so a queued send and a
    /// resume carry it (spec §4); none of it is rendered into a provider request.
    #[serde(default, flatten)]
    pub policy: RunPolicy,
    /// The session's fetch plan as its first episode fetched it (its tools are in `tools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanManifest>,
    /// `session.send.tool_choice`, rendered per family (`tool-choice/v1`); absent: the
    /// provider's default (auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// The run's fixed service level (llm-runner §9.3.2), rendered per family
    /// (`provider::tier`, `service-tier/v1`); absent: standard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<cortexkit_role_llm_runner::service_tier::ServiceTier>,
    /// The ids a Code Assist request carries (`provider::code_assist`): never frozen at
    /// admission (the project is the backend's answer); the loop sets them on its own copy
    /// before the run's first step and records the project on `StepStarted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_assist: Option<CodeAssistIds>,
}

/// What a Code Assist request carries beside its Gemini request (`provider::code_assist`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeAssistIds {
    /// The Google Cloud project the backend serves the account under.
    pub project: String,
    /// One id per person's prompt (Google's client's `prompt_id`): the run id.
    pub user_prompt_id: String,
    /// The conversation (Google's client's session id): the session's address.
    pub session_id: String,
}

/// Whether and which tool the model must call (spec §4 runner parameter `tool_choice`):
/// `"auto"`, `"none"`, `"required"` (some tool), or `{"tool": name}` (that one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolChoiceMode),
    Named { tool: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceMode {
    Auto,
    None,
    Required,
}

impl ToolChoice {
    /// Whether it makes the model call a tool.
    pub fn forces(&self) -> bool {
        !matches!(self, ToolChoice::Mode(ToolChoiceMode::Auto | ToolChoiceMode::None))
    }
}

impl FrozenConfig {
    /// Whether the session's requests show part numbers and its replies get output-reference
    /// sets: an item of its frozen plan opted into `output_refs` (llm-runner §9.13).
    pub fn renders_part_numbers(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.output_refs)
    }
}

/// A session's frozen fetch plan (spec §4): what its first episode fetched from each tool
/// provider. Later sends and resumes use it; nothing is ever fetched again for the session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanManifest {
    /// The plan's identity as sent (the SHA-256 of its JCS bytes): `plan_drift` compares it.
    pub identity: String,
    pub items: Vec<ManifestItem>,
    /// Optional items that did not arrive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Vec<AbsentItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composition_digest: Option<String>,
    /// The system-text items fetched, in plan order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub texts: Vec<TextItem>,
    /// Their texts joined (a blank line between): rendered before the send's own system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_text: Option<String>,
    /// An item opted into output references (§9.13): the session's requests show part numbers
    /// (`§N§ `, compaction A3) and its replies get reference sets.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_refs: bool,
    /// The plan's senders (llm-runner §9.7), frozen with it: who besides the owner may send,
    /// with which grants and templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub senders: Vec<cortexkit_role_llm_runner::delivery_order::PlanSender>,
}

/// A fetched system-text item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextItem {
    pub provider: String,
    pub preset: String,
    /// SHA-256 of the exact text.
    pub item_digest: String,
    pub preflight_digest: String,
}

/// One provider's part of a frozen plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestItem {
    pub provider: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    pub generation: String,
    pub catalog_digest: String,
    /// The session capabilities the provider's catalog declared (`late_results`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// The tools it offered, in its catalog's order.
    pub tool_names: Vec<String>,
}

impl ManifestItem {
    pub fn declares(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// An optional plan item admitted without its provider (spec §4, optional plan tools).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbsentItem {
    pub provider: String,
    /// `tool`.
    pub kind: String,
    /// `unavailable`, `invalid` or `refused`.
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
}

/// The baseline broca serves: the role's, and its `cache` declaration beside the role's
/// members (an extension the role decodes leniently).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionBaseline {
    #[serde(flatten)]
    pub role: cortexkit_role_llm_runner::baseline::Baseline,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<BaselineCache>,
}

/// `baseline.cache` (spec §4a): every member absent when unknown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BaselineCache {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ttl_options_ms: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_refreshes_ttl: Option<bool>,
    /// `supported` | `unsupported`.
    pub warm: &'static str,
    /// `requested` | `provider_default`.
    pub basis: &'static str,
}

/// A send's cache request (§4 `send.cache`): admission-only metadata, frozen with the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachePolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<CacheRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<CacheTtl>,
}

/// `primary`: an interactive or long-lived session (the long tier where the provider has one);
/// `ephemeral`: a subagent-class session (the short tier).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheRole {
    Primary,
    Ephemeral,
}

/// A cache lifetime the caller names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CacheTtl {
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
    #[serde(rename = "24h")]
    OneDay,
}

impl CachePolicy {
    /// The lifetime an Anthropic request's cache marks ask for: one hour for `ttl: "1h"`, or
    /// `role: "primary"` without a ttl; else the provider's five-minute default.
    pub fn anthropic_ttl(policy: Option<&CachePolicy>) -> CacheTtl {
        match policy {
            Some(CachePolicy { ttl: Some(CacheTtl::OneHour), .. }) => CacheTtl::OneHour,
            Some(CachePolicy { ttl: None, role: Some(CacheRole::Primary) }) => CacheTtl::OneHour,
            _ => CacheTtl::FiveMinutes,
        }
    }
}

impl CacheTtl {
    pub const fn ms(self) -> u64 {
        match self {
            CacheTtl::FiveMinutes => 300_000,
            CacheTtl::OneHour => 3_600_000,
            CacheTtl::OneDay => 86_400_000,
        }
    }
}

/// What a send decided beyond the request bytes. Every member absent when not set, so configs
/// frozen before these existed read the same.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunPolicy {
    /// `"none"` (the only mode served) or a recorded older value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_management: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_class: Option<String>,
    /// `resume` or `interrupt` (absent means interrupt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_restart: Option<String>,
    /// The session-wide input-token cap in force when the episode was admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u64>,
    /// The send's cache request `{role?, ttl?}` (§4 `send.cache`), frozen as asked; each family
    /// resolves it when it renders (`provider::cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CachePolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_key: Option<String>,
    /// `caller`, `session` or `inherited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_key_source: Option<String>,
    /// Retention seconds (the session lives in `wal-ephemeral/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u64>,
    /// The caller's routing decision the run was admitted under (fixed per run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_decision_id: Option<String>,
    /// `session.send.work_class`: an open classification of the work (attribution on step
    /// hints; never rendered to a provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_class: Option<String>,
    /// `session.send.context_limit`: the context-token limit the caller set for the run (at most
    /// the model's `limit.context`; reported on step hints; no family has a request field for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<u64>,
}

impl FrozenConfig {
    /// What `session.baseline` and the admitting send's reply serve: the role's baseline and
    /// broca's declared cache object (spec §4a "Head and declaration").
    pub fn baseline(&self) -> SessionBaseline {
        SessionBaseline { role: self.role_baseline(), cache: Some(self.baseline_cache()) }
    }

    /// The lifetime a request rendered from this config asks its provider's cache for (`None`
    /// where the provider's own is not known: OpenAI's in-memory retention, Chat compatibles).
    pub fn cache_ttl_ms(&self) -> Option<u64> {
        match self.family {
            Family::AnthropicMessages => Some(CachePolicy::anthropic_ttl(self.policy.cache.as_ref()).ms()),
            _ if self.openai_own_route() && self.policy.cache.and_then(|c| c.ttl) == Some(CacheTtl::OneDay) => {
                Some(CacheTtl::OneDay.ms())
            }
            _ => None,
        }
    }

    /// OpenAI's own API-key routes (Responses and Chat), where `prompt_cache_*` is served.
    pub fn openai_own_route(&self) -> bool {
        self.provider == "openai" && matches!(self.family, Family::OpenaiChat | Family::OpenaiResponses)
    }

    /// Anthropic's own Messages route (the catalog's `anthropic` provider), the one route
    /// with a documented zero-output request (`session.warm`, spec §4a).
    pub fn first_party_anthropic(&self) -> bool {
        self.family == Family::AnthropicMessages && self.provider == "anthropic"
    }

    /// Whether `session.warm` serves this config: first-party Anthropic without manual
    /// thinking (a budget needs `max_tokens` above it). A forced `tool_choice` or a structured
    /// output format would refuse it too; broca renders neither from a send.
    pub fn warm_supported(&self) -> bool {
        let manual = self.variant_params.pointer("/thinking/type").and_then(Value::as_str) == Some("enabled");
        self.first_party_anthropic() && !manual
    }

    /// The declared cache object: the lifetime asked for, the lifetimes the route offers,
    /// whether a read renews the lifetime, whether `session.warm` is served, and whether the
    /// lifetime was asked for or is the provider's default. Unknown members are absent.
    pub fn baseline_cache(&self) -> BaselineCache {
        // Anthropic resolves a named ttl or role to a tier; elsewhere only OpenAI's 24h is one.
        let requested = match self.family {
            Family::AnthropicMessages => self.policy.cache.is_some_and(|c| c.ttl.is_some() || c.role.is_some()),
            _ => self.cache_ttl_ms().is_some(),
        };
        let (options, renews) = match self.family {
            Family::AnthropicMessages => (vec![CacheTtl::FiveMinutes.ms(), CacheTtl::OneHour.ms()], Some(true)),
            _ if self.openai_own_route() => (vec![CacheTtl::OneDay.ms()], None),
            _ => (Vec::new(), None),
        };
        BaselineCache {
            ttl_ms: self.cache_ttl_ms(),
            ttl_options_ms: options,
            read_refreshes_ttl: renews,
            warm: if self.warm_supported() { "supported" } else { "unsupported" },
            basis: if requested { "requested" } else { "provider_default" },
        }
    }

    /// The role's baseline this config describes (llm-runner §10): the plan's per-item digests,
    /// its absent optional items, the composition digest and the tool names.
    fn role_baseline(&self) -> cortexkit_role_llm_runner::baseline::Baseline {
        let config = self;
        use cortexkit_role_llm_runner::baseline::{AbsentItem, Baseline, BaselineItem};
        let tool_names: Vec<String> = config.tools.iter().map(|t| t.name.clone()).collect();
        let Some(plan) = &config.plan else { return Baseline::plan_less(tool_names) };
        let tool_items =
            plan.items.iter().map(|i| BaselineItem::new(&i.provider, &i.catalog_digest).with_item("tools"));
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
}

#[cfg(test)]
mod auth_kind_tests {
    use super::*;

    #[test]
    fn a_credential_kind_is_the_frozen_one_else_the_one_its_vault_id_names() {
        let mut config = test_route("anthropic", Family::AnthropicMessages, "claude");
        assert_eq!(config.credential_kind(), AuthMethod::ApiKey);
        config.auth = AuthSource::Vault { credential_id: "oauth:anthropic".into() };
        assert_eq!(config.credential_kind(), AuthMethod::Oauth, "a session frozen before the kind was recorded");
        config.auth = AuthSource::Bearer;
        config.auth_method = AuthMethod::Oauth;
        assert_eq!(config.credential_kind(), AuthMethod::Oauth);
        let bytes = serde_json::to_value(&config).unwrap();
        assert_eq!(bytes["auth_method"], "oauth");
        config.auth_method = AuthMethod::ApiKey;
        assert!(serde_json::to_value(&config).unwrap().get("auth_method").is_none(), "an API key adds no bytes");
    }
}
