//! `broca.jsonc`: the operator's configuration, read once at boot from the state root.
//!
//! The file is JSON with comments (`//` and `/* */` outside strings) and trailing commas. An
//! absent file means the defaults: `backup_classes` is `["head"]` and there are no
//! context-management defaults (a first send then binds `"none"`). Unknown top-level members
//! are tolerated; the members broca reads are strict, and a malformed one refuses boot with a
//! [`ConfigError`] naming the file and the member.
//!
//! Invariants of a loaded [`BrocaConfig`]:
//! - every `backup_classes` label matches the session-class grammar `[a-z0-9_-]{1,32}` and
//!   appears once;
//! - every context-management value (the default and each project's) is a mode broca serves as
//!   a default, which today is only `"none"` (`"compaction"` and `{"transform": …}` refuse boot);
//! - `context_management.projects` keys are stored without trailing `/` (the root `/` stays),
//!   so a lookup ignores a trailing `/` on both sides.
//!
//! - `step_events`, when present, names a loopback NATS endpoint (`nats://<loopback>:<port>`;
//!   the bus listener has no TLS, so another host is refused) and a concrete account token.
//!
//! Changing the file later never changes a session that already bound its values: callers
//! read it only to decide a session's first send.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::limits::Limits;
use crate::state_root::{Placement, StateRoot};

/// The file name inside the state root.
pub use crate::state_root::CONFIG_FILE_NAME as FILE_NAME;

/// The session classes backed up when `broca.jsonc` does not say.
const DEFAULT_BACKUP_CLASSES: &[&str] = &["head"];

/// The only context-management mode servable as a default.
const SERVABLE_DEFAULT: &str = "none";

/// The fold policy (`broca.jsonc` `fold`, `lineage::fold`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldPolicy {
    /// A WAL untouched this long is cold (`after_idle_secs`, default seven days).
    pub after_idle_ms: u64,
    /// Smaller WALs stay live (`min_bytes`, default 0).
    pub min_bytes: u64,
    /// At most this many folds per sweep (`max_per_pass`, default 256).
    pub max_per_pass: usize,
    /// How often the sweep looks (`sweep_secs`, default 600).
    pub sweep_every_ms: u64,
}

impl Default for FoldPolicy {
    fn default() -> FoldPolicy {
        FoldPolicy { after_idle_ms: 7 * 24 * 3600 * 1000, min_bytes: 0, max_per_pass: 256, sweep_every_ms: 600_000 }
    }
}

/// The federation module's id in CortexKit: the default `federation.carriers`.
pub const DEFAULT_FEDERATION_CARRIER: &str = "callosum";

/// The configuration broca boots with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrocaConfig {
    /// Session classes whose live WALs go to `wal-durable/` (captured by backup).
    pub backup_classes: Vec<String>,
    pub context_management: ContextDefaults,
    /// `limits`: the operator-tunable bounds ([`crate::limits`]).
    pub limits: Limits,
    /// `step_events`: where `step.finished.v1` hints are published; `None`: the group is not
    /// declared and nothing is published.
    pub step_events: Option<BusConfig>,
    /// `auth_methods`: provider id → the auth method its routes use (`apikey`, `chatgpt`,
    /// `oauth`, `antigravity`); a provider not named uses its API key.
    pub auth_methods: BTreeMap<String, crate::frozen::AuthMethod>,
    /// `providers.<id>.base_url`: a provider's base replaced (the classifier providers
    /// `typesafe` and `cloudflare-workers-ai`, spec §4b), without a trailing `/`.
    pub provider_base_urls: BTreeMap<String, String>,
    /// `federation.carriers`: the module ids whose routes are relayed from other machines
    /// (`crate::federation`); default `["callosum"]`.
    pub federation_carriers: Vec<String>,
    /// `fold`: when cold WALs are folded into the archive trees (`lineage::fold`).
    pub fold: FoldPolicy,
    /// `code_assist.project`: the Google Cloud project Code Assist runs name when the backend
    /// names none for the account (a Workspace account; `provider::code_assist`).
    pub code_assist_project: Option<String>,
}

