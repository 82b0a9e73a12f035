//! What a `broca-run` turn costs as a process: its start-up (exec to the first request byte at
//! the provider), its fsyncs on a continued session, and the baseline of a bare `true` process.

use crate::quick;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use broca_mock::mock::MockServer;

/// Turns timed per figure (the median is reported).
fn turns() -> usize {
    quick::n(7, 2)
}

/// The figures of [`measure`].
pub struct CliFigures {
    /// Median of exec → the mock reading the turn's request head.
    pub start_ms: f64,
    /// Median wall time of spawning and reaping `true`.
    pub true_ms: f64,
    /// fsync + fdatasync calls per continued single-step turn (the mean of [`turns`] turns, so
    /// the run index's occasional checkpoint at close counts its share), counted by strace
    /// (None without strace).
    pub turn_fsyncs: Option<f64>,
    /// Median wall time of a whole continued one-step turn, spawn to exit.
    pub turn_us: f64,
    /// Median wall time of a bare client's turn on the same mock: spawning `true`, then one
    /// request on a new connection, its whole stream read.
    pub bare_turn_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs continued single-step turns of the `broca-run` beside this binary against an
/// in-process mock (default lane: a one-step answer). `None` if broca-run is not built.
pub fn measure(dir: &Path) -> Option<CliFigures> {
    // An example runs from `target/<profile>/examples`; the binaries are one level up.
    let here = std::env::current_exe().ok()?;
    let exe = here.parent()?.parent()?.join("broca-run");
    if !exe.exists() {
        eprintln!("broca-bench: {} is not built; skipping cli.start_ms and cli.turn_fsyncs", exe.display());
        return None;
    }
    let root = dir.join("cli-root");
    std::fs::create_dir_all(root.join("catalog")).ok()?;
    std::fs::write(root.join("catalog/fusiform-lkg.json"), include_str!("../../testdata/catalog/fusiform-lkg.json"))
        .ok()?;
    let mock = MockServer::start("127.0.0.1:0").ok()?;
    let turn = |program: Option<&str>, extra: &[&str]| -> Option<Instant> {
        let mut cmd = match program {
            None => Command::new(&exe),
            Some(p) => {
                let mut c = Command::new(p);
                c.args(extra).arg(&exe);
                c
            }
        };
        cmd.arg("--state-root").arg(&root).arg("--base-url").arg(mock.base_url(None));
        cmd.args(["--model", "mock/echo-chat", "--session", "bench", "hello"]);
        cmd.stdout(Stdio::null()).stderr(Stdio::null()).stdin(Stdio::null());
        let start = Instant::now();
        let ok = cmd.status().ok()?.success();
        ok.then_some(start)
    };
    // The first turn creates the session; every later one continues it.
    turn(None, &[])?;
    let (mut starts, mut whole) = (Vec::new(), Vec::new());
    for _ in 0..turns() {
        let spawned = turn(None, &[])?;
        whole.push(spawned.elapsed().as_secs_f64() * 1e6);
        let first_byte = mock.last_request_at()?;
        starts.push(first_byte.saturating_duration_since(spawned).as_secs_f64() * 1e3);
    }
    let url = format!("{}/chat/completions", mock.base_url(None));
    let body = br#"{"model":"echo-chat","messages":[{"role":"user","content":"hello"}],"stream":true}"#;
    let bare: Vec<f64> = (0..turns())
        .filter_map(|_| {
            let t = Instant::now();
            Command::new("true").status().ok()?.success().then_some(())?;
            let agent = ureq::Agent::new_with_defaults();
            let resp = agent.post(&url).header("content-type", "application/json").send(&body[..]).ok()?;
            std::io::Read::read_to_end(&mut resp.into_body().into_reader(), &mut Vec::new()).ok()?;
            Some(t.elapsed().as_secs_f64() * 1e6)
        })
        .collect();
    if bare.is_empty() {
        return None;
    }
    let trues: Vec<f64> = (0..turns())
        .filter_map(|_| {
            let t = Instant::now();
            let ok = Command::new("true").status().ok()?.success();
            ok.then(|| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect();
    if trues.is_empty() {
        return None;
    }
    let trace = dir.join("cli-turn.strace");
    let turn_fsyncs = strace_fsyncs(&trace, |args| turn(Some("strace"), args));
    Some(CliFigures {
        start_ms: median(starts),
        true_ms: median(trues),
        turn_fsyncs,
        turn_us: median(whole),
        bare_turn_us: median(bare),
    })
}

/// Runs [`turns`] turns under `strace -f` tracing fsync and fdatasync; the calls per turn.
fn strace_fsyncs(trace: &PathBuf, turn: impl Fn(&[&str]) -> Option<Instant>) -> Option<f64> {
    let available = Command::new("strace").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !available.is_ok_and(|s| s.success()) {
        eprintln!("broca-bench: strace is not available; skipping cli.turn_fsyncs");
        return None;
    }
    let out = trace.to_str()?;
    let mut calls = 0;
    for _ in 0..turns() {
        turn(&["-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", out])?;
        let text = std::fs::read_to_string(trace).ok()?;
        // A call interrupted by another thread's line shows once as `fsync(3 <unfinished ...>`.
        calls += text.lines().filter(|l| l.contains("fsync(") || l.contains("fdatasync(")).count();
    }
    Some(calls as f64 / turns() as f64)
}

/// Process CPU time (user + system) so far.
pub fn cpu_time() -> Duration {
    let (user, system) = cpu_times();
    user + system
}

/// Process CPU time in user mode so far: the engine's own work, without the kernel's
/// (fsync, scheduling), and so steadier on a shared machine.
pub fn user_cpu_time() -> Duration {
    cpu_times().0
}

/// Process (user, system) CPU time so far.
fn cpu_times() -> (Duration, Duration) {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(usage.ru_utime), tv(usage.ru_stime))
}
