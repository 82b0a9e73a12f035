//! The two System One classifier providers (`classifier/v1`, the role's CONTRACT §9 and
//! model-batch RULES §15) as a scriptable, call-counting stand-in: the provider the published
//! conformance suite (`cortexkit-role-classifier-conformance`) asks a subject to control. Both
//! routes are on the server's root, so broca's provider `base_url` is [`MockServer::url`](super::MockServer::url).
//!
//! # Provider routes
//!
//! | request | provider |
//! |---|---|
//! | `POST /v1/systemone` | TypeSafe |
//! | `POST /client/v4/accounts/<account_id>/ai/run/@cf/cloudflare/<model>` (`@` may be `%40`) | Cloudflare Workers AI |
//!
//! The body is the provider request `{model, state, questions, images?}`: one that is not JSON
//! or has no `state` is answered 400 and not counted (TypeSafe: the mock's `{"error": …}`;
//! Workers AI: the error envelope with code 5004, invalid data). Otherwise the call's **key**
//! is the RFC 8785 (JCS) canonical text of `state` ([`state_key`]: an object's member order
//! does not matter; a string state's key is the JSON string, quotes included); the call is
//! counted under it and logged ([`ClassifyCall`]: number, provider, account id, model,
//! `Authorization`, key, status, arrival time), then, in order:
//!
//! 1. it waits the delay set by `/_mock/classify/delay`;
//! 2. Workers AI: an expected account id other than the path's is answered 404 with Cloudflare's
//!    no-route errors 7003 and 7000;
//! 3. an expected `Authorization` (per provider) other than the header is answered 401 (TypeSafe
//!    bare; Workers AI with code 10000, authentication error);
//! 4. if a hold is pending for the key, the call waits until released ([`HOLD_TIMEOUT`]: then
//!    500);
//! 5. it answers what is scripted for the key *now*:
//!    - `answer` → 200 with the exact bytes (Workers AI:
//!      `{"result":<bytes>,"success":true,"errors":[],"messages":[]}`, the bytes unchanged);
//!    - `status` → that status, with `Retry-After: <seconds, rounded up>` when
//!      `retry_after_ms` is given; TypeSafe has no body; Workers AI the envelope
//!      `{"result":null,"success":false,"errors":[{"code":<workers_ai_code>,"message":…}],"messages":[]}`,
//!      `errors` empty when no code is scripted;
//!    - nothing scripted → 500 (TypeSafe bare, Workers AI the envelope with no errors), with
//!      the header `x-broca-mock: unscripted`.
//!
//! Another method on these paths is answered 405, uncounted.
//!
//! # Control routes
//!
//! | request | answer |
//! |---|---|
//! | `POST /_mock/classify/script` `{"key", "answer": "<exact body text>"}` or `{"key", "status", "retry_after_ms"?, "workers_ai_code"?}` | 204; replaces what the key answers from now on (`status` 400 to 599) |
//! | `POST /_mock/classify/auth` `{"typesafe"?: "Bearer …", "workers_ai"?: "Bearer …", "account_id"?}` | 204; replaces the expected credentials (absent: not checked) |
//! | `GET /_mock/classify/calls?key=<percent-encoded key>` | 200 `{"calls": n}` (`+` decodes as a space) |
//! | `GET /_mock/classify/calls` | 200 `{"total": n, "by_key": {key: n}}` |
//! | `GET /_mock/classify/log` | 200, JSON array of [`ClassifyCall`], oldest first; header `X-Mock-Dropped-Calls` |
//! | `POST /_mock/classify/hold` `{"key"}` | 204; the key's next call waits until released |
//! | `GET /_mock/classify/held?key=…` | 200 `{"held": bool}`: whether a call for the key is waiting now |
//! | `POST /_mock/classify/release` `{"key"}` | 204; the key's waiting calls answer; with none waiting, a pending hold is cancelled |
//! | `POST /_mock/classify/delay` `{"delay_ms"}` | 204; every later call waits that long first (default 0, at most [`MAX_DELAY_MS`]) |
//! | `DELETE /_mock/classify` | 204; everything above forgotten, waiting calls released (call numbers keep rising) |
//!
//! A malformed control body is answered 400 `{"error": …}`. Bounds: [`MAX_SCRIPTED_KEYS`]
//! scripted keys and [`MAX_PENDING_HOLDS`] pending holds (507 beyond), [`MAX_COUNTED_KEYS`]
//! counted keys (a call for another key is answered 507, uncounted), [`MAX_LOGGED_CALLS`]
//! logged calls (older ones dropped and counted).
//!
//! # File log
//!
//! With [`MockOptions::classify_log`](super::MockOptions::classify_log) (`broca-mock
//! --classify-log PATH`) every counted call, once answered, is appended to the file as one
//! JSON line `{"n", "provider", "key", "status", "at_ms"}` (one write per line, O_APPEND), so a
//! test can count outside broca, across broca's restarts, how often each item was asked.

