//! How a request carries its credential: one typed decision per (family, credential kind)
//! (#46), each row with its public source. A provider refuses a credential in the wrong place
//! (Anthropic answers an API key sent as `Authorization: Bearer` with 401), so the header is
//! never a family-wide default.
//!
//! | family | kind | carried as | source |
//! |---|---|---|---|
//! | Anthropic Messages | API key | `x-api-key: <key>` | Anthropic API reference, "Authentication" |
//! | Anthropic Messages | OAuth | `Authorization: Bearer <token>`, `anthropic-beta: oauth-2025-04-20` | Claude Code's client; the API's 401 "OAuth authentication is currently not supported" without the beta |
//! | OpenAI Chat / Responses | API key | `Authorization: Bearer <key>` | OpenAI API reference, "Authentication" |
//! | ChatGPT/Codex backend | chatgpt OAuth | `Authorization: Bearer <token>` (+ `chatgpt-account-id`) | OpenAI's Codex CLI |
//! | Gemini GenerateContent | API key | `x-goog-api-key: <key>` | Gemini API reference, "API keys" |
//! | Gemini GenerateContent | OAuth | `Authorization: Bearer <token>` | Google OAuth for the Gemini API |
//! | Code Assist | antigravity OAuth | `Authorization: Bearer <token>` | Gemini CLI's Code Assist client |
//! | Bedrock Converse | API key | `Authorization: Bearer <key>` | AWS "Use an Amazon Bedrock API key" |
//! | Bedrock Converse | sigv4 (access key) | SigV4 `Authorization`, `x-amz-date`, `x-amz-security-token` | AWS "Signature Version 4 for API requests" |

use crate::frozen::{AuthMethod, Family};

/// The beta an Anthropic OAuth access token needs on the Messages API.
pub const ANTHROPIC_OAUTH_BETA: &str = "oauth-2025-04-20";
/// The header Anthropic reads betas from (comma-separated when several apply).
pub const ANTHROPIC_BETA: &str = "anthropic-beta";

/// Where a credential goes on a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The token alone in the named header.
    Header(&'static str),
    /// An AWS access key signing each request (Signature Version 4, service `bedrock`).
    SigV4,
}

/// How one (family, kind) authenticates: the credential's carrier and the betas it requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub carrier: Carrier,
    /// Values of [`ANTHROPIC_BETA`] the credential requires (merged with the request's own).
    pub betas: &'static [&'static str],
}

/// The decision for a credential of `kind` on `family`.
pub fn decide(family: Family, kind: AuthMethod) -> Decision {
    let carrier = match (family, kind) {
        (Family::AnthropicMessages, AuthMethod::ApiKey) => Carrier::Header("x-api-key"),
        (Family::GoogleGenerateContent, AuthMethod::ApiKey) => Carrier::Header("x-goog-api-key"),
        (Family::AwsBedrockConverse, AuthMethod::Sigv4) => Carrier::SigV4,
        _ => Carrier::Bearer,
    };
    let betas: &'static [&'static str] = match (family, kind) {
        (Family::AnthropicMessages, AuthMethod::Oauth) => &[ANTHROPIC_OAUTH_BETA],
        _ => &[],
    };
    Decision { carrier, betas }
}

impl Decision {
    /// The header carrying `token` (a signed request's headers come from [`sigv4_headers`]).
    pub fn header(&self, token: &str) -> (&'static str, String) {
        match self.carrier {
            Carrier::Bearer | Carrier::SigV4 => ("authorization", format!("Bearer {token}")),
            Carrier::Header(name) => (name, token.to_owned()),
        }
    }
}

