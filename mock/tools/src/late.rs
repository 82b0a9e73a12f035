//! The late-results store: the calls broca-mock holds past a held first reply
//! (`held-reply/v1`) and the `late_results` entries that settle them (tool-provider/v1 §7),
//! kept in files under the script's `late_results_dir` so tests can watch and drive them and
//! everything survives a restart of the mock.
//!
//! ```text
//! <dir>/held/<stem>.json      one per held call (a HeldRecord), written before the held reply;
//!                             it stays after the call settles (log.jsonl says which settled)
//! <dir>/release/<stem>.json   written by a test to settle a held call (a release file, below);
//!                             deleted once its entry is durable, renamed `.bad` when unusable
//! <dir>/log.jsonl             append-only: {"seq": n, "session": "…", "entry": <LateEntry>}
//! <dir>/acked.json            {"<custodian>": <highest acked seq>, …}
//! ```
//!
//! `<stem>` is the lowercase hex of the call_key's bytes ([`stem`]). A release file is
//! `{"kind":"result","result":<tool-result/v1 body>}` (verbatim), `{"kind":"result","text":"…"}`
//! (one text part), `{"kind":"not_started","reason":"…"}` (default `restart_before_dispatch`) or
//! `{"kind":"expired"}`. Write it atomically (temp name, then rename): a file that stays
//! unreadable for [`BAD_FILE_GRACE`] is renamed `<name>.bad`.
//!
//! Invariants:
//! - a held record is durable (fsynced, renamed into place, directory fsynced) before the call's
//!   held reply is sent; an entry is durable (appended and fsynced) before its release file is
//!   deleted and before any reader sees it;
//! - `seq` is global, 1, 2, … across restarts (the log is replayed at open); a call_key gets at
//!   most one terminal entry: a later release for it is deleted and ignored;
//! - `event_id` is the hex SHA-256 of `call_key + "\0" + kind`, so a re-read after a restart
//!   carries the same ids;
//! - an entry is served only to its custodian, and only while unacked; acks are per custodian
//!   and only move forward;
//! - retention (CONTRACT.md §7): at most [`MAX_UNACKED_PER_SESSION`] unacked results per
//!   (custodian, session), the oldest dropped first. Replaying the log under the final acks drops
//!   exactly what the live store dropped. (The 24 h expiry and the per-owner bound on `expired`
//!   entries are not modelled: a test settles a call `expired` with a release file.)
//! - the incarnation is the provider's, new at every start, so an old cursor is refused
//!   `cursor_incarnation_changed` ([`check_since`]).
//!
//! Releases are picked up by every `late_results` read and by a poller thread every
//! [`POLL_INTERVAL`]; so are `from_dir` calls' `<key>.late` files and due `release_after_ms`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cortexkit_role_tool_provider::late_results::{
    check_since, kinds, reasons, AckRequest, Cursor, LateEntry, LateResultsReply, LateResultsRequest,
};
use cortexkit_role_tool_provider::result::{self, ContentPart, ToolResult};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use subc_protocol::{ErrorBody, Principal};

use super::call_log::canonical_json;
use super::script::sha256_hex;

/// How often the poller looks for releases.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Entries per `late_results` answer without a `limit`, and the most with one.
pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;
/// CONTRACT.md §7: at most 1,000 unacked results per session, oldest dropped first.
pub const MAX_UNACKED_PER_SESSION: usize = 1000;
/// How long an unreadable release file is left alone (it may be half written) before `.bad`.
pub const BAD_FILE_GRACE: Duration = Duration::from_secs(2);
/// The largest release, held or acked file read.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// A call_key longer than this is named by its SHA-256 (hex stems must fit a file name).
const MAX_HEX_KEY_BYTES: usize = 100;
/// The code a request is refused with when the store cannot write.
pub const UNWRITABLE: &str = "late_results_unwritable";

