//! `broca-mock --subc <connection-file>`: the scripted double as a real subc module serving
//! `tool-provider/v1` (the published `cortexkit-role-tool-provider` 0.15.0 role; its types are
//! the wire shapes used here). The daemon starts it from `subc.jsonc` like any module:
//!
//! ```jsonc
//! "mock-tools": {"program": "/…/broca-mock", "reserved": true,
//!                "args": ["--tools", "/…/tools.jsonc", "--call-log", "/…/calls.jsonl"]}
//! ```
//!
//! It registers through broca's own synchronous subc layer ([`broca::subc`]: handshake, HELLO,
//! the mio io thread) with a `tool_provider` manifest whose capabilities provide
//! `tool-provider/v1` and, unless the script turns it off, `call-keepalive/v1`.
//!
//! # What it serves
//!
//! Every request is `{name, arguments, …}` (subc-protocol's `ToolCallRequest`); answers are bare
//! bodies, refusals Error frames `{code, message, detail?}` (CONTRACT.md §4).
//!
//! | `name` | answer |
//! |---|---|
//! | `role.describe` | `{majors: [{version: "tool-provider/v1", ops, stability: "alpha"}], implementation_version, capabilities: []}` |
//! | `tool.catalog` | `CatalogAnswer` for the request's `preset` and the route's stamped scope; `digest_only` carries the same `catalog_digest`; `composition` gets its `composition_digest`; `presets` listed only without a preset; a `system_text` item with a listed preset gets one scripted line naming the preset and its tools (`tool_names` sorted); any `params` key, a preset-less `system_text` or an unlisted preset is refused `invalid_request {field}` |
//! | `late_results`, `late_results.ack` | only with `"late_results": true`: with `late_results_dir`, the held calls' entries whose custodian is the route's stamped principal ([`late`]); without it an always-empty log (`{entries: [], cursor: {provider_incarnation, seq: 0}, more: false}`); a cursor of another incarnation, or past the log, is `cursor_incarnation_changed` |
//! | a tool's name | the tool's scripted behaviour, after the role's checks: `call_key` and `schema_pin` shapes (`invalid_request`), an unlisted `preset`, or none on a scoped route (`invalid_request {field: "preset"}`), a tool the route's catalog does not list (`unknown_tool`), a pin naming another digest or semantics (`tool_schema_changed` / `tool_semantics_changed`) |
//!
//! A CANCEL of a running call stops it: it answers `cancelled` (one terminal frame, as subc
//! requires) and the call log records the cancel. A route's close abandons its calls. While the
//! daemon drains, new requests are refused `module_reloading` (nothing ran).
//!
//! Results: a tool declaring `"result_format": "tool-result/v1"` answers a `tool-result/v1`
//! body (`{content: [{type: "text", text}], structuredContent?}`) on routes whose bind declared
//! `tool-result/v1`, and its legacy body elsewhere (CONTRACT.md §4.1); other tools always answer
//! legacy bodies (the text as a JSON string, or the JSON value).
//!
//! Held first replies (`held-reply/v1`, [`late`] and `provider/held.rs`): a `held` behaviour, or a
//! `from_dir` call with a `<key>.held-reply` file, answers `{content: [{type: "text", text}],
//! held: {reason}}` and holds the call in the late-results store when the bind declared both
//! `held-reply/v1` and `tool-result/v1`, the tool's `result_format` is `tool-result/v1`, the call
//! carries a `call_key` and the script has `late_results` with a `late_results_dir`; otherwise it
//! answers at once as if not held (unless `force`). Tests settle held calls with files:
//!
//! ```text
//! <late_results_dir>/held/<stem>.json     {"call_key", "custodian", "owner", "ref", "scope_epoch", "session",
//!                                          "tool", "arguments", "reason", "held_at_ms", "release_at_ms"?, "from_dir"?}
//! <late_results_dir>/release/<stem>.json  written by a test: {"kind":"result","result":<tool-result/v1 body>}
//!                                          | {"kind":"result","text":"…"} | {"kind":"not_started","reason"?:"…"}
//!                                          | {"kind":"expired"}; deleted once its entry is durable
//! <late_results_dir>/log.jsonl            {"seq": n, "session": "…", "entry": <LateEntry>} per line
//! <late_results_dir>/acked.json           {"<custodian>": <acked seq>}
//! <from_dir>/<key>.held-reply             written by a test: a `held` object, e.g. {"reason": "consent"}
//! <from_dir>/<key>.call_key               written by the mock: the held call's call_key
//! <from_dir>/<key>.late                   written by a test: a release (a `result` without `result`/`text`
//!                                          answers `<key>.json`; a non-tool-result/v1 value becomes one text part)
//! ```
//!
//! `<stem>` is the lowercase hex of the call_key's bytes (`sha256-<hex>` of them past 100 bytes);
//! the custodian is `reserved:<module_id>`, `direct` or `unverified`, from the route's stamp.
//!
//! Keepalives: while a call waits out a delay, on a route whose bind declared
//! `call-keepalive/v1`, it sends `{"kind":"keepalive"}` Pushes on the call's corr every
//! `keepalive_interval_ms` (default 30,000). A `hang` sends none unless its behaviour says
//! `"keepalive": true` (stuck work goes silent, CONTRACT.md §4.4).
//!
//! # The call log
//!
//! `--call-log PATH` (or `BROCA_MOCK_CALL_LOG`) appends one JSON line per call, cancel, end and
//! role op ([`call_log`] has the format); `broca-mock calls --call-log PATH` totals it. Keep it
//! outside broca's state root: it is the count broca cannot rewrite.
//!
//! # The tool script (`--tools FILE`)
//!
//! JSON with `//` and `/* */` comments and trailing commas. Every member is optional; unknown
//! members are refused by name.
//!
//! ```jsonc
//! {
//!   "implementation_version": "broca-mock test",   // role.describe's implementation_version
//!   "keepalive": true,                // declare call-keepalive/v1 (manifest) and send keepalives
//!   "keepalive_interval_ms": 30000,   // 1..=30000
//!   "late_results": false,            // catalog capability + late_results / late_results.ack
//!   "late_results_dir": "/…/late",    // with late_results: the durable store of held calls (else an empty log)
//!   "presets": ["default", "worker"], // served presets, listed in preset-less catalog answers (≤ 16)
//!   "scoped_calls_need_preset": true, // refuse a preset-less call on a scoped route
//!   "builtins": false,                // also serve the built-in tools (a same-named tool here replaces one)
//!   // Scopes this module owns, synced with the daemon at start (subc-protocol ScopeRecord);
//!   // a `direct` carrier lets a plain test client open routes under them.
//!   "scopes": [{"ref": "lead-1", "scope_epoch": 1, "kind": "head",
//!               "carriers": [{"principal": {"kind": "direct"}}]}],
//!   "tools": [{
//!     "name": "lookup",                          // required; never a role op's name
//!     "description": "…",
//!     "input_schema": {"type": "object"},        // flat (CONTRACT.md §3); digest computed
//!     "semantics": 1,
//!     "capabilities": ["code.read/v1"],          // checked with check_capability_tag
//!     "reply": {"max_ms": 600000, "hold_argument": {"name": "ms", "default_ms": 1000, "grace_ms": 5000}},
//!     "result_format": "tool-result/v1",
//!     "emits_events": false,
//!     "default": true,                // listed when the catalog request names no preset
//!     "presets": ["worker"],          // presets whose catalog lists it (absent: all)
//!     "scopes": ["unscoped", "head", "worker", "ephemeral"],   // route scopes that see it (absent: all)
//!     "behaviour": {"echo": true},    // absent: echo
//!     "rules": [{"when": {"arguments": {"mode": "slow"}, "preset": "worker"},
//!                "then": {"text": "done", "delay_ms": 2000}}]   // first match wins
//!   }]
//! }
//! ```
//!
//! A behaviour has at most one answer (none means `echo`) and optional modifiers:
//!
//! | member | the call |
//! |---|---|
//! | `"echo": true` | answers its arguments |
//! | `"text": "s"` | answers the text `s` |
//! | `"result": <json>` | answers this JSON value as the body, verbatim |
//! | `"refuse": {"code", "message", "detail"?}` | is refused with this Error body |
//! | `"malformed": "raw"` | answers a Response whose body is these bytes (not what the role defines) |
//! | `"big": {"bytes": 71680, "from": "bytes"}` | answers a text of `bytes` model-visible bytes (or the integer argument named by `from`) |
//! | `"hang": true` (`"ignore_cancel": true`) | never answers; answers `cancelled` on CANCEL (or not even then) |
//! | `"count": true` | answers `{key, count}`: how many times this call's key was received, this one included (across restarts sharing a call log) |
//! | `"whoami": true` | answers what the daemon stamped on the route (principal, scope), its identity and consumer capabilities, and the call's preset, `call_key`, `tool_call_id` |
//! | `"from_dir": "/dir"` | answers the JSON in `/dir/<hex>.json`, `<hex>` the SHA-256 of the arguments' canonical JSON (keys sorted, compact), written by a test before the call (none: refused `tool_unavailable`); while `/dir/<hex>.hold` exists the call waits (CANCEL still ends it), having created `/dir/<hex>.held`: the conformance adapter's held calls, released from outside; with `/dir/<hex>.held-reply` it answers a held first reply (above) and writes `/dir/<hex>.call_key` |
//! | `"held": {"reason": "consent", "text"?: "…", "release_after_ms"?: n, "force"?: false}` | a held first reply (interim text default `waiting: <reason>`); `release_after_ms` settles it by itself with a `result` whose text is the arguments' canonical JSON (`structuredContent` the arguments); missing prerequisites: answers its arguments (echo) at once; `force`: the held body anyway, nothing recorded |
//! | `"delay_ms": n` | waits `n` ms first (≤ 24 h) |
//! | `"delay_from": "ms"` | waits the integer argument `ms` instead, when the call has one |
//! | `"keepalive": false` | sends no keepalives while it waits |
//!
//! # Built-in tools (no `--tools`)
//!
//! Presets `default` (every tool) and `worker` (`echo`, `sleep`, `counter`, `whoami`):
//!
//! | tool | arguments | behaviour |
//! |---|---|---|
//! | `echo` | anything | answers its arguments |
//! | `sleep` | `{ms}` | waits `ms` (keepalives meanwhile), then answers its arguments; `reply {max_ms: 600000, hold_argument ms}` |
//! | `fail` | `{mode?}` | refused `tool_unavailable {tool, reason: "under_review"}`; `mode: "malformed"` answers `this is not JSON {` |
//! | `big` | `{bytes?}` | a text of `bytes` (default 71,680 = 70 KiB) bytes |
//! | `hang` | — | never answers; `cancelled` on CANCEL |
//! | `counter` | `{name?}` | `{key, count}` |
//! | `whoami` | — | the route's stamps |

