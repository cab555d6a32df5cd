//! The command line of `gmlp-onnx build`: its flags (clap definitions; docs/cli.md is
//! generated from them). The values of enum flags are the library's own enums (clap's
//! `ValueEnum`, see `gmlp_onnx::spelling`; `--with-past`'s is `pipeline::PastForm`), except
//! the one below: `--weights-format`, a layout or `auto`.

use std::path::PathBuf;
use std::sync::OnceLock;

use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};

use gmlp_onnx::checkpoint::Format;
use gmlp_onnx::gmlp::targets::Target;
use gmlp_onnx::gmlp::{GateAct, InitScheme, Precision, SpatialForm};
use gmlp_onnx::pipeline::PastForm;

use crate::cli::triton::TritonFlags;

/// `--weights-format`: a checkpoint layout, or `auto` (`None`: recognized from the tensor
/// names). Its values are `auto` and those of [`Format`].
#[derive(Clone, Copy)]
pub struct FormatArg(pub Option<Format>);

impl ValueEnum for FormatArg {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: OnceLock<Vec<FormatArg>> = OnceLock::new();
        ALL.get_or_init(|| {
            std::iter::once(None)
                .chain(Format::value_variants().iter().copied().map(Some))
                .map(FormatArg)
                .collect()
        })
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self.0 {
            None => Some(PossibleValue::new("auto").help("Recognize the layout from tensor names")),
            Some(format) => format.to_possible_value(),
        }
    }
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
    pub gate_act: GateAct,
    /// Also write the model's weights in the native layout (safetensors).
    #[arg(long)]
    pub save_weights: Option<PathBuf>,
    /// Output ONNX file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Spatial weight form (default: toeplitz-gather for token presets, dense for vision).
    #[arg(long, value_enum)]
    pub spatial: Option<SpatialForm>,
    /// Deployment profile: picks the opset, spatial form and op forms its consumers accept (explicit --opset / --spatial win).
    #[arg(long, value_enum, default_value = "ort")]
    pub target: Target,
    /// ONNX opset (13..=24) [default: 13 for --target portable, else 17]; LayerNormalization from 17 (primitive ops below), `Gelu` from 20 (the exact erf form below).
    #[arg(long)]
    pub opset: Option<i64>,
    /// Storage and compute type.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Precision,
    /// Seed of the weights (the same seed gives the same weights whatever the spatial form).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Initialization scheme.
    #[arg(long, value_enum, default_value = "paper")]
    pub init: InitScheme,
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
    pub with_past: Option<Option<PastForm>>,
    /// After writing, run the model in tract and ONNX Runtime and compare.
    #[arg(long)]
    pub validate: bool,
    /// Runtimes for --validate.
    #[command(flatten)]
    pub runtimes: crate::cli::flags::RuntimeList,
    /// --validate: ONNX Runtime's library, threads and device.
    #[command(flatten)]
    pub ort: crate::cli::flags::OrtFlags,
    /// --validate: the comparison's bounds.
    #[command(flatten)]
    pub tolerance: crate::cli::flags::ToleranceFlags,
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
    /// The token that ends a sequence (causal token models): recorded in the file, where `generate` stops and a genai folder declares it.
    #[arg(long, value_name = "ID")]
    pub eos_token_id: Option<i64>,
    /// Also write an onnxruntime-genai model folder here (needs --with-past; see `gmlp-onnx genai`).
    #[arg(long, value_name = "DIR")]
    pub genai_dir: Option<PathBuf>,
}
