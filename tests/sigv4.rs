//! Signature Version 4 (`broca::provider::sigv4`, #46) against what this crate did not write:
//!
//! - AWS's published Signature Version 4 test suite, as the `@aws-sdk/signature-v4` npm package
//!   ships it (`scripts/sigv4-vectors` fetches it from the registry: nothing is committed);
//! - botocore's signer (the AWS CLI's and boto3's, from PyPI: `scripts/sigv4-botocore`) on a
//!   Converse request with a session token, signed as broca signs one (`provider::auth`).
//!
//! A machine without npm/node or python3, or without the registries, skips each by name.

mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use broca::provider::sigv4::{sign, AccessKey, Request, Scope};
use serde_json::{json, Value};

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(name)
}

#[test]
fn the_aws_signature_v4_test_suite_signs_as_published() {
    let suite = tmp().join("sigv4-suite.json");
    let fetched = Command::new("bash").arg(script("sigv4-vectors")).arg(&suite).output().expect("bash runs");
    if !fetched.status.success() {
        return skip::skip(
            "sigv4::the_aws_signature_v4_test_suite_signs_as_published",
            String::from_utf8_lossy(&fetched.stderr).trim(),
        );
    }
    let suite: Value = serde_json::from_slice(&std::fs::read(&suite).unwrap()).unwrap();
    let key = AccessKey {
        access_key_id: suite["credentials"]["accessKeyId"].as_str().unwrap().into(),
        secret_access_key: suite["credentials"]["secretAccessKey"].as_str().unwrap().into(),
        session_token: None,
    };
    let cases = suite["requests"].as_array().unwrap();
    assert!(cases.len() >= 20, "the suite holds {} cases", cases.len());
    for case in cases {
        let r = &case["request"];
        let headers: Vec<(String, String)> = r["headers"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let mut query = Vec::new();
        for (k, v) in r["query"].as_object().unwrap() {
            match v {
                Value::Array(values) => {
                    query.extend(values.iter().map(|v| (k.clone(), v.as_str().unwrap().to_owned())))
                }
                v => query.push((k.clone(), v.as_str().unwrap_or_default().to_owned())),
            }
        }
        let body = r["body"].as_str().unwrap_or_default();
        let amz_date = headers.iter().find(|(k, _)| k == "x-amz-date").map(|(_, v)| v.clone()).unwrap();
        let request = Request {
            method: r["method"].as_str().unwrap(),
            path: r["path"].as_str().unwrap(),
            query: &query,
            headers: &headers,
            body: body.as_bytes(),
        };
        let scope = Scope {
            region: suite["region"].as_str().unwrap(),
            service: suite["service"].as_str().unwrap(),
            amz_date: &amz_date,
        };
        let signed = sign(&request, &key, &scope);
        assert_eq!(
            signed.authorization,
            case["authorization"].as_str().unwrap(),
            "{}:\n{}",
            case["name"],
            signed.canonical_request
        );
    }
    eprintln!("sigv4: {} cases of AWS's test suite sign as published", cases.len());
}

#[test]
fn a_signed_converse_request_with_a_session_token_matches_botocore() {
    let secret = json!({"access_key_id": "AKIDEXAMPLE", "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                        "session_token": "IQoJb3JpZ2luX2VjEXAMPLETOKEN//////////wEaCXVzLWVhc3QtMSJHMEUCIQ"});
    let url = "https://bedrock-runtime.us-west-2.amazonaws.com/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse-stream";
    let body =
        br#"{"messages":[{"role":"user","content":[{"text":"h\u00e9llo"}]}],"inferenceConfig":{"maxTokens":64}}"#;
    let at_ms = 1_796_644_800_000; // 2026-12-07T12:00:00Z
    let base = [("content-type", "application/json"), ("accept", "application/vnd.amazon.eventstream")];
    let ours = broca::provider::auth::sigv4_headers(url, &base, body, &secret.to_string(), at_ms).unwrap();
    let ours_auth = ours.iter().find(|(n, _)| *n == "authorization").map(|(_, v)| v.clone()).unwrap();
    let spec = json!({
        "url": url, "body": String::from_utf8(body.to_vec()).unwrap(),
        "headers": {"content-type": "application/json", "accept": "application/vnd.amazon.eventstream"},
        "access_key_id": secret["access_key_id"], "secret_access_key": secret["secret_access_key"],
        "session_token": secret["session_token"], "region": "us-west-2", "service": "bedrock",
        "amz_date": "20261207T120000Z",
    });
    let spec_path = tmp().join("sigv4-converse.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let out = Command::new("bash")
        .arg(script("sigv4-botocore"))
        .arg(&spec_path)
        .arg(tmp().join("botocore-venv"))
        .output()
        .expect("bash runs");
    if !out.status.success() {
        return skip::skip(
            "sigv4::a_signed_converse_request_with_a_session_token_matches_botocore",
            String::from_utf8_lossy(&out.stderr).trim(),
        );
    }
    let theirs: Value = serde_json::from_slice(&out.stdout).expect("botocore's answer is JSON");
    assert_eq!(ours_auth, theirs["authorization"].as_str().unwrap(), "botocore signs otherwise");
    eprintln!("sigv4: a Converse request with a session token signs as botocore signs it");
}
