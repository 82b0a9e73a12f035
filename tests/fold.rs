//! Archive folding (`broca::lineage::fold`, spec §20): cold, closed WALs sealed into the archive
//! trees by their class, served afterwards exactly as before (the first need unfolds them), a
//! send reopening one in its own tree; what is never folded; and a SIGKILL campaign at every
//! fold and unfold step (`broca fold` / `broca unfold` killed at their fail points while this
//! process reads the sessions and sends to one of them) after which every session reads as
//! before, exactly one copy of each is authoritative and, once the next start has tidied, no
//! stray file is left.

mod inproc;
use broca_mock::mock;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use broca::clock::ManualClock;
use broca::lineage::fold::{self, FoldPolicy, Folded};
use broca::ops::Ops;
use broca::session_key::SessionKey;
use broca::wire::Refusal;
use inproc::{reply_script, Rig};
use serde_json::{json, Value};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn call(ops: &Arc<Ops>, key: &SessionKey, method: &str, params: Value) -> Result<Value, Refusal> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    ops.handle(key, method, params, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).expect("an answer")
}

fn key(name: &str) -> SessionKey {
    SessionKey::new("/tmp", "fold-test", name)
}

fn send(prompt: &str, class: Option<&str>) -> Value {
    let mut v = json!({"prompt": prompt, "model": {"provider": "mock", "model": "echo-chat"}, "send_id": prompt});
    if let Some(c) = class {
        v["session_class"] = json!(c);
    }
    v
}

/// A finished one-turn session, its actor closed.
fn finished(rig: &Rig, key: &SessionKey, prompt: &str, class: Option<&str>) -> String {
    let sent = call(&rig.ops, key, "session.send", send(prompt, class)).unwrap();
    let run = sent["run_id"].as_str().unwrap().to_owned();
    inproc::wait_until("the run completes", || {
        call(&rig.ops, key, "run.status", json!({"run_id": run})).is_ok_and(|s| s["state"] == "completed")
    });
    rig.wait_closed(key);
    run
}

/// Everything a reader sees of the session, as served bytes (less `session.head.cache`: the
/// prompt cache's clock is the process's memory, spec §4a, and a restart forgets it).
fn reads(ops: &Arc<Ops>, key: &SessionKey, run: &str) -> Vec<String> {
    [
        ("session.read", json!({})),
        ("session.history", json!({})),
        ("session.head", json!({})),
        ("run.status", json!({"run_id": run})),
    ]
    .into_iter()
    .map(|(m, p)| {
        let mut answer = call(ops, key, m, p);
        if let Ok(Value::Object(head)) = &mut answer {
            head.remove("cache");
        }
        answer.map(|v| v.to_string()).unwrap_or_else(|r| r.to_json())
    })
    .collect()
}

fn files_of(root: &Path, addr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["wal", "wal-durable", "wal-ephemeral", "wal-archive", "wal-archive-durable"] {
        for entry in std::fs::read_dir(root.join(dir)).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(addr) {
                out.push(format!("{dir}/{name}"));
            }
        }
    }
    out.sort();
    out
}

fn clocked() -> (Rig, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::now());
    (inproc::clocked_rig(Duration::from_millis(100), clock.clone()), clock)
}

