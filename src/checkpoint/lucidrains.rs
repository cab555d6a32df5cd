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
use crate::checkpoint::plan::{count_layers, image_side, isqrt_exact, need_shape, Plan};
use crate::checkpoint::spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{BlockOptions, GmlpConfig, Precision, SpatialForm, Task};

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
    let block = |i: usize| format!("layers.{i}.{nest}");
    let layers = count_layers(ck, "layers")?;
    let proj_in = need_shape(ck, &format!("{}proj_in.0.weight", block(0)), 2)?;
    let (f, d) = (proj_in[0], proj_in[1]);
    let e = f / 2;
    let sgu = format!("{}sgu.", block(0));
    let circulant = ck.contains(&format!("{sgu}circulant_pos_x"));
    let sgu_shape = need_shape(ck, &format!("{sgu}weight"), if circulant { 2 } else { 3 })?;
    let (heads, n) = (sgu_shape[0], sgu_shape[1]);
    let attn_dim = match ck.shape(&format!("{}attn.to_qkv.weight", block(0))) {
        Some([rows, cols]) if rows % 3 == 0 && *cols == d => Some(rows / 3),
        Some(s) => {
            return Err(Error::BadTensor(format!(
                "{}attn.to_qkv.weight has shape {s:?}, expected [3a, {d}]",
                block(0)
            )))
        }
        None => None,
    };
    let mut plan = Plan::new(ck);
    let task = if ck.contains("to_embed.weight") {
        let vocab = need_shape(ck, "to_embed.weight", 2)?[0];
        plan.same("embed.weight", "to_embed.weight", &[vocab, d]);
        plan.norm("norm", "to_logits.0", d);
        plan.linear("head.weight", "to_logits.1.weight", vocab, d);
        plan.same("head.bias", "to_logits.1.bias", &[vocab]);
        Task::Tokens {
            vocab_size: vocab,
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
                    Error::InvalidArgument(format!(
                        "to_patch_embed.1.weight has {k} inputs, not {c} channels times a square patch; pass --in-chans / --patch-size"
                    ))
                })?)
            }
            (Some(p), _) => {
                return Err(Error::InvalidArgument(format!(
                    "--patch-size {p} does not divide the {k} inputs of to_patch_embed.1.weight"
                )))
            }
        };
        let classes = need_shape(ck, "to_logits.2.weight", 2)?[0];
        plan.same("stem.weight", "to_patch_embed.1.weight", &[d, k]);
        plan.same("stem.bias", "to_patch_embed.1.bias", &[d]);
        plan.norm("norm", "to_logits.0", d);
        plan.linear("head.weight", "to_logits.2.weight", classes, d);
        plan.same("head.bias", "to_logits.2.bias", &[classes]);
        Task::Vision {
            image_size: image_side(ck, hints, n, p)?,
            patch_size: p,
            in_chans: c,
            num_classes: classes,
        }
    };
    for i in 0..layers {
        let (b, l) = (format!("blocks.{i}"), block(i));
        plan.norm(&format!("{b}.norm"), &format!("layers.{i}.fn.norm"), d);
        plan.linear(
            &format!("{b}.proj_in.weight"),
            &format!("{l}proj_in.0.weight"),
            f,
            d,
        );
        plan.same(
            &format!("{b}.proj_in.bias"),
            &format!("{l}proj_in.0.bias"),
            &[f],
        );
        plan.norm(&format!("{b}.sgu.norm"), &format!("{l}sgu.norm"), e);
        if circulant {
            plan.spatial(
                &format!("{b}.sgu.spatial.weight"),
                StoredSpatial::Circulant {
                    weight: format!("{l}sgu.weight"),
                    pos_x: format!("{l}sgu.circulant_pos_x"),
                    pos_y: format!("{l}sgu.circulant_pos_y"),
                },
                vec![vec![heads, n]; 3],
            );
        } else {
            plan.spatial(
                &format!("{b}.sgu.spatial.weight"),
                StoredSpatial::Dense(format!("{l}sgu.weight")),
                vec![vec![heads, n, n]],
            );
        }
        plan.same(
            &format!("{b}.sgu.spatial.bias"),
            &format!("{l}sgu.bias"),
            &[heads, n],
        );
        if let Some(a) = attn_dim {
            plan.linear(
                &format!("{b}.attn.qkv.weight"),
                &format!("{l}attn.to_qkv.weight"),
                3 * a,
                d,
            );
            plan.linear(
                &format!("{b}.attn.out.weight"),
                &format!("{l}attn.to_out.weight"),
                e,
                a,
            );
            plan.same(
                &format!("{b}.attn.out.bias"),
                &format!("{l}attn.to_out.bias"),
                &[e],
            );
        }
        plan.linear(
            &format!("{b}.proj_out.weight"),
            &format!("{l}proj_out.weight"),
            d,
            e,
        );
        plan.same(
            &format!("{b}.proj_out.bias"),
            &format!("{l}proj_out.bias"),
            &[d],
        );
    }
    let config = GmlpConfig {
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
    };
    Ok((config, plan.finish()?))
}
