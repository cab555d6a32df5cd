//! The command line: the main job, validation, and clean one-line errors with the
//! documented exit codes and no output file left behind.

use crate::common::{assert_fails, gmlp, small_vision_model};

use std::process::{Command, Output};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
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
    assert_fails(&o, 3, &["pip install onnxruntime==1.31.1"]);
    let o = gmlp(&[
        "validate",
        out.to_str().unwrap(),
        "--runtimes",
        "tract,onnx",
    ]);
    assert_fails(
        &o,
        2,
        &["invalid value 'onnx' for '--runtimes <RUNTIMES>' [possible values: tract, ort-cpu, ort-cuda]"],
    );
}

/// The paper's models, in the order `presets` lists them.
const PRESETS: [&str; 8] = [
    "gmlp-ti16",
    "gmlp-s16",
    "gmlp-b16",
    "gmlp-base",
    "amlp-base",
    "gmlp-large",
    "amlp-large",
    "gmlp-xlarge",
];

/// `presets --json`, parsed.
fn presets_json() -> Vec<serde_json::Value> {
    let o = gmlp(&["presets", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn presets_lists_every_preset() {
    let names: Vec<String> = presets_json()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, PRESETS);
}

/// The text form of `presets` (the one test of it; the other reads `--json`): a header, one
/// row per preset in the JSON's order with its layers, widths, spatial form and parameter
/// count, and the line that says how FLOPs are counted.
#[test]
fn presets_text_shows_a_row_per_preset() {
    let o = gmlp(&["presets"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    let presets = presets_json();
    assert_eq!(lines.len(), presets.len() + 2, "{text}");
    assert!(lines[0].starts_with("preset "), "{text}");
    assert!(
        lines[lines.len() - 1].starts_with("FLOPs: 2 per multiply-add"),
        "{text}"
    );
    for (row, p) in lines[1..].iter().zip(&presets) {
        let c = &p["config"];
        let attn = c["attn_dim"]
            .as_u64()
            .map_or("-".to_string(), |a| a.to_string());
        let params_m = format!("{:.2}", p["params"].as_f64().unwrap() / 1e6);
        let want = [
            p["name"].as_str().unwrap(),
            &c["layers"].to_string(),
            &c["d_model"].to_string(),
            &c["d_ffn"].to_string(),
            &attn,
            c["spatial"].as_str().unwrap(),
            &params_m,
        ];
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[..want.len()], want, "{row}");
    }
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use crate::common::{validate_report, Amlp, Build};

    #[test]
    fn build_then_validate_a_small_amlp() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a.onnx");
        let o = Build::amlp(2, Amlp::Short)
            .args(&["--init", "spread", "--validate", "--quiet"])
            .run(&out);
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        let text = stdout(&o);
        assert!(
            text.contains("tract vs ort-cpu") && text.contains("PASS"),
            "{text}"
        );
        let json = validate_report(&out, &["--batch", "3"]);
        assert_eq!(
            json["inputs"],
            serde_json::json!([{"name": "input_ids", "shape": [3, 32], "dtype": "int64"}])
        );
    }

    #[test]
    fn validate_writes_a_json_report() {
        let dir = tempfile::tempdir().unwrap();
        let out = small_vision_model(dir.path());
        let json = validate_report(&out, &[]);
        assert_eq!(json["pass"], true);
        assert_eq!(json["pairs"][0]["reference"], "tract");
        assert_eq!(json["pairs"][0]["other"], "ort-cpu");
        assert_eq!(
            json["inputs"][0]["shape"],
            serde_json::json!([2, 3, 32, 32])
        );
    }

    /// Precondition, checked: the ONNX Runtime the tests load (scripts/test: PyPI's CPU
    /// `onnxruntime` wheel) has no CUDA execution provider beside it, so registering CUDA must
    /// fail. With onnxruntime-gpu on a GPU machine this test does not apply.
    #[test]
    fn cuda_runtime_without_cuda_exits_3_naming_cuda() {
        let library = gmlp_onnx::runtime::onnxruntime::find_library(
            None,
            gmlp_onnx::runtime::RuntimeKind::OrtCpu,
        )
        .expect("the ONNX Runtime library (run scripts/test)");
        let capi = library.parent().unwrap();
        assert!(
            !capi.join("libonnxruntime_providers_cuda.so").exists(),
            "{} ships the CUDA execution provider: this test needs the CPU-only onnxruntime wheel",
            library.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let out = small_vision_model(dir.path());
        let o = gmlp(&[
            "validate",
            out.to_str().unwrap(),
            "--runtimes",
            "tract,ort-cuda",
        ]);
        assert_fails(&o, 3, &["ort-cuda is unavailable"]);
        assert!(
            stderr(&o).contains("CUDA execution provider"),
            "{}",
            stderr(&o)
        );
    }
}
