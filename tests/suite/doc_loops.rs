//! The Python loops the documentation shows users run as written: docs/static-state.md's
//! plain loop and I/O-binding loop on a file built with a plain `--with-past` (the static
//! state), and docs/generation.md's loop on one built `--with-past growing`. Each block is
//! taken from the page itself (its ```python fences) and run in a folder holding the file
//! name it opens; the greedy tokens it prints must be those of `gmlp-onnx generate` on the
//! same file.

use std::path::Path;

use crate::common::{doc_python_blocks, gmlp, output_text, path_str, python, Amlp, Build};

/// A seeded byte-level aMLP (2 blocks, d 64, n = 64; paper init with `seed`, whose greedy
/// continuations of the docs' prompts vary) built with `past` flags into `dir/name`.
fn build(dir: &Path, name: &str, seed: &str, past: &[&str]) -> std::path::PathBuf {
    Build::amlp(2, Amlp::Medium)
        .args(&["--causal", "--seed", seed])
        .args(past)
        .write(&dir.join(name))
}

/// `generate`'s tokens, checked to vary enough that a loop feeding the wrong position or
/// state would show.
fn varied(tokens: Vec<i64>) -> Vec<i64> {
    let mut distinct = tokens.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 5, "a varied continuation: {tokens:?}");
    tokens
}

/// `script` run in `dir` (where the docs' file name points), its stdout.
fn run_in(dir: &Path, script: &str) -> String {
    let o = std::process::Command::new(python())
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("run python (set GMLP_ONNX_PYTHON or run scripts/test)");
    assert!(o.status.success(), "{script}\n{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `gmlp-onnx generate`'s greedy tokens for `prompt` on `model`.
fn generated(model: &Path, prompt: &str, count: usize) -> Vec<i64> {
    let o = gmlp(&[
        "generate",
        path_str(model),
        "--runtime",
        "ort-cpu",
        "--prompt-ids",
        prompt,
        "--max-new-tokens",
        &count.to_string(),
        "--json",
        "-q",
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    serde_json::from_value(v[0]["tokens"].clone()).unwrap()
}

/// A printed Python list of ints, `[1, 2, 3]`.
fn list(line: &str) -> Vec<i64> {
    let inner = line.trim().trim_start_matches('[').trim_end_matches(']');
    inner
        .split(',')
        .map(|t| t.trim().parse().expect("a token id"))
        .collect()
}

#[test]
fn the_static_state_loops_of_the_docs_run_as_written() {
    let blocks = doc_python_blocks("static-state.md");
    assert_eq!(blocks.len(), 2, "the plain loop and the I/O-binding loop");
    assert!(blocks.iter().all(|b| !b.contains("model.onnx")));
    let dir = tempfile::tempdir().unwrap();
    let model = build(dir.path(), "lm.onnx", "5", &["--with-past"]);
    // The second block continues the first (same session, state names, batch).
    let printed = run_in(dir.path(), &blocks.concat());
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "{printed}");
    let expected = varied(generated(&model, "80,101,114", 16));
    assert_eq!(list(lines[0]), expected, "the plain loop");
    assert_eq!(list(lines[1]), expected, "the I/O-binding loop");
}

#[test]
fn the_growing_state_loop_of_the_docs_runs_as_written() {
    let blocks = doc_python_blocks("generation.md");
    assert_eq!(blocks.len(), 1, "the growing-state loop");
    let dir = tempfile::tempdir().unwrap();
    let model = build(dir.path(), "model.onnx", "2", &["--with-past", "growing"]);
    let printed = run_in(dir.path(), &blocks[0]);
    let tokens: Vec<i64> = printed
        .lines()
        .map(|l| l.trim().parse().expect("a token id per line"))
        .collect();
    assert_eq!(tokens, varied(generated(&model, "72,101,108,108,111", 20)));
}

#[test]
fn the_genai_loop_of_the_docs_runs_as_written() {
    let blocks = doc_python_blocks("genai.md");
    assert_eq!(blocks.len(), 1, "one Python block");
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("lm-genai");
    let model = build(
        dir.path(),
        "lm.onnx",
        "2",
        &["--with-past", "--genai-dir", path_str(&folder)],
    );
    let printed = run_in(dir.path(), &blocks[0]);
    let lines: Vec<&str> = printed.lines().collect();
    let prompt: Vec<String> = "Pay attention to".bytes().map(|b| b.to_string()).collect();
    // max_length 40 after a prompt of 16 bytes.
    let want = varied(generated(&model, &prompt.join(","), 24));
    assert_eq!(list(lines[0]), want, "genai's tokens are generate's");
    // The decoded text (its byte-level round trip is tests/suite/genai.rs's).
    assert_eq!(lines.len(), 2, "{printed}");
}