/// `step_events`: the bus broca publishes its live step hints on (llm-runner §14.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusConfig {
    /// `bus`, as `host:port` (the `nats://` scheme removed); the host is loopback.
    pub addr: String,
    /// `account`: the `{acct}` token of `ck.{acct}.live.<runner>.…` subjects.
    pub account: String,
}

/// `context_management`: the values a first send that omits the field binds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContextDefaults {
    /// `context_management.default`.
    pub default: Option<String>,
    /// `context_management.projects`, keyed by project root without trailing `/`.
    pub projects: BTreeMap<String, String>,
}

impl Default for BrocaConfig {
    fn default() -> Self {
        BrocaConfig {
            backup_classes: DEFAULT_BACKUP_CLASSES.iter().map(|s| s.to_string()).collect(),
            context_management: ContextDefaults::default(),
            limits: Limits::default(),
            step_events: None,
            auth_methods: BTreeMap::new(),
            provider_base_urls: BTreeMap::new(),
            federation_carriers: vec![DEFAULT_FEDERATION_CARRIER.to_owned()],
            fold: FoldPolicy::default(),
            code_assist_project: None,
        }
    }
}

/// Why `broca.jsonc` refuses boot.
#[derive(Debug)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    Io { path: PathBuf, source: std::io::Error },
    /// The text is not JSONC (or not UTF-8, or not an object at the top level).
    Syntax { path: PathBuf, reason: String },
    /// A member broca reads holds a value it refuses.
    Member { path: PathBuf, member: String, reason: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Io { path, source } => write!(f, "{}: cannot read: {source}", path.display()),
            ConfigError::Syntax { path, reason } => write!(f, "{}: not valid JSONC: {reason}", path.display()),
            ConfigError::Member { path, member, reason } => write!(f, "{}: {member}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Whether `s` matches the session-class grammar `[a-z0-9_-]{1,32}`.
pub fn valid_session_class(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

/// A project root as `projects` keys and lookups compare it: trailing `/` removed, except
/// that the root `/` stays `/`.
fn normalize_project(root: &str) -> &str {
    match root.trim_end_matches('/') {
        "" if root.starts_with('/') => "/",
        trimmed => trimmed,
    }
}

impl BrocaConfig {
    /// Reads `<state root>/broca.jsonc`; an absent file gives [`BrocaConfig::default`].
    pub fn load(root: &StateRoot) -> Result<BrocaConfig, ConfigError> {
        let path = root.config_path();
        match std::fs::read(&path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => BrocaConfig::parse(&path, &text),
                Err(_) => Err(ConfigError::Syntax { path, reason: "not UTF-8".into() }),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BrocaConfig::default()),
            Err(source) => Err(ConfigError::Io { path, source }),
        }
    }

    /// Parses the text of `broca.jsonc`; `path` only names the file in errors.
    pub fn parse(path: &Path, text: &str) -> Result<BrocaConfig, ConfigError> {
        let syntax = |reason: String| ConfigError::Syntax { path: path.to_path_buf(), reason };
        let json = jsonc_to_json(text).map_err(|r| syntax(r.into()))?;
        let value: Value = serde_json::from_str(&json).map_err(|e| syntax(e.to_string()))?;
        let Value::Object(top) = value else {
            return Err(syntax("the top level must be an object".into()));
        };
        let mut config = BrocaConfig::default();
        if let Some(v) = top.get("backup_classes") {
            config.backup_classes = parse_backup_classes(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("context_management") {
            config.context_management = parse_context(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("limits") {
            config.limits = Limits::parse(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("step_events") {
            config.step_events = Some(parse_step_events(v).map_err(|(m, r)| member_error(path, m, r))?);
        }
        if let Some(v) = top.get("auth_methods") {
            config.auth_methods = parse_auth_methods(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("providers") {
            config.provider_base_urls = parse_providers(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("code_assist") {
            config.code_assist_project = parse_code_assist(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("fold") {
            config.fold = parse_fold(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        if let Some(v) = top.get("federation") {
            config.federation_carriers = parse_federation(v).map_err(|(m, r)| member_error(path, m, r))?;
        }
        Ok(config)
    }

    /// The context-management value a first send without one binds in `project_root`, if the
    /// file names one: the project's entry (a trailing `/` ignored on both sides), else the
    /// default. `None` means the built-in `"none"`.
    pub fn context_default_for(&self, project_root: &str) -> Option<&str> {
        let cm = &self.context_management;
        cm.projects.get(normalize_project(project_root)).or(cm.default.as_ref()).map(String::as_str)
    }

    /// Whether sessions of `class` are backed up (their live WALs go to `wal-durable/`).
    pub fn is_backed_up(&self, class: &str) -> bool {
        self.backup_classes.iter().any(|c| c == class)
    }

    /// Where a NEW session's live WAL goes: a send with retention is always ephemeral (deletion
    /// takes precedence over backup); a listed class is durable; anything else is standard.
    pub fn placement_for(&self, class: Option<&str>, retention: bool) -> Placement {
        match class {
            _ if retention => Placement::Ephemeral,
            Some(c) if self.is_backed_up(c) => Placement::Durable,
            _ => Placement::Standard,
        }
    }
}

/// `auth_methods`: an object of provider id → auth method name.
fn parse_auth_methods(v: &Value) -> Result<BTreeMap<String, crate::frozen::AuthMethod>, MemberRefusal> {
    use crate::frozen::AuthMethod;
    let Value::Object(map) = v else {
        return Err(("auth_methods".into(), "must be an object of provider id -> auth method".into()));
    };
    map.iter()
        .map(|(provider, method)| match method.as_str().and_then(AuthMethod::parse) {
            Some(m) if !provider.is_empty() => Ok((provider.clone(), m)),
            _ => Err((
                format!("auth_methods.{provider}"),
                "must be one of apikey, chatgpt, oauth, antigravity, sigv4".into(),
            )),
        })
        .collect()
}

/// `providers`: provider id → `{base_url}`, an `http://` or `https://` URL (nothing else is
/// read from a provider's section, and an unknown member is refused so a misspelt one cannot
/// silently send item text to the real host).
fn parse_providers(v: &Value) -> Result<BTreeMap<String, String>, MemberRefusal> {
    let Value::Object(map) = v else {
        return Err(("providers".into(), "must be an object of provider id -> {base_url}".into()));
    };
    let mut out = BTreeMap::new();
    for (provider, section) in map {
        let member = |m: &str| format!("providers.{provider}{m}");
        let Value::Object(section) = section else {
            return Err((member(""), "must be an object {base_url}".into()));
        };
        if let Some(k) = section.keys().find(|k| k.as_str() != "base_url") {
            return Err((member(&format!(".{k}")), "unknown member (expected base_url)".into()));
        }
        let Some(url) = section.get("base_url") else { continue };
        let url = url.as_str().filter(|u| u.starts_with("http://") || u.starts_with("https://"));
        let Some(url) = url.filter(|u| u.len() <= 2048) else {
            return Err((member(".base_url"), "must be an http:// or https:// URL".into()));
        };
        out.insert(provider.clone(), url.trim_end_matches('/').to_owned());
    }
    Ok(out)
}

/// `code_assist`: `{project?}`, a Google Cloud project id (letters, digits, `-`, `.`, `:`, `_`;
/// at most 100 bytes); an unknown member is refused.
fn parse_code_assist(v: &Value) -> Result<Option<String>, MemberRefusal> {
    let Value::Object(section) = v else {
        return Err(("code_assist".into(), "must be an object {project}".into()));
    };
    if let Some(k) = section.keys().find(|k| k.as_str() != "project") {
        return Err((format!("code_assist.{k}"), "unknown member (expected project)".into()));
    }
    let Some(project) = section.get("project") else { return Ok(None) };
    let valid = |p: &&str| {
        !p.is_empty() && p.len() <= 100 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b))
    };
    match project.as_str().filter(valid) {
        Some(p) => Ok(Some(p.to_owned())),
        None => Err(("code_assist.project".into(), "must be a Google Cloud project id".into())),
    }
}

/// `fold`: `{after_idle_secs?, min_bytes?, max_per_pass?, sweep_secs?}`, each a positive
/// integer (`min_bytes` may be 0); an unknown member is refused.
fn parse_fold(v: &Value) -> Result<FoldPolicy, MemberRefusal> {
    let Value::Object(section) = v else {
        return Err(("fold".into(), "must be an object".into()));
    };
    let mut policy = FoldPolicy::default();
    for (k, value) in section {
        let n = value.as_u64().ok_or_else(|| (format!("fold.{k}"), "must be a non-negative integer".to_owned()))?;
        let positive = || if n == 0 { Err((format!("fold.{k}"), "must be at least 1".to_owned())) } else { Ok(n) };
        match k.as_str() {
            "after_idle_secs" => policy.after_idle_ms = positive()?.saturating_mul(1000),
            "min_bytes" => policy.min_bytes = n,
            "max_per_pass" => policy.max_per_pass = usize::try_from(positive()?).unwrap_or(usize::MAX),
            "sweep_secs" => policy.sweep_every_ms = positive()?.saturating_mul(1000),
            _ => {
                return Err((
                    format!("fold.{k}"),
                    "unknown member (after_idle_secs, min_bytes, max_per_pass, sweep_secs)".into(),
                ))
            }
        }
    }
    Ok(policy)
}

/// `federation`: `{carriers: [module id, ...]}` (an empty list: no route is relayed).
fn parse_federation(v: &Value) -> Result<Vec<String>, MemberRefusal> {
    let Value::Object(section) = v else {
        return Err(("federation".into(), "must be an object {carriers}".into()));
    };
    if let Some(k) = section.keys().find(|k| k.as_str() != "carriers") {
        return Err((format!("federation.{k}"), "unknown member (expected carriers)".into()));
    }
    let Some(carriers) = section.get("carriers") else { return Ok(Vec::new()) };
    let Value::Array(items) = carriers else {
        return Err(("federation.carriers".into(), "must be an array of module ids".into()));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_str() {
            Some(id) if !id.is_empty() && id.len() <= 128 && !id.contains(char::is_whitespace) => Ok(id.to_owned()),
            _ => Err((format!("federation.carriers[{i}]"), "must be a module id".into())),
        })
        .collect()
}

/// A refused member: its dotted name and why.
type MemberRefusal = (String, String);

fn member_error(path: &Path, member: String, reason: String) -> ConfigError {
    ConfigError::Member { path: path.to_path_buf(), member, reason }
}

/// `backup_classes`: an array of distinct session-class labels (duplicates collapse).
fn parse_backup_classes(v: &Value) -> Result<Vec<String>, MemberRefusal> {
    let Value::Array(items) = v else {
        return Err(("backup_classes".into(), "must be an array of session-class labels".into()));
    };
    let mut classes: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some(s) if valid_session_class(s) => {
                if !classes.iter().any(|c| c == s) {
                    classes.push(s.to_string());
                }
            }
            _ => return Err((format!("backup_classes[{i}]"), "must be a label matching [a-z0-9_-]{1,32}".into())),
        }
    }
    Ok(classes)
}

/// `context_management`: an object with optional `default` and `projects`; other members are
/// refused so a misspelt one cannot silently drop a default.
fn parse_context(v: &Value) -> Result<ContextDefaults, MemberRefusal> {
    let Value::Object(section) = v else {
        return Err(("context_management".into(), "must be an object".into()));
    };
    if let Some(k) = section.keys().find(|k| !matches!(k.as_str(), "default" | "projects")) {
        return Err((format!("context_management.{k}"), "unknown member (expected default or projects)".into()));
    }
    let mut out = ContextDefaults::default();
    if let Some(d) = section.get("default") {
        let member = "context_management.default".to_string();
        out.default = Some(servable_mode(d).map_err(|r| (member, r))?);
    }
    if let Some(p) = section.get("projects") {
        out.projects = parse_projects(p)?;
    }
    Ok(out)
}

/// `context_management.projects`: project root → servable mode, keys normalized.
fn parse_projects(v: &Value) -> Result<BTreeMap<String, String>, MemberRefusal> {
    let Value::Object(projects) = v else {
        return Err(("context_management.projects".into(), "must be an object keyed by project root".into()));
    };
    let mut out = BTreeMap::new();
    for (root, value) in projects {
        let member = format!("context_management.projects[{}]", Value::String(root.clone()));
        if root.is_empty() {
            return Err((member, "the project root must not be empty".into()));
        }
        let mode = servable_mode(value).map_err(|r| (member, r))?;
        out.insert(normalize_project(root).to_string(), mode);
    }
    Ok(out)
}

/// A context-management value usable as a default, or why not.
fn servable_mode(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) if s == SERVABLE_DEFAULT => Ok(s.clone()),
        Value::String(s) if s == "compaction" => {
            Err("\"compaction\" is not available yet and cannot be a default".into())
        }
        Value::Object(o) if o.contains_key("transform") => {
            Err("a {\"transform\": ...} value is not served by broca and cannot be a default".into())
        }
        other => Err(format!("{other} is not a context-management mode (expected \"none\")")),
    }
}

/// `step_events`: `{"bus": "nats://<loopback host>:<port>", "account": "<token>"}`, both
/// required, nothing else.
fn parse_step_events(v: &Value) -> Result<BusConfig, MemberRefusal> {
    let Value::Object(section) = v else {
        return Err(("step_events".into(), "must be an object with bus and account".into()));
    };
    if let Some(k) = section.keys().find(|k| !matches!(k.as_str(), "bus" | "account")) {
        return Err((format!("step_events.{k}"), "unknown member (expected bus or account)".into()));
    }
    let url = section
        .get("bus")
        .and_then(Value::as_str)
        .ok_or_else(|| ("step_events.bus".to_string(), "must be a nats://<loopback host>:<port> string".to_string()))?;
    let addr = loopback_nats_addr(url).map_err(|r| ("step_events.bus".to_string(), r))?;
    let account = section.get("account").and_then(Value::as_str).unwrap_or_default();
    if !concrete_token(account) {
        return Err((
            "step_events.account".into(),
            "must be one subject token of 1 to 64 bytes without whitespace, '.', '*' or '>'".into(),
        ));
    }
    Ok(BusConfig { addr, account: account.to_owned() })
}

/// Whether `token` can stand as one concrete subject token: 1 to 64 bytes, no whitespace,
/// `.`, `*` or `>`.
fn concrete_token(token: &str) -> bool {
    (1..=64).contains(&token.len()) && !token.bytes().any(|b| b.is_ascii_whitespace() || b"*>.".contains(&b))
}

/// `nats://host:port` with a loopback host, as `host:port`.
fn loopback_nats_addr(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("nats://").ok_or("must start with nats://")?;
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or("must name a port (nats://host:port)")?;
    port.parse::<u16>().ok().filter(|p| *p != 0).ok_or("the port must be 1 to 65535")?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare == "localhost" || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(format!("{host} is not a loopback host: the bus listener has no TLS"));
    }
    Ok(rest.to_owned())
}

/// Turns JSONC into JSON: comments outside strings become whitespace (newlines kept, so
/// serde_json's line numbers still point into the file) and trailing commas are dropped.
pub fn jsonc_to_json(text: &str) -> Result<String, &'static str> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    Ok(drop_trailing_commas(&strip_comments(text)?))
}

/// Replaces `//` and `/* */` comments outside strings with whitespace.
fn strip_comments(text: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                '\\' => out.extend(chars.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut closed = false;
                while let Some(c) = chars.next() {
                    if c == '*' && chars.peek() == Some(&'/') {
                        chars.next();
                        closed = true;
                        break;
                    }
                    out.push(if c == '\n' { '\n' } else { ' ' });
                }
                if !closed {
                    return Err("unterminated /* comment");
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// Drops each `,` (outside strings) that only whitespace separates from a `}` or `]`.
fn drop_trailing_commas(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c == ',' {
            let next = text[i + 1..].trim_start().chars().next();
            if matches!(next, Some('}' | ']')) {
                out.push(' ');
                continue;
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BrocaConfig, ConfigError> {
        BrocaConfig::parse(Path::new("/state/broca.jsonc"), text)
    }

    #[test]
    fn provider_bases_are_urls_and_nothing_else() {
        let config = parse(r#"{"providers": {"typesafe": {"base_url": "http://127.0.0.1:9/"}, "x": {}}}"#).unwrap();
        assert_eq!(config.provider_base_urls.get("typesafe").map(String::as_str), Some("http://127.0.0.1:9"));
        assert!(!config.provider_base_urls.contains_key("x"));
        assert_eq!(
            refused_member(r#"{"providers": {"typesafe": {"base_url": "ftp://h"}}}"#),
            "providers.typesafe.base_url"
        );
        assert_eq!(refused_member(r#"{"providers": {"typesafe": {"base": "http://h"}}}"#), "providers.typesafe.base");
        assert_eq!(refused_member(r#"{"providers": []}"#), "providers");
        assert_eq!(parse(r#"{}"#).unwrap().federation_carriers, ["callosum"]);
        let fold = parse(r#"{"fold": {"after_idle_secs": 60, "min_bytes": 0}}"#).unwrap().fold;
        assert_eq!((fold.after_idle_ms, fold.min_bytes, fold.max_per_pass), (60_000, 0, 256));
        assert_eq!(refused_member(r#"{"fold": {"after_idle_secs": 0}}"#), "fold.after_idle_secs");
        assert_eq!(refused_member(r#"{"fold": {"after": 1}}"#), "fold.after");
        assert_eq!(parse(r#"{"federation": {"carriers": ["a", "b"]}}"#).unwrap().federation_carriers, ["a", "b"]);
        assert_eq!(refused_member(r#"{"federation": {"carrier": []}}"#), "federation.carrier");
        assert_eq!(refused_member(r#"{"federation": {"carriers": [""]}}"#), "federation.carriers[0]");
    }

    /// The refused member's name, and the message (which must name the file and the member).
    fn refused_member(text: &str) -> String {
        let err = parse(text).expect_err(text);
        let msg = err.to_string();
        match err {
            ConfigError::Member { member, .. } => {
                assert!(msg.contains("/state/broca.jsonc") && msg.contains(&member), "{msg}");
                member
            }
            other => panic!("expected a member refusal for {text}, got {other:?}"),
        }
    }

    #[test]
    fn limits_override_defaults_and_bad_ones_refuse_boot_by_name() {
        let config = parse(r#"{"limits": {"open_sessions": 12}}"#).unwrap();
        assert_eq!(config.limits.open_sessions, 12);
        assert_eq!(config.limits.subscribers_per_session, Limits::default().subscribers_per_session);
        assert_eq!(refused_member(r#"{"limits": {"open_sessions": 0}}"#), "limits.open_sessions");
        assert_eq!(refused_member(r#"{"limits": {"queue": 3}}"#), "limits.queue");
        assert_eq!(refused_member(r#"{"limits": 3}"#), "limits");
    }

    #[test]
    fn auth_methods_name_a_known_method_per_provider() {
        use crate::frozen::AuthMethod;
        let config = parse(r#"{"auth_methods": {"openai": "chatgpt", "google": "antigravity"}}"#).unwrap();
        assert_eq!(config.auth_methods.get("openai"), Some(&AuthMethod::Chatgpt));
        assert_eq!(refused_member(r#"{"auth_methods": {"openai": "password"}}"#), "auth_methods.openai");
        assert_eq!(refused_member(r#"{"auth_methods": ["chatgpt"]}"#), "auth_methods");
    }

    #[test]
    fn code_assist_names_a_google_cloud_project_and_nothing_else() {
        let config = parse(r#"{"code_assist": {"project": "acme-prod-123"}}"#).unwrap();
        assert_eq!(config.code_assist_project.as_deref(), Some("acme-prod-123"));
        assert_eq!(parse(r#"{"code_assist": {}}"#).unwrap().code_assist_project, None);
        assert_eq!(refused_member(r#"{"code_assist": {"project": "a/b"}}"#), "code_assist.project");
        assert_eq!(refused_member(r#"{"code_assist": {"project": ""}}"#), "code_assist.project");
        assert_eq!(refused_member(r#"{"code_assist": {"projects": "x"}}"#), "code_assist.projects");
        assert_eq!(refused_member(r#"{"code_assist": "x"}"#), "code_assist");
    }

    #[test]
    fn step_events_name_a_loopback_bus_and_an_account() {
        let config = parse(r#"{"step_events": {"bus": "nats://127.0.0.1:4222", "account": "acct1"}}"#).unwrap();
        let bus = config.step_events.unwrap();
        assert_eq!((bus.addr.as_str(), bus.account.as_str()), ("127.0.0.1:4222", "acct1"));
        let ipv6 = parse(r#"{"step_events": {"bus": "nats://[::1]:4222/", "account": "a"}}"#).unwrap();
        assert_eq!(ipv6.step_events.unwrap().addr, "[::1]:4222");
        for (text, member) in [
            (r#"{"step_events": {"bus": "nats://10.0.0.2:4222", "account": "a"}}"#, "step_events.bus"),
            (r#"{"step_events": {"bus": "http://127.0.0.1:4222", "account": "a"}}"#, "step_events.bus"),
            (r#"{"step_events": {"bus": "nats://127.0.0.1", "account": "a"}}"#, "step_events.bus"),
            (r#"{"step_events": {"bus": "nats://127.0.0.1:4222", "account": "a.b"}}"#, "step_events.account"),
            (r#"{"step_events": {"bus": "nats://127.0.0.1:4222"}}"#, "step_events.account"),
            (r#"{"step_events": {"bus": "nats://127.0.0.1:4222", "account": "a", "tls": 1}}"#, "step_events.tls"),
            (r#"{"step_events": "nats://127.0.0.1:4222"}"#, "step_events"),
        ] {
            assert_eq!(refused_member(text), member, "{text}");
        }
    }

    #[test]
    fn defaults_when_empty_or_absent() {
        let d = BrocaConfig::default();
        assert_eq!(d.backup_classes, vec!["head".to_string()]);
        assert_eq!(d.context_management, ContextDefaults::default());
        assert_eq!(parse("{}").unwrap(), d);
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::at(t.path()).unwrap();
        assert_eq!(BrocaConfig::load(&root).unwrap(), d);
        assert!(d.is_backed_up("head") && !d.is_backed_up("sub"));
        assert_eq!(d.context_default_for("/work/proj"), None);
    }

    #[test]
    fn load_reads_the_state_root_file() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::at(t.path()).unwrap();
        std::fs::write(root.config_path(), "// ops\n{\"backup_classes\": [\"main\",],}").unwrap();
        assert_eq!(BrocaConfig::load(&root).unwrap().backup_classes, vec!["main".to_string()]);
        std::fs::write(root.config_path(), b"{\"x\": \"\xff\"}").unwrap();
        assert!(matches!(BrocaConfig::load(&root), Err(ConfigError::Syntax { .. })));
    }

    #[test]
    fn comments_and_trailing_commas() {
        let text = r#"
            // line comment with "quotes" and /* an opener
            {
                /* block
                   comment */ "backup_classes": ["head", "ops-1",], // trailing
                "context_management": {
                    "default": "none", /* inline */
                    "projects": {"/work//*not a comment*/x": "none", "/a//b": "none",},
                },
                "note": "a // b /* c */ d, ]",
            }
        "#;
        let c = parse(text).unwrap();
        assert_eq!(c.backup_classes, vec!["head".to_string(), "ops-1".to_string()]);
        assert_eq!(c.context_management.default.as_deref(), Some("none"));
        let keys: Vec<&str> = c.context_management.projects.keys().map(String::as_str).collect();
        assert_eq!(keys, vec!["/a//b", "/work//*not a comment*/x"]);
    }

    #[test]
    fn string_escapes_do_not_end_strings() {
        let c = parse(r#"{"note": "a \" // still string, }", "backup_classes": ["x"]}"#).unwrap();
        assert_eq!(c.backup_classes, vec!["x".to_string()]);
    }

    #[test]
    fn syntax_errors_name_the_file() {
        for bad in ["{", "/* open", "[1]", "{\"a\": 1 /* x */ \"b\": 2}", ""] {
            match parse(bad) {
                Err(e @ ConfigError::Syntax { .. }) => assert!(e.to_string().contains("/state/broca.jsonc"), "{e}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_top_level_members_are_tolerated() {
        let c = parse(r#"{"future": {"anything": [1, 2]}, "backup_classes": []}"#).unwrap();
        assert!(c.backup_classes.is_empty());
    }

    #[test]
    fn backup_classes_refusals() {
        assert_eq!(refused_member(r#"{"backup_classes": "head"}"#), "backup_classes");
        assert_eq!(refused_member(r#"{"backup_classes": null}"#), "backup_classes");
        assert_eq!(refused_member(r#"{"backup_classes": ["ok", "Head"]}"#), "backup_classes[1]");
        assert_eq!(refused_member(r#"{"backup_classes": [""]}"#), "backup_classes[0]");
        assert_eq!(refused_member(r#"{"backup_classes": ["a b"]}"#), "backup_classes[0]");
        assert_eq!(refused_member(r#"{"backup_classes": [7]}"#), "backup_classes[0]");
        let long = "x".repeat(33);
        assert_eq!(refused_member(&format!(r#"{{"backup_classes": ["{long}"]}}"#)), "backup_classes[0]");
        let c = parse(r#"{"backup_classes": ["a", "a", "b"]}"#).unwrap();
        assert_eq!(c.backup_classes, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn context_management_refusals() {
        let cm = |inner: &str| refused_member(&format!(r#"{{"context_management": {inner}}}"#));
        assert_eq!(cm(r#""none""#), "context_management");
        assert_eq!(cm("null"), "context_management");
        assert_eq!(cm(r#"{"defualt": "none"}"#), "context_management.defualt");
        assert_eq!(cm(r#"{"default": "compaction"}"#), "context_management.default");
        assert_eq!(cm(r#"{"default": {"transform": "ctx-mod"}}"#), "context_management.default");
        assert_eq!(cm(r#"{"default": "None"}"#), "context_management.default");
        assert_eq!(cm(r#"{"default": null}"#), "context_management.default");
        assert_eq!(cm(r#"{"projects": []}"#), "context_management.projects");
        assert_eq!(cm(r#"{"projects": {"/p": "compaction"}}"#), r#"context_management.projects["/p"]"#);
        assert_eq!(cm(r#"{"projects": {"/p": {"transform": "m"}}}"#), r#"context_management.projects["/p"]"#);
        assert_eq!(cm(r#"{"projects": {"/p": 1}}"#), r#"context_management.projects["/p"]"#);
        assert_eq!(cm(r#"{"projects": {"": "none"}}"#), r#"context_management.projects[""]"#);
        let msg = parse(r#"{"context_management": {"default": "compaction"}}"#).unwrap_err().to_string();
        assert!(msg.contains("compaction"), "{msg}");
        let msg = parse(r#"{"context_management": {"default": {"transform": "m"}}}"#).unwrap_err().to_string();
        assert!(msg.contains("transform"), "{msg}");
    }

    #[test]
    fn project_lookup_ignores_trailing_slash() {
        let text = r#"{"context_management": {"projects": {"/work/a/": "none", "/work/b": "none", "/": "none"}}}"#;
        let c = parse(text).unwrap();
        assert_eq!(c.context_default_for("/work/a"), Some("none"));
        assert_eq!(c.context_default_for("/work/a/"), Some("none"));
        assert_eq!(c.context_default_for("/work/b/"), Some("none"));
        assert_eq!(c.context_default_for("/work/c"), None);
        assert_eq!(c.context_default_for("/"), Some("none"));
        assert_eq!(c.context_default_for("//"), Some("none"));
    }

    #[test]
    fn project_entry_wins_over_default() {
        let mut c = parse(r#"{"context_management": {"default": "none"}}"#).unwrap();
        assert_eq!(c.context_default_for("/anywhere"), Some("none"));
        // Only "none" is servable today, so prove precedence with hand-built values.
        c.context_management.default = Some("dflt".into());
        c.context_management.projects.insert("/p".into(), "proj".into());
        assert_eq!(c.context_default_for("/p/"), Some("proj"));
        assert_eq!(c.context_default_for("/q"), Some("dflt"));
    }

    #[test]
    fn session_class_grammar() {
        for ok in ["head", "a", "sub-agent_2", &"z".repeat(32)] {
            assert!(valid_session_class(ok), "{ok}");
        }
        for bad in ["", "Head", "a b", "a.b", "é", &"z".repeat(33), " head"] {
            assert!(!valid_session_class(bad), "{bad}");
        }
    }

    #[test]
    fn placement_rules() {
        let c = BrocaConfig::default();
        assert_eq!(c.placement_for(Some("head"), false), Placement::Durable);
        assert_eq!(c.placement_for(Some("head"), true), Placement::Ephemeral);
        assert_eq!(c.placement_for(None, true), Placement::Ephemeral);
        assert_eq!(c.placement_for(Some("other"), false), Placement::Standard);
        assert_eq!(c.placement_for(None, false), Placement::Standard);
    }
}
