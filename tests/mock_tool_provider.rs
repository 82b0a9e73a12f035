//! broca-mock as a real `tool-provider/v1` module: the subc daemon (the `subc-daemon` library,
//! booted in this process) launches `broca-mock --tools … --call-log … --subc <file>` from its
//! `subc.jsonc`, and the official consumer SDK (`subc-client-rs`) calls it like a runner would:
//! `role.describe`, `tool.catalog` under two presets and two route scopes (one stamped by the
//! daemon, the scope owned by the mock itself), and `tool.call` results, delays with keepalives,
//! refusals, a malformed answer, an oversize result, a `tool-result/v1` result, CANCEL of a
//! call that never answers, and a count that carries over a SIGKILL and respawn of the mock.
//! The call log is read outside the mock, with the reader tests include by path, and through
//! `broca-mock calls`.
//!
//! One test, because stopping the in-process daemon means SIGTERM to this process. Every wait
//! is bounded.

use broca_mock::tools::call_log;

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cortexkit_role_tool_provider::catalog::CatalogAnswer;
use cortexkit_role_tool_provider::describe::check_describe;
use cortexkit_role_tool_provider::result::{self, ContentPart, ToolResult};
use cortexkit_role_tool_provider::{errors, is_keepalive, CALL_KEEPALIVE_CAPABILITY, PROVIDES};
use serde_json::{json, Value};
use subc_client_rs::{CallError, CallOptions, ConsumerOptions, RouteHandle, SubcConsumer};
use subc_daemon::bootstrap::{run_with_config, BootstrapConfig, BootstrapError};
use subc_protocol::scope::ScopeSelector;
use subc_protocol::{BindIdentity, Principal, RouteTarget};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

const MODULE: &str = "mock-tools";
/// The longest wait for any one thing.
const STEP: Duration = Duration::from_secs(15);
const KEEPALIVE_MS: u64 = 100;

const TOOLS: &str = r#"{
  // The built-ins, plus one tool per route scope and one with a tool-result/v1 body.
  "builtins": true,
  "keepalive_interval_ms": 100,
  "scopes": [{"ref": "lead-1", "scope_epoch": 1, "kind": "head",
              "carriers": [{"principal": {"kind": "direct"}}]}],
  "tools": [
    {"name": "plan", "scopes": ["head"], "behaviour": {"text": "planned"}},
    {"name": "local", "scopes": ["unscoped"], "presets": [], "behaviour": {"text": "local"}},
    {"name": "report", "result_format": "tool-result/v1", "behaviour": {"text": "all done"}},
  ],
}"#;

struct Rig {
    dir: tempfile::TempDir,
    rt: Runtime,
    daemon_rt: Runtime,
    daemon: Option<JoinHandle<Result<(), BootstrapError>>>,
    consumer: Option<SubcConsumer>,
}

