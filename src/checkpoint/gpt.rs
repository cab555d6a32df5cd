//! g-mlp-gpt 0.0.15 by lucidrains (`gMLPGPT` in g_mlp_gpt/g_mlp_gpt.py, the reversible stack
//! in g_mlp_gpt/reversible.py), a causal gMLP language model. State-dict layout:
//! `to_embed.weight [V, d]`; layer i under `net.layers.i.0.` (sequential) or
//! `net.blocks.i.f.net.` (`reversible=True`, whose GEGLU feed-forward is
//! `net.blocks.i.g.net.net.{0, 2}`): `norm` (PreNorm), `fn.conv` (`AxiallyFold` with
//! every > 1: depthwise Conv1d [d, 1, every]), and the block under `fn.fn.`:
//! `attn.{to_qkv, to_out}` (global `Attention` or `LocalAttention`), `proj_in.0`,
//! `sgu.{norm, weight, bias, mask}` (`CausalSGU`: weight [h, n, n], bias [h, n]; or
//! `CausalLocalSGU` with window w: weight [h, w, 2w], bias [h, w]; `mask` is a constant
//! buffer), `proj_out`; the head `to_logits.{0 (LN), 1 (Linear)}`. Every LayerNorm has eps
//! 1e-5; GELU is exact. The gate activation `act` has no weights and comes from the hints.

use std::collections::BTreeMap;

use crate::checkpoint::file::Checkpoint;
use crate::checkpoint::plan::{count_layers, need_shape, Plan};
use crate::checkpoint::spatial::StoredSpatial;
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{
    BlockOptions, GmlpConfig, Precision, SpatialForm, StackKind, Task, TokenMixing,
};

/// The layer prefix of a sequential (`net.layers.i.0.`) or reversible
/// (`net.blocks.i.f.net.`) g-mlp-gpt checkpoint, if the checkpoint has one.
pub(super) fn gpt_layers(ck: &Checkpoint) -> Option<(&'static str, &'static str)> {
    [("net.layers", "0."), ("net.blocks", "f.net.")]
        .into_iter()
        .find(|(stack, inner)| {
            ck.keys().any(|k| {
                k.strip_prefix(stack)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .and_then(|rest| rest.split_once('.'))
                    .is_some_and(|(index, tail)| {
                        index.parse::<usize>().is_ok()
                            && tail == format!("{inner}fn.fn.proj_in.0.weight")
                    })
            })
        })
}

/// The constant causal masks upstream registers as buffers (`sgu.mask`): part of every
/// state_dict, not parameters (the tool applies causality itself).
pub(super) fn gpt_buffers(ck: &Checkpoint) -> Vec<String> {
    ck.keys()
        .filter(|k| k.starts_with("net.") && k.ends_with(".fn.fn.sgu.mask"))
        .map(str::to_string)
        .collect()
}

/// The spatial weight of one layer as stored: its gating heads and either n (global
/// `CausalSGU`, [h, n, n]) or the window w (`CausalLocalSGU`, [h, w, 2w]).
fn layer_spatial(ck: &Checkpoint, key: &str) -> Result<(usize, Option<usize>, usize)> {
    let shape = need_shape(ck, key, 3)?;
    match shape {
        [h, rows, cols] if cols == rows => Ok((*h, None, *rows)),
        [h, rows, cols] if *cols == 2 * rows => Ok((*h, Some(*rows), *rows)),
        _ => Err(Error::BadTensor(format!(
            "{}: {key} has shape {shape:?}, expected [heads, n, n] (CausalSGU) or [heads, w, 2w] (CausalLocalSGU)",
            ck.path().display()
        ))),
    }
}

