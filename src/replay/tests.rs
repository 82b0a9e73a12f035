use super::*;
use crate::message::StepUsage;
use crate::record::{AttemptFinished, ErrorClass};

// The record builders of the `broca-testkit` package (a dev-dependency, which would link a second
// broca whose records are not this crate's), compiled here as this crate's own.
#[allow(dead_code)]
#[path = "../../mock/testkit/src/records.rs"]
mod testkit;
use testkit::*;

fn finished(run_id: &str) -> Record {
    Record::RunFinished {
        run_id: run_id.into(),
        reason: FinishReason::Completed,
        error: None,
        usage: RunUsage::default(),
        retries_used: 0,
        final_step_finish_reason: Some("stop".into()),
        indeterminate_tool_calls: vec![],
        at_ms: 1,
        detail: None,
        undelivered_steers: vec![],
    }
}

fn queued(id: &str) -> Record {
    Record::Queued { submission_id: id.into(), message: Message::user_text(id), request: RequestIdentity::default() }
}

/// Applies records in order, returning the messages derived.
fn run(replay: &mut Replay, records: &[Record]) -> Vec<(u64, Message)> {
    let mut out = Vec::new();
    for r in records {
        let seq = replay.last_seq + 1;
        replay
            .apply(seq, r, &mut |e| {
                if let Effect::Message { ordinal, message, .. } = e {
                    out.push((ordinal, message))
                }
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

fn episode(run_id: &str) -> Vec<Record> {
    vec![
        run_started(run_id, None, "hi"),
        step_started(run_id, 1),
        model_step(run_id, 1, "calling", &[("c1", "read"), ("c2", "write")]),
        intent(run_id, 1, "c1", "read"),
        intent(run_id, 1, "c2", "write"),
        tool_result(run_id, 1, "c2", "wrote"),
        tool_result(run_id, 1, "c1", "read it"),
        step_started(run_id, 2),
        model_step(run_id, 2, "done", &[]),
        finished(run_id),
    ]
}

#[test]
fn episodes_accumulate_a_prefix_and_a_terminal_never_seals_the_lineage() {
    let mut r = Replay::default();
    let first = run(&mut r, &episode("run-1"));
    assert_eq!(first.len(), 4, "user, assistant, one tool message, assistant");
    let Part::ToolResult { tool_call_id, .. } = &first[2].1.content[0] else { panic!() };
    assert_eq!(tool_call_id, "c1", "results in planned order, not arrival order");
    assert_eq!(first[2].1.content.len(), 2);
    assert_eq!(r.resolution(), Resolution::Idle { run_id: "run-1".into(), reason: FinishReason::Completed });
    let second = run(&mut r, &episode("run-2"));
    assert_eq!(second[0].0, 4, "ordinals continue across episodes");
    assert_eq!(r.prompt_len, 8);
    assert_eq!(r.episodes, 2);
    assert_eq!(r.last.as_ref().unwrap().usage.steps, 2, "counters reset per episode");
}

#[test]
fn only_a_finished_episode_may_be_followed_by_a_new_one() {
    let mut r = Replay::default();
    run(&mut r, &[run_started("run-1", None, "hi"), step_started("run-1", 1)]);
    assert!(r.check(&run_started("run-2", None, "again")).is_err());
    assert_eq!(r.resolution(), Resolution::Resume { run_id: "run-1".into() });
    run(&mut r, &[Record::RunPaused { run_id: "run-1".into(), reason: PauseReason::AuthRequired, error: None }]);
    assert_eq!(r.resolution(), Resolution::Paused { run_id: "run-1".into(), reason: PauseReason::AuthRequired });
    assert!(r.check(&run_started("run-2", None, "again")).is_err(), "no new episode while paused");
    assert!(r.check(&step_started("run-1", 2)).is_err(), "a paused run takes no step before it resumes");
    run(&mut r, &[Record::RunResumed { run_id: "run-1".into() }, model_step("run-1", 1, "back", &[])]);
    assert_eq!(r.resolution(), Resolution::Resume { run_id: "run-1".into() }, "same run_id after the pause");
}

#[test]
fn records_out_of_place_are_refused_with_nothing_applied() {
    let mut r = Replay::default();
    run(&mut r, &[run_started("run-1", None, "hi"), step_started("run-1", 1)]);
    let before = r.clone();
    for bad in [
        step_started("run-1", 2),                      // step 1 is still open
        model_step("run-1", 7, "x", &[]),              // not the open step
        tool_result("run-1", 1, "nope", "x"),          // no intent
        step_started("run-9", 2),                      // not the last episode
        finished("run-0"),                             // not the last episode
        Record::RunResumed { run_id: "run-1".into() }, // not paused
    ] {
        assert!(r.apply(99, &bad, &mut |_| {}).is_err(), "{bad:?}");
        assert_eq!(r, before, "a refused record changes nothing");
    }
}

#[test]
fn the_durable_queue_is_queued_minus_retracted_minus_consumed_in_fifo_order() {
    let mut r = Replay::default();
    run(
        &mut r,
        &[queued("sub-a"), queued("sub-b"), queued("sub-c"), Record::Retracted { submission_id: "sub-b".into() }],
    );
    let ids: Vec<_> = r.queue.iter().map(|p| p.submission_id.as_str()).collect();
    assert_eq!(ids, ["sub-a", "sub-c"]);
    run(&mut r, &[run_started("run-sub-a", Some("sub-a"), "a")]);
    assert_eq!(r.queue.len(), 1);
    // A retract after consumption is a no-op, never an un-consume.
    run(&mut r, &[Record::Retracted { submission_id: "sub-a".into() }]);
    assert_eq!(r.queue.front().unwrap().submission_id, "sub-c");
    assert!(r.check(&queued("sub-c")).is_err(), "a pending id cannot be queued twice");
    // A steer consumes its submission and joins after the batch's tool message.
    let msgs = run(
        &mut r,
        &[
            step_started("run-sub-a", 1),
            model_step("run-sub-a", 1, "t", &[("c1", "read")]),
            intent("run-sub-a", 1, "c1", "read"),
            tool_result("run-sub-a", 1, "c1", "r"),
            Record::Steered {
                run_id: "run-sub-a".into(),
                submission_id: "sub-c".into(),
                message: Message::user_text("steer"),
                title: None,
            },
        ],
    );
    assert!(r.queue.is_empty());
    let roles: Vec<_> = msgs.iter().map(|(_, m)| m.role).collect();
    assert_eq!(roles, [Role::Assistant, Role::Tool, Role::User]);
}

#[test]
fn cancel_requests_escalate_and_retries_are_counted() {
    let mut r = Replay::default();
    run(&mut r, &[run_started("run-1", None, "hi"), step_started("run-1", 1)]);
    let attempt = |outcome: &str| {
        Record::ModelAttemptFinished(Box::new(AttemptFinished {
            run_id: "run-1".into(),
            step: 1,
            attempt: 0,
            outcome: outcome.into(),
            error: Some(ProviderError::new(ErrorClass::Transient, None, "503".into(), Some(503))),
            ..Default::default()
        }))
    };
    run(&mut r, &[attempt("retry"), attempt("retry"), attempt("ok")]);
    assert_eq!(r.last.as_ref().unwrap().retries_used, 2);
    let cancel = |at| Record::RunCancelRequested { run_id: "run-1".into(), at };
    run(&mut r, &[cancel(CancelAt::StepBoundary), cancel(CancelAt::StepBoundary)]);
    assert_eq!(r.last.as_ref().unwrap().cancel, Some(CancelAt::StepBoundary));
    run(&mut r, &[cancel(CancelAt::Now), cancel(CancelAt::StepBoundary)]);
    assert_eq!(r.last.as_ref().unwrap().cancel, Some(CancelAt::Now), "never de-escalated");
}

#[test]
fn usage_accumulates_per_episode_and_unreported_steps_are_counted() {
    let mut r = Replay::default();
    let mut unreported = model_step("run-1", 2, "b", &[]);
    if let Record::ModelStepFinished { usage, .. } = &mut unreported {
        *usage = StepUsage::default();
    }
    run(
        &mut r,
        &[
            run_started("run-1", None, "hi"),
            step_started("run-1", 1),
            model_step("run-1", 1, "a", &[]),
            step_started("run-1", 2),
            unreported,
        ],
    );
    let u = &r.last.as_ref().unwrap().usage;
    assert_eq!((u.steps, u.unreported_steps, u.totals.output_tokens), (2, 1, Some(5)));
}

/// Property: every prefix of a valid record sequence replays without error to a state whose
/// message count matches the messages derived, and the state serializes and restores.
#[test]
fn every_prefix_replays_consistently() {
    let mut records = Vec::new();
    records.push(queued("sub-x"));
    records.extend(episode("run-1"));
    records.push(run_started("run-sub-x", Some("sub-x"), "x"));
    records.push(step_started("run-sub-x", 1));
    records.push(model_step("run-sub-x", 1, "t", &[("c9", "read")]));
    records.push(intent("run-sub-x", 1, "c9", "read"));
    for n in 0..=records.len() {
        let mut r = Replay::default();
        let msgs = run(&mut r, &records[..n]);
        assert_eq!(r.prompt_len as usize, msgs.len());
        assert!(msgs.iter().enumerate().all(|(i, (o, _))| *o == i as u64));
        let restored: Replay = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(restored, r);
    }
}
