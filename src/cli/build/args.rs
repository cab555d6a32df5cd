//! The command line of `gmlp-onnx build`: its flags (clap definitions; docs/cli.md is
//! generated from them) and their translation into the library's types.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use gmlp_onnx::gmlp::targets::Target;
use gmlp_onnx::gmlp::{GateAct, SpatialForm};

use crate::cli::triton::TritonFlags;

#[derive(Clone, Copy, ValueEnum)]
pub enum SpatialArg {
    /// A free n×n W.
    Dense,
    /// Toeplitz W stored expanded to n×n.
    ToeplitzExpand,
    /// Toeplitz W stored as its 2n−1 vector and gathered in the graph.
    ToeplitzGather,
}

/// `--target`: a deployment profile (see [`Target`]).
#[derive(Clone, Copy, Default, ValueEnum)]
pub enum TargetArg {
    /// ONNX Runtime >= 1.15, tract, OpenVINO, onnxruntime-node, onnx.reference, OpenCV 5: opset 17, LayerNormalization.
    #[default]
    Ort,
    /// ONNX Runtime <= 1.14: IR <= 8, opset <= 18.
    OrtLegacy,
    /// ONNX Runtime 1.31 alone, CPU or CUDA: opset 24, the static state written by TensorScatter, every node of a step on the GPU (CUDA graphs); not tract.
    OrtGpu,
    /// Widest reach (ONNX Runtime 1.14, candle-onnx, OpenCV 4.x, onnx2torch): opset 13, LayerNorm as primitive ops, Toeplitz expanded.
    Portable,
    /// OpenCV 4.x dnn: Toeplitz expanded (no Gather feeding a MatMul).
    Opencv4,
    /// candle-onnx: LayerNorm as primitive ops, means as ReduceSum then Div.
    Candle,
}

