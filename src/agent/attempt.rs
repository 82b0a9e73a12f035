//! Assembling one model attempt's stream events into the assistant message.

use crate::message::{Message, Part, Role, StepUsage};
use crate::provider::event::StreamEvent;

use super::parse_arguments;

/// A tool call being assembled.
struct PendingCall {
    index: usize,
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates an attempt's events. Invariants: parts keep stream order; consecutive deltas of
/// one kind extend the last part, unless a `TextPartStart` came between two text deltas; tool
/// calls are ordered by their stream index.
#[derive(Default)]
pub(super) struct Assembler {
    parts: Vec<Part>,
    /// A `TextPartStart` arrived: the next text delta opens a new part.
    text_break: bool,
    calls: Vec<PendingCall>,
    pub usage: StepUsage,
    /// The service level the provider stated it served (its last statement).
    pub served_tier: Option<String>,
    pub finish: Option<(String, String)>,
    /// Real content arrived (a retry would now duplicate what the user saw).
    pub delivered: bool,
}

fn merge(into: &mut Option<u64>, from: Option<u64>) {
    if from.is_some() {
        *into = from;
    }
}

impl Assembler {
    pub fn push(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::TextDelta { text } => {
                self.delivered = true;
                match self.parts.last_mut() {
                    Some(Part::Text { text: t }) if !self.text_break => t.push_str(&text),
                    _ => self.parts.push(Part::Text { text }),
                }
                self.text_break = false;
            }
            StreamEvent::TextPartStart => self.text_break = true,
            StreamEvent::ReasoningDelta { text } => {
                self.delivered = true;
                match self.parts.last_mut() {
                    Some(Part::Reasoning { text: t, signature: None }) => t.push_str(&text),
                    _ => self.parts.push(Part::Reasoning { text, signature: None }),
                }
            }
            StreamEvent::ReasoningSignature { signature } => match self.parts.last_mut() {
                Some(Part::Reasoning { signature: s @ None, .. }) => *s = Some(signature),
                _ => self.parts.push(Part::Reasoning { text: String::new(), signature: Some(signature) }),
            },
            StreamEvent::ReasoningOpaque { data } => self.parts.push(Part::RedactedReasoning { data }),
            StreamEvent::ToolCallStart { index, id, name } => {
                self.delivered = true;
                self.calls.push(PendingCall { index, id, name, arguments: String::new() });
            }
            StreamEvent::ToolCallArgsDelta { index, delta } => {
                self.delivered = true;
                if let Some(c) = self.calls.iter_mut().rev().find(|c| c.index == index) {
                    c.arguments.push_str(&delta);
                }
            }
            StreamEvent::Usage { usage } => {
                merge(&mut self.usage.input_tokens, usage.input_tokens);
                merge(&mut self.usage.cached_input_tokens, usage.cached_input_tokens);
                merge(&mut self.usage.cache_write_tokens, usage.cache_write_tokens);
                merge(&mut self.usage.output_tokens, usage.output_tokens);
                merge(&mut self.usage.reasoning_tokens, usage.reasoning_tokens);
            }
            StreamEvent::ServedTier { tier } => self.served_tier = Some(tier),
            StreamEvent::Finish { reason, raw } => self.finish = Some((reason, raw)),
            // Errors end the attempt; the caller handles them before they reach here.
            StreamEvent::Error { .. } => {}
        }
    }

