//! Weight-only quantization, `--dtype int4` and `--dtype int8-weight-only`: ONNX Runtime's
//! `MatMulNBits` reads the packed weights as we mean them (against its own f32 MatMul of
//! the dequantized matrix), the trained fixtures keep their logits and next-token
//! predictions, tract and ONNX Runtime agree on whole-sequence, variable-length and
//! with-past files (tract running 8-bit blocks dequantized, as `validate` reports), and
//! what cannot be such a file is refused.
//!
//! Accuracy bounds (docs/quantization.md has the measured values), against the f32 export
//! of the same weights: int4, the relative L2 error of all logits ‖q − f32‖₂ / ‖f32‖₂ ≤
//! 2e-2, the max-norm error max|q − f32| / max|f32| ≤ 4e-2 (4-bit weights on these d = 24
//! models: the max-norm error is about twice the L2 one), next-token (greedy) top-1
//! agreement ≥ 93% (measured at worst: 1.3e-2, 2.9e-2, 95.8%; before int4 kept its output
//! projections in 8 bits: 1.9e-2, 4.2e-2, 92.7%); int8-weight-only: L2 ≤ 1e-2, max-norm ≤
//! 3e-2, top-1 ≥ 97%.
//!
//! Longer than ~500 lines: int4 and int8-weight-only share the accuracy measurement over
//! the ten trained fixtures and the packing checks against ONNX Runtime.

use std::sync::Arc;

use crate::common::*;
use gmlp_onnx::gmlp::{GmlpConfig, ParamSpec, Precision, SpatialForm, WeightSource};

/// Seeded weights with one enormous value in a projection.
struct Huge;

impl WeightSource for Huge {
    fn values(&self, spec: &ParamSpec) -> gmlp_onnx::error::Result<Vec<f32>> {
        let mut v = spread(1).values(spec)?;
        if spec.name == "blocks.1.proj_in.weight" {
            v[3] = 1e7;
        }
        Ok(v)
    }
}

