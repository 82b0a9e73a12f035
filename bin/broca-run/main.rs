//! `broca-run`: one blocking CLI turn on the shared core. One lineage per `--session`, one
//! episode per invocation; text streams to stdout as it arrives.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broca::actor::admission::{Admission, Arrival, Checked};
use broca::actor::decide;
use broca::agent::{self, DisplayEvent, LoopOptions, NoTools, Output, RunCommand, ToolDispatcher, TurnOutcome};
use broca::catalog::route::RouteOverrides;
use broca::catalog::Catalog;
use broca::lineage::{read, Shared};
use broca::message::{Message, RunUsage};
use broca::provider::client::{HttpClient, ModelClient};
use broca::provider::config::AuthSource;
use broca::record::{CancelAt, FinishReason};
use broca::replay::Resolution;
use broca::session_key::SessionKey;
use broca::state_root::{RootEnv, StateRoot};
use broca::subc::consumer::Consumer;
use broca::tools::ToolPlane;
use broca::wire::send::{ModelChoice, SendParams};
use broca::wire::Refusal;
use parking_lot::RwLock;

mod cli;
mod credentials;
mod demo;

use cli::{Args, ReasoningMode};

const EXIT_OK: u8 = 0;
const EXIT_RUN_ERROR: u8 = 1;
const EXIT_REFUSED: u8 = 2;
const EXIT_CANCELLED: u8 = 130;

