//! aMLP's tiny attention (paper fig. 6): a single head of size a on the block's normalized
//! input h, `attn(h) = softmax(q·kᵀ/√a [+ causal mask]) · v · W_o + b_o`, added to the
//! gate. q, k and v are three MatMuls on column slices of W_qkv (no `Split`); causal models
//! add [`MASK_VALUE`](super::super::MASK_VALUE) above the diagonal before the softmax. In a with-past graph k and v
//! are the block's `past_key.{i}` / `past_value.{i}` state followed by the new rows (in a
//! static-state graph, the whole state with the new rows written, masked by position). A
//! block with a window (g-mlp-gpt's `LocalAttention`) attends within its window and, as
//! upstream does, uses its keys as values (see [`super::local`]). In the fused spelling
//! q, k and v come from the block's joined input projection and the attention is ONNX's
//! `Attention` (opset 23), its output bias left to the gate's `Sum`.

use super::super::context::Emitter;
use super::super::sequence::Sequence;
use super::super::static_state::Written;
use crate::error::Result;
use crate::gmlp::emit::block::LocalMixing;
use crate::gmlp::emit::sequence::SequenceAxis;
use crate::gmlp::emit::static_state::StaticStatePart;
use crate::onnx::graph::{Dim, ElemType, Value};

/// The aMLP's tiny attention (paper fig. 6): one head of width `attn_dim` on the block's normalized input, added to the gate.
pub(crate) struct TinyAttention;

