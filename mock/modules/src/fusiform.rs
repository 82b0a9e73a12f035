//! `broca-mock --fusiform-script FILE --subc <connection-file>`: the scripted double as a real
//! `fusiform` module (default module id `fusiform`), serving the `catalog.get` tool on its tool
//! route over broca's own subc layer, as the tool provider does (`broca-mock-tools`,
//! `mock/tools/src/lib.rs`).
//!
//! The catalog is the `response` of an LKG file (default `testdata/catalog/fusiform-lkg.json`),
//! its models split into pages in key order. The script (JSON) is re-read on every request; a
//! changed file starts again from its first attempt. Every page-one request (no `page_token`)
//! starts the next attempt; the last attempt repeats. Members of an attempt (all optional):
//!
//! | member | effect |
//! |---|---|
//! | `pages: [n, …]` | models per page (the last page takes the rest); default one page |
//! | `unpaged: true` | an older fusiform: one answer, no `next_page_token`, whatever was asked |
//! | `published: true` | a 0.30.0 fusiform: arguments decode as `fusiform_protocol::CatalogGetRequest` (unknown members refused `bad_request` with serde's message), then an unpaged answer |
//! | `version: n` | the `catalog_version` served (default the file's) |
//! | `refuse: {page, code, message}` | that page request is refused with an Error frame |
//! | `mismatch_page: n` | page n carries `catalog_version + 1` |
//! | `malformed_page: n` | page n is the bytes `{"models": "not a map"` |
//! | `repeat_token_page: n` | page n repeats the previous page's `next_page_token` |
//! | `null_token_page: n` | page n has `next_page_token: null` |
//! | `duplicate_model_page: n` | page n also carries page one's first model |
//! | `duplicate_row_page: n` | page n repeats page one's `overridden` rows |
//! | `pad_bytes: n` | each page carries `n` bytes of padding (an unknown member) |
//! | `endless: true` | every page has a next token; pages after page one carry no models |
//!
//! A `page_token` that is not exactly the token last served is refused `bad_request`, so a test
//! proves tokens are echoed exactly. `--request-log PATH` appends `{attempt, page, arguments,
//! answer}` per request.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use broca::subc::{self, health_ok, BindRequest, ControlRequest, Handler, Outbound, Route};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use subc_protocol::{ErrorBody, Flags};

pub const DEFAULT_MODULE_ID: &str = "fusiform";
const DEFAULT_CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/catalog/fusiform-lkg.json");

#[derive(Debug)]
pub struct Options {
    pub conn_file: PathBuf,
    pub script: PathBuf,
    pub request_log: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    #[serde(default)]
    catalog: Option<PathBuf>,
    #[serde(default)]
    attempts: Vec<Attempt>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Attempt {
    #[serde(default)]
    pages: Vec<usize>,
    #[serde(default)]
    unpaged: bool,
    #[serde(default)]
    published: bool,
    version: Option<i64>,
    refuse: Option<Refuse>,
    mismatch_page: Option<usize>,
    malformed_page: Option<usize>,
    repeat_token_page: Option<usize>,
    null_token_page: Option<usize>,
    duplicate_model_page: Option<usize>,
    duplicate_row_page: Option<usize>,
    #[serde(default)]
    pad_bytes: usize,
    #[serde(default)]
    endless: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Refuse {
    page: usize,
    code: String,
    #[serde(default)]
    message: String,
}

/// Where the current poll is: which attempt, which page, the token last served.
#[derive(Default)]
struct State {
    script_bytes: Vec<u8>,
    attempt: usize,
    page: usize,
    last_token: Option<String>,
    requests: u64,
}

struct Shared {
    opts: Options,
    outbound: Outbound,
    state: Mutex<State>,
}

struct Fusiform {
    shared: Arc<Shared>,
}

pub fn serve(opts: Options) -> ExitCode {
    let module_id = std::env::var(subc_protocol::SUBC_MODULE_ID_ENV)
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| DEFAULT_MODULE_ID.to_owned());
    let conn = match subc::connect(&opts.conn_file, manifest(&module_id), &module_id) {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("broca-mock: {e}");
            return ExitCode::from(1);
        }
    };
    let outbound = conn.outbound();
    let shared = Arc::new(Shared { opts, outbound, state: Mutex::new(State::default()) });
    let authorize = |bind: &BindRequest| match bind.principal {
        Some(_) => Ok(()),
        None => Err(ErrorBody::new("not_authorized", "the daemon stamped no principal on this bind")),
    };
    let running = match conn.start(Fusiform { shared }, authorize) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("broca-mock: cannot start the subc io thread: {e}");
            return ExitCode::from(1);
        }
    };
    log::info!("serving catalog.get as {module_id}");
    let end = running.join();
    if end.is_clean() {
        ExitCode::SUCCESS
    } else {
        eprintln!("broca-mock: {end}");
        ExitCode::from(1)
    }
}

