//! Request rendering across a run's steps without re-rendering the whole transcript each time.
//!
//! A loop's transcript only grows, and every step sends all of it: rendering it afresh made the
//! request body the largest non-fsync cost of a step (building a JSON tree of every message,
//! quadratic over a run). For a family whose messages render on their own
//! ([`WireFamily::render_message`]) the cache keeps each message's compact JSON and splices
//! them into the body the family renders around a placeholder.
//!
//! Invariant: [`RenderCache::render`] returns exactly the bytes of [`super::render_request`]
//! (the tests compare them). A cached message is reused only while it equals the transcript's
//! message at its index; a family without per-message rendering, or a body in which the
//! placeholder is not found exactly once, is rendered whole. The body around the transcript (the
//! shell: model, system text, tools) is rendered once per config.
//!
//! [`RenderCache::render_appended`] is the loop's entry: its caller promises the transcript only
//! grew since the last call, under the same config, so it compares the newest cached message
//! only (every message in debug builds) instead of the whole transcript at every step.

use serde_json::Value;

use super::config::RenderConfig;
use super::event::Family;
use super::wire::{wire, WireFamily};
use crate::message::Message;

/// Stands in for the rendered transcript in the body; a NUL-delimited string no config holds.
const PLACEHOLDER: &str = "\u{0}broca:rendered-transcript\u{0}";
/// [`PLACEHOLDER`] as it appears in a rendered body: a JSON string (tested).
const MARKER: &[u8] = b"\"\\u0000broca:rendered-transcript\\u0000\"";

/// Rendered messages of one transcript, kept between its requests.
#[derive(Default)]
pub struct RenderCache {
    family: Option<Family>,
    /// Per message: the message and its elements as compact JSON joined by `,` (maybe empty).
    entries: Vec<(Message, Vec<u8>)>,
    /// The body rendered around the placeholder for `config`, and the placeholder's offset.
    shell: Option<Shell>,
}

struct Shell {
    config: RenderConfig,
    bytes: Vec<u8>,
    at: usize,
}

impl RenderCache {
    /// The request body for `config.family` and `transcript`: the bytes
    /// [`super::render_request`] gives.
    pub fn render(&mut self, config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
        let keep = self.entries.iter().zip(transcript).take_while(|((cached, _), m)| cached == *m).count();
        self.render_keeping(config, transcript, keep, true)
    }

    /// [`Self::render`] for a caller whose `transcript` extends the one of its previous call
    /// and whose `config` is the one of every earlier call (a run's loop): only the newest
    /// cached message is compared (all of them in debug builds, which assert the promise).
    pub fn render_appended(&mut self, config: &RenderConfig, transcript: &[Message]) -> Vec<u8> {
        let cached = self.entries.len();
        let extends =
            cached <= transcript.len() && (cached == 0 || self.entries[cached - 1].0 == transcript[cached - 1]);
        debug_assert!(
            !extends || self.entries.iter().zip(transcript).all(|((c, _), m)| c == m),
            "render_appended: the transcript was edited, not extended"
        );
        debug_assert!(self.shell.as_ref().is_none_or(|s| s.config == *config), "render_appended: the config changed");
        let keep = if extends { cached } else { 0 };
        self.render_keeping(config, transcript, keep, false)
    }

    /// Renders with the first `keep` cached messages reused (they equal the transcript's);
    /// `check_config` compares the cached shell's config with `config`.
    fn render_keeping(
        &mut self,
        config: &RenderConfig,
        transcript: &[Message],
        keep: usize,
        check_config: bool,
    ) -> Vec<u8> {
        let family = wire(config.family);
        if check_config && self.shell.as_ref().is_some_and(|s| s.config != *config) {
            self.shell = None;
        }
        match self.spliced(family, config, transcript, keep) {
            Some(body) => body,
            None => {
                self.entries.clear();
                family.render(config, transcript)
            }
        }
    }

    fn spliced(
        &mut self,
        family: &dyn WireFamily,
        config: &RenderConfig,
        transcript: &[Message],
        keep: usize,
    ) -> Option<Vec<u8>> {
        if self.family != Some(config.family) {
            self.entries.clear();
            self.shell = None;
            self.family = Some(config.family);
        }
        self.entries.truncate(keep);
        for m in &transcript[keep..] {
            let mut bytes = Vec::new();
            for (i, element) in family.render_message(m)?.iter().enumerate() {
                if i > 0 {
                    bytes.push(b',');
                }
                serde_json::to_writer(&mut bytes, element).ok()?;
            }
            self.entries.push((m.clone(), bytes));
        }
        if self.shell.is_none() {
            let bytes = family.render_body(config, vec![Value::String(PLACEHOLDER.into())])?;
            let at = find_once(&bytes, MARKER)?;
            self.shell = Some(Shell { config: config.clone(), bytes, at });
        }
        let Shell { bytes: shell, at, .. } = self.shell.as_ref()?;
        let (shell, at) = (shell.as_slice(), *at);
        let mut elements: Vec<&[u8]> =
            self.entries.iter().map(|(_, b)| b.as_slice()).filter(|b| !b.is_empty()).collect();
        let mut body = Vec::with_capacity(shell.len() + elements.iter().map(|b| b.len() + 1).sum::<usize>());
        if elements.is_empty() {
            // The placeholder goes with the comma before it, if it follows another element.
            let start = if at > 0 && shell[at - 1] == b',' { at - 1 } else { at };
            body.extend_from_slice(&shell[..start]);
        } else {
            body.extend_from_slice(&shell[..at]);
            let last = elements.pop().unwrap_or_default();
            for e in elements {
                body.extend_from_slice(e);
                body.push(b',');
            }
            body.extend_from_slice(last);
        }
        body.extend_from_slice(&shell[at + MARKER.len()..]);
        Some(body)
    }
}

impl RenderCache {
    /// Messages held (a family rendered whole holds none).
    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.entries.len()
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
