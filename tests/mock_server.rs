//! broca-mock over real loopback TCP, driven by a plain `std::net::TcpStream` HTTP client.

use broca_mock::mock;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use broca::provider::event::{Family, StreamEvent};
use broca::provider::sse::{SseEvent, SseFramer};
use mock::{HttpReply, MockServer, RecordedRequest, Script, ScriptedResponse, Step, StreamReply, WriteMode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Reads that returned bytes (a lower bound on the server's writes).
    reads: usize,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn events(&self) -> Vec<SseEvent> {
        let mut framer = SseFramer::new();
        let mut events = framer.push(&self.body).unwrap().events;
        events.extend(framer.finish().unwrap().events);
        events
    }
}

/// Sends one request and reads the response to EOF.
fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // `Connection: close`: the response is read to EOF (a kept-alive one would be chunked).
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    read_response(&mut stream)
}

fn read_response(stream: &mut TcpStream) -> Response {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let mut reads = 0;
    loop {
        let n = stream.read(&mut buf).expect("read until EOF");
        if n == 0 {
            break;
        }
        reads += 1;
        all.extend_from_slice(&buf[..n]);
    }
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8(all[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers =
        lines.map(|l| l.split_once(':').unwrap()).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    Response { status, headers, body: all[end + 4..].to_vec(), reads }
}

/// POSTs `body`; to a model path, with the members the family's provider requires filled in
/// where `body` lacks them, so the request keeps broca-mock's provider rules (strict mode).
fn post(port: u16, path: &str, body: &Value) -> Response {
    let mut body = body.clone();
    if let (Some(required), Value::Object(members)) = (required_members(path), &mut body) {
        for (key, value) in required {
            members.entry(key).or_insert(value);
        }
    }
    request(port, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

/// A minimal valid request of the family a model path names.
fn required_members(path: &str) -> Option<serde_json::Map<String, Value>> {
    let path = path.split('?').next().unwrap_or_default();
    let body = if path.ends_with("/messages") {
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    } else if path.ends_with("/chat/completions") {
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    } else if path.ends_with("/responses") {
        json!({"model": "m", "input": "hi"})
    } else {
        return None;
    };
    body.as_object().cloned()
}

fn stream(events: Vec<Step>) -> ScriptedResponse {
    ScriptedResponse::Stream(StreamReply::new(events))
}

/// The assistant text of a stream, whatever its family.
fn text(events: &[SseEvent]) -> String {
    let mut out = String::new();
    for e in events {
        let Ok(d) = serde_json::from_str::<Value>(&e.data) else { continue };
        if d["type"] == "content_block_delta" && d["delta"]["type"] == "text_delta" {
            out.push_str(d["delta"]["text"].as_str().unwrap());
        } else if d["type"] == "response.output_text.delta" {
            out.push_str(d["delta"].as_str().unwrap());
        } else if let Some(t) = d["choices"][0]["delta"]["content"].as_str() {
            out.push_str(t);
        }
    }
    out
}

fn names(events: &[SseEvent]) -> Vec<String> {
    events.iter().map(|e| e.event.clone().unwrap_or_else(|| e.data.clone())).collect()
}

#[test]
fn records_request_bytes_and_hash_before_answering() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let body = br#"{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"h\u00e9llo \u2603"}]}"#;
    let headers = [("Content-Type", "application/json"), ("Authorization", "Bearer sk-mock")];
    let r = request(server.port(), "POST", "/v1/chat/completions?x=1", &headers, body);
    assert_eq!(r.status, 200);
    let recorded = server.requests("default");
    assert_eq!(recorded.len(), 1);
    let got = &recorded[0];
    assert_eq!((got.method.as_str(), got.path.as_str()), ("POST", "/v1/chat/completions?x=1"));
    assert_eq!(got.family, Some(Family::OpenaiChat));
    assert_eq!(got.header("authorization"), Some("Bearer sk-mock"));
    assert_eq!(got.body, body);
    let expected: String = Sha256::digest(body).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got.body_sha256, expected);
    assert_eq!(got.body_json().unwrap()["model"], "gpt-4.1");
    // The model is echoed on every chunk.
    let events = r.events();
    assert!(events.iter().filter(|e| e.data != "[DONE]").all(|e| e.data.contains("\"model\":\"gpt-4.1\"")));
}

#[test]
fn default_reply_in_every_family() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    for (path, terminal) in
        [("/v1/messages", "message_stop"), ("/v1/chat/completions", "[DONE]"), ("/v1/responses", "response.completed")]
    {
        let r = post(server.port(), path, &json!({"model": "m", "stream": true}));
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
        let events = r.events();
        assert_eq!(text(&events), "Hello from broca-mock.", "{path}");
        assert_eq!(names(&events).last().map(String::as_str), Some(terminal), "{path}");
    }
    assert_eq!(server.requests("default").len(), 3);
}

#[test]
fn lanes_are_isolated() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    server.install("a", Script::one(stream(vec![Step::Text("from a".into())])));
    server.install("b", Script::one(stream(vec![Step::Text("from b".into())])));
    let port = server.port();
    let b = post(port, "/lane/b/v1/messages", &json!({"lane": "b"}));
    let dflt = post(port, "/v1/messages", &json!({"lane": "default"}));
    let a = post(port, "/lane/a/v1/responses", &json!({"lane": "a"}));
    assert_eq!(text(&b.events()), "from b");
    assert_eq!(text(&dflt.events()), "Hello from broca-mock.");
    assert_eq!(text(&a.events()), "from a");
    for lane in ["a", "b", "default"] {
        let recorded = server.requests(lane);
        assert_eq!(recorded.len(), 1, "{lane}");
        assert_eq!(recorded[0].body_json().unwrap()["lane"], lane);
    }
    assert_eq!(server.requests("a")[0].family, Some(Family::OpenaiResponses));
    // a's FIFO is now empty: the default reply again.
    assert_eq!(text(&post(port, "/lane/a/v1/messages", &json!({})).events()), "Hello from broca-mock.");
    assert!(server.base_url(Some("a")).ends_with(&format!(":{port}/lane/a/v1")));
}

