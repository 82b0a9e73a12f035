//! Request rendering across a run's steps without re-rendering the whole transcript each time,
//! in every wire family.
//!
//! A loop's transcript only grows, and every step sends all of it: rendering it afresh made the
//! request body the largest non-fsync cost of a step (building a JSON tree of every message,
//! quadratic over a run). Every family renders its transcript as one JSON array of elements
//! ([`WireFamily::render_message`], then [`WireFamily::merge_element`]) inside a body
//! ([`WireFamily::body_around`]); a whole render ([`WireFamily::body`]) and this cache use the
//! same pieces, so the cache renders each message once and splices the elements' bytes into the
//! body rendered around a placeholder (the shell: model, system text, tools).
//!
//! What makes one message's elements depend on others, and how the cache keeps that:
//! - **Earlier and later messages' calls** (a Gemini `functionResponse` names the call it
//!   answers; Converse declares every called tool when the run offers none): a
//!   [`RenderContext`] gathered by a pass over the messages before any is rendered. The cache
//!   notes each step's new messages before rendering them; a new call that would rename a result
//!   already rendered (a result before its call, or a call id reused under another name) makes
//!   the cache start over, since a whole render would name it differently.
//! - **Neighbours** (Converse merges consecutive messages of one role into one turn) and **the
//!   tail's cache marks** (Anthropic marks the last two messages, Converse the last one): the
//!   last elements stay open, as JSON values ([`WireFamily::open_tail`]); a new message may merge
//!   into the last of them, and the marks ([`WireFamily::mark_tail`]) are applied to a copy of
//!   them at every render. Everything before is settled: its bytes are final.
//!
//! Invariant: [`RenderCache::render`] returns exactly the bytes of [`super::render_request`]
//! (the tests compare them, in every family). The cache keeps a transcript only while the
//! next one extends it under the same config; anything else starts it over. A body in which the
//! placeholder is not found exactly once (a variant's member replacing the transcript's array,
//! say) is rendered whole.
//!
//! [`RenderCache::render_appended`] is the loop's entry: its caller promises the transcript only
//! grew since the last call, under the same config, so it compares the newest cached message
//! only (every message in debug builds) instead of the whole transcript at every step.

use serde_json::Value;

use super::config::RenderConfig;
use super::render_context::RenderContext;
use super::wire::{push_element, wire, WireFamily};
use crate::message::Message;

/// Stands in for the rendered transcript in the body; a NUL-delimited string no config holds.
const PLACEHOLDER: &str = "\u{0}broca:rendered-transcript\u{0}";
/// [`PLACEHOLDER`] as it appears in a rendered body: a JSON string (tested).
const MARKER: &[u8] = b"\"\\u0000broca:rendered-transcript\\u0000\"";

/// Rendered elements of one transcript, kept between its requests.
#[derive(Default)]
pub struct RenderCache {
    /// The config (and so the family) everything below was rendered for.
    config: Option<RenderConfig>,
    /// The transcript rendered so far.
    messages: Vec<Message>,
    context: RenderContext,
    /// The settled elements as compact JSON joined by `,`: no later message changes them.
    settled: Vec<u8>,
    /// The elements after them, which a later message may still change (a merge, the marks).
    open: Vec<Value>,
    /// The body rendered around the placeholder, for the context's called tools.
    shell: Option<Shell>,
}

struct Shell {
    /// How many called tools the context held when it was rendered.
    called: usize,
    bytes: Vec<u8>,
    /// The placeholder's offset in `bytes`; `None`: not found exactly once (rendered whole).
    at: Option<usize>,
}

impl RenderCache {
    /// The request body for `config.family` and `transcript`: the bytes
    /// [`super::render_request`] gives.
    pub fn render(&mut self, config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
        let cached = self.messages.len();
        let extends = self.config.as_ref() == Some(config)
            && cached <= transcript.len()
            && self.messages[..] == transcript[..cached];
        if !extends {
            self.start_over(config);
        }
        self.render_extended(config, transcript)
    }

