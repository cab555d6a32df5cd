//! Helpers of the decoding tests (tests/suite/generation.rs, static_state.rs,
//! static_batch.rs): writing a model in a sequence mode, token ids, decoding in chunks, the
//! small causal configurations, the inputs of a static-state run, the causal fixtures
//! against PyTorch, greedy continuation.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gmlp_onnx::checkpoint::Import;
use gmlp_onnx::generation::Decoder;
use gmlp_onnx::generation::{Generator, Sampling};
use gmlp_onnx::gmlp::export::export_for;
use gmlp_onnx::gmlp::interface::DecodingInfo;
use gmlp_onnx::gmlp::reference::forward_tokens;
use gmlp_onnx::gmlp::targets::{BuildTarget, Target};
use gmlp_onnx::gmlp::{fused_gap, GmlpConfig, SequenceMode, SpatialForm, Task, WeightSource};
use gmlp_onnx::onnx::writer::write_model;
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{concatenate, s, Array1, Array2, Array3, ArrayD, Axis, IxDyn};

use super::{onnx_check, rel_diff, spread, tiny_tokens, Fixture, CPU_RUNTIMES, PYTORCH_RTOL};

/// Writes `cfg` with `source`'s weights in `mode` for `target` to `dir/name`.
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

/// Runs the onnx checker on the file at `path` and returns the path.
pub fn checked(path: PathBuf) -> PathBuf {
    onnx_check(std::slice::from_ref(&path));
    path
}

/// Token ids [2, 12] below 50 (the batch, n and vocabulary of [`causal_configs`]) made
/// with `salt`, and the f64 reference's logits of `cfg` with `source`'s weights on them.
pub fn ids_and_reference(
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    salt: usize,
) -> (Array2<i64>, Array3<f32>) {
    let ids = ids_for(2, 12, 50, salt);
    let reference = forward_tokens(cfg, source, ids.view()).unwrap();
    (ids, reference)
}

/// The small aMLP of [`causal_configs`] (one head, attention) with spread(3) weights,
/// written at opset 17 in `mode` to `dir/name`.
pub fn write_small_amlp(mode: SequenceMode, dir: &Path, name: &str) -> PathBuf {
    let (_, cfg) = causal_configs().swap_remove(1);
    let target = BuildTarget::at_opset(17);
    write_for(&cfg, Arc::new(spread(3)), mode, &target, dir, name)
}

/// The inputs of one run of a static-state file described by `info`: `tokens` ids of 1 per
/// sequence, each sequence's position, and every state buffer zero with `rows` rows.
pub fn static_feed(
    info: &DecodingInfo,
    tokens: usize,
    positions: &[i64],
    rows: usize,
) -> Vec<NamedTensor> {
    let batch = positions.len();
    let mut feed = vec![
        NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(Array2::<i64>::ones((batch, tokens)).into_dyn()),
        },
        NamedTensor {
            name: "position".into(),
            value: TensorValue::I64(Array1::from(positions.to_vec()).into_dyn()),
        },
    ];
    feed.extend(info.state.iter().map(|s| NamedTensor {
        name: s.past.clone(),
        value: TensorValue::F32(ArrayD::zeros(IxDyn(&[batch, rows, s.width]))),
    }));
    feed
}

/// Token ids [batch, len] that differ by sequence, position and `salt`, below `vocab`.
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

/// [`rel_diff`] of two [batch, positions, vocabulary] logits.
pub fn rel(a: &Array3<f32>, b: &Array3<f32>) -> f64 {
    rel_diff(&a.clone().into_dyn(), &b.clone().into_dyn())
}

/// The f32 array of a tensor (panics on another type).
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

/// The static-state builds every decoding check runs on: opset 17 (`ScatterND`, both
/// runtimes), the portable target (opset 13, Toeplitz W expanded, primitive LayerNorm),
/// opset 24 (`TensorScatter`: ONNX Runtime only), `--target tract` (opset 17, the state read
/// as written: both runtimes) and `--target onnxruntime` (opset 24 in ONNX Runtime's fused
/// kernels: ONNX Runtime only) where its kernels express the model (it refuses the others:
/// tests/suite/static_state.rs checks that).
pub fn targets(cfg: &GmlpConfig) -> Vec<(&'static str, GmlpConfig, BuildTarget, Vec<RuntimeKind>)> {
    let mut portable = cfg.clone();
    portable.spatial = Target::Portable.spatial_for(portable.spatial);
    let onnxruntime = BuildTarget::resolve(Target::OnnxRuntime, None).unwrap();
    let mut out = vec![
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
        (
            "tract",
            cfg.clone(),
            BuildTarget::resolve(Target::Tract, None).unwrap(),
            CPU_RUNTIMES.to_vec(),
        ),
    ];
    if fused_gap(cfg, SequenceMode::Static, onnxruntime.opset).is_none() {
        out.push((
            "ort-gpu",
            cfg.clone(),
            onnxruntime,
            vec![RuntimeKind::OrtCpu],
        ));
    }
    out
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

/// The causal g-mlp-pytorch fixtures: gMLP, aMLP, and aMLP with shift_tokens = 2.
pub const LUCID_CAUSAL: [&str; 3] = [
    "lucid_tokens_causal",
    "lucid_amlp_causal",
    "lucid_shift_causal",
];

/// A causal trained fixture as the decoding tests use it: the import of its checkpoint,
/// its input ids, PyTorch's logits, and the chunks the ids are fed in (half the positions
/// as the prompt, 8 single steps, the rest as one chunk).
pub struct CausalFixture {
    /// The fixture's name under fixtures/.
    pub name: &'static str,
    /// The configuration the import found.
    pub cfg: GmlpConfig,
    /// The imported weights.
    pub weights: Arc<dyn WeightSource>,
    /// The input ids [batch, n].
    pub ids: Array2<i64>,
    /// PyTorch's logits [batch, n, vocabulary].
    pub pytorch: Array3<f32>,
    /// Prompt, single steps, last chunk: n tokens in all.
    pub chunks: Vec<usize>,
}

impl CausalFixture {
    /// Opens fixtures/`name` and imports its checkpoint with the fixture's hints.
    pub fn open(name: &'static str) -> CausalFixture {
        let fx = Fixture::open(name);
        let import = Import::open(&fx.checkpoint(), &fx.hints()).unwrap();
        let cfg = import.config.clone();
        let weights: Arc<dyn WeightSource> = Arc::new(import.weights(&cfg));
        let ids = fx.ids("input_ids");
        let n = ids.ncols();
        let mut chunks = vec![n / 2];
        chunks.extend(std::iter::repeat_n(1, 8));
        chunks.push(n - n / 2 - 8);
        CausalFixture {
            name,
            cfg,
            weights,
            ids,
            pytorch: fx.logits().into_dimensionality().unwrap(),
            chunks,
        }
    }

    /// Asserts `logits` equal PyTorch's within [`PYTORCH_RTOL`], all of them and every
    /// position on its own (`what` names the run); returns the overall difference.
    pub fn assert_matches_pytorch(&self, logits: &Array3<f32>, what: &str) -> f64 {
        let d = rel(logits, &self.pytorch);
        assert!(d <= PYTORCH_RTOL, "{} {what}: {d:e}", self.name);
        for t in 0..self.ids.ncols() {
            let d = rel_diff(
                &logits.slice(s![.., t, ..]).to_owned().into_dyn(),
                &self.pytorch.slice(s![.., t, ..]).to_owned().into_dyn(),
            );
            assert!(
                d <= PYTORCH_RTOL,
                "{} {what} position {t}: {d:e}",
                self.name
            );
        }
        d
    }
}
