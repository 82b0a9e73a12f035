//! Code Assist's project and client identity (#46): what the `cloudcode-pa` backend needs
//! before it serves a `streamGenerateContent`, resolved once per credential and cached.
//!
//! The backend serves a request only for the Google Cloud project the account is set up with,
//! so every request carries `project`. Which project that is comes from the backend itself, as
//! Google's own Code Assist client does it (gemini-cli `packages/core/src/code_assist/setup.ts`,
//! `setupUser`):
//!
//! 1. `POST /v1internal:loadCodeAssist {cloudaicompanionProject?, metadata}`;
//! 2. an account with a `currentTier` uses the `cloudaicompanionProject` it answers, else the
//!    project the operator configured (`code_assist.project` in `broca.jsonc`, `broca-run
//!    --code-assist-project`); with neither, the account needs a project set (a Workspace
//!    account), or is ineligible, and the send ends with that named;
//! 3. an account without a tier is onboarded to its default allowed tier
//!    (`POST /v1internal:onboardUser {tierId, cloudaicompanionProject?, metadata}`; the free
//!    tier takes no project: "Setting a project in the `onboardUser` request causes a
//!    `Precondition Failed` error"), a long-running operation polled with
//!    `GET /v1internal/<operation name>` until `done`, whose `response.cloudaicompanionProject.id`
//!    is the project.
//!
//! A found project is cached per credential (keyed by the secret's SHA-256, never the secret)
//! in a bounded map, and the run records it on its `StepStarted`, so a resumed run sends the
//! project it started with (`crate::agent::turn`). The requests also carry the ids Google's
//! client sends: `user_prompt_id` (one per person's prompt: broca's run id) and
//! `request.session_id` (the session's address), and the Antigravity client's identity headers
//! ([`CLIENT_HEADERS`]).

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::record::{ErrorClass, ProviderError};

pub const LOAD_PATH: &str = "/v1internal:loadCodeAssist";
pub const ONBOARD_PATH: &str = "/v1internal:onboardUser";
/// An operation is read at `/v1internal/<name>` (gemini-cli `server.ts` `getOperation`).
pub const OPERATION_PREFIX: &str = "/v1internal/";
/// The tier that takes no project in `onboardUser` (Google manages its project).
pub const FREE_TIER: &str = "free-tier";
/// The tier an account whose answer lists no default is onboarded to (gemini-cli
/// `getOnboardTier`).
pub const LEGACY_TIER: &str = "legacy-tier";

/// The Antigravity client's identity, as the backend sees it on every request (the headers the
/// Antigravity OAuth clients send: opencode-antigravity-auth `ANTIGRAVITY_HEADERS`; the
/// platform is the one broca runs on).
pub const CLIENT_HEADERS: &[(&str, &str)] = &[
    ("user-agent", USER_AGENT),
    ("x-goog-api-client", "google-cloud-sdk vscode_cloudshelleditor/0.1"),
    ("client-metadata", r#"{"ideType":"IDE_UNSPECIFIED","platform":"PLATFORM_UNSPECIFIED","pluginType":"GEMINI"}"#),
];

#[cfg(all(target_os = "macos", target_arch = "aarch64"))]
const USER_AGENT: &str = "antigravity/1.11.5 darwin/arm64";
#[cfg(all(target_os = "macos", not(target_arch = "aarch64")))]
const USER_AGENT: &str = "antigravity/1.11.5 darwin/amd64";
#[cfg(all(not(target_os = "macos"), target_arch = "aarch64"))]
const USER_AGENT: &str = "antigravity/1.11.5 linux/arm64";
#[cfg(all(not(target_os = "macos"), not(target_arch = "aarch64")))]
const USER_AGENT: &str = "antigravity/1.11.5 linux/amd64";

/// The `metadata` of `loadCodeAssist` and `onboardUser` (the Antigravity client's).
/// The client metadata every setup call carries (members in gemini-cli's order).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientMetadata {
    ide_type: &'static str,
    platform: &'static str,
    plugin_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    duet_project: Option<String>,
}

fn metadata(project: Option<&str>) -> ClientMetadata {
    ClientMetadata {
        ide_type: "ANTIGRAVITY",
        platform: "PLATFORM_UNSPECIFIED",
        plugin_type: "GEMINI",
        duet_project: project.map(str::to_owned),
    }
}

