//! `broca doctor` (#46) through a real subc daemon: broca-mock plays the vault (`claustrum`,
//! dev-tools handles naming its records) and every provider (one lane per catalog provider,
//! each checking what the real provider checks). In every wire family a right key is `ok`;
//! a wrong key, an expired OAuth token, a Code Assist account without a project and a Bedrock
//! request signed for the wrong region each get their line and a non-zero exit. Each `--json`
//! is pinned as a golden.

use broca_mock::mock;
mod pin;
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use support::{Harness, Options};

const BIN: &str = env!("CARGO_BIN_EXE_broca");

/// Each credential: its id, the vault record's secret, and more of the record.
const RIGHT_KEY: &str = "sk-right-1";

struct Rig {
    h: Harness,
    dir: tempfile::TempDir,
}

/// A catalog row copied from the test catalog's `mock/<from>` under provider `provider`, its
/// route pointed at `lane`.
fn row(rows: &Value, from: &str, lane_url: &str) -> Value {
    let mut row = rows[format!("mock/{from}")].clone();
    row["wire.api"] = json!(lane_url);
    row
}

impl Rig {
    fn start(vault: Value) -> Rig {
        let dir = tempfile::Builder::new().prefix("bdoc").tempdir_in("/tmp").unwrap();
        let d = dir.path();
        std::fs::write(d.join("vault.json"), vault.to_string()).unwrap();
        let claustrum = json!({"program": broca_mock::exe(), "args": ["claustrum", "--vault", d.join("vault.json")],
                               "enabled": true, "reserved": true});
        let h = Harness::start_with(Options { modules: vec![("claustrum".into(), claustrum)], ..Options::default() });
        // The catalog: one provider per family, each on its own lane.
        let seeded = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
        let lkg: Value = serde_json::from_slice(&std::fs::read(seeded).unwrap()).unwrap();
        let mut response = lkg["response"].clone();
        let rows = response["models"].clone();
        let lane = |name: &str| h.mock.base_url(Some(name));
        response["models"] = json!({
            "t-anthropic/m": row(&rows, "echo-messages", &lane("anthropic")),
            "t-chat/m": row(&rows, "echo-chat", &lane("chat")),
            "t-openai/m": row(&rows, "echo-responses", &lane("openai")),
            "t-google/m": row(&rows, "antigravity-echo-gemini", &lane("google")),
            "t-bedrock/m": row(&rows, "echo-bedrock", &lane("bedrock")),
        });
        let root = d.join("root");
        std::fs::create_dir_all(root.join("catalog")).unwrap();
        let bytes = broca::catalog::lkg::envelope(&response, 1, 1_700_000_000_000);
        std::fs::write(root.join("catalog/fusiform-lkg.json"), bytes).unwrap();
        Rig { h, dir }
    }

    fn install(&self, lane: &str, script: Value) {
        self.h.mock.install(lane, mock::Script::from_json(&script.to_string()).unwrap());
    }

