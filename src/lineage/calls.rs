//! A session's tool-call facts, read from its WAL (spec §4: `session.read` `tool_calls`,
//! `run.tool_calls`): every dispatch intent with the ordinal of the assistant message that asked
//! for it, its position among that message's calls, where it was dispatched, and its result (or
//! none yet). Facts are tied to the step record that produced the message, never matched by
//! content.
//!
//! One pass reads the WAL from its first record (the store keeps messages, not intents).

use super::reader::{Reader, Sink, Start};
use super::LineageError;
use crate::message::Role;
use crate::record::{self, CallOutcome, Record};
use crate::replay::Effect;

/// One call, as the WAL holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct CallFact {
    pub run_id: String,
    pub step: u64,
    pub tool_call_id: String,
    pub name: String,
    /// The exact argument JSON text dispatched (`{}` for older records without it).
    pub arguments: String,
    pub call_key: String,
    /// The module the intent names (absent for a send's own tools and older records).
    pub dispatched_to: Option<String>,
    /// The `session.read` ordinal of the assistant message that asked for the call.
    pub ordinal: u64,
    /// Its index among that message's tool calls, in planned order.
    pub position: u32,
    pub result: Option<CallResult>,
}

/// A call's durable result.
#[derive(Clone, Debug, PartialEq)]
pub struct CallResult {
    pub outcome: CallOutcome,
    /// The byte length of the stored result encoding.
    pub bytes: u64,
    /// The ordinal of the tool message holding it (once the batch closed).
    pub ordinal: Option<u64>,
    /// The result is an error output a provider or the daemon gave before the call ran.
    pub refused: bool,
}

impl CallFact {
    /// `session.read`'s `indeterminate` (llm-runner §5, §14): a durable intent and no result
    /// yet. A call closed with an unknown-outcome result is no longer indeterminate there (its
    /// result says `outcome_unknown`; `run.tool_calls` still names that outcome).
    pub fn indeterminate(&self) -> bool {
        self.result.is_none()
    }

    /// The llm-runner role's outcome name (`run.tool_calls`).
    pub fn role_outcome(&self) -> &'static str {
        use cortexkit_role_llm_runner::tool_calls::outcomes;
        match &self.result {
            None => outcomes::INDETERMINATE,
            Some(r) => match r.outcome {
                CallOutcome::Ok => outcomes::SUCCEEDED,
                CallOutcome::Error if r.refused => outcomes::REFUSED,
                CallOutcome::Error => outcomes::FAILED,
                CallOutcome::NotExecuted => outcomes::NOT_EXECUTED,
                CallOutcome::Unknown | CallOutcome::Cancelled => outcomes::INDETERMINATE,
            },
        }
    }
}

/// Collects facts; `stop_after` ends the scan once a message past that ordinal is seen.
struct CallsSink<'a> {
    run: Option<&'a str>,
    stop_after: Option<u64>,
    /// The step record being applied: its assistant message is the next one derived.
    step_record: Option<(String, u64)>,
    /// `(run_id, step, ordinal)` of the latest assistant message.
    assistant: Option<(String, u64, u64)>,
    facts: Vec<CallFact>,
    past: bool,
}

impl Sink for CallsSink<'_> {
    fn record(&mut self, _seq: u64, record: &Record) -> bool {
        match record {
            Record::ModelStepFinished { run_id, step, .. } => self.step_record = Some((run_id.clone(), *step)),
            Record::ToolDispatchIntent {
                run_id,
                step,
                tool_call_id,
                tool_name,
                module_id,
                call_key,
                arguments,
                ..
            } => {
                if self.run.is_some_and(|r| r != run_id) {
                    return true;
                }
                let Some((_, _, ordinal)) =
                    self.assistant.as_ref().filter(|(r, s, _)| r == run_id && s == step).cloned()
                else {
                    return true;
                };
                let position = self.facts.iter().filter(|f| f.run_id == *run_id && f.step == *step).count();
                self.facts.push(CallFact {
                    run_id: run_id.clone(),
                    step: *step,
                    tool_call_id: tool_call_id.clone(),
                    name: tool_name.clone(),
                    arguments: arguments.clone().unwrap_or_else(|| "{}".into()),
                    call_key: call_key.clone(),
                    dispatched_to: module_id.clone(),
                    ordinal,
                    position: u32::try_from(position).unwrap_or(u32::MAX),
                    result: None,
                });
            }
            Record::ToolResult { run_id, step, tool_call_id, output, is_error, outcome, refused, .. } => {
                let open = self.facts.iter_mut().find(|f| {
                    f.run_id == *run_id && f.step == *step && f.tool_call_id == *tool_call_id && f.result.is_none()
                });
                if let Some(fact) = open {
                    let outcome = outcome.unwrap_or(if *is_error { CallOutcome::Error } else { CallOutcome::Ok });
                    let bytes = serde_json::to_vec(output).map_or(0, |b| b.len() as u64);
                    fact.result = Some(CallResult {
                        outcome,
                        bytes,
                        ordinal: None,
                        refused: record::refused_before_run(*refused, output),
                    });
                }
            }
            _ => {}
        }
        !self.past
    }

    fn effect(&mut self, effect: Effect) {
        let Effect::Message { ordinal, run_id, message, .. } = effect else { return };
        if self.stop_after.is_some_and(|last| ordinal > last.saturating_add(1)) {
            self.past = true;
        }
        match message.role {
            Role::Assistant => {
                if let Some((step_run, step)) = self.step_record.take().filter(|(r, _)| *r == run_id) {
                    self.assistant = Some((step_run, step, ordinal));
                }
            }
            Role::Tool => {
                for fact in self.facts.iter_mut().filter(|f| f.run_id == run_id && f.ordinal + 1 == ordinal) {
                    if let Some(result) = fact.result.as_mut() {
                        result.ordinal = Some(ordinal);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Every call of `run_id` (all runs when `None`), in dispatch order. With `through`, the scan
/// stops after the tool message of the assistant message at that ordinal.
pub fn facts(reader: &Reader, run: Option<&str>, through: Option<u64>) -> Result<Vec<CallFact>, LineageError> {
    let mut sink =
        CallsSink { run, stop_after: through, step_record: None, assistant: None, facts: Vec::new(), past: false };
    reader.scan(Start::Beginning, &mut sink)?;
    Ok(sink.facts)
}
