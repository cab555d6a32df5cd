//! The consumer matrix (docs/model.md, "Where the files run"): every model of
//! tests/consumers/matrix.toml, built with `gmlp-onnx build`, runs in every downstream stack
//! that installs from the registries on a CPU machine (ONNX Runtime from Python, Rust and Node,
//! ONNX Runtime Web in headless Chromium on WebAssembly and on WebGPU with SwiftShader's
//! adapter, ONNX Runtime 1.14, tract, onnx.reference, OpenVINO,
//! OpenCV 4 and 5 dnn, candle-onnx) and agrees with ONNX Runtime (Python) to 1e-5 relative
//! (1e-2 for f16 files), except the cells matrix.toml lists as known failures, which must
//! still fail. tests/consumers/matrix.py does the work; the consumers are installed by
//! scripts/consumers_setup.sh (scripts/test runs it).
//!
//! Results: target/tmp/consumers/results.json and compatibility.md; with
//! GMLP_ONNX_UPDATE_DOCS=1 also docs/compatibility.md.

use std::process::Command;

#[test]
fn every_consumer_agrees_with_onnx_runtime_or_fails_as_recorded() {
    assert!(
        std::env::var_os("GMLP_CONSUMER_CANDLE").is_some(),
        "the consumers are not installed: run `scripts/test --test external consumers` \
         (it evals scripts/consumers_setup.sh)"
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("consumers");
    let mut cmd = Command::new(crate::common::python());
    cmd.arg(format!("{root}/tests/consumers/matrix.py"))
        .args(["--gmlp", env!("CARGO_BIN_EXE_gmlp-onnx"), "--out"])
        .arg(&out);
    if std::env::var("GMLP_ONNX_UPDATE_DOCS").as_deref() == Ok("1") {
        cmd.arg("--update-docs");
    }
    let o = cmd
        .output()
        .expect("run python (set GMLP_ONNX_PYTHON or run scripts/test)");
    let text = crate::common::output_text(&o);
    println!("{text}");
    assert!(o.status.success(), "consumer matrix:\n{text}");
    assert!(out.join("results.json").exists(), "no results.json written");
}
