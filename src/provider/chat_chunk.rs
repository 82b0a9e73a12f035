//! The members of a Chat Completions stream chunk the decoder reads, in two ways to one view.
//!
//! [`ChunkView`] is what [`super::openai_chat::ChatDecoder`] acts on: choice 0's delta and
//! finish reason, the chunk's `object`, and whether it had `choices`. [`fast`] reads the common
//! chunk shape straight into typed, borrowed fields (no JSON tree: the streamer's largest cost
//! per step was building one per chunk); [`from_value`] reads any chunk through a JSON tree.
//!
//! Invariant: for every chunk [`fast`] accepts, its view equals [`from_value`]'s (tested over
//! every recorded stream and hostile variants). So [`fast`] refuses whatever the tree reading
//! treats leniently: an error or usage member, a member of another type than the common one, an
//! integral float for an index, a duplicate member, an array where an object belongs. The
//! decoder then reads the tree.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::common::{str_at, u64_at};

/// What the decoder reads of one chunk.
#[derive(Debug, Default, PartialEq)]
pub struct ChunkView<'a> {
    /// `object`, when it is a string.
    pub object: Option<Cow<'a, str>>,
    /// Whether the chunk has a `choices` array.
    pub has_choices: bool,
    /// The first choice whose `index` is 0 (or absent).
    pub choice: Option<ChoiceView<'a>>,
    /// `service_tier`: the level the provider says served the request.
    pub service_tier: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, PartialEq)]
pub struct ChoiceView<'a> {
    pub content: Option<Cow<'a, str>>,
    /// `reasoning_content`, else `reasoning`.
    pub reasoning: Option<Cow<'a, str>>,
    pub refusal: Option<Cow<'a, str>>,
    pub tool_calls: Vec<CallView<'a>>,
    pub finish_reason: Option<Cow<'a, str>>,
}

/// One `tool_calls` fragment.
#[derive(Debug, Default, PartialEq)]
pub struct CallView<'a> {
    pub index: Option<u64>,
    pub id: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
    pub arguments: Option<Cow<'a, str>>,
}

/// The common chunk shape, or `None` (read the tree instead).
pub fn fast(data: &str) -> Option<ChunkView<'_>> {
    let Obj(chunk) = serde_json::from_str::<Obj<Chunk<'_>>>(data).ok()?;
    if chunk.error.is_some() || chunk.usage.is_some() {
        return None;
    }
    let has_choices = chunk.choices.is_some();
    let choice = chunk.choices.into_iter().flatten().map(|Obj(c)| c).find(|c| c.index.unwrap_or(0) == 0).map(|c| {
        let d = c.delta.map(|Obj(d)| d).unwrap_or_default();
        ChoiceView {
            content: d.content,
            reasoning: d.reasoning_content.or(d.reasoning),
            refusal: d.refusal,
            tool_calls: d
                .tool_calls
                .into_iter()
                .flatten()
                .map(|Obj(tc)| {
                    let f = tc.function.map(|Obj(f)| f).unwrap_or_default();
                    CallView { index: tc.index, id: tc.id, name: f.name, arguments: f.arguments }
                })
                .collect(),
            finish_reason: c.finish_reason,
        }
    });
    Some(ChunkView { object: chunk.object, has_choices, choice, service_tier: chunk.service_tier })
}

/// Any chunk, read through its JSON tree.
pub fn from_value(data: &Value) -> ChunkView<'_> {
    let choices = data.get("choices").and_then(Value::as_array);
    let choice = choices.and_then(|cs| cs.iter().find(|c| u64_at(c, &["index"]).unwrap_or(0) == 0)).map(|c| {
        let delta = c.get("delta").unwrap_or(&Value::Null);
        let text = |path: &[&str]| str_at(delta, path).map(Cow::Borrowed);
        ChoiceView {
            content: text(&["content"]),
            reasoning: text(&["reasoning_content"]).or_else(|| text(&["reasoning"])),
            refusal: text(&["refusal"]),
            tool_calls: delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|tc| CallView {
                    index: u64_at(tc, &["index"]),
                    id: str_at(tc, &["id"]).map(Cow::Borrowed),
                    name: str_at(tc, &["function", "name"]).map(Cow::Borrowed),
                    arguments: str_at(tc, &["function", "arguments"]).map(Cow::Borrowed),
                })
                .collect(),
            finish_reason: str_at(c, &["finish_reason"]).map(Cow::Borrowed),
        }
    });
    ChunkView {
        object: str_at(data, &["object"]).map(Cow::Borrowed),
        has_choices: choices.is_some(),
        choice,
        service_tier: str_at(data, &["service_tier"]).map(Cow::Borrowed),
    }
}

