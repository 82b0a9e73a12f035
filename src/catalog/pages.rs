//! One catalog poll's pages (spec §1a; `reference/catalog-and-vault.md` B.2): the paged
//! `catalog.get` request, how one answer is classified, and the assembly of pages into one
//! `CatalogGetResponse`. Pure: no I/O, no clock; [`super::poller`] drives it.
//!
//! Invariants of an [`Assembly`] (one attempt, from page one):
//! - every page agreed with page one on `catalog_version` and `resolved_at_ms` (a mismatch is
//!   [`PageFault::Restart`], never merged);
//! - `models` holds each `provider/model` identity once, and each qualification array
//!   ([`QUALIFICATION_ARRAYS`]) each row identity once, concatenated in page order;
//! - every continuation token it handed out is distinct (a repeat is a protocol error), and the
//!   final page had no `next_page_token` at all (`null` is malformed, not "final");
//! - every page decoded as `fusiform_protocol::CatalogGetResponse` 0.30.0 before anything of it
//!   was merged, so a malformed page leaves nothing behind.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::{Map, Value};

/// The module that serves the catalog, on its tool route.
pub const FUSIFORM_MODULE: &str = "fusiform";
/// The tool the poller calls.
pub const CATALOG_GET: &str = "catalog.get";
/// The fact prefixes the poller asks for (the LKG's `request.fact_prefixes`).
pub const FACT_PREFIXES: [&str; 7] = ["existence", "model.", "limit.", "capability.", "wire.", "route.", "rate."];
/// The paging members a 0.30.0 fusiform does not know (it refuses them `bad_request`).
pub const PAGING_MEMBER: &str = "paged";
pub const PAGE_TOKEN_MEMBER: &str = "page_token";
/// The member naming the next page; absent on the last page.
pub const NEXT_PAGE_TOKEN: &str = "next_page_token";
/// The refusal code of a stale continuation: restart from page one.
pub const CATALOG_CHANGED: &str = "catalog_changed";
/// Per-row arrays concatenated across pages, with the members that identify a row.
pub const QUALIFICATION_ARRAYS: [(&str, &[&str]); 6] = [
    ("withheld", &["model", "fact_key"]),
    ("uncertain", &["provider_id", "model_id", "fact_key", "superseded_after_ms"]),
    ("retired", &["model"]),
    ("overridden", &["provider_id", "model_id", "fact_key"]),
    ("aliased", &["model"]),
    ("billing_rules", &["model", "fact_key"]),
];

/// The `arguments` of one page request. Page one omits `page_token`.
#[derive(Clone, Debug, Serialize)]
pub struct PagedCatalogGet {
    pub fact_prefixes: Vec<String>,
    pub include_retired: bool,
    pub paged: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_token: Option<String>,
}

impl PagedCatalogGet {
    pub fn page(token: Option<&str>) -> PagedCatalogGet {
        PagedCatalogGet {
            fact_prefixes: FACT_PREFIXES.iter().map(|p| (*p).to_owned()).collect(),
            include_retired: true,
            paged: true,
            page_token: token.map(str::to_owned),
        }
    }

    /// The tool-call body: `{"name": "catalog.get", "arguments": {…}}`.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"name": CATALOG_GET, "arguments": self})).expect("requests serialize")
    }

    /// The paging members this request carries (named when fusiform refuses them).
    pub fn paging_members(&self) -> Vec<&'static str> {
        let mut members = vec![PAGING_MEMBER];
        if self.page_token.is_some() {
            members.push(PAGE_TOKEN_MEMBER);
        }
        members
    }
}

/// A refusal fusiform answered: `{code, message, detail?}`.
#[derive(Clone, Debug, PartialEq)]
pub struct PageRefusal {
    pub code: String,
    pub message: String,
    pub detail: Option<Value>,
}

/// What a Response body is: a page, or an error document (`{"error": {code, message}}`, or a
/// bare `{code, message}` with no `models`; a `tool-result/v1` envelope is unwrapped first).
pub fn classify(body: &[u8]) -> Result<Result<Value, PageRefusal>, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let value = unwrap_tool_result(value)?;
    let Some(object) = value.as_object() else { return Err("the answer is not a JSON object".into()) };
    let error = match object.get("error") {
        Some(e) => Some(e),
        None if !object.contains_key("models") && object.contains_key("code") => Some(&value),
        None => None,
    };
    match error {
        Some(e) => refusal_of(e).map(Err).ok_or_else(|| "an error document without a string code".to_owned()),
        None => Ok(Ok(value)),
    }
}

