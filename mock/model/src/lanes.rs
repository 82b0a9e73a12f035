//! Per-lane state: the FIFO of scripted responses and the bounded log of recorded requests.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::script::{Script, ScriptedResponse};
use broca::provider::event::Family;

/// Recorded requests kept per lane; older ones are dropped (and counted) beyond this.
pub const MAX_RECORDED_PER_LANE: usize = 10_000;

/// One request as the mock received it, recorded before it was answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "RecordedJson", try_from = "RecordedJson")]
pub struct RecordedRequest {
    pub method: String,
    /// The request target as sent (query included).
    pub path: String,
    /// Header names as sent, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// SHA-256 of `body`, lowercase hex.
    pub body_sha256: String,
    /// The family the path names, if any.
    pub family: Option<Family>,
}

impl RecordedRequest {
    pub fn new(
        method: &str,
        path: &str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        family: Option<Family>,
    ) -> RecordedRequest {
        let body_sha256 = sha256_hex(&body);
        RecordedRequest { method: method.into(), path: path.into(), headers, body, body_sha256, family }
    }

    /// The first header of this name, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The control endpoint's form: the body as a UTF-8 string (lossy for other bytes; the hash is
/// always of the bytes received).
#[derive(Serialize, Deserialize)]
struct RecordedJson {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
    body_sha256: String,
    family: Option<Family>,
}

impl From<RecordedRequest> for RecordedJson {
    fn from(r: RecordedRequest) -> RecordedJson {
        RecordedJson {
            method: r.method,
            path: r.path,
            headers: r.headers,
            body: String::from_utf8_lossy(&r.body).into_owned(),
            body_sha256: r.body_sha256,
            family: r.family,
        }
    }
}

impl TryFrom<RecordedJson> for RecordedRequest {
    type Error = String;

    fn try_from(j: RecordedJson) -> Result<RecordedRequest, String> {
        Ok(RecordedRequest {
            method: j.method,
            path: j.path,
            headers: j.headers,
            body: j.body.into_bytes(),
            body_sha256: j.body_sha256,
            family: j.family,
        })
    }
}

#[derive(Default)]
struct Lane {
    pending: VecDeque<ScriptedResponse>,
    requests: VecDeque<RecordedRequest>,
    dropped: u64,
    /// The `Authorization` a model request must carry (the script's `authorization`).
    authorization: Option<String>,
    /// What the lane's provider has cached (`prompt_cache`).
    prompt_cache: super::prompt_cache::PromptCache,
    /// How the next warms are answered (the script's `warms`).
    warms: VecDeque<super::script::WarmScript>,
    /// Provider rules the lane's requests may break (the scripts' `allow_rules`).
    allowed_rules: std::collections::BTreeSet<String>,
    /// The Code Assist account behind the lane (the script's `code_assist`; default: set up).
    code_assist: super::code_assist::AccountState,
    /// The region of the lane's Bedrock endpoint (the script's `aws_region`).
    aws_region: Option<String>,
    /// Its setup requests (`loadCodeAssist`, `onboardUser`, operation reads), kept apart from
    /// `requests` so a lane's model requests stay in their own order.
    setup_requests: VecDeque<RecordedRequest>,
}

/// All lanes, behind one lock held only for queue operations (never across I/O).
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<String, Lane>>,
}

impl Lanes {
    pub(crate) fn install(&self, lane: &str, script: Script) {
        let mut lanes = self.lanes.lock();
        let lane = lanes.entry(lane.to_string()).or_default();
        lane.pending.extend(script.responses);
        lane.warms.extend(script.warms);
        lane.allowed_rules.extend(script.allow_rules);
        if script.authorization.is_some() {
            lane.authorization = script.authorization;
        }
        if script.aws_region.is_some() {
            lane.aws_region = script.aws_region;
        }
        if let Some(account) = script.code_assist {
            lane.code_assist = super::code_assist::AccountState::new(account);
        }
    }

    /// Records a Code Assist setup request and answers it (`super::code_assist`).
    pub(crate) fn code_assist_setup(&self, lane: &str, rest: &str, request: RecordedRequest) -> super::http::Reply {
        let mut lanes = self.lanes.lock();
        let lane = lanes.entry(lane.to_string()).or_default();
        let reply = super::code_assist::answer(&mut lane.code_assist, &request.method, rest, &request.body);
        if lane.setup_requests.len() == MAX_RECORDED_PER_LANE {
            lane.setup_requests.pop_front();
        }
        lane.setup_requests.push_back(request);
        reply
    }

    /// The region a lane's Bedrock requests must be signed for, if the script named one.
    pub(crate) fn aws_region(&self, lane: &str) -> Option<String> {
        self.lanes.lock().get(lane).and_then(|l| l.aws_region.clone())
    }

    pub(crate) fn setup_requests(&self, lane: &str) -> Vec<RecordedRequest> {
        self.lanes.lock().get(lane).map(|l| l.setup_requests.iter().cloned().collect()).unwrap_or_default()
    }

