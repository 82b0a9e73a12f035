//! The classifier kill campaign (#31): the real subc daemon supervises broca (fail points
//! `classify.after_record` and `classify.before_publish` armed with a probability), the vault and
//! a scope authority (`tests/classify_rig`); broca is SIGKILLed at a random moment in every round
//! while a 12-item batch runs against broca-mock's Workers AI, and the batch is re-sent until it
//! answers. Afterwards, counted at broca-mock (outside broca): every item answered; an item asked
//! twice only when its first answer was never recorded (the recorded answer is the second
//! call's); exactly one `system_one` fact per answered item; no re-send ever met
//! `batch_in_progress` (every hold was released at restart). `make test` runs
//! [`DEFAULT_KILLS`] rounds; `BROCA_CLASSIFY_KILLS=N` more. The last line is
//! `CLASSIFY-KILLS rounds=… restarted_rounds=… failpoint_kills=… calls=… repeats=… violations=0`.

use broca_mock::mock;
mod classify_rig;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use classify_rig::*;
use serde_json::{json, Value};

/// Kill rounds in `make test`.
const DEFAULT_KILLS: usize = 12;

#[test]
fn no_recorded_item_is_asked_twice_across_sigkills() {
    let rounds = std::env::var("BROCA_CLASSIFY_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_KILLS);
    let base = tempfile::Builder::new().prefix("bck").tempdir_in("/tmp").unwrap();
    let h = start(base.path(), true);
    let stand = Stand(&h);
    stand.post("delay", json!({"delay_ms": 15}));
    let state_root: PathBuf = h.state_root();
    let mut rng = (std::process::id() as u64) | 1;
    let mut kills = 0;
    let mut batches = Vec::new();
    for round in 0..rounds {
        let batch_id = format!("kill-{round}");
        let states: Vec<String> = (0..12).map(|i| h.unique(&format!("k{round}-{i}"))).collect();
        for s in &states {
            stand.answer(s, &noul("0.42"));
        }
        let body = batch(&batch_id, &states);
        // A random kill while the first call runs (and the fail points' own kills).
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let before = h.broca_pid();
        let killer = {
            let after = Duration::from_millis(20 + rng % 150);
            std::thread::spawn(move || {
                std::thread::sleep(after);
                if let Some(pid) = before {
                    // SAFETY: kill(2) on the broca process this test's daemon spawned.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            })
        };
        let until = Instant::now() + Duration::from_secs(120);
        let reply = loop {
            assert!(Instant::now() < until, "batch {batch_id} never completed:\n{}", h.broca_log_tail(40));
            let route = ready(&h);
            match route.try_request("classify.run", &body) {
                Ok(text) => break text,
                Err(Failed::Route(_)) => std::thread::sleep(Duration::from_millis(50)),
                Err(Failed::Refused(refusal)) => {
                    assert_ne!(refusal["code"], "batch_in_progress", "a dead process's hold was not released");
                    // The call's route died with broca, or its reply with the process.
                    assert!(refusal["detail"]["class"] == "transient", "{batch_id}: refused {refusal}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let _ = killer.join();
        if h.broca_pid() != before {
            kills += 1;
        }
        let reply: Value = serde_json::from_str(&reply).unwrap();
        assert!(reply["items"].as_array().unwrap().iter().all(|i| i.get("answers").is_some()), "{reply}");
        batches.push((batch_id, states));
    }
    // Outside broca: every item asked at most twice (once more only if it was in flight at a
    // kill), and exactly once when no kill came between its answer and its record.
    let log = stand.log();
    let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
    for call in &log {
        *per_key.entry(call["key"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    let mut first_call_at: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for call in &log {
        first_call_at
            .entry(call["key"].as_str().unwrap().to_owned())
            .or_default()
            .push(call["at_ms"].as_u64().unwrap());
    }
    let mut repeats = 0;
    for (batch_id, states) in &batches {
        let answered = recorded_answers(&state_root, batch_id);
        assert_eq!(answered.len(), states.len(), "{batch_id}: every item answered");
        for (i, s) in states.iter().enumerate() {
            let n = per_key.get(&key(s)).copied().unwrap_or(0);
            assert!((1..=2).contains(&n), "{batch_id}: {s} asked {n} times");
            if n == 2 {
                // Asked again only if the first answer was never recorded: the recorded answer
                // is the second call's.
                let second = first_call_at[&key(s)][1];
                let recorded = answered_at(&state_root, batch_id, i as u64);
                assert!(recorded >= second, "{batch_id}: item {i} re-asked after its answer was recorded");
                repeats += 1;
            }
        }
        let published = facts(&h, batch_id);
        let ids: BTreeSet<&String> = published.iter().map(|f| &f.0).collect();
        assert_eq!((published.len(), ids.len()), (states.len(), states.len()), "{batch_id}: one fact per item");
    }
    let failpoints = h.broca_log().matches("broca: failpoint classify.").count();
    println!(
        "CLASSIFY-KILLS rounds={rounds} restarted_rounds={kills} failpoint_kills={failpoints} calls={} repeats={repeats} violations=0",
        log.len()
    );
    h.stop();
}
