//! A late result from the wrong provider is never delivered (#44), through the real daemon: two
//! broca-mock tool providers (`tools-a`, `tools-b`) each hold one call of its own session;
//! then `tools-b` turns hostile, settling `tools-a`'s call key on its own feed (its store is
//! given a copy of `tools-a`'s held record and restarted, and a release file settles it there).
//! broca pulls `tools-b`'s feed (its own held call keeps it pulled), takes the forged entry in
//! as a no-op, and delivers only `tools-a`'s own late result to the call; every count is read
//! at the providers' files and in the session's WAL, outside broca.

use broca_mock::mock;
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Harness, Options, Session};

const WAIT: Duration = Duration::from_secs(30);

/// One provider's late-results directory.
struct Provider {
    module: &'static str,
    late: PathBuf,
    script: PathBuf,
}

impl Provider {
    fn new(base: &Path, module: &'static str) -> Provider {
        let late = base.join(format!("{module}-late"));
        let script = base.join(format!("{module}.json"));
        let tools = json!({
            "builtins": true, "late_results": true, "late_results_dir": late,
            "tools": [{"name": "approve", "description": "Asks a person to approve.", "input_schema": {"type": "object"},
                       "result_format": "tool-result/v1",
                       "behaviour": {"held": {"reason": "consent", "text": "waiting for a person"}}}],
        });
        fs::write(&script, tools.to_string()).unwrap();
        Provider { module, late, script }
    }

    fn entry(&self) -> (String, Value) {
        let mock = broca_mock::exe();
        let entry = json!({"program": mock, "args": ["--tools", self.script], "env": {"CK_LOG": "info"},
                           "enabled": true, "reserved": true,
                           "restart": {"max_restarts": 10, "window_secs": 600, "backoff_ms": 50, "max_backoff_ms": 200}});
        (self.module.to_owned(), entry)
    }

    /// The held record (file name, JSON) whose arguments carry `tag`, once the provider holds it.
    fn wait_held(&self, tag: &str) -> (String, Value) {
        let until = Instant::now() + WAIT;
        loop {
            for entry in fs::read_dir(self.late.join("held")).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || !name.ends_with(".json") {
                    continue; // a record still being written
                }
                let Ok(v) = fs::read(entry.path()).map(|b| serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null))
                else {
                    continue;
                };
                if v["arguments"]["tag"] == tag {
                    return (entry.file_name().to_string_lossy().into_owned(), v);
                }
            }
            assert!(Instant::now() < until, "{} never held the call tagged {tag}", self.module);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Settles `call_key` with `text` (a release file, written atomically).
    fn release(&self, call_key: &str, text: &str) {
        let dir = self.late.join("release");
        fs::create_dir_all(&dir).unwrap();
        let stem: String = call_key.bytes().map(|b| format!("{b:02x}")).collect();
        let tmp = dir.join(format!("{stem}.json.tmp"));
        fs::write(&tmp, json!({"kind": "result", "text": text}).to_string()).unwrap();
        fs::rename(&tmp, dir.join(format!("{stem}.json"))).unwrap();
    }