/// A `tool-result/v1` body (`{content: [{type: "text", text}], structuredContent?}`) carries the
/// document in `structuredContent`, else as the JSON text of its one text part.
fn unwrap_tool_result(value: Value) -> Result<Value, String> {
    let Some(content) = value.get("content").and_then(Value::as_array) else { return Ok(value) };
    if value.get("models").is_some() {
        return Ok(value);
    }
    if let Some(structured) = value.get("structuredContent") {
        return Ok(structured.clone());
    }
    let text = content
        .iter()
        .find_map(|p| p.get("text").and_then(Value::as_str))
        .ok_or("a tool-result answer without a text part")?;
    serde_json::from_str(text).map_err(|e| format!("a tool-result text is not JSON: {e}"))
}

/// `{code, message, detail?}` from an error body.
pub fn refusal_of(e: &Value) -> Option<PageRefusal> {
    Some(PageRefusal {
        code: e.get("code")?.as_str()?.to_owned(),
        message: e.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
        detail: e.get("detail").cloned(),
    })
}

/// Why a page cannot be merged.
#[derive(Debug, PartialEq)]
pub enum PageFault {
    /// The page disagrees with page one on the snapshot: discard and restart from page one.
    Restart(String),
    /// Malformed or duplicated: the poll fails.
    Protocol(String),
}

/// What to do after a merged page.
#[derive(Debug, PartialEq)]
pub enum Next {
    Page(String),
    Done,
}

/// The pages of one attempt, merged. See the module invariants.
#[derive(Debug, Default)]
pub struct Assembly {
    merged: Option<Map<String, Value>>,
    version: i64,
    resolved_at_ms: i64,
    tokens: HashSet<String>,
    rows: HashSet<(usize, String)>,
    pub pages: usize,
}

impl Assembly {
    /// Merges one page (`page` is an answer [`classify`] accepted).
    pub fn add(&mut self, page: Value) -> Result<Next, PageFault> {
        let protocol = |m: String| PageFault::Protocol(format!("page {}: {m}", self.pages + 1));
        let typed: fusiform_protocol::CatalogGetResponse =
            serde_json::from_value(page.clone()).map_err(|e| protocol(format!("not a CatalogGetResponse: {e}")))?;
        let Value::Object(mut page) = page else { unreachable!("a CatalogGetResponse decoded from an object") };
        let next = match page.remove(NEXT_PAGE_TOKEN) {
            None => Next::Done,
            Some(Value::String(t)) if !t.is_empty() => Next::Page(t),
            Some(other) => return Err(protocol(format!("{NEXT_PAGE_TOKEN} is {other}, not a non-empty string"))),
        };
        if let Next::Page(t) = &next {
            if !self.tokens.insert(t.clone()) {
                return Err(protocol(format!("{NEXT_PAGE_TOKEN} repeats an earlier page's")));
            }
        }
        // Qualification rows: distinct across the attempt (checked before anything is merged).
        let mut fresh = Vec::new();
        for (index, (array, key_members)) in QUALIFICATION_ARRAYS.iter().enumerate() {
            let rows = match page.get(*array) {
                None => continue,
                Some(Value::Array(rows)) => rows,
                Some(_) => return Err(protocol(format!("{array} is not an array"))),
            };
            for row in rows {
                let id: Vec<String> =
                    key_members.iter().map(|m| row.get(*m).map_or_else(String::new, Value::to_string)).collect();
                let id = (index, id.join("\u{1f}"));
                if self.rows.contains(&id) || fresh.contains(&id) {
                    return Err(protocol(format!("a duplicate {array} row {row}")));
                }
                fresh.push(id);
            }
        }
        let Some(merged) = self.merged.as_mut() else {
            // Page one: the snapshot every later page must agree with, kept as served.
            self.version = typed.catalog_version;
            self.resolved_at_ms = typed.resolved_at_ms;
            self.rows.extend(fresh);
            self.merged = Some(page);
            self.pages = 1;
            return Ok(next);
        };
        if typed.catalog_version != self.version || typed.resolved_at_ms != self.resolved_at_ms {
            return Err(PageFault::Restart(format!(
                "page {} is catalog_version {} resolved_at_ms {}, page one {} / {}",
                self.pages + 1,
                typed.catalog_version,
                typed.resolved_at_ms,
                self.version,
                self.resolved_at_ms
            )));
        }
        let models = merged.get_mut("models").and_then(Value::as_object_mut).expect("page one had models");
        if let Some(dup) = typed.models.keys().find(|k| models.contains_key(*k)) {
            return Err(PageFault::Protocol(format!("page {}: model {dup:?} is on an earlier page", self.pages + 1)));
        }
        if let Some(Value::Object(page_models)) = page.remove("models") {
            models.extend(page_models);
        }
        for (array, _) in QUALIFICATION_ARRAYS {
            if let Some(Value::Array(rows)) = page.remove(array) {
                match merged.entry(array).or_insert_with(|| Value::Array(Vec::new())) {
                    Value::Array(all) => all.extend(rows),
                    _ => return Err(PageFault::Protocol(format!("page one's {array} is not an array"))),
                }
            }
        }
        self.rows.extend(fresh);
        self.pages += 1;
        Ok(next)
    }

