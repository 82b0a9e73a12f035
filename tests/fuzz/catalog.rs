//! The catalog parser: the seeded LKG (`testdata/catalog/fusiform-lkg.json`) mutated and
//! re-signed (so a mutant reaches the row parser, not only the checksum) and loaded from a file;
//! every model of a loaded catalog resolved with every variant it defines and a few it does
//! not; and the paged `catalog.get` answer — the seeded response split into pages, one page
//! mutated (as JSON, as bytes, wrapped as a tool result, replaced by an error document, its
//! token repeated or nulled) — assembled by the poller's real `fetch` over a scripted source.
//!
//! Checks: nothing panics; a load fails only with a typed `CatalogError`, a tampered unsigned
//! response always fails; an admission fails only with an `AdmissionError` whose refusal is
//! typed; a fetch fails only with a `PollError` that has its code, and an unmutated one merges
//! every model.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use broca::catalog::pages::NEXT_PAGE_TOKEN;
use broca::catalog::poller::{self, CatalogSource};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::{jcs_sha256, variant, Catalog, CatalogError};
use broca::provider::config::AuthSource;
use broca::provider::event::Family;
use broca::subc::consumer::CallError;
use serde_json::{json, Map, Value};

use crate::{fuzz, testdata, Gen};

fn seeded() -> Value {
    serde_json::from_slice(&std::fs::read(testdata().join("catalog/fusiform-lkg.json")).unwrap()).unwrap()
}

/// Every member name and fact key the seeded LKG uses, and the fact values the parser reads.
fn names(lkg: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(lkg, &mut out);
    out.extend(
        ["effort", "budget_tokens", "toggle", "values", "min", "max", "type", "chat", "retired"].map(String::from),
    );
    out.into_iter().collect()
}

/// Resolves every model of `catalog` (up to a bound) with its variants and a few others.
fn admit_every_model(g: &mut Gen, catalog: &Catalog, response: &Value) {
    let models: Vec<String> = response
        .get("models")
        .and_then(Value::as_object)
        .map(|m| m.keys().take(40).cloned().collect())
        .unwrap_or_default();
    let overrides = [
        RouteOverrides::default(),
        RouteOverrides { vault: true, ..RouteOverrides::default() },
        RouteOverrides { base_url_override: Some("http://127.0.0.1:1/v1".into()), ..RouteOverrides::default() },
        RouteOverrides { auth: AuthSource::Bearer, ..RouteOverrides::default() },
    ];
    for model in models {
        let mut asked: Vec<Option<String>> =
            vec![None, Some("high".into()), Some(String::new()), Some("x".repeat(300))];
        if let Some(row) = catalog.row(&model) {
            for family in Family::ALL {
                for (name, setting) in variant::variants(row, family) {
                    let _ = variant::render(&setting, family, &row.model);
                    asked.push(Some(name));
                }
            }
        }
        for v in asked {
            let req = ModelRequest {
                model: model.clone(),
                variant: v,
                max_output_tokens: *g.pick(&[None, Some(0), Some(1), Some(u64::MAX)]),
                max_steps: *g.pick(&[None, Some(0), Some(u64::MAX)]),
                ..ModelRequest::default()
            };
            if let Err(e) = route::resolve(Ok(catalog), PathBuf::from("/lkg"), &req, g.pick(&overrides)) {
                let refusal = e.refusal();
                assert!(!refusal.message.is_empty());
                serde_json::from_str::<Value>(&refusal.to_json()).expect("a refusal body is JSON");
            }
        }
    }
}

#[test]
fn fuzz_catalog_lkg() {
    let lkg = seeded();
    let names = names(&lkg);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let digest = jcs_sha256(&lkg["response"]);
    let dir = crate::scratch_dir();
    let path = dir.path().join("fusiform-lkg.json");
    fuzz("catalog.lkg", 100, |g| {
        let mut file = lkg.clone();
        let (mut resigned, mut tampered) = (false, false);
        match g.below(8) {
            0..=4 => {
                if g.chance(3) {
                    g.mutate_json_typed(&mut file["response"]);
                } else {
                    g.mutate_json(&mut file["response"], &names);
                }
                tampered = jcs_sha256(&file["response"]) != digest;
                if !g.chance(6) {
                    file["response_sha256"] = json!(jcs_sha256(&file["response"]));
                    resigned = true;
                }
            }
            5 => g.mutate_json(&mut file, &["format", "response_sha256", "response", "written_at_ms", "pages"]),
            _ => {}
        }
        let mut bytes = serde_json::to_vec(&file).unwrap();
        if g.chance(6) {
            g.mutate_bytes(&mut bytes, &[]);
        }
        std::fs::write(&path, &bytes).unwrap();
        match Catalog::load_lkg(&path) {
            Ok(catalog) => {
                assert!(!tampered || resigned, "a tampered response loaded without its checksum");
                // (Members the loader skips may nest past serde_json's limit for a whole value.)
                let whole = serde_json::from_slice::<Value>(&bytes).ok();
                let response = whole.and_then(|v| v.get("response").cloned()).unwrap_or_default();
                admit_every_model(g, &catalog, &response);
            }
            Err(CatalogError::Invalid { reason, .. }) => assert!(!reason.is_empty()),
            Err(e) => panic!("the LKG file exists and is readable: {e}"),
        }
    });
}

