//! The gMLP / aMLP architecture description and its size checks (the paper's presets are in
//! `gmlp/presets.rs`, which builds on this).
//!
//! Shapes follow the paper's notation (Liu et al. 2021, §2): `n` tokens, `d` = d_model,
//! `f` = d_ffn, `e` = f/2 channels per half of the gate, `a` = tiny-attention size.

mod block;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

pub use block::{BlockOptions, GateAct, GeluForm, NormKind, StackKind, TokenMixing};

use crate::error::{Error, Result};
use crate::onnx::graph::ElemType;
use crate::spelling::spelling;

/// What the network reads and predicts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Task {
    /// Masked / causal language model: `input_ids` int64 [batch, n] → `logits` [batch, n, vocab],
    /// with the output projection tied to the token embedding (plus an output bias).
    Tokens {
        /// Vocabulary size.
        vocab_size: usize,
        /// Number of tokens n (the spatial weight is n×n).
        seq_len: usize,
        /// Output projection tied to the token embedding (the paper's MLM models); when
        /// false the head has its own weight (g-mlp-pytorch's `to_logits.1`).
        #[serde(default = "default_true")]
        tied_embedding: bool,
    },
    /// Image classifier (ViT-style patches): `pixel_values` f32 [batch, C, H, W] →
    /// `logits` [batch, classes]; mean over tokens before the classifier.
    Vision {
        /// Height = width of the input image.
        image_size: usize,
        /// Side of the square, non-overlapping patches.
        patch_size: usize,
        /// Input channels C.
        in_chans: usize,
        /// Number of classes.
        num_classes: usize,
    },
    /// The blocks alone, without embedding or head (gmlp-tinygrad's `gMLP`):
    /// `inputs_embeds` f32 [batch, n, d] → `last_hidden_state` f32 [batch, n, d].
    Backbone {
        /// Number of tokens n.
        seq_len: usize,
    },
}

/// How the spatial weight W (n×n) of each gating unit is parameterized and emitted
/// (`--spatial`; each variant's first doc paragraph is its `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SpatialForm {
    /// A free n×n W.
    ///
    /// Stored as a dense initializer (vision models).
    Dense,
    /// Toeplitz W stored expanded to n×n.
    ///
    /// 2n−1 parameters (paper §4), expanded to a dense n×n initializer.
    ToeplitzExpand,
    /// Toeplitz W stored as its 2n−1 vector and gathered in the graph.
    ///
    /// The graph builds `W[i, j] = w[j − i + n − 1]` with one `Gather` from a shared int64
    /// index table.
    ToeplitzGather,
}

impl SpatialForm {
    /// True for the two Toeplitz forms (2n−1 parameters per layer).
    pub fn is_toeplitz(self) -> bool {
        !matches!(self, SpatialForm::Dense)
    }
    /// The command-line and metadata spelling.
    pub fn name(self) -> String {
        spelling(&self)
    }
}

/// Storage and compute type of an emitted model (`--dtype`; each variant's first doc
/// paragraph is its `--help` line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// Weights and MatMuls in f16; LayerNorm, softmax and logits in f32.
    ///
    /// Activations in f16 too; LayerNorm keeps its scale and shift in f32.
    F16,
    /// Projections, spatial MatMul and vocabulary head in int8 (per output channel),
    /// dynamically quantized activations; LayerNorm, softmax, residual and logits in f32.
    ///
    /// Symmetric per output channel, run as dynamically quantized integer MatMuls
    /// (`DynamicQuantizeLinear → MatMulInteger → scale`; see [`crate::gmlp::quantize`]).
    Int8,
    /// Weight-only int4 projections (blocks of 32, ONNX Runtime's MatMulNBits), the blocks'
    /// output projections and the vocabulary head in 8 bits (blocks of 128); activations,
    /// embedding, spatial MatMul, norms and logits in f32.
    ///
    /// Blocks along K with one f16-exact scale per block, run as ONNX Runtime's
    /// `com.microsoft.MatMulNBits` (see [`crate::onnx::nbits`] and docs/quantization.md).
    Int4,
    /// Weight-only int8 projections (blocks of 32, MatMulNBits with 8 bits) and vocabulary
    /// head (blocks of 128); activations, embedding, spatial MatMul, norms and logits in f32.
    ///
    /// 8-bit codes, one f16-exact scale per block (docs/quantization.md).
    Int8WeightOnly,
}

impl Precision {
    /// The element type of activations and of the weights that are not quantized.
    pub fn elem(self) -> ElemType {
        match self {
            Precision::F32 | Precision::Int8 | Precision::Int4 | Precision::Int8WeightOnly => {
                ElemType::F32
            }
            Precision::F16 => ElemType::F16,
        }
    }

    /// The name used by `--dtype` and in the configuration JSON.
    pub fn name(self) -> String {
        spelling(&self)
    }
}