    /// The merged `CatalogGetResponse`, once the last page arrived.
    pub fn finish(self) -> Option<Value> {
        self.merged.map(Value::Object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn page(version: i64, models: &[&str], token: Option<&str>) -> Value {
        let models: Map<String, Value> =
            models.iter().map(|m| ((*m).to_owned(), json!({"existence": "present"}))).collect();
        let mut p = json!({"source": "models.dev", "resolved_at_ms": 5, "catalog_version": version, "models": models});
        if let Some(t) = token {
            p[NEXT_PAGE_TOKEN] = json!(t);
        }
        p
    }

    #[test]
    fn page_one_omits_the_token_and_later_pages_echo_it() {
        let one: Value = serde_json::from_slice(&PagedCatalogGet::page(None).body()).unwrap();
        assert_eq!(
            one,
            json!({"name": "catalog.get", "arguments": {"fact_prefixes": FACT_PREFIXES, "include_retired": true, "paged": true}})
        );
        let two: Value = serde_json::from_slice(&PagedCatalogGet::page(Some("t 1/é")).body()).unwrap();
        assert_eq!(two["arguments"]["page_token"], "t 1/é");
    }

    #[test]
    fn pages_merge_and_every_rule_is_checked() {
        let mut a = Assembly::default();
        assert_eq!(a.add(page(7, &["a/x"], Some("t1"))), Ok(Next::Page("t1".into())));
        assert_eq!(a.add(page(7, &["b/y"], None)), Ok(Next::Done));
        let merged = a.finish().unwrap();
        assert_eq!(merged["models"].as_object().unwrap().len(), 2);
        assert!(merged.get(NEXT_PAGE_TOKEN).is_none());

        let mut a = Assembly::default();
        a.add(page(7, &["a/x"], Some("t1"))).unwrap();
        assert!(matches!(a.add(page(8, &["b/y"], None)), Err(PageFault::Restart(_))));
        assert!(matches!(a.add(page(7, &["a/x"], None)), Err(PageFault::Protocol(m)) if m.contains("earlier page")));
        assert!(matches!(a.add(page(7, &["c/z"], Some("t1"))), Err(PageFault::Protocol(m)) if m.contains("repeats")));
        let mut null_token = page(7, &["c/z"], None);
        null_token[NEXT_PAGE_TOKEN] = Value::Null;
        assert!(matches!(a.add(null_token), Err(PageFault::Protocol(_))));
        assert!(
            matches!(a.add(json!({"models": {}})), Err(PageFault::Protocol(m)) if m.contains("CatalogGetResponse"))
        );
        let row = json!({"model": "a/x", "fact_key": "limit.context", "corrections": []});
        let mut with_row = page(7, &["d/w"], Some("t2"));
        with_row["withheld"] = json!([row]);
        a.add(with_row.clone()).unwrap();
        with_row["models"] = json!({"e/v": {"existence": "present"}});
        with_row[NEXT_PAGE_TOKEN] = json!("t3");
        assert!(matches!(a.add(with_row), Err(PageFault::Protocol(m)) if m.contains("duplicate withheld")));
    }

    #[test]
    fn answers_are_told_apart() {
        let refused = |b: &str| classify(b.as_bytes()).unwrap().unwrap_err().code;
        assert_eq!(refused(r#"{"error":{"code":"catalog_changed","message":"m"}}"#), "catalog_changed");
        assert_eq!(refused(r#"{"code":"refused","message":"m"}"#), "refused");
        let tool_result = json!({"content": [{"type": "text", "text": page(1, &["a/x"], None).to_string()}]});
        assert!(classify(tool_result.to_string().as_bytes()).unwrap().is_ok());
        assert!(classify(b"nope").is_err());
        assert!(classify(b"[1]").is_err());
    }
}
