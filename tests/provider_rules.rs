//! broca's requests against the providers' rules (#46): every request golden
//! (`testdata/golden/request.<family>.*.json`) and every request `tests/api_schema.rs` renders
//! (the MCP tool corpus, `request_corpus`) is checked against its family's table in broca-mock
//! (`broca_mock::mock::rules`: what the real provider refuses or requires, each row with its
//! public source). The mock's server applies the same tables to every request it receives in a
//! run (`BROCA_MOCK_RULES_LOG`, summed by `scripts/provider-rules-summary`).
//!
//! Prints `PROVIDER-RULES requests=<n> violations=<n>`, each violation above it; fails on any.

mod request_corpus;
mod skip;

use broca::frozen::Family;
use broca_mock::mock::rules;
use request_corpus::{model, rendered, repo};

/// Where the family's request goes, with the model the goldens and the corpus render for (the
/// Bedrock rows that depend on the model read it from the path).
fn path(family: Family) -> String {
    let (_, model) = model(family);
    match family {
        Family::AnthropicMessages => "/v1/messages".into(),
        Family::OpenaiChat => "/v1/chat/completions".into(),
        Family::OpenaiResponses | Family::OpenaiChatgptResponses => "/v1/responses".into(),
        Family::GoogleGenerateContent => format!("/v1/models/{model}:streamGenerateContent?alt=sse"),
        Family::GoogleCodeAssist => "/v1/v1internal:streamGenerateContent?alt=sse".into(),
        Family::AwsBedrockConverse => format!("/v1/model/{}/converse-stream", model.replace(':', "%3A")),
    }
}

/// `request.<family>.<case>.json` → the family.
fn family_of(file: &str) -> Option<Family> {
    let name = file.strip_prefix("request.")?.split('.').next()?;
    Family::ALL.into_iter().find(|f| f.as_str() == name)
}

#[test]
fn requests_keep_the_providers_rules() {
    let mut requests: Vec<(String, Family, Vec<u8>)> = Vec::new();
    for entry in std::fs::read_dir(repo().join("testdata/golden")).expect("golden dir") {
        let file = entry.expect("golden entry").file_name().to_string_lossy().into_owned();
        if !(file.starts_with("request.") && file.ends_with(".json")) {
            continue;
        }
        let family = family_of(&file).unwrap_or_else(|| panic!("{file}: no family of that name"));
        let body = std::fs::read(repo().join("testdata/golden").join(&file)).expect("read a golden");
        requests.push((file, family, body));
    }
    let goldens = requests.len();
    assert!(goldens > 0, "no request goldens found");
    for (file, body) in rendered() {
        let family = family_of(&file).expect("a rendered request names its family");
        requests.push((file, family, body));
    }
    let mut violations = 0;
    for (file, family, body) in &requests {
        serde_json::from_slice::<serde_json::Value>(body).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
        for v in rules::check(*family, &path(*family), &[], body) {
            violations += 1;
            println!("{file}: {} ({}): {}", v.rule, v.status, v.message);
        }
    }
    skip::report(&format!(
        "PROVIDER-RULES requests={} violations={violations} (request goldens and corpus)",
        requests.len()
    ));
    println!("(request goldens: {goldens}; rendered corpus: {})", requests.len() - goldens);
    assert_eq!(violations, 0, "broca's requests break the providers' rules (listed above)");
}
