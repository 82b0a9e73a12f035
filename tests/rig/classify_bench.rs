//! `classify-bench`: classifier/v1 batches through the real subc daemon, behind `make bench`.
//! Prints `BENCH <name> <value> <unit>` lines on stdout; progress goes to stderr. Nothing here
//! asserts a figure.
//!
//! The rig is `tests/classify_rig` (the tests' harness with the vault and a scope authority)
//! with the release broca (`BROCA_BENCH_BROCA`, or `../broca` beside this example's directory)
//! and the release broca-mock; the harness's MockServer answers Workers AI at once.
//!
//! - `classify.bare_provider_us`: one item's provider request sent straight to the mock from this
//!   process (keep-alive, the same body broca sends): what an item costs without broca.
//! - `classify.raw_fsync_us`: one 128-byte append and `fdatasync` in the bench's directory: each
//!   recorded item costs one synced SQLite commit, so this is the floor under the overhead.
//! - `classify.bare_request_us`: one classifier `role.describe` round trip through the daemon.
//! - `classify.item_overhead_us`: broca's own wall time per item in a [`items`]-item batch:
//!   the batch's time divided by its items, less the bare provider request (median of
//!   [`rounds`] batches).
//! - `classify.item_cpu_us`: broca's CPU time (user + system, from `/proc`) per item over the same
//!   batches: the figure that does not move with the machine's load.
//! - `classify.items_per_s`: [`items`] items as [`CAP`] concurrent batches (the per-model cap),
//!   wall time of the whole.
//! - `classify.items_per_s.one_call`: one [`items`]-item batch (a call sends its items one at a
//!   time).

use broca_mock::mock;
#[path = "../classify_rig/mod.rs"]
mod classify_rig;
#[path = "../bench/quick.rs"]
mod quick;
#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use classify_rig::*;
use serde_json::json;

fn items() -> usize {
    quick::n(1_000, 64)
}
fn rounds() -> usize {
    quick::n(5, 1)
}
const CAP: usize = broca::classify::service::CALLS_PER_MODEL;

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        eprintln!("usage: classify-bench   (environment: BROCA_BENCH_BROCA, BROCA_BENCH_MOCK, BROCA_BENCH_DIR)");
        return ExitCode::SUCCESS;
    }
    let broca = match support::bench_broca_binary() {
        Ok(path) => path,
        Err(why) => {
            eprintln!("classify-bench: {why}");
            return ExitCode::from(1);
        }
    };
    let mock_bin = match std::env::var_os("BROCA_BENCH_MOCK").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => broca.with_file_name("broca-mock"),
    };
    let base_dir = std::env::var_os("BROCA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let base = match tempfile::Builder::new().prefix("bcb").tempdir_in(&base_dir) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("classify-bench: {}: {e}", base_dir.display());
            return ExitCode::from(1);
        }
    };
    let h = start_with(base.path(), false, Some(broca), Some(mock_bin));
    let stand = Stand(&h);
    let route = ready(&h);

    // The bare provider request, as broca sends it.
    let url = format!("{}/client/v4/accounts/{ACCOUNT}/ai/run/@cf/cloudflare/clef", h.mock.url());
    let agent = ureq::Agent::config_builder().proxy(None).max_redirects(5).build().new_agent();
    let state = h.unique("bare");
    stand.answer(&state, &noul("0.5"));
    let body = json!({"model": "clef", "state": state, "questions": {"q": {"type": "noul", "instructions": "Is it flagged?"}}})
        .to_string();
    let bare_provider = median((0..200).map(|_| {
        let t = Instant::now();
        let _ = agent.post(&url).header("Authorization", &format!("Bearer {CF_SECRET}")).send(&body);
        t.elapsed()
    }));
    let bare_request = median((0..200).map(|_| {
        let t = Instant::now();
        let _ = route.ok("role.describe", "{}");
        t.elapsed()
    }));

    // Batches of ITEMS, one call each.
    let pid = h.broca_pid().unwrap_or(0);
    let cpu_before = cpu_ticks(pid);
    let mut per_item = Vec::new();
    let mut one_call = Duration::ZERO;
    for round in 0..rounds() {
        let states = scripted(&stand, &h, &format!("r{round}"), items());
        let t = Instant::now();
        let reply = route.ok("classify.run", &batch(&format!("bench-{round}"), &states));
        let took = t.elapsed();
        assert!(reply.len() > items() * 20, "a short reply: {}", &reply[..reply.len().min(200)]);
        per_item.push(took / items() as u32);
        one_call = if round == 0 { took } else { one_call.min(took) };
        eprintln!("classify-bench: batch {round}: {} items in {took:?}", items());
    }
    let cpu = cpu_ticks(pid).saturating_sub(cpu_before);
    let item = median(per_item.into_iter());
    let overhead = item.as_secs_f64() * 1e6 - bare_provider.as_secs_f64() * 1e6;
    let cpu_us = cpu as f64 * 1e6 / ticks_per_second() / (rounds() * items()) as f64;

    // ITEMS as CAP concurrent batches.
    let groups: Vec<Vec<String>> = (0..CAP).map(|g| scripted(&stand, &h, &format!("c{g}"), items() / CAP)).collect();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for (g, states) in groups.iter().enumerate() {
            let h = &h;
            scope.spawn(move || {
                let route = ready(h);
                route.ok("classify.run", &batch(&format!("cap-{g}"), states));
            });
        }
    });
    let at_cap = t.elapsed();

    let raw_fsync = raw_fsync(base.path());
    println!("BENCH classify.raw_fsync_us {:.1} us", raw_fsync.as_secs_f64() * 1e6);
    println!("BENCH classify.bare_provider_us {:.1} us", bare_provider.as_secs_f64() * 1e6);
    println!("BENCH classify.bare_request_us {:.1} us", bare_request.as_secs_f64() * 1e6);
    println!("BENCH classify.item_overhead_us {overhead:.1} us");
    println!("BENCH classify.item_cpu_us {cpu_us:.1} us");
    println!("BENCH classify.items_per_s {:.0} items/s", items() as f64 / at_cap.as_secs_f64());
    println!("BENCH classify.items_per_s.one_call {:.0} items/s", items() as f64 / one_call.as_secs_f64());
    h.stop();
    ExitCode::SUCCESS
}

/// `n` fresh item states, each scripted with an answer.
fn scripted(stand: &Stand<'_>, h: &support::Harness, label: &str, n: usize) -> Vec<String> {
    let states: Vec<String> = (0..n).map(|i| h.unique(&format!("{label}-{i}"))).collect();
    for s in &states {
        stand.answer(s, &noul("0.25"));
    }
    states
}

/// The median of 100 appends of 128 bytes, each followed by `fdatasync`.
fn raw_fsync(dir: &std::path::Path) -> Duration {
    use std::io::Write;
    let Ok(mut file) = std::fs::File::create(dir.join("fsync-probe")) else { return Duration::ZERO };
    median((0..100).map(|_| {
        let t = Instant::now();
        let _ = file.write_all(&[b'x'; 128]).and_then(|()| file.sync_data());
        t.elapsed()
    }))
}

fn median(samples: impl Iterator<Item = Duration>) -> Duration {
    let mut v: Vec<Duration> = samples.collect();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // After the comm: state is 0, utime 11, stime 12.
    field(11) + field(12)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}
