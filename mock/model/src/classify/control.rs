//! The stand-in's control routes under `/_mock/classify` (documented in [`classify`](super)).

use serde::Deserialize;
use serde_json::json;

use super::super::http::{Reply, Request};
use super::{percent_decode, ExpectedAuth, Full, Scripted, Stand, MAX_DELAY_MS};

/// Answers one `/_mock/classify…` control request; `rest` is the path after `classify`.
pub(crate) fn control(stand: &Stand, request: &Request, rest: &[&str]) -> Reply {
    match (request.method.as_str(), rest) {
        ("POST", ["script"]) => match parse::<ScriptBody>(&request.body).and_then(ScriptBody::into_script) {
            Ok((key, scripted)) => done(stand.script(&key, scripted)),
            Err(why) => Reply::refusal(400, &format!("invalid classify script: {why}")),
        },
        ("POST", ["auth"]) => match parse::<ExpectedAuth>(&request.body) {
            Ok(auth) => {
                stand.set_auth(auth);
                Reply::empty(204)
            }
            Err(why) => Reply::refusal(400, &format!("invalid classify auth: {why}")),
        },
        ("GET", ["calls"]) => match query_key(&request.target) {
            Ok(Some(key)) => Reply::json(200, &json!({"calls": stand.calls(&key)})),
            Ok(None) => {
                let (total, by_key) = stand.totals();
                Reply::json(200, &json!({"total": total, "by_key": by_key}))
            }
            Err(why) => Reply::refusal(400, why),
        },
        ("GET", ["log"]) => {
            let (calls, dropped) = stand.log();
            let mut reply = Reply::json(200, &serde_json::to_value(&calls).expect("calls serialize"));
            reply.headers.push(("X-Mock-Dropped-Calls".into(), dropped.to_string()));
            reply
        }
        ("GET", ["held"]) => match query_key(&request.target) {
            Ok(Some(key)) => Reply::json(200, &json!({"held": stand.held(&key)})),
            Ok(None) => Reply::refusal(400, "held needs ?key="),
            Err(why) => Reply::refusal(400, why),
        },
        ("POST", ["hold"]) => match parse::<KeyBody>(&request.body) {
            Ok(body) => done(stand.hold(&body.key)),
            Err(why) => Reply::refusal(400, &format!("invalid hold: {why}")),
        },
        ("POST", ["release"]) => match parse::<KeyBody>(&request.body) {
            Ok(body) => {
                stand.release(&body.key);
                Reply::empty(204)
            }
            Err(why) => Reply::refusal(400, &format!("invalid release: {why}")),
        },
        ("POST", ["delay"]) => match parse::<DelayBody>(&request.body) {
            Ok(body) if body.delay_ms <= MAX_DELAY_MS => {
                stand.set_delay(body.delay_ms);
                Reply::empty(204)
            }
            Ok(_) => Reply::refusal(400, &format!("delay_ms is at most {MAX_DELAY_MS}")),
            Err(why) => Reply::refusal(400, &format!("invalid delay: {why}")),
        },
        ("DELETE", []) => {
            stand.reset();
            Reply::empty(204)
        }
        (_, [] | ["script" | "auth" | "calls" | "log" | "held" | "hold" | "release" | "delay"]) => {
            Reply::refusal(405, "method not allowed on this control route")
        }
        _ => Reply::refusal(404, "no such classify control route"),
    }
}

fn done(result: Result<(), Full>) -> Reply {
    match result {
        Ok(()) => Reply::empty(204),
        Err(Full(why)) => Reply::refusal(507, &why),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptBody {
    key: String,
    answer: Option<String>,
    status: Option<u16>,
    retry_after_ms: Option<u64>,
    workers_ai_code: Option<i64>,
}

impl ScriptBody {
    fn into_script(self) -> Result<(String, Scripted), String> {
        let scripted = match (self.answer, self.status) {
            (Some(answer), None) if self.retry_after_ms.is_none() && self.workers_ai_code.is_none() => {
                Scripted::Answer(answer)
            }
            (Some(_), None) => return Err("retry_after_ms and workers_ai_code go with status".into()),
            (None, Some(status)) if (400..=599).contains(&status) => {
                Scripted::Status { status, retry_after_ms: self.retry_after_ms, workers_ai_code: self.workers_ai_code }
            }
            (None, Some(status)) => return Err(format!("status {status} is not 400 to 599")),
            _ => return Err("exactly one of answer and status".into()),
        };
        Ok((self.key, scripted))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyBody {
    key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DelayBody {
    delay_ms: u64,
}

/// The decoded `key` query parameter, if the target has one.
fn query_key(target: &str) -> Result<Option<String>, &'static str> {
    let Some((_, query)) = target.split_once('?') else { return Ok(None) };
    match query.split('&').find_map(|pair| pair.strip_prefix("key=")) {
        Some(encoded) => percent_decode(encoded, true).map(Some).ok_or("the key is not percent-encoded UTF-8"),
        None => Ok(None),
    }
}
