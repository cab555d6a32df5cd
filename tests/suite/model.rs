//! Whole models on small configs: the independent f64 reference, tract and ONNX Runtime
//! must agree; spatial forms, causality, aMLP, both heads, batch symbol, determinism,
//! parameter counts read back from the files.
//!
//! Longer than ~500 lines: every spatial form, opset and model kind checked against the
//! f64 reference with the same few helpers.

use std::sync::Arc;

use crate::common::*;
use gmlp_onnx::gmlp::export::{counts, export};
use gmlp_onnx::gmlp::{param_specs, SpatialForm};
use gmlp_onnx::onnx::reader::{read_model, stored_f32_count};
use gmlp_onnx::onnx::writer::encode_model_to_vec;

#[test]
fn builds_are_byte_for_byte_deterministic() {
    let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
    let bytes = |seed| {
        let m = export(&cfg, Arc::new(spread(seed)), "test", None, 17).unwrap();
        encode_model_to_vec(&m.graph, &m.info).unwrap()
    };
    assert_eq!(bytes(1), bytes(1));
    assert_ne!(bytes(1), bytes(2));
}

#[test]
fn parameter_counts_read_from_files_match_the_graph_and_the_specs() {
    let dir = tempfile::tempdir().unwrap();
    for (k, cfg) in [
        tiny_tokens(SpatialForm::ToeplitzGather, Some(8), false),
        tiny_tokens(SpatialForm::ToeplitzExpand, None, true),
        tiny_tokens(SpatialForm::Dense, None, false),
        tiny_vision(SpatialForm::Dense),
    ]
    .iter()
    .enumerate()
    {
        let m = export(cfg, Arc::new(spread(0)), "test", None, 17).unwrap();
        let path = write_config(cfg, 0, 17, dir.path(), &format!("p{k}.onnx"));
        let from_file = stored_f32_count(&read_model(&path).unwrap());
        let from_graph = counts(&m.graph).stored_params;
        assert_eq!(from_file, from_graph);
        assert_eq!(u128::from(from_file), cfg.stored_f32_estimate());
        let logical: usize = param_specs(cfg).iter().map(|s| s.len()).sum();
        let n = cfg.seq_len() as u64;
        let expected = match cfg.spatial {
            // Expanded Toeplitz stores n² per layer for 2n−1 parameters.
            SpatialForm::ToeplitzExpand => {
                logical as u64 + cfg.layers as u64 * (n * n - (2 * n - 1))
            }
            _ => logical as u64,
        };
        assert_eq!(from_file, expected);
    }
}

#[test]
fn node_names_are_by_place_and_metadata_holds_the_config() {
    let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), false);
    let dir = tempfile::tempdir().unwrap();
    let model = read_model(&write_config(&cfg, 0, 17, dir.path(), "n.onnx")).unwrap();
    let graph = model.graph.as_ref().unwrap();
    let names: Vec<&str> = graph.node.iter().map(|n| n.name()).collect();
    for expected in [
        "blocks.0/norm",
        "blocks.0/proj_in_z1",
        "blocks.1/sgu/spatial_matmul",
        "blocks.1/sgu/spatial_weight_gather",
        "blocks.0/attn/softmax",
        "head/vocab_projection",
    ] {
        assert!(names.contains(&expected), "no node {expected} in {names:?}");
    }
    let stored = gmlp_onnx::validate::stored_config(&model).expect("config in metadata");
    assert_eq!(stored, cfg);
    assert_eq!(model.ir_version(), 8);
    let opset = &model.opset_import[0];
    assert_eq!((opset.domain(), opset.version()), ("", 17));
}

