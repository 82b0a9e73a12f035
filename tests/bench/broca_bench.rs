//! `broca-bench`: measures the lineage core on this host's filesystem and prints one line per
//! figure, `BENCH <name> <value> <unit>`, so runs can be compared. `make bench` runs it.
//!
//! Files go under `BROCA_BENCH_DIR` (default: the system temp dir); measure on the filesystem
//! your state root lives on. Targets are in the README; nothing here asserts them.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::io::Read;
use std::sync::Arc;

use broca::agent::{self, LoopOptions, NoTools, ToolDispatcher};
use broca::catalog::route::{self, ModelRequest, RouteOverrides};
use broca::catalog::Catalog;
use broca::lineage::reader::{Reader, Sink, Start};
use broca::lineage::{LineageError, Shared};
use broca::provider::client::HttpClient;
use broca::record::{self, FinishReason, Record};
use broca::session_key::SessionKey;
use broca::state_root::StateRoot;
use broca::wal::{self, RecordOutcome, ScannedFrame, Wal, WalError, WalOpen};
use broca_mock::mock::{MockOptions, MockServer, Script};
use broca_testkit::*;

fn fsync_samples() -> usize {
    quick::n(1000, 25)
}

mod cache;
mod cli;
mod families;
mod held;
mod publish;
mod quick;
mod warm;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--help") {
        println!("usage: broca-bench            run every benchmark\n       broca-bench loop       only the loop benchmarks\n       broca-bench cache      only the prompt-cache and warm figures\n       broca-bench families   only the per-family loop and decoder figures\n       broca-bench held       only the held-call resume figures\n       broca-bench replay-rss WAL   (internal) replay WAL, print peak RSS in KiB");
        return;
    }
    if args.get(1).map(String::as_str) == Some("replay-rss") {
        let path = PathBuf::from(&args[2]);
        let n = replay_file(&path).expect("replay");
        println!("{n} {}", peak_rss_kib());
        return;
    }
    let base = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::tempdir_in(&base).expect("bench dir");
    if args.get(1).map(String::as_str) == Some("cache") {
        for (name, value, unit) in cache::figures(dir.path()) {
            report(name, value, unit);
        }
        for (name, value, unit) in warm::figures(dir.path()) {
            report(name, value, unit);
        }
        return;
    }
    if args.get(1).map(String::as_str) == Some("held") {
        for (name, value, unit) in held::figures(dir.path()) {
            report(name, value, unit);
        }
        return;
    }
    if args.get(1).map(String::as_str) == Some("families") {
        let raw = broca_testkit::raw_fsync_p50_us(dir.path(), fsync_samples() / 5);
        report("fs.raw_fsync_us", raw, "us");
        families::report_all(dir.path(), raw);
        return;
    }
    if args.get(1).map(String::as_str) == Some("loop") {
        let raw = broca_testkit::raw_fsync_p50_us(dir.path(), fsync_samples() / 5);
        report("fs.raw_fsync_us", raw, "us");
        report_loop(dir.path(), raw);
        return;
    }
    let raw = broca_testkit::raw_fsync_p50_us(dir.path(), fsync_samples());
    report("fs.raw_fsync_us", raw, "us");
    let append = append_fsync_us(dir.path());
    report("wal.append_fsync_us", append, "us");
    report("wal.append_fsync_ratio", append / raw, "x");
    report("wal.group_commit_records_per_s", group_commit_records_per_s(dir.path()), "records/s");
    report("fanout.publish_ns.subs1", publish::publish_ns(dir.path(), 1), "ns");
    report("fanout.publish_ns.subs32", publish::publish_ns(dir.path(), 32), "ns");

    let wal_100k = dir.path().join("100k.wal");
    write_lineage(&wal_100k, quick::n(100_000, 2_000));
    let start = Instant::now();
    let n = replay_file(&wal_100k).expect("replay");
    report("replay.records_per_s", n as f64 / start.elapsed().as_secs_f64(), "records/s");
    report("open.tail_ms_100k", open_tail_ms(dir.path(), &wal_100k), "ms");

    report_loop(dir.path(), raw);
    for (name, value, unit) in cache::figures(dir.path()) {
        report(name, value, unit);
    }
    for (name, value, unit) in warm::figures(dir.path()) {
        report(name, value, unit);
    }
    families::report_all(dir.path(), raw);
    for (name, value, unit) in held::figures(dir.path()) {
        report(name, value, unit);
    }
    if let Some(ms) = demo_ms() {
        report("cli.demo_ms", ms, "ms");
    }

    let wal_1m = dir.path().join("1m.wal");
    write_lineage(&wal_1m, quick::n(1_000_000, 10_000));
    let small = child_rss(&wal_100k);
    let large = child_rss(&wal_1m);
    report("replay.rss_kib_100k", small as f64, "KiB");
    report("replay.rss_kib_1m", large as f64, "KiB");
    report("replay.rss_ratio_1m_vs_100k", large as f64 / small as f64, "x");
}