impl TargetArg {
    /// The library's target profile.
    pub(super) fn target(self) -> Target {
        match self {
            TargetArg::Ort => Target::Ort,
            TargetArg::OrtLegacy => Target::OrtLegacy,
            TargetArg::OrtGpu => Target::OrtGpu,
            TargetArg::Portable => Target::Portable,
            TargetArg::Opencv4 => Target::Opencv4,
            TargetArg::Candle => Target::Candle,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    /// Everything in f32.
    F32,
    /// Weights and MatMuls in f16; LayerNorm, softmax and logits in f32.
    F16,
    /// Projections, spatial MatMul and vocabulary head in int8 (per output channel),
    /// dynamically quantized activations; LayerNorm, softmax, residual and logits in f32.
    Int8,
    /// Weight-only int4 projections (blocks of 32, ONNX Runtime's MatMulNBits), the blocks'
    /// output projections and the vocabulary head in 8 bits (blocks of 128); activations,
    /// embedding, spatial MatMul, norms and logits in f32.
    Int4,
    /// Weight-only int8 projections (blocks of 32, MatMulNBits with 8 bits) and vocabulary
    /// head (blocks of 128); activations, embedding, spatial MatMul, norms and logits in f32.
    Int8WeightOnly,
}

/// The state form of `--with-past` (docs/static-state.md).
#[derive(Clone, Copy, ValueEnum)]
pub enum PastArg {
    /// Fixed-size state [batch, n, ·] written in place, a `position` input [batch]
    /// (batches sequences at different positions; the default where the model and the
    /// target allow it).
    Static,
    /// State that grows with every token: past_* [batch, P, ·] in, present_* = past
    /// followed by the new rows out.
    Growing,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum InitArg {
    /// The paper's init: W near zero, b = 1 (identity gating at start).
    Paper,
    /// Every parameter away from its trivial value (for testing exports).
    Spread,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// Recognize the layout from tensor names.
    Auto,
    /// This project's own names (see docs/checkpoints.md).
    Native,
    /// timm's gMLP (MlpMixer with SpatialGatingBlock).
    Timm,
    /// g-mlp-pytorch (gMLP, gMLPVision).
    Lucidrains,
    /// g-mlp-gpt (gMLPGPT, causal language model).
    GmlpGpt,
    /// gmlp-tinygrad (gMLP backbone: inputs_embeds → last_hidden_state).
    Tinygrad,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum GateActArg {
    /// No activation (upstream's default `nn.Identity()`).
    Identity,
    /// tanh.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// max(x, 0).
    Relu,
    /// Exact GELU.
    Gelu,
    /// x·sigmoid(x).
    Silu,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["preset", "weights"])))]
pub struct BuildArgs {
    /// Preset name (see `gmlp-onnx presets`).
    #[arg(long)]
    pub preset: Option<String>,
    /// Trained checkpoint: safetensors (F32, F16, BF16, F64), NumPy .npz (float32, float64) or PyTorch .pt/.pth/.bin from torch.save; the architecture is read from it.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Layout of --weights.
    #[arg(long, value_enum, default_value = "auto")]
    pub weights_format: FormatArg,
    /// Accept checkpoint tensors the model does not use.
    #[arg(long)]
    pub allow_unused: bool,
    /// Relative tolerance (of max|W|) for accepting a dense W as Toeplitz [default: 1e-5].
    #[arg(long)]
    pub toeplitz_tol: Option<f32>,
    /// g-mlp-pytorch token shift the checkpoint was trained with (not visible in weights).
    #[arg(long, default_value_t = 0)]
    pub shift_tokens: usize,
    /// Gate activation the checkpoint was trained with: g-mlp-pytorch's and g-mlp-gpt's `act` (not visible in weights).
    #[arg(long, value_enum, default_value = "identity")]
    pub gate_act: GateActArg,
    /// Also write the model's weights in the native layout (safetensors).
    #[arg(long)]
    pub save_weights: Option<PathBuf>,
    /// Output ONNX file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Spatial weight form (default: toeplitz-gather for token presets, dense for vision).
    #[arg(long, value_enum)]
    pub spatial: Option<SpatialArg>,
    /// Deployment profile: picks the opset, spatial form and op forms its consumers accept (explicit --opset / --spatial win).
    #[arg(long, value_enum, default_value = "ort")]
    pub target: TargetArg,
    /// ONNX opset (13..=24) [default: 13 for --target portable, else 17]; LayerNormalization from 17 (primitive ops below), `Gelu` from 20 (the exact erf form below).
    #[arg(long)]
    pub opset: Option<i64>,
    /// Storage and compute type.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
    /// Seed of the weights (the same seed gives the same weights whatever the spatial form).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Initialization scheme.
    #[arg(long, value_enum, default_value = "paper")]
    pub init: InitArg,
    /// Number of blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Channel width d_model.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Width d_ffn of the first projection (even; the gate halves it).
    #[arg(long)]
    pub d_ffn: Option<usize>,
    /// Tiny-attention size (aMLP); 0 removes the attention.
    #[arg(long)]
    pub attn_dim: Option<usize>,
    /// Tokens n (token models).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Vocabulary size (token models).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Classes (vision models).
    #[arg(long)]
    pub num_classes: Option<usize>,
    /// Image side (vision models).
    #[arg(long)]
    pub image_size: Option<usize>,
    /// Patch side (vision models).
    #[arg(long)]
    pub patch_size: Option<usize>,
    /// Input channels (vision models).
    #[arg(long)]
    pub in_chans: Option<usize>,
    /// Causal model: W[i, j] = 0 and attention masked for j > i.
    #[arg(long)]
    pub causal: bool,
    /// Causal token models: keep the static [batch, n] input (default: any length 1..=n;
    /// `--target portable` and `opencv4` keep it static).
    #[arg(long, conflicts_with = "with_past")]
    pub fixed_seq: bool,
    /// Causal token models: one graph for prefill and single steps, with each block's
    /// state as past_* inputs and present_* outputs: `static` (fixed size [batch, n, ·], a
    /// per-sequence `position` input, new rows written in place: faster steps, batches of
    /// sequences at different positions) or `growing` (past_* [batch, P, ·], present_* one
    /// row longer per token: the form earlier builds wrote) [default: static; growing,
    /// with a note, for windowed or folded blocks and --target portable/candle/opencv4];
    /// see docs/static-state.md and docs/generation.md.
    #[arg(long, value_enum, num_args = 0..=1)]
    pub with_past: Option<Option<PastArg>>,
    /// After writing, run the model in tract and ONNX Runtime and compare.
    #[arg(long)]
    pub validate: bool,
    /// Runtimes for --validate.
    #[arg(long, default_value = "tract,ort-cpu")]
    pub runtimes: String,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else a Python environment's onnxruntime; see `gmlp-onnx doctor`).
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
    /// --validate: relative tolerance [default: by precision: f32 1e-4, f16 1e-2].
    #[arg(long, requires = "validate")]
    pub rtol: Option<f64>,
    /// --validate: absolute tolerance [default: by precision: f32 1e-6, f16 1e-4].
    #[arg(long, requires = "validate")]
    pub atol: Option<f64>,
    /// Write the weights to OUT.onnx.data beside the model even under 2 GiB (always done above).
    #[arg(long)]
    pub external_data: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Also put the model into this Triton model repository (see `gmlp-onnx triton`).
    #[arg(long)]
    pub triton_repo: Option<PathBuf>,
    /// The --triton-* options of the repository.
    #[command(flatten)]
    pub triton: TritonFlags,
}

/// The library's gate activation for `--gate-act`.
pub(super) fn gate_act(a: GateActArg) -> GateAct {
    match a {
        GateActArg::Identity => GateAct::Identity,
        GateActArg::Tanh => GateAct::Tanh,
        GateActArg::Sigmoid => GateAct::Sigmoid,
        GateActArg::Relu => GateAct::Relu,
        GateActArg::Gelu => GateAct::Gelu,
        GateActArg::Silu => GateAct::Silu,
    }
}

/// The library's spatial form for `--spatial`.
pub(super) fn spatial_form(s: SpatialArg) -> SpatialForm {
    match s {
        SpatialArg::Dense => SpatialForm::Dense,
        SpatialArg::ToeplitzExpand => SpatialForm::ToeplitzExpand,
        SpatialArg::ToeplitzGather => SpatialForm::ToeplitzGather,
    }
}