#[test]
fn what_cannot_be_an_int4_file_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // Other targets' consumers cannot read MatMulNBits.
    for (target, dtype) in [
        ("portable", "int4"),
        ("ort-legacy", "int4"),
        ("opencv4", "int8-weight-only"),
        ("candle", "int4"),
    ] {
        let out = dir.path().join(format!("{target}.onnx"));
        let o = Build::preset("amlp-base")
            .args(&["-q", "--layers", "1", "--dtype", dtype, "--target", target])
            .run(&out);
        assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("MatMulNBits"), "{err}");
        assert!(!out.exists());
    }
    // A weight whose block scale would overflow f16: refused, no file left behind.
    let mut cfg: GmlpConfig = tiny_tokens(SpatialForm::Dense, None, true);
    cfg.dtype = Precision::Int4;
    let model = gmlp_onnx::gmlp::export::export(&cfg, Arc::new(Huge), "test", None, 17).unwrap();
    let path = dir.path().join("huge.onnx");
    let err = gmlp_onnx::onnx::writer::write_model(&model.graph, &model.info, &path, |_, _| {})
        .unwrap_err();
    assert!(matches!(err, gmlp_onnx::Error::BadTensor(_)), "{err:?}");
    // The rendering of the family: the weight named, its magnitude and the limit.
    assert_eq!(
        err.to_string(),
        "blocks.1.proj_in.weight: a weight of magnitude 1e7 is too large for 4-bit block quantization (its scale, stored as f16, would overflow; the limit is 5.24032e5)"
    );
    assert!(!path.exists());
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use gmlp_onnx::gmlp::Task;
    use gmlp_onnx::onnx::builder::GraphBuilder;
    use gmlp_onnx::onnx::graph::{Dim, ElemType, TensorData};
    use gmlp_onnx::onnx::nbits::{self, dequantize_packed};
    use gmlp_onnx::onnx::ops::NBits;
    use gmlp_onnx::onnx::reader::read_model;
    use gmlp_onnx::runtime::tract::TractRuntime;
    use gmlp_onnx::runtime::Runtime;
    use gmlp_onnx::runtime::{RuntimeKind, RuntimeOptions};
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use gmlp_onnx::validate::Tolerance;

    /// What tract says it ran differently for the int8-weight-only aMLP (2 blocks, with
    /// past) of the test below.
    const TRACT_NOTE: &str = "15 MatMulNBits nodes with codes tract does not read (it reads 2 and 4 bits) ran as MatMul on weights gmlp-onnx dequantized from the file's blocks";
    use ndarray::{Array2, ArrayD, IxDyn};
    use std::path::{Path, PathBuf};

    /// A deterministic spread of values in about [−1, 1].
    fn values(len: usize, seed: u64) -> Vec<f32> {
        gmlp_onnx::rng::SplitMix64::keyed(seed, "int4").uniform_f32(len, -1.0, 1.0)
    }

    /// (dtype, max L2, max max-norm, min top-1 agreement) against f32.
    const BOUNDS: [(&str, f64, f64, f64); 2] = [
        ("int4", 2e-2, 4e-2, 0.93),
        ("int8-weight-only", 1e-2, 3e-2, 0.97),
    ];

    /// The causal token fixtures (g-mlp-pytorch causal, g-mlp-gpt).
    const FIXTURES: [&str; 10] = [
        "lucid_tokens_causal",
        "lucid_amlp_causal",
        "lucid_shift_causal",
        "gpt_tokens",
        "gpt_heads2_attn",
        "gpt_window",
        "gpt_fold",
        "gpt_reversible",
        "gpt_act_tanh",
        "gpt_act_sigmoid",
    ];

    /// `a [2, 3, k]` times a `[k, n]` weight given as f32 values (`MatMul`) or block-quantized
    /// (`MatMulNBits`), written to `dir/name`.
    fn one_matmul(dir: &Path, name: &str, k: usize, weight: Weight) -> PathBuf {
        let mut g = GraphBuilder::new(17).unwrap();
        let a = g
            .input(
                "a",
                ElemType::F32,
                vec![Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(k)],
            )
            .unwrap();
        let y = match weight {
            Weight::Float { values, n } => {
                let w = g.weight("w", &[k, n], TensorData::F32(values)).unwrap();
                g.matmul("y", &a, &w).unwrap()
            }
            Weight::Block { q, accuracy_level } => {
                let b = g
                    .weight_as(
                        "w.int4",
                        &q.packed_dims(),
                        ElemType::U8,
                        TensorData::F32(q.packed().into_iter().map(f32::from).collect()),
                    )
                    .unwrap();
                let s = g
                    .weight(
                        "w.scale",
                        &q.scale_dims(),
                        TensorData::F32(q.scales.clone()),
                    )
                    .unwrap();
                let attrs = NBits {
                    k,
                    n: q.n,
                    bits: q.bits,
                    block_size: q.block_size,
                    accuracy_level,
                };
                g.matmul_nbits("y", &a, &b, &s, None, attrs).unwrap()
            }
        };
        write_graph(&g.finish("g", vec![y]), dir, name)
    }

    enum Weight {
        Float {
            values: Vec<f32>,
            n: usize,
        },
        Block {
            q: nbits::BlockQuantized,
            accuracy_level: i64,
        },
    }

    fn input_a(k: usize) -> Vec<NamedTensor> {
        vec![NamedTensor {
            name: "a".into(),
            value: TensorValue::F32(
                ArrayD::from_shape_vec(IxDyn(&[2, 3, k]), values(6 * k, 11)).unwrap(),
            ),
        }]
    }

    #[test]
    fn matmul_nbits_computes_onnx_runtimes_matmul_of_the_dequantized_weights() {
        let dir = tempfile::tempdir().unwrap();
        // K = 70: two full blocks of 32 and a padded third (tract dequantizes such a weight to
        // f32); K = 96: three full blocks (tract keeps them as its Q4_0 blocks).
        for (k, n, bits) in [(70, 9, 4), (70, 9, 8), (96, 7, 4)] {
            let w = values(k * n, 5);
            let inputs = input_a(k);
            let q = nbits::quantize(&w, k, n, bits, nbits::BLOCK_SIZE).unwrap();
            // The weights read back from the bytes we write, by our own unpacking.
            let deq = dequantize_packed(&q.packed(), &q.scales, k, n, bits, 32).unwrap();
            let plain = one_matmul(
                dir.path(),
                &format!("plain{k}_{bits}.onnx"),
                k,
                Weight::Float { values: deq, n },
            );
            let packed = one_matmul(
                dir.path(),
                &format!("nbits{k}_{bits}.onnx"),
                k,
                Weight::Block {
                    q: q.clone(),
                    accuracy_level: 0,
                },
            );
            let reference = f32_output(&run(RuntimeKind::OrtCpu, &plain, &inputs));
            let got = f32_output(&run(RuntimeKind::OrtCpu, &packed, &inputs));
            let d = rel_diff(&got, &reference);
            eprintln!(
                "K {k} bits {bits}: MatMulNBits vs MatMul of the dequantized weights {d:.1e}"
            );
            assert!(d <= 1e-6, "bits {bits}: {d:e}");
            // tract reads 4-bit MatMulNBits (its Q4_0 blocks hold the same f16 scales).
            if bits == 4 {
                let t = f32_output(&run(RuntimeKind::Tract, &packed, &inputs));
                let d = rel_diff(&t, &reference);
                eprintln!(
                    "K {k} bits 4: tract vs ONNX Runtime's MatMul of the dequantized weights {d:.1e}"
                );
                assert!(d <= 1e-6, "tract: {d:e}");
            }
            // accuracy_level 4 (what the models use) lets ONNX Runtime quantize `a` to int8 per
            // block: close, not exact.
            let fast = one_matmul(
                dir.path(),
                &format!("nbits{k}_{bits}-acc4.onnx"),
                k,
                Weight::Block {
                    q,
                    accuracy_level: 4,
                },
            );
            let d = rel_diff(
                &f32_output(&run(RuntimeKind::OrtCpu, &fast, &inputs)),
                &reference,
            );
            eprintln!("K {k} bits {bits}: accuracy_level 4 vs the dequantized MatMul {d:.1e}");
            assert!(d <= 2e-2, "bits {bits} accuracy_level 4: {d:e}");
        }
    }

    fn logits(kind: RuntimeKind, path: &Path, ids: &Array2<i64>) -> ArrayD<f32> {
        let feed = [NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(ids.clone().into_dyn()),
        }];
        f32_output(&run(kind, path, &feed))
    }

    /// ‖a − b‖₂ / ‖b‖₂ over all elements.
    fn rel_l2(a: &ArrayD<f32>, b: &ArrayD<f32>) -> f64 {
        let (mut num, mut den) = (0f64, 0f64);
        for (x, y) in a.iter().zip(b) {
            num += f64::from(x - y).powi(2);
            den += f64::from(*y).powi(2);
        }
        (num / den).sqrt()
    }

    #[test]
    fn quantized_fixtures_keep_their_logits_and_next_token_predictions() {
        let dir = tempfile::tempdir().unwrap();
        for (dtype, max_l2, max_norm, min_top1) in BOUNDS {
            let mut worst = (0f64, 0f64, 1f64);
            for name in FIXTURES {
                let (f32_path, q_path) = (
                    dir.path().join(format!("{name}.onnx")),
                    dir.path().join(format!("{name}-{dtype}.onnx")),
                );
                let fx = Fixture::open(name);
                if !f32_path.exists() {
                    fx.build("model.safetensors", &[], &f32_path);
                }
                fx.build("model.safetensors", &["--dtype", dtype], &q_path);
                let ids = fx.ids("input_ids");
                let reference = logits(RuntimeKind::OrtCpu, &f32_path, &ids);
                let ref_top1 = argmax_rows(&reference);
                let out = logits(RuntimeKind::OrtCpu, &q_path, &ids);
                let (l2, maxnorm) = (rel_l2(&out, &reference), rel_diff(&out, &reference));
                let top1 = argmax_rows(&out);
                let agree = top1.iter().zip(&ref_top1).filter(|(a, b)| a == b).count() as f64
                    / top1.len() as f64;
                eprintln!(
                    "{name}: {dtype} vs f32 (ONNX Runtime): L2 {l2:.2e}, max-norm {maxnorm:.2e}, top-1 agreement {agree:.3}"
                );
                assert!(l2 <= max_l2, "{name} {dtype}: L2 {l2:e}");
                assert!(maxnorm <= max_norm, "{name} {dtype}: max-norm {maxnorm:e}");
                assert!(agree >= min_top1, "{name} {dtype}: top-1 {agree}");
                worst = (worst.0.max(l2), worst.1.max(maxnorm), worst.2.min(agree));
                // tract runs the same file (8-bit blocks dequantized by us, as validate does).
                let mut rt = TractRuntime::load_with(&q_path, true).unwrap();
                let feed = [NamedTensor {
                    name: "input_ids".into(),
                    value: TensorValue::I64(ids.clone().into_dyn()),
                }];
                let t = f32_output(&rt.run(&feed).unwrap());
                let between = rel_diff(&t, &out);
                let (t_l2, t_max) = (rel_l2(&t, &reference), rel_diff(&t, &reference));
                eprintln!(
                    "{name}: {dtype} tract vs f32: L2 {t_l2:.2e}, max-norm {t_max:.2e}; tract vs ONNX Runtime {between:.2e}"
                );
                assert!(t_l2 <= max_l2 && t_max <= max_norm, "{name} {dtype} tract");
                assert!(between <= Tolerance::INT8.rtol, "{name}: {between:e}");
            }
            eprintln!(
                "{dtype}, worst over the fixtures: L2 {:.2e}, max-norm {:.2e}, top-1 agreement {:.3}",
                worst.0, worst.1, worst.2
            );
        }
    }

    #[test]
    fn graphs_have_one_matmul_nbits_per_projection_at_any_opset() {
        let dir = tempfile::tempdir().unwrap();
        let mut untied = tiny_tokens(SpatialForm::Dense, Some(8), true);
        if let Task::Tokens { tied_embedding, .. } = &mut untied.task {
            *tied_embedding = false;
        }
        // Per block: two proj_in halves, q, k, v, attention out, proj_out; a token model's head
        // is one more MatMulNBits (8-bit blocks of 128) in both weight-only types.
        let cases = [
            (tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true), 14),
            (untied, 14),
            (tiny_tokens(SpatialForm::Dense, None, false), 6),
            (tiny_vision(SpatialForm::Dense), 6),
        ];
        let tract = RuntimeOptions {
            tract: gmlp_onnx::runtime::TractOptions {
                dequantize_nbits: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut checked = Vec::new();
        for (k, (cfg, blocks)) in cases.into_iter().enumerate() {
            let heads = usize::from(matches!(cfg.task, Task::Tokens { .. }));
            for (dtype, nbits_nodes, integer_nodes) in [
                (Precision::Int4, blocks + heads, 0),
                (Precision::Int8WeightOnly, blocks + heads, 0),
            ] {
                for opset in [13, 17, 21] {
                    let f32_path =
                        write_config(&cfg, 3, opset, dir.path(), &format!("f{k}_{opset}.onnx"));
                    let mut q = cfg.clone();
                    q.dtype = dtype;
                    let name = format!("q{k}_{}_{opset}.onnx", dtype.name());
                    let path = write_config(&q, 3, opset, dir.path(), &name);
                    assert_eq!(op_count(&path, "MatMulNBits"), nbits_nodes, "{name}");
                    assert_eq!(op_count(&path, "MatMulInteger"), integer_nodes, "{name}");
                    let model = read_model(&path).unwrap();
                    assert!(model
                        .opset_import
                        .iter()
                        .any(|o| o.domain() == "com.microsoft" && o.version() == 1));
                    let node = model
                        .graph
                        .as_ref()
                        .unwrap()
                        .node
                        .iter()
                        .find(|n| n.op_type() == "MatMulNBits")
                        .unwrap();
                    assert_eq!(node.domain(), "com.microsoft");
                    let dims = [("sequence".to_string(), cfg.seq_len())];
                    let inputs = gmlp_onnx::validate::make_inputs(&model, 2, &dims, 1).unwrap();
                    let reference = f32_output(&run(RuntimeKind::OrtCpu, &f32_path, &inputs));
                    let mut outs = Vec::new();
                    for kind in CPU_RUNTIMES {
                        let mut rt = gmlp_onnx::runtime::open(kind, &path, &tract).unwrap();
                        let out = f32_output(&rt.run(&inputs).unwrap());
                        let l2 = rel_l2(&out, &reference);
                        eprintln!("{name} {}: L2 vs f32 {l2:.2e}", kind.name());
                        assert!(l2 <= 0.1, "{name} {}: {l2:e}", kind.name());
                        outs.push(out);
                    }
                    assert!(rel_diff(&outs[0], &outs[1]) <= Tolerance::INT8.rtol);
                    checked.push(path);
                }
            }
        }
        onnx_check(&checked);
    }

    #[test]
    fn int4_metadata_describes_the_quantization_and_validate_uses_int8_tolerances() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.onnx");
        Build::amlp(2, Amlp::Short)
            .args(&["--causal", "--dtype", "int4"])
            .write(&path);
        let summary = inspect_json(&path);
        let q = &summary["quantization"];
        assert_eq!(q["projections"]["op"], "com.microsoft.MatMulNBits");
        assert_eq!(q["projections"]["bits"], 4);
        assert_eq!(q["projections"]["block_size"], 32);
        assert_eq!(
            q["projections"]["parameters"],
            serde_json::json!([
                "blocks.*.proj_in.weight",
                "blocks.*.attn.qkv.weight",
                "blocks.*.attn.out.weight"
            ])
        );
        // The output projections in 8-bit blocks of 128, as the head.
        let out = &q["output_projections"];
        assert_eq!(
            out["parameters"],
            serde_json::json!(["blocks.*.proj_out.weight"])
        );
        assert_eq!(
            (out["bits"].as_u64(), out["block_size"].as_u64()),
            (Some(8), Some(128))
        );
        assert_eq!(q["head"]["parameters"], serde_json::json!(["embed.weight"]));
        assert_eq!(q["head"]["op"], "com.microsoft.MatMulNBits");
        assert_eq!(q["head"]["bits"], 8);
        assert_eq!(q["head"]["block_size"], 128);
        // A vision model's classifier stays f32: no quantized head is described.
        let vision = dir.path().join("v.onnx");
        Build::preset("gmlp-ti16")
            .args(&["--layers", "1", "--dtype", "int4"])
            .write(&vision);
        let v = inspect_json(&vision);
        assert!(v["quantization"]["head"].is_null(), "{v}");
        assert_eq!(v["quantization"]["projections"]["bits"], 4);
        assert_eq!(
            v["quantization"]["output_projections"]["parameters"],
            serde_json::json!(["blocks.*.proj_out.weight"])
        );
        // The parameter count is the f32 model's.
        let f32_path = dir.path().join("f.onnx");
        Build::amlp(2, Amlp::Short)
            .args(&["--causal"])
            .write(&f32_path);
        assert_eq!(summary["parameters"], inspect_json(&f32_path)["parameters"]);
        let r = validate_report(&path, &[]);
        assert_eq!(r["tolerance"]["rtol"], 0.1);
        assert_eq!(r["precision"], "int4");
    }

    #[test]
    fn int4_with_past_files_decode_like_the_whole_sequence_in_both_runtimes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.onnx");
        // Paper init with seed 2: its greedy continuation of the prompt below varies (6
        // distinct tokens in 8), so two runtimes agreeing on it is not agreeing on a constant.
        Build::amlp(2, Amlp::Short)
            .args(&["--causal", "--with-past", "--dtype", "int4", "--seed", "2"])
            .write(&path);
        // validate: the whole sequence in tract and ONNX Runtime, then the decoding check
        // (prefill, single steps, a chunk; state fed back) in each, against the whole sequence.
        let r = validate_report(&path, &[]);
        assert_eq!(r["decoding"]["pass"], true, "{r}");
        // generate: the same greedy tokens from both runtimes.
        let tokens = |runtime: &str| {
            let args = [
                "--runtime",
                runtime,
                "--prompt-ids",
                "5,17,99,3",
                "--max-new-tokens",
                "8",
                "-q",
            ];
            generate_json(&path, &args)[0]["tokens"].clone()
        };
        let (a, b) = (tokens("tract"), tokens("ort-cpu"));
        eprintln!("greedy tokens: tract {a}, ort-cpu {b}");
        let tract: Vec<i64> = serde_json::from_value(a).unwrap();
        let mut distinct = tract.clone();
        distinct.sort();
        distinct.dedup();
        assert!(
            tract.len() == 8 && distinct.len() >= 4,
            "a varied continuation: {tract:?}"
        );
        assert_eq!(
            tract,
            serde_json::from_value::<Vec<i64>>(b).unwrap(),
            "tract and ort-cpu generated different tokens"
        );
    }

    #[test]
    fn int8_weight_only_files_validate_with_tract_on_dequantized_blocks_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w8.onnx");
        Build::amlp(2, Amlp::Short)
            .args(&[
                "--causal",
                "--with-past",
                "--dtype",
                "int8-weight-only",
                "--init",
                "spread",
            ])
            .write(&path);
        let summary = inspect_json(&path);
        let q = &summary["quantization"];
        assert_eq!(q["dtype"], "int8-weight-only");
        assert_eq!(q["projections"]["bits"], 8);
        assert_eq!(q["head"]["op"], "com.microsoft.MatMulNBits");
        assert_eq!(q["head"]["parameters"], serde_json::json!(["embed.weight"]));
        let r = validate_report(&path, &[]);
        assert_eq!(r["precision"], "int8-weight-only");
        assert_eq!(r["runtimes"][0]["name"], "tract");
        assert_eq!(r["runtimes"][0]["note"], TRACT_NOTE);
        assert!(r["runtimes"][1].get("note").is_none());
        assert_eq!(r["decoding"]["pass"], true);
        // generate runs tract the same way and says so: one note line on stderr (also with
        // --quiet) and a `note` in the JSON result.
        let o = gmlp(&[
            "generate",
            path_str(&path),
            "--runtime",
            "tract",
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
            "--json",
            "-q",
        ]);
        assert!(o.status.success(), "{}", output_text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_eq!(err.trim(), format!("note: tract: {TRACT_NOTE}"));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[0]["note"], TRACT_NOTE);
        // The library refuses such a file in tract unless asked to dequantize: nothing is
        // substituted silently.
        let refused =
            gmlp_onnx::runtime::open(RuntimeKind::Tract, &path, &RuntimeOptions::default());
        let err = refused.err().expect("tract refuses 8-bit MatMulNBits");
        assert!(
            matches!(&err, gmlp_onnx::Error::RuntimeFailed { runtime, .. } if runtime == "tract"),
            "{err:?}"
        );
        let o = gmlp(&[
            "generate",
            path_str(&path),
            "--runtime",
            "ort-cpu",
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
        ]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
}
