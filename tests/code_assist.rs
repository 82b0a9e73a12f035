//! Code Assist's project and client identity (#46) through `broca-run` against broca-mock's
//! Code Assist accounts (`mock/model/src/code_assist.rs`): a set-up account's project, a
//! Workspace account that needs one configured, a free account onboarded (its operation
//! polled), an ineligible account told why, the ids and identity headers on every request, and
//! a resumed run that sends the project it started with, without asking again.

mod cli_rig;

use broca_mock::mock::Script;
use cli_rig::{code, json_lines, text_step, unit, Rig};
use serde_json::{json, Value};

const MODEL: &str = "mock/antigravity-echo-gemini";

fn account(rig: &Rig, lane: &str, account: Value, responses: Value) {
    let script = json!({"code_assist": account, "responses": responses});
    rig.mock.install(lane, Script::from_json(&script.to_string()).unwrap());
}

fn turn(rig: &Rig, lane: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--model", MODEL, "--auth-method", "antigravity", "--auth-bearer", "ya29.token"];
    args.extend_from_slice(extra);
    rig.run(lane, &args)
}

fn setup_paths(rig: &Rig, lane: &str) -> Vec<String> {
    rig.mock.setup_requests(lane).iter().map(|r| r.path.rsplit("/v1").next().unwrap().to_owned()).collect()
}

#[test]
fn a_set_up_account_sends_its_project_the_ids_and_the_client_identity() {
    let rig = Rig::new();
    account(&rig, "std", json!({"state": "standard", "project": "acme-prod"}), json!([text_step("Paris.")]));
    let out = turn(&rig, "std", &["--session", "s1", "--json", "Capital of France?"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let run_id = json_lines(&out)[0]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(setup_paths(&rig, "std"), ["internal:loadCodeAssist"]);
    let load = rig.mock.setup_requests("std")[0].body_json().unwrap();
    assert_eq!(load["metadata"]["pluginType"], "GEMINI");
    let sent = &rig.mock.requests("std")[0];
    let body = sent.body_json().unwrap();
    assert_eq!(body["project"], "acme-prod");
    assert_eq!(body["user_prompt_id"], json!(run_id), "one prompt id per person's prompt: the run");
    assert!(body["request"]["session_id"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    assert!(sent.header("user-agent").is_some_and(|ua| ua.starts_with("antigravity/")), "{:?}", sent.headers);
    assert!(sent.header("client-metadata").is_some_and(|m| m.contains("\"pluginType\":\"GEMINI\"")));
    assert_eq!(sent.header("x-goog-api-client"), Some("google-cloud-sdk vscode_cloudshelleditor/0.1"));
    assert_eq!(sent.header("authorization"), Some("Bearer ya29.token"));
}

#[test]
fn a_workspace_account_needs_a_configured_project_and_says_so_by_name() {
    let rig = Rig::new();
    account(&rig, "ws", json!({"state": "workspace"}), json!([text_step("Paris.")]));
    let out = turn(&rig, "ws", &["--session", "s1", "--json", "hi"]);
    assert_eq!(code(&out), 1);
    let lines = json_lines(&out);
    let finished = unit(&lines, "run_finished").unwrap();
    assert_eq!(finished["reason"], "error");
    assert_eq!(finished["error"]["provider_code"], "code_assist_project_required");
    assert!(finished["error"]["message"].as_str().unwrap().contains("code_assist.project"), "{finished}");
    assert!(rig.mock.requests("ws").is_empty(), "no model request without a project");

    let out = turn(&rig, "ws", &["--session", "s2", "--code-assist-project", "team-proj", "hi"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rig.mock.requests("ws")[0].body_json().unwrap()["project"], "team-proj");
    let load = rig.mock.setup_requests("ws")[1].body_json().unwrap();
    assert_eq!(load["cloudaicompanionProject"], "team-proj", "the configured project is offered to loadCodeAssist");
}

#[test]
fn a_free_account_is_onboarded_and_its_operation_polled() {
    let rig = Rig::new();
    let free = json!({"state": "free", "project": "managed-123", "onboard_polls": 1});
    account(&rig, "free", free, json!([text_step("Paris.")]));
    let out = turn(&rig, "free", &["--session", "s1", "hi"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        setup_paths(&rig, "free"),
        ["internal:loadCodeAssist", "internal:onboardUser", "internal/operations/onboard-1"]
    );
    let onboard = rig.mock.setup_requests("free")[1].body_json().unwrap();
    assert_eq!(onboard["tierId"], "free-tier");
    assert!(onboard.get("cloudaicompanionProject").is_none(), "the free tier takes no project: {onboard}");
    assert_eq!(rig.mock.requests("free")[0].body_json().unwrap()["project"], "managed-123");
}

#[test]
fn an_ineligible_account_is_told_why() {
    let rig = Rig::new();
    account(&rig, "no", json!({"state": "ineligible"}), json!([]));
    let out = turn(&rig, "no", &["--session", "s1", "--json", "hi"]);
    assert_eq!(code(&out), 1);
    let lines = json_lines(&out);
    let error = &unit(&lines, "run_finished").unwrap()["error"];
    assert_eq!(error["provider_code"], "code_assist_ineligible");
    assert!(error["message"].as_str().unwrap().contains("not eligible"), "{error}");
}

#[test]
fn a_refused_token_pauses_the_run_for_reauthentication() {
    let rig = Rig::new();
    let script = json!({"authorization": "Bearer other", "responses": []});
    rig.mock.install("auth", Script::from_json(&script.to_string()).unwrap());
    let out = turn(&rig, "auth", &["--session", "s1", "--json", "hi"]);
    assert_eq!(code(&out), 1);
    let lines = json_lines(&out);
    assert_eq!(unit(&lines, "run_paused").unwrap()["reason"], "auth_required");
    assert!(rig.mock.requests("auth").is_empty());
}

/// The project is recorded with the run's first step: a run resumed in a new process (an
/// empty project cache) sends the same project without another `loadCodeAssist`, even when the
/// account would now answer another.
#[test]
fn a_resumed_run_sends_the_project_it_started_with() {
    let rig = Rig::new();
    account(&rig, "res", json!({"state": "standard", "project": "first-proj"}), json!([{"status": 401}]));
    let paused = turn(&rig, "res", &["--session", "s1", "--json", "hello"]);
    assert_eq!(code(&paused), 1);
    assert_eq!(unit(&json_lines(&paused), "run_paused").unwrap()["reason"], "auth_required");
    // The account's project changes; the paused run still names the one it started with.
    account(&rig, "res", json!({"state": "workspace"}), json!([text_step("Hello again.")]));
    let resumed = rig.run("res", &["--auth-bearer", "ya29.token", "--session", "s1", "--json"]);
    assert_eq!(code(&resumed), 0, "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(unit(&json_lines(&resumed), "run_finished").unwrap()["reason"], "completed");
    let sent = rig.mock.requests("res");
    let projects: Vec<Value> = sent.iter().map(|r| r.body_json().unwrap()["project"].clone()).collect();
    assert_eq!(projects, [json!("first-proj"), json!("first-proj")]);
    assert_eq!(setup_paths(&rig, "res"), ["internal:loadCodeAssist"], "the resume asked nothing");
}