static SIGINT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    SIGINT.store(true, Ordering::SeqCst);
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("CK_LOG", "warn")).init();
    let args = match cli::parse(std::env::args().skip(1)) {
        Ok(cli::Parsed::Run(args)) => *args,
        Ok(cli::Parsed::Help) => {
            // A closed pipe (`broca-run --help | head`) is not an error worth a panic.
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broca-run: {e}\n\n{}", cli::USAGE);
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    ExitCode::from(run(args))
}

/// Everything after argument parsing; returns the exit code.
fn run(mut args: Args) -> u8 {
    let demo = if args.demo {
        match demo::prepare(&mut args) {
            Ok(d) => Some(d),
            Err(e) => return fail(&args, EXIT_RUN_ERROR, &format!("demo setup failed: {e}")),
        }
    } else {
        None
    };
    let root = match &args.state_root {
        Some(dir) => StateRoot::at(dir),
        None => StateRoot::resolve(&RootEnv::from_process(None)),
    };
    let shared = match root.map_err(|e| e.to_string()).and_then(|r| Shared::open(r).map_err(|e| e.to_string())) {
        Ok(s) => s,
        Err(e) => return fail(&args, EXIT_RUN_ERROR, &e),
    };
    // One turn, one process: its few reads share the writer's connection.
    shared.store.use_one_connection();
    let key = SessionKey::new(&args.project_root, &args.harness, &args.session);
    if args.read {
        return read_transcript(&args, &shared, &key);
    }
    // Tools, dev-tools credentials and the catalog come from other modules, through the subc
    // daemon a connection file names (none without one).
    let consumer = match credentials::subc_file(&args) {
        None => None,
        Some(file) => match Consumer::connect(&file, None) {
            Ok(consumer) => Some(consumer),
            Err(e) => return fail(&args, EXIT_RUN_ERROR, &format!("cannot reach the subc daemon: {e}")),
        },
    };
    let plane = consumer.clone().map(|c| Arc::new(ToolPlane::new(c)));
    let admission = match admission(&args, &shared, plane.clone(), consumer.as_ref()) {
        Ok(a) => a,
        Err(refusal) => return refuse(&args, &refusal),
    };
    if let Some(consumer) = &consumer {
        refresh_catalog(&admission, consumer, &shared.clock);
    }
    let mut bearer = None;
    // A new session is checked (its model resolved) before anything is created, so a refusal
    // writes nothing.
    let mut checked = None;
    if !shared.wal_path(&key).exists() {
        if args.model.is_none() {
            return fail(&args, EXIT_REFUSED, "--model PROVIDER/MODEL is required for a new session");
        }
        let prompt = match prompt_text(&args) {
            Ok(p) => p,
            Err(e) => return fail(&args, EXIT_REFUSED, &e),
        };
        match turn_send(&args, &key, &prompt)
            .and_then(|send| precheck(&admission, &key, &send, false, false).map(|r| (send, r)))
        {
            Ok(c) => checked = Some(c),
            Err(refusal) => return refuse(&args, &refusal),
        }
        match credentials::bearer(
            &args,
            consumer.as_ref(),
            &admission.catalog,
            args.model.as_deref().unwrap_or_default(),
        ) {
            Ok(b) => bearer = b,
            Err(e) => return fail(&args, EXIT_REFUSED, &e),
        }
    }
    let mut lineage = match shared.open_lineage(&key) {
        Ok(l) => l,
        Err(e) => return refuse(&args, &e.refusal()),
    };
    let mut out = Printer::new(&args);
    if !matches!(lineage.state().resolution(), Resolution::Paused { .. }) {
        if !lineage.state().queue.is_empty() {
            let why = "the session has sends queued by the module; let the module run them first";
            return fail(&args, EXIT_REFUSED, why);
        }
        if args.model.is_none() {
            // A continued session keeps the model (and variant) of its last turn.
            match lineage.state().last.as_ref().map(|e| e.config.config()) {
                Some(Some(c)) => {
                    args.model = Some(format!("{}/{}", c.provider, c.model));
                    args.variant = args.variant.take().or_else(|| c.variant.clone());
                }
                Some(None) => {
                    let why = "the session's last model is unreadable by this build: name one with --model";
                    return fail(&args, EXIT_REFUSED, why);
                }
                None => return fail(&args, EXIT_REFUSED, "--model PROVIDER/MODEL is required for a new session"),
            }
        }
        if checked.is_none() {
            let model = args.model.clone().unwrap_or_default();
            match credentials::bearer(&args, consumer.as_ref(), &admission.catalog, &model) {
                Ok(b) => bearer = b,
                Err(e) => return fail(&args, EXIT_REFUSED, &e),
            }
        }
        let has_episode = lineage.state().last.is_some();
        let (send, checked) = match checked {
            Some(c) => c,
            None => {
                let prompt = match prompt_text(&args) {
                    Ok(p) => p,
                    Err(e) => return fail(&args, EXIT_REFUSED, &e),
                };
                match turn_send(&args, &key, &prompt)
                    .and_then(|s| precheck(&admission, &key, &s, true, has_episode).map(|r| (s, r)))
                {
                    Ok(c) => c,
                    Err(refusal) => return refuse(&args, &refusal),
                }
            }
        };
        // Admitted as the module admits a send (frozen facts checked, the rest inherited), and
        // written only once every check passed.
        let mut units = Vec::new();
        match decide::send(&admission, &shared.store, &mut lineage, send, checked, &mut units) {
            Ok(reply) => out.session(&args.session, reply.run_id.as_deref().unwrap_or_default()),
            Err(refusal) => return refuse(&args, &refusal),
        }
        out.emit(Output::Control(units));
    }
    let commands = watch_sigint();
    let code_assist_project = args
        .code_assist_project
        .clone()
        .or_else(|| admission.config.code_assist_project.clone())
        .or_else(|| ["GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_PROJECT_ID"].iter().find_map(|v| non_empty_env(v)));
    let opts = LoopOptions {
        idle_timeout: Duration::from_millis(args.idle_timeout_ms),
        bearer,
        code_assist_project,
        ..LoopOptions::default()
    };
    let tools: Arc<dyn ToolDispatcher> = match plane {
        Some(plane) => plane,
        None => Arc::new(NoTools),
    };
    let http;
    let client: &dyn ModelClient = match &demo {
        Some(demo) => &demo.client,
        None => {
            http = HttpClient::default();
            &http
        }
    };
    let outcome = agent::drive(&mut lineage, client, &tools, &commands, &opts, &mut |o| out.emit(o));
    let usage = lineage.state().last.as_ref().map(|e| e.usage.clone()).unwrap_or_default();
    drop(lineage);
    match outcome {
        Ok(outcome) => out.finish(&outcome, &usage),
        Err(e) => fail(&args, EXIT_RUN_ERROR, &e.to_string()),
    }
}

/// The rules this turn is admitted by: the module's own ([`Admission`]), over the state root's
/// LKG catalog and `broca.jsonc`.
/// The provider of a `provider/model` id.
/// A variable's value, unless unset or empty.
fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn provider_of(model: &str) -> Option<&str> {
    model.split_once('/').map(|(provider, _)| provider)
}

fn admission(
    args: &Args,
    shared: &Shared,
    tools: Option<Arc<ToolPlane>>,
    consumer: Option<&Consumer>,
) -> Result<Admission, Refusal> {
    let broca_config = broca::config::BrocaConfig::load(&shared.root).map_err(|e| {
        let detail = Some(broca::detail!("class" => "permanent"));
        Refusal::new(broca::wire::RefusalCode::InvalidParams, format!("broca.jsonc: {e}"), detail)
    })?;
    let lkg = shared.root.catalog_path();
    let mut auth_methods = broca_config.auth_methods.clone();
    if let (Some(method), Some(provider)) = (args.auth_method, args.model.as_deref().and_then(provider_of)) {
        auth_methods.insert(provider.to_owned(), method);
    }
    let overrides = RouteOverrides {
        base_url_override: args.base_url.clone().or_else(|| std::env::var("BROCA_PROVIDER_BASE_URL").ok()),
        auth: if credentials::has_bearer_source(args, consumer) { AuthSource::Bearer } else { AuthSource::None },
        auth_methods,
        ..Default::default()
    };
    Ok(Admission {
        catalog: Arc::new(RwLock::new(Catalog::load_lkg(&lkg))),
        config: Arc::new(broca_config),
        overrides,
        lkg,
        tools,
        credentials: None,
    })
}

/// One catalog poll through the daemon when the LKG is missing, unreadable or older than the
/// module's poll interval; a failed poll keeps whatever LKG there is (and admission names it).
fn refresh_catalog(admission: &Admission, consumer: &Consumer, clock: &broca::clock::SharedClock) {
    use broca::catalog::{lkg, poller};
    let fresh = admission.catalog.read().is_ok()
        && lkg::written_at_ms(&admission.lkg)
            .is_some_and(|at| clock.now_ms().saturating_sub(at) < poller::POLL_INTERVAL.as_millis() as u64);
    if fresh {
        return;
    }
    let poller = poller::Poller {
        source: Arc::new(consumer.clone()),
        catalog: Arc::clone(&admission.catalog),
        lkg: admission.lkg.clone(),
        health: Default::default(),
        interval: poller::POLL_INTERVAL,
        clock: Arc::clone(clock),
    };
    if let Err(e) = poller.poll_once() {
        log::warn!("catalog refresh through fusiform failed ({}); using the state root's LKG if any", e.code());
    }
}

/// The turn as the send a client would make: the prompt, and the model and limits the flags name.
fn turn_send(args: &Args, key: &SessionKey, prompt: &str) -> Result<SendParams, Refusal> {
    let mut send = broca::wire::send::parse(&serde_json::json!({ "prompt": prompt }), key)?;
    send.model = args.model.clone().map(|id| ModelChoice { id, variant: args.variant.clone() });
    send.system = args.system.clone();
    send.max_output_tokens = args.max_output_tokens;
    send.max_steps = args.max_steps;
    if !args.tool_providers.is_empty() {
        let items: Vec<serde_json::Value> = args
            .tool_providers
            .iter()
            .map(|(module, preset)| match preset {
                Some(p) => serde_json::json!({"provider": module, "preset": p, "params": {}}),
                None => serde_json::json!({"provider": module, "params": {}}),
            })
            .collect();
        send.plan = Some(broca::wire::plan::decode(&serde_json::json!({ "tool_items": items }))?);
    }
    Ok(send)
}

/// The module's pre-check, for a CLI turn (never scoped, never shutting down).
fn precheck(
    admission: &Admission,
    key: &SessionKey,
    send: &SendParams,
    exists: bool,
    has_episode: bool,
) -> Result<Checked, Refusal> {
    admission.precheck(send, Arrival { key, scoped: false, sealing: false, exists, has_episode })
}

fn prompt_text(args: &Args) -> Result<String, String> {
    match args.prompt.as_deref() {
        Some("-") => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| format!("reading the prompt from stdin: {e}"))?;
            Ok(s)
        }
        Some(p) if !p.trim().is_empty() => Ok(p.to_string()),
        _ => Err("a prompt is required (an argument, or - to read stdin)".into()),
    }
}

