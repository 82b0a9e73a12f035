//! The late-results store over real files in a temp dir.

use super::*;
use serde_json::json;

const BROCA: &str = "reserved:broca";
const OTHER: &str = "reserved:other";

fn record(call_key: &str, custodian: &str) -> HeldRecord {
    HeldRecord {
        call_key: call_key.to_owned(),
        custodian: custodian.to_owned(),
        owner: custodian.to_owned(),
        scope_ref: "unscoped".to_owned(),
        scope_epoch: 0,
        session: "s1".to_owned(),
        tool: "ask".to_owned(),
        arguments: json!({"q": call_key}),
        reason: "consent".to_owned(),
        held_at_ms: 1,
        release_at_ms: None,
        from_dir: None,
    }
}

fn release(store: &LateStore, call_key: &str, body: Value) {
    let path = store.dir().join("release").join(format!("{}.json", stem(call_key)));
    fs::write(path, body.to_string()).unwrap();
}

fn read(store: &LateStore, custodian: &str, since: Option<Cursor>, limit: Option<u32>) -> LateResultsReply {
    let mut request = LateResultsRequest::new();
    request.since = since;
    request.limit = limit;
    store.read(custodian, &request).unwrap()
}

fn keys(reply: &LateResultsReply) -> Vec<&str> {
    reply.entries.iter().map(|e| e.call_key.as_str()).collect()
}

fn make_old(path: &Path) {
    let old = SystemTime::now() - BAD_FILE_GRACE - Duration::from_secs(1);
    File::options().write(true).open(path).unwrap().set_modified(old).unwrap();
}

#[test]
fn stems_are_hex_or_a_digest_for_long_keys() {
    assert_eq!(stem("k:1"), "6b3a31");
    let long = "k".repeat(200);
    assert!(stem(&long).starts_with("sha256-") && stem(&long).len() < 100);
    assert_eq!(principal_text(Some(&Principal::Reserved { module_id: "broca".into() })), BROCA);
    assert_eq!(principal_text(Some(&Principal::Direct)), "direct");
}

#[test]
fn a_held_call_is_recorded_and_a_release_file_settles_it_once_for_its_custodian_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = LateStore::open(dir.path(), "inc-1").unwrap();
    store.hold(record("k:1", BROCA)).unwrap();
    let held: Value = serde_json::from_slice(&fs::read(dir.path().join("held/6b3a31.json")).unwrap()).unwrap();
    assert_eq!((held["call_key"].as_str(), held["custodian"].as_str()), (Some("k:1"), Some(BROCA)));
    assert_eq!((held["tool"].as_str(), held["reason"].as_str()), (Some("ask"), Some("consent")));
    assert_eq!(read(&store, BROCA, None, None).entries.len(), 0, "held, not settled");

    release(&store, "k:1", json!({"kind": "result", "text": "approved"}));
    let reply = read(&store, BROCA, None, None);
    assert_eq!((keys(&reply), reply.cursor.seq, reply.more), (vec!["k:1"], 1, false));
    let e = &reply.entries[0];
    assert_eq!((e.kind.as_str(), e.custodian.as_str(), e.owner.as_str()), ("result", BROCA, BROCA));
    assert_eq!((e.scope_ref.as_str(), e.scope_epoch), ("unscoped", 0));
    assert_eq!(e.result, Some(json!({"content": [{"type": "text", "text": "approved"}]})));
    assert_eq!(e.event_id, sha256_hex(b"k:1\0result"));
    assert!(!dir.path().join("release/6b3a31.json").exists(), "deleted once durable");
    assert_eq!(read(&store, OTHER, None, None).entries.len(), 0, "another custodian sees nothing");

    // A second release for a settled key is deleted and ignored.
    release(&store, "k:1", json!({"kind": "expired"}));
    assert_eq!(read(&store, BROCA, None, None).entries.len(), 1);
    assert!(!dir.path().join("release/6b3a31.json").exists());
    assert_eq!(store.settle("k:1", Release::Expired).unwrap(), Settled::AlreadySettled);
    assert_eq!(store.settle("k:none", Release::Expired).unwrap(), Settled::NotHeld);
    let log = fs::read_to_string(dir.path().join("log.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 1);
}

#[test]
fn cursors_page_by_limit_and_acks_hide_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = LateStore::open(dir.path(), "inc-1").unwrap();
    for (key, custodian) in [("a", BROCA), ("b", OTHER), ("c", BROCA), ("d", BROCA)] {
        store.hold(record(key, custodian)).unwrap();
        store.settle(key, Release::NotStarted("restart_before_dispatch".into())).unwrap();
    }
    let first = read(&store, BROCA, None, Some(2));
    assert_eq!((keys(&first), first.cursor.seq, first.more), (vec!["a", "c"], 3, true));
    assert_eq!(first.entries[0].reason.as_deref(), Some("restart_before_dispatch"));
    let rest = read(&store, BROCA, Some(first.cursor.clone()), Some(2));
    assert_eq!((keys(&rest), rest.cursor.seq, rest.more), (vec!["d"], 4, false));
    let none = read(&store, BROCA, Some(rest.cursor.clone()), None);
    assert_eq!((none.entries.len(), none.cursor.seq, none.more), (0, 4, false));
    check_since("inc-1", store.head(), Some(&none.cursor)).unwrap();
    let future = Cursor { provider_incarnation: "inc-1".into(), seq: 9 };
    let refused = store.read(BROCA, &LateResultsRequest::new().with_since(future.clone())).unwrap_err();
    assert_eq!(refused.code, "cursor_incarnation_changed");
    assert_eq!(store.ack(BROCA, &AckRequest { through: future }).unwrap_err().code, "cursor_incarnation_changed");

    store.ack(BROCA, &AckRequest { through: first.cursor }).unwrap();
    let after = read(&store, BROCA, None, None);
    assert_eq!((keys(&after), after.cursor.seq), (vec!["d"], 4));
    assert_eq!(keys(&read(&store, OTHER, None, None)), ["b"], "acks are per custodian");
    // An ack never moves back; reading from null with nothing unacked answers the acked seq.
    store.ack(BROCA, &AckRequest { through: Cursor { provider_incarnation: "inc-1".into(), seq: 4 } }).unwrap();
    store.ack(BROCA, &AckRequest { through: Cursor { provider_incarnation: "inc-1".into(), seq: 1 } }).unwrap();
    let empty = read(&store, BROCA, None, None);
    assert_eq!((empty.entries.len(), empty.cursor.seq), (0, 4));
    let acked: Value = serde_json::from_slice(&fs::read(dir.path().join("acked.json")).unwrap()).unwrap();
    assert_eq!(acked, json!({BROCA: 4}));
}