#[test]
fn http_429_with_retry_after_in_family_shape() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let mut reply = HttpReply { status: 429, body: None, headers: Default::default(), delay_ms: 0 };
    reply.headers.insert("retry-after".into(), "1".into());
    let script = Script {
        responses: vec![ScriptedResponse::Http(reply.clone()), ScriptedResponse::Http(reply)],
        ..Script::default()
    };
    server.install("default", script);
    let r = post(server.port(), "/v1/messages", &json!({}));
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.header("request-id").is_some());
    let body = r.json();
    assert_eq!((body["type"].as_str(), body["error"]["type"].as_str()), (Some("error"), Some("rate_limit_error")));
    let r = post(server.port(), "/v1/chat/completions", &json!({}));
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (429, Some("rate_limit_exceeded")));
    // A scripted body is sent as is.
    let script = r#"{"responses":[{"status":401,"body":{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}}]}"#;
    server.install("default", Script::from_json(script).unwrap());
    let r = post(server.port(), "/v1/responses", &json!({}));
    assert_eq!((r.status, r.json()["error"]["message"].as_str()), (401, Some("bad key")));
}

#[test]
fn split_writes_cut_events_and_characters() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let mut reply = StreamReply::new(vec![Step::Text("héllo ".into()), Step::Text("wörld ☃🎉".into())]);
    reply.write = WriteMode::Split { every: 5, pause_ms: 2 };
    server.install("default", Script::one(ScriptedResponse::Stream(reply)));
    let r = post(server.port(), "/v1/messages", &json!({}));
    assert!(r.reads >= 2, "expected the stream in several reads, got {}", r.reads);
    let events = r.events();
    assert_eq!(text(&events), "héllo wörld ☃🎉");
    assert_eq!(names(&events).last().map(String::as_str), Some("message_stop"));

    let mut reply = StreamReply::new(vec![Step::Text("a".into()), Step::Text("b".into())]);
    reply.write = WriteMode::Coalesce;
    server.install("default", Script::one(ScriptedResponse::Stream(reply)));
    let r = post(server.port(), "/v1/chat/completions", &json!({}));
    assert_eq!((text(&r.events()), names(&r.events()).last().cloned()), ("ab".into(), Some("[DONE]".into())));
}