/// The file stem of a call_key: the lowercase hex of its bytes, or `sha256-<hex>` of them when
/// the key is over 100 bytes.
pub fn stem(call_key: &str) -> String {
    if call_key.len() > MAX_HEX_KEY_BYTES {
        return format!("sha256-{}", sha256_hex(call_key.as_bytes()));
    }
    call_key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The one string form of a daemon-stamped principal, used as a custodian and an owner:
/// `reserved:<module_id>`, `direct`, `unverified` (`unstamped` when there is none).
pub fn principal_text(principal: Option<&Principal>) -> String {
    match principal {
        Some(Principal::Reserved { module_id }) => format!("reserved:{module_id}"),
        Some(Principal::Direct) => "direct".to_owned(),
        Some(Principal::Unverified) => "unverified".to_owned(),
        None => "unstamped".to_owned(),
    }
}

/// A held call, as `held/<stem>.json` records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldRecord {
    pub call_key: String,
    /// The principal stamped on the route the call came on ([`principal_text`]).
    pub custodian: String,
    /// The route's scope owner, or the custodian on an unscoped route.
    pub owner: String,
    /// The route's scope ref, or `unscoped`.
    #[serde(rename = "ref")]
    pub scope_ref: String,
    pub scope_epoch: u64,
    /// The bind identity's session: the retention bound counts per (custodian, session).
    pub session: String,
    pub tool: String,
    pub arguments: Value,
    pub reason: String,
    pub held_at_ms: u64,
    /// Settle by itself then, with a `result` echoing the arguments ([`echo_result`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_at_ms: Option<u64>,
    /// A `from_dir` call, settled by `<dir>/<key>.late`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_dir: Option<FromDirHold>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FromDirHold {
    pub dir: PathBuf,
    pub key: String,
}

/// How a held call settles: the terminal entry's kind and content.
#[derive(Clone, Debug, PartialEq)]
pub enum Release {
    Result(Value),
    NotStarted(String),
    Expired,
}

impl Release {
    fn kind(&self) -> &'static str {
        match self {
            Release::Result(_) => kinds::RESULT,
            Release::NotStarted(_) => kinds::NOT_STARTED,
            Release::Expired => kinds::EXPIRED,
        }
    }
}

/// A release file (`release/<stem>.json`, or a `from_dir` call's `<key>.late`).
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum ReleaseFile {
    Result {
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        text: Option<String>,
    },
    NotStarted {
        #[serde(default)]
        reason: Option<String>,
    },
    Expired,
}

/// One line of `log.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LogLine {
    seq: u64,
    session: String,
    entry: LateEntry,
}

/// What [`LateStore::settle`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Settled {
    /// The entry is durable under this seq.
    Appended(u64),
    /// The call already has a terminal entry; nothing was written.
    AlreadySettled,
    /// No held call has this key.
    NotHeld,
}

struct Inner {
    log: File,
    /// The newest seq in the log.
    head: u64,
    /// Unacked, undropped entries, oldest first.
    entries: VecDeque<LogLine>,
    acked: BTreeMap<String, u64>,
    /// Stems of the calls with a terminal entry.
    settled: HashSet<String>,
    /// Unsettled held calls, by stem.
    held: BTreeMap<String, HeldRecord>,
}

pub struct LateStore {
    dir: PathBuf,
    incarnation: String,
    cap: usize,
    inner: Mutex<Inner>,
}

impl LateStore {
    /// Opens (creating) the store under `dir` for a provider of `incarnation`: replays the log
    /// under the acks and loads the unsettled held calls. A torn last log line is cut off; any
    /// other unreadable log line or acks file is an error (the store would lie).
    pub fn open(dir: &Path, incarnation: &str) -> io::Result<LateStore> {
        LateStore::open_with_cap(dir, incarnation, MAX_UNACKED_PER_SESSION)
    }

