//! The classifier stand-in over real sockets: exact bytes, statuses, counting by JCS key,
//! credentials, holds, the delay, the file log and the control routes' refusals.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::{MockOptions, MockServer};
use super::*;

const TS: &str = "/v1/systemone";
const CF: &str = "/client/v4/accounts/acct-1/ai/run/@cf/cloudflare/clef";

struct Got {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One request on its own connection (`Connection: close`), the reply read whole.
fn send(server: &MockServer, method: &str, target: &str, auth: Option<&str>, body: &str) -> Got {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines.map(|l| l.split_once(": ").unwrap()).map(|(k, v)| (k.into(), v.into())).collect();
    Got { status, headers, body: body.into() }
}

fn control(server: &MockServer, method: &str, path: &str, body: Value) -> Got {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    send(server, method, &format!("/_mock/classify{path}"), None, &body)
}

fn request(model: &str, state: Value) -> String {
    json!({"model": model, "state": state, "questions": {"q": {"type": "noul", "instructions": "Flagged?"}}})
        .to_string()
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn calls(server: &MockServer, key: &str) -> u64 {
    control(server, "GET", &format!("/calls?key={}", pct(key)), Value::Null).json()["calls"].as_u64().unwrap()
}

const ANSWER: &str = r#"{"model":"clef","answers":{"q":{"type":"noul","noul":0.70},"r":{"type":"noul","noul":3e-1}},"usage":{"input_tokens":12,"output_tokens":1}}"#;

#[test]
fn answers_are_the_scripted_bytes_on_both_providers() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let key = state_key(&json!("item-a"));
    assert_eq!(key, r#""item-a""#);
    assert_eq!(control(&server, "POST", "/script", json!({"key": key, "answer": ANSWER})).status, 204);

    let ts = send(&server, "POST", TS, Some("Bearer t"), &request("jev-1.13.0", json!("item-a")));
    assert_eq!((ts.status, ts.body.as_str()), (200, ANSWER));
    assert_eq!(ts.header("content-type"), Some("application/json"));
    let cf = send(&server, "POST", CF, Some("Bearer c"), &request("clef", json!("item-a")));
    assert_eq!(cf.status, 200);
    assert_eq!(cf.body, format!(r#"{{"result":{ANSWER},"success":true,"errors":[],"messages":[]}}"#));
    // `@` percent-encoded reaches the same route.
    let encoded = CF.replace('@', "%40");
    assert_eq!(send(&server, "POST", &encoded, None, &request("clef", json!("item-a"))).status, 200);

    assert_eq!(calls(&server, &key), 3);
    let log = control(&server, "GET", "/log", Value::Null);
    assert_eq!(log.header("x-mock-dropped-calls"), Some("0"));
    let log = log.json();
    assert_eq!(log[0]["provider"], "typesafe");
    assert_eq!((&log[0]["model"], &log[0]["account_id"]), (&json!("jev-1.13.0"), &Value::Null));
    assert_eq!(log[1]["provider"], "workers-ai");
    assert_eq!((&log[1]["model"], &log[1]["account_id"]), (&json!("clef"), &json!("acct-1")));
    assert_eq!((&log[0]["authorization"], &log[1]["authorization"]), (&json!("Bearer t"), &json!("Bearer c")));
    assert_eq!(log[2]["authorization"], Value::Null);
    let ns: Vec<u64> = log.as_array().unwrap().iter().map(|c| c["n"].as_u64().unwrap()).collect();
    assert!(ns.windows(2).all(|w| w[1] == w[0] + 1), "{ns:?}");
    assert!(log.as_array().unwrap().iter().all(|c| c["key"] == key && c["status"] == 200 && c["at_ms"].is_u64()));
}

#[test]
fn statuses_envelopes_and_retry_after() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let stand = server.classify();
    let (a, b) = (state_key(&json!("a")), state_key(&json!("b")));
    stand
        .script(&a, Scripted::Status { status: 429, retry_after_ms: Some(1500), workers_ai_code: Some(3036) })
        .unwrap();
    stand.script(&b, Scripted::Status { status: 529, retry_after_ms: None, workers_ai_code: None }).unwrap();

    let ts = send(&server, "POST", TS, None, &request("jev-1.13.0", json!("a")));
    assert_eq!((ts.status, ts.body.as_str(), ts.header("retry-after")), (429, "", Some("2")));
    assert_eq!(ts.header("content-length"), Some("0"));
    let cf = send(&server, "POST", CF, None, &request("clef", json!("a")));
    assert_eq!((cf.status, cf.header("retry-after")), (429, Some("2")));
    let envelope = cf.json();
    assert_eq!((&envelope["result"], &envelope["success"]), (&Value::Null, &json!(false)));
    assert_eq!(envelope["errors"][0]["code"], 3036);
    assert!(envelope["errors"][0]["message"].is_string() && envelope["messages"] == json!([]));

    let cf = send(&server, "POST", CF, None, &request("clef", json!("b")));
    assert_eq!((cf.status, cf.header("retry-after")), (529, None));
    assert_eq!(cf.body, r#"{"result":null,"success":false,"errors":[],"messages":[]}"#);

    // Unscripted: 500, tagged.
    let ts = send(&server, "POST", TS, None, &request("jev-1.13.0", json!("nobody")));
    assert_eq!((ts.status, ts.body.as_str(), ts.header("x-broca-mock")), (500, "", Some("unscripted")));
    let cf = send(&server, "POST", CF, None, &request("clef", json!("nobody")));
    assert_eq!((cf.status, cf.json()["errors"].clone()), (500, json!([])));
    // Scripting replaces what the key answers from now on.
    stand.script(&b, Scripted::Answer("{}".into())).unwrap();
    assert_eq!(send(&server, "POST", TS, None, &request("m", json!("b"))).body, "{}");
    // Retry-After rounds up to whole seconds.
    stand.script(&b, Scripted::Status { status: 503, retry_after_ms: Some(1), workers_ai_code: None }).unwrap();
    assert_eq!(send(&server, "POST", TS, None, &request("m", json!("b"))).header("retry-after"), Some("1"));
    let log = stand.log().0;
    assert_eq!(log.iter().map(|c| c.status.unwrap()).collect::<Vec<_>>(), [429, 429, 529, 500, 500, 200, 503]);
}

#[test]
fn calls_count_by_the_canonical_state() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let one = r#"{"model":"m","state":{"b":1,"a":[1,2.50,"x y+z"]},"questions":{}}"#;
    let other = r#"{"state":{"a":[1,2.5,"x y+z"],"b":1.0},"model":"m","questions":{}}"#;
    let key = state_key(&serde_json::from_str::<Value>(one).unwrap()["state"]);
    assert_eq!(key, r#"{"a":[1,2.5,"x y+z"],"b":1}"#);
    control(&server, "POST", "/script", json!({"key": key, "answer": "{\"n\": 3e-1}"}));
    assert_eq!(send(&server, "POST", TS, None, one).body, "{\"n\": 3e-1}");
    assert_eq!(
        send(&server, "POST", CF, None, other).body,
        r#"{"result":{"n": 3e-1},"success":true,"errors":[],"messages":[]}"#
    );
    assert_eq!(calls(&server, &key), 2);
    // A form-encoded query (`+` for a space) names the same key.
    let form = pct(&key).replace("%20", "+");
    let counted = control(&server, "GET", &format!("/calls?key={form}"), Value::Null).json();
    assert_eq!(counted, json!({"calls": 2}));
    assert_eq!(calls(&server, "\"never\""), 0);
    send(&server, "POST", TS, None, &request("m", json!(null)));
    let totals = control(&server, "GET", "/calls", Value::Null).json();
    assert_eq!(totals, json!({"total": 3, "by_key": {"null": 1, key.clone(): 2}}));
    // A reset forgets counts and scripts; call numbers keep rising.
    assert_eq!(control(&server, "DELETE", "", Value::Null).status, 204);
    assert_eq!(calls(&server, &key), 0);
    assert_eq!(send(&server, "POST", TS, None, one).status, 500);
    assert_eq!(server.classify().log().0[0].n, 4);
}

#[test]
fn malformed_calls_are_refused_uncounted() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let ts = send(&server, "POST", TS, None, "not json");
    assert_eq!((ts.status, ts.json()["error"].as_str().is_some()), (400, true));
    let cf = send(&server, "POST", CF, None, r#"{"model":"clef","questions":{}}"#);
    assert_eq!((cf.status, &cf.json()["errors"][0]["code"]), (400, &json!(5004)));
    assert_eq!(send(&server, "GET", TS, None, "").status, 405);
    assert_eq!(send(&server, "POST", "/client/v4/accounts//ai/run/@cf/cloudflare/clef", None, "{}").status, 404);
    assert_eq!(send(&server, "POST", "/client/v4/accounts/a/ai/run/@cf/cloudflare/", None, "{}").status, 404);
    assert_eq!(server.classify().totals().0, 0);
    assert!(server.classify().log().0.is_empty());
}

#[test]
fn expected_credentials_are_checked() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let key = state_key(&json!("s"));
    server.classify().script(&key, Scripted::Answer(ANSWER.into())).unwrap();
    let auth = json!({"typesafe": "Bearer ts-1", "workers_ai": "Bearer cf-1", "account_id": "acct-1"});
    assert_eq!(control(&server, "POST", "/auth", auth).status, 204);
    let body = request("clef", json!("s"));

    let ts = send(&server, "POST", TS, Some("Bearer cf-1"), &body);
    assert_eq!((ts.status, ts.body.as_str()), (401, ""));
    assert_eq!(send(&server, "POST", TS, None, &body).status, 401);
    assert_eq!(send(&server, "POST", TS, Some("Bearer ts-1"), &body).status, 200);
    let cf = send(&server, "POST", CF, Some("Bearer ts-1"), &body);
    assert_eq!((cf.status, &cf.json()["errors"][0]["code"]), (401, &json!(10000)));
    let other = CF.replace("acct-1", "acct-2");
    let cf = send(&server, "POST", &other, Some("Bearer cf-1"), &body);
    assert_eq!(
        (cf.status, &cf.json()["errors"][0]["code"], &cf.json()["errors"][1]["code"]),
        (404, &json!(7003), &json!(7000))
    );
    assert_eq!(send(&server, "POST", CF, Some("Bearer cf-1"), &body).status, 200);
    // Refused calls were made to the provider: they count.
    assert_eq!(calls(&server, &key), 6);
    // A later expectation replaces the earlier: absent members are not checked.
    control(&server, "POST", "/auth", json!({"typesafe": "Bearer ts-2"}));
    assert_eq!(send(&server, "POST", &other, None, &body).status, 200);
    assert_eq!(send(&server, "POST", TS, Some("Bearer ts-1"), &body).status, 401);
}

#[test]
fn a_held_call_waits_until_released() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let key = state_key(&json!({"item": 1}));
    let hold = json!({"key": key});
    control(&server, "POST", "/script", json!({"key": key, "answer": ANSWER}));
    let held = |server: &MockServer| {
        control(server, "GET", &format!("/held?key={}", pct(&key)), Value::Null).json()["held"].as_bool().unwrap()
    };
    assert_eq!(control(&server, "POST", "/hold", hold.clone()).status, 204);
    assert!(!held(&server), "a pending hold is not a held call");
    let got = thread::scope(|s| {
        let call = s.spawn(|| send(&server, "POST", CF, None, &request("clef", json!({"item": 1}))));
        let until = Instant::now() + Duration::from_secs(10);
        while !held(&server) {
            assert!(Instant::now() < until, "the call never became held");
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(calls(&server, &key), 1, "a held call is counted on arrival");
        assert_eq!(server.classify().log().0[0].status, None);
        thread::sleep(Duration::from_millis(50));
        assert!(!call.is_finished());
        assert_eq!(control(&server, "POST", "/release", hold.clone()).status, 204);
        call.join().unwrap()
    });
    assert_eq!(got.status, 200);
    assert!(!held(&server));
    assert_eq!(server.classify().log().0[0].status, Some(200));
    // Later calls answer at once; a release with nothing waiting cancels a pending hold.
    assert_eq!(send(&server, "POST", TS, None, &request("m", json!({"item": 1}))).status, 200);
    control(&server, "POST", "/hold", hold.clone());
    control(&server, "POST", "/release", hold.clone());
    assert_eq!(send(&server, "POST", TS, None, &request("m", json!({"item": 1}))).status, 200);
    // A call never released gives up with 500.
    server.classify().set_hold_timeout(Duration::from_millis(100));
    control(&server, "POST", "/hold", hold);
    let got = send(&server, "POST", TS, None, &request("m", json!({"item": 1})));
    assert_eq!((got.status, got.header("x-broca-mock")), (500, Some("hold-timeout")));
    assert_eq!(control(&server, "GET", "/held", Value::Null).status, 400);
}

#[test]
fn the_delay_applies_to_every_call() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    assert_eq!(control(&server, "POST", "/delay", json!({"delay_ms": 120})).status, 204);
    let started = Instant::now();
    assert_eq!(send(&server, "POST", TS, None, &request("m", json!("d"))).status, 500);
    assert!(started.elapsed() >= Duration::from_millis(120));
    assert_eq!(control(&server, "POST", "/delay", json!({"delay_ms": MAX_DELAY_MS + 1})).status, 400);
    control(&server, "DELETE", "", Value::Null);
    assert_eq!(server.classify().delay_ms(), 0);
}

#[test]
fn the_file_log_has_a_line_per_answered_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("classify.jsonl");
    std::fs::write(&path, "{\"n\":0}\n").unwrap();
    let options = MockOptions { classify_log: Some(path.clone()), ..Default::default() };
    let server = MockServer::start_with("127.0.0.1:0", options).unwrap();
    server.classify().script(r#""f""#, Scripted::Answer("{}".into())).unwrap();
    send(&server, "POST", TS, None, &request("m", json!("f")));
    send(&server, "POST", CF, None, &request("clef", json!("g")));
    send(&server, "POST", TS, None, "{}");
    let lines: Vec<Value> =
        std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "appended after what was there: {lines:?}");
    let strip = |v: &Value| {
        assert!(v["at_ms"].as_u64().unwrap() > 1_600_000_000_000);
        json!({"n": v["n"], "provider": v["provider"], "key": v["key"], "status": v["status"]})
    };
    assert_eq!(strip(&lines[1]), json!({"n": 1, "provider": "typesafe", "key": "\"f\"", "status": 200}));
    assert_eq!(strip(&lines[2]), json!({"n": 2, "provider": "workers-ai", "key": "\"g\"", "status": 500}));
}

#[test]
fn control_refusals() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let bad = [
        json!({"key": "k"}),
        json!({"key": "k", "answer": "{}", "status": 429}),
        json!({"key": "k", "answer": "{}", "workers_ai_code": 3036}),
        json!({"key": "k", "status": 200}),
        json!({"key": "k", "status": 429, "extra": 1}),
        json!({"answer": "{}"}),
    ];
    for body in bad {
        assert_eq!(control(&server, "POST", "/script", body.clone()).status, 400, "{body}");
    }
    let nulls = json!({"key": "k", "status": 429, "retry_after_ms": null, "workers_ai_code": null});
    assert_eq!(control(&server, "POST", "/script", nulls).status, 204);
    assert_eq!(control(&server, "POST", "/auth", json!({"typo": "x"})).status, 400);
    assert_eq!(control(&server, "POST", "/hold", json!({})).status, 400);
    assert_eq!(control(&server, "GET", "/calls?key=%zz", Value::Null).status, 400);
    assert_eq!(control(&server, "GET", "/script", Value::Null).status, 405);
    assert_eq!(control(&server, "GET", "", Value::Null).status, 405);
    assert_eq!(control(&server, "GET", "/nothing", Value::Null).status, 404);
}

