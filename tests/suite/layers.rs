//! The library's modules form a graph without a circle, each using only the modules the
//! graph gives it, so the data path points one way (docs/architecture.md). This reads the
//! sources and checks every `crate::NAME` reference against [`USES`], the real graph (an
//! edge the sources do not have fails too, so the table claims nothing false), and that
//! src/lib.rs's doc draws the same graph; it also checks that the gMLP model knows nothing
//! of protobuf, and that the engine (`src/runtime/`) knows nothing of the decoding layer on
//! top of it (`src/generation/`) nor any tensor name of the model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level library module and the modules its files use (`crate::NAME` anywhere,
/// doc links and unit tests included): modules used by none of each other's are siblings
/// (`runtime` and `checkpoint` over `gmlp`; `serve` and `validate` over `generation`).
const USES: &[(&str, &[&str])] = &[
    ("message", &[]),
    ("rng", &[]),
    ("spelling", &[]),
    ("error", &["message"]),
    ("tensor", &["error"]),
    ("fs", &["error"]),
    ("archive", &["error"]),
    ("npz", &["archive", "error", "fs", "tensor"]),
    ("plot", &["error", "fs"]),
    ("onnx", &["error", "fs", "rng", "tensor"]),
    (
        "gmlp",
        &["error", "message", "onnx", "rng", "spelling", "tensor"],
    ),
    (
        "checkpoint",
        &["archive", "error", "fs", "gmlp", "message", "npz", "tensor"],
    ),
    ("inspect", &["error", "gmlp", "message", "onnx", "plot"]),
    ("rebuild", &["error", "gmlp", "onnx"]),
    ("runtime", &["error", "gmlp", "onnx", "spelling", "tensor"]),
    (
        "generation",
        &[
            "error", "gmlp", "onnx", "rebuild", "rng", "runtime", "tensor",
        ],
    ),
    (
        "serve",
        &[
            "error",
            "fs",
            "generation",
            "gmlp",
            "message",
            "onnx",
            "rebuild",
            "rng",
            "runtime",
            "tensor",
        ],
    ),
    (
        "validate",
        &[
            "error",
            "generation",
            "gmlp",
            "message",
            "npz",
            "onnx",
            "plot",
            "rng",
            "runtime",
            "tensor",
        ],
    ),
    (
        "pipeline",
        &[
            "checkpoint",
            "error",
            "gmlp",
            "inspect",
            "message",
            "onnx",
            "runtime",
            "serve",
        ],
    ),
];

/// The modules `module` may use, or `None` for a module not in [`USES`].
fn uses_of(module: &str) -> Option<&'static [&'static str]> {
    USES.iter().find(|(m, _)| *m == module).map(|(_, u)| *u)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a library source file belongs to (`src/onnx/ops/math.rs` → `onnx`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_string())
}

/// Every `crate::NAME` in the text (comments included: a doc link that points up is a
/// dependency of the reader's mind too, and there is none).
fn crate_references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let tail = &rest[at + "crate::".len()..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let before = rest[..at].chars().last();
        // `gmlp_onnx::crate` never occurs; skip `super::crate`-like false hits of other idents.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
            found.push(name);
        }
        rest = tail;
    }
    found
}

/// The `crate::NAME` references of `text`, a source file of the top-level module
/// `module`, to a module the graph does not give it (itself and the crate root's
/// `Error`/`Result` aside).
fn undeclared(module: &str, text: &str) -> Vec<String> {
    let uses = uses_of(module).expect("a module in USES");
    crate_references(text)
        .into_iter()
        .filter(|used| {
            !(used == module
                || used == "Error"
                || used == "Result"
                || uses.contains(&used.as_str()))
        })
        .collect()
}

/// Every library source file with its top-level module (the crate root, the binary and the
/// command line, which sit on top of everything, aside).
fn library_files() -> Vec<(String, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .filter_map(|file| Some((module_of(&src, &file)?, file)))
        .filter(|(module, _)| !["lib", "main", "cli"].contains(&module.as_str()))
        .collect()
}

#[test]
fn modules_use_only_what_the_graph_gives_them() {
    let mut violations = BTreeMap::new();
    let mut checked = 0;
    for (module, file) in library_files() {
        assert!(
            uses_of(&module).is_some(),
            "{}: module {module} is not in USES",
            file.display()
        );
        let text = std::fs::read_to_string(&file).unwrap();
        checked += crate_references(&text).len();
        let undeclared = undeclared(&module, &text);
        if !undeclared.is_empty() {
            violations.insert(file.display().to_string(), undeclared);
        }
    }
    assert!(
        checked > 100,
        "only {checked} references seen: is the scan broken?"
    );
    assert!(
        violations.is_empty(),
        "uses the graph does not have (add the edge to USES and lib.rs if it belongs): {violations:?}"
    );
}

