//! AWS Signature Version 4 (#46), for Bedrock deployments that authenticate with an access key
//! (its id, its secret, and a session token for temporary credentials) instead of a bearer API
//! key. Written on `hmac`/`sha2`: AWS's own signers pull an async runtime.
//!
//! The steps of AWS's "Create a signed AWS API request": a canonical request (the method; the
//! wire path with each segment URI-encoded again, so Bedrock's `%3A` in a model id signs as
//! `%253A`; the query sorted by encoded key then value; the signed headers lowercased, their
//! values trimmed with inner runs of spaces collapsed, several of one name joined by `,`; the
//! payload's SHA-256), the string to sign over its digest and the credential scope, the signing
//! key derived from the secret through the date, region, service and `aws4_request`, and the
//! `Authorization` header. Checked against AWS's published Signature Version 4 test suite
//! (`tests/sigv4.rs`) and against botocore's signer (`scripts/sigv4-botocore`).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::session_key::hex;

/// The algorithm's name on the wire.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An access key. The secret is never printed (`Debug` shows the id only).
#[derive(Clone, PartialEq, Eq)]
pub struct AccessKey {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// For temporary credentials (STS): sent and signed as `x-amz-security-token`.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

/// What a signature covers besides the request: where and when.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
    /// `YYYYMMDDTHHMMSSZ` (UTC), sent as `x-amz-date`.
    pub amz_date: &'a str,
}

/// One request to sign: the wire path, the query pairs (decoded), the headers to sign, the body.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a [(String, String)],
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

/// The signature's parts: the canonical request and string to sign (for diagnostics and tests),
/// the signed header names and the `Authorization` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    pub canonical_request: String,
    pub string_to_sign: String,
    pub signed_headers: String,
    pub authorization: String,
}

/// Signs `request` (whose headers already include `host` and `x-amz-date`, and
/// `x-amz-security-token` when it is to be signed) with `key` for `scope`.
pub fn sign(request: &Request<'_>, key: &AccessKey, scope: &Scope<'_>) -> Signed {
    let (canonical_headers, signed_headers) = canonical_headers(request.headers);
    let canonical_request = [
        request.method.to_owned(),
        canonical_path(request.path),
        canonical_query(request.query),
        canonical_headers,
        signed_headers.clone(),
        hex(&Sha256::digest(request.body)),
    ]
    .join("\n");
    let date = &scope.amz_date[..scope.amz_date.len().min(8)];
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{}\n{credential_scope}\n{}",
        scope.amz_date,
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let signing_key = [date, scope.region, scope.service, "aws4_request"]
        .iter()
        .fold(format!("AWS4{}", key.secret_access_key).into_bytes(), |k, part| hmac(&k, part.as_bytes()));
    let signature = hex(&hmac(&signing_key, string_to_sign.as_bytes()));
    let authorization = format!(
        "{ALGORITHM} Credential={}/{credential_scope}, SignedHeaders={signed_headers}, Signature={signature}",
        key.access_key_id
    );
    Signed { canonical_request, string_to_sign, signed_headers, authorization }
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time in milliseconds (UTC).
pub fn amz_date(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The Gregorian date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// RFC 3986 percent-encoding as AWS asks: every byte but `A-Za-z0-9-._~` as `%XX`, upper case.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// The wire path, each segment encoded (again): a path sent with `%3A` signs as `%253A`.
fn canonical_path(path: &str) -> String {
    if path.is_empty() {
        return "/".to_owned();
    }
    path.split('/').map(uri_encode).collect::<Vec<_>>().join("/")
}

fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query.iter().map(|(k, v)| (uri_encode(k), uri_encode(v))).collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// The canonical headers block (each `name:value\n`) and the signed header names.
fn canonical_headers(headers: &[(String, String)]) -> (String, String) {
    let mut by_name: Vec<(String, Vec<String>)> = Vec::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => by_name.push((name, vec![value])),
        }
    }
    by_name.sort_by(|a, b| a.0.cmp(&b.0));
    let block: String = by_name.iter().map(|(n, v)| format!("{n}:{}\n", v.join(","))).collect();
    let signed = by_name.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(";");
    (block, signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's worked example ("Examples of the complete Signature Version 4 signing process",
    /// IAM ListUsers): its canonical request, string to sign and signature.
    #[test]
    fn the_documented_list_users_example_signs_as_published() {
        let key = AccessKey {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let headers = [
            ("Content-Type".to_owned(), "application/x-www-form-urlencoded; charset=utf-8".to_owned()),
            ("Host".to_owned(), "iam.amazonaws.com".to_owned()),
            ("X-Amz-Date".to_owned(), "20150830T123600Z".to_owned()),
        ];
        let query = [("Action".to_owned(), "ListUsers".to_owned()), ("Version".to_owned(), "2010-05-08".to_owned())];
        let request = Request { method: "GET", path: "/", query: &query, headers: &headers, body: b"" };
        let signed = sign(&request, &key, &Scope { region: "us-east-1", service: "iam", amz_date: "20150830T123600Z" });
        assert_eq!(
            hex(&Sha256::digest(signed.canonical_request.as_bytes())),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        assert!(signed
            .authorization
            .ends_with("Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"));
    }

    #[test]
    fn a_percent_in_the_wire_path_is_encoded_again_and_the_date_is_utc() {
        assert_eq!(
            canonical_path("/model/anthropic.claude-v1%3A0/converse-stream"),
            "/model/anthropic.claude-v1%253A0/converse-stream"
        );
        assert_eq!(canonical_path(""), "/");
        assert_eq!(amz_date(1_440_938_160_000), "20150830T123600Z");
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(951_782_400_000), "20000229T000000Z");
        assert!(!format!(
            "{:?}",
            AccessKey { access_key_id: "id".into(), secret_access_key: "s3cr3t".into(), session_token: None }
        )
        .contains("s3cr3t"));
    }
}