impl TinyAttention {
    /// The tiny attention of block `i` (prefix `p`, size `a`) on its normalized input `h`,
    /// over the sequence `seq`, as the gate's terms: projected here, or from `qkv` where
    /// the block's input projection joined them (the fused static step).
    pub(crate) fn emit(
        em: &mut Emitter,
        p: &str,
        h: &Value,
        a: usize,
        qkv: Option<[Value; 3]>,
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Vec<Value>> {
        if !em.fused() {
            return Ok(vec![TinyAttention::standard_ops(em, p, h, a, i, seq)?]);
        }
        let qkv = match qkv {
            Some(qkv) => qkv,
            None => TinyAttention::projections(em, p, h, a)?,
        };
        TinyAttention::fused_kernel(em, p, a, qkv, i, seq)
    }

    /// q, k and v of block prefix `p` (size `a`): three MatMuls with their biases on
    /// column slices of W_qkv.
    fn projections(em: &mut Emitter, p: &str, h: &Value, a: usize) -> Result<[Value; 3]> {
        let form = em.projection_form();
        let weight = format!("{p}.attn.qkv.weight");
        let bias = em
            .cfg
            .block
            .attn_qkv_bias
            .then(|| format!("{p}.attn.qkv.bias"));
        let part = |s: &mut Emitter, k: usize, local: &str| {
            let cols = Some((k * a, (k + 1) * a));
            s.dense(local, h, &weight, bias.as_deref(), cols, form)
        };
        Ok([part(em, 0, "q")?, part(em, 1, "k")?, part(em, 2, "v")?])
    }

    /// `Attention(q, K, V, mask) · W_o + b_o`, the keys and values those of `seq`; b_o
    /// apart in the fused static step (its gate's `Sum` adds it).
    fn fused_kernel(
        em: &mut Emitter,
        p: &str,
        a: usize,
        [q, k, v]: [Value; 3],
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Vec<Value>> {
        let (keys, values) = TinyAttention::keys_and_values(em, i, &k, Some(&v), seq)?;
        let mask = match em.cfg.causal {
            true => Some(SequenceAxis::causal_mask_rows(em, seq)?),
            false => None,
        };
        let scale = (a as f32).powf(-0.5);
        let context =
            em.g.attention("attention", &q, &keys, &values, mask.as_ref(), scale)?;
        let form = em.projection_form();
        let (weight, bias) = (format!("{p}.attn.out.weight"), format!("{p}.attn.out.bias"));
        if !em.joins_step() {
            return Ok(vec![em.dense(
                "out",
                &context,
                &weight,
                Some(&bias),
                None,
                form,
            )?]);
        }
        let out = em.dense("out", &context, &weight, None, None, form)?;
        let bias = em.param(&bias)?;
        Ok(vec![out, bias])
    }

    /// The attention in standard operators: q, k, v projected from `h`, scores, mask,
    /// softmax, context and the output projection with its bias.
    fn standard_ops(
        em: &mut Emitter,
        p: &str,
        h: &Value,
        a: usize,
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Value> {
        // q, k, v from column slices of Wqkv (three MatMuls, no Split).
        let form = em.projection_form();
        let mixing = em.cfg.block.mixing(i);
        let bias = em
            .cfg
            .block
            .attn_qkv_bias
            .then(|| format!("{p}.attn.qkv.bias"));
        // g-mlp-gpt's LocalAttention attends over its keys twice: its values are the keys
        // (upstream's `map(lambda t: torch.cat((k[:, :-1], k[:, 1:]), dim = 2), (k, v))`
        // builds both from k), so a windowed layer has no v.
        let windowed = mixing.window.is_some();
        let used = if windowed { 2 } else { 3 };
        let mut parts = Vec::with_capacity(3);
        for (k, part) in ["q", "k", "v"].into_iter().enumerate().take(used) {
            let weight = format!("{p}.attn.qkv.weight");
            let cols = Some((k * a, (k + 1) * a));
            parts.push(em.dense(part, h, &weight, bias.as_deref(), cols, form)?);
        }
        let elem = parts[0].elem;
        let scale =
            em.g.const_float("scale_value", &[], vec![(a as f32).powf(-0.5)], elem)?;
        let q = em.g.mul("q_scale", &parts[0], &scale)?;
        let (mut keys, mut values) =
            TinyAttention::keys_and_values(em, i, &parts[1], parts.get(2), seq)?;
        let mut local_mask = None;
        if !mixing.is_global() {
            let mut local = seq.local(&em.cfg)?;
            let rows = SequenceAxis::row_positions(em, &mut local)?;
            let cols = SequenceAxis::key_positions(em, &mut local, &keys)?;
            let (mask, zero_keys) = em.scoped("local", |s| {
                let maps = LocalMixing::local_maps(s, mixing, &rows, &cols)?;
                LocalMixing::local_attention_mask(s, &maps, mixing.window)
            })?;
            local_mask = Some(match zero_keys {
                // upstream's first window also attends to w zero keys: one extra zero key
                // (and value) at the end, weighted w by its logit ln(w).
                Some(extra) => {
                    let with_zero = Dim::Symbol(format!("{} + 1", keys.shape[1]));
                    keys =
                        em.g.pad_axis_symbolic("zero_key", &keys, 1, (0, 1), with_zero.clone())?;
                    values = em.g.pad_axis_symbolic(
                        "zero_value",
                        &values,
                        1,
                        (0, 1),
                        with_zero.clone(),
                    )?;
                    em.g.concat_symbolic("local_mask_zero_key", &[&mask, &extra], 1, with_zero)?
                }
                None => mask,
            });
        }
        let kt = em.g.transpose("k_transpose", &keys, &[0, 2, 1])?;
        let scores = em.g.matmul("scores", &q, &kt)?;
        // Mask and softmax in f32 (an f16 model casts around them).
        let mut scores = em.cast_to("scores_to_f32", &scores, ElemType::F32)?;
        if let Some(mask) = &local_mask {
            scores = em.g.add("local_mask", &scores, mask)?;
        } else if em.cfg.causal {
            let mask = SequenceAxis::causal_mask_rows(em, seq)?;
            scores = em.g.add("causal_mask", &scores, &mask)?;
        }
        let probs = em.g.softmax("softmax", &scores, -1)?;
        let probs = em.cast_to("probs_to_f16", &probs, elem)?;
        let context = em.g.matmul("context", &probs, &values)?;
        em.linear(
            "out",
            &context,
            &format!("{p}.attn.out.weight"),
            Some(&format!("{p}.attn.out.bias")),
        )
    }

    /// The keys and values block `i`'s new rows attend to over `seq`, from the new keys
    /// `k` and values `v` (a local attention has none: its values are its keys): the new
    /// ones alone, the growing state's past followed by them, or the whole static state
    /// with them written (the mask hides the rows after each sequence's position).
    fn keys_and_values(
        em: &mut Emitter,
        i: usize,
        k: &Value,
        v: Option<&Value>,
        seq: &mut Sequence,
    ) -> Result<(Value, Value)> {
        match seq {
            Sequence::Fixed(_) | Sequence::Variable(_) => {
                Ok((k.clone(), v.cloned().unwrap_or_else(|| k.clone())))
            }
            Sequence::Growing(pos, state) => {
                let keys = SequenceAxis::with_block_state(em, pos, state, i, "key", k)?;
                let values = match v {
                    Some(v) => SequenceAxis::with_block_state(em, pos, state, i, "value", v)?,
                    None => keys.clone(),
                };
                Ok((keys, values))
            }
            Sequence::Static(state) => {
                let keys = StaticStatePart::update(em, state, i, "key", k, Written::Only)?;
                let values = match v {
                    Some(v) => StaticStatePart::update(em, state, i, "value", v, Written::Only)?,
                    None => keys.clone(),
                };
                Ok((keys, values))
            }
        }
    }
}