#[test]
fn a_failed_write_leaves_neither_file() {
    use gmlp_onnx::gmlp::weights::ParamSpec;
    use gmlp_onnx::onnx::writer::{write_model_with, ExternalData};
    /// Weights that turn out not to be finite halfway through the write.
    struct Poisoned;
    impl gmlp_onnx::gmlp::WeightSource for Poisoned {
        fn values(&self, spec: &ParamSpec) -> gmlp_onnx::Result<Vec<f32>> {
            let fill = if spec.name.starts_with("blocks.1.") {
                f32::INFINITY
            } else {
                0.5
            };
            Ok(vec![fill; spec.len()])
        }
    }
    let cfg = tiny_tokens(SpatialForm::Dense, None, false);
    let dir = tempfile::tempdir().unwrap();
    let m = export(&cfg, Arc::new(Poisoned), "test", None, 17).unwrap();
    for layout in [ExternalData::Auto, ExternalData::Always] {
        let err = write_model_with(
            &m.graph,
            &m.info,
            &dir.path().join("p.onnx"),
            layout,
            |_, _| {},
        )
        .unwrap_err();
        assert!(matches!(err, gmlp_onnx::Error::NotFinite(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "blocks.1.norm.weight: value inf at flat index 0 is not finite"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use gmlp_onnx::gmlp::reference::{forward_backbone, forward_tokens, forward_vision};
    use gmlp_onnx::gmlp::{GmlpConfig, Task};
    use gmlp_onnx::onnx::versions::ir_version_for;
    use gmlp_onnx::rng::SplitMix64;
    use gmlp_onnx::runtime::RuntimeKind;
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use ndarray::{Array2, Array3, Array4, ArrayD};

    /// Reference vs runtimes: the f64 reference is exact up to f32 rounding of the runtimes.
    const REFERENCE_RTOL: f64 = 1e-4;

    /// tract vs ONNX Runtime on the same file.
    const RUNTIME_RTOL: f64 = 1e-5;

    fn token_ids(cfg: &GmlpConfig, batch: usize, seed: u64) -> Array2<i64> {
        let Task::Tokens {
            vocab_size,
            seq_len,
            ..
        } = cfg.task
        else {
            panic!("token model")
        };
        let mut rng = SplitMix64::keyed(seed, "ids");
        Array2::from_shape_fn((batch, seq_len), |_| rng.below(vocab_size as u64) as i64)
    }

    fn pixels(cfg: &GmlpConfig, batch: usize, seed: u64) -> Array4<f32> {
        let Task::Vision {
            image_size,
            in_chans,
            ..
        } = cfg.task
        else {
            panic!("vision model")
        };
        let mut rng = SplitMix64::keyed(seed, "pixels");
        Array4::from_shape_fn((batch, in_chans, image_size, image_size), |_| {
            rng.uniform(-1.0, 1.0) as f32
        })
    }

    fn embeds(cfg: &GmlpConfig, batch: usize, seed: u64) -> Array3<f32> {
        let Task::Backbone { seq_len } = cfg.task else {
            panic!("backbone")
        };
        let mut rng = SplitMix64::keyed(seed, "embeds");
        Array3::from_shape_fn((batch, seq_len, cfg.d_model), |_| {
            rng.uniform(-1.0, 1.0) as f32
        })
    }

    /// Builds `cfg`, runs it in the reference, tract and ONNX Runtime, checks agreement, and
    /// returns the ONNX Runtime output.
    fn three_way(cfg: &GmlpConfig, opset: i64, batch: usize) -> ArrayD<f32> {
        let dir = tempfile::tempdir().unwrap();
        let path = write_config(cfg, 7, opset, dir.path(), "m.onnx");
        let (inputs, reference) = match cfg.task {
            Task::Tokens { .. } => {
                let ids = token_ids(cfg, batch, 1);
                let r = forward_tokens(cfg, &spread(7), ids.view())
                    .unwrap()
                    .into_dyn();
                (
                    vec![NamedTensor {
                        name: "input_ids".into(),
                        value: TensorValue::I64(ids.into_dyn()),
                    }],
                    r,
                )
            }
            Task::Vision { .. } => {
                let px = pixels(cfg, batch, 1);
                let r = forward_vision(cfg, &spread(7), px.view())
                    .unwrap()
                    .into_dyn();
                (
                    vec![NamedTensor {
                        name: "pixel_values".into(),
                        value: TensorValue::F32(px.into_dyn()),
                    }],
                    r,
                )
            }
            Task::Backbone { .. } => {
                let x = embeds(cfg, batch, 1);
                let r = forward_backbone(cfg, &spread(7), x.view())
                    .unwrap()
                    .into_dyn();
                (
                    vec![NamedTensor {
                        name: "inputs_embeds".into(),
                        value: TensorValue::F32(x.into_dyn()),
                    }],
                    r,
                )
            }
        };
        let tract = f32_output(&run(RuntimeKind::Tract, &path, &inputs));
        let ort = f32_output(&run(RuntimeKind::OrtCpu, &path, &inputs));
        let (rt, ro, tr) = (
            rel_diff(&tract, &reference),
            rel_diff(&ort, &reference),
            rel_diff(&tract, &ort),
        );
        assert!(rt <= REFERENCE_RTOL, "tract vs reference: {rt:e}");
        assert!(ro <= REFERENCE_RTOL, "ort vs reference: {ro:e}");
        assert!(tr <= RUNTIME_RTOL, "tract vs ort: {tr:e}");
        // The outputs must depend on the input: guard against a test that compares constants.
        let spread_out = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(spread_out > 1e-3, "outputs are all near zero");
        ort
    }

    #[test]
    fn token_model_each_spatial_form_agrees_with_reference() {
        for form in [
            SpatialForm::Dense,
            SpatialForm::ToeplitzExpand,
            SpatialForm::ToeplitzGather,
        ] {
            three_way(&tiny_tokens(form, None, false), 17, 2);
        }
    }

    #[test]
    fn token_model_at_each_opset_agrees_with_reference() {
        for opset in (13..=16).chain(18..=21) {
            three_way(
                &tiny_tokens(SpatialForm::ToeplitzGather, None, false),
                opset,
                1,
            );
        }
    }

    #[test]
    fn amlp_agrees_with_reference() {
        three_way(
            &tiny_tokens(SpatialForm::ToeplitzGather, Some(8), false),
            17,
            2,
        );
        three_way(&tiny_tokens(SpatialForm::Dense, Some(8), false), 20, 2);
    }

    #[test]
    fn causal_models_agree_with_reference() {
        for form in [
            SpatialForm::Dense,
            SpatialForm::ToeplitzExpand,
            SpatialForm::ToeplitzGather,
        ] {
            three_way(&tiny_tokens(form, Some(8), true), 17, 2);
            three_way(&tiny_tokens(form, None, true), 17, 1);
        }
    }

    #[test]
    fn vision_model_agrees_with_reference() {
        three_way(&tiny_vision(SpatialForm::Dense), 17, 3);
        three_way(&tiny_vision(SpatialForm::Dense), 13, 2);
        three_way(&tiny_vision(SpatialForm::ToeplitzGather), 18, 2);
    }

    #[test]
    fn toeplitz_expand_and_gather_give_the_same_outputs() {
        for attn in [None, Some(8)] {
            let gather = three_way(
                &tiny_tokens(SpatialForm::ToeplitzGather, attn, false),
                17,
                2,
            );
            let expand = three_way(
                &tiny_tokens(SpatialForm::ToeplitzExpand, attn, false),
                17,
                2,
            );
            let d = rel_diff(&gather, &expand);
            assert!(d <= 1e-6, "expand vs gather in ONNX Runtime: {d:e}");
        }
    }

    #[test]
    fn causal_outputs_ignore_later_tokens() {
        // Independent of the reference: changing token t+1.. must not move logits at 0..=t.
        let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
        let dir = tempfile::tempdir().unwrap();
        let path = write_config(&cfg, 3, 17, dir.path(), "c.onnx");
        let ids = token_ids(&cfg, 1, 5);
        let mut changed = ids.clone();
        let t = 6;
        for j in t + 1..ids.ncols() {
            changed[[0, j]] = (ids[[0, j]] + 17) % 50;
        }
        let feed = |a: &Array2<i64>| {
            vec![NamedTensor {
                name: "input_ids".into(),
                value: TensorValue::I64(a.clone().into_dyn()),
            }]
        };
        for kind in CPU_RUNTIMES {
            let a = f32_output(&run(kind, &path, &feed(&ids)));
            let b = f32_output(&run(kind, &path, &feed(&changed)));
            let max_before = (0..=t)
                .flat_map(|i| (0..50).map(move |v| (i, v)))
                .map(|(i, v)| (a[[0, i, v]] - b[[0, i, v]]).abs())
                .fold(0f32, f32::max);
            assert_eq!(max_before, 0.0, "{}: positions <= {t} changed", kind.name());
            let max_after = (0..50)
                .map(|v| (a[[0, t + 1, v]] - b[[0, t + 1, v]]).abs())
                .fold(0f32, f32::max);
            assert!(
                max_after > 1e-4,
                "{}: changing tokens had no effect",
                kind.name()
            );
        }
    }

    #[test]
    fn one_file_runs_several_batch_sizes() {
        let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), false);
        let dir = tempfile::tempdir().unwrap();
        let path = write_config(&cfg, 7, 17, dir.path(), "b.onnx");
        for kind in CPU_RUNTIMES {
            let mut rt = gmlp_onnx::runtime::open(kind, &path, &options()).unwrap();
            for batch in [1, 3] {
                let ids = token_ids(&cfg, batch, 2);
                let out = f32_output(
                    &rt.run(&[NamedTensor {
                        name: "input_ids".into(),
                        value: TensorValue::I64(ids.clone().into_dyn()),
                    }])
                    .unwrap(),
                );
                assert_eq!(out.shape(), &[batch, 12, 50]);
                let r = forward_tokens(&cfg, &spread(7), ids.view())
                    .unwrap()
                    .into_dyn();
                assert!(rel_diff(&out, &r) <= REFERENCE_RTOL);
            }
        }
    }

    #[test]
    fn emitted_models_pass_the_onnx_checker() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for opset in 13..=24 {
            for (k, cfg) in [
                tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true),
                tiny_tokens(SpatialForm::ToeplitzExpand, None, false),
                tiny_vision(SpatialForm::Dense),
            ]
            .iter()
            .enumerate()
            {
                paths.push(write_config(
                    cfg,
                    0,
                    opset,
                    dir.path(),
                    &format!("m{opset}_{k}.onnx"),
                ));
            }
        }
        // Every file carries the IR version ONNX's release table pairs with its opset.
        for path in &paths {
            let model = read_model(path).unwrap();
            let opset = model.opset_import[0].version();
            assert_eq!(
                model.ir_version(),
                ir_version_for(opset),
                "{}",
                path.display()
            );
        }
        onnx_check(&paths);
    }

    #[test]
    fn gating_heads_untied_head_and_token_shift_agree_with_reference() {
        for form in [
            SpatialForm::Dense,
            SpatialForm::ToeplitzExpand,
            SpatialForm::ToeplitzGather,
        ] {
            let mut cfg = tiny_tokens(form, Some(8), true);
            cfg.heads = 4;
            three_way(&cfg, 17, 2);
            cfg.causal = false;
            three_way(&cfg, 17, 2);
        }
        let mut cfg = tiny_tokens(SpatialForm::Dense, None, false);
        if let Task::Tokens { tied_embedding, .. } = &mut cfg.task {
            *tied_embedding = false;
        }
        three_way(&cfg, 17, 2);
        for (shift, causal) in [(1, false), (2, true), (3, false)] {
            let mut cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), causal);
            cfg.shift_tokens = shift;
            three_way(&cfg, 17, 2);
        }
        let mut cfg = tiny_vision(SpatialForm::Dense);
        cfg.heads = 2;
        three_way(&cfg, 18, 2);
    }

    #[test]
    fn external_data_is_aligned_loads_in_both_runtimes_and_matches_inline() {
        use gmlp_onnx::onnx::writer::{write_model_with, ExternalData, EXTERNAL_ALIGNMENT};
        let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
        let dir = tempfile::tempdir().unwrap();
        let m = export(&cfg, Arc::new(spread(4)), "test", None, 17).unwrap();
        let inline = dir.path().join("inline.onnx");
        let external = dir.path().join("ext.onnx");
        write_model_with(&m.graph, &m.info, &inline, ExternalData::Auto, |_, _| {}).unwrap();
        let written = write_model_with(
            &m.graph,
            &m.info,
            &external,
            ExternalData::Always,
            |_, _| {},
        )
        .unwrap();
        let (data_path, data_len) = written.data_file.expect("external data written");
        assert_eq!(data_path, dir.path().join("ext.onnx.data"));
        assert_eq!(std::fs::metadata(&data_path).unwrap().len(), data_len);
        let model = read_model(&external).unwrap();
        let graph = model.graph.as_ref().unwrap();
        assert!(!graph.initializer.is_empty());
        for t in &graph.initializer {
            assert!(
                t.raw_data.is_none()
                    && t.data_location()
                        == gmlp_onnx::onnx::proto::tensor_proto::DataLocation::External
            );
            let get = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key() == k)
                    .unwrap()
                    .value()
                    .to_string()
            };
            assert_eq!(get("location"), "ext.onnx.data");
            let offset: u64 = get("offset").parse().unwrap();
            assert_eq!(offset % EXTERNAL_ALIGNMENT, 0, "{} at {offset}", t.name());
        }
        onnx_check(std::slice::from_ref(&external));
        let ids = token_ids(&cfg, 2, 9);
        let feed = [NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(ids.into_dyn()),
        }];
        for kind in CPU_RUNTIMES {
            let a = f32_output(&run(kind, &inline, &feed));
            let b = f32_output(&run(kind, &external, &feed));
            assert_eq!(a, b, "{}: external data changes the outputs", kind.name());
        }
    }

    /// f16 export vs the f32 model (same weights): documented tolerance 1e-2 of max|logits|.
    const F16_RTOL: f64 = 1e-2;

    #[test]
    fn f16_export_tracks_the_f32_model() {
        use gmlp_onnx::gmlp::Precision;
        let dir = tempfile::tempdir().unwrap();
        for (k, base) in [
            tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true),
            tiny_tokens(SpatialForm::Dense, None, false),
            tiny_vision(SpatialForm::Dense),
        ]
        .into_iter()
        .enumerate()
        {
            let mut half = base.clone();
            half.dtype = Precision::F16;
            let p32 = write_config(&base, 3, 17, dir.path(), &format!("f32_{k}.onnx"));
            let p16 = write_config(&half, 3, 17, dir.path(), &format!("f16_{k}.onnx"));
            onnx_check(std::slice::from_ref(&p16));
            // About half the bytes of weights (LayerNorm parameters stay f32).
            let bytes = |c: &GmlpConfig| {
                export(c, Arc::new(spread(3)), "t", None, 17)
                    .unwrap()
                    .graph
                    .initializer_bytes()
            };
            let (s32, s16) = (bytes(&base), bytes(&half));
            assert!(s16 * 10 < s32 * 6, "f16 weights {s16} bytes vs f32 {s32}");
            let feed = match base.task {
                Task::Tokens { .. } => vec![NamedTensor {
                    name: "input_ids".into(),
                    value: TensorValue::I64(token_ids(&base, 2, 4).into_dyn()),
                }],
                Task::Vision { .. } => vec![NamedTensor {
                    name: "pixel_values".into(),
                    value: TensorValue::F32(pixels(&base, 2, 4).into_dyn()),
                }],
                Task::Backbone { .. } => vec![NamedTensor {
                    name: "inputs_embeds".into(),
                    value: TensorValue::F32(embeds(&base, 2, 4).into_dyn()),
                }],
            };
            let reference = f32_output(&run(RuntimeKind::OrtCpu, &p32, &feed));
            for kind in CPU_RUNTIMES {
                let out = f32_output(&run(kind, &p16, &feed));
                let d = rel_diff(&out, &reference);
                eprintln!(
                    "f16 model {k} in {}: max|f16 - f32| / max|f32| = {d:.2e}",
                    kind.name()
                );
                assert!(
                    d <= F16_RTOL && d > 0.0,
                    "f16 model {k} in {}: {d:e}",
                    kind.name()
                );
            }
        }
    }
}
