//! `--dtype int8`: the trained fixtures keep their accuracy / next-token predictions, tract
//! and ONNX Runtime agree on the int8 files, the file has the standard dynamic-quantization
//! form (checker-valid at every opset), and all-zero weights quantize without a NaN.
//!
//! Bounds, each against the f32 export of the same weights (measured values in docs/speed.md,
//! "int8": classifier accuracy unchanged, next-token top-1 agreement 99.0% to 100%, logits
//! error 7.4e-3 to 1.9e-2):
//! classifier test accuracy within 1.5 points, next-token top-1 agreement ≥ 97%,
//! max|int8 − f32| / max|f32| ≤ 5e-2; tract vs ONNX Runtime within `Tolerance::INT8`.

use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use gmlp_onnx::checkpoint::Import;
use gmlp_onnx::gmlp::export::export;
use gmlp_onnx::gmlp::{GmlpConfig, ParamSpec, Precision, SpatialForm, Task, WeightSource};
use gmlp_onnx::onnx::reader::read_model;
use gmlp_onnx::onnx::writer::write_model;
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::validate::Tolerance;

const MAX_REL_VS_F32: f64 = 5e-2;
const MIN_TOP1_AGREEMENT: f64 = 0.97;
const MAX_ACCURACY_DROP: f64 = 0.015;

fn write(cfg: &GmlpConfig, source: Arc<dyn WeightSource>, opset: i64, path: &Path) {
    let model = export(cfg, source, "test", None, opset).expect("export");
    write_model(&model.graph, &model.info, path, |_, _| {}).expect("write");
}

fn agreement(a: &[usize], b: &[usize]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

/// Builds the fixture in f32 and int8, runs both in tract and ONNX Runtime, checks the bounds.
fn check_fixture(name: &str) {
    let fx = Fixture::open(name);
    let (inputs, labels) = (fx.inputs(), fx.labels());
    let import = Import::open(&fx.checkpoint(), &fx.hints()).unwrap();
    let mut cfg = import.config.clone();
    let source: Arc<dyn WeightSource> = Arc::new(import.weights(&cfg));
    let dir = tempfile::tempdir().unwrap();
    let (f32_path, int8_path) = (dir.path().join("f32.onnx"), dir.path().join("int8.onnx"));
    write(&cfg, source.clone(), 17, &f32_path);
    cfg.dtype = Precision::Int8;
    write(&cfg, source, 17, &int8_path);
    let reference = f32_output(&run(RuntimeKind::OrtCpu, &f32_path, &inputs));
    let ref_top1 = argmax_rows(&reference);
    let mut outs = Vec::new();
    for kind in CPU_RUNTIMES {
        let out = f32_output(&run(kind, &int8_path, &inputs));
        let rel = rel_diff(&out, &reference);
        let agree = agreement(&argmax_rows(&out), &ref_top1);
        eprintln!(
            "{name}: int8 in {} vs f32: rel {rel:.2e}, top-1 agreement {agree:.3}",
            kind.name()
        );
        assert!(rel <= MAX_REL_VS_F32, "{name} {}: rel {rel:e}", kind.name());
        assert!(
            agree >= MIN_TOP1_AGREEMENT,
            "{name} {}: top-1 agreement {agree}",
            kind.name()
        );
        if let Some(labels) = &labels {
            let labels: Vec<usize> = labels.iter().map(|&l| l as usize).collect();
            let (acc8, acc32) = (
                agreement(&argmax_rows(&out), &labels),
                agreement(&ref_top1, &labels),
            );
            eprintln!("{name}: accuracy f32 {acc32:.4}, int8 {acc8:.4}");
            assert!(
                acc8 >= acc32 - MAX_ACCURACY_DROP,
                "{name} {}: accuracy {acc8} vs f32 {acc32}",
                kind.name()
            );
        }
        outs.push(out);
    }
    let between = rel_diff(&outs[0], &outs[1]);
    eprintln!("{name}: int8 tract vs ONNX Runtime: {between:.2e}");
    assert!(between <= Tolerance::INT8.rtol, "{name}: {between:e}");
}

#[test]
fn int8_timm_classifier_keeps_its_test_accuracy() {
    check_fixture("timm_gmlp_vision");
}

#[test]
fn int8_lucidrains_classifier_keeps_its_test_accuracy() {
    check_fixture("lucid_vision");
}

#[test]
fn int8_byte_language_models_keep_their_next_token_predictions() {
    for name in [
        "lucid_tokens",
        "lucid_amlp_causal",
        "lucid_heads2",
        "lucid_shift",
    ] {
        check_fixture(name);
    }
}

#[test]
fn int8_graphs_use_the_dynamic_form_pass_the_checker_and_track_f32() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    let mut untied = tiny_tokens(SpatialForm::Dense, None, false);
    if let Task::Tokens { tied_embedding, .. } = &mut untied.task {
        *tied_embedding = false;
    }
    let cases = [
        (tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true), 17),
        (untied, 9),
        (tiny_vision(SpatialForm::Dense), 8),
    ];
    for (k, (cfg, integer_matmuls)) in cases.into_iter().enumerate() {
        for opset in [17, 21] {
            let f32_path = write_config(&cfg, 3, opset, dir.path(), &format!("f{k}_{opset}.onnx"));
            let mut q = cfg.clone();
            q.dtype = Precision::Int8;
            let path = write_config(&q, 3, opset, dir.path(), &format!("q{k}_{opset}.onnx"));
            // Per block: two proj_in halves, the spatial MatMul, proj_out (+ q, k, v and
            // attention out); token models' vocabulary head.
            assert_eq!(
                op_count(&path, "MatMulInteger"),
                integer_matmuls,
                "case {k}"
            );
            assert_eq!(op_count(&path, "DynamicQuantizeLinear"), integer_matmuls);
            // The f32 graph has no Split (proj_in halves and q, k, v are weight slices).
            assert_eq!(op_count(&f32_path, "Split"), 0);
            // Causal token models take any length (`sequence`): run all n positions.
            let dims = [("sequence".to_string(), cfg.seq_len())];
            let inputs = gmlp_onnx::validate::make_inputs(
                &read_model(&path).unwrap(),
                2,
                &dims,
                opset as u64,
            )
            .unwrap();
            let reference = f32_output(&run(RuntimeKind::OrtCpu, &f32_path, &inputs));
            for kind in CPU_RUNTIMES {
                let out = f32_output(&run(kind, &path, &inputs));
                let rel = rel_diff(&out, &reference);
                eprintln!("case {k} opset {opset} {}: rel {rel:.2e}", kind.name());
                assert!(rel <= MAX_REL_VS_F32, "case {k} {}: {rel:e}", kind.name());
            }
            paths.push(path);
        }
    }
    onnx_check(&paths);
}

