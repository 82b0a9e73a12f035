//! The durable live events of the control projection (llm-runner/v1 `live_events`, CONTRACT
//! §7.1), from records alone: every stored message has `message_started` and then
//! `message_finished` naming its `mid` (the tool message of a closed batch included), tool
//! events carry the times broca recorded and none it did not (and the content's length as the
//! display row shows it), and `run_started` names the send that started the run.

use broca::lineage::projection::{self, ControlUnit};
use broca::record::{Record, RequestIdentity};
use broca::replay::{Effect, Replay};
use broca_testkit::*;
use cortexkit_role_llm_runner::live::LiveEvent;

const STARTED_AT: u64 = 1_700_000_000_100;
const FINISHED_AT: u64 = 1_700_000_000_250;

/// Applies `records` from seq 1 and returns every unit and the ordinals of the messages they
/// stored, checking `unit_count` against each record's units on the way.
fn project(records: &[Record]) -> (Vec<ControlUnit>, Vec<u64>) {
    let mut replay = Replay::default();
    let (mut units, mut messages) = (Vec::new(), Vec::new());
    for (i, record) in records.iter().enumerate() {
        let mut tool_message = false;
        let out = projection::apply(&mut replay, i as u64 + 1, record, &mut |e| {
            tool_message |= projection::is_tool_message(&e);
            if let Effect::Message { ordinal, .. } = e {
                messages.push(ordinal);
            }
        })
        .unwrap_or_else(|e| panic!("record {} does not replay: {e}", i + 1));
        assert_eq!(out.len(), projection::unit_count(record, tool_message), "unit_count of record {}", i + 1);
        units.extend(out);
    }
    (units, messages)
}

fn timed(mut record: Record, at: u64) -> Record {
    match &mut record {
        Record::ToolDispatchIntent { at_ms, .. } | Record::ToolResult { at_ms, .. } => *at_ms = Some(at),
        _ => unreachable!("only tool records carry a call time"),
    }
    record
}

/// One run: a tool call, its result, a closing answer.
fn tool_run(timed_calls: bool) -> Vec<Record> {
    let (intent, result) = (intent("r1", 1, "c1", "echo"), tool_result("r1", 1, "c1", "ok"));
    let (intent, result) =
        if timed_calls { (timed(intent, STARTED_AT), timed(result, FINISHED_AT)) } else { (intent, result) };
    vec![
        run_started("r1", None, "hi"),
        step_started("r1", 1),
        model_step("r1", 1, "calling", &[("c1", "echo")]),
        intent,
        result,
        step_started("r1", 2),
        model_step("r1", 2, "done", &[]),
    ]
}

fn events(units: &[ControlUnit]) -> Vec<&LiveEvent> {
    units.iter().filter_map(|u| u.event.as_ref()).collect()
}

#[test]
fn every_stored_message_is_started_then_finished_by_its_mid() {
    let (units, messages) = project(&tool_run(true));
    assert_eq!(messages, vec![0, 1, 2, 3], "user, assistant, tool message, assistant");
    let events = events(&units);
    for ordinal in messages {
        let mid = projection::mid(ordinal);
        let started: Vec<usize> =
            (0..events.len()).filter(|&i| matches!(events[i], LiveEvent::MessageStarted(m) if m.mid == mid)).collect();
        let finished: Vec<usize> =
            (0..events.len()).filter(|&i| matches!(events[i], LiveEvent::MessageFinished(m) if m.mid == mid)).collect();
        assert!(
            matches!((started.as_slice(), finished.as_slice()), ([s], [f]) if s < f),
            "{mid}: message_started at {started:?}, message_finished at {finished:?}"
        );
    }
    // The tool message's pair leads the record that closed its batch (the second step).
    let tool_mid = projection::mid(2);
    let finished = units
        .iter()
        .find(|u| matches!(&u.event, Some(LiveEvent::MessageFinished(m)) if m.mid == tool_mid))
        .expect("the tool message is finished");
    assert_eq!(finished.body()["type"], "tool_message");
    assert_eq!(finished.cursor.wal_seq, 6, "carried by the step_started that closed the batch");
    // Cursors stay strictly ordered within and across records.
    assert!(units.windows(2).all(|w| w[0].cursor < w[1].cursor));
}

#[test]
fn tool_events_carry_the_recorded_times_and_invent_none() {
    let (units, _) = project(&tool_run(true));
    let started = events(&units).into_iter().find_map(|e| match e {
        LiveEvent::ToolStarted(t) => Some(t.clone()),
        _ => None,
    });
    let finished = events(&units).into_iter().find_map(|e| match e {
        LiveEvent::ToolFinished(t) => Some(t.clone()),
        _ => None,
    });
    let (started, finished) = (started.expect("tool_started"), finished.expect("tool_finished"));
    assert_eq!((started.mid.as_str(), started.started_at), ("m2", Some(STARTED_AT)));
    assert_eq!((finished.mid.as_str(), finished.finished_at), ("m2", Some(FINISHED_AT)));
    // The uncut length of the content the display row shows: the text "ok", not its JSON.
    assert_eq!((finished.outcome.as_str(), finished.output_bytes), ("ok", 2));
    // Records from before broca kept call times: the members stay out.
    let (units, _) = project(&tool_run(false));
    for event in events(&units) {
        match event {
            LiveEvent::ToolStarted(t) => assert_eq!(t.started_at, None),
            LiveEvent::ToolFinished(t) => assert_eq!(t.finished_at, None),
            _ => {}
        }
    }
}

#[test]
fn run_started_names_the_send_that_started_it() {
    let request = RequestIdentity { send_id: Some("send-7".into()), received_at_ms: 1, ..Default::default() };
    let queued =
        Record::Queued { submission_id: "sub-1".into(), message: broca::message::Message::user_text("hi"), request };
    let (units, _) = project(&[queued, run_started("r1", Some("sub-1"), "hi")]);
    let send_ids: Vec<Option<String>> = events(&units)
        .into_iter()
        .filter_map(|e| match e {
            LiveEvent::RunStarted(r) => Some(r.send_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(send_ids, vec![Some("send-7".to_owned())]);
    // A run no send started names none (never a guess).
    let (units, _) = project(&[run_started("r1", None, "hi")]);
    assert!(events(&units).iter().all(|e| !matches!(e, LiveEvent::RunStarted(r) if r.send_id.is_some())));
}
