//! Command-line values that are malformed, out of range, or would make an absurd model:
//! one-line error, exit 2, nothing written, nothing allocated past the size estimate.

use std::path::Path;

use super::{assert_refused, s};

/// `build --preset PRESET FLAGS -o DIR/x.onnx` is refused with `needle`.
fn refuse_build(dir: &Path, preset: &str, flags: &[&str], needle: &str) {
    let out = dir.join("x.onnx");
    let mut args = vec!["build", "--preset", preset];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["-o", s(&out)]);
    assert_refused(dir, &args, 2, needle);
}

#[test]
fn unknown_presets_and_malformed_numbers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    refuse_build(
        d,
        "gmlp-huge",
        &[],
        "unknown preset 'gmlp-huge' (known: gmlp-ti16",
    );
    for (flags, needle) in [
        (
            &["--d-model", "abc"][..],
            "invalid value 'abc' for '--d-model",
        ),
        (&["--d-model", "-5"], "unexpected argument '-5'"),
        (&["--d-model=-5"], "invalid value '-5' for '--d-model"),
        (&["--layers", "1e3"], "invalid value '1e3' for '--layers"),
        (&["--layers", "99999999999999999999999"], "number too large"),
        (&["--seed", "-1"], "unexpected argument '-1'"),
        (&["--seed=-1"], "invalid value '-1' for '--seed"),
        (&["--opset", "99"], "opset 99 is not supported"),
        (
            &["--toeplitz-tol", "0.1"],
            "--toeplitz-tol applies to --weights",
        ),
        (&["--allow-unused"], "--allow-unused applies to --weights"),
        (
            &["--weights-format", "timm"],
            "--weights-format applies to --weights",
        ),
        (&["--dtype", "f8"], "invalid value 'f8' for '--dtype"),
        (&["--no-such-flag"], "unexpected argument '--no-such-flag'"),
    ] {
        refuse_build(d, "amlp-base", flags, needle);
    }
}

#[test]
fn absurd_sizes_are_refused_before_allocation_with_the_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (preset, flags, needle) in [
        (
            "gmlp-base",
            &["--seq-len", "100000000"][..],
            "seq_len = 100000000 is out of range",
        ),
        ("gmlp-base", &["--d-model", "0"], "d_model = 0"),
        ("gmlp-base", &["--layers", "0"], "layers = 0"),
        ("gmlp-base", &["--vocab-size", "0"], "vocab_size = 0"),
        ("gmlp-base", &["--d-ffn", "3071"], "must be even"),
        ("gmlp-ti16", &["--num-classes", "0"], "num_classes = 0"),
        ("gmlp-ti16", &["--patch-size", "0"], "patch_size = 0"),
        ("gmlp-ti16", &["--image-size", "225"], "not a multiple of patch_size"),
        // The Toeplitz index table must stay inline: 60000² int64 is refused with its size.
        (
            "gmlp-base",
            &["--seq-len", "60000", "--spatial", "toeplitz-gather"],
            "GiB of constants inside the graph",
        ),
        (
            "gmlp-xlarge",
            &["--d-model", "100000", "--d-ffn", "400000"],
            "the model would hold 32199.0 GiB of weights (8643359M parameters), over the 64 GiB limit",
        ),
        ("gmlp-xlarge", &["--layers", "4000000000"], "layers = 4000000000 is out of range"),
    ] {
        refuse_build(d, preset, flags, needle);
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
        ("gmlp-s16", &["--opset", "12"], "opset 12 is not supported"),
        (
            "gmlp-s16",
            &["--shift-tokens", "1"],
            "--shift-tokens applies to --weights",
        ),
        (
            "gmlp-s16",
            &["--gate-act", "tanh"],
            "--gate-act applies to --weights",
        ),
    ] {
        refuse_build(dir.path(), preset, flags, needle);
    }
}

#[test]
fn malformed_validate_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = crate::common::small_vision_model(d);
    let m = s(&model);
    for (flags, needle) in [
        (
            &["--rtol", "nan"][..],
            "--rtol must be a finite number >= 0",
        ),
        (&["--rtol=-1"], "--rtol must be a finite number >= 0"),
        (&["--rtol", "-1"], "unexpected argument '-1'"),
        (&["--atol", "inf"], "--atol must be a finite number >= 0"),
        (&["--batch", "0"], "--batch must be at least 1"),
        (&["--dim", "n"], "expected NAME=N"),
        (&["--dim", "n=abc"], "'abc' is not a size"),
        (&["--dim", "=4"], "expected NAME=N with N >= 1"),
        (
            &["--runtimes", "tract,nonsense"],
            "invalid value 'nonsense' for '--runtimes <RUNTIMES>' [possible values: tract, ort-cpu, ort-cuda]",
        ),
        (
            &["--runtimes", ""],
            "a value is required for '--runtimes <RUNTIMES>'",
        ),
        (&["--bench=-3"], "invalid value '-3' for '--bench"),
        (
            &["--bench", "1000000000"],
            "--bench 1000000000 is more than 10000 runs",
        ),
        (&["--seed", "x"], "invalid value 'x' for '--seed"),
    ] {
        let mut args = vec!["validate", m];
        args.extend_from_slice(flags);
        assert_refused(d, &args, 2, needle);
    }
}

/// The backstop for bugs: a panic anywhere still ends in one line asking for a report and
/// a non-zero exit (101). The binary panics on purpose when GMLP_ONNX_DEBUG_PANIC is set.
#[test]
fn a_panic_exits_101_with_one_line_asking_for_a_report() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .args(["presets"])
        .env("GMLP_ONNX_DEBUG_PANIC", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(101), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("gmlp-onnx: internal error: ")
            && err.contains("GMLP_ONNX_DEBUG_PANIC is set")
            && err.contains("this is a bug, please report it"),
        "{err}"
    );
}
