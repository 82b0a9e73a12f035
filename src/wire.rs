//! Refusal bodies: `{code, message, detail?}` (subc `ErrorBody`). Every field other than `code`
//! and `message` goes inside `detail`. The served bytes of each refusal are pinned by a golden
//! file under `testdata/golden/`, so `detail` keeps its members in the order the spec writes
//! them (a plain JSON map would sort them).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::Value;

/// An ordered `detail` object.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Detail(pub Vec<(&'static str, Value)>);

impl Detail {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl Serialize for Detail {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// Builds a [`Detail`] from `key => value` pairs, in order.
#[macro_export]
macro_rules! detail {
    ($($k:literal => $v:expr),* $(,)?) => {
        $crate::wire::Detail(vec![$(($k, serde_json::json!($v))),*])
    };
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusal {
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
}

impl Refusal {
    pub fn new(code: &str, message: impl Into<String>, detail: Option<Detail>) -> Refusal {
        Refusal { code: code.into(), message: message.into(), detail }
    }

    /// The exact bytes served.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("refusals serialize")
    }
}