#[test]
fn disconnect_mid_stream_is_eof_without_terminal() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    for path in ["/v1/messages", "/v1/chat/completions", "/v1/responses"] {
        server.install("default", Script::one(stream(vec![Step::Text("partial".into()), Step::Disconnect])));
        let r = post(server.port(), path, &json!({}));
        assert_eq!(r.status, 200);
        let events = r.events();
        assert_eq!(text(&events), "partial", "{path}");
        let names = names(&events);
        for terminal in ["message_stop", "message_delta", "[DONE]", "response.completed"] {
            assert!(!names.iter().any(|n| n == terminal), "{path}: {names:?}");
        }
    }
}

#[test]
fn delays_are_honoured() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let steps = vec![Step::Text("a".into()), Step::DelayMs(300), Step::Text("b".into())];
    server.install("default", Script::one(stream(steps)));
    let started = Instant::now();
    let r = post(server.port(), "/v1/responses", &json!({}));
    let elapsed = started.elapsed();
    assert_eq!(text(&r.events()), "ab");
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");
}

#[test]
fn control_endpoint_round_trip() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let port = server.port();
    let health = request(port, "GET", "/_mock/health", &[], b"");
    assert_eq!((health.status, health.json()), (200, json!({"ok": true})));

    let script = json!({"responses": [{"events": [{"text": "scripted"}, {"finish": "stop"}]}]});
    assert_eq!(post(port, "/_mock/lanes/ctl/script", &script).status, 204);
    assert_eq!(post(port, "/_mock/lanes/ctl/script", &json!({"responses": [{}]})).status, 400);
    let stats = request(port, "GET", "/_mock/lanes/ctl", &[], b"");
    assert_eq!(stats.json()["pending"], 1);

    let body = json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(text(&post(port, "/lane/ctl/v1/messages", &body).events()), "scripted");

    let listed = request(port, "GET", "/_mock/lanes/ctl/requests", &[], b"");
    assert_eq!(listed.status, 200);
    assert_eq!(listed.header("x-mock-dropped-requests"), Some("0"));
    let raw = listed.json();
    assert_eq!(raw[0]["body"], body.to_string());
    assert_eq!(raw[0]["family"], "anthropic_messages");
    let recorded: Vec<RecordedRequest> = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(recorded, server.requests("ctl"));
    assert_eq!(recorded[0].body, body.to_string().as_bytes());

    assert_eq!(request(port, "DELETE", "/_mock/lanes/ctl", &[], b"").status, 204);
    assert_eq!(request(port, "GET", "/_mock/lanes/ctl/requests", &[], b"").json(), json!([]));
    assert_eq!(request(port, "GET", "/_mock/nothing", &[], b"").status, 404);
    // Control requests are not recorded on any lane.
    assert!(server.requests("default").is_empty());
}

#[test]
fn refuses_oversized_bodies_and_unknown_paths() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!("POST /v1/messages HTTP/1.1\r\nContent-Length: {}\r\n\r\n", (64 << 20) + 1);
    stream.write_all(head.as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream).status, 413);
    assert!(server.requests("default").is_empty());

    assert_eq!(request(server.port(), "POST", "/elsewhere", &[], b"{}").status, 404);
    assert_eq!(request(server.port(), "GET", "/v1/messages", &[], b"").status, 405);
    assert_eq!(request(server.port(), "GET", "/v1/models", &[], b"").status, 404);
    assert_eq!(server.requests("default").len(), 2, "lane requests are recorded even when refused");
}

