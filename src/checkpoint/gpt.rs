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
use crate::checkpoint::plan::{count_layers, map_names, need_shape, Map::*, Row};
use crate::checkpoint::{ImportHints, Rule};
use crate::error::{Error, Result};
use crate::gmlp::config::{
    BlockOptions, GmlpConfig, Precision, SpatialForm, StackKind, Task, TokenMixing,
};
use crate::message::{Phrase, Setting};

/// g-mlp-gpt's names; `{l}` is layer i's prefix ([`gpt_layers`]). A windowed layer's W is
/// read as it is; `fold` (`AxiallyFold`'s conv) exists in layers with every > 1, `ff` (the
/// reversible stack's GEGLU `FeedForward`, outside `{l}`) with `reversible=True`.
#[rustfmt::skip]
const GPT: &[Row] = &[
    ("embed.*", "to_embed.*", Same),
    ("blocks.{i}.norm.*", "{l}norm.*", Same),
    ("blocks.{i}.proj_in.*", "{l}fn.fn.proj_in.0.*", Linear),
    ("blocks.{i}.sgu.norm.*", "{l}fn.fn.sgu.norm.*", Same),
    ("blocks.{i}.sgu.spatial.*", "{l}fn.fn.sgu.*", SpatialHeaded),
    ("blocks.{i}.attn.qkv.*", "{l}fn.fn.attn.to_qkv.*", Linear),
    ("blocks.{i}.attn.out.*", "{l}fn.fn.attn.to_out.*", Linear),
    ("blocks.{i}.proj_out.*", "{l}fn.fn.proj_out.*", Linear),
    ("blocks.{i}.fold.*", "{l}fn.conv.*", Same),
    ("blocks.{i}.ff.proj_in.*", "net.blocks.{i}.g.net.net.0.*", Linear),
    ("blocks.{i}.ff.proj_out.*", "net.blocks.{i}.g.net.net.2.*", Linear),
    ("norm.*", "to_logits.0.*", Same),
    ("head.*", "to_logits.1.*", Linear),
];

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
    let (stack, inner) = gpt_layers(ck).ok_or_else(|| {
        Error::BadTensor(format!(
            "{}: no net.layers.0.0.fn.fn.proj_in.0.weight or net.blocks.0.f.net.fn.fn.proj_in.0.weight: not a g-mlp-gpt checkpoint",
            ck.path().display()
        ))
    })?;
    let layer = move |i: usize| format!("{stack}.{i}.{inner}");
    let config = infer(ck, hints, stack, &layer)?;
    check_masks(ck, &config, &layer)?;
    let rules = map_names(ck, &config, &[GPT], &layer)?;
    Ok((config, rules))
}

/// The architecture of a g-mlp-gpt checkpoint whose layers are `stack` (`net.blocks` when
/// reversible) with the prefix `layer(i)`, from its shapes and the hints.
fn infer(
    ck: &Checkpoint,
    hints: &ImportHints,
    stack: &str,
    layer: &dyn Fn(usize) -> String,
) -> Result<GmlpConfig> {
    let layers = count_layers(ck, stack)?;
    let embed = need_shape(ck, "to_embed.weight", 2)?;
    let (vocab, d) = (embed[0], embed[1]);
    let f = need_shape(ck, &format!("{}fn.fn.proj_in.0.weight", layer(0)), 2)?[0];
    let (heads, mixing, n) = layer_mixing(ck, layer, layers, d, hints.seq_len)?;
    let attn_dim = layer_attention(ck, layer, layers, d)?;
    let stack = match stack {
        "net.blocks" => StackKind::Reversible {
            ff_inner: need_shape(ck, "net.blocks.0.g.net.net.2.weight", 2)?[1],
        },
        _ => StackKind::Sequential,
    };
    let global = mixing.iter().all(TokenMixing::is_global);
    Ok(GmlpConfig {
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
            stack,
            ..BlockOptions::default()
        },
    })
}

/// Per layer, the token mixing (window from W's shape, fold from the conv's); with the
/// gating heads, the same in every layer, and the sequence length n, from the global
/// layers and `seq_len` (which must agree).
fn layer_mixing(
    ck: &Checkpoint,
    layer: &dyn Fn(usize) -> String,
    layers: usize,
    d: usize,
    seq_len: Option<usize>,
) -> Result<(usize, Vec<TokenMixing>, usize)> {
    let mut heads = None;
    let mut mixing = Vec::with_capacity(layers);
    let mut n = seq_len;
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
        Error::Setting(
            Phrase::text(format!(
                "{}: every layer of this g-mlp-gpt model is windowed, so its sequence length is not in the weights: pass ",
                ck.path().display()
            ))
            .and(Setting::SeqLen)
            .then(" (gMLPGPT's seq_len)"),
        )
    })?;
    Ok((heads.unwrap_or(1), mixing, n))
}

/// Checks the shape of each layer's causal mask buffer (`sgu.mask`, not used) where the
/// checkpoint has one: [n, n], or [w, 2w] with a window w.
fn check_masks(
    ck: &Checkpoint,
    config: &GmlpConfig,
    layer: &dyn Fn(usize) -> String,
) -> Result<()> {
    let n = config.seq_len();
    for i in 0..config.layers {
        let mask = format!("{}fn.fn.sgu.mask", layer(i));
        let window = config.block.mixing(i).window;
        if let Some(shape) = ck.shape(&mask) {
            let expected = [window.unwrap_or(n), window.map_or(n, |w| 2 * w)];
            if shape != expected {
                return Err(Error::BadTensor(format!(
                    "{}: buffer {mask} has shape {shape:?}, expected {expected:?}",
                    ck.path().display()
                )));
            }
        }
    }
    Ok(())
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
