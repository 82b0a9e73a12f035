//! `broca doctor` (#46): one cheap authenticated request per configured credential, to prove
//! the credential and the request shape work before a real run depends on them.
//!
//! A credential is named `<method>:<provider>` (`catalog::route::credential_id_for`). Its check
//! takes the first model of that provider the catalog routes with that method, renders a
//! one-message request exactly as a run's first step would (a 16-token cap), sends it through
//! the real client (the same auth headers, signature, Code Assist project and identity), and
//! reads the answer's first event. The outcome is one [`Check`]: `ok`, or the [`Problem`]
//! with the provider's words and what to do about it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::catalog::route::{resolve, ModelRequest, RouteOverrides};
use crate::catalog::Catalog;
use crate::frozen::{AuthMethod, AuthSource, CodeAssistIds, Family};
use crate::message::Message;
use crate::provider::client::{Attempt, AttemptEvent, ModelClient, ProjectLookup};
use crate::record::{ErrorClass, ProviderError};

/// The output cap of a check's request: enough for any model to start answering.
pub const CHECK_MAX_OUTPUT_TOKENS: u64 = 16;
/// The longest a check waits for its provider's first answer.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);
/// The prompt a check sends.
pub const CHECK_PROMPT: &str = "Reply with the single word: ok";

/// A configured credential: its id and what the id names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub credential_id: String,
    pub method: AuthMethod,
    pub provider: String,
}

impl Target {
    /// `<method>:<provider>`, or `None` for an id of another shape.
    pub fn parse(credential_id: &str) -> Option<Target> {
        let (method, provider) = credential_id.split_once(':')?;
        let method = AuthMethod::parse(method)?;
        (!provider.is_empty()).then(|| Target {
            credential_id: credential_id.to_owned(),
            method,
            provider: provider.into(),
        })
    }
}

/// The secret a check sends, as the vault gave it.
pub struct Secret {
    pub value: String,
    pub account_id: Option<String>,
    pub expires_at_ms: Option<i64>,
}

/// What is wrong, when something is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// The credential id is not `<method>:<provider>` with a known method.
    UnknownCredential,
    /// The vault did not give the credential.
    VaultRefused,
    /// The state root holds no readable catalog (no LKG yet).
    NoCatalog,
    /// The catalog routes no model of the provider with this method.
    NoModel,
    /// The vault's record says the token expired.
    TokenExpired,
    /// The provider refused the credential (wrong, revoked or expired).
    CredentialRefused,
    /// An API key was sent where an OAuth token belongs (or the other way round).
    WrongKind,
    /// Code Assist: the account has no project, and none is configured.
    ProjectMissing,
    /// Code Assist: the account cannot use Code Assist.
    Ineligible,
    /// Bedrock: the request was signed for, or sent to, the wrong region.
    WrongRegion,
    /// The provider does not serve the model to this credential.
    ModelUnavailable,
    /// The provider is busy or failing: the credential could not be proved.
    ProviderBusy,
    /// The provider could not be reached.
    Unreachable,
    /// The provider refused the request for another reason.
    Refused,
}

/// One credential's outcome: a line of the report, an element of its `--json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub credential: String,
    pub provider: String,
    pub method: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<&'static str>,
    /// `ok` or `failed`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
    /// The provider's (or the vault's) own words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
}

impl Check {
    fn new(target: &Target) -> Check {
        Check {
            credential: target.credential_id.clone(),
            provider: target.provider.clone(),
            method: target.method.as_str().into(),
            model: None,
            family: None,
            status: "ok",
            problem: None,
            message: None,
            advice: None,
        }
    }

    pub fn failed(mut self, problem: Problem, message: impl Into<String>, advice: impl Into<String>) -> Check {
        self.status = "failed";
        self.problem = Some(problem);
        self.message = Some(message.into());
        self.advice = Some(advice.into());
        self
    }

    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }

    /// The report's line: `ok  <credential>  <model>`, or `FAIL <credential>  <problem>: <message> — <advice>`.
    pub fn line(&self) -> String {
        let model = self.model.as_deref().unwrap_or("-");
        match (self.problem, &self.message, &self.advice) {
            (Some(p), Some(m), Some(a)) => {
                let p = serde_json::to_value(p).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
                format!("FAIL {}  {model}  {p}: {m}; {a}", self.credential)
            }
            _ => format!("ok   {}  {model}", self.credential),
        }
    }
}

