//! The layers import downward only (DESIGN.md §3): among the library's top-level modules, the
//! graph of `crate::<module>` references has no cycle. Read from the sources, so a new import
//! that closes a cycle fails here with the cycle named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text` names as `crate::<m>` (in paths and in `use crate::{…}`).
fn references(text: &str) -> BTreeSet<String> {
    references_after(text, "crate::")
}

/// The modules `text` names right after `prefix` (in paths and in `use <prefix>{…}`), outside
/// comments (a doc link is no import).
fn references_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect::<String>();
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let text = code.as_str();
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|item| ident(item.trim())).filter(|m| !m.is_empty()));
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

/// A cycle through `start`, if the graph has one.
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|m| m == at) {
            let mut cycle = path[i..].to_vec();
            cycle.push(at.to_string());
            return Some(cycle);
        }
        if !done.insert(at.to_string()) {
            return None;
        }
        path.push(at.to_string());
        for next in graph.get(at).into_iter().flatten() {
            if let Some(c) = walk(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    walk(graph, start, &mut Vec::new(), &mut BTreeSet::new())
}

/// The import graph among the children (files and folders) of `dir`, `skip` aside: an edge
/// for every child named in `refs(path below dir, text)` of one of a child's files.
fn import_graph(
    dir: &Path,
    skip: &str,
    refs: impl Fn(&Path, &str) -> BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(dir, &mut files);
    let known: BTreeSet<String> = dir
        .read_dir()
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(dir).unwrap();
        let child = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if child == skip {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let deps: Vec<String> = refs(rel, &text).into_iter().filter(|m| *m != child && known.contains(m)).collect();
        graph.entry(child).or_default().extend(deps);
    }
    graph
}

fn assert_acyclic(graph: &BTreeMap<String, BTreeSet<String>>, among: &str) {
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(graph, module) {
            panic!("an import cycle among {among}: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn top_level_modules_import_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph(&src, "lib", |_, text| references(text));
    assert!(graph.len() > 10, "the source walk found the modules: {graph:?}");
    assert_acyclic(&graph, "top-level modules");
}

/// One level down too, and below (#27): inside every folder of `src`, its children import
/// without a cycle, read from `crate::<path>::<m>` anywhere below the folder and `super::<m>` in
/// the files directly in it (their siblings). The folder's own module file (`mod.rs`, or the
/// `<folder>.rs` beside it) is the parent, not one of them.
#[test]
fn every_folder_s_children_import_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = Vec::new();
    folders(&src, &mut dirs);
    let mut checked = Vec::new();
    for dir in dirs {
        let path: Vec<String> = dir
            .strip_prefix(&src)
            .unwrap()
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let prefix = format!("crate::{}::", path.join("::"));
        let graph = import_graph(&dir, "mod", |rel, text| {
            let mut refs = references_after(text, &prefix);
            if rel.components().count() == 1 && rel.file_name().is_some_and(|f| f != "mod.rs") {
                refs.extend(references_after(text, "super::"));
            }
            refs
        });
        assert_acyclic(&graph, &format!("src/{}'s modules", path.join("/")));
        checked.push(path.join("/"));
    }
    for expected in ["subc", "subc/consumer", "lineage", "agent", "provider"] {
        assert!(checked.iter().any(|c| c == expected), "the walk checked src/{expected}: {checked:?}");
    }
}

fn folders(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.push(path.clone());
            folders(&path, out);
        }
    }
}

#[test]
fn the_reference_scan_reads_paths_and_groups() {
    let text = "use crate::wire::Refusal;\nuse crate::{agent, lineage::Lineage};\nlet x = crate::store::f();";
    let found: Vec<String> = references(text).into_iter().collect();
    assert_eq!(found, ["agent", "lineage", "store", "wire"]);
}

/// Where `serde_json::Value` may still appear in the core (#27): values stay typed from the
/// wire to the WAL, except what is opaque to broca by nature and the wire edge. One row per
/// file: how many code lines name `Value`, and why. A new use fails here until it is typed or
/// listed with its reason; a removed one asks for its row to shrink.
const VALUE_IN_THE_CORE: &[(&str, usize, &str)] = &[
    ("src/record.rs", 11, "tool result output (ToolResult.output; refused_before_run reads the shape older records gave refusals); Frozen::Unreadable keeps a config this build cannot read as written (and reads its tools/max_input_tokens/plan.output_refs from it)"),
    ("src/replay.rs", 2, "a tool result's output as the batch holds it"),
    ("src/lineage/held.rs", 1, "a sealed tool result's output (the record's own output shape)"),
    ("src/lineage/projection.rs", 2, "a tool result's output, and ToolStarted's empty arguments placeholder"),
    ("src/lineage/unit.rs", 5, "a tool_result unit's output; the unit's JSON at the wire edge (to_json, body)"),
    ("src/actor/mod.rs", 1, "Frozen::Unreadable for a queued send recorded without a config"),
    ("src/actor/policy.rs", 3, "send.context_management, refused by name (context_management_unavailable) before anything is frozen"),
    ("src/agent/attempt.rs", 1, "a message's origin, part of the opaque model message"),
    ("src/agent/mod.rs", 4, "tool arguments parsed from the model's text"),
    ("src/agent/tools.rs", 4, "tool arguments and outputs"),
    ("src/agent/turn.rs", 3, "tool arguments of a step's calls"),
    ("src/agent/turn/stops.rs", 2, "tool arguments and the never-executed output"),
    ("src/fanout/mod.rs", 5, "the wire edge: frames become JSON for the sinks"),
];

#[test]
fn serde_json_value_in_the_core_only_where_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for core in ["record.rs", "replay.rs"] {
        files.push(root.join("src").join(core));
    }
    for core in ["replay", "lineage", "actor", "agent", "fanout"] {
        let dir = root.join("src").join(core);
        if dir.is_dir() {
            sources(&dir, &mut files);
        }
    }
    let mut found = BTreeMap::new();
    for file in files.iter().filter(|f| f.is_file()) {
        let text = std::fs::read_to_string(file).unwrap();
        let count = text.lines().filter(|l| names_value(l)).count();
        if count > 0 {
            found.insert(file.strip_prefix(root).unwrap().to_string_lossy().into_owned(), count);
        }
    }
    let listed: BTreeMap<String, usize> = VALUE_IN_THE_CORE.iter().map(|(f, n, _)| ((*f).to_string(), *n)).collect();
    assert_eq!(found, listed, "serde_json::Value in the core differs from VALUE_IN_THE_CORE (found, listed)");
}

/// Whether a code line names `Value` as a word (a visitor's `V::Value` is serde's, not JSON).
fn names_value(line: &str) -> bool {
    let line = line.trim();
    if line.starts_with("//") {
        return false;
    }
    let line = line.replace("V::Value", "");
    line.match_indices("Value").any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + 5..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !word(before) && !word(after)
    })
}
