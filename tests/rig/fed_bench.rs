//! `fed-bench`: what federation costs, behind `make bench`. Two real daemons (the federation
//! test rig, `tests/fed_rig`), the release broca on both, `broca-mock fed` between them, one
//! in-process model mock. Prints `BENCH <name> <value> <unit>`; nothing is asserted.
//!
//! - `fed.raw_fsync_us`: a 128-byte append and `fdatasync` in the rig's directory (the floor of
//!   every durable step, for reading the rest on a noisy machine).
//! - `fed.bare_request_us` / `fed.request_us`: median `session.head` round trip from a client on
//!   A to A's own broca, and to B's through `fed:<B>:broca` (the baseline and the relayed one).
//! - `fed.step_us.local` / `fed.step_us.fed`: median time of a one-step turn as its consumer on
//!   A sees it, `session.send` to the `run_finished` unit on its subscription, on A's own broca
//!   and on B's through the re-export (taken alternately); `fed.step_overhead_us` is their
//!   difference: two relayed hops (the send's answer and the unit) and the link's queueing.
//! - `fed.fanout_delta_p50_us` / `fed.fanout_delta_p99_us`: one session on B followed by two
//!   subscribers, one on B and one on A through the re-export; for every control unit, its
//!   arrival through the re-export less its arrival on B.

#[path = "../fed_rig/mod.rs"]
mod fed_rig;
#[path = "../conformance/process.rs"]
mod process;
#[path = "../bench/quick.rs"]
mod quick;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broca::session_key::SessionKey;
use broca::subc::consumer::{ClientRoute, Consumer, StreamCall, StreamEvent};
use fed_rig::{FedOptions, FedRig, CALL};
use serde_json::{json, Value};
use subc_protocol::{BindIdentity, RouteTarget};

/// When each subscriber (0: on B, 1: through A) received each control unit, by cursor.
type Arrivals = Arc<Mutex<[BTreeMap<(u64, u64), Instant>; 2]>>;

fn requests() -> usize {
    quick::n(300, 10)
}
fn steps() -> usize {
    quick::n(100, 5)
}
fn fanout_turns() -> usize {
    quick::n(40, 3)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, dir] = args.as_slice() {
        if flag == "--daemon" {
            return process::daemon_main(Path::new(dir), "fed-bench daemon");
        }
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        eprintln!("usage: fed-bench   (environment: BROCA_BENCH_BROCA: the broca binary)");
        return ExitCode::SUCCESS;
    }
    for var in ["SUBC_MODULE_ID", "SUBC_LAUNCH_NONCE", "SUBC_LAUNCH_NONCE_FD"] {
        std::env::remove_var(var);
    }
    let broca = std::env::var_os("BROCA_BENCH_BROCA").map(Into::into);
    let rig = FedRig::start(FedOptions { broca, ..FedOptions::default() });
    let on_a = rig.a.consumer();
    let root = rig.project_dir("bench");
    let root = root.to_str().expect("a UTF-8 root");

    let local = SessionKey::new(root, "fed-bench", "local");
    let remote = SessionKey::new(root, "fed-bench", "remote");
    let a_route = open(&on_a, &FedRig::broca_target(), &local);
    let fed_route = open(&on_a, &rig.fed_target(), &remote);
    let bare = median_us((0..requests()).map(|_| timed(|| call(&on_a, a_route, "session.head"))));
    let relayed = median_us((0..requests()).map(|_| timed(|| call(&on_a, fed_route, "session.head"))));
    bench("fed.raw_fsync_us", raw_fsync(rig.root()), "us");
    bench("fed.bare_request_us", bare, "us");
    bench("fed.request_us", relayed, "us");

    let [step_local, step_fed] = step_medians(&on_a, [(&FedRig::broca_target(), &local), (&rig.fed_target(), &remote)]);
    bench("fed.step_us.local", step_local, "us");
    bench("fed.step_us.fed", step_fed, "us");
    bench("fed.step_overhead_us", step_fed - step_local, "us");

    let (p50, p99, n) = fanout(&rig, root);
    eprintln!("fed-bench: {n} control units compared");
    bench("fed.fanout_delta_p50_us", p50, "us");
    bench("fed.fanout_delta_p99_us", p99, "us");
    ExitCode::SUCCESS
}

/// The median 128-byte append + `fdatasync` in the rig's directory (the disk's floor).
fn raw_fsync(dir: &Path) -> f64 {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("fsync.probe")).expect("a probe file");
    median_us((0..200).map(|_| {
        timed(|| {
            let _ = file.write_all(&[b'x'; 128]).and_then(|()| file.sync_data());
        })
    }))
}

fn bench(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.1} {unit}");
}