#[test]
fn the_graph_claims_no_use_the_sources_do_not_have() {
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in library_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        used.entry(module)
            .or_default()
            .extend(crate_references(&text));
    }
    for (module, uses) in USES {
        let seen = used.get(*module).cloned().unwrap_or_default();
        for u in *uses {
            assert!(
                seen.contains(*u),
                "USES says {module} uses {u}, but no file of {module} does"
            );
        }
    }
    assert_eq!(
        used.keys().cloned().collect::<BTreeSet<_>>(),
        USES.iter()
            .map(|(m, _)| m.to_string())
            .collect::<BTreeSet<_>>(),
        "the modules of src/ and of USES"
    );
}

#[test]
fn the_graph_has_no_circle_and_lib_rs_draws_it() {
    let edges: BTreeMap<String, BTreeSet<String>> = USES
        .iter()
        .map(|(m, u)| (m.to_string(), u.iter().map(|s| s.to_string()).collect()))
        .collect();
    assert_eq!(find_cycle(&edges), None);
    // src/lib.rs's doc lists the graph, a line per module: `module: used, used, ...`.
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let drawn: Vec<(String, Vec<String>)> = lib
        .lines()
        .skip_while(|l| !l.starts_with("//! ```text"))
        .skip(1)
        .take_while(|l| !l.starts_with("//! ```"))
        .map(|l| {
            let (module, uses) = l.trim_start_matches("//!").trim().split_once(':').unwrap();
            let uses = uses.split(',').map(str::trim).filter(|u| !u.is_empty());
            (
                module.trim().to_string(),
                uses.map(str::to_string).collect(),
            )
        })
        .collect();
    let table: Vec<(String, Vec<String>)> = USES
        .iter()
        .map(|(m, u)| (m.to_string(), u.iter().map(|s| s.to_string()).collect()))
        .collect();
    assert_eq!(drawn, table, "src/lib.rs's graph and USES");
}

#[test]
fn the_gmlp_model_knows_nothing_of_protobuf() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gmlp");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 8);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for needle in [
            "onnx::proto",
            "prost",
            "onnx::reader",
            "onnx::writer::encode",
        ] {
            assert!(
                !text.contains(needle),
                "{} mentions {needle}",
                file.display()
            );
        }
    }
}

/// The two layers of running a model: the engine (`runtime`: sessions, buffers, where
/// ONNX Runtime comes from) under the decoding layer (`generation`: the decoding model,
/// the decoder, its state, the sampler, the generator). A reference from the engine to the
/// decoding layer, a doc link included, is one pointing up; the other way is allowed.
#[test]
fn the_engine_never_refers_to_the_decoding_layer() {
    assert!(!uses_of("runtime").unwrap().contains(&"generation"));
    assert!(uses_of("generation").unwrap().contains(&"runtime"));
    assert_eq!(
        undeclared("runtime", "use crate::generation::Decoder;"),
        vec!["generation"]
    );
    assert_eq!(
        undeclared(
            "runtime",
            "/// See [`Sampler`](crate::generation::sampling::Sampler)."
        ),
        vec!["generation"]
    );
    assert!(undeclared("generation", "use crate::runtime::{open, Runtime};").is_empty());
    // And on the sources: no file of the engine names the decoding layer at all.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 8, "the engine's files: {files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            !crate_references(&text).iter().any(|m| m == "generation"),
            "{} refers to the decoding layer",
            file.display()
        );
    }
}

/// The engine's library code (its unit tests and their test models aside) names no tensor
/// of the model and uses nothing of the gMLP module: a bound session's buffers and
/// bindings are named by the decoding layer, and a carried value is the engine's own
/// `Carry`, a pair of names its caller fills.
#[test]
fn the_engine_names_no_tensor_of_the_model() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut seen = 0;
    let library_file =
        |f: &&std::path::PathBuf| !f.ends_with("testing.rs") && !f.ends_with("tests.rs");
    for file in files.iter().filter(library_file) {
        let text = std::fs::read_to_string(file).unwrap();
        let library = text.split("#[cfg(test)]").next().unwrap_or("");
        let own = module_path(dir.parent().unwrap(), file);
        for path in path_references(&own, library) {
            seen += 1;
            assert!(
                path.first().is_none_or(|m| m != "gmlp"),
                "{} uses the model: {}",
                file.display(),
                path.join("::")
            );
        }
        for name in [
            "\"input_ids\"",
            "\"logits\"",
            "\"position\"",
            "\"past_",
            "\"present_",
        ] {
            assert!(
                !library.contains(name),
                "{} names the model's tensor {name}",
                file.display()
            );
        }
    }
    assert!(
        seen >= 1,
        "the engine's references to the crate: is the scan broken?"
    );
}

