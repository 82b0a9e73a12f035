//! The `session.read` page and the `session.head` answer (spec §4 ∪ llm-runner/v1 §4.2–§4.3,
//! §5, §6): both documents' members in one body, so a consumer of either reads it. Served
//! ordinals count from 1 and `mid` is `m<ordinal>`; every page and head carries the cache pair
//! (`history_version`, `incarnation`) beside broca's `lineage_id` and `lineage_state`.

use cortexkit_role_llm_runner::read::descriptors::PartDigest;
use serde::Serialize;

use crate::message::Message;
use crate::replay::Cursor;

/// Which run produced an entry, and whether it is that run's last message (llm-runner §6).
/// In broca a run is one episode, so `episode` is the run id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunAttribution {
    pub run_id: String,
    pub episode: String,
    #[serde(rename = "final")]
    pub is_final: bool,
}

/// A tool call's dispatch facts on the message that asked for it (spec §4, llm-runner §5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadToolCall {
    pub tool_call_id: String,
    pub call_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatched_to: Option<String>,
    /// The call may have run and no answer is known.
    pub indeterminate: bool,
}

/// An entry's `message`: the stored body (`media: "inline"`), or that body described
/// (`media: "descriptors"`, [`super::descriptors`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EntryMessage<'a> {
    Stored(#[serde(serialize_with = "message_body")] &'a Message),
    Described(serde_json::Value),
}

/// A stored message as a read serves it: its role, content and origin. What broca keeps beside
/// it (its delivery, its sender, the caller's message id) is never in the body.
#[derive(Serialize)]
pub struct MessageBody<'m> {
    pub role: &'m crate::message::Role,
    pub content: &'m [crate::message::Part],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: &'m Option<serde_json::Value>,
}

impl<'m> MessageBody<'m> {
    pub fn of(message: &'m Message) -> MessageBody<'m> {
        MessageBody { role: &message.role, content: &message.content, origin: &message.origin }
    }
}

fn message_body<S: serde::Serializer>(message: &&Message, s: S) -> Result<S::Ok, S::Error> {
    MessageBody::of(message).serialize(s)
}

/// One `session.read` entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReadEntry<'a> {
    pub ordinal: u64,
    pub mid: String,
    pub message: EntryMessage<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunAttribution>,
    /// An assistant message's dispatch facts, one per tool call in planned order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ReadToolCall>>,
    pub role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_at: Option<u64>,
    /// How a `delivery_order` send went out (llm-runner §4.2, §9.7): in the envelope, taken
    /// from the stored message, whose served body leaves it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_as: Option<&'a cortexkit_role_llm_runner::delivery_order::EntryDelivery>,
    /// In descriptors mode: the stored message's content digest (llm-runner §4.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// In descriptors mode: one digest per top-level stored part, keyed as display rows key it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part_digests: Option<Vec<PartDigest>>,
}

/// A tool of the session's latest run, as `include_tools` serves it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReadTool<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub input_schema: &'a serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<&'a str>,
}

/// A `session.read` page.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReadPage<'a> {
    pub messages: Vec<ReadEntry<'a>>,
    pub history_version: u64,
    pub incarnation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_from_ordinal: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<Cursor>,
    pub lineage_id: String,
    pub lineage_state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ReadTool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools_run_id: Option<String>,
}

/// `session.head`'s `last_run_state`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LastRunState {
    pub run_id: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `session.head`'s `last_run_error`: the class and timing of an `error` run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LastRunError {
    pub class: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at_ms: Option<u64>,
}

/// `session.head`'s `model`: the selection a send naming no model would use next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeadModel {
    pub provider: String,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// The `session.head` answer. Absent members are unknown (a never-written session carries
/// only the cache pair).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeadMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ordinal: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_ordinal: Option<u64>,
    pub history_version: u64,
    pub incarnation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<Cursor>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run_state: Option<LastRunState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run_error: Option<LastRunError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<HeadModel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<SessionUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage_id: Option<String>,
    /// The caller's own delivery grant (`head_sender`); absent: no grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<cortexkit_role_llm_runner::read::HeadSender>,
    /// The prompt-cache clock from memory (spec §4 `session.head.cache`); absent until the
    /// session sends a request its provider answers in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<HeadCache>,
}

/// `session.head.cache`: when the last answered request was sent, the lifetime it asked for,
/// and the estimated expiry (both absent where the provider's lifetime is not known).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeadCache {
    pub last_sent_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Always `estimated` (§4a): broca computes it; the provider does not report it.
    pub expiry_basis: &'static str,
}

/// `session.head`'s `usage` (`session_usage`): run usage's shape over every counted step of
/// the session, with `since` naming the first counted run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionUsage {
    #[serde(flatten)]
    pub usage: crate::message::RunUsage,
    pub since: String,
}

/// The incarnation a session with no WAL reports: no record exists, so none was minted, and a
/// reader's cache of it is dropped once the first write mints the real one (a UUID, never this).
/// The contract leaves its value opaque (any fixed string of 1–128 bytes would do); the published
/// conformance suite 0.17.0 pins a never-written page to `ReadPage::empty(1, "log-1")`
/// (`retention_honoured`), so broca serves that string, with history version 1
/// (retention's `FIRST_HISTORY_VERSION`).
pub const UNWRITTEN_INCARNATION: &str = "log-1";