/// A complete gMLP / aMLP architecture (everything needed to emit the graph).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GmlpConfig {
    /// Input and head.
    pub task: Task,
    /// Number of blocks L.
    pub layers: usize,
    /// Channel width d.
    pub d_model: usize,
    /// Width f of the first projection; the gate halves it (e = f/2).
    pub d_ffn: usize,
    /// Size a of the tiny single-head attention (aMLP); `None` for gMLP.
    pub attn_dim: Option<usize>,
    /// Causal model: W[i, j] = 0 and attention masked for j > i.
    pub causal: bool,
    /// Gating heads: the e gate channels are split into `heads` contiguous groups, each
    /// with its own W and b (g-mlp-pytorch's `heads`; 1 in the paper).
    #[serde(default = "default_one")]
    pub heads: usize,
    /// g-mlp-pytorch's token shift: the normalized block input is split into
    /// `2·shift_tokens + 1` channel chunks (`shift_tokens + 1` when causal), shifted along
    /// the tokens by −s..=s (0..=s when causal), with zero fill; 0 disables it.
    #[serde(default)]
    pub shift_tokens: usize,
    /// Spatial weight form.
    pub spatial: SpatialForm,
    /// Epsilon of the block and final LayerNorms.
    pub norm_eps: f32,
    /// Epsilon of the LayerNorm inside the spatial gating unit.
    pub sgu_norm_eps: f32,
    /// Storage and compute type of the emitted graph.
    #[serde(default)]
    pub dtype: Precision,
    /// What the public implementations choose differently from the paper's block (norm,
    /// GELU form, gate activation, biases, windows and folds, reversible stack); its
    /// default fields are not written to the JSON.
    #[serde(flatten)]
    pub block: BlockOptions,
}

fn default_true() -> bool {
    true
}

fn default_one() -> usize {
    1
}

/// Largest dimension accepted for any single size (tokens, widths, vocabulary...).
pub const MAX_DIM: usize = 1 << 20;
/// Largest number of blocks accepted.
pub const MAX_LAYERS: usize = 4096;

impl GmlpConfig {
    /// Number of tokens n.
    pub fn seq_len(&self) -> usize {
        match &self.task {
            Task::Tokens { seq_len, .. } | Task::Backbone { seq_len } => *seq_len,
            Task::Vision {
                image_size,
                patch_size,
                ..
            } => {
                let side = image_size / patch_size.max(&1);
                side * side
            }
        }
    }

    /// Channels per half of the gate, e = f/2.
    pub fn gate_dim(&self) -> usize {
        self.d_ffn / 2
    }

    /// Token shifts, one per channel chunk (g-mlp-pytorch: `range(-s, s + 1)`, or
    /// `range(0, s + 1)` when causal); empty when the shift is off.
    pub fn shift_amounts(&self) -> Vec<i64> {
        if self.shift_tokens == 0 {
            return Vec::new();
        }
        let s = self.shift_tokens as i64;
        let first = if self.causal { 0 } else { -s };
        (first..=s).collect()
    }

    /// Checks every size and combination; an error names the first offending field.
    pub fn validate(&self) -> Result<()> {
        for (name, value) in self.named_dims() {
            if value == 0 || value > MAX_DIM {
                return Err(Error::InvalidConfig(format!(
                    "{name} = {value} is out of range 1..={MAX_DIM}"
                )));
            }
        }
        if self.layers == 0 || self.layers > MAX_LAYERS {
            return Err(Error::InvalidConfig(format!(
                "layers = {} is out of range 1..={MAX_LAYERS}",
                self.layers
            )));
        }
        self.validate_gate()?;
        self.validate_shift()?;
        self.validate_tokens()?;
        self.validate_token_mixing()?;
        for (name, eps) in [
            ("norm_eps", self.norm_eps),
            ("sgu_norm_eps", self.sgu_norm_eps),
        ] {
            if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
                return Err(Error::InvalidConfig(format!(
                    "{name} = {eps} must be in (0, 1)"
                )));
            }
        }
        Ok(())
    }

    /// Number of f32 values the ONNX file stores, computed in u128 from the sizes alone so
    /// that absurd configurations are refused before anything is allocated.
    pub fn stored_f32_estimate(&self) -> u128 {
        let (d, f, e, n) = (
            self.d_model as u128,
            self.d_ffn as u128,
            self.gate_dim() as u128,
            self.seq_len() as u128,
        );
        let heads = self.heads as u128;
        let spatial = heads
            * match self.spatial {
                SpatialForm::ToeplitzGather => 2 * n - 1,
                _ => n * n,
            };
        let qkv_bias = u128::from(self.block.attn_qkv_bias);
        let attn = self
            .attn_dim
            .map_or(0, |a| (d + qkv_bias) * 3 * a as u128 + a as u128 * e + e);
        let ff = match self.block.stack {
            StackKind::Sequential => 0,
            StackKind::Reversible { ff_inner } => {
                let h = ff_inner as u128;
                d * 2 * h + 2 * h + h * d + d
            }
        };
        let block = 2 * d + (d * f + f) + 2 * e + spatial + heads * n + attn + (e * d + d) + ff;
        // A fold adds a depthwise Conv1d (d·fold + d); windows make W smaller (counted n×n).
        let folds: u128 = (0..self.layers)
            .map(|i| self.block.mixing(i).fold as u128)
            .filter(|&k| k > 1)
            .map(|k| d * k + d)
            .sum();
        let ends = match &self.task {
            Task::Tokens {
                vocab_size,
                tied_embedding,
                ..
            } => {
                let v = *vocab_size as u128;
                v * (d + 1) + 2 * d + if *tied_embedding { 0 } else { v * d }
            }
            Task::Vision {
                patch_size,
                in_chans,
                num_classes,
                ..
            } => {
                let p = *patch_size as u128;
                d * (*in_chans as u128) * p * p
                    + d
                    + 2 * d
                    + d * (*num_classes as u128)
                    + *num_classes as u128
            }
            Task::Backbone { .. } => 0,
        };
        self.layers as u128 * block + folds + ends
    }
}

