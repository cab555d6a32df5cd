//! The command line: the main job, validation, and clean one-line errors with the
//! documented exit codes and no output file left behind.

mod common;

use common::{gmlp, small_vision_model};

use std::path::Path;
use std::process::{Command, Output};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit code `code`, a single-line error message containing `needle`, no panic.
fn assert_fails(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn build_then_validate_a_small_amlp() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a.onnx");
    let o = gmlp(&[
        "build",
        "--preset",
        "amlp-base",
        "--layers",
        "2",
        "--seq-len",
        "32",
        "--vocab-size",
        "300",
        "--init",
        "spread",
        "-o",
        out.to_str().unwrap(),
        "--validate",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("tract vs ort-cpu") && text.contains("PASS"),
        "{text}"
    );
    let o = gmlp(&["validate", out.to_str().unwrap(), "--batch", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("input_ids int64 [3, 32]"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn validate_writes_a_json_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.onnx");
    let report = dir.path().join("r.json");
    let o = gmlp(&[
        "build",
        "--preset",
        "gmlp-ti16",
        "--layers",
        "1",
        "--image-size",
        "32",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = gmlp(&[
        "validate",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["pass"], true);
    assert_eq!(json["pairs"][0]["reference"], "tract");
    assert_eq!(json["pairs"][0]["other"], "ort-cpu");
    assert_eq!(
        json["inputs"][0]["shape"],
        serde_json::json!([2, 3, 32, 32])
    );
}

#[test]
fn unknown_preset_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.onnx");
    let o = gmlp(&[
        "build",
        "--preset",
        "gmlp-huge",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_fails(&o, 2, "unknown preset 'gmlp-huge' (known: gmlp-ti16");
    assert!(is_empty_dir(dir.path()));
}

/// `build --preset PRESET FLAGS -o DIR/x.onnx` must fail with exit 2 and `needle`.
fn assert_build_refused(dir: &Path, preset: &str, flags: &[&str], needle: &str) {
    let out = dir.join("x.onnx");
    let mut args = vec!["build", "--preset", preset];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    assert_fails(&gmlp(&args), 2, needle);
    assert!(is_empty_dir(dir), "{preset} {flags:?} left a file");
}

#[test]
fn absurd_sizes_are_refused_before_allocation() {
    let dir = tempfile::tempdir().unwrap();
    for (preset, flags, needle) in [
        (
            "gmlp-base",
            &["--seq-len", "100000000"][..],
            "seq_len = 100000000 is out of range",
        ),
        ("gmlp-base", &["--d-model", "0"], "d_model = 0"),
        ("gmlp-base", &["--d-ffn", "3071"], "must be even"),
        (
            "gmlp-ti16",
            &["--image-size", "225"],
            "not a multiple of patch_size",
        ),
        // The Toeplitz index table must stay inline: 60000² int64 is refused with the size.
        (
            "gmlp-base",
            &["--seq-len", "60000"],
            "GiB of constants inside the graph",
        ),
        (
            "gmlp-xlarge",
            &["--d-model", "100000", "--d-ffn", "400000"],
            "GiB of weights",
        ),
        (
            "gmlp-xlarge",
            &["--d-model", "100000", "--d-ffn", "400000"],
            "over the 64 GiB limit",
        ),
    ] {
        assert_build_refused(dir.path(), preset, flags, needle);
    }
}

#[test]
fn flags_of_the_wrong_model_kind_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (preset, flags, needle) in [
        (
            "gmlp-base",
            &["--num-classes", "10"][..],
            "--num-classes applies to vision presets",
        ),
        (
            "gmlp-s16",
            &["--seq-len", "10"],
            "--seq-len applies to token presets",
        ),
        ("gmlp-s16", &["--opset", "16"], "opset 16 is not supported"),
        (
            "gmlp-s16",
            &["--shift-tokens", "1"],
            "--shift-tokens applies to --weights",
        ),
    ] {
        assert_build_refused(dir.path(), preset, flags, needle);
    }
}

#[test]
fn bad_output_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = gmlp(&[
        "build",
        "--preset",
        "gmlp-ti16",
        "--layers",
        "1",
        "-o",
        dir.path().to_str().unwrap(),
    ]);
    assert_fails(&o, 2, "is a directory");
    let missing = dir.path().join("no/such/dir/m.onnx");
    let o = gmlp(&[
        "build",
        "--preset",
        "gmlp-ti16",
        "--layers",
        "1",
        "-o",
        missing.to_str().unwrap(),
    ]);
    assert_fails(&o, 2, "does not exist");
    assert!(is_empty_dir(dir.path()));
}

#[test]
fn broken_model_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.onnx");
    assert_fails(
        &gmlp(&["validate", missing.to_str().unwrap()]),
        2,
        "missing.onnx",
    );
    let empty = dir.path().join("empty.onnx");
    std::fs::write(&empty, b"").unwrap();
    assert_fails(
        &gmlp(&["validate", empty.to_str().unwrap()]),
        2,
        "the file is empty",
    );
    let garbage = dir.path().join("garbage.onnx");
    std::fs::write(&garbage, [0xffu8; 64]).unwrap();
    assert_fails(
        &gmlp(&["validate", garbage.to_str().unwrap()]),
        2,
        "not a usable ONNX model",
    );
    // A truncated real model.
    let good = dir.path().join("good.onnx");
    let o = gmlp(&[
        "build",
        "--preset",
        "gmlp-ti16",
        "--layers",
        "1",
        "-o",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.onnx");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert_fails(
        &gmlp(&["validate", cut.to_str().unwrap()]),
        2,
        "not a usable ONNX model",
    );
}

#[test]
fn cuda_runtime_without_cuda_exits_3_naming_cuda() {
    let dir = tempfile::tempdir().unwrap();
    let out = small_vision_model(dir.path());
    let o = gmlp(&[
        "validate",
        out.to_str().unwrap(),
        "--runtimes",
        "tract,ort-cuda",
    ]);
    assert_fails(&o, 3, "ort-cuda is unavailable");
    assert!(
        stderr(&o).contains("CUDA execution provider"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn missing_onnxruntime_library_says_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = small_vision_model(dir.path());
    let o = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .args([
            "validate",
            out.to_str().unwrap(),
            "--runtimes",
            "tract,ort-cpu",
        ])
        .env("ORT_DYLIB_PATH", dir.path().join("nope.so"))
        .output()
        .unwrap();
    assert_fails(&o, 3, "pip install onnxruntime==1.31.1");
    let o = gmlp(&[
        "validate",
        out.to_str().unwrap(),
        "--runtimes",
        "tract,onnx",
    ]);
    assert_fails(&o, 2, "unknown runtime 'onnx'");
}

#[test]
fn presets_lists_every_preset() {
    let o = gmlp(&["presets"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for name in [
        "gmlp-ti16",
        "gmlp-s16",
        "gmlp-b16",
        "gmlp-base",
        "amlp-base",
        "gmlp-large",
        "amlp-large",
        "gmlp-xlarge",
    ] {
        assert!(text.contains(name), "{name} missing from {text}");
    }
}