fn open(c: &Consumer, target: &RouteTarget, key: &SessionKey) -> ClientRoute {
    let identity = BindIdentity::new(key.harness.clone(), key.session.clone());
    c.open_route_rooted(target, &identity, Some(&key.project_root), CALL).expect("a route")
}

fn call(c: &Consumer, route: ClientRoute, method: &str) -> Vec<u8> {
    let body = json!({"method": method, "params": {}}).to_string();
    c.call(route, body.as_bytes(), CALL).expect("an answer")
}

fn timed<T>(f: impl FnOnce() -> T) -> Duration {
    let t = Instant::now();
    let _ = f();
    t.elapsed()
}

fn median_us(samples: impl Iterator<Item = Duration>) -> f64 {
    let mut v: Vec<f64> = samples.map(|d| d.as_secs_f64() * 1e6).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn send(c: &Consumer, route: ClientRoute, prompt: &str) {
    let body = json!({"method": "session.send", "params": {"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}}});
    c.call(route, body.to_string().as_bytes(), CALL).expect("session.send");
}

fn subscribe(c: &Consumer, target: &RouteTarget, key: &SessionKey) -> StreamCall {
    let route = open(c, target, key);
    let body = json!({"method": "session.subscribe", "params": {"from": "live"}}).to_string();
    c.subscribe(route, body.as_bytes(), 8192).expect("a subscription")
}

/// The next control unit of `stream` (waiting up to 30 s): its cursor and unit.
fn next_unit(stream: &mut StreamCall) -> ((u64, u64), Value) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match stream.next_until(until) {
            Some(StreamEvent::Data(body)) => {
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if event["kind"] == "control" {
                    let c = &event["cursor"];
                    return (
                        (c["wal_seq"].as_u64().unwrap_or(0), c["sub_index"].as_u64().unwrap_or(0)),
                        event["unit"].clone(),
                    );
                }
            }
            other => panic!("the stream ended or went quiet: {other:?}"),
        }
    }
}

/// Medians of [`steps`] one-step turns on each of two sessions, taken alternately so both see
/// the same machine: `session.send` until the subscriber sees `run_finished`.
fn step_medians(c: &Consumer, sides: [(&RouteTarget, &SessionKey); 2]) -> [f64; 2] {
    let mut routes = sides.map(|(target, key)| (open(c, target, key), subscribe(c, target, key)));
    let mut samples: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for i in 0..steps() * 2 {
        let side = i % 2;
        let (route, stream) = &mut routes[side];
        let t = Instant::now();
        send(c, *route, &format!("step {i}"));
        while next_unit(stream).1["type"] != "run_finished" {}
        samples[side].push(t.elapsed());
    }
    samples.map(|s| median_us(s.into_iter()))
}

/// Arrival-time deltas (through the re-export less on B) of every control unit of
/// [`fanout_turns`] turns on one session on B: (p50, p99, count).
fn fanout(rig: &FedRig, root: &str) -> (f64, f64, usize) {
    let key = SessionKey::new(root, "fed-bench", "fanout");
    let on_b = rig.b.consumer();
    let on_a = rig.a.consumer();
    let arrivals: Arrivals = Arc::default();
    let follow = |mut stream: StreamCall, side: usize, arrivals: Arrivals| {
        std::thread::spawn(move || {
            let mut finished = 0;
            while finished < fanout_turns() {
                let (cursor, unit) = next_unit(&mut stream);
                arrivals.lock().unwrap()[side].insert(cursor, Instant::now());
                finished += usize::from(unit["type"] == "run_finished");
            }
        })
    };
    let local = follow(subscribe(&on_b, &FedRig::broca_target(), &key), 0, Arc::clone(&arrivals));
    let relayed = follow(subscribe(&on_a, &rig.fed_target(), &key), 1, Arc::clone(&arrivals));
    let route = open(&on_b, &FedRig::broca_target(), &key);
    for i in 0..fanout_turns() {
        send(&on_b, route, &format!("fan {i}"));
        // One turn at a time: its units, then the next send.
        let until = Instant::now() + Duration::from_secs(30);
        while arrivals.lock().unwrap()[1].values().count() < (i + 1) * 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    local.join().expect("the local subscriber");
    relayed.join().expect("the relayed subscriber");
    let arrivals = arrivals.lock().unwrap();
    let mut deltas: Vec<f64> = arrivals[0]
        .iter()
        .filter_map(|(cursor, at)| {
            arrivals[1].get(cursor).map(|fed| fed.saturating_duration_since(*at).as_secs_f64() * 1e6)
        })
        .collect();
    deltas.sort_by(f64::total_cmp);
    let pick = |q: f64| deltas[((deltas.len() - 1) as f64 * q).round() as usize];
    (pick(0.5), pick(0.99), deltas.len())
}