/// One page's answer: its body, or the code of a module refusal.
type PageAnswer = Result<Vec<u8>, String>;

/// A scripted fusiform: answers page requests by token with fixed bodies.
struct Pages {
    /// `(token this page answers to, body)`; page one answers to no token.
    bodies: Vec<(Option<String>, PageAnswer)>,
    calls: Mutex<usize>,
}

impl CatalogSource for Pages {
    fn call(&self, body: &[u8], _timeout: Duration) -> Result<Vec<u8>, CallError> {
        *self.calls.lock().unwrap() += 1;
        let request: Value = serde_json::from_slice(body).expect("the poller's request is JSON");
        let token = request["arguments"]["page_token"].as_str().map(String::from);
        match self.bodies.iter().find(|(t, _)| *t == token) {
            Some((_, Ok(body))) => Ok(body.clone()),
            Some((_, Err(code))) => Err(CallError::Module(subc_protocol::ErrorBody::new(code, "scripted refusal"))),
            None => Err(CallError::Module(subc_protocol::ErrorBody::new("bad_request", "unknown page_token"))),
        }
    }
}

/// The seeded response split into `n` pages chained by tokens.
fn paginate(response: &Value, n: usize) -> Vec<(Option<String>, Value)> {
    let models = response["models"].as_object().unwrap();
    let per = models.len().div_ceil(n);
    let chunks: Vec<Map<String, Value>> = models
        .iter()
        .collect::<Vec<_>>()
        .chunks(per)
        .map(|c| c.iter().map(|(k, v)| ((*k).clone(), (*v).clone())).collect())
        .collect();
    let count = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, models)| {
            let mut page = response.clone();
            page["models"] = Value::Object(models);
            if i > 0 {
                page.as_object_mut().unwrap().remove("overridden");
            }
            if i + 1 < count {
                page[NEXT_PAGE_TOKEN] = json!(format!("t{}", i + 1));
            }
            (if i == 0 { None } else { Some(format!("t{i}")) }, page)
        })
        .collect()
}

#[test]
fn fuzz_catalog_pages() {
    let lkg = seeded();
    let response = lkg["response"].clone();
    let total = response["models"].as_object().unwrap().len();
    let names = names(&lkg);
    let mut names: Vec<&str> = names.iter().map(String::as_str).collect();
    names.extend([NEXT_PAGE_TOKEN, "error", "code", "message", "content", "structuredContent", "text"]);
    fuzz("catalog.pages", 100, |g| {
        let pages = paginate(&response, g.range(1, 5));
        let target = g.below(pages.len());
        let mut mutated = false;
        let bodies = pages
            .iter()
            .enumerate()
            .map(|(i, (token, page))| {
                let mut page = page.clone();
                if i == target && !g.chance(8) {
                    mutated = true;
                    match g.below(9) {
                        0 => g.mutate_json_typed(&mut page),
                        1..=3 => g.mutate_json(&mut page, &names),
                        4 => page[NEXT_PAGE_TOKEN] = g.pick(&[json!(null), json!(""), json!("t1"), json!(7)]).clone(),
                        5 => page = json!({"content": [{"type": "text", "text": page.to_string()}]}),
                        6 => page = json!({"error": {"code": g.pick(&["catalog_changed", "unavailable", "bad_request"]), "message": "m"}}),
                        7 => return (token.clone(), Err(g.pick(&["catalog_changed", "module_timeout", "bad_request"]).to_string())),
                        _ => {
                            let mut bytes = serde_json::to_vec(&page).unwrap();
                            g.mutate_bytes(&mut bytes, &[]);
                            return (token.clone(), Ok(bytes));
                        }
                    }
                }
                (token.clone(), Ok(serde_json::to_vec(&page).unwrap()))
            })
            .collect();
        let source = Pages { bodies, calls: Mutex::new(0) };
        match poller::fetch(&source) {
            Ok((merged, pages_read, _restarts)) => {
                assert!(pages_read >= 1);
                let catalog = Catalog::from_response(&merged);
                if !mutated {
                    assert_eq!(catalog.as_ref().map(Catalog::len), Ok(total), "an intact paged answer merges whole");
                }
                if let Ok(catalog) = catalog {
                    admit_every_model(g, &catalog, &merged);
                }
            }
            Err(e) => {
                assert!(mutated, "an intact paged answer failed: {e:?}");
                assert!(!e.code().is_empty());
                let _ = (e.retry_soon(), e.body());
            }
        }
        assert!(*source.calls.lock().unwrap() <= poller::MAX_PAGE_REQUESTS);
    });
}
