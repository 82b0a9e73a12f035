//! The catalog poller end to end (spec §1a): the real subc daemon supervises broca on a fresh
//! state root with **no** LKG and broca-mock as a scripted `fusiform` module
//! (`--fusiform-script`, `mock/modules/src/fusiform.rs`). broca polls every 400 ms here
//! (`BROCA_TEST_CATALOG_POLL_MS`, a debug-build switch). Each scenario rewrites the script and
//! waits for two more polls, so at least one whole poll ran under it; `health.check`'s
//! `metrics.catalog` and the LKG's bytes are then checked, and every failure body is pinned
//! under `testdata/golden/catalog_poll.*.json`.

use broca_mock::mock;
mod pin;
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Harness, Options, MODULE_ID};

/// The vault secret the catalog's mock routes run with.
const VAULT_SECRET: &str = "sk-catalog-e2e-vault-31aa";

/// The seeded catalog's version and model count.
const V0: i64 = 1_795_392_012_345;
const MODELS: u64 = 16;

struct Rig {
    h: Harness,
    script: PathBuf,
    requests: PathBuf,
    lkg: PathBuf,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn health(&self) -> Value {
        let probe = self.h.block_on(self.h.client().consumer().supervisor_health_probe(MODULE_ID)).unwrap();
        probe.metrics.expect("health metrics")["catalog"].clone()
    }

