//! What deriving any set of a session needs besides the messages it names, kept up to date as
//! the session grows (#50): the part numbers' places and every call's key, from one resumable
//! scan of the WAL, so a read fetches only the message it asks about and the parts that message
//! names, never the whole transcript.
//!
//! Both are append-only: a number once shown never changes ([`super::tags`]: only the newest
//! message's calls may still get numbers, when its results arrive), and a call's key is its
//! dispatch intent's. The scan is [`Reader`]'s own, resumed where it stopped, so the WAL is read
//! once over the life of an index, whatever the number of reads.

use std::collections::HashMap;

use crate::frozen::FrozenConfig;
use crate::lineage::reader::{Reader, Scan, Sink, Start};
use crate::lineage::LineageError;
use crate::message::{Message, Part, Role};
use crate::record::{Frozen, Record};
use crate::replay::Effect;

/// A session's numbering and call keys through its durable end as last read.
pub struct Index {
    /// The WAL's incarnation the scan reads (another one is another session record).
    pub incarnation: String,
    scan: Scan,
    sink: IndexSink,
    /// The serialized size of the scan's replay state, taken when it last moved.
    replay_bytes: usize,
}

/// Whether an index can answer for its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Every message through the durable end was numbered in order.
    Whole,
    /// A message arrived out of order: this index answers nothing (the caller derives the
    /// whole way).
    Broken,
}

impl Index {
    /// An index over the WAL `reader` reads, empty until [`Index::advance`].
    pub fn start(reader: &Reader) -> Result<Index, LineageError> {
        let scan = reader.start(Start::Beginning)?;
        let incarnation = scan.incarnation.clone();
        Ok(Index { incarnation, scan, sink: IndexSink::default(), replay_bytes: 0 })
    }

    /// Reads the records made durable since the last call.
    pub fn advance(&mut self, reader: &Reader) -> Result<Coverage, LineageError> {
        let before = self.scan.replay.last_seq;
        self.scan.resume();
        while !reader.next(&mut self.scan, usize::MAX, &mut self.sink)? {}
        if self.scan.replay.last_seq != before || self.replay_bytes == 0 {
            self.replay_bytes = serde_json::to_vec(&self.scan.replay).map_or(0, |b| b.len());
        }
        Ok(match self.sink.broken {
            true => Coverage::Broken,
            false => Coverage::Whole,
        })
    }

    /// Messages in the session as last read.
    pub fn prompt_len(&self) -> u64 {
        self.scan.replay.prompt_len
    }

    /// The session's frozen config, if its requests show part numbers (its plan is frozen on
    /// its first episode, so the last episode's config is every episode's).
    pub fn numbering_config(&self) -> Option<&FrozenConfig> {
        match self.scan.replay.last.as_ref().map(|e| &e.config) {
            Some(Frozen::Config(c)) if c.renders_part_numbers() => Some(c),
            _ => None,
        }
    }

    /// Each call's key, by the ordinal of the message that asked for it and its id.
    pub fn call_keys(&self) -> &HashMap<(u64, String), String> {
        &self.sink.call_keys
    }

    /// Where the number `n` is, `(ordinal, part)`, if the request of the message at `before`
    /// showed it (numbers of the messages before that one only).
    pub fn place(&self, n: u64, before: u64) -> Option<(u64, usize)> {
        let i = usize::try_from(n.checked_sub(1)?).ok()?;
        let (ordinal, part) = *self.sink.places.get(i)?;
        (ordinal < before).then_some((ordinal, part as usize))
    }

    /// Roughly the bytes this index holds.
    pub fn bytes(&self) -> usize {
        let pending = self.sink.last.as_ref().map_or(0, Pending::bytes);
        std::mem::size_of::<Index>()
            + self.replay_bytes
            + self.sink.places.len() * std::mem::size_of::<(u64, u32)>()
            + self.sink.keys_bytes
            + pending
    }
}