fn manifest(module_id: &str) -> subc_protocol::manifest::ModuleManifest {
    use subc_protocol::manifest::{Concurrency, ExecutionMode, ModuleManifest, ProviderRole, Tool};
    let tool = Tool {
        name: "catalog.get".into(),
        description: Some("the scripted model catalog".into()),
        execution_mode: ExecutionMode::Pure,
        schema: json!({"type": "object"}),
    };
    ModuleManifest::builder(module_id, env!("CARGO_PKG_VERSION"))
        .provides(vec![ProviderRole::ToolProvider {
            tools: vec![tool],
            identity_scope: Vec::new(),
            concurrency: Concurrency::ModuleManaged,
            emits_push: false,
            sub_supervises: false,
        }])
        .build()
}

/// An answer: a body, raw bytes, or an Error frame.
enum Answer {
    Body(Value),
    Raw(Vec<u8>),
    Refuse(ErrorBody),
}

impl Handler for Fusiform {
    fn on_request(&mut self, route: Route, corr: u64, _flags: Flags, body: Vec<u8>) {
        let shared = Arc::clone(&self.shared);
        // Pages can be megabytes: built off the io thread.
        std::thread::spawn(move || {
            let answer = shared.answer(&body);
            let _ = match answer {
                Answer::Body(v) => shared.outbound.reply(route, corr, serde_json::to_vec(&v).expect("serializes")),
                Answer::Raw(bytes) => shared.outbound.reply(route, corr, bytes),
                Answer::Refuse(e) => shared.outbound.error(route, corr, &e),
            };
        });
    }

    fn on_cancel(&mut self, _route: Route, _corr: u64) {}

    fn on_route_closed(&mut self, _route: Route) {}

    fn on_control(&mut self, request: ControlRequest) {
        if let ControlRequest::HealthCheck { corr } = request {
            let requests = self.shared.state.lock().requests;
            let _ = self.shared.outbound.health(corr, health_ok(json!({"requests": requests})));
        }
    }

    fn on_shutdown(&mut self) {}
}

fn bad_request(message: impl Into<String>) -> Answer {
    Answer::Refuse(ErrorBody::new("bad_request", message))
}

