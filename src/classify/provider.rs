//! One provider call per item (spec §4b "Providers"; classifier CONTRACT §8–§9; model-batch
//! RULES §15): TypeSafe's `POST {base}/v1/systemone` and Workers AI's `POST
//! {base}/client/v4/accounts/{account_id}/ai/run/@cf/cloudflare/{model}`, both with the vault's
//! bearer token, both answering `{model, answers, usage?}` (Workers AI inside its `result`
//! envelope).
//!
//! The answers object is kept as the provider's text ([`Answered::answers`]): its numbers reach
//! the reply with the provider's spelling (RULES §12). An error maps to the role's item code
//! once: TypeSafe by HTTP status, Workers AI by `errors[].code` first. broca does not retry a
//! call itself: a transient outcome is stored and the caller's re-send retries it (RULES §4, §11).

use std::time::Duration;

use cortexkit_model_batch::status::{item_code_for_status, workers_ai_item_code};
use cortexkit_role_classifier::errors::{self, ItemError};
use cortexkit_role_classifier::reply::{Answer, Usage};
use cortexkit_role_classifier::IndexMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::models::{Provider, Routed};

/// The whole-call bound of one provider call (connect + answer).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest provider answer read; a larger one is a `provider_error`.
pub const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// The URL one item is posted to.
pub fn endpoint(base: &str, routed: &Routed, account_id: Option<&str>) -> String {
    match routed.provider {
        Provider::TypeSafe => format!("{base}/v1/systemone"),
        Provider::WorkersAi => format!(
            "{base}/client/v4/accounts/{}/ai/run/@cf/cloudflare/{}",
            account_id.unwrap_or_default(),
            routed.wire_model
        ),
    }
}

/// A provider's answer for one item.
#[derive(Debug)]
pub struct Answered {
    /// The `answers` object's JSON text, as the provider sent it.
    pub answers: String,
    pub usage: Option<Usage>,
    /// The model the provider says answered (logged when it is not the one sent).
    pub model: String,
}

/// What one call came to: an answer or the item error it maps to (with the HTTP status, for
/// the health report's "last provider error").
#[derive(Debug)]
pub enum Outcome {
    Answered(Answered),
    Failed { error: ItemError, status: Option<u16> },
}

/// Posts one provider request body and maps the answer. A failure's text never carries the
/// bearer (providers sometimes echo a key back): it is stored, logged and served (#44).
pub fn call(agent: &ureq::Agent, url: &str, routed: &Routed, bearer: &str, body: &[u8]) -> Outcome {
    match post(agent, url, routed, bearer, body) {
        Outcome::Failed { mut error, status } if !bearer.is_empty() => {
            error.message = error.message.replace(bearer, "[redacted]");
            Outcome::Failed { error, status }
        }
        outcome => outcome,
    }
}