impl GmlpConfig {
    /// Every size of the configuration with its field name, in the order they are checked.
    fn named_dims(&self) -> Vec<(&'static str, usize)> {
        let mut v = vec![("d_model", self.d_model), ("d_ffn", self.d_ffn)];
        if let Some(a) = self.attn_dim {
            v.push(("attn_dim", a));
        }
        match &self.task {
            Task::Tokens {
                vocab_size,
                seq_len,
                ..
            } => {
                v.push(("vocab_size", *vocab_size));
                v.push(("seq_len", *seq_len));
            }
            Task::Vision {
                image_size,
                patch_size,
                in_chans,
                num_classes,
            } => {
                v.push(("image_size", *image_size));
                v.push(("patch_size", *patch_size));
                v.push(("in_chans", *in_chans));
                v.push(("num_classes", *num_classes));
            }
            Task::Backbone { seq_len } => v.push(("seq_len", *seq_len)),
        }
        if let StackKind::Reversible { ff_inner } = self.block.stack {
            v.push(("ff_inner", ff_inner));
        }
        v
    }

    /// Checks the gate: an even d_ffn, split into heads that divide its half.
    fn validate_gate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if !self.d_ffn.is_multiple_of(2) {
            return bad(format!(
                "d_ffn = {} must be even (the gate splits it in two halves)",
                self.d_ffn
            ));
        }
        if self.heads == 0 || !self.gate_dim().is_multiple_of(self.heads) {
            return bad(format!(
                "heads = {} must divide the gate width d_ffn/2 = {}",
                self.heads,
                self.gate_dim()
            ));
        }
        Ok(())
    }

    /// Checks the token shift: a channel per shift and fewer shifted tokens than tokens.
    fn validate_shift(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.shift_tokens > 0 {
            let segments = self.shift_amounts().len();
            if self.d_model < segments {
                return bad(format!(
                    "shift_tokens = {} needs d_model >= {segments} channels",
                    self.shift_tokens
                ));
            }
            if self.shift_tokens >= self.seq_len() {
                return bad(format!(
                    "shift_tokens = {} must be less than the {} tokens",
                    self.shift_tokens,
                    self.seq_len()
                ));
            }
        }
        Ok(())
    }

    /// Checks the tokens: whole patches of an image, at most 65536 tokens.
    fn validate_tokens(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if let Task::Vision {
            image_size,
            patch_size,
            ..
        } = &self.task
        {
            if image_size % patch_size != 0 {
                return bad(format!(
                    "image_size = {image_size} is not a multiple of patch_size = {patch_size}"
                ));
            }
        }
        if self.seq_len() > 65536 {
            return bad(format!(
                "{} tokens is more than the 65536 supported (W is n x n)",
                self.seq_len()
            ));
        }
        Ok(())
    }

    /// Checks the per-block windows and folds: one entry per block (or none), a window of
    /// 1..n, a fold of 1..=n, local mixing and reversible stacks only in causal token
    /// models (as g-mlp-gpt, the implementation they come from).
    fn validate_token_mixing(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        let mixing = &self.block.token_mixing;
        let n = self.seq_len();
        if !mixing.is_empty() && mixing.len() != self.layers {
            return bad(format!(
                "token_mixing has {} entries for {} blocks",
                mixing.len(),
                self.layers
            ));
        }
        for (i, m) in mixing.iter().enumerate() {
            if let Some(w) = m.window {
                if w == 0 || w >= n {
                    return bad(format!(
                        "block {i}: window = {w} must be in 1..{n} (a window of n or more is the global W)"
                    ));
                }
            }
            if m.fold == 0 || m.fold > n {
                return bad(format!("block {i}: fold = {} must be in 1..={n}", m.fold));
            }
        }
        let local = self.block.has_local_mixing();
        let reversible = self.block.stack != StackKind::Sequential;
        if (local || reversible) && !(self.causal && matches!(self.task, Task::Tokens { .. })) {
            return bad(
                "windows, axial folds and reversible stacks are supported for causal token models (g-mlp-gpt)"
                    .into(),
            );
        }
        if local && (self.spatial.is_toeplitz() || self.shift_tokens > 0) {
            return bad(
                "windows and axial folds need a dense spatial weight and no token shift".into(),
            );
        }
        Ok(())
    }
}
