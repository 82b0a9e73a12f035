//! The Code Assist backend's account endpoints, per lane, as Google's own client meets them
//! (gemini-cli `packages/core/src/code_assist/setup.ts` and `server.ts`):
//!
//! | request | answer |
//! |---|---|
//! | `POST …/v1internal:loadCodeAssist` | `standard`: `{currentTier, cloudaicompanionProject}`; `workspace`: `{currentTier}` (no project); `ineligible`: `{currentTier, ineligibleTiers}`; `free` before onboarding: `{allowedTiers: [free-tier (default), standard-tier]}`, after: as `standard` with the managed project |
//! | `POST …/v1internal:onboardUser {tierId, cloudaicompanionProject?}` | a long-running operation `{name, done}`; `done: true` carries `response.cloudaicompanionProject {id, name}`. The free tier refuses a project 400 `FAILED_PRECONDITION` ("Setting a project in the `onboardUser` request causes a `Precondition Failed` error") |
//! | `GET …/v1internal/operations/<id>` | the operation: with `onboard_polls` n > 0, `onboardUser` answers `done: false` and the n-th read `done: true` |
//!
//! A `streamGenerateContent` must name the account's project (a `workspace` account: any
//! project it was given); another is refused 403 `PERMISSION_DENIED` as the backend answers
//! one ("Permission denied on resource project …", cline/cline#4526). The lane's
//! `authorization`, when scripted, is checked here too (401 `UNAUTHENTICATED`).

use serde_json::{json, Value};

use super::http::Reply;
use super::script::{CodeAssistAccount, CodeAssistState};

/// Whether `rest` (the path after a lane's `/v1`) is one of these endpoints.
pub fn is_setup_path(rest: &str) -> bool {
    matches!(rest, "/v1internal:loadCodeAssist" | "/v1internal:onboardUser")
        || rest.starts_with("/v1internal/operations/")
}

/// One lane's account and how far its onboarding went.
#[derive(Clone, Debug)]
pub struct AccountState {
    pub account: CodeAssistAccount,
    pub onboarded: bool,
    pub polls_left: u32,
}

impl AccountState {
    pub fn new(account: CodeAssistAccount) -> AccountState {
        let polls_left = account.onboard_polls;
        AccountState { account, onboarded: false, polls_left }
    }

    /// The project a generate request must name: `None` accepts any non-empty one (a
    /// Workspace account's project is the caller's), `Some("")` none (not set up yet).
    pub fn required_project(&self) -> Option<&str> {
        match self.account.state {
            CodeAssistState::Standard => Some(self.account.project()),
            CodeAssistState::Free if self.onboarded => Some(self.account.project()),
            CodeAssistState::Free | CodeAssistState::Ineligible => Some(""),
            CodeAssistState::Workspace => None,
        }
    }
}

impl Default for AccountState {
    fn default() -> AccountState {
        AccountState::new(CodeAssistAccount { state: CodeAssistState::Standard, project: None, onboard_polls: 0 })
    }
}

/// The answer to a setup request on `state`.
pub fn answer(state: &mut AccountState, method: &str, rest: &str, body: &[u8]) -> Reply {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match (method, rest) {
        ("POST", "/v1internal:loadCodeAssist") => Reply::json(200, &load(state)),
        ("POST", "/v1internal:onboardUser") => onboard(state, &body),
        ("GET", path) if path.starts_with("/v1internal/operations/") => {
            state.polls_left = state.polls_left.saturating_sub(1);
            if state.polls_left > 0 {
                return Reply::json(200, &json!({"name": "operations/onboard-1", "done": false}));
            }
            state.onboarded = true;
            Reply::json(200, &done(state))
        }
        _ => Reply::refusal(405, "not a Code Assist setup request"),
    }
}

fn load(state: &AccountState) -> Value {
    let standard = json!({"id": "standard-tier", "name": "Gemini Code Assist"});
    match state.account.state {
        CodeAssistState::Standard => {
            json!({"currentTier": standard, "cloudaicompanionProject": state.account.project()})
        }
        CodeAssistState::Free if state.onboarded => json!({
            "currentTier": {"id": "free-tier", "name": "Gemini Code Assist for individuals"},
            "cloudaicompanionProject": state.account.project()
        }),
        CodeAssistState::Free => json!({"allowedTiers": [
            {"id": "free-tier", "name": "Gemini Code Assist for individuals", "isDefault": true},
            {"id": "standard-tier", "name": "Gemini Code Assist", "userDefinedCloudaicompanionProject": true}
        ]}),
        CodeAssistState::Workspace => json!({"currentTier": standard}),
        CodeAssistState::Ineligible => json!({"currentTier": standard, "ineligibleTiers": [{
            "reasonCode": "INELIGIBLE_ACCOUNT",
            "reasonMessage": "Your current account is not eligible for Gemini Code Assist for individuals",
            "tierId": "free-tier"
        }]}),
    }
}

fn onboard(state: &mut AccountState, body: &Value) -> Reply {
    let tier = body.get("tierId").and_then(Value::as_str).unwrap_or_default();
    if tier == "free-tier" && body.get("cloudaicompanionProject").is_some() {
        return Reply::json(
            400,
            &json!({"error": {"code": 400, "status": "FAILED_PRECONDITION",
                "message": "Precondition check failed: the free tier takes no project"}}),
        );
    }
    if state.polls_left > 0 {
        return Reply::json(200, &json!({"name": "operations/onboard-1", "done": false}));
    }
    state.onboarded = true;
    Reply::json(200, &done(state))
}

fn done(state: &AccountState) -> Value {
    let project = state.account.project();
    json!({"name": "operations/onboard-1", "done": true,
        "response": {"cloudaicompanionProject": {"id": project, "name": project}}})
}

/// The backend's refusal of a generate request naming `sent` where `state` serves another
/// project (or none yet), else `None`.
pub fn refuse_project(state: &AccountState, sent: Option<&str>) -> Option<Reply> {
    let sent = sent.unwrap_or_default();
    let ok = match state.required_project() {
        Some(required) => !required.is_empty() && sent == required,
        None => !sent.is_empty(),
    };
    (!ok).then(|| {
        let message = format!("Permission denied on resource project {sent}.");
        Reply::json(
            403,
            &json!({"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "CONSUMER_INVALID",
                    "domain": "googleapis.com", "metadata": {"consumer": format!("projects/{sent}"),
                    "service": "cloudaicompanion.googleapis.com"}}]}}),
        )
    })
}

/// The backend's refusal of a request without the lane's credential.
pub fn unauthenticated() -> Reply {
    Reply::json(
        401,
        &json!({"error": {"code": 401, "status": "UNAUTHENTICATED",
            "message": "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential."}}),
    )
}