/// The newest message's numbering inputs: its calls get numbers only once the next message
/// (its results) is known.
struct Pending {
    ordinal: u64,
    parts: Vec<Shape>,
}

impl Pending {
    fn bytes(&self) -> usize {
        let ids: usize = self.parts.iter().map(|s| if let Shape::Call(id) = s { id.len() } else { 0 }).sum();
        self.parts.len() * std::mem::size_of::<Shape>() + ids
    }
}

/// A part as numbering sees it ([`super::tags::numbers`]).
enum Shape {
    /// A non-empty user or assistant text: numbered.
    Text,
    /// An assistant's tool call: numbered once the next message holds its result.
    Call(String),
    /// Never numbered.
    Other,
}

/// The scan's sink: numbers placed as messages arrive, call keys as intents do (the pairing of
/// [`crate::lineage::calls::facts`]: an intent belongs to the assistant message of its step).
#[derive(Default)]
struct IndexSink {
    /// Number `n`'s place at `n - 1`: `(ordinal, part)`.
    places: Vec<(u64, u32)>,
    last: Option<Pending>,
    next_ordinal: u64,
    broken: bool,
    /// The step record being applied: its assistant message is the next one derived.
    step_record: Option<(String, u64)>,
    /// `(run_id, step, ordinal)` of the latest assistant message.
    assistant: Option<(String, u64, u64)>,
    call_keys: HashMap<(u64, String), String>,
    keys_bytes: usize,
}

impl IndexSink {
    fn message(&mut self, ordinal: u64, run_id: &str, message: &Message) {
        if message.role == Role::Assistant {
            if let Some((step_run, step)) = self.step_record.take().filter(|(r, _)| r == run_id) {
                self.assistant = Some((step_run, step, ordinal));
            }
        }
        if ordinal != self.next_ordinal {
            self.broken = true;
            return;
        }
        self.next_ordinal += 1;
        if let Some(last) = self.last.take() {
            for (p, shape) in last.parts.iter().enumerate() {
                let numbered = match shape {
                    Shape::Text => true,
                    Shape::Call(id) => answers(message, id),
                    Shape::Other => false,
                };
                if numbered {
                    self.places.push((last.ordinal, u32::try_from(p).unwrap_or(u32::MAX)));
                }
            }
        }
        let parts = message
            .content
            .iter()
            .map(|p| match (message.role, p) {
                (Role::User | Role::Assistant, Part::Text { text }) if !text.is_empty() => Shape::Text,
                (Role::Assistant, Part::ToolCall { tool_call_id, .. }) => Shape::Call(tool_call_id.clone()),
                _ => Shape::Other,
            })
            .collect();
        self.last = Some(Pending { ordinal, parts });
    }
}

/// Whether `next` is the tool message holding the result of the call `id` (as
/// [`super::tags::result_of`] pairs them).
fn answers(next: &Message, id: &str) -> bool {
    next.role == Role::Tool
        && next.content.iter().any(|p| matches!(p, Part::ToolResult { tool_call_id, .. } if tool_call_id == id))
}

impl Sink for IndexSink {
    fn record(&mut self, _seq: u64, record: &Record) -> bool {
        match record {
            Record::ModelStepFinished { run_id, step, .. } => self.step_record = Some((run_id.clone(), *step)),
            Record::ToolDispatchIntent { run_id, step, tool_call_id, call_key, .. } => {
                let asker = self.assistant.as_ref().filter(|(r, s, _)| r == run_id && s == step);
                if let Some(&(_, _, ordinal)) = asker {
                    self.keys_bytes += tool_call_id.len() + call_key.len() + 64;
                    self.call_keys.insert((ordinal, tool_call_id.clone()), call_key.clone());
                }
            }
            _ => {}
        }
        true
    }

    fn effect(&mut self, effect: Effect) {
        if let Effect::Message { ordinal, run_id, message, .. } = effect {
            self.message(ordinal, &run_id, &message);
        }
    }
}