/// Ctrl-C becomes `cancel now`; a second Ctrl-C falls back to the default (immediate exit).
fn watch_sigint() -> crossbeam_channel::Receiver<RunCommand> {
    let (tx, rx) = crossbeam_channel::bounded(4);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(20));
        if SIGINT.load(Ordering::SeqCst) {
            // SAFETY: restoring the default disposition is async-signal-safe and done once.
            unsafe {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
            }
            let _ = tx.send(RunCommand::Cancel(CancelAt::Now));
            return;
        }
    });
    rx
}

fn read_transcript(args: &Args, shared: &Shared, key: &SessionKey) -> u8 {
    let Some(reader) = broca::lineage::reader::Reader::open(shared, key) else {
        return fail(
            args,
            EXIT_REFUSED,
            &format!("session {:?} has no transcript under {}", args.session, shared.root.path().display()),
        );
    };
    let page = match read::transcript(&reader, 0, u64::MAX) {
        Ok(p) => p,
        Err(e) => return refuse(args, &e.refusal()),
    };
    let mut stdout = std::io::stdout().lock();
    for (internal, message) in page.messages {
        // The ordinals and ids session.read serves (from 1).
        let (ordinal, mid) =
            (broca::lineage::projection::served_ordinal(internal), broca::lineage::projection::mid(internal));
        let line = if args.json {
            serde_json::json!({"ordinal": ordinal, "mid": mid, "message": message}).to_string()
        } else {
            format!(
                "[{ordinal}] {}: {}",
                serde_json::to_value(message.role).unwrap_or_default().as_str().unwrap_or("?"),
                summary(&message)
            )
        };
        if writeln!(stdout, "{line}").is_err() {
            break;
        }
    }
    EXIT_OK
}