/// The architecture and rules of a g-mlp-gpt checkpoint.
pub(super) fn gpt(
    ck: &Checkpoint,
    hints: &ImportHints,
) -> Result<(GmlpConfig, BTreeMap<String, Rule>)> {
    let (stack_prefix, inner) = gpt_layers(ck).ok_or_else(|| {
        Error::BadTensor(format!(
            "{}: no net.layers.0.0.fn.fn.proj_in.0.weight or net.blocks.0.f.net.fn.fn.proj_in.0.weight: not a g-mlp-gpt checkpoint",
            ck.path().display()
        ))
    })?;
    let reversible = stack_prefix == "net.blocks";
    let layer = |i: usize| format!("{stack_prefix}.{i}.{inner}");
    let layers = count_layers(ck, stack_prefix)?;
    let embed = need_shape(ck, "to_embed.weight", 2)?;
    let (vocab, d) = (embed[0], embed[1]);
    let f = need_shape(ck, &format!("{}fn.fn.proj_in.0.weight", layer(0)), 2)?[0];
    let e = f / 2;
    // Per layer: heads, window, fold; n from the global layers.
    let mut heads = None;
    let mut mixing = Vec::with_capacity(layers);
    let mut n = hints.seq_len;
    for i in 0..layers {
        let key = format!("{}fn.fn.sgu.weight", layer(i));
        let (h, window, rows) = layer_spatial(ck, &key)?;
        if *heads.get_or_insert(h) != h {
            return Err(Error::BadTensor(format!(
                "{}: {key} has {h} gating heads, the first layer {}",
                ck.path().display(),
                heads.unwrap_or(h)
            )));
        }
        if window.is_none() {
            match n {
                Some(m) if m != rows => {
                    return Err(Error::BadTensor(format!(
                        "{}: {key} is [{h}, {rows}, {rows}], but the sequence length is {m}",
                        ck.path().display()
                    )))
                }
                _ => n = Some(rows),
            }
        }
        let fold = match ck.shape(&format!("{}fn.conv.weight", layer(i))) {
            Some([c, 1, k]) if *c == d => *k,
            Some(s) => {
                return Err(Error::BadTensor(format!(
                    "{}: {}fn.conv.weight has shape {s:?}, expected [{d}, 1, every]",
                    ck.path().display(),
                    layer(i)
                )))
            }
            None => 1,
        };
        mixing.push(TokenMixing { window, fold });
    }
    let n = n.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{}: every layer of this g-mlp-gpt model is windowed, so its sequence length is not in the weights: pass --seq-len (gMLPGPT's seq_len)",
            ck.path().display()
        ))
    })?;
    let heads = heads.unwrap_or(1);
    let attn_dim = layer_attention(ck, &layer, layers, d)?;
    let ff_inner = if reversible {
        Some(need_shape(ck, "net.blocks.0.g.net.net.2.weight", 2)?[1])
    } else {
        None
    };
    let mut plan = Plan::new(ck);
    plan.same("embed.weight", "to_embed.weight", &[vocab, d]);
    for (i, m) in mixing.iter().enumerate() {
        let (b, l) = (format!("blocks.{i}"), layer(i));
        plan.norm(&format!("{b}.norm"), &format!("{l}norm"), d);
        plan.linear(
            &format!("{b}.proj_in.weight"),
            &format!("{l}fn.fn.proj_in.0.weight"),
            f,
            d,
        );
        plan.same(
            &format!("{b}.proj_in.bias"),
            &format!("{l}fn.fn.proj_in.0.bias"),
            &[f],
        );
        plan.norm(&format!("{b}.sgu.norm"), &format!("{l}fn.fn.sgu.norm"), e);
        let (w, rows) = (format!("{l}fn.fn.sgu.weight"), m.window.unwrap_or(n));
        match m.window {
            None => plan.spatial(
                &format!("{b}.sgu.spatial.weight"),
                StoredSpatial::Dense(w),
                vec![vec![heads, n, n]],
            ),
            Some(win) => plan.same(
                &format!("{b}.sgu.spatial.weight"),
                &w,
                &[heads, win, 2 * win],
            ),
        }
        plan.same(
            &format!("{b}.sgu.spatial.bias"),
            &format!("{l}fn.fn.sgu.bias"),
            &[heads, rows],
        );
        if let Some(a) = attn_dim {
            plan.linear(
                &format!("{b}.attn.qkv.weight"),
                &format!("{l}fn.fn.attn.to_qkv.weight"),
                3 * a,
                d,
            );
            plan.linear(
                &format!("{b}.attn.out.weight"),
                &format!("{l}fn.fn.attn.to_out.weight"),
                e,
                a,
            );
            plan.same(
                &format!("{b}.attn.out.bias"),
                &format!("{l}fn.fn.attn.to_out.bias"),
                &[e],
            );
        }
        plan.linear(
            &format!("{b}.proj_out.weight"),
            &format!("{l}fn.fn.proj_out.weight"),
            d,
            e,
        );
        plan.same(
            &format!("{b}.proj_out.bias"),
            &format!("{l}fn.fn.proj_out.bias"),
            &[d],
        );
        if m.fold > 1 {
            plan.same(
                &format!("{b}.fold.weight"),
                &format!("{l}fn.conv.weight"),
                &[d, 1, m.fold],
            );
            plan.same(&format!("{b}.fold.bias"), &format!("{l}fn.conv.bias"), &[d]);
        }
        if let Some(h) = ff_inner {
            let g = format!("net.blocks.{i}.g.net.net");
            plan.linear(
                &format!("{b}.ff.proj_in.weight"),
                &format!("{g}.0.weight"),
                2 * h,
                d,
            );
            plan.same(
                &format!("{b}.ff.proj_in.bias"),
                &format!("{g}.0.bias"),
                &[2 * h],
            );
            plan.linear(
                &format!("{b}.ff.proj_out.weight"),
                &format!("{g}.2.weight"),
                d,
                h,
            );
            plan.same(
                &format!("{b}.ff.proj_out.bias"),
                &format!("{g}.2.bias"),
                &[d],
            );
        }
        let mask = format!("{l}fn.fn.sgu.mask");
        if let Some(shape) = ck.shape(&mask) {
            let expected = [rows, m.window.map_or(n, |w| 2 * w)];
            if shape != expected {
                return Err(Error::BadTensor(format!(
                    "{}: buffer {mask} has shape {shape:?}, expected {expected:?}",
                    ck.path().display()
                )));
            }
        }
    }
    plan.norm("norm", "to_logits.0", d);
    plan.linear("head.weight", "to_logits.1.weight", vocab, d);
    plan.same("head.bias", "to_logits.1.bias", &[vocab]);
    let global = mixing.iter().all(TokenMixing::is_global);
    let config = GmlpConfig {
        task: Task::Tokens {
            vocab_size: vocab,
            seq_len: n,
            tied_embedding: false,
        },
        layers,
        d_model: d,
        d_ffn: f,
        attn_dim,
        causal: true,
        heads,
        shift_tokens: 0,
        spatial: SpatialForm::Dense,
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: BlockOptions {
            gate_act: hints.gate_act,
            token_mixing: if global { Vec::new() } else { mixing },
            stack: match ff_inner {
                Some(ff_inner) => StackKind::Reversible { ff_inner },
                None => StackKind::Sequential,
            },
            ..BlockOptions::default()
        },
    };
    Ok((config, plan.finish()?))
}

/// The tiny attention's size a, the same in every layer (upstream allows one per layer;
/// this tool's configuration has one).
fn layer_attention(
    ck: &Checkpoint,
    layer: &dyn Fn(usize) -> String,
    layers: usize,
    d: usize,
) -> Result<Option<usize>> {
    let mut sizes = Vec::with_capacity(layers);
    for i in 0..layers {
        let key = format!("{}fn.fn.attn.to_qkv.weight", layer(i));
        sizes.push(match ck.shape(&key) {
            Some([rows, cols]) if rows % 3 == 0 && *cols == d => Some(rows / 3),
            Some(s) => {
                return Err(Error::BadTensor(format!(
                    "{}: {key} has shape {s:?}, expected [3a, {d}]",
                    ck.path().display()
                )))
            }
            None => None,
        });
    }
    if sizes.windows(2).any(|w| w[0] != w[1]) {
        return Err(Error::BadTensor(format!(
            "{}: the layers have different attention sizes {sizes:?}; one size for every layer is supported",
            ck.path().display()
        )));
    }
    Ok(sizes.first().copied().flatten())
}