mod control;
mod stand;
#[cfg(test)]
mod tests;

pub(crate) use control::control;

pub use stand::{
    state_key, ClassifyCall, ExpectedAuth, Full, Provider, Scripted, Stand, HOLD_TIMEOUT, MAX_COUNTED_KEYS,
    MAX_DELAY_MS, MAX_LOGGED_CALLS, MAX_PENDING_HOLDS, MAX_SCRIPTED_KEYS,
};

use serde_json::{json, Value};

use super::http::{self, Reply, Request, Stopping};
use stand::HoldEnd;

/// A provider path: TypeSafe, or Workers AI with its account id and model.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    TypeSafe,
    WorkersAi { account_id: String, model: String },
}

impl Route {
    fn provider(&self) -> Provider {
        match self {
            Route::TypeSafe => Provider::TypeSafe,
            Route::WorkersAi { .. } => Provider::WorkersAi,
        }
    }
}

/// The provider route `path` names, if any.
pub(crate) fn route(path: &str) -> Option<Route> {
    if path == "/v1/systemone" {
        return Some(Route::TypeSafe);
    }
    let rest = path.strip_prefix("/client/v4/accounts/")?;
    let (account, rest) = rest.split_once('/')?;
    let model = rest.strip_prefix("ai/run/")?;
    let model = model.strip_prefix("@cf/cloudflare/").or_else(|| model.strip_prefix("%40cf/cloudflare/"))?;
    let (account_id, model) = (percent_decode(account, false)?, percent_decode(model, false)?);
    let segment = |s: &str| !s.is_empty() && !s.contains('/');
    (segment(&account_id) && segment(&model)).then_some(Route::WorkersAi { account_id, model })
}

/// Answers one provider call; `None` when the server stopped while the call waited (close
/// the connection without an answer).
pub(crate) fn answer(stand: &Stand, stopping: &Stopping, request: &Request, route: Route) -> Option<Reply> {
    let provider = route.provider();
    if request.method != "POST" {
        return Some(Reply::refusal(405, "the classifier provider routes take POST"));
    }
    let body = match serde_json::from_slice::<Value>(&request.body) {
        Ok(body) => body,
        Err(_) => return Some(malformed(provider, "the body is not JSON")),
    };
    let Some(state) = body.get("state") else { return Some(malformed(provider, "the body has no state")) };
    let key = state_key(state);
    let authorization = request.header("authorization").map(str::to_owned);
    let (account_id, model) = match &route {
        Route::TypeSafe => (None, body.get("model").and_then(Value::as_str).map(str::to_owned)),
        Route::WorkersAi { account_id, model } => (Some(account_id.clone()), Some(model.clone())),
    };
    let (n, at_ms) = match stand.arrive(provider, account_id.clone(), model, authorization.clone(), key.clone()) {
        Ok(arrived) => arrived,
        Err(Full(why)) => return Some(Reply::refusal(507, &why)),
    };
    let reply = decide(stand, stopping, provider, &key, account_id.as_deref(), authorization.as_deref())?;
    stand.finish(n, provider, &key, at_ms, reply.status);
    Some(reply)
}

