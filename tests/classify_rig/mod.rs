//! The classifier rig shared by `tests/e2e_classify.rs` and `classify-bench`: the real subc
//! daemon supervising broca, `broca-mock claustrum` (the vault, holding the Workers AI token and
//! account id) and `broca-mock --tools` as the scope authority syncing a run scope
//! (`run-scope`: agent `agent-7`, run `run-7`) and a flow scope (`flow-scope`: `flow-3`); the
//! harness's MockServer plays Workers AI and counts every provider call per item
//! (`/_mock/classify/…`, outside broca).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_client_rs::{CallError, CallOptions, RouteHandle, ScopeSelector};
use subc_protocol::{BindIdentity, Principal, RouteTarget};

use crate::support::{self, Harness, Options};

pub const SCOPES: &str = "mock-tools";
pub const CLEF: &str = "cloudflare-workers-ai/@cf/cloudflare/clef";
pub const CF_SECRET: &str = "cf-token-e2e-41c7";
pub const ACCOUNT: &str = "acct-e2e-9";

pub fn scopes_script() -> Value {
    let carriers = json!([{"principal": {"kind": "direct"}}]);
    json!({
        "scopes": [
            {"ref": "run-scope", "scope_epoch": 1, "kind": "worker", "carriers": carriers,
             "attributes": {"agent_id": "agent-7", "run_id": "run-7"}},
            {"ref": "flow-scope", "scope_epoch": 1, "kind": "worker", "carriers": carriers,
             "attributes": {"flow_id": "flow-3"}},
        ],
        "tools": [],
    })
}

pub fn vault() -> Value {
    json!({"credentials": {"apikey:cloudflare-workers-ai": {
        "secret": CF_SECRET, "record_version": 1, "account_id": ACCOUNT, "state": "ready", "principals": ["broca"]}}})
}

/// The stand-in's key for a string state: its JCS text (a JSON string).
pub fn key(state: &str) -> String {
    serde_json::to_string(state).unwrap()
}

pub fn noul(n: &str) -> String {
    format!(
        r#"{{"model":"clef","answers":{{"q":{{"type":"noul","noul":{n}}}}},"usage":{{"input_tokens":12,"output_tokens":1}}}}"#
    )
}

pub struct Stand<'h>(pub &'h Harness);

impl Stand<'_> {
    pub fn url(&self, path: &str) -> String {
        format!("{}/_mock/classify/{path}", self.0.mock.url())
    }

    pub fn post(&self, path: &str, body: Value) {
        ureq::post(&self.url(path))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("/_mock/classify/{path}: {e}"));
    }

    pub fn answer(&self, state: &str, body: &str) {
        self.post("script", json!({"key": key(state), "answer": body}));
    }

    pub fn status(&self, state: &str, status: u16, code: Option<u64>) {
        self.post("script", json!({"key": key(state), "status": status, "workers_ai_code": code}));
    }

    pub fn calls(&self, state: &str) -> u64 {
        let url = format!("{}?key={}", self.url("calls"), pct(&key(state)));
        let reply: Value =
            serde_json::from_str(&ureq::get(&url).call().unwrap().into_body().read_to_string().unwrap()).unwrap();
        reply["calls"].as_u64().unwrap()
    }

    pub fn held(&self, state: &str) -> bool {
        let url = format!("{}?key={}", self.url("held"), pct(&key(state)));
        let reply: Value =
            serde_json::from_str(&ureq::get(&url).call().unwrap().into_body().read_to_string().unwrap()).unwrap();
        reply["held"] == true
    }

    pub fn log(&self) -> Vec<Value> {
        serde_json::from_str(&ureq::get(&self.url("log")).call().unwrap().into_body().read_to_string().unwrap())
            .unwrap()
    }
}

pub fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A classifier route under one of the synced scopes (or none).
pub struct Route<'h> {
    h: &'h Harness,
    pub handle: RouteHandle,
}

pub fn open<'h>(h: &'h Harness, scope: Option<&str>, roles: &[(&str, &str)]) -> Result<Route<'h>, CallError> {
    let consumer = h.client().consumer();
    let target = RouteTarget::ManagementSurface { module_id: support::MODULE_ID.into() };
    let identity = BindIdentity::new("classify-e2e", "none");
    let versions: BTreeMap<String, String> = roles.iter().map(|(r, v)| (r.to_string(), v.to_string())).collect();
    let opts = CallOptions { role_versions: Some(versions), ..support::call_options() };
    let handle = h.block_on(async {
        match scope {
            Some(scope_ref) => {
                let owner = Principal::Reserved { module_id: SCOPES.into() };
                let selector = ScopeSelector::new(owner, scope_ref, Some(1));
                consumer.open_route_scoped(target, identity, selector, opts).await
            }
            None => consumer.open_route(target, identity, opts).await,
        }
    })?;
    Ok(Route { h, handle })
}

/// How a request ended that did not answer.
pub enum Failed {
    Refused(Value),
    /// The route broke (broca was killed): open another and send again.
    Route(String),
}