#[test]
fn bounds_refuse_clearly() {
    let stand = Stand::default();
    for i in 0..MAX_SCRIPTED_KEYS {
        stand.script(&i.to_string(), Scripted::Answer(String::new())).unwrap();
    }
    assert!(stand.script("one more", Scripted::Answer(String::new())).unwrap_err().0.contains("100000"));
    stand.script("0", Scripted::Answer("again".into())).unwrap();
    for i in 0..MAX_PENDING_HOLDS {
        stand.hold(&i.to_string()).unwrap();
    }
    assert!(stand.hold("one more").is_err());
    stand.hold("0").unwrap();
    for i in 0..MAX_COUNTED_KEYS {
        stand.arrive(Provider::TypeSafe, None, None, None, i.to_string()).unwrap();
    }
    assert!(stand.arrive(Provider::TypeSafe, None, None, None, "one more".into()).is_err());
    let (n, at_ms) = stand.arrive(Provider::WorkersAi, None, None, None, "7".into()).unwrap();
    stand.finish(n, Provider::WorkersAi, "7", at_ms, 200);
    let (log, dropped) = stand.log();
    assert_eq!((log.len(), dropped), (MAX_LOGGED_CALLS, 1));
    assert_eq!((log.last().unwrap().n, log.last().unwrap().status), (n, Some(200)));
    assert_eq!((stand.calls("7"), stand.totals().0), (2, MAX_COUNTED_KEYS as u64 + 1));
}
