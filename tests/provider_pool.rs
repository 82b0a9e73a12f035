//! Connection reuse against broca-mock over TLS (a real socket, a real rustls handshake; the
//! mock counts accepts and handshakes on its side): a run of many steps makes one connection, a
//! cancelled stream's connection is never reused, and a provider that closes keep-alive
//! connections (at once, or when idle) costs a new connection and no error.

use broca_mock::mock;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::agent::{self, LoopOptions, NoTools, Output, RunCommand, ToolDispatcher};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::lineage::Shared;
use broca::message::Message;
use broca::provider::client::{Attempt, AttemptEvent, HttpClient, ModelClient};
use broca::provider::config::RenderConfig;
use broca::record::{CancelAt, FinishReason};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use mock::{Connections, MockOptions, MockServer, Script};
use serde_json::json;

const STEPS: usize = 20;

fn tls_mock(options: MockOptions) -> (MockServer, HttpClient) {
    let mock = MockServer::start_with("127.0.0.1:0", MockOptions { tls: true, ..options }).unwrap();
    assert!(mock.url().starts_with("https://"));
    let client = HttpClient::with_test_root_pem(mock.ca_pem().unwrap()).unwrap();
    (mock, client)
}

fn config(mock: &MockServer, lane: &str) -> RenderConfig {
    let lkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/catalog/fusiform-lkg.json");
    let catalog = Catalog::load_lkg(&lkg).unwrap();
    let req = ModelRequest { model: "mock/echo-chat".into(), ..Default::default() };
    let overrides = RouteOverrides { base_url_override: Some(mock.base_url(Some(lane))), ..Default::default() };
    route::resolve(Ok(&catalog), lkg, &req, &overrides).unwrap()
}

/// `steps - 1` responses calling a tool, then an answer.
fn tool_steps(steps: usize) -> Script {
    let mut responses = Vec::new();
    for i in 0..steps - 1 {
        responses.push(json!({"events": [
            {"text": "next "},
            {"tool_call": {"id": format!("call-{i}"), "name": "read", "arguments": {"path": "f"}}},
            {"finish": "tool_calls"}
        ]}));
    }
    responses.push(json!({"events": [{"text": "Done."}, {"finish": "stop"}]}));
    Script::from_json(&json!({ "responses": responses }).to_string()).unwrap()
}

fn run(shared: &Shared, client: &HttpClient, config: &RenderConfig, session: &str, run_id: &str) -> FinishReason {
    let mut lineage = shared.open_lineage(&SessionKey::new("/pool", "pool-test", session)).unwrap();
    agent::admit(&mut lineage, run_id, None, config, Message::user_text("go"), None, None).unwrap();
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    let (_tx, rx) = crossbeam_channel::unbounded();
    let outcome = agent::drive(&mut lineage, client, &tools, &rx, &LoopOptions::default(), &mut |_| {}).unwrap();
    outcome.reason.unwrap()
}

/// One attempt through the client, to its terminal event.
fn attempt(client: &HttpClient, config: &RenderConfig) -> AttemptEvent {
    attempt_with(client, config, Duration::from_secs(10))
}

/// [`attempt`] with a read timeout of its own (a timeout the client has not seen is a new agent).
fn attempt_with(client: &HttpClient, config: &RenderConfig, read_timeout: Duration) -> AttemptEvent {
    let body = broca::provider::render_request(config, &[Message::user_text("hi")]);
    let cancel = Arc::new(AtomicBool::new(false));
    let a = Attempt { config: config.clone(), body, bearer: None, account_id: None, read_timeout, cancel };
    let rx = client.start(a);
    loop {
        match rx.recv_timeout(Duration::from_secs(20)).unwrap() {
            AttemptEvent::Stream { .. } => {}
            end => return end,
        }
    }
}

fn assert_ended(event: AttemptEvent) {
    assert!(matches!(event, AttemptEvent::End { terminal: true, .. }), "{event:?}");
}