#[test]
fn a_restart_re_serves_unacked_entries_with_the_same_ids_and_refuses_old_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let (old_cursor, old_ids) = {
        let store = LateStore::open(dir.path(), "inc-1").unwrap();
        for key in ["a", "b", "c"] {
            store.hold(record(key, BROCA)).unwrap();
        }
        store.hold(record("still-held", BROCA)).unwrap();
        store.settle("a", Release::Expired).unwrap();
        store.settle("b", Release::Result(json!({"content": [{"type": "text", "text": "b"}]}))).unwrap();
        store.settle("c", Release::Expired).unwrap();
        let all = read(&store, BROCA, None, None);
        store.ack(BROCA, &AckRequest { through: Cursor { provider_incarnation: "inc-1".into(), seq: 1 } }).unwrap();
        (all.cursor, all.entries.iter().skip(1).map(|e| e.event_id.clone()).collect::<Vec<_>>())
    };
    let store = LateStore::open(dir.path(), "inc-2").unwrap();
    let refused = store.read(BROCA, &LateResultsRequest::new().with_since(old_cursor)).unwrap_err();
    assert_eq!(refused.code, "cursor_incarnation_changed");
    let again = read(&store, BROCA, None, None);
    assert_eq!(keys(&again), ["b", "c"], "the acked entry stays hidden");
    assert_eq!(again.entries.iter().map(|e| e.event_id.clone()).collect::<Vec<_>>(), old_ids);
    assert_eq!(again.cursor, Cursor { provider_incarnation: "inc-2".into(), seq: 3 });
    // Held calls survive too, and seqs go on from the log.
    release(&store, "still-held", json!({"kind": "not_started"}));
    let next = read(&store, BROCA, Some(again.cursor), None);
    assert_eq!((keys(&next), next.cursor.seq), (vec!["still-held"], 4));
    assert_eq!(store.settle("a", Release::Expired).unwrap(), Settled::AlreadySettled, "settled before the restart");
}