#[test]
fn the_scanner_sees_references() {
    assert_eq!(
        crate_references("use crate::onnx::graph::Dim; x(crate::gmlp::A); mycrate::no"),
        vec!["onnx", "gmlp"]
    );
}

/// The module path of a library source file (`src/validate/stepwise.rs` →
/// `[validate, stepwise]`; a folder's `mod.rs` is the folder itself).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_str()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The module paths a file refers to: `crate::a::b::c` and `super::b` (one level of
/// `{…}` groups expanded), each as the path of identifiers it names.
fn path_references(own: &[String], text: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> (&str, &str) {
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        (&s[..end], &s[end..])
    }
    // Reads `a::b::{c::d, e}` from `rest`: every path it names.
    fn paths(prefix: Vec<String>, rest: &str, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        let mut rest = rest;
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                // Split the group at its top-level commas, up to the matching brace.
                let (mut depth, mut start) = (0usize, 0usize);
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            paths(path.clone(), group[start..i].trim(), out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            paths(path.clone(), group[start..i].trim(), out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let (name, tail) = ident(rest);
            if name.is_empty() {
                break;
            }
            if name == "super" {
                path.pop(); // `super::super::x`
            } else {
                path.push(name.to_string());
            }
            match tail.strip_prefix("::") {
                Some(next) => rest = next,
                None => break,
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    for (needle, base) in [
        ("crate::", Vec::new()),
        ("super::", own[..own.len().saturating_sub(1)].to_vec()),
    ] {
        let mut from = 0;
        while let Some(at) = text[from..].find(needle).map(|at| from + at) {
            let before = text[..at].chars().last();
            let tail = &text[at + needle.len()..];
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                paths(base.clone(), tail, &mut out);
            }
            from = at + needle.len();
        }
    }
    out
}

/// A cycle in `edges` (module → the sibling modules it uses), if there is one.
fn find_cycle(edges: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, std::collections::BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

/// Inside every folder of src/, the files and sub-folders (siblings) use each other
/// without a circle: `a` using `b` and `b` using `a` (directly or through others) is a
/// dependency pointing both ways. A module using its parent's own items, or a parent
/// using its children, is not a sibling edge; doc links count, as above.
#[test]
fn no_circle_between_the_files_of_a_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: std::collections::BTreeSet<Vec<String>> =
        files.iter().map(|f| module_path(&src, f)).collect();
    let is_module = |path: &[String]| modules.iter().any(|m| m.starts_with(path));
    // folder path → (sibling → siblings it uses)
    let mut folders: BTreeMap<Vec<String>, BTreeMap<String, std::collections::BTreeSet<String>>> =
        BTreeMap::new();
    let mut edges_seen = 0;
    for file in &files {
        let own = module_path(&src, file);
        if own.is_empty() || own[0] == "main" || own[0] == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        // A file's unit tests (its `#[cfg(test)]` module, last by convention) may use any
        // sibling: they are not part of the library's dependency graph.
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        for target in path_references(&own, text) {
            let common = own.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == 0 || common >= own.len() || common >= target.len() {
                continue; // top level (checked above), or parent and child
            }
            if !is_module(&target[..=common]) {
                continue; // an item of the parent module, not a sibling
            }
            edges_seen += 1;
            folders
                .entry(own[..common].to_vec())
                .or_default()
                .entry(own[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    assert!(
        edges_seen > 50,
        "only {edges_seen} sibling edges seen: is the scan broken?"
    );
    let circles: Vec<String> = folders
        .iter()
        .filter_map(|(folder, edges)| {
            find_cycle(edges).map(|c| format!("src/{}: {}", folder.join("/"), c.join(" → ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "modules of a folder import each other in a circle: {circles:#?}"
    );
}

#[test]
fn the_path_scanner_reads_groups_and_super() {
    let own = vec!["validate".to_string(), "decoding".to_string()];
    let found = path_references(
        &own,
        "use crate::validate::{compare::X, report::{a, b}}; use super::inputs::Y; x::super::no; super::super::gmlp::Z",
    );
    let as_str: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        as_str,
        vec![
            "validate::compare::X",
            "validate::report::a",
            "validate::report::b",
            "validate::inputs::Y",
            "gmlp::Z"
        ]
    );
}