impl Shared {
    fn answer(&self, body: &[u8]) -> Answer {
        let request: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return bad_request(format!("not JSON: {e}")),
        };
        if request.get("name").and_then(Value::as_str) != Some("catalog.get") {
            return Answer::Refuse(ErrorBody::new("unknown_tool", "only catalog.get is served"));
        }
        let arguments = request.get("arguments").cloned().unwrap_or_else(|| json!({}));
        let script_bytes = std::fs::read(&self.opts.script).unwrap_or_default();
        let script: Script = match serde_json::from_slice(&script_bytes) {
            Ok(s) => s,
            Err(e) => return Answer::Refuse(ErrorBody::new("unavailable", format!("the mock's script: {e}"))),
        };
        let mut state = self.state.lock();
        state.requests += 1;
        if state.script_bytes != script_bytes {
            *state = State { script_bytes, requests: state.requests, ..State::default() };
        }
        let token = arguments.get("page_token").and_then(Value::as_str).map(str::to_owned);
        match &token {
            None => {
                state.attempt += 1;
                state.page = 1;
            }
            Some(t) if Some(t) == state.last_token.as_ref() => state.page += 1,
            Some(t) => return bad_request(format!("unknown page_token {t:?}")),
        }
        let index = (state.attempt - 1).min(script.attempts.len().saturating_sub(1));
        let attempt = script.attempts.get(index).cloned().unwrap_or_default();
        let (attempt_no, page) = (state.attempt, state.page);
        let answer = build(&script, &attempt, &arguments, attempt_no, page, &mut state.last_token);
        drop(state);
        self.log(attempt_no, page, &arguments, &answer);
        answer
    }

    fn log(&self, attempt: usize, page: usize, arguments: &Value, answer: &Answer) {
        let Some(path) = &self.opts.request_log else { return };
        let what = match answer {
            Answer::Body(v) => {
                json!({"page": v["models"].as_object().map_or(0, Map::len), "next": v.get("next_page_token")})
            }
            Answer::Raw(_) => json!("raw"),
            Answer::Refuse(e) => json!({"refused": e.code}),
        };
        let line = json!({"attempt": attempt, "page": page, "arguments": arguments, "answer": what});
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

fn build(
    script: &Script,
    attempt: &Attempt,
    arguments: &Value,
    attempt_no: usize,
    page: usize,
    last_token: &mut Option<String>,
) -> Answer {
    let path = script.catalog.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CATALOG));
    let mut response = match std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
        Some(lkg) => lkg["response"].clone(),
        None => return Answer::Refuse(ErrorBody::new("unavailable", format!("cannot read {}", path.display()))),
    };
    if let Some(v) = attempt.version {
        response["catalog_version"] = json!(v);
    }
    if attempt.published {
        if let Err(e) = serde_json::from_value::<fusiform_protocol::CatalogGetRequest>(arguments.clone()) {
            return bad_request(e.to_string());
        }
        return Answer::Body(response);
    }
    if attempt.unpaged {
        return Answer::Body(response);
    }
    if let Some(r) = attempt.refuse.as_ref().filter(|r| r.page == page) {
        return Answer::Refuse(ErrorBody::new(r.code.clone(), r.message.clone()));
    }
    if attempt.malformed_page == Some(page) {
        return Answer::Raw(br#"{"models": "not a map""#.to_vec());
    }
    let mut models: Vec<(String, Value)> =
        response["models"].as_object().cloned().unwrap_or_default().into_iter().collect();
    models.sort_by(|a, b| a.0.cmp(&b.0));
    let first_model = models.first().cloned();
    let sizes = if attempt.pages.is_empty() { vec![models.len()] } else { attempt.pages.clone() };
    let start: usize = if attempt.endless { 0 } else { sizes.iter().take(page - 1).sum() };
    let size = sizes.get(page - 1).copied().unwrap_or(models.len());
    let last = !attempt.endless && (page >= sizes.len() || start + size >= models.len());
    // Endless pages after page one carry no models (so only the bounds can end the poll).
    let take = match (attempt.endless, last) {
        (true, _) if page > 1 => 0,
        (_, true) => models.len().saturating_sub(start),
        _ => size,
    };
    let mut page_models: Map<String, Value> = models.into_iter().skip(start).take(take).collect();
    if attempt.duplicate_model_page == Some(page) {
        if let Some((k, v)) = first_model {
            page_models.insert(k, v);
        }
    }
    let mut out = json!({
        "source": response["source"],
        "resolved_at_ms": response["resolved_at_ms"],
        "catalog_version": response["catalog_version"],
        "models": page_models,
    });
    if page == 1 || attempt.duplicate_row_page == Some(page) {
        if let Some(rows) = response.get("overridden") {
            out["overridden"] = rows.clone();
        }
    }
    if attempt.mismatch_page == Some(page) {
        out["catalog_version"] = json!(response["catalog_version"].as_i64().unwrap_or(0) + 1);
    }
    if attempt.pad_bytes > 0 {
        out["padding"] = json!("x".repeat(attempt.pad_bytes));
    }
    if attempt.null_token_page == Some(page) {
        out["next_page_token"] = Value::Null;
    } else if attempt.repeat_token_page == Some(page) {
        out["next_page_token"] = json!(last_token.clone());
    } else if !last {
        let token = format!("tok/{attempt_no}/{page}/é+{}", uuid::Uuid::new_v4().simple());
        out["next_page_token"] = json!(token);
        *last_token = Some(token);
    }
    Answer::Body(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(script: Value) -> Attempt {
        serde_json::from_value(script).unwrap()
    }

    fn body(answer: Answer) -> Value {
        match answer {
            Answer::Body(v) => v,
            Answer::Raw(b) => panic!("raw bytes {}", String::from_utf8_lossy(&b)),
            Answer::Refuse(e) => panic!("refused {}: {}", e.code, e.message),
        }
    }

    #[test]
    fn the_default_catalog_is_found_from_this_package() {
        assert!(PathBuf::from(DEFAULT_CATALOG).is_file(), "{DEFAULT_CATALOG}");
    }

    #[test]
    fn pages_split_the_models_in_key_order_and_the_last_takes_the_rest() {
        let script = Script::default();
        let a = attempt(json!({"pages": [5, 5, 5]}));
        let mut token = None;
        let one = body(build(&script, &a, &json!({}), 1, 1, &mut token));
        let two = body(build(&script, &a, &json!({}), 1, 2, &mut token));
        let three = body(build(&script, &a, &json!({}), 1, 3, &mut token));
        let counts: Vec<usize> = [&one, &two, &three].iter().map(|p| p["models"].as_object().unwrap().len()).collect();
        assert_eq!(counts, [5, 5, 6]);
        assert!(one["next_page_token"].is_string() && two["next_page_token"].is_string());
        assert!(three.get("next_page_token").is_none(), "the last page has no token");
        assert!(one.get("overridden").is_some() && two.get("overridden").is_none(), "rows ride page one");
        let keys: Vec<String> =
            [&one, &two, &three].iter().flat_map(|p| p["models"].as_object().unwrap().keys().cloned()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn a_scripted_page_is_refused_malformed_or_mismatched() {
        let script = Script::default();
        let mut token = None;
        let refused = attempt(json!({"pages": [5], "refuse": {"page": 2, "code": "unavailable"}}));
        assert!(
            matches!(build(&script, &refused, &json!({}), 1, 2, &mut token), Answer::Refuse(e) if e.code == "unavailable")
        );
        let malformed = attempt(json!({"pages": [5], "malformed_page": 1}));
        assert!(matches!(build(&script, &malformed, &json!({}), 1, 1, &mut token), Answer::Raw(_)));
        let mismatched = attempt(json!({"pages": [5], "mismatch_page": 2}));
        let one = body(build(&script, &mismatched, &json!({}), 1, 1, &mut token));
        let two = body(build(&script, &mismatched, &json!({}), 1, 2, &mut token));
        assert_eq!(two["catalog_version"].as_i64(), one["catalog_version"].as_i64().map(|v| v + 1));
    }

    #[test]
    fn unpaged_answers_the_whole_catalog_and_published_checks_the_arguments() {
        let script = Script::default();
        let mut token = None;
        let whole = body(build(&script, &attempt(json!({"unpaged": true})), &json!({}), 1, 1, &mut token));
        assert_eq!(whole["models"].as_object().unwrap().len(), 16);
        assert!(whole.get("next_page_token").is_none());
        let published = attempt(json!({"published": true}));
        let refused = build(&script, &published, &json!({"no_such_member": 1}), 1, 1, &mut token);
        assert!(matches!(refused, Answer::Refuse(e) if e.code == "bad_request"));
    }
}
