//! The block variants of the other public gMLP implementations (g-mlp-gpt: gating heads,
//! gate activations, local windows, axial folds, reversible stacks; gmlp-tinygrad: RMSNorm,
//! tanh GELU, no spatial bias, attention biases, backbone) on seeded weights: the emitted
//! graph in tract and ONNX Runtime against the independent f64 reference, which computes
//! windows and folds as upstream does (padding, blocks, real sub-sequences), at the full
//! length, at a shorter length, with a fixed length, and decoded with state in pieces.

use crate::common::*;
use gmlp_onnx::gmlp::{
    GateAct, GeluForm, GmlpConfig, NormKind, SequenceMode, SpatialForm, StackKind, Task,
    TokenMixing,
};

/// A causal token model: n = 16, vocabulary 50, d 16, f 32, untied head.
fn causal(attn: Option<usize>, heads: usize) -> GmlpConfig {
    let mut cfg = tiny_tokens(SpatialForm::Dense, attn, true);
    cfg.heads = heads;
    if let Task::Tokens {
        seq_len,
        tied_embedding,
        ..
    } = &mut cfg.task
    {
        *seq_len = 16;
        *tied_embedding = false;
    }
    cfg
}

fn mixing(blocks: &[(Option<usize>, usize)]) -> Vec<TokenMixing> {
    blocks
        .iter()
        .map(|&(window, fold)| TokenMixing { window, fold })
        .collect()
}

/// Every causal token variant the upstream implementations have.
fn token_variants() -> Vec<(&'static str, GmlpConfig)> {
    let mut out = Vec::new();
    let mut v = causal(Some(8), 1);
    v.block.gate_act = GateAct::Tanh;
    out.push(("gate-tanh-attn", v));
    let mut v = causal(Some(8), 2);
    v.block.gate_act = GateAct::Silu;
    out.push(("heads2-attn-gate-silu", v));
    let mut v = causal(Some(8), 2);
    v.block.token_mixing = mixing(&[(Some(4), 1), (Some(4), 1)]);
    out.push(("window4-everywhere-attn-heads2", v));
    let mut v = causal(Some(8), 1);
    v.block.token_mixing = mixing(&[(Some(4), 1), (None, 1)]);
    v.block.gate_act = GateAct::Sigmoid;
    out.push(("window4-then-global-attn", v));
    let mut v = causal(Some(8), 1);
    v.block.token_mixing = mixing(&[(None, 2), (None, 1)]);
    out.push(("fold2-global-attn", v));
    let mut v = causal(Some(8), 2);
    v.block.token_mixing = mixing(&[(Some(2), 3), (None, 2)]);
    out.push(("fold3-window2-attn-heads2", v));
    let mut v = causal(None, 1);
    v.block.token_mixing = mixing(&[(Some(4), 2), (None, 1)]);
    v.block.stack = StackKind::Reversible { ff_inner: 12 };
    out.push(("reversible-fold2-window4", v));
    let mut v = causal(Some(8), 1);
    v.block.stack = StackKind::Reversible { ff_inner: 10 };
    v.block.gate_act = GateAct::Gelu;
    out.push(("reversible-attn", v));
    let mut v = causal(Some(8), 1);
    v.block.norm = NormKind::RmsNorm;
    v.block.gelu = GeluForm::Tanh;
    v.block.spatial_bias = false;
    v.block.attn_qkv_bias = true;
    v.block.gate_act = GateAct::Relu;
    out.push(("rms-tanh-no-spatial-bias-qkv-bias", v));
    out
}

