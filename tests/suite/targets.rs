//! `--target` profiles: each profile's files for the representative models (vision, token
//! gather, causal aMLP, f16) pass the ONNX checker and strict
//! shape inference, carry the release table's IR version and the profile in their
//! metadata, avoid what the profile's consumers cannot read, and give today's outputs:
//! the independent f64 reference, tract and ONNX Runtime agree on each, and each agrees
//! with the default (`ort`) graph of the same weights.

use crate::common::*;

#[test]
fn cli_target_flags_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.onnx");
    let base = [
        "build",
        "--preset",
        "gmlp-base",
        "--layers",
        "1",
        "--seq-len",
        "8",
        "--vocab-size",
        "20",
        "-q",
        "-o",
    ];
    let build_with = |extra: &[&str]| {
        let mut args: Vec<&str> = base.to_vec();
        args.push(path_str(&out));
        args.extend_from_slice(extra);
        gmlp(&args)
    };
    // portable: opset 13, IR 7, Toeplitz expanded, no LayerNormalization; inspect names it.
    let o = build_with(&["--target", "portable"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(output_text(&o).contains("target portable, opset 13, spatial toeplitz-expand"));
    let json = inspect_json(&out);
    assert_eq!(json["target"], "portable");
    assert_eq!(json["ir_version"], 7);
    assert_eq!(json["opsets"][0]["version"], 13);
    assert_eq!(json["config"]["spatial"], "toeplitz-expand");
    assert!(json["ops"].get("LayerNormalization").is_none(), "{json}");
    // onnxruntime, and ort-gpu (its name before 0.9.0) for the same file: opset 24,
    // recorded under its new name.
    let o = build_with(&["--target", "onnxruntime"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(output_text(&o).contains("target onnxruntime, opset 24"));
    let json = inspect_json(&out);
    assert_eq!(json["target"], "onnxruntime");
    let new_name = std::fs::read(&out).unwrap();
    let o = build_with(&["--target", "ort-gpu"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        new_name,
        "ort-gpu is onnxruntime"
    );
    // Explicit --opset and --spatial win over the profile.
    let o = build_with(&[
        "--target",
        "portable",
        "--opset",
        "21",
        "--spatial",
        "dense",
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    let json = inspect_json(&out);
    assert_eq!(
        (
            json["ir_version"].as_i64(),
            json["opsets"][0]["version"].as_i64()
        ),
        (Some(10), Some(21))
    );
    assert_eq!(json["config"]["spatial"], "dense");
    // ort-legacy is ort at IR <= 8.
    let o = build_with(&["--target", "ort-legacy", "--opset", "18"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(inspect_json(&out)["ir_version"], 8);
    std::fs::remove_file(&out).unwrap();
    // Contradictions: one line, exit 2, no file.
    for (extra, needle) in [
        (
            &["--target", "ort-legacy", "--opset", "19"][..],
            "opset 19 needs IR 9",
        ),
        (
            &["--target", "opencv4", "--spatial", "toeplitz-gather"],
            "cannot import a Gather feeding a MatMul",
        ),
        (
            &["--target", "tflite"],
            "invalid value 'tflite' for '--target",
        ),
        (
            &["--opset", "12"],
            "opset 12 is not supported (supported: 13..=24)",
        ),
    ] {
        let o = build_with(extra);
        let text = output_text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {text}");
        assert!(text.contains(needle), "{extra:?}: {text}");
        assert_eq!(
            String::from_utf8_lossy(&o.stderr).lines().count(),
            1,
            "{text}"
        );
        assert!(!out.exists(), "{extra:?} left a file");
    }
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use clap::ValueEnum;
    use gmlp_onnx::gmlp::export::export_for;
    use gmlp_onnx::gmlp::metadata::TARGET_KEY;
    use gmlp_onnx::gmlp::reference::{forward_tokens, forward_vision};
    use gmlp_onnx::gmlp::targets::BuildTarget;
    use gmlp_onnx::gmlp::targets::Target;
    use gmlp_onnx::gmlp::{GmlpConfig, SequenceMode};
    use gmlp_onnx::gmlp::{Precision, SpatialForm, Task};
    use gmlp_onnx::onnx::reader::{metadata_value, read_model};
    use gmlp_onnx::onnx::versions::ir_version_for;
    use gmlp_onnx::onnx::writer::write_model;
    use gmlp_onnx::rng::SplitMix64;
    use gmlp_onnx::runtime::RuntimeKind;
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use ndarray::{Array2, Array4, ArrayD};
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// Builds `cfg` for `target` as the CLI does (the profile's spatial form, opset, forms).
    fn build(
        cfg: &GmlpConfig,
        target: &BuildTarget,
        dir: &Path,
        name: &str,
    ) -> (GmlpConfig, PathBuf) {
        let mut cfg = cfg.clone();
        cfg.spatial = target.target.spatial_for(cfg.spatial);
        target.check(cfg.spatial).unwrap();
        let model = export_for(
            &cfg,
            Arc::new(spread(7)),
            "test",
            None,
            target,
            SequenceMode::Fixed,
        )
        .unwrap();
        let path = dir.join(name);
        write_model(&model.graph, &model.info, &path, |_, _| {}).unwrap();
        (cfg, path)
    }

    /// Reference (f64) vs a runtime.
    const REFERENCE_RTOL: f64 = 1e-4;

    /// A profile's graph vs the default graph, and tract vs ONNX Runtime, f32.
    const SAME_MODEL_RTOL: f64 = 1e-5;

    /// f16 models against the f32 reference (docs/model.md: 1e-2 of max|logits|).
    const F16_RTOL: f64 = 1e-2;

    /// The representative models.
    fn models() -> Vec<(&'static str, GmlpConfig)> {
        let mut f16 = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
        f16.dtype = Precision::F16;
        vec![
            ("vision", tiny_vision(SpatialForm::Dense)),
            (
                "tokens-gather",
                tiny_tokens(SpatialForm::ToeplitzGather, None, false),
            ),
            (
                "causal-amlp",
                tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true),
            ),
            ("f16", f16),
        ]
    }

    fn inputs(cfg: &GmlpConfig) -> Vec<NamedTensor> {
        match cfg.task {
            Task::Tokens {
                vocab_size,
                seq_len,
                ..
            } => {
                let mut rng = SplitMix64::keyed(1, "ids");
                let ids =
                    Array2::from_shape_fn((2, seq_len), |_| rng.below(vocab_size as u64) as i64);
                vec![NamedTensor {
                    name: "input_ids".into(),
                    value: TensorValue::I64(ids.into_dyn()),
                }]
            }
            Task::Vision {
                image_size,
                in_chans,
                ..
            } => {
                let mut rng = SplitMix64::keyed(1, "pixels");
                let px = Array4::from_shape_fn((2, in_chans, image_size, image_size), |_| {
                    rng.uniform(-1.0, 1.0) as f32
                });
                vec![NamedTensor {
                    name: "pixel_values".into(),
                    value: TensorValue::F32(px.into_dyn()),
                }]
            }
            Task::Backbone { .. } => {
                panic!("the target profiles are tested on token and vision models")
            }
        }
    }

    fn reference(cfg: &GmlpConfig, feed: &[NamedTensor]) -> ArrayD<f32> {
        let mut f32_cfg = cfg.clone();
        f32_cfg.dtype = Precision::F32;
        match &feed[0].value {
            TensorValue::I64(ids) => {
                let ids = ids.clone().into_dimensionality().unwrap();
                forward_tokens(&f32_cfg, &spread(7), ids.view())
                    .unwrap()
                    .into_dyn()
            }
            TensorValue::F32(px) => {
                let px = px.clone().into_dimensionality().unwrap();
                forward_vision(&f32_cfg, &spread(7), px.view())
                    .unwrap()
                    .into_dyn()
            }
            other => panic!("unexpected input {other:?}"),
        }
    }

    /// What a profile's file must not contain, by operator type and by pattern.
    fn check_forms(target: Target, path: &Path) {
        let model = read_model(path).unwrap();
        let graph = model.graph.as_ref().unwrap();
        let ops: Vec<&str> = graph.node.iter().map(|n| n.op_type()).collect();
        let what = format!("{} {}", target.name(), path.display());
        if matches!(target, Target::Portable | Target::Candle) {
            assert!(!ops.contains(&"LayerNormalization"), "{what}: {ops:?}");
            // candle-onnx silently misreads ReduceMean's opset-18 axes input.
            assert!(!ops.contains(&"ReduceMean"), "{what}: {ops:?}");
        }
        if matches!(target, Target::Portable | Target::Opencv4) {
            // OpenCV 4.x cannot import a Gather feeding a MatMul.
            let gathered: Vec<&str> = graph
                .node
                .iter()
                .filter(|n| n.op_type() == "Gather")
                .flat_map(|n| n.output.iter().map(String::as_str))
                .collect();
            assert!(
                !graph.node.iter().any(|n| n.op_type() == "MatMul"
                    && n.input.iter().any(|i| gathered.contains(&i.as_str()))),
                "{what}: a Gather feeds a MatMul"
            );
        }
        if target == Target::Ort {
            assert!(ops.contains(&"LayerNormalization"), "{what}: {ops:?}");
        }
    }

    #[test]
    fn every_target_runs_each_model_with_todays_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for (kind, cfg) in models() {
            let feed = inputs(&cfg);
            let reference = reference(&cfg, &feed);
            let (_, default_path) = build(
                &cfg,
                &BuildTarget::resolve(Target::Ort, None).unwrap(),
                dir.path(),
                &format!("{kind}_default.onnx"),
            );
            let today = f32_output(&run(RuntimeKind::OrtCpu, &default_path, &feed));
            for &target in Target::value_variants() {
                let b = BuildTarget::resolve(target, None).unwrap();
                let (built, path) = build(
                    &cfg,
                    &b,
                    dir.path(),
                    &format!("{kind}_{}.onnx", target.name()),
                );
                let model = read_model(&path).unwrap();
                assert_eq!(model.opset_import[0].version(), b.opset);
                assert_eq!(model.ir_version(), ir_version_for(b.opset));
                assert_eq!(
                    metadata_value(&model, TARGET_KEY),
                    Some(target.name().as_str())
                );
                let stored = gmlp_onnx::validate::stored_config(&model).unwrap();
                assert_eq!(stored, built);
                check_forms(target, &path);
                let tract = f32_output(&run(RuntimeKind::Tract, &path, &feed));
                let ort = f32_output(&run(RuntimeKind::OrtCpu, &path, &feed));
                let (rt, ro, tr, od) = (
                    rel_diff(&tract, &reference),
                    rel_diff(&ort, &reference),
                    rel_diff(&tract, &ort),
                    rel_diff(&ort, &today),
                );
                eprintln!(
                    "{kind} --target {} (opset {}): tract/ref {rt:.1e}, ort/ref {ro:.1e}, tract/ort {tr:.1e}, ort/default graph {od:.1e}",
                    target.name(),
                    b.opset
                );
                if cfg.dtype == Precision::F16 {
                    assert!(
                        rt <= F16_RTOL && ro <= F16_RTOL,
                        "{kind} {}: {rt:e} {ro:e}",
                        target.name()
                    );
                    assert!(od <= F16_RTOL, "{kind} {}: {od:e}", target.name());
                } else {
                    assert!(
                        rt <= REFERENCE_RTOL,
                        "{kind} {} tract vs reference: {rt:e}",
                        target.name()
                    );
                    assert!(
                        ro <= REFERENCE_RTOL,
                        "{kind} {} ort vs reference: {ro:e}",
                        target.name()
                    );
                    assert!(
                        tr <= SAME_MODEL_RTOL,
                        "{kind} {} tract vs ort: {tr:e}",
                        target.name()
                    );
                    assert!(
                        od <= SAME_MODEL_RTOL,
                        "{kind} {} vs the default graph: {od:e}",
                        target.name()
                    );
                }
                paths.push(path);
            }
        }
        onnx_check(&paths);
    }

    #[test]
    fn explicit_opsets_override_the_profile_and_keep_its_forms() {
        // portable's primitive LayerNorm at every opset: the sum-then-divide means read the
        // same at 13 and 21 (ReduceSum has had its axes as an input since 13).
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny_vision(SpatialForm::Dense);
        let feed = inputs(&cfg);
        let reference = reference(&cfg, &feed);
        let mut paths = Vec::new();
        for opset in 13..=24 {
            let b = BuildTarget::resolve(Target::Portable, Some(opset)).unwrap();
            let (_, path) = build(&cfg, &b, dir.path(), &format!("portable_{opset}.onnx"));
            check_forms(Target::Portable, &path);
            for kind in CPU_RUNTIMES {
                let out = f32_output(&run(kind, &path, &feed));
                let d = rel_diff(&out, &reference);
                assert!(
                    d <= REFERENCE_RTOL,
                    "opset {opset} in {}: {d:e}",
                    kind.name()
                );
            }
            paths.push(path);
        }
        onnx_check(&paths);
    }

    #[test]
    fn trained_fixtures_reproduce_pytorch_for_every_target() {
        use gmlp_onnx::checkpoint::Import;
        let dir = tempfile::tempdir().unwrap();
        for name in ["timm_gmlp_vision", "lucid_tokens_causal", "lucid_amlp"] {
            let fx = Fixture::open(name);
            let (feed, pytorch) = (fx.inputs(), fx.logits());
            let import = Import::open(&fx.checkpoint(), &fx.hints()).unwrap();
            for &target in Target::value_variants() {
                let mut cfg = import.config.clone();
                cfg.spatial = target.spatial_for(cfg.spatial);
                let b = BuildTarget::resolve(target, None).unwrap();
                let model = export_for(
                    &cfg,
                    Arc::new(import.weights(&cfg)),
                    "t",
                    None,
                    &b,
                    SequenceMode::Fixed,
                )
                .unwrap();
                let path = dir.path().join(format!("{name}_{}.onnx", target.name()));
                write_model(&model.graph, &model.info, &path, |_, _| {}).unwrap();
                for kind in CPU_RUNTIMES {
                    let out = f32_output(&run(kind, &path, &feed));
                    let d = rel_diff(&out, &pytorch);
                    assert!(
                        d <= PYTORCH_RTOL,
                        "{name} --target {} in {}: {d:e}",
                        target.name(),
                        kind.name()
                    );
                }
            }
        }
    }
}