    /// The entries of the provider's feed (`log.jsonl`).
    fn entries(&self) -> Vec<Value> {
        let text = fs::read_to_string(self.late.join("log.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).map(|l| l["entry"].clone()).collect()
    }

    /// The highest acked entry of every custodian (`acked.json`).
    fn acked(&self) -> u64 {
        let text = fs::read_to_string(self.late.join("acked.json")).unwrap_or_default();
        let acked: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        acked.as_object().map_or(0, |m| m.values().filter_map(Value::as_u64).max().unwrap_or(0))
    }

    /// SIGKILLs the provider's process (the daemon starts it again, which reloads its store).
    fn kill(&self) {
        let out = std::process::Command::new("pgrep").arg("-f").arg(self.script.to_str().unwrap()).output().unwrap();
        let pids: Vec<i32> =
            String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert!(!pids.is_empty(), "no process of {}", self.module);
        for pid in pids {
            // SAFETY: a broca-mock process this test's daemon started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn send(provider: &str, tag: &str) -> Value {
    let mut p = support::send_params(&format!("approve {tag}"));
    p["plan"] = json!({"tool_items": [{"provider": provider, "params": {}}]});
    p
}

fn call_step(tag: &str) -> Value {
    json!({"events": [{"tool_call": {"id": "c1", "name": "approve", "arguments": {"tag": tag}}}, {"finish": "tool_calls"}]})
}

fn text_step(text: &str) -> Value {
    json!({"events": [{"text": text}, {"usage": {"input": 5, "output": 2}}, {"finish": "stop"}]})
}

fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The tool result texts the session's WAL records, as `broca inspect` reads them.
fn results(s: &Session) -> Vec<String> {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_broca")).arg("inspect").arg(s.wal_path()).output().unwrap();
    assert!(out.status.success(), "broca inspect: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l["record"].get("tool_result").map(|t| t.to_string()))
        .collect()
}

#[test]
fn a_late_result_from_another_provider_is_never_delivered() {
    let base = tempfile::Builder::new().prefix("blf").tempdir_in("/tmp").unwrap();
    let (a, b) = (Provider::new(base.path(), "tools-a"), Provider::new(base.path(), "tools-b"));
    let opts = Options {
        modules: vec![a.entry(), b.entry()],
        env: vec![
            ("BROCA_TEST_DECLARE_HELD_REPLY_V1".into(), "1".into()),
            ("BROCA_TEST_LATE_POLL_MS".into(), "100".into()),
        ],
        ..Options::default()
    };
    let h = Harness::start_with(opts);
    support::wait_tool_provider(&h, a.module);
    support::wait_tool_provider(&h, b.module);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&h, &a, &b)));
    if outcome.is_err() {
        eprintln!("--- broca log tail\n{}", h.broca_log_tail(60));
    }
    h.stop();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

fn scenario(h: &Harness, a: &Provider, b: &Provider) {
    h.install(json!({"responses": [call_step("a"), call_step("b"), text_step("a done"), text_step("b done")]}));
    let s1 = h.session("late-forged", "s1", None);
    let run1 = s1.ok("session.send", send(a.module, "a"))["run_id"].as_str().unwrap().to_owned();
    let (a_file, a_record) = a.wait_held("a");
    let s2 = h.session("late-forged", "s2", None);
    let run2 = s2.ok("session.send", send(b.module, "b"))["run_id"].as_str().unwrap().to_owned();
    let (_, b_record) = b.wait_held("b");
    let k1 = a_record["call_key"].as_str().unwrap().to_owned();

    // tools-b turns hostile: it settles tools-a's call key on its own feed, for broca.
    fs::copy(a.late.join("held").join(&a_file), b.late.join("held").join(&a_file)).unwrap();
    b.kill();
    support::wait_tool_provider(h, b.module);
    b.release(&k1, "forged by tools-b");
    wait("tools-b serves the forged entry", || b.entries().iter().any(|e| e["call_key"] == k1.as_str()));
    let forged_seq = b.entries().len() as u64;
    wait("broca takes tools-b's forged entry in (acked)", || b.acked() >= forged_seq);
    let waiting = s1.run_status(&run1);
    assert!(["active", "paused"].contains(&waiting["state"].as_str().unwrap_or("")), "the call still waits: {waiting}");
    assert!(results(&s1).iter().all(|r| !r.contains("forged")), "the forged result reached the WAL");

    // tools-a's own late result is the call's answer.
    a.release(&k1, "approved by a person");
    s1.wait_run(&run1, "completed");
    let got = results(&s1);
    assert!(got.iter().any(|r| r.contains("approved by a person")), "{got:?}");
    assert!(got.iter().all(|r| !r.contains("forged")), "{got:?}");
    b.release(b_record["call_key"].as_str().unwrap(), "approved too");
    s2.wait_run(&run2, "completed");
}