pub mod call_log;
pub mod late;
pub mod provider;
pub mod script;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use broca::subc;

use call_log::CallLog;
use provider::Provider;
use script::ToolScript;

/// The module id when the daemon names none (`SUBC_MODULE_ID`).
pub const DEFAULT_MODULE_ID: &str = "broca-mock-tools";

/// How `--subc` mode was asked to run.
pub struct Options {
    pub conn_file: PathBuf,
    pub script: ToolScript,
    pub call_log: Option<PathBuf>,
    pub sync: call_log::Sync,
}

/// Serves until the daemon says GOODBYE (or closes, or SIGTERM): exit 0 when the end was
/// orderly, 1 when the connection could not be made or broke.
pub fn serve(opts: Options) -> ExitCode {
    let module_id = std::env::var(subc_protocol::SUBC_MODULE_ID_ENV)
        .ok()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| DEFAULT_MODULE_ID.to_owned());
    let log = match &opts.call_log {
        Some(path) => match CallLog::open(path, opts.sync) {
            Ok(log) => log,
            Err(e) => {
                eprintln!("broca-mock: cannot open the call log {}: {e}", path.display());
                return ExitCode::from(1);
            }
        },
        None => {
            log::warn!("no --call-log: calls are counted in memory only");
            CallLog::in_memory()
        }
    };
    // `connect` reads the launch nonce first, before anything could start a child process.
    let conn = match subc::connect(&opts.conn_file, provider::manifest(&opts.script, &module_id), &module_id) {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("broca-mock: {e}");
            return ExitCode::from(1);
        }
    };
    let outbound = conn.outbound();
    let (stopped, _stopped_rx) = crossbeam_channel::unbounded();
    let script = opts.script.clone();
    let provider = match Provider::new(opts.script, outbound.clone(), log, &module_id, stopped) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("broca-mock: {e}");
            return ExitCode::from(1);
        }
    };
    let running = match conn.start(provider, provider::authorize) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("broca-mock: cannot start the subc io thread: {e}");
            return ExitCode::from(1);
        }
    };
    log::info!(
        "serving tool-provider/v1 as {module_id}: {} tools, presets {:?}, call log {}",
        script.tools.len(),
        script.presets,
        opts.call_log.as_deref().map_or_else(|| "in memory".to_owned(), |p| p.display().to_string())
    );
    Provider::sync_scopes(&script, &outbound);
    broca::subc::sigterm::close_on_sigterm(outbound, "broca-mock");
    let end = running.join();
    if end.is_clean() {
        log::info!("broca-mock: exiting cleanly: {end}");
        ExitCode::SUCCESS
    } else {
        eprintln!("broca-mock: {end}");
        ExitCode::from(1)
    }
}

