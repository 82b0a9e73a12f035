//! The output-reference cache (`broca::refs::cache`, #50): a set answered from the cache is the
//! set a cold read derives, whether the read hits or misses, after the session grew, in a fresh
//! process's cache and under a budget that evicts everything. The sessions are written through
//! the lineage API with testkit records, on a state root the in-process ops serve.

mod inproc;
use broca_mock::mock;

use std::sync::Arc;
use std::time::Duration;

use broca::frozen::{PlanManifest, ToolSpec};
use broca::lineage::reader::Reader;
use broca::lineage::Lineage;
use broca::message::{Message, Part, Role};
use broca::record::{FinishReason, Frozen, Record};
use broca::refs::cache::{Lookup, RefCache};
use broca::refs::ids::SetId;
use broca::refs::sets::Set;
use broca::session_key::SessionKey;
use broca_testkit::{intent, model_step, run_started, step_started, tool_result};
use inproc::{rig, Rig};
use serde_json::json;

fn logs_tool() -> ToolSpec {
    ToolSpec {
        name: "logs".into(),
        description: "The service's log.".into(),
        input_schema: json!({"type": "object"}),
        reply: None,
        module: Some("mock-tools".into()),
        preset: None,
        pin: None,
        result_format: None,
        output_refs: true,
        reference_slots: vec![cortexkit_role_llm_runner::output_refs::ReferenceSlot::new("data", "token")],
    }
}

/// A config whose requests render part numbers (a plan opted into output references).
fn config(rig: &Rig) -> Frozen {
    let mut config = rig
        .ops
        .admission
        .resolve(
            &broca::wire::send::parse(
                &json!({"prompt": "x", "model": {"provider": "mock", "model": "echo-chat"}}),
                &inproc::key(),
            )
            .unwrap(),
            None,
        )
        .unwrap();
    config.plan = Some(PlanManifest {
        identity: "refs-cache".into(),
        items: Vec::new(),
        absent: Vec::new(),
        composition_digest: None,
        texts: Vec::new(),
        system_text: None,
        output_refs: true,
        senders: Vec::new(),
    });
    config.tools = vec![logs_tool()];
    Frozen::new(config)
}

fn transcript(lineage: &Lineage) -> Vec<Message> {
    lineage.transcript(0, u64::MAX).expect("transcript").messages.into_iter().map(|(_, m)| m).collect()
}

/// One run: a call to `logs` answered with `log`, then a reply naming the result's number.
/// Returns the ordinal of the reply.
fn logs_run(lineage: &mut Lineage, config: &Frozen, run: &str, log: &str) -> u64 {
    let id = format!("{run}-c1");
    let mut started = run_started(run, None, "read the log");
    if let Record::RunStarted(r) = &mut started {
        r.config = config.clone();
    }
    for rec in [
        started,
        step_started(run, 1),
        model_step(run, 1, "Reading the log.", &[(&id, "logs")]),
        intent(run, 1, &id, "logs"),
        tool_result(run, 1, &id, log),
        step_started(run, 2),
    ] {
        lineage.append(&rec).unwrap();
    }
    lineage.commit().unwrap();
    let history = transcript(lineage);
    let asked = history.len() - 2;
    assert!(matches!(history[asked].content[1], Part::ToolCall { .. }) && history[asked].role == Role::Assistant);
    let tag = broca::refs::tags::numbers(&history)[asked][1].expect("the answered call is numbered");
    lineage.append(&model_step(run, 2, &format!("The log is clean: see $$tc({tag})."), &[])).unwrap();
    let finished = Record::RunFinished {
        run_id: run.into(),
        reason: FinishReason::Completed,
        error: None,
        usage: Default::default(),
        retries_used: 0,
        final_step_finish_reason: Some("stop".into()),
        indeterminate_tool_calls: vec![],
        at_ms: 1,
        detail: None,
        undelivered_steers: vec![],
    };
    lineage.append(&finished).unwrap();
    lineage.commit().unwrap();
    transcript(lineage).len() as u64 - 1
}

/// The reply set at `ordinal`, as `cache` answers it.
fn reply_set(cache: &RefCache, rig: &Rig, key: &SessionKey, ordinal: u64) -> Arc<Set> {
    let reader = Reader::open(rig.ops.registry.shared(), key).expect("the session's WAL");
    match cache.set(&reader, |salt| Some(SetId::reply(salt, ordinal))).unwrap() {
        Lookup::Set(set) => set,
        other => panic!("the reply at {ordinal} has no set: {other:?}"),
    }
}

fn same(a: &Set, b: &Set) -> bool {
    serde_json::to_value(&a.records).unwrap() == serde_json::to_value(&b.records).unwrap() && a.snapshots == b.snapshots
}

#[test]
fn a_cached_set_is_the_set_a_cold_read_derives() {
    let rig = rig(Duration::from_secs(60));
    let key = inproc::key();
    let config = config(&rig);
    let mut lineage = rig.ops.registry.shared().open_lineage(&key).unwrap();
    let first = logs_run(&mut lineage, &config, "run-a", &"GET /health 200\n".repeat(200));

    let cache = RefCache::default();
    let miss = reply_set(&cache, &rig, &key, first);
    assert!(!miss.records.is_empty(), "the reply names the call's result");
    assert_eq!(cache.sessions(), 1);
    let hit = reply_set(&cache, &rig, &key, first);
    assert!(Arc::ptr_eq(&miss, &hit), "the second read is the kept set");

    // The session grows: the old set reads the same, the new one is the new reply's.
    let second = logs_run(&mut lineage, &config, "run-b", &"POST /items 201\n".repeat(300));
    let old = reply_set(&cache, &rig, &key, first);
    assert!(same(&old, &miss), "a set never changes as its session grows");
    let grown = reply_set(&cache, &rig, &key, second);

    // A fresh process's cache (a restart) and a cache that keeps nothing answer the same.
    let fresh = RefCache::default();
    assert!(same(&reply_set(&fresh, &rig, &key, first), &old));
    assert!(same(&reply_set(&fresh, &rig, &key, second), &grown));
    let tiny = RefCache::new(1);
    assert!(same(&reply_set(&tiny, &rig, &key, second), &grown));
    assert_eq!((tiny.sessions(), tiny.bytes()), (0, 0), "an entry over the budget is not kept");

    // Two sessions under a budget for one: the least recently read is evicted, and reads of
    // either still answer their own sets.
    let other = SessionKey::new(&key.project_root, &key.harness, "other");
    let mut other_lineage = rig.ops.registry.shared().open_lineage(&other).unwrap();
    let theirs = logs_run(&mut other_lineage, &config, "run-c", &"DELETE /x 204\n".repeat(100));
    let one = RefCache::default();
    reply_set(&one, &rig, &key, second);
    let budget = one.bytes() + one.bytes() / 2;
    let small = RefCache::new(budget);
    assert!(same(&reply_set(&small, &rig, &key, second), &grown));
    let other_set = reply_set(&small, &rig, &other, theirs);
    assert!(small.bytes() <= budget && small.sessions() == 1, "the budget holds: {} bytes", small.bytes());
    assert!(same(&reply_set(&small, &rig, &key, second), &grown), "an evicted session reads the same again");
    assert!(same(&reply_set(&small, &rig, &other, theirs), &other_set));
}
