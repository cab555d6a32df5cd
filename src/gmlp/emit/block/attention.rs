//! aMLP's tiny attention (paper fig. 6): a single head of size a on the block's normalized
//! input h, `attn(h) = softmax(q·kᵀ/√a [+ causal mask]) · v · W_o + b_o`, added to the
//! gate. q, k and v are three MatMuls on column slices of W_qkv (no `Split`); causal models
//! add [`MASK_VALUE`] above the diagonal before the softmax. In a with-past graph k and v
//! are the block's `past_key.{i}` / `past_value.{i}` state followed by the new rows (in a
//! static-state graph, the whole state with the new rows written, masked by position). A
//! block with a window (g-mlp-gpt's `LocalAttention`) attends within its window and, as
//! upstream does, uses its keys as values (see [`super::local`]). In the fused spelling
//! q, k and v come from the block's joined input projection and the attention is ONNX's
//! `Attention` (opset 23), its output bias left to the gate's `Sum`.

use super::super::context::Emitter;
use super::super::sequence::Sequence;
use super::super::static_state::Written;
use super::super::MASK_VALUE;
use crate::error::Result;
use crate::onnx::graph::{Dim, ElemType, Value};

impl Emitter {
    /// The additive causal mask [n, n] (0 on and below the diagonal, [`MASK_VALUE`] above),
    /// shared by the blocks; [1, 1, n, n] in the fused spelling, `Attention`'s layout.
    pub(crate) fn causal_mask(&mut self) -> Result<Value> {
        if let Some(v) = &self.causal_mask {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let mut mask = vec![0f32; n * n];
        for i in 0..n {
            mask[i * n + i + 1..(i + 1) * n].fill(MASK_VALUE);
        }
        let dims: &[usize] = if self.fused() { &[1, 1, n, n] } else { &[n, n] };
        let v = self
            .g
            .scoped("shared", |g| g.const_f32("causal_mask", dims, mask))?;
        self.causal_mask = Some(v.clone());
        Ok(v)
    }

    /// The tiny attention of block `i` (prefix `p`, size `a`) on its normalized input `h`,
    /// over the sequence `seq`, as the gate's terms: projected here, or from `qkv` where
    /// the block's input projection joined them (the fused static step).
    pub(crate) fn attention(
        &mut self,
        p: &str,
        h: &Value,
        a: usize,
        qkv: Option<[Value; 3]>,
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Vec<Value>> {
        if !self.fused() {
            return Ok(vec![self.attention_standard(p, h, a, i, seq)?]);
        }
        let qkv = match qkv {
            Some(qkv) => qkv,
            None => self.attention_projections(p, h, a)?,
        };
        self.attention_fused(p, a, qkv, i, seq)
    }

    /// q, k and v of block prefix `p` (size `a`): three MatMuls with their biases on
    /// column slices of W_qkv.
    fn attention_projections(&mut self, p: &str, h: &Value, a: usize) -> Result<[Value; 3]> {
        let form = self.projection_form();
        let weight = format!("{p}.attn.qkv.weight");
        let bias = self
            .cfg
            .block
            .attn_qkv_bias
            .then(|| format!("{p}.attn.qkv.bias"));
        let part = |s: &mut Self, k: usize, local: &str| {
            let cols = Some((k * a, (k + 1) * a));
            s.dense(local, h, &weight, bias.as_deref(), cols, form)
        };
        Ok([
            part(self, 0, "q")?,
            part(self, 1, "k")?,
            part(self, 2, "v")?,
        ])
    }

    /// `Attention(q, K, V, mask) · W_o + b_o`, the keys and values those of `seq`; b_o
    /// apart in the fused static step (its gate's `Sum` adds it).
    fn attention_fused(
        &mut self,
        p: &str,
        a: usize,
        [q, k, v]: [Value; 3],
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Vec<Value>> {
        let (keys, values) = self.keys_and_values(i, &k, Some(&v), seq)?;
        let mask = match self.cfg.causal {
            true => Some(self.causal_mask_rows(seq)?),
            false => None,
        };
        let scale = (a as f32).powf(-0.5);
        let context = self
            .g
            .attention("attention", &q, &keys, &values, mask.as_ref(), scale)?;
        let form = self.projection_form();
        let (weight, bias) = (format!("{p}.attn.out.weight"), format!("{p}.attn.out.bias"));
        if !self.joins_step() {
            return Ok(vec![self.dense(
                "out",
                &context,
                &weight,
                Some(&bias),
                None,
                form,
            )?]);
        }
        let out = self.dense("out", &context, &weight, None, None, form)?;
        let bias = self.param(&bias)?;
        Ok(vec![out, bias])
    }

    /// The attention in standard operators: q, k, v projected from `h`, scores, mask,
    /// softmax, context and the output projection with its bias.
    fn attention_standard(
        &mut self,
        p: &str,
        h: &Value,
        a: usize,
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Value> {
        // q, k, v from column slices of Wqkv (three MatMuls, no Split).
        let form = self.projection_form();
        let mixing = self.cfg.block.mixing(i);
        let bias = self
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
            parts.push(self.dense(part, h, &weight, bias.as_deref(), cols, form)?);
        }
        let elem = parts[0].elem;
        let scale = self
            .g
            .const_float("scale_value", &[], vec![(a as f32).powf(-0.5)], elem)?;
        let q = self.g.mul("q_scale", &parts[0], &scale)?;
        let (mut keys, mut values) = self.keys_and_values(i, &parts[1], parts.get(2), seq)?;
        let mut local_mask = None;
        if !mixing.is_global() {
            let mut local = seq.local(&self.cfg)?;
            let rows = self.row_positions(&mut local)?;
            let cols = self.key_positions(&mut local, &keys)?;
            let (mask, zero_keys) = self.scoped("local", |s| {
                let maps = s.local_maps(mixing, &rows, &cols)?;
                s.local_attention_mask(&maps, mixing.window)
            })?;
            local_mask = Some(match zero_keys {
                // upstream's first window also attends to w zero keys: one extra zero key
                // (and value) at the end, weighted w by its logit ln(w).
                Some(extra) => {
                    let with_zero = Dim::Symbol(format!("{} + 1", keys.shape[1]));
                    keys = self.g.pad_axis_symbolic(
                        "zero_key",
                        &keys,
                        1,
                        (0, 1),
                        with_zero.clone(),
                    )?;
                    values = self.g.pad_axis_symbolic(
                        "zero_value",
                        &values,
                        1,
                        (0, 1),
                        with_zero.clone(),
                    )?;
                    self.g
                        .concat_symbolic("local_mask_zero_key", &[&mask, &extra], 1, with_zero)?
                }
                None => mask,
            });
        }
        let kt = self.g.transpose("k_transpose", &keys, &[0, 2, 1])?;
        let scores = self.g.matmul("scores", &q, &kt)?;
        // Mask and softmax in f32 (an f16 model casts around them).
        let mut scores = self.cast_to("scores_to_f32", &scores, ElemType::F32)?;
        if let Some(mask) = &local_mask {
            scores = self.g.add("local_mask", &scores, mask)?;
        } else if self.cfg.causal {
            let mask = self.causal_mask_rows(seq)?;
            scores = self.g.add("causal_mask", &scores, &mask)?;
        }
        let probs = self.g.softmax("softmax", &scores, -1)?;
        let probs = self.cast_to("probs_to_f16", &probs, elem)?;
        let context = self.g.matmul("context", &probs, &values)?;
        self.linear(
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
        &mut self,
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
                let keys = self.with_block_state(pos, state, i, "key", k)?;
                let values = match v {
                    Some(v) => self.with_block_state(pos, state, i, "value", v)?,
                    None => keys.clone(),
                };
                Ok((keys, values))
            }
            Sequence::Static(state) => {
                let keys = self.update_static_state(state, i, "key", k, Written::Only)?;
                let values = match v {
                    Some(v) => self.update_static_state(state, i, "value", v, Written::Only)?,
                    None => keys.clone(),
                };
                Ok((keys, values))
            }
        }
    }
}