/// The report of a check for a credential whose id names no method and provider.
pub fn unknown_credential(credential_id: &str) -> Check {
    let target = Target { credential_id: credential_id.into(), method: AuthMethod::ApiKey, provider: String::new() };
    Check { method: String::new(), ..Check::new(&target) }.failed(
        Problem::UnknownCredential,
        format!("{credential_id:?} is not <method>:<provider>"),
        "name it apikey:, oauth:, chatgpt:, antigravity: or sigv4: and the catalog's provider id",
    )
}

/// What a check runs with.
pub struct Doctor<'a> {
    pub client: &'a dyn ModelClient,
    pub catalog: Result<&'a Catalog, &'a crate::catalog::CatalogError>,
    pub lkg_path: std::path::PathBuf,
    /// `code_assist.project` (broca.jsonc).
    pub code_assist_project: Option<String>,
    /// `BROCA_PROVIDER_BASE_URL`: every route's base replaced (a mock provider).
    pub base_url_override: Option<String>,
    pub now_ms: i64,
}

impl Doctor<'_> {
    /// Checks one credential; `secret` is the vault's answer (its refusal in words).
    pub fn check(&self, target: &Target, secret: Result<Secret, String>) -> Check {
        let check = Check::new(target);
        let secret = match secret {
            Ok(s) => s,
            Err(e) => {
                let advice =
                    format!("grant broca the vault record {} (or fix its dev-tools handle)", target.credential_id);
                return check.failed(Problem::VaultRefused, e, advice);
            }
        };
        if let Err(e) = self.catalog {
            let advice =
                "let broca fetch the catalog through the daemon first: run the module, or one `broca-run --subc` turn";
            return check.failed(Problem::NoCatalog, e.to_string(), advice);
        }
        let Some(mut config) = self.route(target) else {
            let advice = "the catalog lists no chat model of this provider that this kind of credential can reach";
            return check.failed(
                Problem::NoModel,
                format!("no model of {} routes with {}", target.provider, target.method.as_str()),
                advice,
            );
        };
        let check = Check {
            model: Some(format!("{}/{}", config.provider, config.model)),
            family: Some(config.family.as_str()),
            ..check
        };
        if secret.expires_at_ms.is_some_and(|at| at <= self.now_ms) {
            let advice = format!("sign in again so the vault refreshes {}", target.credential_id);
            return check.failed(Problem::TokenExpired, "the vault's record says the token has expired", advice);
        }
        if config.family == Family::GoogleCodeAssist {
            match self.project(&config, &secret) {
                Ok(project) => {
                    config.code_assist = Some(CodeAssistIds {
                        project,
                        user_prompt_id: "broca-doctor".into(),
                        session_id: "broca-doctor".into(),
                    })
                }
                Err(error) => return diagnose(check, target, &error),
            }
        }
        match self.send(&config, &secret) {
            Ok(()) => check,
            Err(error) => diagnose(check, target, &error),
        }
    }

    /// The first model of the provider that routes with the target's method.
    fn route(&self, target: &Target) -> Option<crate::frozen::FrozenConfig> {
        let catalog = self.catalog.ok()?;
        let overrides = RouteOverrides {
            base_url_override: self.base_url_override.clone(),
            auth: AuthSource::Bearer,
            auth_methods: [(target.provider.clone(), target.method)].into(),
            ..Default::default()
        };
        catalog.provider_rows(&target.provider).find_map(|row| {
            let req = ModelRequest {
                model: row.key.clone(),
                max_output_tokens: Some(CHECK_MAX_OUTPUT_TOKENS),
                ..Default::default()
            };
            resolve(self.catalog, self.lkg_path.clone(), &req, &overrides).ok()
        })
    }

    fn project(&self, config: &crate::frozen::FrozenConfig, secret: &Secret) -> Result<String, ProviderError> {
        let rx = self.client.code_assist_project(ProjectLookup {
            config: config.clone(),
            bearer: Some(secret.value.clone()),
            configured: self.code_assist_project.clone(),
            cancel: Arc::new(AtomicBool::new(false)),
        });
        match rx.recv_timeout(CHECK_TIMEOUT) {
            Ok(found) => found.map(|p| p.id),
            Err(_) => Err(timeout()),
        }
    }

    /// Sends the check's request; `Ok` once the provider streams an answer.
    fn send(&self, config: &crate::frozen::FrozenConfig, secret: &Secret) -> Result<(), ProviderError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let rx = self.client.start(Attempt {
            config: config.clone(),
            body: crate::provider::render_request(config, &[Message::user_text(CHECK_PROMPT)]),
            bearer: Some(secret.value.clone()),
            account_id: secret.account_id.clone(),
            read_timeout: CHECK_TIMEOUT,
            cancel: Arc::clone(&cancel),
        });
        // The first thing the provider says decides: a stream is a working credential.
        let outcome = match rx.recv_timeout(CHECK_TIMEOUT) {
            Ok(AttemptEvent::Stream { events, .. }) => {
                let error = events.into_iter().find_map(|e| match e {
                    crate::provider::event::StreamEvent::Error { error } => Some(error),
                    _ => None,
                });
                error.map_or(Ok(()), Err)
            }
            Ok(AttemptEvent::End { .. }) => Ok(()),
            Ok(AttemptEvent::Http { error, .. } | AttemptEvent::Failed { error, .. }) => Err(error),
            Err(_) => Err(timeout()),
        };
        cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        outcome
    }
}