/// Spread init with some weights set to zero.
struct Zeroed(SeededInitSource);
type SeededInitSource = gmlp_onnx::gmlp::SeededInit;

impl WeightSource for Zeroed {
    fn values(&self, spec: &ParamSpec) -> gmlp_onnx::error::Result<Vec<f32>> {
        let mut v = self.0.values(spec)?;
        if spec.name == "blocks.0.proj_out.weight" {
            v.fill(0.0);
        }
        if spec.name == "blocks.1.proj_in.weight" {
            // Column 0 of [d, f] all zero.
            let cols = spec.shape[1];
            v.iter_mut().step_by(cols).for_each(|x| *x = 0.0);
        }
        Ok(v)
    }
}

#[test]
fn all_zero_weight_columns_get_scale_one_and_no_nan() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_tokens(SpatialForm::Dense, Some(8), false);
    let source: Arc<dyn WeightSource> = Arc::new(Zeroed(spread(5)));
    let f32_path = dir.path().join("f.onnx");
    write(&cfg, source.clone(), 17, &f32_path);
    cfg.dtype = Precision::Int8;
    let path = dir.path().join("q.onnx");
    write(&cfg, source, 17, &path);
    let model = read_model(&path).unwrap();
    let graph = model.graph.as_ref().unwrap();
    let floats = |name: &str| -> Vec<f32> {
        let t = graph
            .initializer
            .iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("no initializer {name}"));
        t.raw_data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let scale = floats("blocks.0.proj_out.weight.scale");
    assert!(scale.iter().all(|&s| s == 1.0), "{scale:?}");
    assert_eq!(floats("blocks.1.proj_in.weight.cols0_16.scale")[0], 1.0);
    for t in &graph.initializer {
        if t.data_type() == 1 {
            let v: Vec<f32> = t
                .raw_data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert!(v.iter().all(|x| x.is_finite()), "{}", t.name());
            if t.name().ends_with(".scale") {
                assert!(v.iter().all(|&x| x > 0.0), "{}", t.name());
            }
        }
    }
    let inputs = gmlp_onnx::validate::make_inputs(&model, 2, &[], 0).unwrap();
    let reference = f32_output(&run(RuntimeKind::OrtCpu, &f32_path, &inputs));
    for kind in CPU_RUNTIMES {
        let out = f32_output(&run(kind, &path, &inputs));
        assert!(out.iter().all(|x| x.is_finite()));
        assert!(rel_diff(&out, &reference) <= MAX_REL_VS_F32);
    }
}

#[test]
fn validate_uses_int8_tolerances_from_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.onnx");
    Build::amlp(2, Amlp::Short)
        .args(&["--dtype", "int8"])
        .write(&path);
    let r = validate_report(&path, &[]);
    assert_eq!(r["tolerance"]["rtol"], 0.1);
    assert_eq!(r["tolerance"]["atol"], 1e-3);
}
