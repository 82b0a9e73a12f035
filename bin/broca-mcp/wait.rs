//! `broca_wait`: wait (bounded) for a run to stop running, streaming its text as MCP
//! `notifications/progress` while it runs.
//!
//! Why a subscription and not polling: `session.subscribe` carries the run's live text deltas
//! (display lane) as the model writes them and its `run_finished` the moment it is durable,
//! while polling `session.read`/`run.status` would see text only once each model step is
//! complete and would re-read the transcript on every tick. The subscription is opened from the
//! cursor a `session.read` snapshot names (`head`, spec §15), so every control unit after that
//! snapshot is seen without a race; a `run.status` check after attaching, and again every
//! [`STATUS_RECHECK`], covers the window where the run ended before the stream attached. If the
//! stream cannot be opened or ends early, the wait falls back to polling `run.status` every
//! [`POLL_INTERVAL`] (without progress).
//!
//! Progress text: display deltas received while this run is the session's running one, in
//! order; an assistant message whose deltas were all missed (the lossy display lane dropped
//! them) is sent whole from its durable control unit. Text the run wrote before the wait
//! attached is not repeated: the result's `final_message.text` is the authoritative text.
//! Every notification is written before the tool's result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use broca::subc::consumer::StreamEvent;
use serde_json::{json, Value};

use crate::broca::{Broca, Failure, SessionRef};
use crate::rpc::Out;

/// The longest wait a call may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// The wait when the call names none.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// Stream frames buffered before the stream is given up (the adapter then polls).
pub const STREAM_BUFFER_FRAMES: usize = 1024;
/// How often `run.status` is asked again while the stream is quiet.
pub const STATUS_RECHECK: Duration = Duration::from_secs(1);
/// How often `run.status` is polled without a stream.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// The longest sleep between checks for the caller's cancellation.
const TICK: Duration = Duration::from_millis(100);
/// How long a run that reported `run_finished` may still read `active` (spec §14's window).
const SETTLE: Duration = Duration::from_secs(2);

/// Run states that keep a wait going.
const RUNNING: &[&str] = &["active", "pending"];
/// States after which a wait stops but `run.result` has nothing to give.
const NO_RESULT: &[&str] = &["paused", "unknown", "idle", "retracted", "superseded", "expired"];

/// Where to send progress: the request's `progressToken`.
pub struct Progress<'a> {
    pub out: &'a Out,
    pub token: Value,
    sent_chars: u64,
}

impl<'a> Progress<'a> {
    pub fn new(out: &'a Out, token: Value) -> Progress<'a> {
        Progress { out, token, sent_chars: 0 }
    }

    fn text(&mut self, chunk: &str) {
        if chunk.is_empty() {
            return;
        }
        self.sent_chars += chunk.chars().count() as u64;
        let params = json!({"progressToken": self.token, "progress": self.sent_chars, "message": chunk});
        self.out.notify("notifications/progress", params);
    }
}

/// How a wait ended.
pub enum Waited {
    /// The answer for the tool result.
    Answer(Value),
    /// The caller cancelled the request: no result is sent.
    Cancelled,
}

fn state_of(status: &Value) -> &str {
    status.get("state").and_then(Value::as_str).unwrap_or("unknown")
}

/// The run's text as one string (text parts only, like `run.result`'s `final_message.text`).
fn message_text(message: &Value) -> String {
    let parts = message.get("content").and_then(Value::as_array);
    parts.into_iter().flatten().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect()
}

struct Watch<'a, 'p> {
    broca: &'a Broca,
    key: &'a SessionRef,
    run_id: &'a str,
    progress: Option<&'a mut Progress<'p>>,
    /// This run is the session's running one, so display deltas are its text.
    ours: bool,
    /// A display delta arrived since the last assistant message of this run.
    deltas_since_message: bool,
    /// Text gathered from the frames read so far, sent as one notification.
    pending_text: String,
}

impl Watch<'_, '_> {
    fn status(&mut self) -> Result<Value, Failure> {
        let status = self.broca.call(self.key, "run.status", json!({"run_id": self.run_id}))?;
        if state_of(&status) == "active" && status.get("run_id").and_then(Value::as_str) == Some(self.run_id) {
            self.ours = true;
        }
        Ok(status)
    }

    /// One stream frame; true when it says this run stopped running.
    fn frame(&mut self, body: &[u8]) -> bool {
        let Ok(frame) = serde_json::from_slice::<Value>(body) else {
            log::debug!(target: "broca_mcp", "a stream frame is not JSON; skipped");
            return false;
        };
        match frame.get("kind").and_then(Value::as_str) {
            Some("display") => {
                let event = &frame["event"];
                if self.ours && event["type"] == "text_delta" && event.get("tool_call_id").is_none() {
                    if let Some(delta) = event["delta"].as_str() {
                        self.pending_text.push_str(delta);
                        self.deltas_since_message = true;
                    }
                }
                false
            }
            Some("control") => {
                let unit = &frame["unit"];
                if unit.get("run_id").and_then(Value::as_str) != Some(self.run_id) {
                    // Another run's unit: a later run started means ours is not the running one.
                    if unit["type"] == "run_started" {
                        self.ours = false;
                    }
                    return false;
                }
                match unit["type"].as_str() {
                    Some("run_started" | "run_resumed") => self.ours = true,
                    Some("assistant_message") => {
                        if !self.deltas_since_message {
                            self.pending_text.push_str(&message_text(&unit["message"]));
                        }
                        self.deltas_since_message = false;
                    }
                    Some("run_finished" | "run_paused") => return true,
                    _ => {}
                }
                false
            }
            _ => false,
        }
    }

