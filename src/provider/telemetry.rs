//! Attempt content telemetry (spec §14): when real content arrived, the longest gap between
//! content events, byte counts by class, and a top-16 tally of event types.
//!
//! Invariants: a measurement never observed stays absent (never a synthetic zero); the gap
//! fields need two content events; counts are exact until the attempt ends, and only the
//! report truncates the tally to sixteen types plus `other`.

use std::collections::BTreeMap;

use super::event::EventClass;
use crate::record::{AttemptTelemetry, EventTypeCount};

#[derive(Default, Debug, Clone, PartialEq, Eq)]
struct Tally {
    count: u64,
    bytes: u64,
    unknown: bool,
}

#[derive(Default, Debug, Clone)]
pub struct Telemetry {
    first_content_at_ms: Option<u64>,
    last_content_at_ms: Option<u64>,
    max_gap: Option<(u64, u64)>,
    content_bytes: Option<u64>,
    non_content_bytes: Option<u64>,
    after_last_bytes: Option<u64>,
    after_last_events: Option<u64>,
    types: BTreeMap<String, Tally>,
}

fn bump(v: &mut Option<u64>, by: u64) {
    *v = Some(v.unwrap_or(0) + by);
}

impl Telemetry {
    /// Records one decoded event of `bytes` data bytes at `now_ms`.
    pub fn observe(&mut self, class: &EventClass, bytes: u64, now_ms: u64) {
        let t = self.types.entry(class.event_type.clone()).or_default();
        t.count += 1;
        t.bytes += bytes;
        t.unknown |= class.unknown;
        if class.content {
            if let Some(last) = self.last_content_at_ms {
                let gap = now_ms.saturating_sub(last);
                if self.max_gap.is_none_or(|(g, _)| gap > g) {
                    self.max_gap = Some((gap, now_ms));
                }
            }
            self.first_content_at_ms.get_or_insert(now_ms);
            self.last_content_at_ms = Some(now_ms);
            bump(&mut self.content_bytes, bytes);
            // Once content is seen the suffix counters restart from a measured zero.
            self.after_last_bytes = Some(0);
            self.after_last_events = Some(0);
        } else {
            self.non_content(bytes, 1);
        }
    }

    /// Records `count` SSE comments (keep-alives) of `bytes` bytes in all.
    pub fn observe_comments(&mut self, count: u64, bytes: u64) {
        let t = self.types.entry("comment".into()).or_default();
        t.count += count;
        t.bytes += bytes;
        self.non_content(bytes, count);
    }

    fn non_content(&mut self, bytes: u64, events: u64) {
        bump(&mut self.non_content_bytes, bytes);
        if self.last_content_at_ms.is_some() {
            bump(&mut self.after_last_bytes, bytes);
            bump(&mut self.after_last_events, events);
        }
    }

    pub fn last_content_at_ms(&self) -> Option<u64> {
        self.last_content_at_ms
    }

    /// The fields for `model_attempt_finished`, absent when unobserved.
    pub fn report(&self) -> AttemptTelemetry {
        AttemptTelemetry {
            first_content_at_ms: self.first_content_at_ms,
            last_content_at_ms: self.last_content_at_ms,
            max_content_gap_ms: self.max_gap.map(|g| g.0),
            max_content_gap_ended_at_ms: self.max_gap.map(|g| g.1),
            content_bytes: self.content_bytes,
            non_content_bytes: self.non_content_bytes,
            non_content_bytes_after_last_content: self.after_last_bytes,
            events_after_last_content: self.after_last_events,
            event_types: self.tally(),
        }
    }

    /// The top sixteen types by count (ties by name), then `other` for the rest.
    fn tally(&self) -> Vec<EventTypeCount> {
        let mut all: Vec<(&String, &Tally)> = self.types.iter().collect();
        all.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
        let mut out: Vec<EventTypeCount> = all
            .iter()
            .take(16)
            .map(|(name, t)| EventTypeCount {
                event_type: (*name).clone(),
                count: t.count,
                bytes: t.bytes,
                unknown: t.unknown,
            })
            .collect();
        let rest = &all[all.len().min(16)..];
        if !rest.is_empty() {
            let (count, bytes) = rest.iter().fold((0, 0), |(c, b), (_, t)| (c + t.count, b + t.bytes));
            out.push(EventTypeCount { event_type: "other".into(), count, bytes, unknown: false });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn map(t: &Telemetry) -> Value {
        serde_json::to_value(t.report()).unwrap()
    }

    fn class(t: &str, content: bool) -> EventClass {
        EventClass { event_type: t.into(), content, unknown: t.starts_with('x') }
    }

    #[test]
    fn nothing_observed_is_all_absent() {
        assert!(Telemetry::default().report().is_empty());
        let mut t = Telemetry::default();
        t.observe(&class("ping", false), 4, 10);
        let m = map(&t);
        assert!(m.get("first_content_at_ms").is_none() && m.get("content_bytes").is_none());
        assert!(m.get("events_after_last_content").is_none());
        assert_eq!(m["non_content_bytes"], 4);
    }

    #[test]
    fn gaps_and_suffix_counters() {
        let mut t = Telemetry::default();
        t.observe(&class("delta", true), 10, 100);
        assert!(map(&t).get("max_content_gap_ms").is_none(), "one content event has no gap");
        assert_eq!(map(&t)["events_after_last_content"], 0, "a measured zero once content is seen");
        t.observe(&class("delta", true), 10, 150);
        t.observe(&class("delta", true), 10, 400);
        t.observe(&class("delta", true), 10, 420);
        t.observe(&class("xfuture", false), 7, 500);
        let m = map(&t);
        assert_eq!(
            (m["max_content_gap_ms"].clone(), m["max_content_gap_ended_at_ms"].clone()),
            (json!(250), json!(400))
        );
        assert_eq!((m["first_content_at_ms"].clone(), m["last_content_at_ms"].clone()), (json!(100), json!(420)));
        assert_eq!(m["non_content_bytes_after_last_content"], 7);
        assert_eq!(m["event_types"][1], json!({"event_type": "xfuture", "count": 1, "bytes": 7, "unknown": true}));
    }

    #[test]
    fn the_tally_keeps_sixteen_and_buckets_the_rest() {
        let mut t = Telemetry::default();
        for i in 0..20u64 {
            for _ in 0..=i {
                t.observe(&class(&format!("t{i:02}"), false), 1, 0);
            }
        }
        let tally = map(&t)["event_types"].as_array().unwrap().clone();
        assert_eq!(tally.len(), 17);
        assert_eq!(tally[0]["event_type"], "t19");
        assert_eq!(tally[16], json!({"event_type": "other", "count": 1 + 2 + 3 + 4, "bytes": 10}));
    }
}
