//! The step-hint publisher (`broca::bus`) against a real `nats-server`: hints arrive on broca's
//! live subject as closed `step.finished.v1` bodies, the publisher reconnects after the server
//! is killed, a server that wants credentials is refused by name, and a publisher that cannot
//! keep up refuses hints at its bound instead of blocking. Each case skips by name without
//! `nats-server`.

#[allow(dead_code)]
mod nats;

use std::net::TcpListener;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use broca::bus::{BusError, Connection, HintRefused, StepFinished, StepHints, StepRef, HINT_QUEUE};
use broca::config::BusConfig;
use cortexkit_role_llm_runner::step_events::decode_step_finished;
use nats::{NatsServer, Subscriber};

const ACCOUNT: &str = "acct-test";

fn hint(seq: u64) -> StepFinished {
    let position = StepRef::new("broca", "0123456789abcdef0123456789abcdef", "inc-1", seq);
    let attempt = NonZeroU64::new(1).unwrap();
    StepFinished::new(position, "run-1", "1", attempt, "completed", "h", "s", "mock", "echo", 1, 2)
        .with_attempt_id(format!("inc-1-{seq}"))
}

fn config(addr: String) -> BusConfig {
    BusConfig { addr, account: ACCOUNT.into() }
}

fn seqs(sub: &Subscriber) -> Vec<u64> {
    let got = sub.captured.lock().unwrap().clone();
    got.iter().map(|c| decode_step_finished(&c.subject, &c.body).unwrap().seq).collect()
}

#[test]
fn hints_arrive_on_the_live_subject_as_closed_bodies() {
    if !nats::available("hints_arrive_on_the_live_subject_as_closed_bodies") {
        return;
    }
    let server = NatsServer::start(&[]);
    let sub = Subscriber::start(&server.addr(), "ck.*.live.*.step.finished.v1", Box::new(|_, _| true));
    let hints = StepHints::start(&config(server.addr())).unwrap();
    for seq in 1..=3 {
        hints.offer(hint(seq)).unwrap();
    }
    let got = sub.wait_for(3, Duration::from_secs(10));
    assert_eq!(got.len(), 3, "{got:?}");
    for (c, seq) in got.iter().zip(1..) {
        assert_eq!(c.subject, format!("ck.{ACCOUNT}.live.broca.step.finished.v1"));
        let event = decode_step_finished(&c.subject, &c.body).expect("a closed step.finished.v1 body");
        assert_eq!(event, hint(seq));
    }
    assert_eq!(hints.counts().published.load(std::sync::atomic::Ordering::Relaxed), 3);
}

#[test]
fn the_publisher_reconnects_after_the_server_is_killed() {
    if !nats::available("the_publisher_reconnects_after_the_server_is_killed") {
        return;
    }
    let mut server = NatsServer::start(&[]);
    let hints = StepHints::start(&config(server.addr())).unwrap();
    {
        let sub = Subscriber::start(&server.addr(), "ck.>", Box::new(|_, _| true));
        hints.offer(hint(1)).unwrap();
        assert_eq!(sub.wait_for(1, Duration::from_secs(10)).len(), 1);
    }
    server.restart();
    let sub = Subscriber::start(&server.addr(), "ck.>", Box::new(|_, _| true));
    // The first hints may meet the dead connection (dropped and counted, never resent); the
    // publisher then connects again and later hints arrive.
    let until = Instant::now() + Duration::from_secs(20);
    let mut seq = 2;
    while seqs(&sub).is_empty() {
        assert!(Instant::now() < until, "no hint arrived after the restart");
        hints.offer(hint(seq)).unwrap();
        seq += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let arrived = seqs(&sub);
    assert!(arrived.windows(2).all(|w| w[0] < w[1]), "each hint at most once, in order: {arrived:?}");
}

#[test]
fn a_server_that_wants_credentials_is_refused_by_name() {
    if !nats::available("a_server_that_wants_credentials_is_refused_by_name") {
        return;
    }
    let server = NatsServer::start(&["--user", "u", "--pass", "p"]);
    match Connection::open(&server.addr(), "broca") {
        Err(BusError::AuthRequired) => {}
        other => panic!("expected AuthRequired, got {:?}", other.map(|_| "a connection")),
    }
}

#[test]
fn a_full_queue_refuses_hints_without_blocking() {
    // A peer that accepts and never speaks holds the publisher in its handshake (for its bounded
    // handshake wait), so the queue fills.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let hints = StepHints::start(&config(silent.local_addr().unwrap().to_string())).unwrap();
    let mut refused = 0;
    for seq in 0..(HINT_QUEUE as u64 + 50) {
        if hints.offer(hint(seq + 1)) == Err(HintRefused::Full) {
            refused += 1;
        }
    }
    assert!(refused >= 50, "only {refused} hints refused past a bound of {HINT_QUEUE}");
    assert!(hints.counts().dropped.load(std::sync::atomic::Ordering::Relaxed) >= 50);
}
