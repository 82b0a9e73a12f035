//! The classifier route: one `route.open` through the daemon to broca's management surface,
//! declaring `role_versions {"classifier": "v1"}`, under the run scope the scope authority
//! synced (so the daemon stamps broca's bind with `agent_id` and `run_id`), with the official
//! consumer SDK. Every request is a real `REQUEST` on that route.
//!
//! The request body is built as text, `{"method": <method>, "params": <params>}`, with the
//! suite's params inserted byte for byte (a re-send with its object keys in another order must
//! reach broca in that order). broca answers `{"result": <reply>}` on its management surface;
//! the adapter returns the `result` member's text exactly as it arrived (a raw slice of the
//! body, never decoded and re-encoded), so number spellings reach the suite unchanged. An
//! `ERROR` frame is returned as its body.

use std::sync::Arc;

use async_trait::async_trait;
use cortexkit_role_classifier_conformance::{ClassifierRoute, Reply, RouteFailure};
use serde_json::value::RawValue;
use subc_client_rs::{CallError, RouteHandle, SubcConsumer};

use crate::rig;

pub struct Route {
    pub consumer: Arc<SubcConsumer>,
    pub handle: RouteHandle,
}

/// The request body, as text.
pub fn body(method: &str, params: &str) -> String {
    let method = serde_json::to_string(method).expect("a string encodes");
    format!(r#"{{"method":{method},"params":{params}}}"#)
}

/// The text of the `result` member of a `RESPONSE` body, exactly as sent.
pub fn result_text(bytes: &[u8]) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        result: &'a RawValue,
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("the reply is not UTF-8: {e}"))?;
    let envelope: Envelope =
        serde_json::from_str(text).map_err(|e| format!("the reply is not {{\"result\": ...}}: {e}: {text}"))?;
    Ok(envelope.result.get().to_owned())
}

#[async_trait]
impl ClassifierRoute for Route {
    async fn request(&self, method: &str, params: &str) -> Result<Reply, RouteFailure> {
        let body = body(method, params).into_bytes();
        match self.consumer.request(&self.handle, body, rig::call_options()).await {
            Ok(bytes) => {
                result_text(&bytes).map(Reply::Response).map_err(|e| RouteFailure::new(format!("{method}: {e}")))
            }
            Err(CallError::Module(body)) => Ok(Reply::Error(body)),
            Err(e) => Err(RouteFailure::new(format!("{method}: {e}"))),
        }
    }
}