fn timeout() -> ProviderError {
    ProviderError::new(
        ErrorClass::Transient,
        Some("timeout".into()),
        format!("no answer within {} s", CHECK_TIMEOUT.as_secs()),
        None,
    )
}

/// The problem a provider's error names, and what to do about it.
fn diagnose(check: Check, target: &Target, error: &ProviderError) -> Check {
    let id = &target.credential_id;
    let code = error.provider_code.as_deref().unwrap_or_default();
    let lower = error.message.to_ascii_lowercase();
    let words = match error.http_status {
        Some(status) => format!("HTTP {status}: {}", error.message),
        None => error.message.clone(),
    };
    let oauth = matches!(target.method, AuthMethod::Oauth | AuthMethod::Antigravity | AuthMethod::Chatgpt);
    let (problem, advice) = if code == "code_assist_project_required" {
        (
            Problem::ProjectMissing,
            "set the Google Cloud project that has Gemini Code Assist as code_assist.project in broca.jsonc".into(),
        )
    } else if code == "code_assist_ineligible" {
        (Problem::Ineligible, "use a Google account that Code Assist serves".into())
    } else if lower.contains("scoped to a valid region") {
        (Problem::WrongRegion, format!("set `region` in {id} to the region of the Bedrock endpoint the catalog names"))
    } else if lower.contains("oauth authentication is currently not supported")
        || (oauth && lower.contains("invalid x-api-key"))
    {
        (
            Problem::WrongKind,
            format!(
                "{id} holds another kind of credential: store an API key as apikey:{} and an OAuth token as oauth:{}",
                target.provider, target.provider
            ),
        )
    } else if error.class == ErrorClass::AuthRequired && oauth {
        (
            Problem::CredentialRefused,
            format!("the token is expired or revoked: sign in again so the vault refreshes {id}"),
        )
    } else if error.class == ErrorClass::AuthRequired {
        (Problem::CredentialRefused, format!("the key is wrong or revoked: put a valid one in the vault record {id}"))
    } else if code == "transport" || code == "timeout" {
        (Problem::Unreachable, "check the network and the provider's base URL (wire.api in the catalog)".into())
    } else if error.class == ErrorClass::Transient {
        (Problem::ProviderBusy, "the provider is busy or failing; run broca doctor again later".into())
    } else if error.http_status == Some(404) || (lower.contains("model") && lower.contains("not found")) {
        (
            Problem::ModelUnavailable,
            "the provider does not serve this model to this credential; check the account's access".into(),
        )
    } else {
        (Problem::Refused, "the provider refused the request; report it with this line".into())
    };
    check.failed(problem, words, advice)
}
