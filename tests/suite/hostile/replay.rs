//! Replays every committed fuzz input (seed corpora in fuzz/corpus/TARGET and crashers
//! found so far in fuzz/regressions/TARGET) through the fuzz targets' bodies: each must
//! finish without a panic. The bodies are fuzz/bodies.rs, shared with `cargo fuzz`.

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/bodies.rs"]
mod bodies;

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        if let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) {
            files.extend(
                dir.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_file()),
            );
        }
    }
    files.sort();
    files
}

fn replay(target: &str, body: fn(&[u8]), at_least: usize) {
    let files = inputs(target);
    assert!(
        files.len() >= at_least,
        "fuzz/corpus/{target}: {} inputs, expected at least {at_least}",
        files.len()
    );
    for file in files {
        let data = std::fs::read(&file).unwrap();
        let outcome = std::panic::catch_unwind(|| body(&data));
        assert!(outcome.is_ok(), "{target} panicked on {}", file.display());
    }
}

#[test]
fn safetensors_reader_corpus_replays_without_panic() {
    replay("safetensors_reader", bodies::safetensors_reader, 5);
}

#[test]
fn npz_reader_corpus_replays_without_panic() {
    replay("npz_reader", bodies::npz_reader, 5);
}

#[test]
fn checkpoint_format_corpus_replays_without_panic() {
    replay("checkpoint_format", bodies::checkpoint_format, 5);
}

#[test]
fn onnx_reader_corpus_replays_without_panic() {
    replay("onnx_reader", bodies::onnx_reader, 5);
}

#[test]
fn pytorch_reader_corpus_replays_without_panic() {
    replay("pytorch_reader", bodies::pytorch_reader, 5);
}