#[test]
fn a_torn_last_log_line_is_cut_and_appends_go_on() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = LateStore::open(dir.path(), "inc-1").unwrap();
        store.hold(record("a", BROCA)).unwrap();
        store.hold(record("b", BROCA)).unwrap();
        store.settle("a", Release::Expired).unwrap();
    }
    let mut log = OpenOptions::new().append(true).open(dir.path().join("log.jsonl")).unwrap();
    log.write_all(br#"{"seq":2,"session":"s1","ent"#).unwrap();
    let store = LateStore::open(dir.path(), "inc-2").unwrap();
    assert_eq!(store.settle("b", Release::Expired).unwrap(), Settled::Appended(2));
    drop(store);
    let store = LateStore::open(dir.path(), "inc-3").unwrap();
    assert_eq!(keys(&read(&store, BROCA, None, None)), ["a", "b"]);
    // Any other bad line is refused: the store would lie.
    fs::write(dir.path().join("log.jsonl"), "not json\n").unwrap();
    assert!(LateStore::open(dir.path(), "inc-4").is_err());
}

#[test]
fn unusable_release_files_wait_out_their_grace_then_are_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let store = LateStore::open(dir.path(), "inc-1").unwrap();
    store.hold(record("k", BROCA)).unwrap();
    let path = dir.path().join("release").join(format!("{}.json", stem("k")));
    fs::write(&path, "{\"kind\": \"res").unwrap();
    store.scan();
    assert!(path.exists(), "maybe still being written");
    make_old(&path);
    store.scan();
    assert!(!path.exists() && path.with_file_name(format!("{}.json.bad", stem("k"))).exists());
    // No held call under a key; both result and text; an unknown kind.
    for (key, body) in [
        ("nobody", json!({"kind": "expired"})),
        ("k", json!({"kind": "result", "result": {}, "text": "x"})),
        ("k", json!({"kind": "maybe"})),
    ] {
        let path = dir.path().join("release").join(format!("{}.json", stem(key)));
        fs::write(&path, body.to_string()).unwrap();
        make_old(&path);
        store.scan();
        assert!(!path.exists(), "{body}");
    }
    assert_eq!(store.head(), 0, "nothing settled");
}

#[test]
fn retention_keeps_the_newest_unacked_results_per_custodian_and_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = LateStore::open_with_cap(dir.path(), "inc-1", 2).unwrap();
    for (key, session) in [("a", "s1"), ("b", "s1"), ("x", "s2"), ("c", "s1")] {
        store.hold(HeldRecord { session: session.into(), ..record(key, BROCA) }).unwrap();
        store.settle(key, Release::Expired).unwrap();
    }
    assert_eq!(keys(&read(&store, BROCA, None, None)), ["b", "x", "c"]);
    drop(store);
    let store = LateStore::open_with_cap(dir.path(), "inc-2", 2).unwrap();
    assert_eq!(keys(&read(&store, BROCA, None, None)), ["b", "x", "c"], "the replay drops the same");
}

#[test]
fn from_dir_late_files_and_timed_releases_settle_held_calls() {
    let dir = tempfile::tempdir().unwrap();
    let results = tempfile::tempdir().unwrap();
    let store = LateStore::open(dir.path(), "inc-1").unwrap();
    let from_dir = |key: &str| Some(FromDirHold { dir: results.path().to_owned(), key: key.to_owned() });
    for key in ["k1", "k2", "k3"] {
        store.hold(HeldRecord { from_dir: from_dir(key), ..record(key, BROCA) }).unwrap();
    }
    store.hold(HeldRecord { release_at_ms: Some(now_ms() + 60_000), ..record("later", BROCA) }).unwrap();
    store.hold(HeldRecord { release_at_ms: Some(now_ms()), ..record("now", BROCA) }).unwrap();
    fs::write(results.path().join("k1.json"), json!({"answer": 42}).to_string()).unwrap();
    fs::write(results.path().join("k1.late"), json!({"kind": "result"}).to_string()).unwrap();
    fs::write(results.path().join("k2.late"), json!({"kind": "result", "result": "plain"}).to_string()).unwrap();
    let body = json!({"content": [{"type": "text", "text": "as is"}], "structuredContent": {"a": 1}});
    fs::write(results.path().join("k3.late"), json!({"kind": "result", "result": body}).to_string()).unwrap();
    store.scan();
    let reply = read(&store, BROCA, None, None);
    let text = |v: &str| json!({"content": [{"type": "text", "text": v}]});
    let results_by_key: Vec<(&str, Option<Value>)> =
        reply.entries.iter().map(|e| (e.call_key.as_str(), e.result.clone())).collect();
    assert_eq!(
        results_by_key,
        [
            ("k1", Some(text(r#"{"answer":42}"#))),
            ("k2", Some(text("plain"))),
            ("k3", Some(body)),
            (
                "now",
                Some(
                    json!({"content": [{"type": "text", "text": r#"{"q":"now"}"#}], "structuredContent": {"q": "now"}})
                )
            ),
        ]
    );
    assert!(!results.path().join("k1.late").exists(), "deleted once durable");
}