/// `broca-mock calls`: the call log's totals, as text or JSON. With `at_most_once`, exit 1 when
/// any call ran more than once.
pub fn print_calls(path: &Path, as_json: bool, at_most_once: bool) -> Result<bool, String> {
    let counts = call_log::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let duplicates = counts.duplicates();
    if as_json {
        let keys: Vec<serde_json::Value> = counts
            .keys
            .iter()
            .map(|(k, c)| serde_json::json!({"key": k, "tool": c.tool, "calls": c.calls, "cancels": c.cancels}))
            .collect();
        let out = serde_json::json!({
            "calls": counts.calls,
            "cancels": counts.cancels,
            "replies": counts.replies,
            "role_ops": counts.role_ops,
            "keys": keys,
            "duplicates": duplicates.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            "torn_tail": counts.torn_tail,
        });
        println!("{out}");
    } else {
        println!("{:>6} {:>7} {:<10} key", "calls", "cancels", "tool");
        for (key, c) in &counts.keys {
            println!("{:>6} {:>7} {:<10} {key}", c.calls, c.cancels, c.tool);
        }
        println!(
            "{} call(s), {} cancel(s), {} key(s), {} ran more than once{}",
            counts.calls,
            counts.cancels,
            counts.keys.len(),
            duplicates.len(),
            if counts.torn_tail { "; a torn last line was skipped" } else { "" }
        );
    }
    Ok(!at_most_once || duplicates.is_empty())
}