#[test]
fn shutdown_stops_the_listener() {
    let mut server = MockServer::start("127.0.0.1:0").unwrap();
    let port = server.port();
    assert_eq!(request(port, "GET", "/_mock/health", &[], b"").status, 200);
    server.shutdown();
    server.shutdown();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn binary_prints_its_url_and_serves_a_script() {
    let dir = std::env::temp_dir().join(format!("broca-mock-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script.json");
    std::fs::write(&script, r#"{"responses":[{"events":[{"text":"from file"}]}]}"#).unwrap();
    let mut child = Command::new(broca_mock::exe())
        .args(["--bind", "127.0.0.1:0", "--script", script.to_str().unwrap(), "--until-stdin-eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("BROCA_MOCK_URL=http://127.0.0.1:").expect(&line);
    let port: u16 = url.parse().unwrap();
    assert_eq!(text(&post(port, "/v1/chat/completions", &json!({})).events()), "from file");
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "broca-mock did not exit on stdin EOF");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decodes a response with broca's own stream decoder: (events, reached the terminal event).
fn decode(family: Family, r: &Response) -> (Vec<StreamEvent>, bool) {
    let mut decoder = broca::provider::wire(family).decoder();
    let mut out = Vec::new();
    for e in r.events() {
        let class = decoder.decode(&e, &mut out).unwrap();
        assert!(!class.unknown, "{family:?}: unknown event {}", e.data);
    }
    (out, decoder.finished())
}

const FAMILIES: [(Family, &str); 3] = [
    (Family::AnthropicMessages, "/v1/messages"),
    (Family::OpenaiChat, "/v1/chat/completions"),
    (Family::OpenaiResponses, "/v1/responses"),
];

#[test]
fn streams_decode_back_to_the_script_with_broca_decoders() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    let script = r#"{"responses":[{"events":[
        {"reasoning":"Think "},{"reasoning":"more.","signature":"sig=="},
        {"text":"héllo "},{"comment":"keepalive"},{"text":"wörld"},
        {"tool_call":{"id":"call_1","name":"stat_file","arguments":"{\"path\":\"a\"}","chunks":3}},
        {"tool_call":{"id":"call_2","name":"ls","arguments":"{}"}},
        {"usage":{"input":10,"cached":5,"cache_write":2,"output":20,"reasoning":3}},
        {"finish":"tool_calls"}]}]}"#;
    for (family, path) in FAMILIES {
        server.install("default", Script::from_json(script).unwrap());
        let (events, finished) = decode(family, &post(server.port(), path, &json!({})));
        assert!(finished, "{family:?}");
        let (mut text, mut reasoning, mut calls, mut usage, mut finish) =
            (String::new(), String::new(), Vec::<(String, String, String)>::new(), None, None);
        for e in events {
            match e {
                StreamEvent::TextDelta { text: t } => text.push_str(&t),
                StreamEvent::ReasoningDelta { text: t } => reasoning.push_str(&t),
                StreamEvent::ToolCallStart { index, id, name } => {
                    assert_eq!(index, calls.len());
                    calls.push((id, name, String::new()));
                }
                StreamEvent::ToolCallArgsDelta { index, delta } => calls[index].2.push_str(&delta),
                StreamEvent::Usage { usage: u } => usage = Some(u),
                StreamEvent::Finish { reason, .. } => finish = Some(reason),
                _ => {}
            }
        }
        assert_eq!((text.as_str(), reasoning.as_str()), ("héllo wörld", "Think more."), "{family:?}");
        let want = |id: &str, name: &str, args: &str| (id.to_string(), name.to_string(), args.to_string());
        assert_eq!(calls, [want("call_1", "stat_file", "{\"path\":\"a\"}"), want("call_2", "ls", "{}")]);
        let usage = usage.expect("usage");
        let got = (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_tokens, usage.output_tokens);
        assert_eq!(got, (Some(10), Some(5), Some(2), Some(20)), "{family:?}");
        assert_eq!(finish.as_deref(), Some("tool_calls"), "{family:?}");
    }
}

#[test]
fn truncated_and_failed_streams_decode_as_unfinished_or_errors() {
    let server = MockServer::start("127.0.0.1:0").unwrap();
    for (family, path) in FAMILIES {
        server.install("default", Script::one(stream(vec![Step::Text("partial".into()), Step::Disconnect])));
        let (events, finished) = decode(family, &post(server.port(), path, &json!({})));
        assert!(!finished, "{family:?}");
        assert!(!events.iter().any(|e| matches!(e, StreamEvent::Finish { .. })), "{family:?}");

        let script = r#"{"responses":[{"events":[{"text":"partial"},{"error":{"type":"overloaded_error","message":"Overloaded"}}]}]}"#;
        server.install("default", Script::from_json(script).unwrap());
        let (events, _) = decode(family, &post(server.port(), path, &json!({})));
        assert!(events.iter().any(|e| matches!(e, StreamEvent::Error { .. })), "{family:?}: {events:?}");
    }
}
