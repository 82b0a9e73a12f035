//! Classifying provider errors into the role's four classes, for pre-stream HTTP failures
//! ([`classify_http_error`]) and for errors reported inside a 200 stream ([`stream_error`]).
//!
//! Classes: `transient` (retry may succeed: overload, rate limit, server fault, timeout),
//! `auth_required` (the credential is missing, wrong or expired: pause for re-auth),
//! `context_overflow` (the prompt does not fit the model's window), `permanent` (the request
//! itself is wrong, forbidden or unpayable: retrying cannot help).
//!
//! Invariant: classification never panics and never reads more than the body it is given; a body
//! that is not JSON still yields an error with its (truncated) text as the message.

use serde_json::Value;

use super::common::{at, str_at};
use super::event::{Family, StreamEvent};
use crate::record::{ErrorClass, ProviderError};

/// The longest message taken from a non-JSON error body.
const MAX_RAW_MESSAGE: usize = 512;

/// The class a provider error code or type names, if it names one.
fn class_of_code(code: &str) -> Option<ErrorClass> {
    let code = code.to_ascii_lowercase();
    Some(match code.as_str() {
        "context_length_exceeded" | "model_context_window_exceeded" | "context_window_exceeded" => {
            ErrorClass::ContextOverflow
        }
        "authentication_error"
        | "invalid_api_key"
        | "invalid_authentication"
        | "unauthorized"
        | "unauthenticated"
        | "expired_token"
        | "token_expired" => ErrorClass::AuthRequired,
        "overloaded_error"
        | "overloaded"
        | "api_error"
        | "server_error"
        | "internal_error"
        | "internal_server_error"
        | "rate_limit_error"
        | "rate_limit_exceeded"
        | "timeout_error"
        | "timeout"
        | "service_unavailable"
        | "server_is_overloaded"
        | "slow_down" => ErrorClass::Transient,
        "invalid_request_error"
        | "permission_error"
        | "permission_denied"
        | "not_found_error"
        | "not_found"
        | "model_not_found"
        | "billing_error"
        | "insufficient_quota"
        | "request_too_large" => ErrorClass::Permanent,
        c if c.starts_with("invalid_") => ErrorClass::Permanent,
        _ => return None,
    })
}

/// Whether a message says the prompt exceeds the context window (providers that report it only
/// as an `invalid_request_error` with prose, e.g. Anthropic's "prompt is too long").
fn mentions_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["prompt is too long", "context length", "context window", "context_length_exceeded", "input is too long"]
        .iter()
        .any(|needle| m.contains(needle))
}

/// The class named by `code` then `kind`, refined to `context_overflow` when a request-shaped
/// (or unnamed) error says so in prose.
fn named_class(code: Option<&str>, kind: Option<&str>, message: &str) -> Option<ErrorClass> {
    let named = code.and_then(class_of_code).or_else(|| kind.and_then(class_of_code));
    match named {
        None | Some(ErrorClass::Permanent) if mentions_context_overflow(message) => Some(ErrorClass::ContextOverflow),
        other => other,
    }
}

/// An error reported inside a 200 stream, as a [`StreamEvent::Error`].
///
/// `code` is the provider's specific code (OpenAI `code`), `kind` its category (`type`). An error
/// whose code and type are both unknown is `transient`: a failure after the provider accepted the
/// request is most often its own, and the retry budget bounds the cost of being wrong.
pub(crate) fn stream_error(code: Option<&str>, kind: Option<&str>, message: Option<&str>) -> StreamEvent {
    stream_error_with_status(code, kind, None, message)
}

/// [`stream_error`] for an error that also carries the HTTP status it stands for, as a number
/// where a code belongs: OpenRouter's mid-stream `{"error": {"code": 400, …}}` (its error docs:
/// the code is the HTTP status), Google's `{"error": {"code": 503, "status": …}}`. When the names
/// classify nothing, the status does, as [`classify_http_error`] classifies it; the status is
/// the provider code when nothing else names the error.
pub(crate) fn stream_error_with_status(
    code: Option<&str>,
    kind: Option<&str>,
    status: Option<u64>,
    message: Option<&str>,
) -> StreamEvent {
    let message = message.filter(|m| !m.is_empty()).unwrap_or("the provider reported an error mid-stream");
    let by_status = || match status? {
        401 => Some(ErrorClass::AuthRequired),
        408 | 409 | 429 | 500..=599 => Some(ErrorClass::Transient),
        400..=499 => Some(ErrorClass::Permanent),
        _ => None,
    };
    let class = named_class(code, kind, message).or_else(by_status).unwrap_or(ErrorClass::Transient);
    StreamEvent::Error {
        error: ProviderError::new(
            class,
            code.or(kind).map(String::from).or_else(|| status.map(|s| s.to_string())),
            message.to_string(),
            None,
        ),
    }
}

/// The fields of an error body: `{"error":{"type","code","message"}}` (Anthropic, OpenAI and
/// most compatibles), `{"error":"text"}`, a Google-style `{"error":{"code":400,"status":…}}`, a
/// top-level `message`/`detail`, or a one-element array of any of these.
struct ErrorBody {
    code: Option<String>,
    kind: Option<String>,
    message: Option<String>,
    /// When an account limit resets (the ChatGPT backend's `error.resets_in_seconds`).
    resets_in_s: Option<u64>,
}