    fn open_with_cap(dir: &Path, incarnation: &str, cap: usize) -> io::Result<LateStore> {
        fs::create_dir_all(dir.join("held"))?;
        fs::create_dir_all(dir.join("release"))?;
        let acked: BTreeMap<String, u64> = match read_bounded(&dir.join("acked.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| invalid(dir.join("acked.json"), e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        let log_path = dir.join("log.jsonl");
        let lines = replay(&log_path)?;
        let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
        sync_dir(dir)?;
        let mut inner =
            Inner { log, head: 0, entries: VecDeque::new(), acked, settled: HashSet::new(), held: BTreeMap::new() };
        for line in lines {
            inner.head = line.seq;
            inner.settled.insert(stem(&line.entry.call_key));
            if line.seq > inner.acked.get(&line.entry.custodian).copied().unwrap_or(0) {
                let (custodian, session) = (line.entry.custodian.clone(), line.session.clone());
                inner.entries.push_back(line);
                enforce_cap(&mut inner.entries, &custodian, &session, cap);
            }
        }
        for (stem, record) in load_held(&dir.join("held")) {
            if !inner.settled.contains(&stem) {
                inner.held.insert(stem, record);
            }
        }
        log::info!(
            "late results in {}: head seq {}, {} unacked, {} held",
            dir.display(),
            inner.head,
            inner.entries.len(),
            inner.held.len()
        );
        Ok(LateStore { dir: dir.to_owned(), incarnation: incarnation.to_owned(), cap, inner: Mutex::new(inner) })
    }

    /// Shares the store and starts its poller, which stops when the last share is dropped.
    pub fn start(self) -> Arc<LateStore> {
        let store = Arc::new(self);
        let weak = Arc::downgrade(&store);
        let poller = std::thread::Builder::new().name("mock-late".into()).spawn(move || loop {
            std::thread::sleep(POLL_INTERVAL);
            match weak.upgrade() {
                Some(store) => store.scan(),
                None => return,
            }
        });
        if let Err(e) = poller {
            log::error!("no late-results poller ({e}): releases are picked up by late_results reads only");
        }
        store
    }

    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records a held call durably. A call_key already held or settled is left as it is.
    pub fn hold(&self, record: HeldRecord) -> io::Result<()> {
        let stem = stem(&record.call_key);
        let mut inner = self.inner.lock();
        if inner.settled.contains(&stem) || inner.held.contains_key(&stem) {
            log::warn!("call_key {} is already held or settled: not held again", record.call_key);
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(&record).map_err(io::Error::other)?;
        write_atomic(&self.dir.join("held").join(format!("{stem}.json")), &bytes)?;
        inner.held.insert(stem, record);
        Ok(())
    }

    /// Settles the held call `call_key` with one durable entry.
    pub fn settle(&self, call_key: &str, release: Release) -> io::Result<Settled> {
        self.settle_stem(&mut self.inner.lock(), &stem(call_key), release)
    }

    /// Picks up release files, `from_dir` calls' `.late` files and due automatic releases.
    pub fn scan(&self) {
        self.scan_locked(&mut self.inner.lock());
    }

    /// `late_results` for `custodian`: its unacked entries after `since`, oldest first.
    pub fn read(&self, custodian: &str, request: &LateResultsRequest) -> Result<LateResultsReply, ErrorBody> {
        let mut inner = self.inner.lock();
        self.scan_locked(&mut inner);
        check_since(&self.incarnation, inner.head, request.since.as_ref())?;
        let acked = inner.acked.get(custodian).copied().unwrap_or(0);
        let after = request.since.as_ref().map_or(acked, |c| c.seq);
        let limit = request.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT) as usize;
        let mut mine = inner.entries.iter().filter(|l| l.entry.custodian == custodian && l.seq > after);
        let entries: Vec<&LogLine> = mine.by_ref().take(limit).collect();
        let more = mine.next().is_some();
        let seq = entries.last().map_or(after, |l| l.seq);
        Ok(LateResultsReply {
            entries: entries.into_iter().map(|l| l.entry.clone()).collect(),
            cursor: Cursor { provider_incarnation: self.incarnation.clone(), seq },
            more,
        })
    }

    /// `late_results.ack` for `custodian`: its entries through `through.seq` are no longer served.
    pub fn ack(&self, custodian: &str, request: &AckRequest) -> Result<(), ErrorBody> {
        let mut inner = self.inner.lock();
        check_since(&self.incarnation, inner.head, Some(&request.through))?;
        let through = request.through.seq;
        if inner.acked.get(custodian).is_some_and(|&seq| seq >= through) {
            return Ok(());
        }
        let mut acked = inner.acked.clone();
        acked.insert(custodian.to_owned(), through);
        let bytes = serde_json::to_vec_pretty(&acked).expect("acks serialize");
        write_atomic(&self.dir.join("acked.json"), &bytes)
            .map_err(|e| ErrorBody::new(UNWRITABLE, format!("broca-mock cannot record the ack: {e}")))?;
        inner.acked = acked;
        inner.entries.retain(|l| l.entry.custodian != custodian || l.seq > through);
        Ok(())
    }

    /// The newest seq in the log.
    pub fn head(&self) -> u64 {
        self.inner.lock().head
    }

    fn settle_stem(&self, inner: &mut Inner, stem: &str, release: Release) -> io::Result<Settled> {
        if inner.settled.contains(stem) {
            return Ok(Settled::AlreadySettled);
        }
        let Some(record) = inner.held.get(stem) else { return Ok(Settled::NotHeld) };
        let kind = release.kind();
        let event_id = sha256_hex(format!("{}\0{kind}", record.call_key).as_bytes());
        let mut entry = LateEntry::new(
            kind,
            record.owner.clone(),
            record.scope_ref.clone(),
            record.scope_epoch,
            record.custodian.clone(),
            record.call_key.clone(),
            event_id,
            now_ms(),
        );
        match release {
            Release::Result(body) => entry = entry.with_result(body),
            Release::NotStarted(reason) => entry = entry.with_reason(reason),
            Release::Expired => {}
        }
        let line = LogLine { seq: inner.head + 1, session: record.session.clone(), entry };
        let mut bytes = serde_json::to_vec(&line).map_err(io::Error::other)?;
        bytes.push(b'\n');
        let before = inner.log.metadata()?.len();
        if let Err(e) = inner.log.write_all(&bytes).and_then(|()| inner.log.sync_data()) {
            // Never leave a torn line for the next append to glue onto.
            let _ = inner.log.set_len(before);
            return Err(e);
        }
        log::info!("late entry {} ({kind}) for call_key {}", line.seq, line.entry.call_key);
        inner.head = line.seq;
        inner.settled.insert(stem.to_owned());
        inner.held.remove(stem);
        let (custodian, session) = (line.entry.custodian.clone(), line.session.clone());
        inner.entries.push_back(line);
        enforce_cap(&mut inner.entries, &custodian, &session, self.cap);
        Ok(Settled::Appended(inner.head))
    }

    fn scan_locked(&self, inner: &mut Inner) {
        self.scan_release_dir(inner);
        // `from_dir` calls: `<dir>/<key>.late` settles the call held under that key.
        let watched: Vec<(String, FromDirHold)> =
            inner.held.iter().filter_map(|(s, r)| Some((s.clone(), r.from_dir.clone()?))).collect();
        for (stem, fd) in watched {
            let path = fd.dir.join(format!("{}.late", fd.key));
            if !path.exists() {
                continue;
            }
            let scripted = fd.dir.join(format!("{}.json", fd.key));
            match read_release(&path, Some(&scripted)) {
                Ok(release) => self.apply(inner, &stem, release, &path),
                Err(why) => set_aside(&path, &why),
            }
        }
        // `release_after_ms`: the automatic release, echoing the arguments.
        let now = now_ms();
        let due: Vec<(String, Value)> = inner
            .held
            .iter()
            .filter(|(_, r)| r.release_at_ms.is_some_and(|at| at <= now))
            .map(|(s, r)| (s.clone(), r.arguments.clone()))
            .collect();
        for (stem, arguments) in due {
            if let Err(e) = self.settle_stem(inner, &stem, Release::Result(echo_result(&arguments))) {
                log::error!("cannot settle the held call {stem} by itself: {e}");
            }
        }
    }

    fn scan_release_dir(&self, inner: &mut Inner) {
        let dir = self.dir.join("release");
        let names = match fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.path()).collect::<Vec<_>>(),
            Err(e) => return log::error!("cannot list {}: {e}", dir.display()),
        };
        for path in names {
            let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let stem = stem.to_owned();
            match read_release(&path, None) {
                Ok(release) => self.apply(inner, &stem, release, &path),
                Err(why) => set_aside(&path, &why),
            }
        }
    }