/// Steps 1 to 5 of the module doc, after the call is counted.
fn decide(
    stand: &Stand,
    stopping: &Stopping,
    provider: Provider,
    key: &str,
    account_id: Option<&str>,
    authorization: Option<&str>,
) -> Option<Reply> {
    if !http::pause(stand.delay_ms(), stopping) {
        return None;
    }
    let expected = stand.auth();
    if let (Some(want), Some(got)) = (&expected.account_id, account_id) {
        if want != got {
            log::info!("broca-mock: a Workers AI call names account {got:?}, not the expected one; 404");
            let route = format!(
                "Could not route to /client/v4/accounts/{got}/ai/run, perhaps your object identifier is invalid?"
            );
            let errors = json!([{"code": 7003, "message": route}, {"code": 7000, "message": "No route for that URI"}]);
            return Some(envelope_error(404, errors));
        }
    }
    let want = match provider {
        Provider::TypeSafe => &expected.typesafe,
        Provider::WorkersAi => &expected.workers_ai,
    };
    if want.as_deref().is_some_and(|want| Some(want) != authorization) {
        log::info!("broca-mock: a {provider:?} call's Authorization is not the expected credential; 401");
        return Some(match provider {
            Provider::TypeSafe => Reply::empty(401),
            Provider::WorkersAi => envelope_error(401, json!([{"code": 10000, "message": "Authentication error"}])),
        });
    }
    match stand.wait_if_held(key, stopping) {
        HoldEnd::NotHeld | HoldEnd::Released => {}
        HoldEnd::Stopped => return None,
        HoldEnd::TimedOut => {
            log::warn!("broca-mock: a held classifier call was not released within {HOLD_TIMEOUT:?}; 500");
            return Some(tagged(render(provider, &unscripted()), "hold-timeout"));
        }
    }
    Some(match stand.scripted(key) {
        Some(scripted) => render(provider, &scripted),
        None => tagged(render(provider, &unscripted()), "unscripted"),
    })
}

fn unscripted() -> Scripted {
    Scripted::Status { status: 500, retry_after_ms: None, workers_ai_code: None }
}

fn tagged(mut reply: Reply, why: &str) -> Reply {
    reply.headers.push(("x-broca-mock".into(), why.into()));
    reply
}

/// The provider's reply for what a key is scripted to answer.
pub(crate) fn render(provider: Provider, scripted: &Scripted) -> Reply {
    match (provider, scripted) {
        (Provider::TypeSafe, Scripted::Answer(body)) => json_bytes(200, body.as_bytes().to_vec()),
        (Provider::WorkersAi, Scripted::Answer(body)) => {
            let mut bytes = Vec::with_capacity(body.len() + 64);
            bytes.extend_from_slice(br#"{"result":"#);
            bytes.extend_from_slice(body.as_bytes());
            bytes.extend_from_slice(br#","success":true,"errors":[],"messages":[]}"#);
            json_bytes(200, bytes)
        }
        (_, Scripted::Status { status, retry_after_ms, workers_ai_code }) => {
            let mut reply = match provider {
                Provider::TypeSafe => Reply::empty(*status),
                Provider::WorkersAi => {
                    let errors: Vec<Value> =
                        workers_ai_code.iter().map(|c| json!({"code": c, "message": code_message(*c)})).collect();
                    envelope_error(*status, Value::Array(errors))
                }
            };
            if let Some(ms) = retry_after_ms {
                reply.headers.push(("Retry-After".into(), ms.div_ceil(1000).to_string()));
            }
            reply
        }
    }
}

fn json_bytes(status: u16, body: Vec<u8>) -> Reply {
    Reply { status, headers: vec![("Content-Type".into(), "application/json".into())], body }
}

/// Cloudflare's error envelope.
fn envelope_error(status: u16, errors: Value) -> Reply {
    Reply::json(status, &json!({"result": null, "success": false, "errors": errors, "messages": []}))
}

/// A 400 for a request the provider cannot read.
fn malformed(provider: Provider, why: &str) -> Reply {
    log::info!("broca-mock: a {provider:?} call is malformed: {why}; 400");
    match provider {
        Provider::TypeSafe => Reply::refusal(400, why),
        Provider::WorkersAi => envelope_error(400, json!([{"code": 5004, "message": format!("Invalid data: {why}")}])),
    }
}

/// The message Workers AI gives with `code` (RULES §15's table), or a generic one.
fn code_message(code: i64) -> &'static str {
    match code {
        3003 => "Incomplete request",
        3006 => "Request is too large",
        3007 => "Timeout",
        3008 => "Aborted",
        3023 => "Account blocked",
        3036 => "Account limited: you have used up your daily free allocation of 10,000 neurons",
        3040 => "Capacity temporarily exceeded, please try again",
        3042 => "No such model",
        5004 => "Invalid data",
        5007 => "No such model",
        5016 => "You must agree to the model's license before using it",
        5035 => "This model requires a paid plan",
        _ => "broca-mock scripted error",
    }
}

/// Percent-decodes `s` (with `plus_space`, `+` is a space, as in a form-encoded query).
pub(crate) fn percent_decode(s: &str, plus_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 3;
                continue;
            }
            b'+' if plus_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}
