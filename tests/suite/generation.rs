//! Causal models as generators (docs/generation.md): variable-length graphs equal the fixed-length
//! graph's first positions, and `--with-past` graphs decoded step by step (prefill, single
//! steps, a multi-token chunk, feeding present back as past) equal the whole sequence, in
//! tract and ONNX Runtime, against the independent f64 reference and against PyTorch's
//! logits for the causal g-mlp-pytorch fixtures.
//!
//! Longer than ~500 lines: the causal-model cases (variable length, growing state, CLI
//! and fixtures) share their builders and decoding helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::decoding::*;
use crate::common::*;
use gmlp_onnx::gmlp::reference::forward_tokens;
use gmlp_onnx::gmlp::targets::BuildTarget;
use gmlp_onnx::gmlp::{GmlpConfig, SequenceMode, SpatialForm, WeightSource};
use ndarray::{s, Array2};

fn write_in(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    mode: SequenceMode,
    dir: &Path,
    name: &str,
) -> PathBuf {
    write_for(cfg, source, mode, &BuildTarget::at_opset(17), dir, name)
}

#[test]
fn greedy_generation_equals_the_argmax_of_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
    let source: Arc<dyn WeightSource> = Arc::new(spread(4));
    let path = write_in(
        &cfg,
        source.clone(),
        SequenceMode::Growing,
        dir.path(),
        "g.onnx",
    );
    let o = gmlp(&[
        "generate",
        path_str(&path),
        "--prompt-ids",
        "3,1,4",
        "--runtime",
        "tract",
        "--json",
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tokens: Vec<i64> = json[0]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    assert_eq!(tokens.len(), 9, "stops at n = 12");
    // The reference, fed the same sequence, picks the same next token at every position.
    let mut all = vec![3, 1, 4];
    all.extend(&tokens);
    let ids = Array2::from_shape_vec((1, 12), all[..12].to_vec()).unwrap();
    let logits = forward_tokens(&cfg, source.as_ref(), ids.view()).unwrap();
    for (k, &t) in tokens.iter().enumerate() {
        let row = logits.slice(s![0, 2 + k, ..]);
        let best = row
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0;
        assert_eq!(best as i64, t, "token {k}");
    }
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use gmlp_onnx::generation::Decoder;
    use gmlp_onnx::gmlp::reference::forward_tokens_stepwise;
    use gmlp_onnx::gmlp::targets::Target;
    use gmlp_onnx::gmlp::Precision;
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use gmlp_onnx::validate::Tolerance;

    /// Runtimes against the f64 reference (f32 rounding only).
    const REFERENCE_RTOL: f64 = 1e-5;

    /// `generate`'s flags for 12 tokens after a 13-byte prompt in tract and ONNX Runtime.
    const PERMISSION_IS_IN_BOTH: [&str; 6] = [
        "--prompt-text",
        "Permission is",
        "--max-new-tokens",
        "12",
        "--compare",
        "tract,ort-cpu",
    ];

    /// fixtures/`name` built by the CLI with the fixture's flags and `--with-past growing`,
    /// as `dir/past.onnx`.
    fn growing_fixture(name: &str, dir: &Path) -> PathBuf {
        let model = dir.join("past.onnx");
        Fixture::open(name).build("model.safetensors", &["--with-past", "growing"], &model);
        model
    }

    fn ids_input(ids: &Array2<i64>) -> Vec<NamedTensor> {
        vec![NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(ids.clone().into_dyn()),
        }]
    }

    #[test]
    fn variable_length_models_equal_the_fixed_models_first_positions() {
        let dir = tempfile::tempdir().unwrap();
        let mut shifted = tiny_tokens(SpatialForm::Dense, None, true);
        shifted.shift_tokens = 3;
        let mut configs = causal_configs();
        configs.push(("gmlp-dense-shift3", shifted));
        for (name, cfg) in configs {
            let source: Arc<dyn WeightSource> = Arc::new(spread(5));
            let fixed = write_in(
                &cfg,
                source.clone(),
                SequenceMode::Fixed,
                dir.path(),
                "f.onnx",
            );
            let variable = checked(write_in(
                &cfg,
                source.clone(),
                SequenceMode::Variable,
                dir.path(),
                "v.onnx",
            ));
            let (ids, reference) = ids_and_reference(&cfg, source.as_ref(), 1);
            for kind in CPU_RUNTIMES {
                let whole = f32_output(&run(kind, &fixed, &ids_input(&ids)));
                for len in [1, 5, 12] {
                    let prefix = ids.slice(s![.., ..len]).to_owned();
                    let out = f32_output(&run(kind, &variable, &ids_input(&prefix)));
                    let expected = whole.slice(s![.., ..len, ..]).to_owned().into_dyn();
                    let d = rel_diff(&out, &expected);
                    assert!(d <= 1e-6, "{name} {} length {len}: {d:e}", kind.name());
                    let r = reference.slice(s![.., ..len, ..]).to_owned().into_dyn();
                    let d = rel_diff(&out, &r);
                    assert!(
                        d <= REFERENCE_RTOL,
                        "{name} {} vs reference: {d:e}",
                        kind.name()
                    );
                }
            }
        }
    }

    #[test]
    fn with_past_decoding_equals_the_whole_sequence_in_both_runtimes() {
        let dir = tempfile::tempdir().unwrap();
        // Today's graph, and the portable target (opset 13: Shape without start/end,
        // primitive LayerNorm, Toeplitz W expanded).
        let portable = BuildTarget::resolve(Target::Portable, None).unwrap();
        let configs = causal_configs().into_iter().flat_map(|(name, cfg)| {
            let mut p = cfg.clone();
            p.spatial = Target::Portable.spatial_for(p.spatial);
            [
                (name.to_string(), cfg, BuildTarget::at_opset(17)),
                (format!("{name}-portable"), p, portable),
            ]
        });
        for (name, cfg, target) in configs {
            let source: Arc<dyn WeightSource> = Arc::new(spread(9));
            let path = checked(write_for(
                &cfg,
                source.clone(),
                SequenceMode::Growing,
                &target,
                dir.path(),
                "p.onnx",
            ));
            let (ids, reference) = ids_and_reference(&cfg, source.as_ref(), 2);
            let chunks = [5, 1, 1, 3, 2];
            let stepwise_reference =
                forward_tokens_stepwise(&cfg, source.as_ref(), ids.view(), &chunks).unwrap();
            assert!(rel(&stepwise_reference, &reference) <= 1e-6, "{name}");
            let mut states = Vec::new();
            for kind in CPU_RUNTIMES {
                let mut decoder = Decoder::open(kind, &path, &options(), 2).unwrap();
                // One run on the whole sequence (past empty) ...
                let whole = decode(&mut decoder, &ids, &[12]);
                let whole_state = decoder.state().unwrap();
                // ... and the same tokens fed in pieces, present fed back as past.
                decoder.reset().unwrap();
                let stepwise = decode(&mut decoder, &ids, &chunks);
                let d = rel(&stepwise, &whole);
                assert!(d <= 1e-5, "{name} {}: stepwise vs whole {d:e}", kind.name());
                let d = rel(&stepwise, &reference);
                assert!(
                    d <= REFERENCE_RTOL,
                    "{name} {} vs reference: {d:e}",
                    kind.name()
                );
                let described = decoder.model().info.state.clone();
                assert_eq!(described.len(), whole_state.len());
                for ((a, b), info) in decoder
                    .state()
                    .unwrap()
                    .iter()
                    .zip(&whole_state)
                    .zip(&described)
                {
                    let (TensorValue::F32(a), TensorValue::F32(b)) = (&a.value, &b.value) else {
                        panic!("f32 state")
                    };
                    // 12 positions, or the last s of them for a token-shift window.
                    let rows = info.window.map_or(12, |w| w.min(12));
                    assert_eq!(a.shape()[1], rows, "{name} {}: {}", info.past, b.shape()[1]);
                    let d = rel_diff(a, b);
                    assert!(d <= 1e-5, "{name} {} state: {d:e}", kind.name());
                }
                // n positions are all there is.
                let err = decoder.feed(ids.slice(s![.., ..1])).unwrap_err();
                assert!(matches!(err, gmlp_onnx::Error::PastPositions(_)), "{err:?}");
                states.push(decoder.state().unwrap());
            }
            // tract and ONNX Runtime end in the same state.
            for (a, b) in states[0].iter().zip(&states[1]) {
                let (TensorValue::F32(a), TensorValue::F32(b)) = (&a.value, &b.value) else {
                    panic!("f32 state")
                };
                assert!(rel_diff(a, b) <= 1e-5, "{name}: {}", a.len());
            }
        }
    }

    /// int8 with-past graphs (the spatial MatMul too: Wᵀ's columns P..P+T−1 gathered from the
    /// int8 matrix) decode step by step within the int8 tolerance of the f64 reference, and
    /// tract and ONNX Runtime agree. Not bit-equal to the whole-sequence run: dynamic
    /// quantization picks its activation scale from each run's own values.
    #[test]
    fn int8_with_past_decoding_tracks_the_reference_in_both_runtimes() {
        let dir = tempfile::tempdir().unwrap();
        for (name, cfg) in causal_configs() {
            let mut q = cfg.clone();
            q.dtype = Precision::Int8;
            let source: Arc<dyn WeightSource> = Arc::new(spread(9));
            let path = checked(write_in(
                &q,
                source.clone(),
                SequenceMode::Growing,
                dir.path(),
                "q.onnx",
            ));
            let (ids, reference) = ids_and_reference(&cfg, source.as_ref(), 3);
            let mut outs = Vec::new();
            for kind in CPU_RUNTIMES {
                let mut decoder = Decoder::open(kind, &path, &options(), 2).unwrap();
                let stepwise = decode(&mut decoder, &ids, &[5, 1, 1, 3, 2]);
                let d = rel(&stepwise, &reference);
                eprintln!(
                    "{name} int8 {}: stepwise vs f64 reference {d:.2e}",
                    kind.name()
                );
                assert!(d <= Tolerance::INT8.rtol, "{name} {}: {d:e}", kind.name());
                outs.push(stepwise);
            }
            let d = rel(&outs[0], &outs[1]);
            assert!(
                d <= Tolerance::INT8.rtol,
                "{name} tract vs ONNX Runtime: {d:e}"
            );
        }
    }

    #[test]
    fn causal_pytorch_fixtures_decoded_step_by_step_match_pytorch_at_every_position() {
        let dir = tempfile::tempdir().unwrap();
        // lucid_shift_causal: aMLP with shift_tokens = 2 (the shift has no parameters, so the
        // import is told by the fixture's flags, as `--shift-tokens 2` tells the CLI).
        for name in LUCID_CAUSAL {
            let fx = CausalFixture::open(name);
            let path = write_in(
                &fx.cfg,
                fx.weights.clone(),
                SequenceMode::Growing,
                dir.path(),
                "p.onnx",
            );
            let reference =
                forward_tokens_stepwise(&fx.cfg, fx.weights.as_ref(), fx.ids.view(), &fx.chunks)
                    .unwrap();
            let d = rel(&reference, &fx.pytorch);
            assert!(
                d <= PYTORCH_RTOL,
                "{name}: stepwise reference vs PyTorch {d:e}"
            );
            for kind in CPU_RUNTIMES {
                let mut decoder = Decoder::open(kind, &path, &options(), fx.ids.nrows()).unwrap();
                let logits = decode(&mut decoder, &fx.ids, &fx.chunks);
                let d = fx.assert_matches_pytorch(&logits, &kind.name());
                eprintln!("{name}: {} step by step vs PyTorch: {d:.2e}", kind.name());
            }
        }
    }

    /// A g-mlp-pytorch aMLP trained with shift_tokens = 2, built `--with-past growing`: validate's
    /// whole-sequence run and decoding check (the window state starts empty too), inspect's
    /// window state, and generate in both runtimes.
    #[test]
    fn cli_validates_and_generates_a_token_shift_model_with_past() {
        let dir = tempfile::tempdir().unwrap();
        // The fixture's flags: --causal --shift-tokens 2.
        let model = growing_fixture("lucid_shift_causal", dir.path());
        let report = validate_report(&model, &["--decode-steps", "3"]);
        let plan = &report["decoding"]["plan"];
        assert_eq!((&plan["prefill"], &plan["steps"]), (&16.into(), &3.into()));
        let decoding = &inspect_json(&model)["decoding"];
        assert_eq!(decoding["mode"], "with-past");
        // d = 24: the window keeps 2 rows of 24 floats per block.
        let shift = decoding["state"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["past"] == "past_shift.0")
            .unwrap_or_else(|| panic!("{decoding}"));
        assert_eq!(
            shift,
            &serde_json::json!({"block": 0, "past": "past_shift.0",
                "present": "present_shift.0", "width": 24, "window": 2})
        );
        assert_eq!(decoding["window_bytes_per_block"], 192);
        let o = gmlp(&[
            "generate",
            path_str(&model),
            "--prompt-text",
            "Permission is",
            "--max-new-tokens",
            "8",
            "--compare",
            "tract,ort-cpu",
        ]);
        assert!(o.status.success(), "{}", output_text(&o));
    }

    #[test]
    fn cli_builds_validates_and_generates_with_past() {
        let dir = tempfile::tempdir().unwrap();
        let model = growing_fixture("lucid_amlp_causal", dir.path());
        let json = validate_report(&model, &["--decode-steps", "5"]);
        let decoding = &json["decoding"];
        assert_eq!(decoding["pass"], true);
        assert_eq!(
            decoding["plan"],
            serde_json::json!({"prefill": 16, "steps": 5, "chunk": 4})
        );
        let runtimes = decoding["runtimes"].as_array().unwrap();
        assert_eq!(runtimes.len(), 2);
        // prefill + 5 steps + chunk, then 3 state tensors per block for 2 blocks.
        assert_eq!(
            runtimes[0]["against_whole"].as_array().unwrap().len(),
            7 + 6
        );
        assert_eq!(decoding["pairs"][0]["pass"], true);
        let decoding = &inspect_json(&model)["decoding"];
        assert_eq!(
            (&decoding["mode"], &decoding["max_sequence"]),
            (&"with-past".into(), &32.into())
        );
        // e = 48, a = 16: (48 + 2·16)·4 = 320 bytes per token per block.
        assert_eq!(decoding["state_bytes_per_token_per_block"], 320);
        for sampling in [
            &[][..],
            &["--temperature", "0.9", "--top-k", "5", "--seed", "3"],
        ] {
            let mut args = PERMISSION_IS_IN_BOTH.to_vec();
            args.extend_from_slice(sampling);
            let json = generate_json(&model, &args);
            let runs = json.as_array().unwrap();
            let names: Vec<&str> = runs
                .iter()
                .map(|r| r["runtime"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["tract", "ort-cpu"]);
            assert_eq!(runs[0]["tokens"], runs[1]["tokens"], "same tokens");
            for run in runs {
                assert_eq!(run["prompt_tokens"], 13, "{run}");
                assert_eq!(run["steps"], 11, "{run}");
            }
        }
    }

    /// The text form of `generate` (the one test of it; the other tests read `--json`): for
    /// each runtime its model form, the tokens and their text, the prefill and step lines,
    /// then that the runtimes agree, each as the JSON result of the same run says.
    #[test]
    fn generate_text_shows_tokens_timings_and_agreement() {
        let dir = tempfile::tempdir().unwrap();
        let model = growing_fixture("lucid_amlp_causal", dir.path());
        let mut argv = vec!["generate", path_str(&model)];
        argv.extend(PERMISSION_IS_IN_BOTH);
        let o = gmlp(&argv);
        assert!(o.status.success(), "{}", output_text(&o));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let json = generate_json(&model, &PERMISSION_IS_IN_BOTH);
        let mut expected = Vec::new();
        for run in json.as_array().unwrap() {
            let tokens: Vec<i64> = serde_json::from_value(run["tokens"].clone()).unwrap();
            let ids: Vec<String> = tokens.iter().map(i64::to_string).collect();
            let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
            expected.push(format!(
                "{} (with-past model):",
                run["runtime"].as_str().unwrap()
            ));
            expected.push(format!("tokens: {}", ids.join(",")));
            expected.push(format!("text:   {:?}", String::from_utf8_lossy(&bytes)));
            expected.push("prefill: 13 tokens in ".into());
            expected.push("steps:   11 tokens in ".into());
        }
        expected.push("same tokens in tract, ort-cpu".into());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), expected.len(), "{text}");
        for (line, want) in lines.iter().zip(&expected) {
            assert!(line.starts_with(want.as_str()), "{want:?} expected: {text}");
        }
        assert!(lines[4].contains("median step"), "{text}");
    }

    /// `generate --fused-gain` on a portable static-state file: the file's own generation
    /// is as without the flag (same tokens), the report names the file's form and sets the
    /// fused twin's measured median step beside the file's; on tract alone, or on a file
    /// fused already, the flag is refused in one line.
    #[test]
    fn the_fused_gain_is_measured_beside_the_file_whose_tokens_stay_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let model = write_small_amlp(SequenceMode::Static, dir.path(), "static.onnx");
        let model = path_str(&model);
        let base = [
            "generate",
            model,
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "8",
            "--runtime",
            "ort-cpu",
            "--json",
        ];
        let json = |extra: &[&str]| -> serde_json::Value {
            let o = gmlp(&[&base[..], extra].concat());
            assert!(o.status.success(), "{}", output_text(&o));
            serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()[0].clone()
        };
        let plain = json(&[]);
        let measured = json(&["--fused-gain"]);
        assert_eq!(plain["tokens"], measured["tokens"]);
        assert_eq!(plain["step_form"], "portable-fusable");
        assert!(plain.get("fused_gain").is_none(), "{plain}");
        let fused = measured["fused_step_median_ms"].as_f64().unwrap();
        let gain = measured["fused_gain"].as_f64().unwrap();
        assert!(fused > 0.0 && gain.is_finite() && gain > 0.0, "{measured}");
        let tract = [&base[..7], &["tract", "--fused-gain"]].concat();
        assert_refused(
            &tract,
            "--fused-gain measures the fused step in ONNX Runtime",
        );
        // A file built fused has no fused form to compare.
        let fused_file = dir.path().join("fused.onnx");
        let (_, cfg) = causal_configs().swap_remove(1);
        let target = BuildTarget::resolve(Target::OnnxRuntime, None).unwrap();
        write_for(
            &cfg,
            Arc::new(spread(3)),
            SequenceMode::Static,
            &target,
            dir.path(),
            "fused.onnx",
        );
        let fused_args = [
            "generate",
            path_str(&fused_file),
            "--prompt-ids",
            "1,2",
            "--fused-gain",
        ];
        assert_refused(&fused_args, "runs the fused static step already");
    }
}