    /// The backend's refusal of a Code Assist request naming `project` on this lane, if any.
    pub(crate) fn code_assist_refusal(&self, lane: &str, project: Option<&str>) -> Option<super::http::Reply> {
        let lanes = self.lanes.lock();
        match lanes.get(lane) {
            Some(l) => super::code_assist::refuse_project(&l.code_assist, project),
            None => super::code_assist::refuse_project(&Default::default(), project),
        }
    }

    /// Whether `header` is what the lane expects (always, when it expects nothing).
    pub(crate) fn authorized(&self, lane: &str, header: Option<&str>) -> bool {
        let lanes = self.lanes.lock();
        match lanes.get(lane).and_then(|l| l.authorization.as_deref()) {
            Some(expected) => header == Some(expected),
            None => true,
        }
    }

    /// Whether the lane's scripts allow breaking the provider rule `id`.
    pub(crate) fn allows(&self, lane: &str, id: &str) -> bool {
        self.lanes.lock().get(lane).is_some_and(|l| l.allowed_rules.contains(id))
    }

    pub(crate) fn record(&self, lane: &str, request: RecordedRequest) {
        let mut lanes = self.lanes.lock();
        let lane = lanes.entry(lane.to_string()).or_default();
        if lane.requests.len() == MAX_RECORDED_PER_LANE {
            lane.requests.pop_front();
            lane.dropped += 1;
        }
        lane.requests.push_back(request);
    }

    /// The next scripted response, or `None` when the FIFO is empty.
    pub(crate) fn pop(&self, lane: &str) -> Option<ScriptedResponse> {
        self.lanes.lock().get_mut(lane).and_then(|l| l.pending.pop_front())
    }

    /// The next warm's scripted answer (a plain one when none is scripted).
    pub(crate) fn pop_warm(&self, lane: &str) -> super::script::WarmScript {
        self.lanes.lock().get_mut(lane).and_then(|l| l.warms.pop_front()).unwrap_or_default()
    }

    pub(crate) fn requests(&self, lane: &str) -> Vec<RecordedRequest> {
        self.lanes.lock().get(lane).map(|l| l.requests.iter().cloned().collect()).unwrap_or_default()
    }

    pub(crate) fn recorded(&self, lane: &str) -> usize {
        self.lanes.lock().get(lane).map_or(0, |l| l.requests.len())
    }

    pub(crate) fn dropped(&self, lane: &str) -> u64 {
        self.lanes.lock().get(lane).map_or(0, |l| l.dropped)
    }

    pub(crate) fn pending(&self, lane: &str) -> usize {
        self.lanes.lock().get(lane).map_or(0, |l| l.pending.len())
    }

    /// What `body` (a `family` request) reads from and writes to the lane's prompt cache.
    pub(crate) fn measure(&self, lane: &str, family: Family, body: &Value) -> super::script::Usage {
        let mut lanes = self.lanes.lock();
        let lane = lanes.entry(lane.to_string()).or_default();
        lane.prompt_cache.measure(family, body, std::time::Instant::now())
    }

    pub(crate) fn reset(&self, lane: &str) {
        self.lanes.lock().remove(lane);
    }
}

#[cfg(test)]
mod tests {
    use super::super::script::{Step, StreamReply};
    use super::*;

    #[test]
    fn recorded_requests_are_capped_oldest_first() {
        let lanes = Lanes::default();
        for i in 0..MAX_RECORDED_PER_LANE + 3 {
            lanes.record("a", RecordedRequest::new("POST", &format!("/{i}"), Vec::new(), Vec::new(), None));
        }
        let got = lanes.requests("a");
        assert_eq!(got.len(), MAX_RECORDED_PER_LANE);
        assert_eq!(got[0].path, "/3");
        assert_eq!(lanes.dropped("a"), 3);
        lanes.reset("a");
        assert_eq!((lanes.requests("a").len(), lanes.dropped("a")), (0, 0));
    }

    #[test]
    fn fifo_pops_in_order_per_lane() {
        let lanes = Lanes::default();
        let reply = |t: &str| ScriptedResponse::Stream(StreamReply::new(vec![Step::Text(t.into())]));
        lanes.install("a", Script { responses: vec![reply("1"), reply("2")], ..Script::default() });
        lanes.install("a", Script::one(reply("3")));
        assert_eq!(lanes.pending("a"), 3);
        assert_eq!(lanes.pop("b"), None);
        for t in ["1", "2", "3"] {
            assert_eq!(lanes.pop("a"), Some(reply(t)));
        }
        assert_eq!(lanes.pop("a"), None);
    }

    #[test]
    fn hashes_and_json_form() {
        let r = RecordedRequest::new("POST", "/v1/messages", vec![("X-A".into(), "1".into())], b"abc".to_vec(), None);
        assert_eq!(r.body_sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(r.header("x-a"), Some("1"));
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["body"], "abc");
        assert_eq!(serde_json::from_value::<RecordedRequest>(j).unwrap(), r);
    }
}