    /// Settles `stem` from the release file at `path`, deleting the file once the entry is
    /// durable (or when the call had settled already).
    fn apply(&self, inner: &mut Inner, stem: &str, release: Release, path: &Path) {
        match self.settle_stem(inner, stem, release) {
            Ok(Settled::Appended(_)) => remove(path),
            Ok(Settled::AlreadySettled) => {
                log::warn!("{}: the call already settled; this release is ignored", path.display());
                remove(path);
            }
            Ok(Settled::NotHeld) => set_aside(path, "no held call has this key"),
            Err(e) => log::error!("cannot append the late entry for {}: {e}", path.display()),
        }
    }
}

/// The automatic release's result: a `tool-result/v1` body whose one text part is the
/// arguments' canonical JSON (and whose `structuredContent` is them, when an object).
pub fn echo_result(arguments: &Value) -> Value {
    let mut r = ToolResult::new(vec![ContentPart::text(canonical_json(arguments))]);
    if let Value::Object(map) = arguments {
        r = r.with_structured_content(map.clone());
    }
    serde_json::to_value(r).expect("results serialize")
}

/// A value as a late `result`: a valid, unheld `tool-result/v1` body verbatim; else one text
/// part, a string as its text and anything else as its canonical JSON.
pub fn as_tool_result(value: Value) -> Value {
    if let Ok(r) = serde_json::from_value::<ToolResult>(value.clone()) {
        if r.held.is_none() && result::validate(&r).is_ok() {
            return value;
        }
    }
    let text = match &value {
        Value::String(s) => s.clone(),
        other => canonical_json(other),
    };
    serde_json::to_value(ToolResult::new(vec![ContentPart::text(text)])).expect("results serialize")
}

