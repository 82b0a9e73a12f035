//! The call log: broca-mock's own record of every tool call it receives, kept **outside**
//! broca's state root so a test can ask how many times a call really ran, whatever broca's
//! WAL says (at-most-once under real kills).
//!
//! The file is append-only JSON lines, one [`Entry`] per line:
//!
//! ```json
//! {"event":"call","incarnation":"…","pid":41,"at_ms":1790000000000,"route":"3/1","corr":7,"key":"call_key:01J…:44","tool":"echo","call_key":"01J…:44","tool_call_id":"toolu_1","preset":"default","scoped":false,"arguments":{"text":"hi"}}
//! {"event":"cancel","incarnation":"…","at_ms":…,"route":"3/1","corr":9,"key":"…","tool":"hang"}
//! {"event":"reply","incarnation":"…","at_ms":…,"route":"3/1","corr":7,"key":"…","tool":"echo","outcome":"result"}
//! {"event":"role","incarnation":"…","at_ms":…,"route":"3/1","corr":2,"op":"tool.catalog","preset":"worker","scoped":false}
//! ```
//!
//! - A `call` line is written (one `write(2)`, and `fsync(2)` with `--call-log-fsync`) **before**
//!   the call does anything or is answered, so it survives a SIGKILL of broca or of the mock.
//!   Every tool-call request the provider handles gets one, refusals included; a request it turns
//!   away unseen (while draining, or past its in-flight bound, answered `module_reloading` /
//!   `provider_busy`, both "nothing ran") gets none.
//! - `key` is what calls are counted by ([`call_key_of`]): `call_key:<call_key>` when the call
//!   carried one, else `args:<tool>:<canonical arguments>` (object keys sorted, no whitespace),
//!   or `args:<tool>:sha256:<hex>` when that canonical text is over [`MAX_INLINE_KEY_BYTES`].
//! - A `cancel` line records a subc CANCEL the provider saw for an open call; a `reply` line
//!   records how the call ended (`result`, `refused` with its `code`, `malformed`, `cancelled`,
//!   `abandoned` when its route closed first, `held` for a held first reply); a `role` line
//!   records a role op (`tool.catalog` fetches can be counted too).
//! - Several provider processes (restarts) may append to one file; lines stay whole because each
//!   is one `O_APPEND` write. A torn last line (a process killed mid-write) is skipped by
//!   [`read`]; a bad line anywhere else is an error.
//!
//! This file depends only on std, serde, serde_json and sha2, so tests include it with
//! `#[path = "../mock/tools/src/call_log.rs"] mod call_log;` and call [`read`].

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The environment variable naming the call log when `--call-log` is not given.
pub const CALL_LOG_ENV: &str = "BROCA_MOCK_CALL_LOG";

/// Canonical argument text longer than this is keyed by its SHA-256 instead.
pub const MAX_INLINE_KEY_BYTES: usize = 256;

/// Arguments whose canonical text is longer than this are logged as their size only.
pub const MAX_LOGGED_ARGUMENT_BYTES: usize = 64 * 1024;

/// The largest call log [`read`] accepts.
pub const MAX_LOG_BYTES: u64 = 1024 * 1024 * 1024;

/// One line of the call log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Entry {
    Call(CallEntry),
    Cancel(CancelEntry),
    Reply(ReplyEntry),
    Role(RoleEntry),
}

/// A tool call as it arrived.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallEntry {
    /// The provider process that received it (a fresh id per start).
    pub incarnation: String,
    pub pid: u32,
    /// Unix milliseconds at receipt.
    pub at_ms: u64,
    /// The route as the provider numbers it, `channel/epoch`.
    pub route: String,
    pub corr: u64,
    /// What calls are counted by ([`call_key_of`]).
    pub key: String,
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Whether the route carried a daemon-stamped scope.
    pub scoped: bool,
    /// The arguments, or `null` when they are over [`MAX_LOGGED_ARGUMENT_BYTES`].
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_bytes: Option<usize>,
}

/// A subc CANCEL seen for an open call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CancelEntry {
    pub incarnation: String,
    pub at_ms: u64,
    pub route: String,
    pub corr: u64,
    pub key: String,
    pub tool: String,
}