/// The `loadCodeAssist` request body.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBody {
    metadata: ClientMetadata,
    #[serde(skip_serializing_if = "Option::is_none")]
    cloudaicompanion_project: Option<String>,
}

/// The `onboardUser` request body: the free tier names no project.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OnboardBody {
    tier_id: String,
    metadata: ClientMetadata,
    #[serde(skip_serializing_if = "Option::is_none")]
    cloudaicompanion_project: Option<String>,
}

/// The longest one setup call may stay silent.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a resolution waits for an onboarding operation to finish.
pub const ONBOARD_WAIT: Duration = Duration::from_secs(60);
/// How often an unfinished onboarding operation is read again.
pub const ONBOARD_POLL: Duration = Duration::from_secs(2);
/// The most bytes read of one answer of these endpoints.
pub const ANSWER_MAX: u64 = 1 << 20;

pub use crate::frozen::CodeAssistIds as RequestIds;

/// A resolved project and the tier it was found under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Project {
    pub id: String,
    pub tier: String,
}

/// `loadCodeAssist`'s answer (gemini-cli `types.ts` `LoadCodeAssistResponse`); members this
/// resolution does not need are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadAnswer {
    #[serde(default)]
    pub current_tier: Option<Tier>,
    #[serde(default)]
    pub paid_tier: Option<Tier>,
    #[serde(default)]
    pub allowed_tiers: Vec<Tier>,
    #[serde(default)]
    pub ineligible_tiers: Vec<Ineligible>,
    /// A string, or `{id, name}` as some answers spell it.
    #[serde(default)]
    pub cloudaicompanion_project: Option<ProjectRef>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tier {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub is_default: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ineligible {
    #[serde(default)]
    pub reason_code: String,
    #[serde(default)]
    pub reason_message: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ProjectRef {
    Id(String),
    Object {
        #[serde(default)]
        id: String,
    },
}

impl ProjectRef {
    fn id(&self) -> Option<&str> {
        let id = match self {
            ProjectRef::Id(id) | ProjectRef::Object { id } => id.as_str(),
        };
        (!id.is_empty()).then_some(id)
    }
}

/// An onboarding long-running operation (`onboardUser`'s answer and each poll's).
#[derive(Debug, Default, Deserialize)]
pub struct Operation {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub done: bool,
    #[serde(default)]
    pub response: Option<OnboardAnswer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OnboardAnswer {
    #[serde(default)]
    pub cloudaicompanion_project: Option<ProjectRef>,
}

/// What `loadCodeAssist`'s answer leads to.
#[derive(Debug, PartialEq)]
pub enum AfterLoad {
    Found(Project),
    /// Onboard to this tier with this `onboardUser` body.
    Onboard {
        tier: String,
        body: OnboardBody,
    },
    /// No project can be had: the account needs one configured, or is ineligible.
    Missing(ProviderError),
}

/// The `loadCodeAssist` request body.
pub fn load_body(configured: Option<&str>) -> LoadBody {
    LoadBody { metadata: metadata(configured), cloudaicompanion_project: configured.map(str::to_owned) }
}

/// gemini-cli's `setupUser` decision after `loadCodeAssist`.
pub fn after_load(answer: &LoadAnswer, configured: Option<&str>) -> AfterLoad {
    if let Some(current) = &answer.current_tier {
        let tier = answer.paid_tier.as_ref().unwrap_or(current).id.clone();
        return match answer.cloudaicompanion_project.as_ref().and_then(ProjectRef::id).or(configured) {
            Some(id) => AfterLoad::Found(Project { id: id.to_owned(), tier }),
            None => AfterLoad::Missing(missing(answer)),
        };
    }
    let tier = answer.allowed_tiers.iter().find(|t| t.is_default).map_or(LEGACY_TIER, |t| t.id.as_str()).to_owned();
    let project = if tier == FREE_TIER { None } else { configured };
    let body = OnboardBody {
        tier_id: tier.clone(),
        metadata: metadata(project),
        cloudaicompanion_project: project.map(str::to_owned),
    };
    AfterLoad::Onboard { tier, body }
}

/// The project a finished onboarding names, else the configured one, else what is missing.
pub fn after_onboard(
    op: &Operation,
    tier: &str,
    configured: Option<&str>,
    load: &LoadAnswer,
) -> Result<Project, ProviderError> {
    let named = op.response.as_ref().and_then(|r| r.cloudaicompanion_project.as_ref()).and_then(ProjectRef::id);
    match named.or(configured) {
        Some(id) => Ok(Project { id: id.to_owned(), tier: tier.to_owned() }),
        None => Err(missing(load)),
    }
}

/// The account's ineligibility as the backend explains it, or the project it needs set.
fn missing(load: &LoadAnswer) -> ProviderError {
    if !load.ineligible_tiers.is_empty() {
        let reasons: Vec<&str> = load.ineligible_tiers.iter().map(|t| t.reason_message.as_str()).collect();
        return ProviderError::permanent(
            "code_assist_ineligible",
            format!("this Google account cannot use Code Assist: {}", reasons.join("; ")),
        );
    }
    ProviderError::permanent(
        "code_assist_project_required",
        "this Google account has no Code Assist project: set the Google Cloud project that has Gemini Code Assist \
         (`code_assist.project` in broca.jsonc, or `broca-run --code-assist-project`)"
            .to_owned(),
    )
}

/// How the resolution reaches the backend: POST a JSON body to a path, or GET a path, answering
/// the status and body. [`resolve`] is written against this so its decisions are tested
/// without a network.
pub trait Exchange {
    fn post(&self, path: &str, body: &Value) -> Result<(u16, Vec<u8>), ProviderError>;
    fn get(&self, path: &str) -> Result<(u16, Vec<u8>), ProviderError>;
}

/// Resolves the credential's project: load, then onboard where the account needs it (polling
/// its operation, `sleep` between reads; `sleep` answers false when the wait was cut short).
pub fn resolve(
    x: &dyn Exchange,
    configured: Option<&str>,
    sleep: &mut dyn FnMut(Duration) -> bool,
) -> Result<Project, ProviderError> {
    let load: LoadAnswer = answer(x.post(LOAD_PATH, &to_json(&load_body(configured)))?, "loadCodeAssist")?;
    let (tier, body) = match after_load(&load, configured) {
        AfterLoad::Found(project) => return Ok(project),
        AfterLoad::Missing(error) => return Err(error),
        AfterLoad::Onboard { tier, body } => (tier, body),
    };
    let mut op: Operation = answer(x.post(ONBOARD_PATH, &to_json(&body))?, "onboardUser")?;
    let mut waited = Duration::ZERO;
    while !op.done {
        let Some(name) = op.name.as_deref().filter(|n| valid_operation_name(n)) else {
            break;
        };
        if waited >= ONBOARD_WAIT {
            return Err(ProviderError::new(
                ErrorClass::Transient,
                Some("code_assist_onboarding_pending".into()),
                format!("Code Assist onboarding to {tier} did not finish within {}s", ONBOARD_WAIT.as_secs()),
                None,
            ));
        }
        if !sleep(ONBOARD_POLL) {
            return Err(ProviderError::permanent("cancelled", "cancelled while Code Assist onboarding ran"));
        }
        waited += ONBOARD_POLL;
        op = answer(x.get(&format!("{OPERATION_PREFIX}{name}"))?, "the onboarding operation")?;
    }
    after_onboard(&op, &tier, configured, &load)
}

/// A typed setup body as the exchange sends it.
fn to_json(body: &impl Serialize) -> Value {
    serde_json::to_value(body).unwrap_or(Value::Null)
}

/// An operation name is a path of plain segments (`operations/abc`): anything else is not
/// put into a URL.
fn valid_operation_name(name: &str) -> bool {
    name.len() <= 256
        && name
            .split('/')
            .all(|seg| !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        && !name.split('/').any(|seg| seg == "." || seg == "..")
}

/// A 2xx answer decoded, or the backend's refusal classified: 401 and a 403 that is not about
/// the project are the credential's (`auth_required`); 429 and 5xx transient; the rest permanent.
fn answer<T: for<'de> Deserialize<'de>>((status, body): (u16, Vec<u8>), what: &str) -> Result<T, ProviderError> {
    if (200..300).contains(&status) {
        return serde_json::from_slice(&body).map_err(|e| {
            ProviderError::new(
                ErrorClass::Transient,
                Some("code_assist_answer_unreadable".into()),
                format!("{what} answered something that is not its documented JSON: {e}"),
                Some(status),
            )
        });
    }
    let mut error = super::errors::classify_http_error(crate::frozen::Family::GoogleCodeAssist, status, &body);
    error.message = format!("{what}: {}", error.message);
    Err(error)
}

/// Projects found, per credential (the SHA-256 of its secret), in the order found.
///
/// Invariant: at most [`PROJECTS_MAX`] entries, one per key; the oldest goes first.
#[derive(Default)]
pub struct ProjectCache {
    entries: Mutex<VecDeque<([u8; 32], Project)>>,
}

/// The most credentials whose project a process remembers (a re-resolution costs one
/// `loadCodeAssist`).
pub const PROJECTS_MAX: usize = 64;

impl ProjectCache {
    fn key(secret: &str, configured: Option<&str>) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(secret.as_bytes());
        h.update([0]);
        h.update(configured.unwrap_or_default().as_bytes());
        h.finalize().into()
    }

    pub fn get(&self, secret: &str, configured: Option<&str>) -> Option<Project> {
        let key = Self::key(secret, configured);
        self.entries.lock().iter().find(|(k, _)| *k == key).map(|(_, p)| p.clone())
    }

    pub fn put(&self, secret: &str, configured: Option<&str>, project: Project) {
        let key = Self::key(secret, configured);
        let mut entries = self.entries.lock();
        entries.retain(|(k, _)| *k != key);
        if entries.len() >= PROJECTS_MAX {
            entries.pop_front();
        }
        entries.push_back((key, project));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::RefCell;

    /// A backend scripted by path: each answer taken in order; every request kept.
    #[derive(Default)]
    struct Backend {
        answers: RefCell<Vec<(&'static str, u16, Value)>>,
        seen: RefCell<Vec<(String, Option<Value>)>>,
    }

    impl Backend {
        fn new(answers: Vec<(&'static str, u16, Value)>) -> Backend {
            Backend { answers: RefCell::new(answers), ..Default::default() }
        }
        fn take(&self, path: &str) -> Result<(u16, Vec<u8>), ProviderError> {
            let mut answers = self.answers.borrow_mut();
            let i = answers.iter().position(|(p, _, _)| path.starts_with(p)).expect("an answer for the path");
            let (_, status, body) = answers.remove(i);
            Ok((status, body.to_string().into_bytes()))
        }
    }

    impl Exchange for Backend {
        fn post(&self, path: &str, body: &Value) -> Result<(u16, Vec<u8>), ProviderError> {
            self.seen.borrow_mut().push((path.to_owned(), Some(body.clone())));
            self.take(path)
        }
        fn get(&self, path: &str) -> Result<(u16, Vec<u8>), ProviderError> {
            self.seen.borrow_mut().push((path.to_owned(), None));
            self.take(path)
        }
    }

    fn run(b: &Backend, configured: Option<&str>) -> Result<Project, ProviderError> {
        resolve(b, configured, &mut |_| true)
    }

    #[test]
    fn a_set_up_account_uses_the_project_the_backend_names() {
        let b = Backend::new(vec![(
            LOAD_PATH,
            200,
            json!({"currentTier": {"id": "standard-tier"}, "cloudaicompanionProject": "proj-1"}),
        )]);
        assert_eq!(run(&b, None).unwrap(), Project { id: "proj-1".into(), tier: "standard-tier".into() });
        let seen = b.seen.borrow();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1.as_ref().unwrap()["metadata"]["pluginType"], "GEMINI");
        assert!(seen[0].1.as_ref().unwrap().get("cloudaicompanionProject").is_none());
    }

    #[test]
    fn a_tier_without_a_project_takes_the_configured_one_or_says_it_is_missing() {
        let answer = json!({"currentTier": {"id": "standard-tier"}});
        let b = Backend::new(vec![(LOAD_PATH, 200, answer.clone())]);
        assert_eq!(run(&b, Some("mine")).unwrap().id, "mine");
        assert_eq!(b.seen.borrow()[0].1.as_ref().unwrap()["cloudaicompanionProject"], "mine");
        let b = Backend::new(vec![(LOAD_PATH, 200, answer)]);
        let e = run(&b, None).unwrap_err();
        assert_eq!(
            (e.class, e.provider_code.as_deref()),
            (ErrorClass::Permanent, Some("code_assist_project_required"))
        );
        assert!(e.message.contains("code_assist.project"), "{}", e.message);
    }

    #[test]
    fn an_ineligible_account_is_told_why() {
        let b = Backend::new(vec![(
            LOAD_PATH,
            200,
            json!({"currentTier": {"id": "standard-tier"}, "ineligibleTiers": [
                {"reasonCode": "INELIGIBLE_ACCOUNT", "reasonMessage": "Your account is not eligible"}]}),
        )]);
        let e = run(&b, None).unwrap_err();
        assert_eq!(e.provider_code.as_deref(), Some("code_assist_ineligible"));
        assert!(e.message.contains("Your account is not eligible"));
    }

    #[test]
    fn a_free_account_is_onboarded_without_a_project_and_its_operation_polled() {
        let b = Backend::new(vec![
            (
                LOAD_PATH,
                200,
                json!({"allowedTiers": [{"id": "free-tier", "isDefault": true}, {"id": "standard-tier"}]}),
            ),
            (ONBOARD_PATH, 200, json!({"name": "operations/op-1", "done": false})),
            (OPERATION_PREFIX, 200, json!({"name": "operations/op-1", "done": false})),
            (
                OPERATION_PREFIX,
                200,
                json!({"name": "operations/op-1", "done": true,
                    "response": {"cloudaicompanionProject": {"id": "managed-7", "name": "Managed"}}}),
            ),
        ]);
        let mut slept = 0;
        let found = resolve(&b, Some("ignored-for-free"), &mut |_| {
            slept += 1;
            true
        })
        .unwrap();
        assert_eq!(found, Project { id: "managed-7".into(), tier: "free-tier".into() });
        assert_eq!(slept, 2);
        let seen = b.seen.borrow();
        let onboard = seen[1].1.as_ref().unwrap();
        assert_eq!(onboard["tierId"], "free-tier");
        assert!(onboard.get("cloudaicompanionProject").is_none(), "the free tier takes no project: {onboard}");
        assert_eq!(seen[2].0, "/v1internal/operations/op-1");
    }

    #[test]
    fn an_unsafe_operation_name_is_never_put_in_a_url() {
        for name in ["../x", "operations/../../v1", "a//b", "ops/a?b", ""] {
            assert!(!valid_operation_name(name), "{name}");
        }
        assert!(valid_operation_name("operations/abc-1_2.3"));
        let b = Backend::new(vec![
            (LOAD_PATH, 200, json!({"allowedTiers": [{"id": "standard-tier", "isDefault": true}]})),
            (ONBOARD_PATH, 200, json!({"name": "../../evil", "done": false})),
        ]);
        assert_eq!(run(&b, None).unwrap_err().provider_code.as_deref(), Some("code_assist_project_required"));
        assert_eq!(b.seen.borrow().len(), 2, "nothing read from the unsafe name");
    }

    #[test]
    fn refusals_are_classified_and_never_cached() {
        let b = Backend::new(vec![(LOAD_PATH, 401, json!({"error": {"code": 401, "status": "UNAUTHENTICATED"}}))]);
        assert_eq!(run(&b, None).unwrap_err().class, ErrorClass::AuthRequired);
        let b = Backend::new(vec![(LOAD_PATH, 503, json!({"error": {"code": 503}}))]);
        assert_eq!(run(&b, None).unwrap_err().class, ErrorClass::Transient);
        let b = Backend::new(vec![(LOAD_PATH, 200, json!("not an object"))]);
        assert_eq!(run(&b, None).unwrap_err().provider_code.as_deref(), Some("code_assist_answer_unreadable"));
    }

    #[test]
    fn the_cache_is_bounded_and_keyed_by_credential_and_configured_project() {
        let cache = ProjectCache::default();
        let p = |id: &str| Project { id: id.into(), tier: "t".into() };
        cache.put("secret-a", None, p("a"));
        assert_eq!(cache.get("secret-a", None), Some(p("a")));
        assert_eq!(cache.get("secret-a", Some("other")), None);
        assert_eq!(cache.get("secret-b", None), None);
        for i in 0..PROJECTS_MAX {
            cache.put(&format!("s{i}"), None, p("x"));
        }
        assert_eq!(cache.get("secret-a", None), None, "the oldest went first");
        assert_eq!(cache.entries.lock().len(), PROJECTS_MAX);
    }
}
