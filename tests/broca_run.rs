//! `broca-run` as a real process against `broca-mock` on loopback: multi-episode sessions for
//! every wire family, SIGINT, auth pause and resume, the watchdog, retries, max_steps, typed
//! admission refusals that write nothing, and `--demo`.

mod cli_rig;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_rig::{code, json_lines, text_step, unit, Rig, BIN};
use serde_json::{json, Value};

/// One model per wire family, each on its own mock lane.
const FAMILIES: [(&str, &str); 5] = [
    ("mock/echo-chat", "chat"),
    ("mock/echo-messages", "messages"),
    ("mock/echo-responses", "responses"),
    ("mock/echo-gemini", "gemini"),
    ("mock/echo-bedrock", "bedrock"),
];

/// All seven wire families: (model, the auth method that routes it there, its mock lane).
const SEVEN: [(&str, &str, &str); 7] = [
    ("mock/echo-chat", "apikey", "seven-chat"),
    ("mock/echo-messages", "apikey", "seven-messages"),
    ("mock/echo-responses", "apikey", "seven-responses"),
    ("mock/echo-responses", "chatgpt", "seven-chatgpt"),
    ("mock/echo-gemini", "apikey", "seven-gemini"),
    ("mock/antigravity-echo-gemini", "antigravity", "seven-code-assist"),
    ("mock/echo-bedrock", "apikey", "seven-bedrock"),
];

#[test]
fn a_session_accumulates_episodes_in_every_family() {
    let rig = Rig::new();
    for (model, auth, lane) in SEVEN {
        rig.script(lane, json!([text_step("Paris."), text_step("About two million.")]));
        let session = format!("geo-{lane}");
        let turn =
            |prompt: &str| rig.run(lane, &["--model", model, "--auth-method", auth, "--session", &session, prompt]);
        let first = turn("What is the capital of France?");
        assert_eq!(code(&first), 0, "{model}: {}", String::from_utf8_lossy(&first.stderr));
        assert_eq!(String::from_utf8_lossy(&first.stdout), "Paris.\n", "{model}: streamed text on stdout");
        let second = turn("How many people live there?");
        assert_eq!(code(&second), 0, "{model}");
        let bodies = rig.mock.requests(lane);
        let sent = String::from_utf8_lossy(&bodies[1].body).to_string();
        for needle in ["What is the capital of France?", "Paris.", "How many people live there?"] {
            assert!(sent.contains(needle), "{model}: the second request lacks {needle:?}");
        }
        let read = rig.run(lane, &["--session", &session, "--read", "--json"]);
        let lines = json_lines(&read);
        let mids: Vec<&str> = lines.iter().map(|l| l["mid"].as_str().unwrap()).collect();
        assert_eq!(mids, ["m1", "m2", "m3", "m4"], "{model}");
        assert_eq!(lines[3]["message"]["content"][0]["text"], "About two million.");
        assert_eq!(lines[3]["ordinal"], 4);
    }
}

#[test]
fn sigint_cancels_the_run_and_exits_130() {
    let rig = Rig::new();
    for (model, lane) in FAMILIES {
        let mut events = vec![json!({"text": "Counting: "})];
        for i in 0..100 {
            events.push(json!({"delay_ms": 50}));
            events.push(json!({"text": format!("{i} ")}));
        }
        rig.script(lane, json!([{"events": events}]));
        let mut child = rig
            .command(lane, &["--model", model, "--session", "count", "--json", "count to 100"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0 && Instant::now() < deadline, "{model}: no text streamed");
            let v: Value = serde_json::from_str(&line).unwrap();
            let is_text = v["kind"] == "display" && v["event"]["type"] == "text_delta";
            lines.push(v);
            if is_text {
                break;
            }
        }
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        for line in stdout.lines() {
            lines.push(serde_json::from_str(&line.unwrap()).unwrap());
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "{model}");
        assert_eq!(unit(&lines, "run_cancel_requested").unwrap()["at"], "now");
        assert_eq!(unit(&lines, "run_finished").unwrap()["reason"], "cancelled", "{model}");
    }
}

