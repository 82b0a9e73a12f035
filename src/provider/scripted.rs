//! A [`ModelClient`] that answers from a script instead of a network (like ureq's test
//! connector): each attempt takes the next scripted response, a list of stream events and
//! pauses, and reports it as a provider's decoded stream would arrive. No socket, no SSE, no
//! TLS: `broca-run --demo` runs on it, and a loop test can drive a turn without loopback HTTP.
//!
//! Invariant: every attempt reports exactly one terminal event (`End`, or `Failed` when the
//! script has no response left or the attempt was cancelled), as [`ModelClient`] requires.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;

use super::client::{Attempt, AttemptEvent, ModelClient};
use super::event::StreamEvent;
use super::telemetry::Telemetry;
use crate::record::{ErrorClass, ProviderError};

/// One step of a scripted response.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A decoded stream event, delivered as one read.
    Event(StreamEvent),
    /// Silence on the stream for this long (a cancel is noticed once it has passed).
    Pause(Duration),
}

/// The events of one attempt, in order.
pub type Response = Vec<Step>;

/// The most responses one client holds.
pub const SCRIPTED_RESPONSES_MAX: usize = 1024;

/// Answers attempts from a queue of responses; records each attempt's request body.
#[derive(Default)]
pub struct ScriptedClient {
    responses: Mutex<VecDeque<Response>>,
    bodies: Mutex<Vec<Vec<u8>>>,
}

/// The script is full ([`SCRIPTED_RESPONSES_MAX`]).
#[derive(Debug, PartialEq, Eq)]
pub struct ScriptFull;

impl ScriptedClient {
    pub fn new(responses: impl IntoIterator<Item = Response>) -> Result<ScriptedClient, ScriptFull> {
        let client = ScriptedClient::default();
        for response in responses {
            client.push(response)?;
        }
        Ok(client)
    }

    /// Queues a response for a later attempt.
    pub fn push(&self, response: Response) -> Result<(), ScriptFull> {
        let mut responses = self.responses.lock();
        if responses.len() >= SCRIPTED_RESPONSES_MAX {
            return Err(ScriptFull);
        }
        responses.push_back(response);
        Ok(())
    }

    /// The request bodies of the attempts started so far, in order.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.bodies.lock().clone()
    }
}

impl ModelClient for ScriptedClient {
    fn start(&self, attempt: Attempt) -> Receiver<AttemptEvent> {
        self.bodies.lock().push(attempt.body.clone());
        // Two slots: the reader never blocks the loop, and the loop drains as it goes.
        let (tx, rx) = bounded(2);
        let Some(response) = self.responses.lock().pop_front() else {
            let _ = tx.send(failed("the script has no response left for this attempt"));
            return rx;
        };
        let spawned =
            std::thread::Builder::new().name("broca-scripted".into()).spawn(move || play(&response, &attempt, &tx));
        if let Err(e) = spawned {
            let (tx, rx) = bounded(1);
            let _ = tx.send(failed(&format!("starting the scripted stream: {e}")));
            return rx;
        }
        rx
    }
}

/// Reports `response` on `tx`, then its terminal.
fn play(response: &Response, attempt: &Attempt, tx: &Sender<AttemptEvent>) {
    for step in response {
        if attempt.cancel.load(Ordering::Acquire) {
            let _ = tx.send(failed("cancelled"));
            return;
        }
        let sent = match step {
            Step::Pause(d) => {
                std::thread::sleep(*d);
                Ok(())
            }
            Step::Event(event) => {
                tx.send(AttemptEvent::Stream { events: vec![event.clone()], at_ms: crate::clock::unix_ms() })
            }
        };
        if sent.is_err() {
            return; // The loop stopped listening.
        }
    }
    let _ = tx.send(AttemptEvent::End { terminal: true, telemetry: Telemetry::default() });
}

fn failed(message: &str) -> AttemptEvent {
    let error = ProviderError::new(ErrorClass::Permanent, Some("scripted".into()), message.into(), None);
    AttemptEvent::Failed { error, telemetry: Telemetry::default() }
}