    /// [`Self::render`] for a caller whose `transcript` extends the one of its previous call
    /// and whose `config` is the one of every earlier call (a run's loop): only the newest
    /// cached message is compared (all of them in debug builds, which assert the promise).
    pub fn render_appended(&mut self, config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
        let cached = self.messages.len();
        let extends = self.config.as_ref().is_some_and(|c| c.family == config.family)
            && cached <= transcript.len()
            && (cached == 0 || self.messages[cached - 1] == transcript[cached - 1]);
        debug_assert!(
            !extends || self.messages[..] == transcript[..cached],
            "render_appended: the transcript was edited, not extended"
        );
        debug_assert!(self.config.as_ref().is_none_or(|c| c == config), "render_appended: the config changed");
        if !extends {
            self.start_over(config);
        }
        self.render_extended(config, transcript)
    }

    fn start_over(&mut self, config: &RenderConfig) {
        *self = Self { config: Some(config.clone()), ..Self::default() };
    }

    /// Renders `transcript`, which extends the cached one under the cached config.
    fn render_extended(&mut self, config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
        let family = wire(config.family);
        let new = &transcript[self.messages.len()..];
        let mut fresh = true;
        for m in new {
            fresh &= self.context.note(m);
        }
        if !fresh {
            // A new call renames a result already rendered: as a whole render would, again.
            self.start_over(config);
            self.context = RenderContext::of(transcript);
        }
        for m in &transcript[self.messages.len()..] {
            for element in family.render_message(config, &self.context, m) {
                push_element(family, &mut self.open, element);
            }
            self.context.rendered(m);
            self.messages.push(m.clone());
        }
        let settle = self.open.len() - family.open_tail(&self.open).min(self.open.len());
        let mut serialized = true;
        for element in self.open.drain(..settle) {
            if !self.settled.is_empty() {
                self.settled.push(b',');
            }
            serialized &= serde_json::to_writer(&mut self.settled, &element).is_ok();
        }
        if !serialized {
            // Not reached (a JSON value always serializes); rendered whole, never guessed.
            self.start_over(config);
            return family.render(config, transcript);
        }
        self.spliced(family, config).unwrap_or_else(|| family.render(config, transcript))
    }

    /// The body: the shell with the settled elements and the marked open ones in place of the
    /// placeholder (`None`: the shell has no single placeholder).
    fn spliced(&mut self, family: &dyn WireFamily, config: &RenderConfig) -> Option<Vec<u8>> {
        let called = self.context.called().len();
        if self.shell.as_ref().is_none_or(|s| s.called != called) {
            let body = family.body_around(config, &self.context, vec![Value::String(PLACEHOLDER.into())]);
            let bytes = family.finish(config, body);
            let at = find_once(&bytes, MARKER);
            self.shell = Some(Shell { called, bytes, at });
        }
        let Shell { bytes: shell, at, .. } = self.shell.as_ref()?;
        let (shell, at) = (shell.as_slice(), (*at)?);
        let mut tail = self.open.clone();
        family.mark_tail(config, &mut tail);
        let mut open = Vec::new();
        for (i, element) in tail.iter().enumerate() {
            if i > 0 {
                open.push(b',');
            }
            serde_json::to_writer(&mut open, element).ok()?;
        }
        let mut body = Vec::with_capacity(shell.len() + self.settled.len() + open.len() + 1);
        let after = at + MARKER.len();
        if self.settled.is_empty() && open.is_empty() {
            // The placeholder goes with the comma beside it, if it is beside another element.
            if at > 0 && shell[at - 1] == b',' {
                body.extend_from_slice(&shell[..at - 1]);
                body.extend_from_slice(&shell[after..]);
            } else {
                body.extend_from_slice(&shell[..at]);
                let after = if shell.get(after) == Some(&b',') { after + 1 } else { after };
                body.extend_from_slice(&shell[after..]);
            }
            return Some(body);
        }
        body.extend_from_slice(&shell[..at]);
        body.extend_from_slice(&self.settled);
        if !self.settled.is_empty() && !open.is_empty() {
            body.push(b',');
        }
        body.extend_from_slice(&open);
        body.extend_from_slice(&shell[after..]);
        Some(body)
    }
}

impl RenderCache {
    /// Messages held.
    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.messages.len()
    }

    /// Elements held open (a merge or the marks may still change them).
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
#[test]
fn the_marker_is_the_placeholder_as_json() {
    assert_eq!(serde_json::to_vec(PLACEHOLDER).ok().as_deref(), Some(MARKER));
}

/// The offset of the only occurrence of `needle` in `hay`.
fn find_once(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let mut found = hay.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i);
    let first = found.next()?;
    found.next().is_none().then_some(first)
}
