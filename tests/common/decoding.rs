//! Helpers of the decoding tests (tests/suite/generation.rs, static_state.rs,
//! static_batch.rs): writing a model in a sequence mode, token ids, decoding in chunks, the
//! small causal configurations, greedy continuation.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gmlp_onnx::generation::Decoder;
use gmlp_onnx::generation::{Generator, Sampling};
use gmlp_onnx::gmlp::export::export_for;
use gmlp_onnx::gmlp::targets::{BuildTarget, Target};
use gmlp_onnx::gmlp::{GmlpConfig, SequenceMode, SpatialForm, Task, WeightSource};
use gmlp_onnx::onnx::writer::write_model;
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{concatenate, s, Array2, Array3, ArrayD, Axis};

use super::{rel_diff, tiny_tokens, CPU_RUNTIMES};

pub fn write_for(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    mode: SequenceMode,
    target: &BuildTarget,
    dir: &Path,
    name: &str,
) -> PathBuf {
    let model = export_for(cfg, source, "test", None, target, mode).expect("export");
    let path = dir.join(name);
    write_model(&model.graph, &model.info, &path, |_, _| {}).expect("write");
    path
}

pub fn ids_for(batch: usize, len: usize, vocab: usize, salt: usize) -> Array2<i64> {
    Array2::from_shape_fn((batch, len), |(b, t)| {
        ((b * 31 + t * 17 + salt * 7 + t * t) % vocab) as i64
    })
}

/// Feeds `ids` in `chunks` and returns the logits of every position.
pub fn decode(decoder: &mut Decoder, ids: &Array2<i64>, chunks: &[usize]) -> Array3<f32> {
    let mut parts = Vec::new();
    let mut start = 0;
    for &len in chunks {
        let logits = decoder
            .feed(ids.slice(s![.., start..start + len]))
            .unwrap_or_else(|e| panic!("{} chunk {start}+{len}: {e}", decoder.runtime_name()));
        parts.push(logits);
        start += len;
    }
    let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
    concatenate(Axis(1), &views).unwrap()
}

pub fn rel(a: &Array3<f32>, b: &Array3<f32>) -> f64 {
    rel_diff(&a.clone().into_dyn(), &b.clone().into_dyn())
}

pub fn f32_of(t: &NamedTensor) -> &ArrayD<f32> {
    match &t.value {
        TensorValue::F32(a) => a,
        other => panic!("{}: f32 expected, got {other:?}", t.name),
    }
}

/// The small causal models of tests/suite/generation.rs: gMLP and aMLP, the three spatial
/// forms, heads 1 and 2, untied head, token shift 1 and 2.
pub fn causal_configs() -> Vec<(&'static str, GmlpConfig)> {
    let mut out = Vec::new();
    for (name, spatial, attn, heads, shift) in [
        ("gmlp-gather", SpatialForm::ToeplitzGather, None, 1, 0),
        ("amlp-gather", SpatialForm::ToeplitzGather, Some(8), 1, 0),
        ("amlp-dense-heads2", SpatialForm::Dense, Some(8), 2, 0),
        (
            "gmlp-expand-heads2",
            SpatialForm::ToeplitzExpand,
            None,
            2,
            0,
        ),
        (
            "amlp-gather-shift2",
            SpatialForm::ToeplitzGather,
            Some(8),
            1,
            2,
        ),
        ("gmlp-dense-heads2-shift1", SpatialForm::Dense, None, 2, 1),
    ] {
        let mut cfg = tiny_tokens(spatial, attn, true);
        cfg.heads = heads;
        cfg.shift_tokens = shift;
        if heads > 1 {
            if let Task::Tokens { tied_embedding, .. } = &mut cfg.task {
                *tied_embedding = false;
            }
        }
        out.push((name, cfg));
    }
    out
}

/// The builds every decoding check runs on: opset 17 (`ScatterND`, both runtimes), the
/// portable target (opset 13, Toeplitz W expanded, primitive LayerNorm) and opset 24
/// (`TensorScatter`: ONNX Runtime only).
pub fn targets(cfg: &GmlpConfig) -> Vec<(&'static str, GmlpConfig, BuildTarget, Vec<RuntimeKind>)> {
    let mut portable = cfg.clone();
    portable.spatial = Target::Portable.spatial_for(portable.spatial);
    vec![
        (
            "opset17",
            cfg.clone(),
            BuildTarget::at_opset(17),
            CPU_RUNTIMES.to_vec(),
        ),
        (
            "portable",
            portable,
            BuildTarget::resolve(Target::Portable, None).unwrap(),
            CPU_RUNTIMES.to_vec(),
        ),
        (
            "opset24",
            cfg.clone(),
            BuildTarget::at_opset(24),
            vec![RuntimeKind::OrtCpu],
        ),
    ]
}

/// Greedy continuation of every sequence by the library's generation loop: prompts fed
/// together, then `steps` tokens; with the logits of every pick and each sequence's
/// position after it.
pub fn greedy(
    decoder: Decoder,
    prompts: &[Vec<i64>],
    steps: usize,
) -> (Vec<Vec<i64>>, Vec<Array2<f32>>, Vec<usize>) {
    let mut all = Vec::new();
    let mut generator = Generator::new(decoder, Sampling::GREEDY).unwrap();
    let generation = generator
        .generate_observing(prompts, steps, &mut |logits| all.push(logits.to_owned()))
        .unwrap();
    let positions = generator.decoder().positions().to_vec();
    (generation.tokens, all, positions)
}