#[test]
fn an_auth_failure_pauses_and_a_rerun_resumes_the_same_run() {
    let rig = Rig::new();
    for (model, lane) in FAMILIES {
        rig.script(lane, json!([{"status": 401}]));
        let paused = rig.run(lane, &["--model", model, "--session", "locked", "--json", "hello"]);
        assert_eq!(code(&paused), 1, "{model}");
        let lines = json_lines(&paused);
        let run_id = lines[0]["run_id"].as_str().unwrap().to_string();
        assert_eq!(unit(&lines, "run_paused").unwrap()["reason"], "auth_required", "{model}");
        assert!(unit(&lines, "run_finished").is_none(), "{model}: a pause is not a terminal");
        rig.script(lane, json!([text_step("Hello again.")]));
        let resumed = rig.run(lane, &["--session", "locked", "--json"]);
        assert_eq!(code(&resumed), 0, "{model}: {}", String::from_utf8_lossy(&resumed.stderr));
        let lines = json_lines(&resumed);
        assert_eq!(unit(&lines, "run_resumed").unwrap()["run_id"], json!(run_id));
        let finished = unit(&lines, "run_finished").unwrap();
        assert_eq!(finished["run_id"], json!(run_id), "{model}: the same run");
        assert_eq!(finished["reason"], "completed");
    }
}

#[test]
fn the_watchdog_ends_a_silent_attempt_interrupted() {
    let rig = Rig::new();
    for (model, lane) in FAMILIES {
        rig.script(lane, json!([{"events": [{"text": "thinking"}, {"delay_ms": 5000}, {"finish": "stop"}]}]));
        let args = ["--model", model, "--session", "w", "--idle-timeout-ms", "300", "--json", "hi"];
        let out = rig.run(lane, &args);
        assert_eq!(code(&out), 1, "{model}");
        let lines = json_lines(&out);
        let finished = unit(&lines, "run_finished").unwrap();
        assert_eq!(finished["reason"], "interrupted", "{model}");
        assert_eq!(finished["error"]["provider_code"], "provider_idle_timeout");
    }
}

#[test]
fn a_transient_error_is_retried() {
    let rig = Rig::new();
    for (model, lane) in FAMILIES {
        rig.script(lane, json!([{"status": 429, "headers": {"retry-after": "0"}}, text_step("ok now")]));
        let out = rig.run(lane, &["--model", model, "--session", "r", "--json", "hi"]);
        assert_eq!(code(&out), 0, "{model}");
        let lines = json_lines(&out);
        assert_eq!(unit(&lines, "run_finished").unwrap()["retries_used"], 1, "{model}");
        assert_eq!(rig.mock.requests(lane).len(), 2, "{model}");
    }
}

#[test]
fn max_steps_stops_the_loop() {
    let rig = Rig::new();
    let call = |id: &str| json!({"events": [{"tool_call": {"id": id, "name": "look", "arguments": {}}}, {"finish": "tool_calls"}]});
    for (model, lane) in FAMILIES {
        rig.script(lane, json!([call("a"), call("b"), call("c")]));
        let out = rig.run(lane, &["--model", model, "--session", "m", "--max-steps", "2", "--json", "go"]);
        assert_eq!(code(&out), 1, "{model}");
        assert_eq!(unit(&json_lines(&out), "run_finished").unwrap()["reason"], "max_steps", "{model}");
        assert_eq!(rig.mock.requests(lane).len(), 2, "{model}");
    }
}

