//! Golden bodies: a served answer or refusal is pinned byte for byte under `testdata/golden/`.
//! Values that differ per run (minted run and submission ids, wall-clock milliseconds, the
//! temp state root) are replaced by stable placeholders first, in order of appearance, so the
//! pin holds the shape and every other byte. `BROCA_BLESS=1` rewrites the files.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

/// The stable form of `body`: `sub-<hex>` ids become `sub-1`, `sub-2`, … (a run id keeps its
/// `run-` prefix), `*_ms`, `written_at` and `updated_at` numbers become 1700000000000, a WAL
/// `incarnation` UUID `<incarnation>`, and `root` (when given) `<root>`.
pub fn normalize(body: &str, root: Option<&str>) -> String {
    let mut text = body.to_string();
    if let Some(root) = root {
        text = text.replace(root, "<root>");
    }
    let mut value: Value = serde_json::from_str(&text).expect("golden bodies are JSON");
    let mut ids = HashMap::new();
    walk(&mut value, &mut ids);
    serde_json::to_string(&value).expect("serializes")
}

fn walk(v: &mut Value, ids: &mut HashMap<String, String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                let time = k.ends_with("_ms") || k == "written_at" || k == "updated_at";
                if time && child.is_u64() {
                    *child = Value::from(1_700_000_000_000u64);
                } else if k == "incarnation" && child.as_str().is_some_and(|s| s.len() == 36) {
                    *child = Value::from("<incarnation>");
                } else {
                    walk(child, ids);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|c| walk(c, ids)),
        Value::String(s) => *s = replace_ids(s, ids),
        _ => {}
    }
}

fn replace_ids(s: &str, ids: &mut HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("sub-") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 4..];
        let hex: String = tail.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        if hex.len() == 32 {
            let n = ids.len() + 1;
            let id = ids.entry(hex.clone()).or_insert_with(|| format!("sub-{n}"));
            out.push_str(id);
            rest = &tail[32..];
        } else {
            out.push_str("sub-");
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Compares `body` (normalized) with `testdata/golden/<name>` byte for byte.
pub fn assert_golden(name: &str, body: &str, root: Option<&str>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/golden").join(name);
    let got = normalize(body, root);
    if std::env::var_os("BROCA_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(got, want.trim_end_matches('\n'), "golden {name} differs");
}