/// A role op (`role.describe`, `tool.catalog`, `late_results`, …), so a test can count
/// catalog fetches too. Not a call: never counted under a key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoleEntry {
    pub incarnation: String,
    pub at_ms: u64,
    pub route: String,
    pub corr: u64,
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    pub scoped: bool,
    /// The composition a `tool.catalog` asked against, as its JCS digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composition_digest: Option<String>,
    /// Whether the request asked for a system-text item.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub system_text: bool,
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplyEntry {
    pub incarnation: String,
    pub at_ms: u64,
    pub route: String,
    pub corr: u64,
    pub key: String,
    pub tool: String,
    pub outcome: Outcome,
    /// The refusal's code, for `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A Response with a well-formed body.
    Result,
    /// An Error frame (the provider refused the call).
    Refused,
    /// A Response whose body is deliberately not what the role defines.
    Malformed,
    /// The call stopped on CANCEL and answered `cancelled`.
    Cancelled,
    /// The route closed before the call answered; nothing was sent.
    Abandoned,
    /// A held first reply (`held-reply/v1`): the answer comes later through `late_results`.
    Held,
}

/// The counting key of a call: its `call_key`, else its tool and canonical arguments.
pub fn call_key_of(call_key: Option<&str>, tool: &str, arguments: &Value) -> String {
    if let Some(key) = call_key {
        return format!("call_key:{key}");
    }
    let canonical = canonical_json(arguments);
    if canonical.len() <= MAX_INLINE_KEY_BYTES {
        format!("args:{tool}:{canonical}")
    } else {
        format!("args:{tool}:sha256:{}", hex(&Sha256::digest(canonical.as_bytes())))
    }
}

/// `value` as compact JSON with every object's keys sorted (bytewise), for stable keys.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Per-key totals of a call log.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KeyCount {
    pub tool: String,
    /// `call` lines with this key: how many times the call ran.
    pub calls: u64,
    pub cancels: u64,
}

/// What [`read`] found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub keys: BTreeMap<String, KeyCount>,
    pub calls: u64,
    pub cancels: u64,
    pub replies: u64,
    /// Role ops received, by op name.
    pub role_ops: BTreeMap<String, u64>,
    /// Every entry, in file order.
    #[serde(skip)]
    pub entries: Vec<Entry>,
    /// A last line without its newline that did not decode (a write cut by a kill) was skipped.
    pub torn_tail: bool,
}

impl Counts {
    /// How many times the call counted under `key` ran.
    pub fn calls_of(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(0, |k| k.calls)
    }

    /// Keys that ran more than once.
    pub fn duplicates(&self) -> Vec<(&str, &KeyCount)> {
        self.keys.iter().filter(|(_, k)| k.calls > 1).map(|(key, k)| (key.as_str(), k)).collect()
    }

    /// The entries for calls of `tool`, in file order.
    pub fn calls_to<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a CallEntry> + 'a {
        self.entries.iter().filter_map(move |e| match e {
            Entry::Call(c) if c.tool == tool => Some(c),
            _ => None,
        })
    }

    fn add(&mut self, entry: Entry) {
        match &entry {
            Entry::Call(c) => {
                self.calls += 1;
                let k = self.keys.entry(c.key.clone()).or_default();
                k.tool.clone_from(&c.tool);
                k.calls += 1;
            }
            Entry::Cancel(c) => {
                self.cancels += 1;
                let k = self.keys.entry(c.key.clone()).or_default();
                if k.tool.is_empty() {
                    k.tool.clone_from(&c.tool);
                }
                k.cancels += 1;
            }
            Entry::Reply(_) => self.replies += 1,
            Entry::Role(r) => *self.role_ops.entry(r.op.clone()).or_default() += 1,
        }
        self.entries.push(entry);
    }
}

/// Why a call log could not be read.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    TooLarge { bytes: u64 },
    BadLine { line: usize, error: String },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::TooLarge { bytes } => write!(f, "the call log is {bytes} bytes, over the {MAX_LOG_BYTES}-byte bound"),
            Self::BadLine { line, error } => write!(f, "line {line} is not a call-log entry: {error}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads and totals a call log. A missing file reads as empty (no call ran).
pub fn read(path: &Path) -> Result<Counts, ReadError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Counts::default()),
        Err(e) => return Err(ReadError::Io(e)),
    };
    let bytes = file.metadata().map_err(ReadError::Io)?.len();
    if bytes > MAX_LOG_BYTES {
        return Err(ReadError::TooLarge { bytes });
    }
    let mut text = Vec::new();
    file.read_to_end(&mut text).map_err(ReadError::Io)?;
    parse(&text)
}