#[test]
fn admission_refusals_are_typed_and_write_nothing() {
    let rig = Rig::new();
    let refused = |args: &[&str]| {
        let out = rig.run("refuse", args);
        assert_eq!(code(&out), 2, "{args:?}");
        json_lines(&out).pop().unwrap()["refusal"].clone()
    };
    let r = refused(&["--model", "nope/none", "--session", "a", "--json", "hi"]);
    assert_eq!(r["code"], "model_unknown");
    let r = refused(&["--model", "mock/echo-chat", "--variant", "max", "--session", "b", "--json", "hi"]);
    assert_eq!(r["code"], "variant_unsupported");
    assert_eq!(r["detail"], json!({"model": "mock/echo-chat", "variant": "max", "defined": []}));
    // Without a --base-url the catalog's endpoint is needed, and never guessed.
    let out = Command::new(BIN)
        .arg("--state-root")
        .arg(rig.root())
        .args(["--model", "mock/no-route", "--auth-bearer", "t", "--session", "c", "--json", "hi"])
        .env_remove("BROCA_PROVIDER_BASE_URL")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    let r = json_lines(&out).pop().unwrap()["refusal"].clone();
    assert!(
        r["message"].as_str().unwrap().contains("mock/no-route") && r["message"].as_str().unwrap().contains("wire.api"),
        "{r}"
    );
    // The module's admission, not a CLI shortcut: a project root that is gone is refused by name.
    let gone = rig.dir.path().join("gone");
    let r = refused(&[
        "--project-root",
        gone.to_str().unwrap(),
        "--model",
        "mock/echo-chat",
        "--session",
        "e",
        "--json",
        "hi",
    ]);
    assert_eq!(r["code"], "invalid_project_root", "{r}");
    assert_eq!(r["detail"], json!({"path": gone.to_str().unwrap()}));
    std::fs::remove_file(rig.root().join("catalog/fusiform-lkg.json")).unwrap();
    let r = refused(&["--model", "mock/echo-chat", "--session", "d", "--json", "hi"]);
    let msg = r["message"].as_str().unwrap();
    assert!(
        msg.contains("model catalog unavailable: no in-memory catalog") && msg.contains("fusiform-lkg.json"),
        "{msg}"
    );
    assert_eq!(std::fs::read_dir(rig.root().join("wal")).unwrap().count(), 0, "no refusal wrote a WAL");
    assert!(rig.mock.requests("refuse").is_empty(), "no refusal reached the provider");
    // A usage error is exit 2 too.
    let out = Command::new(BIN).arg("--max-steps").arg("0").output().unwrap();
    assert_eq!(code(&out), 2);
}

