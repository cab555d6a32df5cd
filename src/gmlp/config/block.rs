//! What the paper's block leaves open and the public implementations choose differently
//! ([`BlockOptions`]): the normalization, the GELU form, the gate's activation, which
//! biases exist, per-block windows and axial folding, and how blocks are chained. The
//! defaults are the paper's block (and timm's and g-mlp-pytorch's), and a default field is
//! not written to the configuration JSON, so models without these options keep their bytes.
//!
//! Upstream sources these mirror: g-mlp-gpt 0.0.15 (`g_mlp_gpt/g_mlp_gpt.py`: `CausalSGU`,
//! `CausalLocalSGU`, `LocalAttention`, `AxiallyFold`, `act`; `reversible.py`:
//! `ReversibleSequence`), gmlp-tinygrad 0.9.2 (`gmlp_tinygrad/__init__.py`: RMSNorm, tanh
//! GELU, no spatial bias, attention biases) and g-mlp-pytorch 0.1.5 (`act`).

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Normalization over channels (block input, gating unit, final norm). A new kind is
/// handled in three places, each a `match` the compiler checks: [`NormKind::has_shift`]
/// here (the parameters), the emitter (`gmlp/emit/block/norm.rs`) and the reference
/// (`gmlp/reference/parts.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// LayerNorm: `(x − mean) / √(var + ε) · γ + β` (biased variance).
    #[default]
    LayerNorm,
    /// RMSNorm: `x / √(mean(x²) + ε) · γ`, no shift (tinygrad's `nn.RMSNorm`).
    RmsNorm,
}

impl NormKind {
    /// Whether the norm has a shift β (`{prefix}.bias`) besides its scale γ
    /// (`{prefix}.weight`).
    pub fn has_shift(self) -> bool {
        match self {
            NormKind::LayerNorm => true,
            NormKind::RmsNorm => false,
        }
    }
}

/// How the GELU of the channel projection is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GeluForm {
    /// Exact, `x·Φ(x) = 0.5·x·(1 + erf(x/√2))` (PyTorch's `nn.GELU()`).
    #[default]
    Erf,
    /// The tanh approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (tinygrad's
    /// `Tensor.gelu`, PyTorch's `approximate="tanh"`).
    Tanh,
}

/// The activation applied to the gate `W·LN(z2) + b (+ attn)` before it multiplies z1
/// (g-mlp-pytorch's and g-mlp-gpt's `act`, `--gate-act`; the paper's block has none). It
/// has no weights, so a checkpoint cannot show it. Each variant's first doc paragraph is its
/// `--help` line. A new activation is handled in three files: here, the emitter
/// (`gmlp/emit/block/gate.rs`) and the reference (`gmlp/reference/parts.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GateAct {
    /// No activation (upstream's default `nn.Identity()`).
    #[default]
    Identity,
    /// tanh.
    ///
    /// `nn.Tanh()`.
    Tanh,
    /// Logistic sigmoid.
    ///
    /// `nn.Sigmoid()`.
    Sigmoid,
    /// max(x, 0).
    ///
    /// `nn.ReLU()`.
    Relu,
    /// Exact GELU.
    ///
    /// `nn.GELU()`, `x·Φ(x)`.
    Gelu,
    /// x·sigmoid(x).
    ///
    /// `nn.SiLU()`.
    Silu,
}

/// How one block mixes tokens (g-mlp-gpt's per-layer `window = (w, every)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenMixing {
    /// Local window w < n: position t (in block b = t div w) mixes only the previous
    /// block of w positions and its own block up to t (`CausalLocalSGU`, spatial weight
    /// [heads, w, 2w] and bias [heads, w]; the tiny attention likewise, `LocalAttention`).
    /// `None`: every earlier position (the paper's n×n W).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Axial fold: the sequence is split into `fold` interleaved sub-sequences
    /// (positions r, r + fold, r + 2·fold, …) that each go through the block, and the
    /// block output then goes through a causal depthwise Conv1d of kernel `fold`
    /// (`AxiallyFold`). 1: no fold.
    pub fold: usize,
}

impl TokenMixing {
    /// The paper's block: global mixing, no fold.
    pub const GLOBAL: TokenMixing = TokenMixing {
        window: None,
        fold: 1,
    };

    /// True for the paper's global, unfolded mixing.
    pub fn is_global(&self) -> bool {
        *self == TokenMixing::GLOBAL
    }
}

/// How the blocks are chained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StackKind {
    /// `x ← x + f_i(x)` (the paper).
    #[default]
    Sequential,
    /// g-mlp-gpt's `reversible=True` (`ReversibleSequence`): x1 = x2 = x, then per block
    /// `y1 = x1 + f_i(x2)`, `y2 = x2 + g_i(y1)` with g_i a GEGLU feed-forward
    /// (`Linear d→2h`, `a ⊙ GELU(b)`, `Linear h→d`), and the output y1 + y2.
    Reversible {
        /// Hidden width h of the GEGLU feed-forward (`int(4d·2/3)` upstream for ff_mult 4).
        ff_inner: usize,
    },
}

/// The block options (see the module doc); the default is the paper's block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockOptions {
    /// Normalization of the block input, the gating unit and the final norm.
    #[serde(default, skip_serializing_if = "is_default")]
    pub norm: NormKind,
    /// GELU form of the channel projection.
    #[serde(default, skip_serializing_if = "is_default")]
    pub gelu: GeluForm,
    /// Activation of the gate.
    #[serde(default, skip_serializing_if = "is_default")]
    pub gate_act: GateAct,
    /// The spatial projection has a bias b per token (false in gmlp-tinygrad).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub spatial_bias: bool,
    /// The tiny attention's qkv projection has a bias (gmlp-tinygrad).
    #[serde(default, skip_serializing_if = "is_default")]
    pub attn_qkv_bias: bool,
    /// Token mixing per block (empty: every block global and unfolded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_mixing: Vec<TokenMixing>,
    /// How the blocks are chained.
    #[serde(default, skip_serializing_if = "is_default")]
    pub stack: StackKind,
}

impl Default for BlockOptions {
    fn default() -> Self {
        BlockOptions {
            norm: NormKind::LayerNorm,
            gelu: GeluForm::Erf,
            gate_act: GateAct::Identity,
            spatial_bias: true,
            attn_qkv_bias: false,
            token_mixing: Vec::new(),
            stack: StackKind::Sequential,
        }
    }
}

impl BlockOptions {
    /// The token mixing of block `i`.
    pub fn mixing(&self, i: usize) -> TokenMixing {
        self.token_mixing
            .get(i)
            .copied()
            .unwrap_or(TokenMixing::GLOBAL)
    }

    /// True when some block has a window or a fold.
    pub fn has_local_mixing(&self) -> bool {
        self.token_mixing.iter().any(|m| !m.is_global())
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn is_true(v: &bool) -> bool {
    *v
}

fn yes() -> bool {
    true
}
