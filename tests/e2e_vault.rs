//! Provider credentials from the vault, end to end: the real subc daemon supervises broca and
//! `broca-mock claustrum` as the `claustrum` module; broca-mock also plays the model and checks
//! the `Authorization` of every request against the scripted vault secret. broca runs with
//! `BROCA_TEST_VAULT_AUTH=1` (a debug-build switch) so its mock routes keep vault auth.

use broca_mock::mock;
mod pin;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Harness, Options};

const HARNESS: &str = "vault-e2e";
/// The credential the mock catalog's `mock/echo-chat` route reads (`apikey:<provider>`).
const CREDENTIAL: &str = "apikey:mock";
const SECRET_1: &str = "sk-vault-secret-one-7f3a";
const SECRET_2: &str = "sk-vault-secret-two-91bc";

fn vault_file(secret: &str, version: u64, state: &str, principals: &[&str]) -> Value {
    json!({"credentials": {CREDENTIAL: {"secret": secret, "record_version": version, "account_id": "acct-mock-1",
                                        "state": state, "principals": principals}}})
}

fn write_vault(path: &Path, file: &Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, file.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

fn vault_log(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn ops(log: &[Value], op: &str) -> usize {
    log.iter().filter(|e| e["op"] == op).count()
}

fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

fn run_id(reply: &Value) -> String {
    reply["run_id"].as_str().unwrap_or_else(|| panic!("no run id in {reply}")).to_string()
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The `auth_selection` a session's WAL froze in each `RunStarted`.
fn frozen_auth(path: &Path) -> Vec<Value> {
    use broca::record::Record;
    use broca::wal::{self, ScannedFrame, WalError};
    let mut out = Vec::new();
    wal::read::<WalError>(path, broca::record::KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| {
        if let Ok(Record::RunStarted(started)) = Record::decode(f.payload) {
            out.push(started.auth_selection.as_ref().map_or(Value::Null, |a| serde_json::to_value(a).unwrap()));
        }
        Ok(())
    })
    .expect("the WAL reads");
    out
}

/// Credential files a fallback would look for, planted in broca's `HOME` with a planted secret
/// and dated two days back (atime and mtime), so any read of one moves its atime (`relatime`).
const PLANTED: [&str; 4] = [
    ".config/cortexkit/broca/dev-tools-handles.json",
    ".config/cortexkit/broca/vault-handles.json",
    ".codex/auth.json",
    ".config/anthropic/credentials.json",
];
const PLANTED_SECRET: &str = "sk-planted-fallback-5d2e";

fn plant(home: &Path) {
    let two_days_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 86_400);
    for rel in PLANTED {
        let path = home.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let body = json!({"handles": {CREDENTIAL: "ckh_planted"}, "api_key": PLANTED_SECRET});
        std::fs::write(&path, body.to_string()).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_times(std::fs::FileTimes::new().set_accessed(two_days_ago).set_modified(two_days_ago)).unwrap();
    }
}

fn planted_atimes(home: &Path) -> Vec<std::time::SystemTime> {
    PLANTED.iter().map(|rel| std::fs::metadata(home.join(rel)).unwrap().accessed().unwrap()).collect()
}

fn wait_vault(h: &Harness) {
    use broca::subc::consumer::Consumer;
    let consumer = Consumer::connect(&h.connection_file(), None).expect("a probe connection");
    let target = subc_protocol::RouteTarget::ManagementSurface { module_id: "claustrum".into() };
    let identity = subc_protocol::BindIdentity::new("probe", "probe");
    let body = serde_json::to_vec(&json!({"method": "credential.status", "params": {}})).unwrap();
    let until = Instant::now() + support::STEP;
    // Any answer (the mock refuses credential.status) means the module is up.
    while let Err(broca::subc::consumer::CallError::RouteOpen(_) | broca::subc::consumer::CallError::OpenTimeout) =
        consumer.call_on(&target, &identity, &body, Duration::from_secs(1))
    {
        assert!(Instant::now() < until, "the mock vault never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn credentials_from_the_vault() {
    let mock = broca_mock::exe();
    let base = tempfile::Builder::new().prefix("bvt").tempdir_in("/tmp").unwrap();
    let file = base.path().join("vault.json");
    let log = base.path().join("vault.jsonl");
    write_vault(&file, &vault_file(SECRET_1, 1, "ready", &["broca"]));
    let entry = json!({"program": mock, "args": ["claustrum", "--vault", file, "--vault-log", log],
                       "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true});
    let home = base.path().join("home");
    plant(&home);
    let opts = Options {
        modules: vec![("claustrum".into(), entry)],
        env: vec![("BROCA_TEST_VAULT_AUTH".into(), "1".into()), ("HOME".into(), home.to_string_lossy().into_owned())],
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    wait_vault(&h);
    h.mock.install(
        "default",
        mock::Script::from_json(&json!({"authorization": format!("Bearer {SECRET_1}")}).to_string()).unwrap(),
    );

    // 1. A turn whose credential the mock endpoint verified came from the vault.
    let s = h.session(HARNESS, &h.unique("turn"), None);
    h.install(json!({"responses": [text_step("from the vault")]}));
    let first = s.send("hello");
    let status = s.wait_run(&run_id(&first), "completed");
    assert_eq!(status["auth_selection"], json!(CREDENTIAL), "{status}");
    let requests = h.mock.requests("default");
    let last = requests.last().expect("the model was called");
    assert_eq!(last.header("authorization"), Some(format!("Bearer {SECRET_1}").as_str()));
    // Admission read the credential to freeze its account, and the first attempt used that
    // read: one vault read for the run.
    assert_eq!(ops(&vault_log(&log), "credential.get_scoped"), 1, "{:?}", vault_log(&log));
    let frozen = frozen_auth(&s.wal_path());
    let account = |a: &Value| (a["credential_id"].clone(), a["account_id"].clone(), a["record_version"].clone());
    let expected = (json!(CREDENTIAL), json!("acct-mock-1"), json!("1"));
    assert_eq!(frozen.iter().map(account).collect::<Vec<_>>(), vec![expected], "{frozen:?}");

    // 2. The provider refuses the credential (the vault rotated behind broca's back): one
    //    report → RunPaused → the vault rotates → the paused send's own send_id resumes it.
    h.mock.install(
        "default",
        mock::Script::from_json(&json!({"authorization": format!("Bearer {SECRET_2}")}).to_string()).unwrap(),
    );
    let s2 = h.session(HARNESS, &h.unique("rotate"), None);
    let mut params = support::send_params("after rotation");
    params["send_id"] = json!("send-rotate-1");
    let paused = s2.ok("session.send", params.clone());
    let run = run_id(&paused);
    let status = s2.wait_run(&run, "paused");
    assert_eq!(status["reason"], "auth_required", "{status}");
    let reports: Vec<_> = vault_log(&log).into_iter().filter(|e| e["op"] == "credential.report_auth_failure").collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!((reports[0]["record_version"].clone(), reports[0]["provider_status"].clone()), (json!(1), json!(401)));
    write_vault(&file, &vault_file(SECRET_2, 2, "ready", &["broca"]));
    h.install(json!({"responses": [text_step("rotated")]}));
    let resumed = s2.ok("session.send", params);
    assert_eq!(run_id(&resumed), run, "the same run resumes");
    s2.wait_run(&run, "completed");
    let reports = ops(&vault_log(&log), "credential.report_auth_failure");
    assert_eq!(reports, 1, "one report, no loop");

    // 2b. A paused run resumes only on the account admission froze (spec "Graceful restart",
    //     #47): the vault now names another account for the credential, so the resume ends the
    //     run interrupted, naming both accounts, and nothing more is sent.
    const SECRET_3: &str = "sk-vault-secret-three-5d0e";
    h.mock.install(
        "default",
        mock::Script::from_json(&json!({"authorization": format!("Bearer {SECRET_3}")}).to_string()).unwrap(),
    );
    let s5 = h.session(HARNESS, &h.unique("account"), None);
    let mut params = support::send_params("before the account changed");
    params["send_id"] = json!("send-account-1");
    let run = run_id(&s5.ok("session.send", params.clone()));
    assert_eq!(s5.wait_run(&run, "paused")["reason"], "auth_required");
    let mut moved = vault_file(SECRET_3, 3, "ready", &["broca"]);
    moved["credentials"][CREDENTIAL]["account_id"] = json!("acct-mock-2");
    write_vault(&file, &moved);
    let sent = h.mock.requests("default").len();
    assert_eq!(run_id(&s5.ok("session.send", params)), run);
    let ended = s5.wait_run(&run, "interrupted");
    assert_eq!(ended["error"]["provider_code"], "resume_refused", "{ended}");
    let message = ended["error"]["message"].as_str().unwrap();
    assert!(message.contains("acct-mock-2") && message.contains("acct-mock-1"), "{message}");
    assert_eq!(h.mock.requests("default").len(), sent, "nothing sent on the other account");
    write_vault(&file, &vault_file(SECRET_2, 2, "ready", &["broca"]));

    // 3. needs_reauth pauses; not_found ends the run with a named permanent error.
    write_vault(&file, &vault_file(SECRET_2, 2, "needs_reauth", &["broca"]));
    let s3 = h.session(HARNESS, &h.unique("reauth"), None);
    let status = s3.wait_run(&run_id(&s3.send("reauth")), "paused");
    assert_eq!(status["reason"], "auth_required", "{status}");
    write_vault(&file, &vault_file(SECRET_2, 2, "ready", &["someone-else"]));
    let atimes = planted_atimes(&home);
    let s4 = h.session(HARNESS, &h.unique("absent"), None);
    let ended = s4.wait_run(&run_id(&s4.send("absent")), "error");
    let error = &ended["error"];
    assert_eq!(error["provider_code"], "credential_absent", "{ended}");
    assert_eq!(error["class"], "permanent", "{ended}");
    pin::assert_golden("vault_credential_absent_run_error.json", &error.to_string(), None);
    // No fallback: no credential file in broca's HOME was read, and the planted secret never
    // reached the provider.
    assert_eq!(planted_atimes(&home), atimes, "a credential file outside the state root was read");
    let sent = h.mock.requests("default");
    assert!(sent.iter().all(|r| r.header("authorization").is_none_or(|a| !a.contains(PLANTED_SECRET))));
    // A refused admission read freezes no account (the run's own read classified the refusal).
    let frozen = frozen_auth(&s4.wal_path());
    assert_eq!(frozen.iter().map(account).collect::<Vec<_>>(), vec![(json!(CREDENTIAL), Value::Null, Value::Null)]);

    // 3b. A vault that stays locked (transient): bounded retries, then the run ends
    //     `interrupted`, coded as the client crate classifies the refusal.
    write_vault(&file, &vault_file(SECRET_2, 2, "locked", &["broca"]));
    let s5 = h.session(HARNESS, &h.unique("locked"), None);
    let ended = s5.wait_run(&run_id(&s5.send("locked")), "interrupted");
    assert_eq!(ended["error"]["provider_code"], "credential_transient", "{ended}");
    pin::assert_golden("vault_transient_run_error.json", &ended["error"].to_string(), None);

    // 4. The secret is never on disk: not in any file of the state root, nor broca's logs.
    for path in files(&h.state_root()).into_iter().chain(files(&h.rig_root().join("run/logs"))) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        for secret in [SECRET_1, SECRET_2] {
            assert!(!text.contains(secret), "{} holds the secret", path.display());
        }
    }
}