/// A one-screen rendering of a message for `--read`.
fn summary(m: &Message) -> String {
    use broca::message::Part;
    m.content
        .iter()
        .map(|p| match p {
            Part::Text { text } => text.clone(),
            Part::Reasoning { text, .. } => format!("(reasoning) {text}"),
            Part::RedactedReasoning { .. } => "(redacted reasoning)".into(),
            Part::ToolCall { tool_name, input, .. } => format!("(call {tool_name} {input})"),
            Part::ToolResult { output, is_error, .. } => {
                format!("(result{} {output})", if *is_error { ", error" } else { "" })
            }
            Part::Image { media_type, .. } => format!("(image {media_type})"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn refuse(args: &Args, refusal: &Refusal) -> u8 {
    if args.json {
        println!(
            "{}",
            serde_json::json!({"kind": "refusal", "refusal": serde_json::from_str::<serde_json::Value>(&refusal.to_json()).unwrap_or_default()})
        );
    } else {
        eprintln!("broca-run: {} ({})", refusal.message, refusal.code);
    }
    EXIT_REFUSED
}

fn fail(args: &Args, code: u8, message: &str) -> u8 {
    if args.json {
        println!("{}", serde_json::json!({"kind": "error", "message": message}));
    } else {
        eprintln!("broca-run: {message}");
    }
    code
}

/// Writes the turn: text to stdout as it arrives (or JSON lines), status to stderr on a tty.
struct Printer {
    json: bool,
    reasoning: ReasoningMode,
    status_tty: bool,
    /// Print the outcome and usage line on stderr even when the run completed.
    summary: bool,
    in_reasoning: bool,
    wrote_text: bool,
}

impl Printer {
    fn new(args: &Args) -> Printer {
        let tty = std::io::stdout().is_terminal();
        // The demo shows everything a turn has: reasoning, text and usage.
        let reasoning = match args.reasoning {
            ReasoningMode::Auto if tty => ReasoningMode::Dim,
            ReasoningMode::Auto if args.demo => ReasoningMode::Plain,
            ReasoningMode::Auto => ReasoningMode::Hide,
            other => other,
        };
        let status_tty = std::io::stderr().is_terminal();
        Printer {
            json: args.json,
            reasoning,
            status_tty,
            summary: status_tty || args.demo,
            in_reasoning: false,
            wrote_text: false,
        }
    }

    fn session(&mut self, session: &str, run_id: &str) {
        if self.json {
            println!("{}", serde_json::json!({"kind": "session", "session": session, "run_id": run_id}));
        } else if self.status_tty {
            eprintln!("\x1b[2msession {session} · {run_id}\x1b[0m");
        }
    }

    fn emit(&mut self, o: Output) {
        let mut stdout = std::io::stdout().lock();
        if self.json {
            let lines: Vec<serde_json::Value> = match o {
                Output::Control(units) => units.iter().map(broca::fanout::control_frame).collect(),
                Output::Display(d) => vec![broca::fanout::display_frame(&d)],
            };
            for l in lines {
                let _ = writeln!(stdout, "{l}");
            }
            let _ = stdout.flush();
            return;
        }
        match o {
            Output::Display(DisplayEvent::TextDelta { text, .. }) => {
                if self.in_reasoning {
                    let _ = write!(stdout, "\n\n");
                    self.in_reasoning = false;
                }
                self.wrote_text = true;
                let _ = write!(stdout, "{text}");
            }
            Output::Display(DisplayEvent::ReasoningDelta { text, .. }) => match self.reasoning {
                ReasoningMode::Hide | ReasoningMode::Auto => {}
                ReasoningMode::Dim => {
                    self.in_reasoning = true;
                    let _ = write!(stdout, "\x1b[2m{text}\x1b[0m");
                }
                ReasoningMode::Plain => {
                    self.in_reasoning = true;
                    let _ = write!(stdout, "{text}");
                }
            },
            Output::Display(DisplayEvent::Status { text }) if self.status_tty => eprintln!("\x1b[2m… {text}\x1b[0m"),
            _ => {}
        }
        let _ = stdout.flush();
    }

    fn finish(&mut self, outcome: &TurnOutcome, usage: &RunUsage) -> u8 {
        if !self.json && self.wrote_text {
            println!();
        }
        let (code, what) = match (outcome.reason, outcome.paused) {
            (Some(FinishReason::Completed), _) => (EXIT_OK, "completed".to_string()),
            (Some(FinishReason::Cancelled), _) => (EXIT_CANCELLED, "cancelled".to_string()),
            (Some(reason), _) => (EXIT_RUN_ERROR, reason.as_str().to_string()),
            (None, Some(_)) => (EXIT_RUN_ERROR, "paused: the provider needs authentication; rerun with the same --session and a valid --auth-bearer to resume this run".to_string()),
            (None, None) => (EXIT_RUN_ERROR, "ended".to_string()),
        };
        if !self.json {
            let err = outcome.error.as_ref().map(|e| format!(": {}", e.message)).unwrap_or_default();
            if code != EXIT_OK || self.summary {
                eprintln!("{} {what}{err} · {}", outcome.run_id, usage_line(usage));
            }
        }
        code
    }
}

fn usage_line(u: &RunUsage) -> String {
    let t = &u.totals;
    let part = |name: &str, v: Option<u64>| v.map(|v| format!("{name} {v}"));
    let fields: Vec<String> = [
        part("input", t.input_tokens),
        part("cached", t.cached_input_tokens),
        part("cache-write", t.cache_write_tokens),
        part("output", t.output_tokens),
        part("reasoning", t.reasoning_tokens),
    ]
    .into_iter()
    .flatten()
    .collect();
    let tokens = if fields.is_empty() { "usage unreported".to_string() } else { fields.join(", ") };
    format!("{} step(s), {tokens}", u.steps)
}