    /// Writes the script (atomically) and waits for two more polls; returns health then, and
    /// the polls and failures counted since the write.
    fn under(&self, script: Value) -> (Value, u64, u64) {
        let before = self.health();
        let tmp = self.script.with_extension("tmp");
        std::fs::write(&tmp, script.to_string()).unwrap();
        std::fs::rename(&tmp, &self.script).unwrap();
        let p0 = before["polls"].as_u64().unwrap();
        let f0 = before["failures"].as_u64().unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.health();
            if now["polls"].as_u64().unwrap() >= p0 + 2 {
                let polls = now["polls"].as_u64().unwrap() - p0;
                let failures = now["failures"].as_u64().unwrap() - f0;
                return (now, polls, failures);
            }
            assert!(Instant::now() < until, "no two polls within 60 s: {now}\n{}", self.h.broca_log_tail(30));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A failing script: every poll under it fails `code`, counted once each; the catalog and
    /// the LKG stay as they were; the failure body is pinned.
    fn fails(&self, name: &str, script: Value, code: &str) -> Value {
        let lkg_before = std::fs::read(&self.lkg).unwrap();
        let version_before = self.health()["catalog_version"].clone();
        let (health, polls, failures) = self.under(script);
        assert_eq!(health["last_outcome"], code, "{name}: {health}");
        // Every failed poll counts once (a poll with restarts too); only the poll that straddled
        // the write may have succeeded under the previous script.
        assert!(failures <= polls && failures + 1 >= polls, "{name}: one failure per failed poll: {health}");
        assert_eq!(health["catalog_version"], version_before, "{name}: the snapshot is kept");
        assert_eq!(health["models"], MODELS);
        assert_eq!(std::fs::read(&self.lkg).unwrap(), lkg_before, "{name}: the LKG is kept");
        pin::assert_golden(&format!("catalog_poll.{name}.json"), &health["last_failure"].to_string(), None);
        health
    }

    fn succeeds(&self, script: Value, version: i64, pages: u64) -> Value {
        let (health, _, _) = self.under(script);
        assert_eq!(health["last_outcome"], "ok", "{health}\n{}", self.h.broca_log_tail(20));
        assert_eq!((health["catalog_version"].as_i64(), health["models"].as_u64()), (Some(version), Some(MODELS)));
        assert_eq!(health["last_pages"], pages, "{health}");
        let lkg = broca::catalog::Catalog::load_lkg(&self.lkg).expect("the written LKG loads");
        assert_eq!(lkg.catalog_version, version as u64);
        health
    }

    /// The request log's lines since `from` (byte offset), and the new end.
    fn requests_since(&self, from: usize) -> (Vec<Value>, usize) {
        let text = std::fs::read_to_string(&self.requests).unwrap_or_default();
        let lines = text[from.min(text.len())..].lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        (lines, text.len())
    }
}

fn boot() -> Rig {
    let mock = broca_mock::exe();
    let dir = tempfile::Builder::new().prefix("bca").tempdir_in("/tmp").unwrap();
    let script = dir.path().join("fusiform.json");
    let requests = dir.path().join("requests.jsonl");
    // fusiform is warming at first: sends are refused until a poll succeeds.
    std::fs::write(
        &script,
        json!({"attempts": [{"refuse": {"page": 1, "code": "unavailable", "message": "warming"}}]}).to_string(),
    )
    .unwrap();
    let fusiform = json!({"program": mock, "args": ["--fusiform-script", script, "--request-log", requests],
                          "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true});
    // The catalog's mock routes read their credential from a scripted vault (checked by the
    // model endpoint), so the first turn on a fetched catalog also proves the vault path.
    let vault = dir.path().join("vault.json");
    let record = json!({"secret": VAULT_SECRET, "record_version": 1, "principals": ["broca"]});
    std::fs::write(&vault, json!({"credentials": {"apikey:mock": record}}).to_string()).unwrap();
    let claustrum =
        json!({"program": mock, "args": ["claustrum", "--vault", vault], "enabled": true, "reserved": true});
    let opts = Options {
        modules: vec![("fusiform".into(), fusiform), ("claustrum".into(), claustrum)],
        env: vec![("BROCA_TEST_CATALOG_POLL_MS".into(), "400".into()), ("BROCA_TEST_VAULT_AUTH".into(), "1".into())],
        seed_lkg: false,
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    let authorization = json!({"authorization": format!("Bearer {VAULT_SECRET}")}).to_string();
    h.mock.install("default", mock::Script::from_json(&authorization).unwrap());
    let lkg = h.state_root().join("catalog/fusiform-lkg.json");
    Rig { h, script, requests, lkg, _dir: dir }
}

fn first_success_serves_a_fresh_root(rig: &Rig) {
    let h = &rig.h;
    let s = h.session("catalog-e2e", "fresh", None);
    let (code, body) = s.refused("session.send", support::send_params("before any catalog"));
    assert_eq!(code, "open_failed");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("model catalog unavailable: no in-memory catalog"), "{message}");
    let root = h.state_root().to_string_lossy().into_owned();
    pin::assert_golden("catalog_unavailable.fresh_root.json", &body.to_string(), Some(&root));
    assert!(!rig.lkg.exists());
    // The first poll may still be in flight right after boot.
    let until = Instant::now() + Duration::from_secs(30);
    let mut health = rig.health();
    while health["polls"].as_u64() == Some(0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        health = rig.health();
    }
    assert_eq!((health["last_outcome"].as_str(), health["models"].is_null()), (Some("unavailable"), true), "{health}");

    // Three pages; the mock refuses any token that is not exactly the one it served.
    let (_, offset) = rig.requests_since(0);
    rig.succeeds(json!({"attempts": [{"pages": [5, 4, 4]}]}), V0, 3);
    let (requests, _) = rig.requests_since(offset);
    let paged: Vec<&Value> = requests.iter().filter(|r| r["answer"].get("refused").is_none()).collect();
    let first = paged.iter().find(|r| r["page"] == 1).expect("a page-one request");
    assert_eq!(
        first["arguments"],
        json!({"fact_prefixes": ["existence", "model.", "limit.", "capability.", "wire.", "route.", "rate."],
               "include_retired": true, "paged": true})
    );
    assert!(paged
        .iter()
        .any(|r| r["page"] == 3 && r["arguments"]["page_token"].as_str().is_some_and(|t| t.contains('é'))));

    // Served without a restart: a turn runs on a catalog model, with the credential the model
    // endpoint checks came from the vault.
    h.install(json!({"responses": [{"events": [{"text": "hello from the catalog"}, {"finish": "stop"}]}]}));
    let reply = s.ok("session.send", support::send_params("after the first poll"));
    let status = s.wait_run(reply["run_id"].as_str().unwrap(), "completed");
    assert_eq!(status["auth_selection"], "apikey:mock", "{status}");
    let sent = h.mock.requests("default");
    assert_eq!(sent.last().and_then(|r| r.header("authorization")), Some(format!("Bearer {VAULT_SECRET}").as_str()));
}

fn restarts_and_older_answers(rig: &Rig) {
    // catalog_changed on page two: restart from page one, then a consistent snapshot.
    rig.succeeds(
        json!({"attempts": [{"pages": [5, 8], "refuse": {"page": 2, "code": "catalog_changed", "message": "stale"}},
                            {"pages": [5, 8], "version": V0 + 1}]}),
        V0 + 1,
        2,
    );
    // A version mismatch on page two restarts too.
    rig.succeeds(
        json!({"attempts": [{"pages": [5, 8], "mismatch_page": 2}, {"pages": [6, 7], "version": V0 + 2}]}),
        V0 + 2,
        2,
    );
    // An older fusiform's unpaged answer is complete.
    rig.succeeds(json!({"attempts": [{"unpaged": true, "version": V0 + 3}]}), V0 + 3, 1);
}

fn failures_keep_the_catalog(rig: &Rig) {
    let v = V0 + 4;
    rig.fails(
        "unstable",
        json!({"attempts": [{"pages": [5, 8], "mismatch_page": 2, "version": v}]}),
        "catalog_unstable",
    );
    rig.fails(
        "changed_thrice",
        json!({"attempts": [{"pages": [5, 8], "refuse": {"page": 2, "code": "catalog_changed"}, "version": v}]}),
        "catalog_unstable",
    );
    rig.fails("refused", json!({"attempts": [{"pages": [5, 8], "refuse": {"page": 2, "code": "refused", "message": "no"}, "version": v}]}), "refused");
    rig.fails(
        "malformed",
        json!({"attempts": [{"pages": [5, 8], "malformed_page": 2, "version": v}]}),
        "catalog_protocol_error",
    );
    rig.fails(
        "duplicate_model",
        json!({"attempts": [{"pages": [5, 8], "duplicate_model_page": 2, "version": v}]}),
        "catalog_protocol_error",
    );
    rig.fails(
        "duplicate_row",
        json!({"attempts": [{"pages": [5, 8], "duplicate_row_page": 2, "version": v}]}),
        "catalog_protocol_error",
    );
    rig.fails(
        "repeated_token",
        json!({"attempts": [{"pages": [4, 4, 5], "repeat_token_page": 2, "version": v}]}),
        "catalog_protocol_error",
    );
    rig.fails(
        "null_token",
        json!({"attempts": [{"pages": [5, 8], "null_token_page": 1, "version": v}]}),
        "catalog_protocol_error",
    );
    rig.fails("regressed", json!({"attempts": [{"pages": [5, 8], "version": V0}]}), "catalog_rejected");
    rig.fails(
        "page_requests",
        json!({"attempts": [{"pages": [1], "endless": true, "version": v}]}),
        "catalog_poll_exhausted",
    );
    rig.fails(
        "response_bytes",
        json!({"attempts": [{"pages": [1], "endless": true, "pad_bytes": 3_500_000, "version": v}]}),
        "catalog_poll_exhausted",
    );
}

fn published_fusiform_refuses_paging(rig: &Rig) {
    let health = rig.fails(
        "published_bad_request",
        json!({"attempts": [{"published": true, "version": V0 + 9}]}),
        "bad_request",
    );
    let failure = &health["last_failure"];
    assert_eq!(failure["detail"]["member"], "paged", "{failure}");
    assert!(failure["message"].as_str().unwrap().contains("paged"), "{failure}");
    assert!(rig.h.broca_log().contains("naming member \"paged\""), "the log names the member");
    // Sends still serve from the LKG.
    let s = rig.h.session("catalog-e2e", "published", None);
    rig.h.install(json!({"responses": [{"events": [{"text": "still serving"}, {"finish": "stop"}]}]}));
    let reply = s.ok("session.send", support::send_params("on the LKG"));
    s.wait_run(reply["run_id"].as_str().unwrap(), "completed");
}

type Scenario = (&'static str, fn(&Rig));

#[test]
fn the_catalog_poller_through_the_daemon() {
    let rig = boot();
    let scenarios: [Scenario; 4] = [
        ("a fresh root is refused, then served after the first poll", first_success_serves_a_fresh_root),
        ("catalog_changed and mismatches restart; an unpaged answer is complete", restarts_and_older_answers),
        ("every failed poll keeps the snapshot and the LKG", failures_keep_the_catalog),
        ("a 0.30.0 fusiform's bad_request names the paging member", published_fusiform_refuses_paging),
    ];
    for (name, scenario) in scenarios {
        let started = Instant::now();
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&rig))) {
            eprintln!("scenario {name:?} failed after {:?}\n{}", started.elapsed(), rig.h.broca_log_tail(40));
            rig.h.stop();
            std::panic::resume_unwind(e);
        }
        eprintln!("scenario {name:?}: {:?}", started.elapsed());
    }
    rig.h.stop();
}