impl Rig {
    fn start() -> Rig {
        // A plain direct caller (subc-wire.md §20.4).
        for var in ["SUBC_MODULE_ID", "SUBC_LAUNCH_NONCE", "SUBC_LAUNCH_NONCE_FD"] {
            std::env::remove_var(var);
        }
        let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        let dir = tempfile::Builder::new().prefix("bmt").tempdir_in("/tmp").unwrap();
        let root = dir.path();
        for sub in ["config", "config/cortexkit", "runtime", "run", "run/logs"] {
            fs::DirBuilder::new().mode(0o700).create(root.join(sub)).unwrap();
        }
        fs::write(root.join("tools.jsonc"), TOOLS).unwrap();
        let mock = broca_mock::exe();
        let args = json!(["--tools", root.join("tools.jsonc"), "--call-log", root.join("calls.jsonl")]);
        let module = json!({"program": mock, "args": args, "env": {"CK_LOG": "info"}, "enabled": true, "reserved": true,
                            "restart": {"max_restarts": 5, "window_secs": 600, "backoff_ms": 100, "max_backoff_ms": 200}});
        let config = json!({"version": 1, "modules": {MODULE: module}});
        fs::write(root.join("config/cortexkit/subc.jsonc"), config.to_string()).unwrap();
        let conn_file = root.join("runtime/subc-connection.json");
        let daemon_config = BootstrapConfig::new(conn_file.clone(), 0)
            .with_daemon_config_path(root.join("config/cortexkit/subc.jsonc"))
            .unwrap()
            .with_capture_logs_dir(root.join("run/logs"))
            .with_terminal_journal_path(root.join("run/terminals.jsonl"));
        let runtime = |name: &str| {
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(name).enable_all().build()
        };
        let daemon_rt = runtime("subc-daemon").unwrap();
        let rt = runtime("test-client").unwrap();
        let daemon = daemon_rt.spawn(run_with_config(daemon_config));
        let mut rig = Rig { dir, rt, daemon_rt, daemon: Some(daemon), consumer: None };
        let until = Instant::now() + STEP;
        while !conn_file.exists() {
            assert!(Instant::now() < until, "{} did not appear", conn_file.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let opts =
            ConsumerOptions { handshake_timeout: Duration::from_secs(2), call_timeout: STEP, ..Default::default() };
        let consumer = loop {
            match rig.rt.block_on(SubcConsumer::connect(&conn_file, opts.clone())) {
                Ok(c) => break c,
                Err(e) => assert!(Instant::now() < until, "cannot connect: {e}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        rig.consumer = Some(consumer);
        rig
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn consumer(&self) -> &SubcConsumer {
        self.consumer.as_ref().unwrap()
    }

    fn call_log(&self) -> PathBuf {
        self.root().join("calls.jsonl")
    }

    fn mock_log(&self) -> String {
        fs::read_to_string(self.root().join(format!("run/logs/{MODULE}.stderr.log"))).unwrap_or_default()
    }

    fn journal(&self) -> Vec<Value> {
        let text = fs::read_to_string(self.root().join("run/terminals.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// The mock's catalog entry once it is registered and ready.
    fn wait_registered(&self) -> subc_client_rs::CatalogEntry {
        let until = Instant::now() + STEP;
        loop {
            if let Ok(list) = self.rt.block_on(self.consumer().catalog_list()) {
                if let Some(e) = list.modules.into_iter().find(|m| m.module_id == MODULE && m.ready) {
                    return e;
                }
            }
            assert!(Instant::now() < until, "the mock did not register:\n{}", self.mock_log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The supervised mock's pid: a child of this process running the broca-mock binary.
    fn mock_pid(&self) -> Option<i32> {
        let exe = broca_mock::exe();
        let me = std::process::id() as i32;
        fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            if fs::read_link(e.path().join("exe")).ok()? != exe {
                return None;
            }
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid: i32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == me).then_some(pid)
        })
    }

    fn counts(&self) -> call_log::Counts {
        call_log::read(&self.call_log()).unwrap()
    }

    /// Waits until the call log satisfies `pred`.
    fn wait_log(&self, what: &str, pred: impl Fn(&call_log::Counts) -> bool) -> call_log::Counts {
        let until = Instant::now() + STEP;
        loop {
            let c = self.counts();
            if pred(&c) {
                return c;
            }
            assert!(Instant::now() < until, "the call log never showed {what}: {c:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        let daemon = self.daemon.take().expect("the daemon runs");
        assert!(!daemon.is_finished(), "the daemon stopped early: {:?}", self.daemon_rt.block_on(daemon));
        // SAFETY: kill(2) on our own pid; the daemon's SIGTERM handler is installed by now.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
        let stopped = self.daemon_rt.block_on(async { tokio::time::timeout(Duration::from_secs(40), daemon).await });
        assert!(stopped.expect("the daemon stopped within 40 s").expect("no panic").is_ok());
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if self.daemon.is_some() {
            if let Some(pid) = self.mock_pid() {
                // SAFETY: the module process the daemon started for this rig.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn target() -> RouteTarget {
    RouteTarget::ToolProvider { module_id: MODULE.into() }
}

/// Runner-style identity: `harness: "runner"` and the session.
fn identity(session: &str) -> BindIdentity {
    BindIdentity::new("runner", session)
}

fn options() -> CallOptions {
    CallOptions { timeout: STEP, ..Default::default() }
}

fn request(name: &str, arguments: Value) -> Vec<u8> {
    json!({"name": name, "arguments": arguments}).to_string().into_bytes()
}

fn tool_names(answer: &CatalogAnswer) -> Vec<&str> {
    answer.tools.iter().map(|t| t.name.as_str()).collect()
}

/// A call on a route opened once (the SDK caches it by target, identity and options).
struct Route<'a> {
    rig: &'a Rig,
    handle: RouteHandle,
}

impl Route<'_> {
    fn call(&self, body: Vec<u8>) -> Result<Vec<u8>, CallError> {
        self.rig.rt.block_on(self.rig.consumer().request(&self.handle, body, options()))
    }

    fn ok(&self, body: Vec<u8>) -> Value {
        serde_json::from_slice(&self.call(body).expect("an answer")).expect("a JSON answer")
    }

    fn refused(&self, body: Vec<u8>) -> subc_protocol::ErrorBody {
        match self.call(body) {
            Err(CallError::Module(e)) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn catalog(&self, arguments: Value) -> CatalogAnswer {
        serde_json::from_value(self.ok(request("tool.catalog", arguments))).expect("a CatalogAnswer")
    }
}

fn open<'a>(rig: &'a Rig, session: &str, opts: CallOptions) -> Route<'a> {
    let handle = rig.rt.block_on(rig.consumer().open_route(target(), identity(session), opts)).expect("route.open");
    Route { rig, handle }
}

fn open_scoped<'a>(rig: &'a Rig, session: &str) -> Route<'a> {
    let owner = Principal::Reserved { module_id: MODULE.into() };
    let scope = ScopeSelector::new(owner, "lead-1", Some(1));
    let handle = rig
        .rt
        .block_on(rig.consumer().open_route_scoped(target(), identity(session), scope, options()))
        .expect("a route under the mock's own scope");
    Route { rig, handle }
}

fn describe_and_catalogs(rig: &Rig) {
    let entry = rig.wait_registered();
    assert!(entry.nonce_verified, "{entry:?}");
    let provides = entry.capabilities.as_ref().map(|c| c.provides.clone()).unwrap_or_default();
    assert_eq!(provides, [PROVIDES, CALL_KEEPALIVE_CAPABILITY], "{entry:?}");

    let plain = open(rig, "s1", options());
    let describe = plain.ok(request("role.describe", json!({})));
    let checked = check_describe(&describe).unwrap_or_else(|p| panic!("{p:?}: {describe}"));
    assert_eq!(checked.major(PROVIDES).unwrap().ops, ["role.describe", "tool.catalog"]);
    assert_eq!(describe["capabilities"], json!([]), "{describe}");

    // Unscoped: the preset-less catalog lists every tool offered there, and the presets.
    let all = plain.catalog(json!({}));
    assert_eq!(tool_names(&all), ["echo", "sleep", "fail", "big", "hang", "counter", "whoami", "local", "report"]);
    assert_eq!(all.presets, ["default", "worker"]);
    cortexkit_role_tool_provider::catalog::check_presets(&all, None).unwrap();
    for tool in &all.tools {
        assert_eq!(
            tool.schema_digest,
            cortexkit_role_tool_provider::catalog::schema_digest(&tool.input_schema).unwrap()
        );
        cortexkit_role_tool_provider::catalog::check_reply(tool).unwrap();
    }
    let worker = plain.catalog(json!({"preset": "worker"}));
    assert_eq!(tool_names(&worker), ["echo", "sleep", "counter", "whoami", "report"]);
    assert!(worker.presets.is_empty(), "presets are listed only without a preset");
    assert_ne!(worker.catalog_digest, all.catalog_digest);
    let cheap = plain.ok(request("tool.catalog", json!({"preset": "worker", "digest_only": true})));
    assert_eq!(cheap, json!({"generation": worker.generation, "catalog_digest": worker.catalog_digest}));
    let e = plain.refused(request("tool.catalog", json!({"preset": "boss"})));
    assert_eq!((e.code.as_str(), errors::invalid_request_field(&e)), ("invalid_request", Some("preset")), "{e:?}");
    let e = plain.refused(request("tool.catalog", json!({"params": {"behavior": "x"}})));
    assert_eq!(errors::invalid_request_field(&e), Some("params.behavior"), "{e:?}");

    // Under the daemon-stamped head scope the catalog changes: `plan` in, `local` out.
    let scoped = open_scoped(rig, "s2");
    let head = scoped.catalog(json!({"preset": "worker"}));
    assert_eq!(tool_names(&head), ["echo", "sleep", "counter", "whoami", "plan", "report"]);
    let stamp = scoped.ok(with(request("whoami", json!({})), "preset", "worker"));
    assert_eq!(stamp["scope"]["ref"], "lead-1", "{stamp}");
    assert_eq!(stamp["scope"]["kind"], "head", "{stamp}");
    assert_eq!(stamp["scope"]["owner"], json!({"kind": "reserved", "module_id": MODULE}), "{stamp}");
    assert_eq!(stamp["principal"], json!({"kind": "direct"}), "{stamp}");
    assert_eq!((stamp["identity"]["harness"].as_str(), stamp["preset"].as_str()), (Some("runner"), Some("worker")));
    // A scoped call names its preset; an unscoped route does not see `plan`.
    let e = scoped.refused(request("plan", json!({})));
    assert_eq!(errors::invalid_request_field(&e), Some("preset"), "{e:?}");
    assert_eq!(scoped.ok(with(request("plan", json!({})), "preset", "worker")), json!("planned"));
    assert_eq!(plain.refused(request("plan", json!({}))).code, "unknown_tool");
}

/// A request body with its top-level `member` set (`call_key`, `preset`).
fn with(body: Vec<u8>, member: &str, value: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&body).unwrap();
    v[member] = json!(value);
    v.to_string().into_bytes()
}

fn with_call_key(body: Vec<u8>, key: &str) -> Vec<u8> {
    with(body, "call_key", key)
}

fn calls(rig: &Rig) {
    let plain = open(rig, "s1", options());
    // An immediate result, counted once under its call_key.
    let echoed = plain.ok(with_call_key(request("echo", json!({"text": "hi"})), "s1:10"));
    assert_eq!(echoed, json!({"text": "hi"}));
    let e = plain.refused(with_call_key(request("echo", json!({})), "has space"));
    assert_eq!(errors::invalid_request_field(&e), Some("call_key"), "{e:?}");

    // A delay with keepalives, on a route that declared call-keepalive/v1.
    let keep = CallOptions { timeout: STEP, ..Default::default() }
        .with_consumer_capability(CALL_KEEPALIVE_CAPABILITY)
        .unwrap();
    let alive = open(rig, "s1", keep);
    let mut pushes = rig.consumer().push_events(&alive.handle).unwrap();
    let started = Instant::now();
    let slept = alive.ok(request("sleep", json!({"ms": 800})));
    assert!(started.elapsed() >= Duration::from_millis(800), "{:?}", started.elapsed());
    assert_eq!(slept, json!({"ms": 800}));
    let mut keepalives = 0;
    while let Ok(push) = pushes.try_recv() {
        assert!(is_keepalive(&push.body), "{:?}", String::from_utf8_lossy(&push.body));
        keepalives += 1;
    }
    // One every 100 ms while the work advances (a loaded machine may stretch the gaps).
    assert!(keepalives >= (800 / KEEPALIVE_MS / 2) as usize, "{keepalives} keepalives in 800 ms");
    // No keepalives on a route that did not declare them.
    let mut quiet = rig.consumer().push_events(&plain.handle).unwrap();
    assert_eq!(plain.ok(request("sleep", json!({"ms": 300}))), json!({"ms": 300}));
    assert!(quiet.try_recv().is_err(), "a keepalive on a route that did not declare them");

    // A refusal (typed body, detail inside), and a malformed answer.
    let e = plain.refused(request("fail", json!({})));
    assert_eq!(e.code, "tool_unavailable");
    assert_eq!(e.detail, Some(json!({"tool": "fail", "reason": "under_review"})));
    assert_eq!(plain.call(request("fail", json!({"mode": "malformed"}))).unwrap(), b"this is not JSON {");

    // An oversize result: 70 KiB of model-visible text in one reply.
    let big = plain.ok(request("big", json!({})));
    assert_eq!(result::legacy_model_visible_bytes(&big), 70 * 1024);
    assert!(result::legacy_model_visible_bytes(&big) > result::MAX_MODEL_VISIBLE_BYTES);

    // tool-result/v1 only on a route that declared it.
    assert_eq!(plain.ok(request("report", json!({}))), json!("all done"));
    let tr = CallOptions { timeout: STEP, ..Default::default() }.with_consumer_capability("tool-result/v1").unwrap();
    let body: ToolResult = serde_json::from_value(open(rig, "s1", tr).ok(request("report", json!({})))).unwrap();
    result::validate(&body).unwrap();
    assert_eq!(body.content, [ContentPart::text("all done")]);

    // A call that never answers, until CANCEL: one `cancelled` terminal, and the cancel is logged.
    let (cancel, reply) = rig.consumer().request_cancellable(
        &plain.handle,
        with_call_key(request("hang", json!({})), "s1:20"),
        options(),
    );
    let answered = rig.rt.block_on(async {
        tokio::pin!(reply);
        tokio::select! {
            r = &mut reply => panic!("hang answered on its own: {r:?}"),
            () = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        cancel.cancel().await;
        reply.await
    });
    match answered {
        Err(CallError::Module(e)) => assert_eq!(e.code, "cancelled", "{e:?}"),
        other => panic!("expected cancelled, got {other:?}"),
    }
    let log = rig.wait_log("the cancel", |c| c.keys.get("call_key:s1:20").is_some_and(|k| k.cancels == 1));
    assert!(log.entries.iter().any(|e| matches!(e, call_log::Entry::Reply(r) if r.key == "call_key:s1:20" && r.outcome == call_log::Outcome::Cancelled)));
    assert!(plain.call(request("echo", json!({}))).is_ok(), "the cancelled call's credit was released");

    // The counter counts one key's calls; a second send of one call_key shows as a duplicate.
    assert_eq!(plain.ok(with_call_key(request("counter", json!({})), "s1:30"))["count"], 1);
    assert_eq!(plain.ok(with_call_key(request("counter", json!({})), "s1:30"))["count"], 2);

    let health = rig.rt.block_on(rig.consumer().supervisor_health_probe(MODULE)).unwrap();
    let metrics = health.metrics.expect("metrics");
    assert!(metrics["calls"].as_u64().unwrap() >= 12 && metrics["cancels"] == 1, "{metrics}");
}

/// The counts carry over a SIGKILL of the mock: the respawned process reads its log.
fn counts_survive_a_restart(rig: &Rig) {
    let pid = rig.mock_pid().expect("the mock's pid");
    // SAFETY: the module process the daemon started for this rig.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let until = Instant::now() + STEP;
    while rig.mock_pid().is_none_or(|p| p == pid) {
        assert!(Instant::now() < until, "the mock was not respawned");
        std::thread::sleep(Duration::from_millis(20));
    }
    rig.wait_registered();
    let body = with_call_key(request("counter", json!({})), "s1:30");
    let until = Instant::now() + STEP;
    let answer = loop {
        // The old route died with the process: a new one binds to the new incarnation.
        match rig.rt.block_on(rig.consumer().call(target(), identity("s3"), body.clone(), options())) {
            Ok(a) => break a,
            Err(e) => assert!(Instant::now() < until, "no answer after the respawn: {e:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["count"], 3, "{answer}");
}

fn check_the_log(rig: &Rig) {
    let counts = rig.counts();
    assert!(!counts.torn_tail);
    assert_eq!(counts.calls_of("call_key:s1:10"), 1, "{counts:?}");
    assert_eq!(counts.calls_of("call_key:s1:20"), 1);
    assert_eq!(counts.calls_of("call_key:s1:30"), 3);
    assert_eq!(counts.calls_of(r#"args:sleep:{"ms":800}"#), 1);
    assert_eq!(counts.calls_to("whoami").count(), 1);
    // Every call received counts, refused ones too: `plan` was refused twice and served once.
    let dups: Vec<&str> = counts.duplicates().into_iter().map(|(k, _)| k).collect();
    assert_eq!(dups, ["args:plan:{}", "args:report:{}", "call_key:s1:30"], "{counts:?}");
    assert!(counts.role_ops["tool.catalog"] >= 6 && counts.role_ops["role.describe"] == 1, "{:?}", counts.role_ops);
    // Every call line precedes its end line.
    for (i, e) in counts.entries.iter().enumerate() {
        if let call_log::Entry::Reply(r) = e {
            let call_at = counts.entries[..i]
                .iter()
                .position(|c| matches!(c, call_log::Entry::Call(c) if c.corr == r.corr && c.route == r.route));
            assert!(call_at.is_some(), "a reply line without its call line: {r:?}");
        }
    }

    // The same totals through the CLI; --at-most-once fails on the duplicate.
    let cli = |extra: &[&str]| {
        let out = std::process::Command::new(broca_mock::exe())
            .args(["calls", "--call-log"])
            .arg(rig.call_log())
            .args(extra)
            .env_remove("CK_LOG")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };
    let (code, json_out) = cli(&["--json"]);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(v["calls"], counts.calls);
    assert_eq!(v["duplicates"], json!(dups));
    let (code, text) = cli(&["--at-most-once"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("3 ran more than once"), "{text}");
}

#[test]
fn broca_mock_serves_tool_provider_v1_under_the_real_daemon() {
    let started = Instant::now();
    let mut rig = Rig::start();
    describe_and_catalogs(&rig);
    calls(&rig);
    counts_survive_a_restart(&rig);
    check_the_log(&rig);
    rig.stop();
    let exits: Vec<Value> =
        rig.journal().into_iter().filter(|e| e["module_id"] == MODULE && e.get("exit_code").is_some()).collect();
    let last = exits.last().unwrap_or_else(|| panic!("no exit journaled: {:?}\n{}", rig.journal(), rig.mock_log()));
    assert_eq!(last["exit_code"], 0, "{last}\n{}", rig.mock_log());
    assert!(rig.mock_log().contains("exiting cleanly"), "{}", rig.mock_log());
    eprintln!("mock_tool_provider took {:?}", started.elapsed());
}