/// Every header of a request to `url` on `config`'s route, in the order sent: content
/// negotiation, the family's own, one `anthropic-beta`, the credential where its provider reads
/// it (or the SigV4 signature over all of the above and `body`), the account. A credential that
/// cannot sign is an `auth_required` error (`credential_unusable`).
pub fn request_headers(
    config: &crate::frozen::FrozenConfig,
    url: &str,
    (bearer, account): (Option<&str>, Option<&str>),
    accept: &str,
    body: &[u8],
) -> Result<Vec<(String, String)>, crate::record::ProviderError> {
    let family = super::wire(config.family);
    let mut headers: Vec<(String, String)> =
        vec![("content-type".into(), "application/json".into()), ("accept".into(), accept.into())];
    headers.extend(family.headers().iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())));
    let credential = match (&config.auth, bearer) {
        (crate::frozen::AuthSource::Bearer | crate::frozen::AuthSource::Vault { .. }, Some(token)) => Some(token),
        _ => None,
    };
    let auth = decide(config.family, config.credential_kind());
    // One `anthropic-beta`: the level's and the credential's, each once.
    let tier_beta = super::tier::request_header(config.family, config.service_tier).map(|(_, beta)| beta);
    let credential_betas = credential.map_or(&[][..], |_| auth.betas);
    if let Some(betas) = merge_betas(tier_beta.into_iter().chain(credential_betas.iter().copied())) {
        headers.push((ANTHROPIC_BETA.into(), betas));
    }
    match (credential, auth.carrier) {
        (Some(secret), Carrier::SigV4) => {
            let unsigned: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let signed = sigv4_headers(url, &unsigned, body, secret, crate::clock::unix_ms()).map_err(|message| {
                crate::record::ProviderError::new(
                    crate::record::ErrorClass::AuthRequired,
                    Some("credential_unusable".into()),
                    message,
                    None,
                )
            })?;
            headers.extend(signed.into_iter().map(|(n, v)| (n.to_owned(), v)));
        }
        (Some(token), _) => {
            let (name, value) = auth.header(token);
            headers.push((name.to_owned(), value));
        }
        (None, _) => {}
    }
    if let (Some(header), Some(account)) = (family.account_header(), account) {
        headers.push((header.to_owned(), account.to_owned()));
    }
    Ok(headers)
}

/// An AWS access key as a vault record or dev-tools handle holds it: JSON with its id, secret,
/// session token (temporary credentials) and, for a route whose host names none, its region.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AwsSecret {
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    session_token: Option<String>,
    #[serde(default)]
    region: Option<String>,
}

/// The headers that sign a Bedrock request with the access key `secret` holds: `x-amz-date`,
/// `x-amz-security-token` (temporary credentials) and `authorization`. `headers` are the
/// request's other headers, all signed. The region is the route host's
/// (`bedrock-runtime[-fips].<region>.amazonaws.com`), else the credential's `region`.
pub fn sigv4_headers(
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    secret: &str,
    now_ms: u64,
) -> Result<Vec<(&'static str, String)>, String> {
    let key: AwsSecret = serde_json::from_str(secret).map_err(|_| {
        "the sigv4 credential is not {access_key_id, secret_access_key, session_token?, region?} JSON".to_owned()
    })?;
    let (host, path, query) = split_url(url).ok_or_else(|| format!("the route URL {url:?} cannot be signed"))?;
    let region = region_of(host)
        .or(key.region.as_deref())
        .ok_or_else(|| format!("the route host {host:?} names no AWS region: give the credential a \"region\""))?;
    let amz_date = super::sigv4::amz_date(now_ms);
    let mut signed: Vec<(String, String)> = headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
    signed.push(("host".into(), host.to_owned()));
    signed.push(("x-amz-date".into(), amz_date.clone()));
    if let Some(token) = &key.session_token {
        signed.push(("x-amz-security-token".into(), token.clone()));
    }
    let access = super::sigv4::AccessKey {
        access_key_id: key.access_key_id,
        secret_access_key: key.secret_access_key,
        session_token: key.session_token.clone(),
    };
    let request = super::sigv4::Request { method: "POST", path, query: &query, headers: &signed, body };
    let scope = super::sigv4::Scope { region, service: "bedrock", amz_date: &amz_date };
    let mut out = vec![
        ("x-amz-date", amz_date.clone()),
        ("authorization", super::sigv4::sign(&request, &access, &scope).authorization),
    ];
    if let Some(token) = key.session_token {
        out.push(("x-amz-security-token", token));
    }
    Ok(out)
}

/// The region a Bedrock runtime host names.
fn region_of(host: &str) -> Option<&str> {
    let rest = host.strip_prefix("bedrock-runtime-fips.").or_else(|| host.strip_prefix("bedrock-runtime."))?;
    rest.split_once('.').map(|(region, _)| region).filter(|r| !r.is_empty())
}