/// Waits until the mock serves no connection (the client closed the one it had).
fn wait_all_closed(mock: &MockServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while mock.open_connections() > 0 {
        assert!(Instant::now() < deadline, "the client never closed its connection");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_twenty_step_run_over_tls_makes_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap();
    let (mock, client) = tls_mock(MockOptions::default());
    mock.install("run", tool_steps(STEPS));
    let config = config(&mock, "run");
    assert_eq!(run(&shared, &client, &config, "s1", "run-1"), FinishReason::Completed);
    assert_eq!(mock.requests("run").len(), STEPS, "every step went to the provider");
    assert_eq!(mock.connections(), Connections { accepts: 1, tls_full: 1, tls_resumed: 0 });
}

#[test]
fn a_run_cancelled_mid_stream_does_not_reuse_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::open(StateRoot::at(dir.path()).unwrap()).unwrap();
    let (mock, client) = tls_mock(MockOptions::default());
    let slow = json!({"responses": [{"events": [{"text": "first "}, {"delay_ms": 300}, {"text": "second"}, {"finish": "stop"}]}]});
    mock.install("cancel", Script::from_json(&slow.to_string()).unwrap());
    let config = config(&mock, "cancel");
    let mut lineage = shared.open_lineage(&SessionKey::new("/pool", "pool-test", "cancel")).unwrap();
    agent::admit(&mut lineage, "run-c", None, &config, Message::user_text("go"), None, None).unwrap();
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut sent = false;
    let outcome = agent::drive(&mut lineage, &client, &tools, &rx, &LoopOptions::default(), &mut |o| {
        if matches!(o, Output::Display(_)) && !sent {
            tx.send(RunCommand::Cancel(CancelAt::Now)).unwrap();
            sent = true;
        }
    })
    .unwrap();
    assert_eq!(outcome.reason, Some(FinishReason::Cancelled));
    drop(lineage);
    // The cancelled stream's connection is closed by the client, not kept for the next run.
    wait_all_closed(&mock);
    assert_eq!(mock.accepts(), 1);
    mock.install("cancel", tool_steps(3));
    assert_eq!(run(&shared, &client, &config, "after", "run-2"), FinishReason::Completed);
    let c = mock.connections();
    assert_eq!(c.accepts, 2, "the next run opened a new connection: {c:?}");
    assert_eq!(c.tls_full + c.tls_resumed, 2, "{c:?}");
}

#[test]
fn a_provider_that_closes_every_connection_costs_a_connection_per_request_and_no_error() {
    let (mock, client) = tls_mock(MockOptions { no_keep_alive: true, ..Default::default() });
    let config = config(&mock, "close");
    for _ in 0..3 {
        assert_ended(attempt(&client, &config));
    }
    let c = mock.connections();
    assert_eq!(c.accepts, 3, "{c:?}");
    assert!(c.tls_resumed >= 1, "a reconnect resumes the TLS session: {c:?}");
}

#[test]
fn a_provider_that_closes_idle_connections_costs_a_new_connection_and_no_error() {
    // The idle bound is well above two back-to-back attempts on a loaded machine (a debug build
    // beside the rest of `make test`: 50 ms was once too short).
    let (mock, client) = tls_mock(MockOptions { idle_close: Some(Duration::from_millis(500)), ..Default::default() });
    let config = config(&mock, "idle");
    assert_ended(attempt(&client, &config));
    assert_ended(attempt(&client, &config));
    assert_eq!(mock.accepts(), 1, "back to back, the connection is reused");
    // The provider closes the idle connection; the pooled one is found closed and replaced.
    wait_all_closed(&mock);
    assert_ended(attempt(&client, &config));
    assert_eq!(mock.accepts(), 2);
    assert_eq!(mock.requests("idle").len(), 3);
}

#[test]
fn a_new_agent_of_the_client_resumes_the_tls_session() {
    // Agents are per origin and read timeout; all of a client's share one rustls configuration
    // (and its session cache), so a second agent's first connection resumes the first's session.
    let (mock, client) = tls_mock(MockOptions::default());
    let config = config(&mock, "resume");
    assert_ended(attempt_with(&client, &config, Duration::from_secs(10)));
    assert_ended(attempt_with(&client, &config, Duration::from_secs(11)));
    let c = mock.connections();
    assert_eq!(c.accepts, 2, "two agents, two connections: {c:?}");
    assert_eq!((c.tls_full, c.tls_resumed), (1, 1), "the second connection resumed: {c:?}");
}