/// Totals the bytes of a call log (see [`read`]).
pub fn parse(text: &[u8]) -> Result<Counts, ReadError> {
    let mut counts = Counts::default();
    let complete = text.ends_with(b"\n");
    let lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    let last = lines.len().saturating_sub(1);
    for (i, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Entry>(line) {
            Ok(entry) => counts.add(entry),
            Err(_) if i == last && !complete => counts.torn_tail = true,
            Err(e) => return Err(ReadError::BadLine { line: i + 1, error: e.to_string() }),
        }
    }
    Ok(counts)
}

/// How hard each entry is pushed toward the disk before the provider goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// One `write(2)`: in the kernel before the reply, so it survives any process kill.
    Write,
    /// `write(2)` then `fsync(2)`: survives a power cut as well.
    Fsync,
}

/// The provider's appender. Without a path it only counts in memory.
pub struct CallLog {
    sync: Sync,
    state: Mutex<State>,
}

struct State {
    file: Option<File>,
    /// `call` lines per key, including those already in the file at open.
    calls: BTreeMap<String, u64>,
}

impl CallLog {
    /// Memory only: counts, no file.
    pub fn in_memory() -> CallLog {
        CallLog { sync: Sync::Write, state: Mutex::new(State { file: None, calls: BTreeMap::new() }) }
    }

    /// Opens (creating, mode 0600) `path` for appending; the counts already in it carry on.
    pub fn open(path: &Path, sync: Sync) -> Result<CallLog, ReadError> {
        let existing = read(path)?;
        let file = OpenOptions::new().create(true).append(true).mode(0o600).open(path).map_err(ReadError::Io)?;
        let calls = existing.keys.iter().map(|(k, c)| (k.clone(), c.calls)).collect();
        Ok(CallLog { sync, state: Mutex::new(State { file: Some(file), calls }) })
    }

    /// Appends `entry`. For a `call`, returns how many calls its key has now (this one included).
    pub fn record(&self, entry: &Entry) -> io::Result<u64> {
        let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(file) = state.file.as_mut() {
            file.write_all(&line)?;
            if self.sync == Sync::Fsync {
                file.sync_data()?;
            }
        }
        Ok(match entry {
            Entry::Call(c) => {
                let n = state.calls.entry(c.key.clone()).or_default();
                *n += 1;
                *n
            }
            _ => 0,
        })
    }

    /// Calls counted under `key` so far.
    pub fn calls_of(&self, key: &str) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).calls.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(key: &str, tool: &str) -> Entry {
        Entry::Call(CallEntry {
            incarnation: "i".into(),
            pid: 1,
            at_ms: 2,
            route: "1/1".into(),
            corr: 3,
            key: key.into(),
            tool: tool.into(),
            call_key: None,
            tool_call_id: None,
            preset: None,
            scoped: false,
            arguments: json!({}),
            arguments_bytes: None,
        })
    }

    #[test]
    fn keys_prefer_the_call_key_and_sort_argument_members() {
        assert_eq!(call_key_of(Some("s:7"), "echo", &json!({"a": 1})), "call_key:s:7");
        let a = call_key_of(None, "echo", &json!({"b": [1, {"y": 2, "x": 1}], "a": "z"}));
        assert_eq!(a, r#"args:echo:{"a":"z","b":[1,{"x":1,"y":2}]}"#);
        let long = call_key_of(None, "echo", &json!({"text": "x".repeat(400)}));
        assert!(long.starts_with("args:echo:sha256:") && long.len() == "args:echo:sha256:".len() + 64, "{long}");
    }

    #[test]
    fn the_log_counts_across_reopens_and_skips_only_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calls.jsonl");
        let log = CallLog::open(&path, Sync::Fsync).unwrap();
        assert_eq!(log.record(&call("k1", "echo")).unwrap(), 1);
        assert_eq!(log.record(&call("k1", "echo")).unwrap(), 2);
        drop(log);
        let again = CallLog::open(&path, Sync::Write).unwrap();
        assert_eq!(again.record(&call("k2", "hang")).unwrap(), 1);
        assert_eq!(again.calls_of("k1"), 2);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(br#"{"event":"call","incarn"#);
        let counts = parse(&bytes).unwrap();
        assert!(counts.torn_tail);
        assert_eq!((counts.calls, counts.calls_of("k1"), counts.duplicates().len()), (3, 2, 1));
        // The same cut in the middle is corruption, not a torn write.
        let mut middle = br#"{"event":"call","incarn"#.to_vec();
        middle.push(b'\n');
        middle.extend_from_slice(&std::fs::read(&path).unwrap());
        assert!(matches!(parse(&middle), Err(ReadError::BadLine { line: 1, .. })));
        assert_eq!(read(&dir.path().join("absent")).unwrap(), Counts::default());
    }
}