/// A `T` read from a JSON object only (a derived struct alone also accepts an array).
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Obj<T>, D::Error> {
        struct ObjectOnly<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOnly<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        deserializer.deserialize_map(ObjectOnly(PhantomData))
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<Obj<Choice<'a>>>>,
    #[serde(default)]
    usage: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default)]
    service_tier: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<Obj<Delta<'a>>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Default, Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<Obj<ToolCall<'a>>>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<Obj<Function<'a>>>,
}

#[derive(Default, Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both readings of `data`: the fast one (if it accepts) must equal the tree's.
    fn agree(data: &str) -> bool {
        let tree: Value = match serde_json::from_str(data) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                assert!(fast(data).is_none(), "not an object, read fast: {data}");
                return false;
            }
        };
        match fast(data) {
            Some(view) => {
                assert_eq!(view, from_value(&tree), "{data}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn the_common_shape_is_read_fast_and_as_the_tree_reads_it() {
        let common = [
            r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"read","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"p\":\"a\\u00e9\"}"}}]}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other"}},{"delta":{"reasoning_content":"think","reasoning":"no"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"refusal":"no"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"index":0,"delta":null,"finish_reason":"tool_calls"}],"usage":null,"error":null}"#,
            r#"{"choices":[]}"#,
            r#"{"object":null}"#,
        ];
        for data in common {
            assert!(agree(data), "read fast: {data}");
        }
    }

    #[test]
    fn whatever_the_tree_reads_leniently_is_left_to_it() {
        let lenient = [
            r#"{"choices":[{"index":0.0,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[7,{"delta":{"content":"x"}}]}"#,
            r#"{"choices":[[0,{"content":"x"}]]}"#,
            r#"{"choices":[{"delta":[null,"x"]}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[[0,"id",["read","{}"]]]}}]}"#,
            r#"{"choices":{"index":0}}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":1,"reasoning":"r"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":"read"}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[3]}}]}"#,
            r#"{"choices":[],"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"object":1,"choices":[]}"#,
            r#"{"usage":{"prompt_tokens":1},"choices":[]}"#,
            r#"{"error":{"message":"boom"}}"#,
            r#"[]"#,
            r#""#,
        ];
        for data in lenient {
            assert!(!agree(data), "left to the tree: {data}");
        }
    }

    /// A random value for a member: mostly of the common type, sometimes any other.
    fn member(rng: &mut fastrand::Rng, common: impl Fn(&mut fastrand::Rng) -> Value) -> Value {
        match rng.u8(0..10) {
            0 => Value::Null,
            1 => serde_json::json!(rng.i64(-2..3)),
            2 => serde_json::json!(0.0),
            3 => serde_json::json!([rng.u8(0..3)]),
            4 => serde_json::json!({"x": 1}),
            5 => Value::String(String::new()),
            _ => common(rng),
        }
    }

    fn text(rng: &mut fastrand::Rng) -> Value {
        Value::String(["a", "é\"x", "", "{\"p\":1}"][rng.usize(0..4)].into())
    }

    /// Makes a random member value.
    type Make<'a> = &'a dyn Fn(&mut fastrand::Rng) -> Value;

    fn object(rng: &mut fastrand::Rng, members: &[(&str, Make<'_>)]) -> Value {
        let mut o = serde_json::Map::new();
        for (name, make) in members {
            if rng.bool() {
                o.insert((*name).into(), member(rng, make));
            }
        }
        Value::Object(o)
    }

    #[test]
    fn random_chunks_read_fast_as_the_tree_reads_them() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        let index = |r: &mut fastrand::Rng| serde_json::json!(r.u8(0..2));
        let function = |r: &mut fastrand::Rng| object(r, &[("name", &text), ("arguments", &text)]);
        let call = |r: &mut fastrand::Rng| object(r, &[("index", &index), ("id", &text), ("function", &function)]);
        let calls = |r: &mut fastrand::Rng| Value::Array((0..r.usize(0..3)).map(|_| member(r, call)).collect());
        let delta = |r: &mut fastrand::Rng| {
            let texts: [(&str, Make<'_>); 5] = [
                ("content", &text),
                ("reasoning_content", &text),
                ("reasoning", &text),
                ("refusal", &text),
                ("tool_calls", &calls),
            ];
            object(r, &texts)
        };
        let choice =
            |r: &mut fastrand::Rng| object(r, &[("index", &index), ("delta", &delta), ("finish_reason", &text)]);
        let choices = |r: &mut fastrand::Rng| Value::Array((0..r.usize(0..3)).map(|_| member(r, choice)).collect());
        let mut read_fast = 0;
        for _ in 0..5000 {
            let chunk = object(&mut rng, &[("object", &text), ("choices", &choices)]);
            read_fast += usize::from(agree(&chunk.to_string()));
        }
        assert!(read_fast > 100, "only {read_fast} random chunks were read fast");
    }
}
