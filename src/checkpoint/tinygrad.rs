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
use crate::checkpoint::plan::{count_layers, need_shape, Plan};
use crate::checkpoint::spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::Result;
use crate::gmlp::config::{
    BlockOptions, GeluForm, GmlpConfig, NormKind, Precision, SpatialForm, Task,
};

/// tinygrad's `nn.RMSNorm` default epsilon.
const RMS_EPS: f32 = 1e-6;

/// The architecture and rules of a gmlp-tinygrad checkpoint.
pub(super) fn tinygrad(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let layers = count_layers(ck, "layers")?;
    let proj = need_shape(ck, "layers.0.channel_proj.weight", 2)?;
    let (f, d) = (proj[0], proj[1]);
    let e = f / 2;
    let n = need_shape(ck, "layers.0.spatial_gating_unit.gating_matrix", 2)?[0];
    let attn_dim = match ck.shape("layers.0.tiny_attention.qkv.weight") {
        Some([rows, _]) => Some(rows / 3),
        _ => None,
    };
    let mut plan = Plan::new(ck);
    for i in 0..layers {
        let (b, l) = (format!("blocks.{i}"), format!("layers.{i}"));
        plan.same(
            &format!("{b}.norm.weight"),
            &format!("{l}.input_norm.weight"),
            &[d],
        );
        plan.linear(
            &format!("{b}.proj_in.weight"),
            &format!("{l}.channel_proj.weight"),
            f,
            d,
        );
        plan.same(
            &format!("{b}.proj_in.bias"),
            &format!("{l}.channel_proj.bias"),
            &[f],
        );
        plan.same(
            &format!("{b}.sgu.norm.weight"),
            &format!("{l}.spatial_gating_unit.norm.weight"),
            &[e],
        );
        plan.spatial(
            &format!("{b}.sgu.spatial.weight"),
            StoredSpatial::Dense(format!("{l}.spatial_gating_unit.gating_matrix")),
            vec![vec![n, n]],
        );
        if let Some(a) = attn_dim {
            let t = format!("{l}.tiny_attention");
            plan.linear(
                &format!("{b}.attn.qkv.weight"),
                &format!("{t}.qkv.weight"),
                3 * a,
                d,
            );
            plan.same(
                &format!("{b}.attn.qkv.bias"),
                &format!("{t}.qkv.bias"),
                &[3 * a],
            );
            plan.linear(
                &format!("{b}.attn.out.weight"),
                &format!("{t}.out_proj.weight"),
                e,
                a,
            );
            plan.same(
                &format!("{b}.attn.out.bias"),
                &format!("{t}.out_proj.bias"),
                &[e],
            );
        }
        plan.linear(
            &format!("{b}.proj_out.weight"),
            &format!("{l}.output_proj.weight"),
            d,
            e,
        );
        plan.same(
            &format!("{b}.proj_out.bias"),
            &format!("{l}.output_proj.bias"),
            &[d],
        );
    }
    let config = GmlpConfig {
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
    };
    Ok((config, plan.finish()?))
}
