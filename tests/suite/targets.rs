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
    use gmlp_onnx::gmlp::{fused_gap, GmlpConfig, SequenceMode};
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
        // A vision stem: tract's patches cut out and one MatMul, everyone else's Conv.
        let stem: Vec<&str> = graph
            .node
            .iter()
            .filter(|n| n.name().starts_with("stem/"))
            .map(|n| n.op_type())
            .collect();
        if !stem.is_empty() {
            let tract = target == Target::Tract;
            assert_eq!(stem.contains(&"Conv"), !tract, "{what}: {stem:?}");
            assert_eq!(stem.contains(&"MatMul"), tract, "{what}: {stem:?}");
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
                // onnxruntime refuses what its fused kernels cannot express (f16 here),
                // naming it, instead of writing standard operators under its name.
                let gap = fused_gap(&cfg, SequenceMode::Fixed, b.opset);
                if let (Target::OnnxRuntime, Some(gap)) = (target, &gap) {
                    let source = Arc::new(spread(7));
                    let refused = export_for(&cfg, source, "test", None, &b, SequenceMode::Fixed);
                    let message = refused.err().expect("refused").to_string();
                    assert!(message.contains(gap.as_str()), "{kind}: {message}");
                    eprintln!("{kind} --target onnxruntime refused: {message}");
                    continue;
                }
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
                let ort = f32_output(&run(RuntimeKind::OrtCpu, &path, &feed));
                // tract cannot read ONNX Runtime's fused kernels: ONNX Runtime alone there.
                let tract = (target != Target::OnnxRuntime)
                    .then(|| f32_output(&run(RuntimeKind::Tract, &path, &feed)));
                let (ro, od) = (rel_diff(&ort, &reference), rel_diff(&ort, &today));
                let tract_diffs = tract
                    .as_ref()
                    .map(|t| (rel_diff(t, &reference), rel_diff(t, &ort)));
                let tract_line = match tract_diffs {
                    Some((rt, tr)) => format!("tract/ref {rt:.1e}, tract/ort {tr:.1e}"),
                    None => "tract cannot read it".into(),
                };
                eprintln!(
                    "{kind} --target {} (opset {}): ort/ref {ro:.1e}, ort/default graph {od:.1e}, {tract_line}",
                    target.name(),
                    b.opset
                );
                let (reference_rtol, same_rtol) = match cfg.dtype {
                    Precision::F16 => (F16_RTOL, F16_RTOL),
                    _ => (REFERENCE_RTOL, SAME_MODEL_RTOL),
                };
                assert!(
                    ro <= reference_rtol,
                    "{kind} {} ort vs reference: {ro:e}",
                    target.name()
                );
                assert!(
                    od <= same_rtol,
                    "{kind} {} vs the default graph: {od:e}",
                    target.name()
                );
                if let Some((rt, tr)) = tract_diffs {
                    assert!(
                        rt <= reference_rtol,
                        "{kind} {} tract vs reference: {rt:e}",
                        target.name()
                    );
                    // f16: each runtime within its tolerance of the reference is the check.
                    if cfg.dtype != Precision::F16 {
                        assert!(
                            tr <= SAME_MODEL_RTOL,
                            "{kind} {} tract vs ort: {tr:e}",
                            target.name()
                        );
                    }
                }
                paths.push(path);
            }
        }
        onnx_check(&paths);
    }

    /// ‖a − b‖ / ‖b‖ over all elements.
    fn normwise(a: &ArrayD<f32>, b: &ArrayD<f32>) -> f64 {
        assert_eq!(a.shape(), b.shape(), "shapes differ");
        let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (d / n).sqrt()
    }

    /// `--target onnxruntime`, ONNX Runtime's fused kernels in every sequence mode, equals
    /// the default file on every trained fixture its kernels express, in ONNX Runtime: the
    /// fixture's own inputs through the whole forward within 1e-5 (normwise relative; the
    /// fixed length, and for causal fixtures any length), and for causal fixtures the
    /// growing state's greedy tokens (a quarter of the ids as prompts, 8 new tokens) equal
    /// with the prefill logits within 1e-5 (the static step: static_state.rs). Every other
    /// fixture is refused, naming what the kernels do not cover, with nothing written.
    #[test]
    fn the_onnxruntime_target_equals_the_default_file_in_every_mode_on_every_fixture() {
        use gmlp_onnx::generation::Decoder;
        let dir = tempfile::tempdir().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("meta.json").exists())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let (mut compared, mut refused) = (Vec::new(), Vec::new());
        for name in &names {
            let fx = Fixture::open(name);
            let flags = fx.flags();
            let input = fx.meta["input_name"].as_str().unwrap().to_string();
            let causal_tokens = flags.iter().any(|f| f == "--causal") && input == "input_ids";
            let modes: &[(&str, &[&str])] = if causal_tokens {
                &[
                    ("fixed", &["--fixed-seq"]),
                    ("any-length", &[]),
                    ("growing", &["--with-past", "growing"]),
                ]
            } else {
                &[("fixed", &[])]
            };
            for &(mode, extra) in modes {
                let what = format!("{name} {mode}");
                let plain = dir.path().join(format!("{name}-{mode}.onnx"));
                let fused = dir.path().join(format!("{name}-{mode}-onnxruntime.onnx"));
                fx.build("model.safetensors", extra, &plain);
                let o = Build::weights(&fx.checkpoint())
                    .args(&flags.iter().map(String::as_str).collect::<Vec<_>>())
                    .args(extra)
                    .args(&["-q", "--target", "onnxruntime"])
                    .run(&fused);
                if !o.status.success() {
                    let text = output_text(&o);
                    assert!(
                        text.contains(
                            "onnxruntime writes ONNX Runtime's fused kernels, which do not cover"
                        ),
                        "{what}: {text}"
                    );
                    assert!(!fused.exists(), "{what}: a refused build wrote a file");
                    refused.push(what);
                    continue;
                }
                let d = if mode == "growing" {
                    let ids = fx.ids("input_ids");
                    let prompts: Vec<Vec<i64>> = ids
                        .rows()
                        .into_iter()
                        .map(|r| r.iter().take(ids.ncols() / 4).copied().collect())
                        .collect();
                    let greedy_of = |path: &Path| {
                        let decoder =
                            Decoder::open(RuntimeKind::OrtCpu, path, &options(), prompts.len())
                                .unwrap();
                        crate::common::decoding::greedy(decoder, &prompts, 8)
                    };
                    let (want, want_logits, _) = greedy_of(&plain);
                    let (tokens, logits, _) = greedy_of(&fused);
                    assert_eq!(tokens, want, "{what}: tokens");
                    normwise(
                        &logits[0].clone().into_dyn(),
                        &want_logits[0].clone().into_dyn(),
                    )
                } else {
                    let feed = vec![NamedTensor {
                        name: input.clone(),
                        value: fx.tensor(&input),
                    }];
                    let want = f32_output(&run(RuntimeKind::OrtCpu, &plain, &feed));
                    let got = f32_output(&run(RuntimeKind::OrtCpu, &fused, &feed));
                    normwise(&got, &want)
                };
                eprintln!("{what}: onnxruntime vs the default file {d:.2e}");
                assert!(d <= SAME_MODEL_RTOL, "{what}: {d:.2e}");
                compared.push(what);
            }
        }
        eprintln!("compared {compared:?}; refused {refused:?}");
        // Every layout's fixtures that the kernels express are compared: g-mlp-pytorch's
        // tokens, aMLP, heads, token shift and vision, timm's vision, g-mlp-gpt's models;
        // gmlp-tinygrad's RMSNorm, g-mlp-gpt's reversible, windowed and folded ones refused.
        for must in [
            "lucid_amlp_causal growing",
            "timm_gmlp_vision fixed",
            "gpt_heads2_attn fixed",
        ] {
            assert!(compared.iter().any(|c| c == must), "{must} not compared");
        }
        for must in ["tiny_gmlp fixed", "gpt_reversible fixed"] {
            assert!(refused.iter().any(|r| r == must), "{must} not refused");
        }
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