    fn handles(&self, ids: &[&str]) -> PathBuf {
        let handles: serde_json::Map<String, Value> =
            ids.iter().map(|id| (id.to_string(), json!(format!("ckh_{}", id.replace(':', "_"))))).collect();
        let path = self.dir.path().join("handles.json");
        std::fs::write(&path, json!({"handles": handles}).to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    fn doctor(&self, ids: &[&str], env: &[(&str, String)], extra: &[&str]) -> Output {
        let mut c = Command::new(BIN);
        c.arg("doctor").arg("--state-root").arg(self.dir.path().join("root"));
        c.arg("--subc").arg(self.h.connection_file()).args(extra);
        c.env("BROCA_DEVTOOLS_HANDLES", self.handles(ids)).env("HOME", self.dir.path());
        c.env_remove("BROCA_PROVIDER_BASE_URL").env_remove("SUBC_SOCKET").env_remove("BROCA_LIVE_SUBC");
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdin(Stdio::null()).output().unwrap()
    }
}

/// The vault: each credential's record, granted to broca, with a dev-tools handle.
fn vault(records: &[(&str, Value)]) -> Value {
    let mut credentials = serde_json::Map::new();
    let mut handles = serde_json::Map::new();
    for (id, record) in records {
        let mut record = record.clone();
        record["record_version"] = json!(1);
        record["principals"] = json!(["broca"]);
        credentials.insert(id.to_string(), record);
        handles.insert(format!("ckh_{}", id.replace(':', "_")), json!(id));
    }
    json!({"credentials": credentials, "handles": handles})
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

fn line_of<'a>(lines: &'a [String], credential: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.split_whitespace().nth(1) == Some(credential))
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no line for {credential}: {lines:?}"))
}

#[test]
fn doctor_proves_each_credential_and_names_what_is_wrong() {
    let aws = |region: &str| json!({"secret": json!({"access_key_id": "AKIDEXAMPLE", "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "region": region}).to_string()});
    let rig = Rig::start(vault(&[
        ("apikey:t-anthropic", json!({"secret": RIGHT_KEY})),
        ("oauth:t-anthropic", json!({"secret": "sk-ant-oat-old", "expires_at_ms": 1_000})),
        ("apikey:t-chat", json!({"secret": RIGHT_KEY})),
        ("oauth:t-chat", json!({"secret": "stale-oauth-token"})),
        ("apikey:t-openai", json!({"secret": "sk-wrong"})),
        ("apikey:t-google", json!({"secret": RIGHT_KEY})),
        ("apikey:t-bedrock", json!({"secret": RIGHT_KEY})),
        ("sigv4:t-bedrock", aws("us-west-2")),
        ("antigravity:t-google", json!({"secret": "ya29.token"})),
        ("chatgpt:t-openai", json!({"secret": "chatgpt-token", "account_id": "acct-1"})),
        ("bogus", json!({"secret": "x"})),
    ]));
    rig.install("openai", json!({"authorization": format!("Bearer {RIGHT_KEY}")}));
    rig.install("chat", json!({"authorization": format!("Bearer {RIGHT_KEY}")}));
    rig.install("bedrock", json!({"aws_region": "us-east-1"}));

    // Every family the catalog routes to its own lane: a right key in four, a wrong key, an
    // OAuth token the vault knows expired and one the provider refuses, a Bedrock key signed
    // for another region, a credential id of no shape.
    let ids = [
        "apikey:t-anthropic",
        "oauth:t-anthropic",
        "apikey:t-chat",
        "oauth:t-chat",
        "apikey:t-openai",
        "apikey:t-google",
        "apikey:t-bedrock",
        "sigv4:t-bedrock",
        "bogus",
    ];
    let out = rig.doctor(&ids, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let l = lines(&out);
    for ok in ["apikey:t-anthropic", "apikey:t-chat", "apikey:t-google", "apikey:t-bedrock"] {
        assert!(line_of(&l, ok).starts_with("ok "), "{ok}: {l:?}");
    }
    assert!(line_of(&l, "oauth:t-anthropic").contains("token_expired"), "{l:?}");
    assert!(line_of(&l, "apikey:t-openai").contains("credential_refused: HTTP 401"), "{l:?}");
    // An OAuth token the provider refuses (its expiry unknown to the vault): sign in again.
    assert!(line_of(&l, "oauth:t-chat").contains("the token is expired or revoked: sign in again"), "{l:?}");
    assert!(line_of(&l, "sigv4:t-bedrock").contains("wrong_region"), "{l:?}");
    assert!(line_of(&l, "bogus").contains("unknown_credential"), "{l:?}");
    assert_eq!(l.last().map(String::as_str), Some("4 ok, 5 failed"));
    assert!(rig.h.mock.requests("anthropic").len() == 1, "the expired token sent nothing");
    let json = rig.doctor(&ids, &[], &["--json"]);
    assert_eq!(json.status.code(), Some(1));
    pin::assert_golden("doctor.families.json", &String::from_utf8_lossy(&json.stdout), None);

    // The subscription credentials select their own backends (a base URL override points them
    // at one lane): ChatGPT's works; a Code Assist account without a project says so.
    rig.install("sub", json!({"code_assist": {"state": "workspace"}}));
    let base = [("BROCA_PROVIDER_BASE_URL", rig.h.mock.base_url(Some("sub")))];
    let out = rig.doctor(&["antigravity:t-google", "chatgpt:t-openai"], &base, &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    pin::assert_golden("doctor.subscriptions.json", &String::from_utf8_lossy(&out.stdout), None);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checks"][0]["problem"], "project_missing");
    assert_eq!(report["checks"][1]["status"], "ok");
    let sent = &rig.h.mock.requests("sub")[0];
    assert_eq!(sent.header("chatgpt-account-id"), Some("acct-1"));

    // A state root without a catalog says so, for every credential (`--state-root` again wins).
    let bare = rig.dir.path().join("no-catalog");
    std::fs::create_dir_all(&bare).unwrap();
    let out = rig.doctor(&["apikey:t-chat"], &[], &["--state-root", bare.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(line_of(&lines(&out), "apikey:t-chat").contains("no_catalog"), "{:?}", lines(&out));

    // With the project configured, the Code Assist credential works too: every command exits 0.
    std::fs::write(rig.dir.path().join("root/broca.jsonc"), r#"{"code_assist": {"project": "team-proj"}}"#).unwrap();
    let out = rig.doctor(&["antigravity:t-google"], &base, &[]);
    assert_eq!(out.status.code(), Some(0), "{:?}", lines(&out));
    let generate = rig.h.mock.requests("sub").into_iter().rev().find(|r| r.path.contains("streamGenerateContent"));
    assert_eq!(generate.unwrap().body_json().unwrap()["project"], "team-proj");
}

#[test]
fn doctor_without_credentials_or_daemon_says_what_to_set() {
    let rig = Rig::start(vault(&[]));
    let out = rig.doctor(&[], &[], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no credential is configured in"), "{out:?}");
    let mut c = Command::new(BIN);
    c.args(["doctor", "--state-root"]).arg(rig.dir.path().join("root"));
    c.env("BROCA_DEVTOOLS_HANDLES", rig.handles(&["apikey:t-chat"]))
        .env_remove("SUBC_SOCKET")
        .env_remove("BROCA_LIVE_SUBC");
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --subc FILE or set SUBC_SOCKET"), "{out:?}");
    let out = Command::new(BIN).args(["doctor", "--frobnicate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