/// The loop, provider-connection and CLI figures, each timing also as a ratio to its baseline
/// measured in this run (raw fsync, the bare ureq client on the same mock, a bare `true`).
fn report_loop(dir: &Path, raw: f64) {
    let l = loop_step_overhead(dir);
    report("loop.step_overhead_us", l.overhead_us, "us");
    report("loop.step_budget_us", 2.0 * raw + 300.0, "us");
    // The same raw fsync with the pause a loop step has between its barriers (about 0.4 ms of
    // request and stream): what the loop's own fsyncs cost on this disk, beside the budget's.
    let paced = broca_testkit::raw_fsync_paced_p50_us(dir, fsync_samples() / 5, Duration::from_micros(400));
    report("fs.raw_fsync_us.paced_400us", paced, "us");
    report("fs.raw_fsync_paced_ratio", paced / raw, "x");
    report("loop.step_overhead_ratio_to_raw_fsync", l.overhead_us / raw, "x");
    report("loop.fsyncs_per_step", l.fsyncs, "fsyncs");
    report("provider.bare_step_us", l.bare_us, "us");
    report("loop.step_ratio_to_bare", (l.bare_us + l.overhead_us) / l.bare_us, "x");
    report("loop.cpu_us_per_step", l.cpu_us, "us");
    report("provider.bare_cpu_us_per_step", l.bare_cpu_us, "us");
    report("loop.cpu_ratio_to_bare", l.cpu_us / l.bare_cpu_us, "x");
    report("loop.user_cpu_us_per_step", l.user_cpu_us, "us");
    report("provider.bare_user_cpu_us_per_step", l.bare_user_cpu_us, "us");
    report("loop.user_cpu_ratio_to_bare", l.user_cpu_us / l.bare_user_cpu_us, "x");
    report("provider.handshakes_per_run", handshakes_per_run(dir), "handshakes");
    if let Some(c) = cli::measure(dir) {
        report("cli.start_ms", c.start_ms, "ms");
        report("cli.true_ms", c.true_ms, "ms");
        report("cli.start_ratio_to_true", c.start_ms / c.true_ms, "x");
        // A one-step turn's own cost: the whole turn less a bare client's (#50).
        report("cli.turn_us", c.turn_us, "us");
        report("cli.bare_turn_us", c.bare_turn_us, "us");
        report("cli.turn_overhead_us", c.turn_us - c.bare_turn_us, "us");
        if let Some(n) = c.turn_fsyncs {
            report("cli.turn_fsyncs", n, "fsyncs");
        }
    }
}

