//! The paper's models (Liu et al. 2021): the vision models of Table 1 (ImageNet, ViT/B16
//! protocol: 224×224 images, 16×16 patches) and the MLM models of Table 5 (BERT protocol:
//! Toeplitz W, n = 512, vocabulary 32000), with the parameter and FLOP counts the paper
//! reports for each.

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision, SpatialForm, Task};

/// A configuration from the paper's tables, with the numbers the paper reports for it.
#[derive(Clone, Debug)]
pub struct Preset {
    /// Preset name, e.g. `amlp-base`.
    pub name: &'static str,
    /// The architecture.
    pub config: GmlpConfig,
    /// Parameters reported in the paper (Table 1 or Table 5), in millions.
    pub paper_params_m: f64,
    /// FLOPs reported in the paper, in billions.
    pub paper_flops_b: f64,
}

/// Epsilon of every LayerNorm of the MLM presets (PyTorch's default, as in g-mlp-pytorch).
pub const MLM_NORM_EPS: f32 = 1e-5;
/// timm's gMLP vision LayerNorm epsilon for block and final norms (the gate uses 1e-5).
pub const TIMM_NORM_EPS: f32 = 1e-6;

fn mlm(layers: usize, d_model: usize, d_ffn: usize, attn_dim: Option<usize>) -> GmlpConfig {
    GmlpConfig {
        task: Task::Tokens {
            vocab_size: 32000,
            seq_len: 512,
            tied_embedding: true,
        },
        layers,
        d_model,
        d_ffn,
        attn_dim,
        causal: false,
        heads: 1,
        shift_tokens: 0,
        spatial: SpatialForm::ToeplitzGather,
        norm_eps: MLM_NORM_EPS,
        sgu_norm_eps: MLM_NORM_EPS,
        dtype: Precision::F32,
        block: Default::default(),
    }
}

fn vision(layers: usize, d_model: usize, d_ffn: usize) -> GmlpConfig {
    GmlpConfig {
        task: Task::Vision {
            image_size: 224,
            patch_size: 16,
            in_chans: 3,
            num_classes: 1000,
        },
        layers,
        d_model,
        d_ffn,
        attn_dim: None,
        causal: false,
        heads: 1,
        shift_tokens: 0,
        spatial: SpatialForm::Dense,
        norm_eps: TIMM_NORM_EPS,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    }
}

/// All presets: vision models of Table 1 (ImageNet, ViT/B16 protocol) and MLM models of
/// Table 5 (BERT protocol, Toeplitz W, n = 512, vocabulary 32000).
pub fn presets() -> Vec<Preset> {
    let p = |name, config, paper_params_m, paper_flops_b| Preset {
        name,
        config,
        paper_params_m,
        paper_flops_b,
    };
    vec![
        p("gmlp-ti16", vision(30, 128, 768), 5.9, 2.7),
        p("gmlp-s16", vision(30, 256, 1536), 19.5, 8.9),
        p("gmlp-b16", vision(30, 512, 3072), 73.4, 31.6),
        p("gmlp-base", mlm(48, 512, 3072, None), 130.0, 158.0),
        p("amlp-base", mlm(36, 512, 3072, Some(64)), 109.0, 128.9),
        p("gmlp-large", mlm(96, 768, 3072, None), 365.0, 430.1),
        p("amlp-large", mlm(72, 768, 3072, Some(128)), 316.0, 370.3),
        p("gmlp-xlarge", mlm(144, 1024, 4096, None), 941.0, 1091.3),
    ]
}

/// The preset called `name`, or an error listing the known names.
pub fn preset(name: &str) -> Result<Preset> {
    let all = presets();
    let names: Vec<&str> = all.iter().map(|p| p.name).collect();
    let joined = names.join(", ");
    all.into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| Error::UnknownName(format!("unknown preset '{name}' (known: {joined})")))
}