    /// Where a delta event lands in the message being assembled, before it is pushed: the
    /// index of its content part and, for a tool call's arguments, the call's id (from its
    /// `ToolCallStart`). Tool calls follow the content parts, by stream index, so a call's part
    /// is counted from the parts and calls known so far. `None` for other events.
    pub fn locate(&self, event: &StreamEvent) -> Option<(usize, Option<String>)> {
        let len = self.parts.len();
        match event {
            StreamEvent::TextDelta { .. } => match self.parts.last() {
                Some(Part::Text { .. }) if !self.text_break => Some((len - 1, None)),
                _ => Some((len, None)),
            },
            StreamEvent::ReasoningDelta { .. } => match self.parts.last() {
                Some(Part::Reasoning { signature: None, .. }) => Some((len - 1, None)),
                _ => Some((len, None)),
            },
            StreamEvent::ToolCallArgsDelta { index, .. } => {
                let call = self.calls.iter().rev().find(|c| c.index == *index)?;
                let before = self.calls.iter().filter(|c| c.index < *index).count();
                Some((len + before, Some(call.id.clone())))
            }
            _ => None,
        }
    }

    /// The assistant message: content parts in order, then tool calls by stream index.
    pub fn into_message(mut self, origin: serde_json::Value) -> Message {
        self.calls.sort_by_key(|c| c.index);
        for c in self.calls {
            let input = parse_arguments(&c.arguments);
            self.parts.push(Part::ToolCall { tool_call_id: c.id, tool_name: c.name, input });
        }
        Message {
            role: Role::Assistant,
            content: self.parts,
            origin: Some(origin),
            delivered_as: None,
            sender: None,
            client_message_id: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_part_start_opens_a_new_text_part_and_locate_agrees() {
        let mut a = Assembler::default();
        let mut located = Vec::new();
        for e in [
            StreamEvent::TextPartStart,
            StreamEvent::TextDelta { text: "one ".into() },
            StreamEvent::TextDelta { text: "block".into() },
            StreamEvent::TextPartStart,
            StreamEvent::TextDelta { text: "two".into() },
        ] {
            if let Some((part, _)) = a.locate(&e) {
                located.push(part);
            }
            a.push(e);
        }
        assert_eq!(located, [0, 0, 1]);
        let m = a.into_message(serde_json::json!(null));
        assert_eq!(m.content, [Part::Text { text: "one block".into() }, Part::Text { text: "two".into() }]);
        assert_eq!(m.text(), "one blocktwo", "run.result joins text parts with nothing between them");
    }

    #[test]
    fn deltas_merge_and_calls_assemble_in_index_order() {
        let mut a = Assembler::default();
        for e in [
            StreamEvent::ReasoningDelta { text: "think ".into() },
            StreamEvent::ReasoningDelta { text: "more".into() },
            StreamEvent::ReasoningSignature { signature: "sig".into() },
            StreamEvent::TextDelta { text: "Hel".into() },
            StreamEvent::TextDelta { text: "lo".into() },
            StreamEvent::ToolCallStart { index: 1, id: "b".into(), name: "write".into() },
            StreamEvent::ToolCallStart { index: 0, id: "a".into(), name: "read".into() },
            StreamEvent::ToolCallArgsDelta { index: 0, delta: "{\"pa".into() },
            StreamEvent::ToolCallArgsDelta { index: 1, delta: "".into() },
            StreamEvent::ToolCallArgsDelta { index: 0, delta: "th\":\"x\"}".into() },
            StreamEvent::Usage { usage: StepUsage { input_tokens: Some(3), ..Default::default() } },
            StreamEvent::Usage { usage: StepUsage { output_tokens: Some(9), ..Default::default() } },
        ] {
            a.push(e);
        }
        assert_eq!(a.usage, StepUsage { input_tokens: Some(3), output_tokens: Some(9), ..Default::default() });
        let m = a.into_message(serde_json::json!({}));
        assert_eq!(m.content[0], Part::Reasoning { text: "think more".into(), signature: Some("sig".into()) });
        assert_eq!(m.content[1], Part::Text { text: "Hello".into() });
        assert!(
            matches!(&m.content[2], Part::ToolCall { tool_call_id, input, .. } if tool_call_id == "a" && input["path"] == "x")
        );
        assert!(
            matches!(&m.content[3], Part::ToolCall { tool_call_id, input, .. } if tool_call_id == "b" && input.as_object().unwrap().is_empty())
        );
    }
}