#[test]
fn local_windows_keep_only_the_rows_they_can_still_see() {
    let (_, cfg) = token_variants()
        .into_iter()
        .find(|(n, _)| *n == "fold3-window2-attn-heads2")
        .unwrap();
    let info = gmlp_onnx::gmlp::interface::DecodingInfo::of(&cfg, SequenceMode::Growing).unwrap();
    let windows: Vec<(String, Option<usize>)> = info
        .state
        .iter()
        .map(|s| (s.past.clone(), s.window))
        .collect();
    // Block 0: window 2, fold 3 → (2·2 − 1)·3 = 9 rows of u and keys (a local attention's
    // values are its keys); the fold's convolution keeps 3 − 1 = 2 outputs. Block 1: global inside a fold of 2 (grows),
    // its convolution 1 output.
    assert_eq!(
        windows,
        [
            ("past_sgu.0".to_string(), Some(9)),
            ("past_key.0".to_string(), Some(9)),
            ("past_fold.0".to_string(), Some(2)),
            ("past_sgu.1".to_string(), None),
            ("past_key.1".to_string(), None),
            ("past_value.1".to_string(), None),
            ("past_fold.1".to_string(), Some(1)),
        ]
    );
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use crate::common::decoding::{decode, rel};
    use gmlp_onnx::generation::Decoder;
    use gmlp_onnx::gmlp::export::export_for;
    use gmlp_onnx::gmlp::reference::{forward_backbone, forward_tokens};
    use gmlp_onnx::gmlp::targets::BuildTarget;
    use gmlp_onnx::gmlp::WeightSource;
    use gmlp_onnx::onnx::writer::write_model;
    use gmlp_onnx::rng::SplitMix64;
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use ndarray::s;
    use ndarray::{Array2, Array3};
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// Runtimes against the f64 reference (f32 rounding only).
    const REFERENCE_RTOL: f64 = 1e-5;

    fn write(cfg: &GmlpConfig, mode: SequenceMode, opset: i64, dir: &Path, name: &str) -> PathBuf {
        let source: Arc<dyn WeightSource> = Arc::new(spread(11));
        let target = BuildTarget::at_opset(opset);
        let model = export_for(cfg, source, "test", None, &target, mode).expect("export");
        let path = dir.join(name);
        write_model(&model.graph, &model.info, &path, |_, _| {}).expect("write");
        path
    }

    fn ids(batch: usize, len: usize, vocab: usize) -> Array2<i64> {
        let mut rng = SplitMix64::keyed(3, "variant ids");
        Array2::from_shape_fn((batch, len), |_| rng.below(vocab as u64) as i64)
    }

    fn logits_of(
        kind: gmlp_onnx::runtime::RuntimeKind,
        path: &Path,
        ids: &Array2<i64>,
    ) -> Array3<f32> {
        let feed = [NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(ids.clone().into_dyn()),
        }];
        f32_output(&run(kind, path, &feed))
            .into_dimensionality()
            .unwrap()
    }

    #[test]
    fn token_variants_agree_with_the_reference_whole_short_and_fixed() {
        let dir = tempfile::tempdir().unwrap();
        for (name, cfg) in token_variants() {
            let source = spread(11);
            let whole = ids(2, 16, 50);
            let reference = forward_tokens(&cfg, &source, whole.view()).unwrap();
            let spread_out = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(spread_out > 1e-2, "{name}: outputs near zero");
            let variable = write(&cfg, SequenceMode::Variable, 17, dir.path(), "v.onnx");
            let fixed = write(&cfg, SequenceMode::Fixed, 17, dir.path(), "f.onnx");
            onnx_check(&[variable.clone(), fixed.clone()]);
            // 11 tokens: not a multiple of any window or fold.
            let short = whole.slice(s![.., ..11]).to_owned();
            let short_reference = forward_tokens(&cfg, &source, short.view()).unwrap();
            let d = rel(
                &short_reference,
                &reference.slice(s![.., ..11, ..]).to_owned(),
            );
            assert!(d <= 1e-6, "{name}: the reference is not causal ({d:e})");
            let mut outs = Vec::new();
            for kind in CPU_RUNTIMES {
                for (form, path) in [("variable", &variable), ("fixed", &fixed)] {
                    let out = logits_of(kind, path, &whole);
                    let d = rel(&out, &reference);
                    assert!(
                        d <= REFERENCE_RTOL,
                        "{name} {form} in {}: {d:e}",
                        kind.name()
                    );
                    outs.push(out);
                }
                let out = logits_of(kind, &variable, &short);
                let d = rel(&out, &short_reference);
                assert!(
                    d <= REFERENCE_RTOL,
                    "{name} short in {}: {d:e}",
                    kind.name()
                );
            }
            let d = rel(&outs[0], &outs[2]);
            assert!(d <= 1e-5, "{name}: tract vs ONNX Runtime {d:e}");
        }
    }

    #[test]
    fn token_variants_decode_with_state_in_pieces() {
        let dir = tempfile::tempdir().unwrap();
        for (name, cfg) in token_variants() {
            let path = write(&cfg, SequenceMode::Growing, 17, dir.path(), "p.onnx");
            onnx_check(std::slice::from_ref(&path));
            let whole = ids(2, 16, 50);
            let reference = forward_tokens(&cfg, &spread(11), whole.view()).unwrap();
            for kind in CPU_RUNTIMES {
                let mut decoder = Decoder::open(kind, &path, &options(), 2)
                    .unwrap_or_else(|e| panic!("{name} in {}: {e}", kind.name()));
                for chunks in [&[16][..], &[5, 1, 1, 3, 6], &[1; 16], &[7, 9]] {
                    decoder.reset().unwrap();
                    let out = decode(&mut decoder, &whole, chunks);
                    let d = rel(&out, &reference);
                    assert!(
                        d <= REFERENCE_RTOL,
                        "{name} {} {chunks:?}: {d:e}",
                        kind.name()
                    );
                    // A window keeps at most its rows; every other state all 16.
                    for (state, info) in decoder
                        .state()
                        .unwrap()
                        .iter()
                        .zip(&decoder.model().info.state)
                    {
                        let TensorValue::F32(a) = &state.value else {
                            panic!("f32 state")
                        };
                        let rows = info.window.map_or(16, |w| w.min(16));
                        assert_eq!(a.shape()[1], rows, "{name}: {}", info.past);
                    }
                }
            }
        }
    }

    /// gmlp-tinygrad's kind of model: a backbone on inputs_embeds with RMSNorm, tanh GELU, no
    /// spatial bias and attention biases, bidirectional and causal.
    #[test]
    fn backbones_agree_with_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        for causal in [false, true] {
            for attn in [None, Some(8)] {
                let mut cfg = tiny_tokens(SpatialForm::Dense, attn, causal);
                cfg.task = Task::Backbone { seq_len: 12 };
                cfg.norm_eps = 1e-6;
                cfg.sgu_norm_eps = 1e-6;
                cfg.block.norm = NormKind::RmsNorm;
                cfg.block.gelu = GeluForm::Tanh;
                cfg.block.spatial_bias = false;
                cfg.block.attn_qkv_bias = true;
                for opset in [17, 20] {
                    let path = write(&cfg, SequenceMode::Fixed, opset, dir.path(), "b.onnx");
                    onnx_check(std::slice::from_ref(&path));
                    let mut rng = SplitMix64::keyed(5, "embeds");
                    let x = Array3::from_shape_fn((2, 12, 16), |_| rng.uniform(-1.0, 1.0) as f32);
                    let reference = forward_backbone(&cfg, &spread(11), x.view()).unwrap();
                    let feed = [NamedTensor {
                        name: "inputs_embeds".into(),
                        value: TensorValue::F32(x.into_dyn()),
                    }];
                    for kind in CPU_RUNTIMES {
                        let outputs = run(kind, &path, &feed);
                        assert_eq!(outputs[0].name, "last_hidden_state");
                        let out: Array3<f32> = f32_output(&outputs).into_dimensionality().unwrap();
                        let d = rel(&out, &reference);
                        assert!(
                            d <= REFERENCE_RTOL,
                            "backbone causal={causal} attn={attn:?} opset {opset} in {}: {d:e}",
                            kind.name()
                        );
                    }
                }
            }
        }
    }
}
