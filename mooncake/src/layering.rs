//! Checks the crate's layering: the `crate::` edges between top-level
//! modules must form no cycle, and the FFI layer may only use the plain
//! data modules below it.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules the FFI layer may use: plain data it returns or fails with.
const BELOW_FFI: &[&str] = &["error", "notify"];

type Edges = BTreeMap<String, BTreeSet<String>>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to.
fn module_files(dir: &Path, top: Option<&str>, out: &mut Vec<(String, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src is readable")
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("UTF-8 file name")
            .to_string();
        let module = top.map_or(stem, str::to_string);
        if path.is_dir() {
            module_files(&path, Some(&module), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((module, path));
        }
    }
}

/// The top-level modules a source text names as `crate::<module>`,
/// comments left out (doc links are not dependencies).
fn referenced_modules(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let rest = rest.trim_start_matches('{');
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&name) {
                found.insert(name);
            }
        }
    }
    found
}

/// Edges between top-level modules (`lib.rs`, the root, is left out).
fn module_edges() -> Edges {
    let mut files = Vec::new();
    module_files(&src_dir(), None, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(m, _)| m.clone())
        .filter(|m| m != "lib")
        .collect();
    let mut edges = Edges::new();
    for (module, path) in files.iter().filter(|(m, _)| m != "lib") {
        let text = std::fs::read_to_string(path).expect("source is readable");
        let targets = edges.entry(module.clone()).or_default();
        for target in referenced_modules(&text, &modules) {
            if &target != module {
                targets.insert(target);
            }
        }
    }
    edges
}

/// A cycle through `edges`, if there is one, as the modules along it.
fn find_cycle(edges: &Edges) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &Edges,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut done, &mut Vec::new()))
}

#[test]
fn module_imports_have_no_cycle() {
    let edges = module_edges();
    for (from, to) in &edges {
        eprintln!("{from} -> {to:?}");
    }
    assert!(edges.contains_key("ffi") && edges.contains_key("engine"));
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn ffi_uses_only_plain_data_modules() {
    let edges = module_edges();
    let above: Vec<_> = edges["ffi"]
        .iter()
        .filter(|m| !BELOW_FFI.contains(&m.as_str()))
        .collect();
    assert!(above.is_empty(), "ffi reaches up into {above:?}");
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut edges = Edges::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&edges), None);
    edges.entry("c".into()).or_default().insert("a".into());
    let cycle = find_cycle(&edges).expect("a -> b -> c -> a");
    assert_eq!(cycle, ["a", "b", "c", "a"]);
}
