//! g-mlp-pytorch 0.1.x by lucidrains (`gMLP`, `gMLPVision` in
//! [g_mlp_pytorch.py](https://github.com/lucidrains/g-mlp-pytorch/blob/main/g_mlp_pytorch/g_mlp_pytorch.py)):
//! `layers.N.fn.norm` (pre-norm), the block under `layers.N.fn.fn.fn.` (0.1.5 token models,
//! with `PreShiftTokens`) or `layers.N.fn.fn.` (vision models, and token models of ≤ 0.1.4):
//! `proj_in.0`, `sgu.{norm, weight, bias}` (or the circulant `sgu.{weight, circulant_pos_x,
//! circulant_pos_y}`), `attn.{to_qkv, to_out}`, `proj_out`; `to_embed` / `to_patch_embed.1`,
//! `to_logits`. LayerNorm eps 1e-5. Causality, token shift and the gate activation (`act`)
//! are not visible in the weights and come from the hints.

use std::collections::BTreeMap;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::plan::{
    count_layers, image_side, isqrt_exact, map_names, need_shape, Map::*, Row,
};
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{BlockOptions, GmlpConfig, Precision, SpatialForm, Task};
use crate::message::{Phrase, Setting};

/// The blocks' names and the head's norm; `{l}` is layer i's block prefix
/// ([`lucid_nesting`]), the pre-norm sits outside it.
const BLOCKS: &[Row] = &[
    ("blocks.{i}.norm.*", "layers.{i}.fn.norm.*", Same),
    ("blocks.{i}.proj_in.*", "{l}proj_in.0.*", Linear),
    ("blocks.{i}.sgu.norm.*", "{l}sgu.norm.*", Same),
    ("blocks.{i}.attn.qkv.*", "{l}attn.to_qkv.*", Linear),
    ("blocks.{i}.attn.out.*", "{l}attn.to_out.*", Linear),
    ("blocks.{i}.proj_out.*", "{l}proj_out.*", Linear),
    ("norm.*", "to_logits.0.*", Same),
];
/// The spatial projection `sgu.{weight [h, n, n], bias [h, n]}`.
const DENSE: &[Row] = &[("blocks.{i}.sgu.spatial.*", "{l}sgu.*", SpatialHeaded)];
/// The spatial projection of `circulant_matrix=True`: `sgu.{weight, circulant_pos_x,
/// circulant_pos_y, bias}`, each [h, n].
const CIRCULANT: &[Row] = &[("blocks.{i}.sgu.spatial.*", "{l}sgu.*", Circulant)];
/// `gMLP`: the embedding and the output projection.
const TOKENS: &[Row] = &[
    ("embed.*", "to_embed.*", Same),
    ("head.*", "to_logits.1.*", Linear),
];
/// `gMLPVision`: the patch embedding (`Rearrange` then `Linear`) and the classifier.
const VISION: &[Row] = &[
    ("stem.*", "to_patch_embed.1.*", LinearStem),
    ("head.*", "to_logits.2.*", Linear),
];

/// The block prefix of layer `i` in g-mlp-pytorch: `layers.i.fn.fn.fn.` (0.1.5 token
/// models) or `layers.i.fn.fn.` (vision, ≤ 0.1.4).
pub(super) fn lucid_nesting(ck: &Checkpoint) -> Option<&'static str> {
    ["fn.fn.fn.", "fn.fn."].into_iter().find(|nest| {
        ck.keys().any(|k| {
            k.strip_prefix("layers.")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(index, tail)| {
                    index.parse::<usize>().is_ok() && tail == format!("{nest}proj_in.0.weight")
                })
        })
    })
}

/// Whether the spatial weights are circulant (`circulant_matrix=True`).
fn circulant(ck: &Checkpoint, nest: &str) -> bool {
    ck.contains(&format!("layers.0.{nest}sgu.circulant_pos_x"))
}

/// The architecture and rules of a g-mlp-pytorch checkpoint.
pub(super) fn lucidrains(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let nest = lucid_nesting(ck).ok_or_else(|| {
        Error::BadTensor(format!(
            "{}: no layers.0.fn.fn[.fn].proj_in.0.weight: not a g-mlp-pytorch gMLP checkpoint",
            ck.path().display()
        ))
    })?;
    let config = infer(ck, hints, nest)?;
    let spatial = if circulant(ck, nest) {
        CIRCULANT
    } else {
        DENSE
    };
    let ends = match config.task {
        Task::Tokens { .. } => TOKENS,
        _ => VISION,
    };
    let layer = |i: usize| format!("layers.{i}.{nest}");
    let rules = map_names(ck, &config, &[BLOCKS, spatial, ends], &layer)?;
    Ok((config, rules))
}

/// The architecture of a g-mlp-pytorch checkpoint whose blocks sit under `nest`, from
/// its shapes and the hints.
fn infer(ck: &Checkpoint, hints: &ImportHints, nest: &str) -> Result<GmlpConfig> {
    let block = format!("layers.0.{nest}");
    let layers = count_layers(ck, "layers")?;
    let proj_in = need_shape(ck, &format!("{block}proj_in.0.weight"), 2)?;
    let (f, d) = (proj_in[0], proj_in[1]);
    let rank = if circulant(ck, nest) { 2 } else { 3 };
    let sgu_shape = need_shape(ck, &format!("{block}sgu.weight"), rank)?;
    let (heads, n) = (sgu_shape[0], sgu_shape[1]);
    let attn_dim = match ck.shape(&format!("{block}attn.to_qkv.weight")) {
        Some([rows, cols]) if rows % 3 == 0 && *cols == d => Some(rows / 3),
        Some(s) => {
            return Err(Error::BadTensor(format!(
                "{block}attn.to_qkv.weight has shape {s:?}, expected [3a, {d}]"
            )))
        }
        None => None,
    };
    let task = if ck.contains("to_embed.weight") {
        Task::Tokens {
            vocab_size: need_shape(ck, "to_embed.weight", 2)?[0],
            seq_len: n,
            tied_embedding: false,
        }
    } else {
        let k = need_shape(ck, "to_patch_embed.1.weight", 2)?[1];
        let (c, p) = match (hints.patch_size, hints.in_chans) {
            (Some(p), _) if p > 0 && k % (p * p) == 0 => (k / (p * p), p),
            (None, c) => {
                let c = c.unwrap_or(3);
                let p = (c > 0 && k % c == 0).then(|| isqrt_exact(k / c)).flatten();
                (c, p.ok_or_else(|| {
                    Error::Setting(
                        Phrase::text(format!(
                            "to_patch_embed.1.weight has {k} inputs, not {c} channels times a square patch; pass "
                        ))
                        .and(Setting::InChans)
                        .then(" / ")
                        .and(Setting::PatchSize),
                    )
                })?)
            }
            (Some(p), _) => {
                return Err(Error::Setting(Phrase::setting(Setting::PatchSize).then(
                    format!(" {p} does not divide the {k} inputs of to_patch_embed.1.weight"),
                )))
            }
        };
        let classes = need_shape(ck, "to_logits.2.weight", 2)?[0];
        Task::Vision {
            image_size: image_side(ck, hints, n, p)?,
            patch_size: p,
            in_chans: c,
            num_classes: classes,
        }
    };
    Ok(GmlpConfig {
        task,
        layers,
        d_model: d,
        d_ffn: f,
        attn_dim,
        causal: hints.causal,
        heads,
        shift_tokens: hints.shift_tokens,
        spatial: hints.spatial.unwrap_or(SpatialForm::Dense),
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: BlockOptions {
            gate_act: hints.gate_act,
            ..BlockOptions::default()
        },
    })
}