impl ErrorBody {
    fn parse(body: &[u8]) -> ErrorBody {
        let mut parsed = ErrorBody { code: None, kind: None, message: None, resets_in_s: None };
        let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if !text.is_empty() {
                let mut end = text.len().min(MAX_RAW_MESSAGE);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                parsed.message = Some(text[..end].to_string());
            }
            return parsed;
        };
        if let Value::Array(items) = &mut v {
            v = items.first().cloned().unwrap_or(Value::Null);
        }
        let own = |x: Option<&str>| x.filter(|s| !s.is_empty()).map(String::from);
        match at(&v, &["error"]) {
            Some(Value::String(s)) => parsed.message = own(Some(s)),
            Some(err @ Value::Object(_)) => {
                parsed.code = own(str_at(err, &["code"])).or_else(|| own(str_at(err, &["status"])));
                parsed.kind = own(str_at(err, &["type"]));
                parsed.message = own(str_at(err, &["message"]));
            }
            _ => {}
        }
        if parsed.message.is_none() {
            parsed.message = own(str_at(&v, &["message"])).or_else(|| own(str_at(&v, &["detail"])));
        }
        if parsed.code.is_none() {
            parsed.code = own(str_at(&v, &["code"]));
        }
        // AWS: `{"message"|"Message", "__type": "<namespace>#<Exception>"}`.
        if parsed.message.is_none() {
            parsed.message = own(str_at(&v, &["Message"]));
        }
        if parsed.kind.is_none() {
            parsed.kind = own(str_at(&v, &["__type"]).map(|t| t.rsplit('#').next().unwrap_or(t)));
        }
        parsed.resets_in_s = at(&v, &["error", "resets_in_seconds"]).and_then(Value::as_u64);
        parsed
    }

    fn names(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code) || self.kind.as_deref() == Some(code)
    }
}

/// Whether a Bedrock 403 says the credential itself is bad (an unknown, expired or malformed key
/// or signature: `UnrecognizedClientException`, `InvalidSignatureException`,
/// `ExpiredTokenException`, a bearer key "Authentication failed"), not that a good one lacks a
/// permission (`AccessDeniedException`, which stays permanent).
fn bedrock_credential_refused(parsed: &ErrorBody, message: &str) -> bool {
    let named = [
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
        "IncompleteSignatureException",
    ];
    if named.iter().any(|n| parsed.names(n)) {
        return true;
    }
    let m = message.to_ascii_lowercase();
    !parsed.names("AccessDeniedException")
        && ["security token", "api key", "signature", "authentication failed", "token has expired", "bearer token"]
            .iter()
            .any(|needle| m.contains(needle))
}

/// Classifies a failure the provider answered with before any stream byte (a non-2xx status).
///
/// 401 is `auth_required`, as is any other 4xx whose body names an authentication type/code (a
/// 403 `permission_error` stays `permanent`). 408, 409, 429 and 5xx (Anthropic's 529 included)
/// are `transient`, the statuses both official SDKs retry; except that a 429 `insufficient_quota`
/// is a billing state, not a rate, and is `permanent`. A 4xx whose code or message reports a
/// context-length overflow is `context_overflow`; any other status is `permanent`.
/// `provider_code` is the body's error `code`, else its `type`; `http_status` is `status`.
pub fn classify_http_error(family: Family, status: u16, body: &[u8]) -> ProviderError {
    let parsed = ErrorBody::parse(body);
    let message = parsed.message.clone().unwrap_or_else(|| format!("{} returned HTTP {status}", family.as_str()));
    let named = named_class(parsed.code.as_deref(), parsed.kind.as_deref(), &message);
    let quota = parsed.code.as_deref() == Some("insufficient_quota");
    // The ChatGPT backend's account limit: its plan's usage is spent until a reset time, so a
    // retry cannot succeed now (#46; OpenAI's Codex client reads it as `UsageLimitReached`).
    let usage_limit = parsed.names("usage_limit_reached") || parsed.names("usage_not_included");
    let message = match (usage_limit, parsed.resets_in_s) {
        (true, Some(s)) => format!("{message} (the account's usage limit resets in {s} s)"),
        _ => message,
    };
    let class = match status {
        401 => ErrorClass::AuthRequired,
        429 if quota => ErrorClass::Permanent,
        _ if usage_limit => ErrorClass::Permanent,
        403 if family == Family::AwsBedrockConverse && bedrock_credential_refused(&parsed, &message) => {
            ErrorClass::AuthRequired
        }
        408 | 409 | 429 | 500..=599 => ErrorClass::Transient,
        400..=499 => match named {
            Some(c @ (ErrorClass::AuthRequired | ErrorClass::ContextOverflow)) => c,
            _ => ErrorClass::Permanent,
        },
        _ => ErrorClass::Permanent,
    };
    ProviderError::new(class, parsed.code.or(parsed.kind), message, Some(status))
}
