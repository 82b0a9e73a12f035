//! 64-bit values at the MCP boundary (as `agent-protocol.md` does for its identities): every
//! integer broca answers (cursor `wal_seq`, ordinals, token counts, timestamps, …) goes out as
//! a decimal string, so a JSON reader that keeps numbers as IEEE-754 doubles never rounds one
//! past 2^53. Inputs take a decimal string or an exactly representable JSON integer.
//!
//! The objects broca stores as it was given them are left byte for byte: transcript messages,
//! tool schemas and tool-call arguments ([`OPAQUE_KEYS`]). Refusal bodies are never passed
//! through here: they are relayed verbatim.

use serde_json::{Map, Value};

/// Members whose value is recorded content, not broca's own numbers.
pub const OPAQUE_KEYS: &[&str] = &["message", "input_schema", "args", "arguments"];

/// The largest integer an input may give as a JSON number (2^53 - 1).
pub const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

/// `v` with every integer outside [`OPAQUE_KEYS`] as a decimal string.
pub fn stringify(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_u64() || n.is_i64() => Value::String(n.to_string()),
        Value::Array(items) => Value::Array(items.into_iter().map(stringify).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, child)| {
                    let child = if OPAQUE_KEYS.contains(&k.as_str()) { child } else { stringify(child) };
                    (k, child)
                })
                .collect(),
        ),
        other => other,
    }
}

/// An unsigned integer argument: a decimal string of at most 20 digits that fits in u64, or a
/// JSON integer of at most [`MAX_EXACT_INTEGER`]. `Ok(None)` when absent.
pub fn u64_arg(args: &Map<String, Value>, name: &str) -> Result<Option<u64>, String> {
    match args.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v <= MAX_EXACT_INTEGER => Ok(Some(v)),
            _ => Err(format!("{name}: a non-negative integer of at most {MAX_EXACT_INTEGER}, or a decimal string")),
        },
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u64>().map(Some).map_err(|_| format!("{name}: {s:?} does not fit in 64 bits"))
        }
        Some(_) => Err(format!("{name}: a non-negative integer or its decimal string is required")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn integers_become_strings_outside_recorded_content() {
        let answer = json!({
            "messages": [{"ordinal": 18446744073709551615u64, "mid": "m1",
                          "message": {"role": "user", "content": [{"type": "text", "text": "3"}], "n": 3}}],
            "head": {"wal_seq": 9007199254740993u64, "sub_index": 0},
            "usage": {"input_tokens": 7, "ratio": 0.5},
            "args": {"count": 2},
        });
        let got = stringify(answer);
        assert_eq!(got["messages"][0]["ordinal"], json!("18446744073709551615"));
        assert_eq!(got["messages"][0]["message"]["n"], json!(3));
        assert_eq!(got["head"], json!({"wal_seq": "9007199254740993", "sub_index": "0"}));
        assert_eq!(got["usage"], json!({"input_tokens": "7", "ratio": 0.5}));
        assert_eq!(got["args"], json!({"count": 2}));
    }

    #[test]
    fn integer_arguments_take_strings_and_exact_numbers() {
        let args = json!({"a": "18446744073709551615", "b": 12, "c": 9007199254740992u64, "d": "1e3",
                          "e": -1, "f": "18446744073709551616", "g": ""});
        let args = args.as_object().unwrap();
        assert_eq!(u64_arg(args, "a"), Ok(Some(u64::MAX)));
        assert_eq!(u64_arg(args, "b"), Ok(Some(12)));
        assert_eq!(u64_arg(args, "none"), Ok(None));
        for bad in ["c", "d", "e", "f", "g"] {
            assert!(u64_arg(args, bad).is_err(), "{bad}");
        }
    }
}
