//! broca's request bodies against the request definitions the providers publish in their own
//! packages (#46), not against our reading of their docs: `scripts/api-schema-check` installs
//! botocore, google-api-python-client, openai and anthropic from PyPI and holds each body to
//! Bedrock's ConverseStreamRequest shape, the Vertex AI discovery document's
//! GenerateContentRequest, or the SDKs' streaming params TypedDicts (scripts/api_schema_check.py).
//!
//! The bodies: every request golden (`testdata/golden/request.*.json`), and requests rendered
//! here by broca's own renderer for every family carrying the tool schemas of real MCP servers
//! (`testdata/api-schema/mcp-tools.json`): each tool alone and all together, with and without a
//! system prompt, under each tool_choice the family takes, on a plain turn and on a multi-step
//! tool loop (images, reasoning with signatures, redacted reasoning, tool errors). The golden
//! tool schemas are too simple to find much; real ones have `$schema`, `$defs`, `anyOf`,
//! `additionalProperties: false`, defaults, enums, nested arrays of objects.
//!
//! Prints the check's `API-SCHEMA requests=<n> violations=<n>` line; fails on any violation.
//! Without python3 or the registry it skips by name (and CI fails on that skip).

mod request_corpus;
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use request_corpus::{rendered, repo};
use serde_json::Value;

const TEST: &str = "api_schema::requests_meet_the_providers_published_definitions";

#[test]
fn requests_meet_the_providers_published_definitions() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("api-schema");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the request dir");
    let mut count = 0;
    for entry in std::fs::read_dir(repo().join("testdata/golden")).expect("golden dir") {
        let path = entry.expect("golden entry").path();
        let file = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if file.starts_with("request.") && file.ends_with(".json") {
            std::fs::copy(&path, dir.join(&file)).expect("copy a request golden");
            count += 1;
        }
    }
    assert!(count > 0, "no request goldens found");
    for (file, body) in rendered() {
        serde_json::from_slice::<Value>(&body).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
        std::fs::write(dir.join(&file), body).expect("write a rendered request");
    }
    // The check's venv lives in this target dir, beside this test's files.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("the target dir").to_path_buf();
    let run = Command::new("bash")
        .arg(repo().join("scripts/api-schema-check"))
        .arg(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    match run.status.code() {
        Some(2) => {
            let why: Vec<&str> = stdout.lines().chain(stderr.lines()).filter(|l| !l.trim().is_empty()).collect();
            skip::skip(TEST, &why.join("; "));
        }
        Some(code) => {
            for line in stdout.lines().filter(|l| !l.starts_with("API-SCHEMA ")) {
                eprintln!("{line}");
            }
            let summary = stdout.lines().rfind(|l| l.starts_with("API-SCHEMA ")).unwrap_or("API-SCHEMA (no summary)");
            skip::report(summary);
            assert_eq!(code, 0, "requests differ from the providers' published definitions:\n{stdout}{stderr}");
            assert!(summary.ends_with(" violations=0"), "{summary}");
        }
        None => panic!("scripts/api-schema-check was killed: {stderr}"),
    }
}