#[test]
fn the_demo_streams_a_turn_with_reasoning_and_usage() {
    let out = Command::new(BIN).arg("--demo").env_remove("BROCA_STATE_ROOT").output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Keep it to two sentences."), "reasoning shown: {stdout}");
    assert!(stdout.contains("broca runs agentic LLM loops"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("completed") && stderr.contains("output 51"), "usage shown: {stderr}");
}

/// A CLI turn freezes the session policy through the module's own admission rule (before, it
/// froze none: no context management, no conversation key), so a session continued from either
/// front-end carries the same frozen facts.
#[test]
fn a_cli_turn_freezes_the_session_policy_as_the_module_does() {
    let rig = Rig::new();
    rig.script("chat", json!([text_step("one"), text_step("two")]));
    for prompt in ["first", "second"] {
        let out = rig.run("chat", &["--model", "mock/echo-chat", "--session", "policy", prompt]);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    }
    let wal = std::fs::read_dir(rig.root().join("wal")).unwrap().map(|e| e.unwrap().path()).next().unwrap();
    let mut policies = Vec::new();
    broca::wal::read::<broca::wal::WalError>(&wal, broca::record::KNOWN_FEATURES, None, &mut |f| {
        if let Ok(broca::record::Record::RunStarted(r)) = broca::record::Record::decode(f.payload) {
            policies.push(r.config.config().expect("a typed config").policy.clone());
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(policies.len(), 2);
    for p in &policies {
        assert_eq!(p.context_management, Some(json!("none")), "{p:?}");
        assert!(p.conversation_key.is_some(), "{p:?}");
    }
    // The first turn keys the session; the next inherits its key, as a module send would.
    let sources: Vec<Option<&str>> = policies.iter().map(|p| p.conversation_key_source.as_deref()).collect();
    assert_eq!(sources, [Some("session"), Some("inherited")]);
    assert_eq!(policies[0].conversation_key, policies[1].conversation_key);
}

/// A `chatgpt` credential routes an OpenAI Responses model to the ChatGPT/Codex backend (#29):
/// the Codex client's headers, `instructions` always, and never the output cap or the extended
/// retention the backend refuses (broca-mock answers 400 to either, as the backend does). On a
/// Chat model it routes nowhere and is refused by name before anything is written.
#[test]
fn a_chatgpt_credential_selects_the_codex_backend_for_a_responses_model() {
    let rig = Rig::new();
    rig.script("codex", json!([text_step("Paris.")]));
    let out = rig.run(
        "codex",
        &[
            "--model",
            "mock/echo-responses",
            "--auth-method",
            "chatgpt",
            "--max-output-tokens",
            "64",
            "Capital of France?",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Paris.\n");
    let sent = &rig.mock.requests("codex")[0];
    assert_eq!(sent.header("originator"), Some("codex_cli_rs"));
    assert_eq!(sent.header("openai-beta"), Some("responses=experimental"));
    let body = sent.body_json().unwrap();
    assert!(body.get("max_output_tokens").is_none(), "{body}");
    assert_eq!(body["instructions"], "", "required by the backend even without a system prompt");

    let refused = rig.run("codex", &["--model", "mock/echo-chat", "--auth-method", "chatgpt", "hi"]);
    assert_ne!(code(&refused), 0);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("a chatgpt credential serves only OpenAI Responses models"), "{stderr}");
    assert_eq!(rig.mock.requests("codex").len(), 1, "nothing sent for the refused turn");
}

/// Each provider reads a credential where its own API reference puts it (#46): Anthropic an API
/// key in `x-api-key` (a bearer is refused 401) and an OAuth token as a bearer with its beta
/// header, Gemini an API key in `x-goog-api-key`, OpenAI a bearer; never two places at once.
#[test]
fn a_credential_goes_where_its_provider_reads_it() {
    let rig = Rig::new();
    // (model, extra flags, each header and the value it must have: absent for `None`)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, Option<&'a str>)]);
    let cases: [Case; 4] = [
        (
            "mock/echo-messages",
            &[],
            &[("x-api-key", Some("sk-test")), ("authorization", None), ("anthropic-beta", None)],
        ),
        (
            "mock/echo-messages",
            &["--auth-method", "oauth"],
            &[
                ("authorization", Some("Bearer sk-test")),
                ("x-api-key", None),
                ("anthropic-beta", Some("oauth-2025-04-20")),
            ],
        ),
        ("mock/echo-gemini", &[], &[("x-goog-api-key", Some("sk-test")), ("authorization", None)]),
        ("mock/echo-chat", &[], &[("authorization", Some("Bearer sk-test")), ("x-api-key", None)]),
    ];
    for (i, (model, extra, want)) in cases.iter().enumerate() {
        let lane = format!("auth-{i}");
        rig.script(&lane, json!([text_step("ok")]));
        let mut args = vec!["--model", model, "--auth-bearer", "sk-test", "--session", &lane];
        args.extend_from_slice(extra);
        args.push("hi");
        let out = rig.run(&lane, &args);
        assert_eq!(code(&out), 0, "{model} {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        let sent = &rig.mock.requests(&lane)[0];
        for (header, value) in *want {
            assert_eq!(sent.header(header), *value, "{model} {extra:?}: {header}");
        }
        // PF-24: an OAuth turn without a variant thinks with the subscription's default budget.
        let thinking = sent.body_json().unwrap().get("thinking").cloned();
        let oauth = extra.contains(&"oauth");
        let want = oauth.then(|| json!({"type": "enabled", "budget_tokens": 1024}));
        assert_eq!(thinking, want, "{model} {extra:?}");
    }
}

/// An AWS access key signs each Bedrock request (SigV4, #46): the region from the credential
/// (a mock's host names none), the session token sent and signed; a key that is not the
/// documented JSON is an auth failure before anything is sent.
#[test]
fn an_aws_access_key_signs_a_bedrock_turn() {
    let rig = Rig::new();
    rig.script("sigv4", json!([text_step("signed")]));
    let key = r#"{"access_key_id":"AKIDEXAMPLE","secret_access_key":"wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY","session_token":"tok","region":"us-east-1"}"#;
    let file = rig.dir.path().join("aws.json");
    std::fs::write(&file, key).unwrap();
    let args =
        ["--model", "mock/echo-bedrock", "--auth-method", "sigv4", "--auth-bearer-file", file.to_str().unwrap(), "hi"];
    let out = rig.run("sigv4", &args);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let sent = &rig.mock.requests("sigv4")[0];
    let auth = sent.header("authorization").unwrap();
    assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), "{auth}");
    assert!(
        auth.contains(
            "/us-east-1/bedrock/aws4_request, SignedHeaders=accept;content-type;host;x-amz-date;x-amz-security-token,"
        ),
        "{auth}"
    );
    assert_eq!(sent.header("x-amz-security-token"), Some("tok"));
    assert!(sent.header("x-amz-date").is_some_and(|d| d.len() == 16 && d.ends_with('Z')));
    let refused =
        rig.run("sigv4", &["--model", "mock/echo-chat", "--auth-method", "sigv4", "--auth-bearer", "x", "hi"]);
    assert_ne!(code(&refused), 0);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("a sigv4 credential (an AWS access key) serves only Bedrock")
    );
    assert_eq!(rig.mock.requests("sigv4").len(), 1, "nothing sent for the refused turn");
}

/// An `antigravity` credential routes a Gemini row to Code Assist (#29): the request is the
/// Gemini body in Code Assist's envelope, and a level selects the route's backend tier (the
/// default tier without one); a level the row defines but the route has no tier for is refused
/// `variant_unsupported`, naming the route's tiers, before anything is sent.
#[test]
fn an_antigravity_credential_selects_code_assist_and_a_level_its_tier() {
    let rig = Rig::new();
    let model = "mock/antigravity-echo-gemini";
    rig.script("ca", json!([text_step("Paris."), text_step("Lyon.")]));
    let out =
        rig.run("ca", &["--model", model, "--auth-method", "antigravity", "--session", "ca", "Capital of France?"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Paris.\n");
    let high = rig.run("ca", &["--model", model, "--auth-method", "antigravity", "--variant", "high", "Second city?"]);
    assert_eq!(code(&high), 0, "{}", String::from_utf8_lossy(&high.stderr));
    let sent = rig.mock.requests("ca");
    assert!(sent[0].path.ends_with("/v1internal:streamGenerateContent?alt=sse"), "{}", sent[0].path);
    let (first, second) = (sent[0].body_json().unwrap(), sent[1].body_json().unwrap());
    assert_eq!(
        (first["model"].clone(), first["userAgent"].clone()),
        (json!("echo-gemini-medium"), json!("antigravity"))
    );
    assert_eq!(first["request"]["contents"][0]["parts"][0]["text"], "Capital of France?");
    // The project the backend named for the account (#46), on every request of each turn.
    assert_eq!((&first["project"], &second["project"]), (&json!("broca-mock-project"), &json!("broca-mock-project")));
    assert_eq!(rig.mock.setup_requests("ca").len(), 2, "one loadCodeAssist per CLI turn (a process each)");
    assert_eq!(second["model"], "echo-gemini-high");
    assert_eq!(second["request"]["generationConfig"]["thinkingConfig"]["thinkingLevel"], "high");

    let medium = rig.run("ca", &["--model", model, "--auth-method", "antigravity", "--variant", "medium", "hi"]);
    assert_ne!(code(&medium), 0);
    let stderr = String::from_utf8_lossy(&medium.stderr);
    assert!(stderr.contains("has no tier for it; the route's tiers are [high, low]"), "{stderr}");
    assert_eq!(rig.mock.requests("ca").len(), 2, "nothing sent for the refused turn");
}