fn post(agent: &ureq::Agent, url: &str, routed: &Routed, bearer: &str, body: &[u8]) -> Outcome {
    let request = agent
        .post(url)
        .config()
        .timeout_global(Some(CALL_TIMEOUT))
        .build()
        .header("Authorization", &format!("Bearer {bearer}"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json");
    match request.send(body) {
        // What ureq 2 returned as `Error::Status` (the agent answers every status: `service.rs`).
        Ok(response) if response.status().as_u16() >= 400 => {
            let status = response.status().as_u16();
            let retry_after_ms = retry_after_ms(&response);
            let text = read_body(response).unwrap_or_default();
            let mut error = status_error(routed.provider, status, &text);
            if let (Some(ms), true) = (retry_after_ms, error.class.is_transient()) {
                error = error.with_retry_after_ms(ms);
            }
            Outcome::Failed { error, status: Some(status) }
        }
        Ok(response) => match read_body(response) {
            Ok(text) => answered(routed, &text),
            Err(e) => provider_error(format!("reading {}'s answer: {e}", routed.provider.id()), None),
        },
        Err(t) => provider_error(format!("{} could not be reached: {t}", routed.provider.id()), None),
    }
}

fn provider_error(message: String, status: Option<u16>) -> Outcome {
    Outcome::Failed { error: ItemError::for_code(errors::PROVIDER_ERROR, message), status }
}

fn read_body(response: ureq::http::Response<ureq::Body>) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    response.into_body().into_reader().take(MAX_ANSWER_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_ANSWER_BYTES {
        return Err(std::io::Error::other(format!("the answer is over {MAX_ANSWER_BYTES} bytes")));
    }
    Ok(text)
}

/// `Retry-After` in whole seconds, as milliseconds (capped at an hour; a date is ignored).
fn retry_after_ms(response: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let secs =
        response.headers().get("retry-after")?.to_str().ok()?.trim().parse::<f64>().ok().filter(|s| s.is_finite())?;
    Some((secs.clamp(0.0, 3600.0) * 1000.0).ceil() as u64)
}

#[derive(Deserialize)]
struct ResponseText<'a> {
    model: String,
    #[serde(borrow)]
    answers: &'a RawValue,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    errors: Vec<CloudflareError>,
}

#[derive(Deserialize)]
struct CloudflareError {
    #[serde(default)]
    code: Option<u64>,
    #[serde(default)]
    message: Option<String>,
}

/// A 200's body: the provider response (Workers AI: its envelope's `result`), checked to decode
/// as the role's answers before its text is kept.
fn answered(routed: &Routed, text: &str) -> Outcome {
    let inner = match routed.provider {
        Provider::TypeSafe => Some(text),
        Provider::WorkersAi => match serde_json::from_str::<Envelope>(text) {
            Ok(Envelope { result: Some(result), .. }) => Some(result.get()),
            _ => None,
        },
    };
    let Some(inner) = inner else {
        return provider_error("Workers AI answered 200 without a result".into(), Some(200));
    };
    let response: ResponseText = match serde_json::from_str(inner) {
        Ok(r) => r,
        Err(e) => return provider_error(format!("{}'s answer does not decode: {e}", routed.provider.id()), Some(200)),
    };
    if let Err(e) = serde_json::from_str::<IndexMap<String, Answer>>(response.answers.get()) {
        return provider_error(format!("{}'s answers do not decode: {e}", routed.provider.id()), Some(200));
    }
    if response.model != routed.wire_model {
        log::info!(
            target: "broca.classify",
            "{} answered as model {:?}; broca sent {:?} (answers kept)",
            routed.catalog_id,
            response.model,
            routed.wire_model
        );
    }
    Outcome::Answered(Answered {
        answers: response.answers.get().to_owned(),
        usage: response.usage.filter(|u| !u.is_empty()),
        model: response.model,
    })
}

/// The item error an HTTP error maps to: TypeSafe by status; Workers AI by its first listed
/// `errors[].code`, else by status, an unlisted code named in the message.
pub fn status_error(provider: Provider, status: u16, body: &str) -> ItemError {
    let fallback = errors::PROVIDER_ERROR;
    match provider {
        Provider::TypeSafe => {
            let code = item_code_for_status(status).unwrap_or(fallback);
            ItemError::for_code(code, format!("TypeSafe answered HTTP {status}"))
        }
        Provider::WorkersAi => {
            let errors = serde_json::from_str::<Envelope>(body).map(|e| e.errors).unwrap_or_default();
            let first = errors.iter().find_map(|e| e.code.map(|c| (c, e.message.as_deref().unwrap_or(""))));
            let code = workers_ai_item_code(status, first.map(|(c, _)| c)).unwrap_or(fallback);
            let message = match first {
                Some((c, "")) => format!("Workers AI answered HTTP {status}, code {c}"),
                Some((c, m)) => format!("Workers AI answered HTTP {status}, code {c}: {}", clip(m)),
                None => format!("Workers AI answered HTTP {status}"),
            };
            ItemError::for_code(code, message)
        }
    }
}

/// A provider's message, bounded before it enters a reply or the store.
fn clip(message: &str) -> &str {
    const MAX: usize = 256;
    match message.char_indices().nth(MAX) {
        Some((at, _)) => &message[..at],
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::models::{host_of, ROUTED};

    const JEV: &Routed = &ROUTED[0];
    const CLEF: &Routed = &ROUTED[1];

    #[test]
    fn endpoints_and_hosts() {
        assert_eq!(endpoint("https://api.typesafe.ai", JEV, None), "https://api.typesafe.ai/v1/systemone");
        assert_eq!(
            endpoint("http://127.0.0.1:9", CLEF, Some("acct")),
            "http://127.0.0.1:9/client/v4/accounts/acct/ai/run/@cf/cloudflare/clef"
        );
        assert_eq!(host_of("https://api.cloudflare.com"), "api.cloudflare.com");
        assert_eq!(host_of("http://127.0.0.1:9/x"), "127.0.0.1");
        assert_eq!(host_of("http://[::1]:9"), "::1");
    }

    #[test]
    fn answers_keep_the_provider_s_number_text() {
        let body = r#"{"model":"clef","answers":{"q":{"type":"noul","noul":0.70}},"usage":{"input_tokens":3}}"#;
        let Outcome::Answered(a) = answered(JEV, body) else { panic!() };
        assert_eq!(a.answers, r#"{"q":{"type":"noul","noul":0.70}}"#);
        assert_eq!(a.usage.and_then(|u| u.input_tokens), Some(3));
        let wrapped = format!(r#"{{"result":{body},"success":true,"errors":[],"messages":[]}}"#);
        let Outcome::Answered(a) = answered(CLEF, &wrapped) else { panic!() };
        assert_eq!(a.answers, r#"{"q":{"type":"noul","noul":0.70}}"#);
        assert!(matches!(answered(CLEF, body), Outcome::Failed { .. }), "no envelope");
        assert!(matches!(answered(JEV, r#"{"model":"x","answers":7}"#), Outcome::Failed { .. }));
    }

    #[test]
    fn errors_map_by_status_or_workers_ai_code() {
        let code = |p, s, b: &str| status_error(p, s, b).code;
        assert_eq!(code(Provider::TypeSafe, 401, ""), "auth_failed");
        assert_eq!(code(Provider::TypeSafe, 422, ""), "invalid_item");
        assert_eq!(code(Provider::TypeSafe, 529, ""), "rate_limited");
        let cf = |c: u64| format!(r#"{{"result":null,"success":false,"errors":[{{"code":{c},"message":"m"}}]}}"#);
        assert_eq!(code(Provider::WorkersAi, 429, &cf(3036)), "account_limit_exhausted");
        assert_eq!(code(Provider::WorkersAi, 403, &cf(5016)), "account_not_entitled");
        assert_eq!(code(Provider::WorkersAi, 400, &cf(5007)), "model_unavailable");
        assert_eq!(code(Provider::WorkersAi, 429, &cf(3040)), "rate_limited");
        assert_eq!(code(Provider::WorkersAi, 400, &cf(9999)), "invalid_item");
        assert!(status_error(Provider::WorkersAi, 400, &cf(9999)).message.contains("9999"));
        assert_eq!(code(Provider::WorkersAi, 503, "not json"), "provider_error");
    }

    #[test]
    fn the_published_workers_ai_code_table_is_followed() {
        let text = cortexkit_role_classifier::vectors::WORKERS_AI_CODES_JSON;
        let table: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut checked = 0;
        for case in table["clef"].as_array().into_iter().flatten() {
            let (Some(status), Some(expected)) = (case["status"].as_u64(), case["item_code"].as_str()) else {
                continue;
            };
            let body = match case["code"].as_u64() {
                Some(c) => format!(r#"{{"errors":[{{"code":{c}}}]}}"#),
                None => "{}".into(),
            };
            assert_eq!(status_error(Provider::WorkersAi, status as u16, &body).code, expected, "{case}");
            checked += 1;
        }
        assert!(checked > 0, "the vector file's layout changed: {table}");
    }
}
