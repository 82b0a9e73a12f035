//! The family-neutral events a provider stream decodes into, and the family names.

use serde::{Deserialize, Serialize};

use crate::message::StepUsage;
use crate::record::ProviderError;

pub use crate::frozen::Family;

/// One decoded, family-neutral stream event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Assistant text.
    TextDelta { text: String },
    /// A new text part begins: the family's stream separates text blocks (Anthropic's
    /// `content_block_start` of a text block; a Responses or Bedrock text delta of another message
    /// item, content part or content block than the last), so the next `TextDelta` starts a part
    /// of its own even right after another text part.
    TextPartStart,
    /// Reasoning (thinking / reasoning summary) text.
    ReasoningDelta { text: String },
    /// The opaque signature of the current reasoning block (sent back unchanged next turn).
    ReasoningSignature { signature: String },
    /// Reasoning the provider returned only as an opaque blob (redacted / encrypted).
    ReasoningOpaque { data: String },
    /// A tool call begins. `index` is its position among this message's calls.
    ToolCallStart { index: usize, id: String, name: String },
    /// A fragment of a tool call's argument JSON.
    ToolCallArgsDelta { index: usize, delta: String },
    /// Usage so far, normalized (fresh input excludes cache reads/writes; reasoning is inside
    /// output). A later `Usage` replaces earlier values field by field where it reports them.
    Usage { usage: StepUsage },
    /// The service level the provider states served the request, as an abstract level
    /// (`standard`, `fast`, `ultrafast`) or its own unmapped value (only families whose wire
    /// reports it, `provider::tier`). A later statement replaces an earlier one.
    ServedTier { tier: String },
    /// The provider's finish reason: `raw` as sent, `reason` normalized to
    /// `stop | length | tool_calls | content_filter | refusal | other`.
    Finish { reason: String, raw: String },
    /// An error reported inside a 200 stream.
    Error { error: ProviderError },
}

/// How one SSE event counts for attempt telemetry (spec §14).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventClass {
    /// The event's type name for the tally (`event:` name or the data's `type`).
    pub event_type: String,
    /// Real content: text, reasoning/summary, function-argument or refusal deltas.
    pub content: bool,
    /// A type this parser does not know (counted as non-content, `unknown: true`).
    pub unknown: bool,
}

/// A family's stream decoder: fed SSE events in order, it yields stream events.
pub trait StreamDecoder: Send {
    /// Decodes one SSE event. Malformed data is an error, never a panic.
    fn decode(
        &mut self,
        event: &crate::provider::sse::SseEvent,
        out: &mut Vec<StreamEvent>,
    ) -> Result<EventClass, DecodeError>;
    /// Whether the stream reached its documented terminal event.
    fn finished(&self) -> bool;
}

/// A stream the decoder cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "provider stream does not decode: {}", self.0)
    }
}