fn report(name: &str, value: f64, unit: &str) {
    println!("BENCH {name} {value:.3} {unit}");
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn open_wal(path: &Path) -> Wal {
    if !path.exists() {
        wal::create(&wal::FileStorage, path, [1; 16]).expect("create wal");
    }
    let opts =
        WalOpen { known_features: record::KNOWN_FEATURES, resume_at: None, epoch: 1, floor: None, truncate_to: None };
    Wal::open(&wal::FileStorage, path, opts, &mut |_f: ScannedFrame<'_>| -> Result<(), WalError> { Ok(()) })
        .expect("open wal")
}

fn accept(o: RecordOutcome) {
    if let RecordOutcome::Refused(e) = o {
        panic!("append refused: {e}");
    }
}

/// A durable append of a 1 KiB record through the WAL.
fn append_fsync_us(dir: &Path) -> f64 {
    let mut wal = open_wal(&dir.join("append.wal"));
    let payload = vec![0x61u8; 1024 - 32];
    let samples = (0..fsync_samples())
        .map(|_| {
            let t = Instant::now();
            accept(wal.append(&[], &payload, true));
            t.elapsed()
        })
        .collect();
    p50(samples)
}

/// 1 KiB records, one fsync per 100.
fn group_commit_records_per_s(dir: &Path) -> f64 {
    let mut wal = open_wal(&dir.join("group.wal"));
    let payload = vec![0x62u8; 1024 - 32];
    let n = quick::n(100_000u64, 1_000);
    let start = Instant::now();
    for i in 1..=n {
        accept(wal.append(&[], &payload, i.is_multiple_of(100)));
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Writes a lineage of `records` records: episodes of 10 steps, each with a ~600-byte answer
/// and a tool call, as a live session would, synced every 1,000 records.
fn write_lineage(path: &Path, records: u64) {
    let _ = fs::remove_file(path);
    let mut wal = open_wal(path);
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(13);
    let mut written = 0u64;
    let mut put = |wal: &mut Wal, rec: Record| {
        written += 1;
        accept(wal.append(&rec.features(), &rec.encode(), written.is_multiple_of(1000)));
        written >= records
    };
    'episodes: for ep in 0.. {
        let run = format!("run-{ep}");
        if put(&mut wal, run_started(&run, None, "summarize the repository")) {
            break;
        }
        for step in 1..=10 {
            let id = format!("call-{step}");
            for rec in [
                step_started(&run, step),
                model_step(&run, step, &text, &[(&id, "read")]),
                intent(&run, step, &id, "read"),
                tool_result(&run, step, &id, &text[..200]),
            ] {
                if put(&mut wal, rec) {
                    break 'episodes;
                }
            }
        }
        let fin = Record::RunFinished {
            run_id: run,
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
        if put(&mut wal, fin) {
            break;
        }
    }
    wal.sync().expect("sync");
}

/// Full replay: frame decode, checksum, record decode and the episode state machine. The
/// records end mid-episode, which is fine for a read-only replay.
fn replay_file(path: &Path) -> Result<u64, LineageError> {
    struct Count(u64);
    impl Sink for Count {
        fn record(&mut self, _seq: u64, _record: &Record) -> bool {
            self.0 += 1;
            true
        }
    }
    let mut count = Count(0);
    Reader::file(path).scan(Start::Beginning, &mut count)?;
    Ok(count.0)
}

/// Opens a 100k-record lineage whose store watermark is current: first an open that builds
/// the store, then the measured reopen.
fn open_tail_ms(dir: &Path, wal_100k: &Path) -> f64 {
    let root = StateRoot::at(&dir.join("root")).expect("state root");
    let shared = Shared::open(root).expect("shared");
    let key = SessionKey::new("/bench", "bench", "open-tail");
    let path = shared.wal_path(&key);
    // The lineage id must match the key: rewrite the header of a copy.
    let mut bytes = fs::read(wal_100k).expect("read wal");
    reheader(&mut bytes, key.lineage_id());
    fs::write(&path, &bytes).expect("copy wal");
    {
        let mut l = shared.open_lineage(&key).expect("first open");
        // The copy ends mid-episode; sealing it makes the lineage idle like a real one.
        let _ = l.commit();
    }
    let samples: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let l = shared.open_lineage(&key).expect("reopen");
            let d = t.elapsed();
            assert!(l.open_report().from_checkpoint, "the reopen used the store's checkpoint");
            drop(l);
            d
        })
        .collect();
    p50(samples) / 1000.0
}

/// Rewrites the lineage id in a WAL header frame (bytes 32+5..32+21) and its checksum.
fn reheader(bytes: &mut [u8], lineage: [u8; 16]) {
    bytes[32 + 5..32 + 21].copy_from_slice(&lineage);
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = crc32fast::hash(&bytes[12..12 + len]);
    bytes[8..12].copy_from_slice(&crc.to_le_bytes());
}

fn child_rss(path: &Path) -> u64 {
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .arg("replay-rss")
        .arg(path)
        .output()
        .expect("spawn replay child");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("child prints its peak RSS")
}

fn peak_rss_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

const LOOP_STEPS: usize = 20;

/// 20 scripted responses: 19 steps calling a tool, then an answer.
fn loop_script() -> Script {
    let mut responses = Vec::new();
    for i in 0..LOOP_STEPS - 1 {
        responses.push(serde_json::json!({"events": [
            {"text": "Checking the next file. "},
            {"tool_call": {"id": format!("call-{i}"), "name": "read", "arguments": {"path": format!("f{i}.txt")}}},
            {"usage": {"input": 100, "output": 20}}, {"finish": "tool_calls"}
        ]}));
    }
    responses.push(
        serde_json::json!({"events": [{"text": "Done."}, {"usage": {"input": 100, "output": 2}}, {"finish": "stop"}]}),
    );
    Script::from_json(&serde_json::json!({"responses": responses}).to_string()).expect("script")
}

/// The route of the bench model at `mock`'s `lane`.
fn bench_config(mock: &MockServer, lane: &str) -> broca::provider::config::RenderConfig {
    bench_route(mock, lane, &BenchModel::CHAT)
}

/// A model the loop bench drives, and the auth method that selects its family.
pub struct BenchModel {
    pub model: &'static str,
    pub auth: broca::frozen::AuthMethod,
}

impl BenchModel {
    const CHAT: BenchModel = BenchModel { model: "mock/echo-chat", auth: broca::frozen::AuthMethod::ApiKey };
}

/// The route of `bench`'s model at `mock`'s `lane`.
pub fn bench_route(mock: &MockServer, lane: &str, bench: &BenchModel) -> broca::provider::config::RenderConfig {
    let lkg: serde_json::Value =
        serde_json::from_str(include_str!("../../testdata/catalog/fusiform-lkg.json")).expect("lkg");
    let catalog = Catalog::from_response(&lkg["response"]).expect("catalog");
    let req = ModelRequest { model: bench.model.into(), ..Default::default() };
    let provider = bench.model.split_once('/').map_or("", |(p, _)| p).to_owned();
    let overrides = RouteOverrides {
        base_url_override: Some(mock.base_url(Some(lane))),
        auth_methods: [(provider, bench.auth)].into_iter().collect(),
        ..Default::default()
    };
    route::resolve(Ok(&catalog), PathBuf::new(), &req, &overrides).expect("route")
}

/// TLS handshakes the mock (HTTPS, its generated root trusted explicitly) counts for one
/// 20-step run through the loop.
fn handshakes_per_run(dir: &Path) -> f64 {
    let mock = MockServer::start_with("127.0.0.1:0", MockOptions { tls: true, ..Default::default() }).expect("mock");
    let client = HttpClient::with_test_root_pem(mock.ca_pem().expect("a TLS mock has a root")).expect("root");
    let shared = Shared::open(StateRoot::at(&dir.join("tls-root")).expect("state root")).expect("shared");
    mock.install("tls", loop_script());
    let config = bench_config(&mock, "tls");
    let mut lineage = shared.open_lineage(&SessionKey::new("/bench", "bench", "tls")).expect("lineage");
    agent::admit(&mut lineage, "run-tls", None, &config, broca::message::Message::user_text("go"), None, None)
        .expect("admit");
    let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
    let (_tx, rx) = crossbeam_channel::unbounded();
    let outcome =
        agent::drive(&mut lineage, &client, &tools, &rx, &LoopOptions::default(), &mut |_| {}).expect("drive");
    assert_eq!(outcome.reason, Some(FinishReason::Completed), "the TLS bench run completes");
    let c = mock.connections();
    (c.tls_full + c.tls_resumed) as f64
}

/// What [`loop_step_overhead`] measures.
pub struct LoopFigures {
    /// Median over rounds of (loop − bare) wall time per step.
    pub overhead_us: f64,
    /// Median bare-client wall time per step.
    pub bare_us: f64,
    /// Median process CPU time per step during the loop's run, and during the bare client's
    /// (both include the in-process mock serving it).
    pub cpu_us: f64,
    bare_cpu_us: f64,
    /// The same in user mode only (no kernel fsync or scheduling work).
    user_cpu_us: f64,
    bare_user_cpu_us: f64,
    fsyncs: f64,
}

/// Per-step wall time of a 20-step run through the loop minus that of a bare ureq client
/// posting the same 20 request bodies (recorded from a warm-up run through the loop) to the same
/// mock and reading each whole stream, as the median of 21 paired rounds (the machine's noise is
/// larger than the difference); the process CPU time per step of each; and the loop's fsyncs
/// per step. Sending the loop's own bodies keeps the mock's work (parsing a growing transcript)
/// out of the difference.
fn loop_step_overhead(dir: &Path) -> LoopFigures {
    let rounds = std::env::var("BROCA_BENCH_LOOP_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(quick::n(21usize, 2))
        .max(1);
    loop_step_overhead_of(dir, &BenchModel::CHAT, rounds)
}

/// [`loop_step_overhead`] of `bench`'s family, over `rounds` rounds.
pub fn loop_step_overhead_of(dir: &Path, bench: &BenchModel, rounds: usize) -> LoopFigures {
    let mock = MockServer::start("127.0.0.1:0").expect("mock");
    // A fresh state root per call: the main loop figure and the per-family section may measure
    // the same model, and a root already holding `run-bench` refuses to admit it again.
    let root_dir = tempfile::Builder::new()
        .prefix(&format!("loop-root-{}-", bench.model.replace('/', "-")))
        .tempdir_in(dir)
        .expect("state root dir");
    let root = StateRoot::at(root_dir.path()).expect("state root");
    let shared = Shared::open(root).expect("shared");
    let client = HttpClient::default();
    let bare_agent = ureq::Agent::config_builder().proxy(None).max_redirects(5).build().new_agent();
    let run_loop = |lane: &str, session: &str| {
        mock.install(lane, loop_script());
        let config = bench_route(&mock, lane, bench);
        let mut lineage = shared.open_lineage(&SessionKey::new("/bench", "bench", session)).expect("lineage");
        let tools: Arc<dyn ToolDispatcher> = Arc::new(NoTools);
        let (_tx, rx) = crossbeam_channel::unbounded();
        let input = broca::message::Message::user_text("go");
        agent::admit(&mut lineage, "run-bench", None, &config, input, None, None).expect("admit");
        let fsyncs_before = lineage.fsyncs();
        let (start, cpu, user) = (Instant::now(), cli::cpu_time(), cli::user_cpu_time());
        let outcome =
            agent::drive(&mut lineage, &client, &tools, &rx, &LoopOptions::default(), &mut |_| {}).expect("drive");
        let figures = (start.elapsed(), cli::cpu_time() - cpu, cli::user_cpu_time() - user);
        assert_eq!(outcome.reason, Some(FinishReason::Completed), "the bench run completes");
        (figures, (lineage.fsyncs() - fsyncs_before) as f64 / LOOP_STEPS as f64)
    };
    run_loop("warm", "warm-up");
    let bodies: Vec<Vec<u8>> = mock.requests("warm").into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), LOOP_STEPS, "the warm-up run sent one request per step");
    let (mut overheads, mut bares, mut cpus, mut bare_cpus) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut user_cpus, mut bare_user_cpus) = (Vec::new(), Vec::new());
    let mut fsyncs = 0.0;
    // 21 rounds by default (a round is about 30 ms); more for a profiler (`perf record ... broca-bench loop`).
    let url = {
        let bare = bench_route(&mock, "bare", bench);
        broca::provider::wire(bare.family).url(&bare)
    };
    for round in 0..rounds {
        // The bare client: one HTTP round trip and the whole stream per step, nothing else.
        mock.install("bare", loop_script());
        let (start, cpu, user) = (Instant::now(), cli::cpu_time(), cli::user_cpu_time());
        for body in &bodies {
            let resp =
                bare_agent.post(&url).header("content-type", "application/json").send(&body[..]).expect("bare post");
            let mut sink = Vec::new();
            resp.into_body().into_reader().read_to_end(&mut sink).expect("bare read");
        }
        let bare = per_step(start.elapsed());
        bare_cpus.push(per_step(cli::cpu_time() - cpu));
        bare_user_cpus.push(per_step(cli::user_cpu_time() - user));

        let ((wall, cpu, user), round_fsyncs) = run_loop(&format!("loop-{round}"), &format!("loop-{round}"));
        let looped = per_step(wall);
        cpus.push(per_step(cpu));
        user_cpus.push(per_step(user));
        fsyncs = round_fsyncs;
        if std::env::var_os("BROCA_BENCH_VERBOSE").is_some() {
            eprintln!("loop {looped:.0} us/step, bare {bare:.0} us/step");
        }
        overheads.push(looped - bare);
        bares.push(bare);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    LoopFigures {
        overhead_us: median(overheads),
        bare_us: median(bares),
        cpu_us: median(cpus),
        bare_cpu_us: median(bare_cpus),
        user_cpu_us: median(user_cpus),
        bare_user_cpu_us: median(bare_user_cpus),
        fsyncs,
    }
}

/// Microseconds per loop step of `d`.
fn per_step(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6 / LOOP_STEPS as f64
}

/// Wall time of `broca-run --demo` end to end (the binary of this profile: this one runs from
/// `target/<profile>/examples/`, broca-run is in `target/<profile>/`), if it is built.
fn demo_ms() -> Option<f64> {
    let exe = std::env::current_exe().ok()?.parent()?.parent()?.join("broca-run");
    if !exe.exists() {
        eprintln!("broca-bench: {} is not built; skipping cli.demo_ms", exe.display());
        return None;
    }
    let start = Instant::now();
    let out = std::process::Command::new(exe).arg("--demo").output().ok()?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    out.status.success().then_some(ms)
}
