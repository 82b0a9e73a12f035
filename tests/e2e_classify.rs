//! The classifier/v1 role end to end (spec §4b): the real subc daemon supervises broca,
//! `broca-mock claustrum` (the vault, holding the Workers AI token and account id) and
//! `broca-mock --tools` as the scope authority that syncs a run scope and a flow scope; the
//! harness's MockServer plays Workers AI (`/client/v4/accounts/{id}/ai/run/@cf/cloudflare/clef`)
//! and counts every provider call per item outside broca.
//!
//! Checked: classifier routes and their refusals (pinned bytes), attribution by stamped scope,
//! the vault's credential and account at the provider, replay without a provider call,
//! `system_one` facts in `run-index.db` once per answered item, the busy gauge and the health
//! counters. The SIGKILL campaign is `tests/crash_classify.rs` (its own process: stopping the
//! in-process daemon signals the whole test binary).

use broca_mock::mock;
mod classify_rig;
mod pin;
mod support;

use std::time::{Duration, Instant};

use classify_rig::*;
use serde_json::json;

#[test]
fn classifier_routes_end_to_end() {
    let base = tempfile::Builder::new().prefix("bce").tempdir_in("/tmp").unwrap();
    let h = start(base.path(), false);
    let stand = Stand(&h);
    stand.post("auth", json!({"workers_ai": format!("Bearer {CF_SECRET}"), "account_id": ACCOUNT}));
    let run = ready(&h);

    // role.describe: the catalog's clef row, its egress host the effective base's.
    pin::assert_golden("classify.describe.json", &run.ok("role.describe", "{}"), None);

    // Answers with the provider's number text, the vault's token and account at the provider.
    let states: Vec<String> = (0..3).map(|i| h.unique(&format!("item-{i}"))).collect();
    for (i, s) in states.iter().enumerate() {
        stand.answer(s, &noul(["0.70", "3e-1", "1"][i]));
    }
    let body = batch("b-one", &states);
    let first = run.ok("classify.run", &body);
    assert!(first.contains(r#""noul":0.70"#) && first.contains(r#""noul":3e-1"#), "{first}");
    assert_eq!(run.ok("classify.run", &body), first, "a replay answers the same bytes");
    for s in &states {
        assert_eq!(stand.calls(s), 1, "asked once, replay served from system-one.db");
    }
    let log = stand.log();
    assert!(
        log.iter().all(|c| c["authorization"] == format!("Bearer {CF_SECRET}") && c["account_id"] == ACCOUNT),
        "{log:?}"
    );
    let published = facts(&h, "b-one");
    assert_eq!(published.len(), 3, "one fact per answered item: {published:?}");
    assert!(published.iter().all(|(_, run_id, flow)| run_id.as_deref() == Some("run-7") && flow.is_none()));

    // Refusals, each writing nothing and calling no provider.
    let unscoped = open(&h, None, &[("classifier", "v1")]).expect("an unscoped classifier route opens");
    pin::assert_golden("classify.scope_required.json", &unscoped.refused("classify.run", &body).to_string(), None);
    assert!(unscoped.request("role.describe", "{}").is_ok(), "describe needs no work scope");
    let flow = open(&h, Some("flow-scope"), &[("classifier", "v1")]).unwrap();
    pin::assert_golden("classify.batch_scope_mismatch.json", &flow.refused("classify.run", &body).to_string(), None);
    pin::assert_golden("classify.unknown_method.json", &run.refused("session.read", "{}").to_string(), None);
    let reuse = batch("b-one", &states[..2]);
    pin::assert_golden("classify.batch_id_reuse.json", &run.refused("classify.run", &reuse).to_string(), None);
    let chat = body.replace(CLEF, "anthropic/claude-sonnet-4-5");
    pin::assert_golden("classify.model_not_classifier.json", &run.refused("classify.run", &chat).to_string(), None);
    let both = open(&h, Some("run-scope"), &[("classifier", "v1"), ("llm-runner", "v1")]);
    let refused = match &both {
        Err(e) => e.route_open_refusal().cloned().unwrap_or_else(|| panic!("not a bind refusal: {e}")),
        Ok(_) => panic!("a bind declaring two roles opened"),
    };
    pin::assert_golden("classify.role_versions_unsupported.json", &serde_json::to_string(&refused).unwrap(), None);
    let runner = h.session("classify-e2e", "runner", None);
    let (code, _) = runner.refused("classify.run", serde_json::from_str(&body).unwrap());
    assert_eq!(code, "unknown_method", "an llm-runner route refuses classify.run");

    // A flow batch is attributed to the flow, never to an agent.
    let flow_state = h.unique("flow-item");
    stand.answer(&flow_state, &noul("0.5"));
    flow.ok("classify.run", &batch("b-flow", std::slice::from_ref(&flow_state)));
    let flow_facts = facts(&h, "b-flow");
    assert_eq!(flow_facts.len(), 1);
    assert_eq!((flow_facts[0].1.as_deref(), flow_facts[0].2.as_deref()), (Some(""), Some("flow-3")));

    // A call in flight: the busy gauge holds a drain open; a second call for its batch is
    // refused at once, and the provider was asked once.
    let probe = || {
        let health = h.block_on(h.client().consumer().supervisor_health_probe(support::MODULE_ID)).unwrap();
        health.metrics.expect("health metrics")
    };
    let held = h.unique("held");
    stand.answer(&held, &noul("0.9"));
    stand.post("hold", json!({"key": key(&held)}));
    let body = batch("b-held", std::slice::from_ref(&held));
    std::thread::scope(|scope| {
        let first = scope.spawn(|| run.ok("classify.run", &body));
        let until = Instant::now() + support::STEP;
        while !stand.held(&held) {
            assert!(Instant::now() < until, "the call never reached the provider");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(probe()["system_one_batches_in_flight"], 1);
        let second = run.refused("classify.run", &body);
        assert_eq!(second["detail"]["retry_after_ms"], 250, "the pin normalizes *_ms: {second}");
        pin::assert_golden("classify.batch_in_progress.json", &second.to_string(), None);
        stand.post("release", json!({"key": key(&held)}));
        first.join().unwrap();
    });
    assert_eq!(stand.calls(&held), 1);
    let metrics = probe();
    assert_eq!(metrics["system_one_batches_in_flight"], 0);
    let system_one = &metrics["system_one"];
    assert_eq!(
        system_one["items"]["answered"], 5,
        "three, the flow's and the held one; replays add nothing: {system_one}"
    );
    assert!(system_one["calls"]["refused"].as_u64().unwrap() >= 5, "{system_one}");
    assert_eq!(
        metrics["management_ops"]["classify.run"],
        system_one["calls"]["answered"].as_u64().unwrap() + system_one["calls"]["refused"].as_u64().unwrap(),
        "{metrics}"
    );

    // Workers AI's daily allocation on the first call refuses the call and records nothing.
    let walled = h.unique("walled");
    let errors_before = probe()["system_one"]["last_provider_error"].clone();
    assert_eq!(errors_before, json!({}), "no provider error yet");
    stand.status(&walled, 429, Some(3036));
    let body = batch("b-walled", std::slice::from_ref(&walled));
    pin::assert_golden("classify.account_limit_exhausted.json", &run.refused("classify.run", &body).to_string(), None);
    assert_eq!(
        probe()["system_one"]["last_provider_error"]["cloudflare-workers-ai"],
        json!({"code": "account_limit_exhausted", "status": 429})
    );
    stand.answer(&walled, &noul("0.25"));
    run.ok("classify.run", &body);

    h.stop();
}