impl Route<'_> {
    /// The reply's `result` text, or the refusal body.
    pub fn request(&self, method: &str, params: &str) -> Result<String, Value> {
        self.try_request(method, params).map_err(|f| match f {
            Failed::Refused(body) => body,
            Failed::Route(e) => panic!("{method}: {e}"),
        })
    }

    pub fn try_request(&self, method: &str, params: &str) -> Result<String, Failed> {
        let body = format!(r#"{{"method":{},"params":{params}}}"#, serde_json::to_string(method).unwrap());
        let consumer = self.h.client().consumer();
        match self.h.block_on(consumer.request(&self.handle, body.into_bytes(), support::call_options())) {
            Ok(bytes) => {
                #[derive(serde::Deserialize)]
                struct Envelope<'a> {
                    #[serde(borrow)]
                    result: &'a serde_json::value::RawValue,
                }
                let text = String::from_utf8(bytes).unwrap();
                let envelope: Envelope = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
                Ok(envelope.result.get().to_owned())
            }
            Err(CallError::Module(e)) => Err(Failed::Refused(serde_json::to_value(e).unwrap())),
            Err(e) => Err(Failed::Route(e.to_string())),
        }
    }

    pub fn ok(&self, method: &str, params: &str) -> String {
        self.request(method, params).unwrap_or_else(|e| panic!("{method} refused: {e}"))
    }

    pub fn refused(&self, method: &str, params: &str) -> Value {
        match self.request(method, params) {
            Ok(text) => panic!("{method} answered {text}, expected a refusal"),
            Err(body) => body,
        }
    }
}

pub fn batch(batch_id: &str, states: &[String]) -> String {
    let items: Vec<Value> = states.iter().map(|s| json!({"state": s})).collect();
    json!({"batch_id": batch_id, "model": CLEF, "items": items,
           "questions": {"q": {"type": "noul", "instructions": "Is it flagged?"}}})
    .to_string()
}

pub fn facts(h: &Harness, batch_id: &str) -> Vec<(String, Option<String>, Option<String>)> {
    let db = rusqlite::Connection::open_with_flags(
        h.state_root().join("run-index.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut stmt = db
        .prepare("SELECT fact_id, run_id, flow_id FROM export_facts WHERE kind = 'system_one' AND batch_id = ?1")
        .unwrap();
    let rows = stmt.query_map([batch_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap();
    rows.map(Result::unwrap).collect()
}

/// Item indexes whose answer `system-one.db` holds for `batch_id`.
pub fn recorded_answers(root: &Path, batch_id: &str) -> BTreeSet<u64> {
    let db =
        rusqlite::Connection::open_with_flags(root.join("system-one.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = db.prepare("SELECT item FROM items WHERE batch_id = ?1 AND answers IS NOT NULL").unwrap();
    let rows = stmt.query_map([batch_id], |r| r.get::<_, i64>(0)).unwrap();
    rows.map(|r| r.unwrap() as u64).collect()
}

/// When `system-one.db` recorded item `i`'s outcome (Unix ms).
pub fn answered_at(root: &Path, batch_id: &str, i: u64) -> u64 {
    let db =
        rusqlite::Connection::open_with_flags(root.join("system-one.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    db.query_row(
        "SELECT recorded_ms FROM items WHERE batch_id = ?1 AND item = ?2",
        rusqlite::params![batch_id, i as i64],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as u64
}

pub fn start(base: &Path, kills: bool) -> Harness {
    start_with(base, kills, None, None)
}

/// [`start`] with another broca and broca-mock binary (the bench's release builds).
pub fn start_with(base: &Path, kills: bool, broca: Option<PathBuf>, mock: Option<PathBuf>) -> Harness {
    let mock = mock.unwrap_or_else(broca_mock::exe);
    let script = base.join("scopes.json");
    std::fs::write(&script, scopes_script().to_string()).unwrap();
    let vault_file = base.join("vault.json");
    std::fs::write(&vault_file, vault().to_string()).unwrap();
    let scopes = json!({"program": mock, "args": ["--tools", script, "--call-log", base.join("calls.jsonl")],
                        "env": {"CK_LOG": "warn"}, "enabled": true, "reserved": true});
    let claustrum = json!({"program": mock, "args": ["claustrum", "--vault", vault_file],
                           "env": {"CK_LOG": "warn"}, "enabled": true, "reserved": true});
    let mut env = Vec::new();
    if kills {
        env.push(("BROCA_FAILPOINTS".into(), "classify.after_record:0.08,classify.before_publish:0.2".into()));
    }
    let providers = json!({"cloudflare-workers-ai": {"base_url": "{mock}"}, "typesafe": {"base_url": "{mock}"}});
    let defaults = Options::default();
    let bench = broca.is_some();
    Harness::start_with(Options {
        broca: broca.unwrap_or(defaults.broca.clone()),
        ck_log: if bench { "warn".into() } else { defaults.ck_log.clone() },
        test_writer: !bench,
        modules: vec![(SCOPES.into(), scopes), ("claustrum".into(), claustrum)],
        daemon: vec![("scope_authority_owners".into(), json!([SCOPES]))],
        broca_jsonc: Some(json!({"providers": providers})),
        restart: Some(json!({"max_restarts": 1000, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 100})),
        prefix: "bcl".into(),
        env,
        ..defaults
    })
}

/// Waits until a scoped classifier route opens and answers `role.describe`.
pub fn ready(h: &Harness) -> Route<'_> {
    let until = Instant::now() + support::STEP;
    loop {
        if let Ok(route) = open(h, Some("run-scope"), &[("classifier", "v1")]) {
            if route.request("role.describe", "{}").is_ok() {
                return route;
            }
        }
        assert!(Instant::now() < until, "no classifier route:\n{}", h.broca_log_tail(40));
        std::thread::sleep(Duration::from_millis(100));
    }
}