#[test]
fn cold_sessions_fold_by_class_and_read_exactly_as_before() {
    let (rig, clock) = clocked();
    rig.script(json!({"responses": [reply_script("one", 0), reply_script("two", 0), reply_script("three", 0), reply_script("four", 0)]}));
    let shared = Arc::clone(rig.ops.registry.shared());
    let root = shared.root.path().to_path_buf();
    let (plain, durable, retained) = (key("plain"), key("durable"), key("retained"));
    let run_plain = finished(&rig, &plain, "plain", None);
    let run_durable = finished(&rig, &durable, "durable", Some("head"));
    let retained_send =
        json!({"prompt": "kept", "model": {"provider": "mock", "model": "echo-chat"}, "retention": 20 * 24 * 3600});
    let run_retained =
        call(&rig.ops, &retained, "session.send", retained_send).unwrap()["run_id"].as_str().unwrap().to_owned();
    inproc::wait_until("the retained run completes", || {
        call(&rig.ops, &retained, "run.status", json!({"run_id": run_retained}))
            .is_ok_and(|s| s["state"] == "completed")
    });
    rig.wait_closed(&retained);
    let before = [reads(&rig.ops, &plain, &run_plain), reads(&rig.ops, &durable, &run_durable)];
    let plain_wal = std::fs::read(root.join("wal").join(format!("{}.wal", plain.addr()))).unwrap();
    rig.wait_closed(&plain);
    rig.wait_closed(&durable);

    // Not cold yet: nothing folds.
    let policy = FoldPolicy::default();
    assert!(fold::sweep(&shared, &policy).iter().all(|r| matches!(r, Ok(Folded::Skipped(_)))));
    clock.advance(8 * DAY);
    let sealed: Vec<_> = fold::sweep(&shared, &policy).into_iter().filter_map(Result::ok).collect();
    assert_eq!(sealed.iter().filter(|f| matches!(f, Folded::Sealed { .. })).count(), 2, "{sealed:?}");
    assert_eq!(files_of(&root, &plain.addr()), [format!("wal-archive/{}.fold", plain.addr())]);
    assert_eq!(files_of(&root, &durable.addr()), [format!("wal-archive-durable/{}.fold", durable.addr())]);
    assert_eq!(
        files_of(&root, &retained.addr()),
        [format!("wal-ephemeral/{}.wal", retained.addr())],
        "ephemeral stays live"
    );
    let where_plain = broca::moves::where_is(&shared, &plain).unwrap();
    assert_eq!((where_plain["state"].as_str(), where_plain["tree"].as_str()), (Some("folded"), Some("wal-archive")));
    if let Some(Folded::Sealed { wal_bytes, container_bytes }) = sealed.first() {
        assert!(container_bytes < wal_bytes, "{container_bytes} < {wal_bytes}");
    }
    // `broca inspect ROOT H S` says where it lives, then prints its records from the container
    // (what `broca inspect` prints of the WAL it seals) without unfolding it.
    let shown = broca_output(&root, &["inspect", &plain.project_root, &plain.harness, &plain.session]);
    let mut lines = shown.lines();
    let place: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!((&place["state"], &place["tree"]), (&json!("folded"), &json!("wal-archive")), "{shown}");
    assert!(lines.next().unwrap().starts_with(r#"{"container":"#), "{shown}");
    let copy = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(copy.path(), &plain_wal).unwrap();
    let live = broca_output(&root, &["inspect", copy.path().to_str().unwrap()]);
    assert_eq!(lines.collect::<Vec<_>>(), live.lines().collect::<Vec<_>>());
    assert_eq!(files_of(&root, &plain.addr()), [format!("wal-archive/{}.fold", plain.addr())], "not unfolded");

    // Reads unfold it: byte-identical answers, the WAL back with its bytes and its time.
    assert_eq!([reads(&rig.ops, &plain, &run_plain), reads(&rig.ops, &durable, &run_durable)], before);
    assert_eq!(std::fs::read(root.join("wal").join(format!("{}.wal", plain.addr()))).unwrap(), plain_wal);
    assert_eq!(files_of(&root, &durable.addr()), [format!("wal-durable/{}.wal", durable.addr())]);

    // Folded again, a send reopens it in its own tree and continues its lineage.
    rig.wait_closed(&durable);
    clock.advance(8 * DAY);
    fold::sweep(&shared, &policy);
    assert_eq!(files_of(&root, &durable.addr()), [format!("wal-archive-durable/{}.fold", durable.addr())]);
    finished(&rig, &durable, "durable again", None);
    assert_eq!(files_of(&root, &durable.addr()), [format!("wal-durable/{}.wal", durable.addr())]);
    let page = call(&rig.ops, &durable, "session.read", json!({})).unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 4, "both turns: {page}");
}

#[test]
fn busy_open_and_held_sessions_stay_live_and_tidy_keeps_one_copy() {
    let (rig, clock) = clocked();
    rig.script(json!({"responses": [reply_script("one", 0), reply_script("slow", 3000)]}));
    let shared = Arc::clone(rig.ops.registry.shared());
    let root = shared.root.path().to_path_buf();
    let (idle, busy) = (key("idle"), key("busy"));
    finished(&rig, &idle, "idle", None);
    call(&rig.ops, &busy, "session.send", send("busy", None)).unwrap();
    clock.advance(8 * DAY);
    let results = fold::sweep(&shared, &FoldPolicy::default());
    assert!(results.iter().any(|r| matches!(r, Ok(Folded::Skipped("open")))), "{results:?}");
    assert_eq!(files_of(&root, &busy.addr()), [format!("wal/{}.wal", busy.addr())]);
    // A container beside a live WAL (a fold cut after its rename) and temp files are tidied;
    // the live WAL stays the authority.
    assert_eq!(files_of(&root, &idle.addr()), [format!("wal-archive/{}.fold", idle.addr())]);
    let container = root.join("wal-archive").join(format!("{}.fold", idle.addr()));
    let copy = std::fs::read(&container).unwrap();
    fold::unfold(&shared, &idle.addr(), false).unwrap();
    std::fs::write(&container, &copy).unwrap();
    std::fs::write(root.join("wal-archive").join(format!("{}.fold.partial", idle.addr())), b"x").unwrap();
    std::fs::write(root.join("wal").join(format!("{}.wal.unfolding", idle.addr())), b"x").unwrap();
    assert_eq!(fold::tidy(&shared), 3);
    assert_eq!(files_of(&root, &idle.addr()), [format!("wal/{}.wal", idle.addr())]);
}

#[test]
fn no_wal_and_no_container_is_history_unreachable() {
    let (rig, clock) = clocked();
    rig.script(json!({"responses": [reply_script("one", 0)]}));
    let shared = Arc::clone(rig.ops.registry.shared());
    let k = key("lost");
    finished(&rig, &k, "lost", None);
    clock.advance(8 * DAY);
    fold::sweep(&shared, &FoldPolicy::default());
    shared.settle();
    let (container, _) = fold::container_of(&shared, &k.addr()).expect("folded");
    std::fs::remove_file(container).unwrap();
    assert_eq!(call(&rig.ops, &k, "session.read", json!({})).unwrap_err().code, "history_unreachable");
}

/// The crash campaign: for each fold point and each unfold point, sessions are written, and a
/// `broca fold` (or `broca unfold`) process is SIGKILLed at that point while this process reads
/// every session and sends to one of them (each send waited to its end). Every answer during
/// the pass is the one before it (or a transient refusal) and every send is accepted and
/// completes; after the next start's tidy, every session reads exactly as this process last
/// read it and has exactly one copy.
#[test]
fn a_fold_killed_at_every_step_loses_nothing_and_leaves_one_copy() {
    let points = ["fold.after_write", "fold.after_rename", "fold.after_remove", "fold.unfold_after_rename"];
    let rounds: usize = std::env::var("BROCA_FOLD_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let (mut kills, mut sends) = (0, 0);
    for round in 0..rounds {
        for point in points {
            let rig = inproc::rig(Duration::from_millis(100));
            let keys: Vec<SessionKey> = (0..3).map(|i| key(&format!("{point}-{round}-{i}"))).collect();
            let busy = key(&format!("{point}-{round}-busy"));
            let runs: Vec<String> = keys.iter().map(|k| finished(&rig, k, &k.session, None)).collect();
            let busy_first = finished(&rig, &busy, &busy.session, None);
            let before: Vec<Vec<String>> = keys.iter().zip(&runs).map(|(k, r)| reads(&rig.ops, k, r)).collect();
            rig.ops.registry.shared().settle();
            let root = rig.dir.path().to_path_buf();
            let unfolding = point.starts_with("fold.unfold");
            if unfolding {
                assert!(broca_cli(&root, &["fold"], None).success());
            }
            let traffic = Traffic::start(&rig.ops, &keys, &runs, &before, &busy);
            // The `@N`th hit: a kill in the middle of the pass, not only at its first session.
            // Sessions this process holds are skipped, so a pass may end before the Nth hit: it
            // is run again (the traffic goes on) until the kill lands.
            let killed = (0..5).any(|_| {
                let status = if unfolding {
                    let k = &keys[round % 3];
                    broca_cli(&root, &["unfold", &k.project_root, &k.harness, &k.session], Some(&format!("{point}@1")))
                } else {
                    broca_cli(&root, &["fold"], Some(&format!("{point}@{}", 1 + round % keys.len())))
                };
                if unfolding && status.success() {
                    // The session was unfolded by a read first: fold it again to unfold it.
                    assert!(broca_cli(&root, &["fold"], None).success());
                }
                !status.success()
            });
            assert!(killed, "{point}: the process was never killed");
            kills += 1;
            let (accepted, last_run) = traffic.stop();
            sends += accepted;
            rig.wait_closed(&busy);
            let busy_run = last_run.unwrap_or(busy_first);
            let busy_before = reads(&rig.ops, &busy, &busy_run);
            let users = serde_json::from_str::<Value>(&busy_before[0]).unwrap()["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "user")
                .count();
            assert_eq!(users, 1 + accepted, "{point}: every accepted send is in the busy session");
            rig.wait_closed(&busy);
            // The next start: a fresh core over the same root tidies, then reads.
            let Rig { dir: _dir, mock: _mock, ops } = rig;
            drop(ops);
            let fresh = inproc::ops_over(&root, "http://127.0.0.1:9".into(), Duration::from_millis(100));
            fold::tidy(fresh.registry.shared());
            let all: Vec<&SessionKey> = keys.iter().chain([&busy]).collect();
            for k in &all {
                let files = files_of(&root, &k.addr());
                assert_eq!(files.len(), 1, "{point}: one copy of {}: {files:?}", k.session);
            }
            let wanted = before.iter().cloned().chain([busy_before]);
            for ((k, r), want) in all.iter().zip(runs.iter().chain([&busy_run])).zip(wanted) {
                assert_eq!(reads(&fresh, k, r), want, "{point}: {} reads differ", k.session);
                let files = files_of(&root, &k.addr());
                assert_eq!(files, [format!("wal/{}.wal", k.addr())], "{point}: after the read");
            }
        }
    }
    println!("FOLD-KILLS rounds={rounds} kills={kills} sends={sends} violations=0");
}

/// Readers and a sender working while a fold process runs: the quiet sessions are read and must
/// answer as before (or transiently); the busy one is sent to, each send waited to its end.
struct Traffic {
    stop: Arc<std::sync::atomic::AtomicBool>,
    worker: std::thread::JoinHandle<(usize, Option<String>, Vec<String>)>,
}

impl Traffic {
    fn start(
        ops: &Arc<Ops>,
        keys: &[SessionKey],
        runs: &[String],
        before: &[Vec<String>],
        busy: &SessionKey,
    ) -> Traffic {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ops, keys, runs, before, busy) =
            (Arc::clone(ops), keys.to_vec(), runs.to_vec(), before.to_vec(), busy.clone());
        let flag = Arc::clone(&stop);
        let worker = std::thread::spawn(move || {
            let (mut accepted, mut last_run, mut wrong) = (0, None, Vec::new());
            for i in 0.. {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let (k, r, want) = (&keys[i % keys.len()], &runs[i % keys.len()], &before[i % keys.len()]);
                let got = reads(&ops, k, r);
                if &got != want && !got.iter().any(|a| a.contains("\"transient\"")) {
                    wrong.push(format!("read {}: {got:?}", k.session));
                }
                match call(&ops, &busy, "session.send", send(&format!("{}-{i}", busy.session), None)) {
                    Ok(sent) => {
                        let run = sent["run_id"].as_str().unwrap().to_owned();
                        inproc::wait_until("the busy session's run completes", || {
                            call(&ops, &busy, "run.status", json!({"run_id": run}))
                                .is_ok_and(|s| s["state"] == "completed")
                        });
                        accepted += 1;
                        last_run = Some(run);
                    }
                    Err(r) if r.to_json().contains("\"transient\"") => {}
                    Err(r) => wrong.push(format!("send {i}: {}", r.to_json())),
                }
            }
            (accepted, last_run, wrong)
        });
        Traffic { stop, worker }
    }

    /// Stops the traffic: the sends accepted and the last one's run; panics on a wrong answer.
    fn stop(self) -> (usize, Option<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (accepted, last_run, wrong) = self.worker.join().expect("the traffic thread");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        (accepted, last_run)
    }
}

/// What `broca ARGS` prints on the state root `root` (it must succeed).
fn broca_output(root: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_broca"))
        .args(args)
        .env("BROCA_STATE_ROOT", root)
        .env_remove("BROCA_FAILPOINTS")
        .output()
        .expect("broca runs");
    assert!(out.status.success(), "broca {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `broca ARGS` on the state root `root`, with `BROCA_FAILPOINTS` when given.
fn broca_cli(root: &Path, args: &[&str], failpoints: Option<&str>) -> std::process::ExitStatus {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_broca"));
    cmd.args(args)
        .env("BROCA_STATE_ROOT", root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    match failpoints {
        Some(f) => cmd.env("BROCA_FAILPOINTS", f),
        None => cmd.env_remove("BROCA_FAILPOINTS"),
    };
    cmd.status().expect("broca runs")
}

/// Reads racing the module's own sweep (the same process) and a `broca fold` process: every
/// answer is the one before the fold, or a transient refusal that is right when asked again.
#[test]
fn reads_racing_folds_answer_as_before() {
    let (rig, clock) = clocked();
    rig.script(json!({"responses": (0..4).map(|i| reply_script(&format!("r{i}"), 0)).collect::<Vec<_>>()}));
    let shared = Arc::clone(rig.ops.registry.shared());
    let keys: Vec<SessionKey> = (0..4).map(|i| key(&format!("race-{i}"))).collect();
    let runs: Vec<String> = keys.iter().map(|k| finished(&rig, k, &k.session, None)).collect();
    let before: Vec<Vec<String>> = keys.iter().zip(&runs).map(|(k, r)| reads(&rig.ops, k, r)).collect();
    shared.settle();
    let mut wrong = Vec::new();
    for round in 0..30 {
        clock.advance(8 * DAY);
        let folder = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || fold::sweep(&shared, &FoldPolicy::default()))
        };
        for ((k, r), want) in keys.iter().zip(&runs).zip(&before) {
            let got = (0..3).map(|_| reads(&rig.ops, k, r)).find(|g| !g.iter().any(|a| a.contains("\"transient\"")));
            if got.as_ref() != Some(want) {
                wrong.push(format!("round {round} {}: {got:?}", k.session));
            }
        }
        folder.join().unwrap();
        for k in &keys {
            rig.wait_closed(k);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
