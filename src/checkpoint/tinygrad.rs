//! gmlp-tinygrad 0.9.2 (`gmlp_tinygrad.gMLP`, saved with tinygrad's
//! `nn.state.safe_save(get_state_dict(model))`): the blocks alone, without embedding or
//! head. Layer i: `layers.i.input_norm.weight` (RMSNorm, eps 1e-6), `channel_proj`
//! (Linear d→f, then tinygrad's tanh GELU), `spatial_gating_unit.norm.weight` (RMSNorm of
//! the second half), `spatial_gating_unit.gating_matrix` [n, n] (no bias), the optional
//! `tiny_attention.{qkv, out_proj}` (both with biases) on the normalized input, and
//! `output_proj` (Linear e→d). Linear weights are [out, in]. The causal mask is an
//! argument of the forward pass, not a weight, and comes from the hints.

use std::collections::BTreeMap;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::plan::{count_layers, map_names, need_shape, Map::*, Row};
use crate::checkpoint::{ImportHints, Rule};
use crate::error::Result;
use crate::gmlp::config::{
    BlockOptions, GeluForm, GmlpConfig, NormKind, Precision, SpatialForm, Task,
};

/// tinygrad's `nn.RMSNorm` default epsilon.
const RMS_EPS: f32 = 1e-6;

/// gmlp-tinygrad's names; `{l}` is `layers.{i}.`. The norms are RMSNorms (`weight` only)
/// and the gating matrix has no bias, as the configuration says, so no row names those.
#[rustfmt::skip]
const TINYGRAD: &[Row] = &[
    ("blocks.{i}.norm.*", "{l}input_norm.*", Same),
    ("blocks.{i}.proj_in.*", "{l}channel_proj.*", Linear),
    (
        "blocks.{i}.sgu.norm.*",
        "{l}spatial_gating_unit.norm.*",
        Same,
    ),
    ("blocks.{i}.sgu.spatial.weight", "{l}spatial_gating_unit.gating_matrix", Spatial),
    ("blocks.{i}.attn.qkv.*", "{l}tiny_attention.qkv.*", Linear),
    (
        "blocks.{i}.attn.out.*",
        "{l}tiny_attention.out_proj.*",
        Linear,
    ),
    ("blocks.{i}.proj_out.*", "{l}output_proj.*", Linear),
];

/// The architecture and rules of a gmlp-tinygrad checkpoint.
pub(super) fn tinygrad(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let config = infer(ck, hints)?;
    let rules = map_names(ck, &config, &[TINYGRAD], &|i| format!("layers.{i}."))?;
    Ok((config, rules))
}

/// The architecture of a gmlp-tinygrad checkpoint, from its shapes and the hints.
fn infer(ck: &Checkpoint, hints: &ImportHints) -> Result<GmlpConfig> {
    let layers = count_layers(ck, "layers")?;
    let proj = need_shape(ck, "layers.0.channel_proj.weight", 2)?;
    let (f, d) = (proj[0], proj[1]);
    let n = need_shape(ck, "layers.0.spatial_gating_unit.gating_matrix", 2)?[0];
    let attn_dim = match ck.shape("layers.0.tiny_attention.qkv.weight") {
        Some([rows, _]) => Some(rows / 3),
        _ => None,
    };
    Ok(GmlpConfig {
        task: Task::Backbone { seq_len: n },
        layers,
        d_model: d,
        d_ffn: f,
        attn_dim,
        causal: hints.causal,
        heads: 1,
        shift_tokens: 0,
        spatial: hints.spatial.unwrap_or(SpatialForm::Dense),
        norm_eps: RMS_EPS,
        sgu_norm_eps: RMS_EPS,
        dtype: Precision::F32,
        block: BlockOptions {
            norm: NormKind::RmsNorm,
            gelu: GeluForm::Tanh,
            gate_act: hints.gate_act,
            spatial_bias: false,
            attn_qkv_bias: attn_dim.is_some(),
            ..BlockOptions::default()
        },
    })
}
