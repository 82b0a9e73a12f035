//! What rendering one message of a transcript needs from the others ([`RenderContext`]), for
//! the wire families' per-message rendering ([`super::wire::WireFamily::render_message`]) and
//! the render cache ([`super::render_cache`]), which notes each step's new messages before it
//! renders them.

use std::collections::{HashMap, HashSet};

use crate::message::{Message, Part};

/// What rendering one message needs from the rest of its transcript, gathered by
/// [`RenderContext::note`] over every message before any is rendered (a whole render notes the
/// whole transcript).
#[derive(Clone, Debug, Default)]
pub struct RenderContext {
    /// The tool name of each call id: that of the last call with the id.
    names: HashMap<String, String>,
    /// Every called tool name, once, in first-use order.
    called: Vec<String>,
    /// Call ids the tool results rendered so far answer (kept by the cache only).
    answered: HashSet<String>,
}

impl RenderContext {
    /// The context of a whole transcript.
    pub fn of(transcript: &[Message]) -> Self {
        let mut context = Self::default();
        for m in transcript {
            context.note(m);
        }
        context
    }

    /// Notes `m`'s calls. False when one gives an id that a result already rendered answers a
    /// name other than the one it was rendered with: that rendering is stale.
    pub fn note(&mut self, m: &Message) -> bool {
        let mut fresh = true;
        for part in &m.content {
            if let Part::ToolCall { tool_call_id, tool_name, .. } = part {
                if self.answered.contains(tool_call_id) && self.names.get(tool_call_id) != Some(tool_name) {
                    fresh = false;
                }
                if !self.called.contains(tool_name) {
                    self.called.push(tool_name.clone());
                }
                self.names.insert(tool_call_id.clone(), tool_name.clone());
            }
        }
        fresh
    }

    /// Records that `m` was rendered with this context (its results' call ids).
    pub(crate) fn rendered(&mut self, m: &Message) {
        for part in &m.content {
            if let Part::ToolResult { tool_call_id, .. } = part {
                if !self.answered.contains(tool_call_id) {
                    self.answered.insert(tool_call_id.clone());
                }
            }
        }
    }

    /// The tool name of the call `call_id` names, if the transcript has one.
    pub fn tool_name(&self, call_id: &str) -> Option<&str> {
        self.names.get(call_id).map(String::as_str)
    }

    /// Every called tool name, once, in first-use order.
    pub fn called(&self) -> &[String] {
        &self.called
    }
}
