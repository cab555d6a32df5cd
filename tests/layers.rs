//! The library's modules form one stack, each importing only from the layers below it, so
//! the data path points one way and there is no import circle (issue 10). This reads the
//! sources and checks every `crate::NAME` reference against the order documented in
//! src/lib.rs; it also checks that the gMLP model knows nothing of protobuf.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top-level modules by layer; a module may use its own layer's module only if it is
/// itself, and any module of a lower layer.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["tensor", "rng", "fs", "archive"],
    &["npz"],
    &["onnx"],
    &["gmlp"],
    &["checkpoint"],
    &["inspect"],
    &["runtime"],
    &["serve"],
    &["validate"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
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

/// The top-level module a library source file belongs to (`src/onnx/ops.rs` → `onnx`).
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

#[test]
fn modules_import_only_from_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = BTreeMap::new();
    let mut checked = 0;
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        if ["lib", "main", "cli"].contains(&module.as_str()) {
            continue; // the crate root and the binary sit on top of everything
        }
        let own = layer_of(&module)
            .unwrap_or_else(|| panic!("{}: module {module} is not in LAYERS", file.display()));
        let text = std::fs::read_to_string(file).unwrap();
        for used in crate_references(&text) {
            checked += 1;
            if used == module || used == "Error" || used == "Result" {
                continue;
            }
            let ok = matches!(layer_of(&used), Some(l) if l < own);
            if !ok {
                violations
                    .entry(format!("{}", file.strip_prefix(&src).unwrap().display()))
                    .or_insert_with(Vec::new)
                    .push(used);
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} references seen: is the scan broken?"
    );
    assert!(
        violations.is_empty(),
        "imports that point up or sideways: {violations:?}"
    );
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

#[test]
fn the_scanner_sees_references() {
    assert_eq!(
        crate_references("use crate::onnx::graph::Dim; x(crate::gmlp::A); mycrate::no"),
        vec!["onnx", "gmlp"]
    );
}