/// A URL's query, as `(name, value)` pairs.
type Query = Vec<(String, String)>;

/// `(host[:port], path, query pairs)` of an `http(s)` URL.
fn split_url(url: &str) -> Option<(&str, &str, Query)> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let (authority, path_query) = rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
    let pairs = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Some((authority, path, pairs))
}

/// One `anthropic-beta` value from the betas a request needs, each once, in order.
pub fn merge_betas<'a>(betas: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for beta in betas.into_iter().flat_map(|b| b.split(',')).map(str::trim).filter(|b| !b.is_empty()) {
        if !seen.contains(&beta) {
            seen.push(beta);
        }
    }
    (!seen.is_empty()).then(|| seen.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_takes_an_api_key_in_x_api_key_and_an_oauth_token_as_a_bearer_with_its_beta() {
        let key = decide(Family::AnthropicMessages, AuthMethod::ApiKey);
        assert_eq!(key.header("sk-ant"), ("x-api-key", "sk-ant".to_owned()));
        assert!(key.betas.is_empty());
        let oauth = decide(Family::AnthropicMessages, AuthMethod::Oauth);
        assert_eq!(oauth.header("tok"), ("authorization", "Bearer tok".to_owned()));
        assert_eq!(oauth.betas, [ANTHROPIC_OAUTH_BETA]);
    }

    #[test]
    fn every_other_family_carries_its_credential_where_its_provider_reads_it() {
        assert_eq!(decide(Family::GoogleGenerateContent, AuthMethod::ApiKey).header("k").0, "x-goog-api-key");
        assert_eq!(decide(Family::GoogleGenerateContent, AuthMethod::Oauth).header("k").0, "authorization");
        for family in [Family::OpenaiChat, Family::OpenaiResponses, Family::AwsBedrockConverse] {
            assert_eq!(decide(family, AuthMethod::ApiKey).header("k"), ("authorization", "Bearer k".to_owned()));
        }
        assert_eq!(decide(Family::OpenaiChatgptResponses, AuthMethod::Chatgpt).carrier, Carrier::Bearer);
        assert_eq!(decide(Family::GoogleCodeAssist, AuthMethod::Antigravity).carrier, Carrier::Bearer);
    }

    #[test]
    fn a_bedrock_access_key_signs_with_the_route_s_region_and_its_session_token() {
        let secret = r#"{"access_key_id":"AKIDEXAMPLE","secret_access_key":"s3cr3t","session_token":"tok"}"#;
        let url = "https://bedrock-runtime.eu-west-1.amazonaws.com/model/m%3A0/converse-stream";
        let headers =
            sigv4_headers(url, &[("content-type", "application/json")], b"{}", secret, 1_440_938_160_000).unwrap();
        let find = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str());
        assert_eq!(find("x-amz-date"), Some("20150830T123600Z"));
        assert_eq!(find("x-amz-security-token"), Some("tok"));
        let auth = find("authorization").unwrap();
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/eu-west-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature="), "{auth}");
        assert!(!auth.contains("s3cr3t"));
        let mock = "http://127.0.0.1:9/model/m/converse-stream";
        assert!(sigv4_headers(mock, &[], b"", secret, 0).unwrap_err().contains("names no AWS region"));
        let regional = r#"{"access_key_id":"A","secret_access_key":"S","region":"us-east-1"}"#;
        assert!(sigv4_headers(mock, &[], b"", regional, 0).is_ok());
        assert!(sigv4_headers(url, &[], b"", "not json", 0).unwrap_err().contains("JSON"));
        assert_eq!(decide(Family::AwsBedrockConverse, AuthMethod::Sigv4).carrier, Carrier::SigV4);
    }

    #[test]
    fn betas_merge_into_one_header_each_once() {
        assert_eq!(merge_betas([]), None);
        assert_eq!(merge_betas(["a"]), Some("a".into()));
        assert_eq!(
            merge_betas(["fast-mode-2026-02-01", "oauth-2025-04-20"]).unwrap(),
            "fast-mode-2026-02-01,oauth-2025-04-20"
        );
        assert_eq!(merge_betas(["a,b", "b", " c "]).unwrap(), "a,b,c");
    }
}