/// Reads a release file. `scripted` (a `from_dir` call's `<key>.json`) makes it a `.late` file:
/// a `result` without `result` or `text` takes the scripted value, and any result value is
/// made a `tool-result/v1` body ([`as_tool_result`]).
fn read_release(path: &Path, scripted: Option<&Path>) -> Result<Release, String> {
    let bytes = read_bounded(path).map_err(|e| e.to_string())?;
    let file: ReleaseFile = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    Ok(match file {
        ReleaseFile::Result { result: Some(_), text: Some(_) } => return Err("both result and text".into()),
        ReleaseFile::Result { result: None, text: Some(t) } => {
            Release::Result(serde_json::to_value(ToolResult::new(vec![ContentPart::text(t)])).expect("serializes"))
        }
        ReleaseFile::Result { result: Some(v), text: None } => match scripted {
            Some(_) => Release::Result(as_tool_result(v)),
            None => Release::Result(v),
        },
        ReleaseFile::Result { result: None, text: None } => {
            let Some(scripted) = scripted else { return Err("a result names its result or text".into()) };
            let bytes = read_bounded(scripted).map_err(|e| format!("{}: {e}", scripted.display()))?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", scripted.display()))?;
            Release::Result(as_tool_result(v))
        }
        ReleaseFile::NotStarted { reason } => {
            Release::NotStarted(reason.unwrap_or_else(|| reasons::RESTART_BEFORE_DISPATCH.to_owned()))
        }
        ReleaseFile::Expired => Release::Expired,
    })
}

/// Drops the oldest entries of (custodian, session) past `cap`.
fn enforce_cap(entries: &mut VecDeque<LogLine>, custodian: &str, session: &str, cap: usize) {
    let same = |l: &LogLine| l.entry.custodian == custodian && l.session == session;
    let mut count = entries.iter().filter(|l| same(l)).count();
    while count > cap {
        let Some(oldest) = entries.iter().position(same) else { return };
        let dropped = entries.remove(oldest);
        log::warn!(
            "late results: over {cap} unacked for {custodian} (session {session}); dropped seq {}",
            dropped.map_or(0, |l| l.seq)
        );
        count -= 1;
    }
}

/// The log's lines. A torn last line (no newline: a write cut short) is cut off the file.
fn replay(path: &Path) -> io::Result<Vec<LogLine>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if whole < bytes.len() {
        log::warn!("{}: cutting a torn last line ({} bytes)", path.display(), bytes.len() - whole);
        OpenOptions::new().write(true).open(path)?.set_len(whole as u64)?;
    }
    let mut lines: Vec<LogLine> = Vec::new();
    for (n, raw) in bytes[..whole].split(|&b| b == b'\n').enumerate().filter(|(_, l)| !l.is_empty()) {
        let line: LogLine = serde_json::from_slice(raw).map_err(|e| invalid(path, format!("line {}: {e}", n + 1)))?;
        if lines.last().is_some_and(|prev| prev.seq >= line.seq) {
            return Err(invalid(path, format!("line {}: seq {} does not increase", n + 1, line.seq)));
        }
        lines.push(line);
    }
    Ok(lines)
}

/// The held records under `dir`, by stem; unreadable ones are logged and skipped.
fn load_held(dir: &Path) -> Vec<(String, HeldRecord)> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for path in rd.filter_map(|e| e.ok()).map(|e| e.path()) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        let record = read_bounded(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<HeldRecord>(&b).map_err(|e| e.to_string()));
        match record {
            Ok(r) if stem(&r.call_key) == name => out.push((name.to_owned(), r)),
            Ok(r) => log::error!("{}: names call_key {}, not its file's", path.display(), r.call_key),
            Err(e) => log::error!("{}: skipped: {e}", path.display()),
        }
    }
    out
}

/// Writes `bytes` to `path` durably: a temp file beside it, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    let len = fs::metadata(path)?.len();
    if len > MAX_FILE_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("over {MAX_FILE_BYTES} bytes")));
    }
    fs::read(path)
}

/// An unusable file: left alone while it may still be being written, then renamed `.bad`.
fn set_aside(path: &Path, why: &str) {
    let age = fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    if age.is_some_and(|a| a < BAD_FILE_GRACE) {
        return log::debug!("{}: not usable yet ({why})", path.display());
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let bad = path.with_file_name(format!("{name}.bad"));
    log::error!("{}: {why}; renamed {}", path.display(), bad.display());
    if let Err(e) = fs::rename(path, &bad) {
        log::error!("cannot rename {}: {e}", path.display());
    }
}

fn remove(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        log::error!("cannot delete {}: {e}", path.display());
    }
}

fn invalid(path: impl AsRef<Path>, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.as_ref().display()))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests;
