//! Refusal bodies: `{code, message, detail?}` (subc `ErrorBody`). Every field other than `code`
//! and `message` goes inside `detail`. The served bytes of each refusal are pinned by a golden
//! file under `testdata/golden/`.

use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusal {
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

impl Refusal {
    pub fn new(code: &str, message: impl Into<String>, detail: Option<Value>) -> Refusal {
        Refusal { code: code.into(), message: message.into(), detail }
    }

    /// The exact bytes served.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("refusals serialize")
    }
}