    fn flush(&mut self) {
        if let Some(p) = self.progress.as_deref_mut() {
            p.text(&self.pending_text);
        }
        self.pending_text.clear();
    }
}

/// Waits until `run_id` stops running or `timeout` passes, then answers
/// `{"outcome": "finished", "result": run.result}`, `{"outcome": "not_running", "status"}`
/// (paused, unknown, retracted, …) or `{"outcome": "timed_out", "status"}`.
pub fn wait(
    broca: &Broca,
    key: &SessionRef,
    run_id: &str,
    timeout: Duration,
    progress: Option<&mut Progress<'_>>,
    cancel: &AtomicBool,
) -> Result<Waited, Failure> {
    let deadline = Instant::now() + timeout.min(MAX_WAIT);
    let mut w =
        Watch { broca, key, run_id, progress, ours: false, deltas_since_message: false, pending_text: String::new() };
    // The snapshot's head: the stream starts strictly after it (no gap, no duplicate).
    let head = broca.call(key, "session.read", json!({"limit": 1}))?.get("head").cloned();
    let from = head.filter(Value::is_object).unwrap_or_else(|| json!("live"));
    let mut sub = match broca.subscribe(key, json!({"from": from}), STREAM_BUFFER_FRAMES) {
        Ok(sub) => Some(sub),
        Err(e) => {
            log::info!(target: "broca_mcp", "session.subscribe unavailable ({e:?}); polling run.status");
            None
        }
    };
    let mut status = w.status()?;
    let mut next_check = Instant::now() + STATUS_RECHECK;
    let mut stopped = !RUNNING.contains(&state_of(&status));
    while !stopped {
        if cancel.load(Ordering::Acquire) {
            return Ok(Waited::Cancelled);
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let stream = sub.as_mut().and_then(|s| s.stream());
        match stream {
            Some(stream) => {
                let until = deadline.min(next_check).min(now + TICK);
                let mut ended = false;
                let mut event = stream.next_until(until);
                while let Some(e) = event.take() {
                    match e {
                        StreamEvent::Data(body) => stopped |= w.frame(&body),
                        StreamEvent::End(end) => {
                            log::info!(target: "broca_mcp", "the subscription ended ({:?}); polling run.status", end.err());
                            ended = true;
                            break;
                        }
                    }
                    // Whatever else is already buffered goes out in the same notification.
                    event = stream.next_until(Instant::now());
                }
                w.flush();
                if ended {
                    sub = None;
                }
            }
            None => std::thread::sleep(TICK.min(deadline.saturating_duration_since(now))),
        }
        if stopped || Instant::now() >= next_check {
            status = w.status()?;
            let interval = if sub.is_some() { STATUS_RECHECK } else { POLL_INTERVAL };
            next_check = Instant::now() + interval;
            let running = RUNNING.contains(&state_of(&status));
            if stopped && running {
                // The stream saw the terminal; the status read may lag it briefly (spec §14).
                stopped = settle(&mut w, &mut status, cancel)?;
            } else {
                stopped = !running;
            }
        }
    }
    w.flush();
    if cancel.load(Ordering::Acquire) {
        return Ok(Waited::Cancelled);
    }
    let state = state_of(&status).to_string();
    if RUNNING.contains(&state.as_str()) {
        return Ok(Waited::Answer(json!({"outcome": "timed_out", "status": status})));
    }
    if NO_RESULT.contains(&state.as_str()) {
        return Ok(Waited::Answer(json!({"outcome": "not_running", "status": status})));
    }
    let result = broca.call(key, "run.result", json!({"run_id": run_id}))?;
    Ok(Waited::Answer(json!({"outcome": "finished", "result": result})))
}

/// Re-reads `run.status` (at most [`SETTLE`]) until it agrees the run stopped.
fn settle(w: &mut Watch<'_, '_>, status: &mut Value, cancel: &AtomicBool) -> Result<bool, Failure> {
    let until = Instant::now() + SETTLE;
    while RUNNING.contains(&state_of(status)) {
        if Instant::now() >= until || cancel.load(Ordering::Acquire) {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
        *status = w.status()?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_text_joins_text_parts_only() {
        let m = json!({"role": "assistant", "content": [{"type": "reasoning", "text": "hm"},
                       {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(message_text(&m), "ab");
        assert_eq!(message_text(&json!({})), "");
    }
}
