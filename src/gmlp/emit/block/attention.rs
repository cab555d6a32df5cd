//! aMLP's tiny attention (paper fig. 6): a single head of size a on the block's normalized
//! input h, `attn(h) = softmax(q·kᵀ/√a [+ causal mask]) · v · W_o + b_o`, added to the
//! gate. q, k and v are three MatMuls on column slices of W_qkv (no `Split`); causal models
//! add [`MASK_VALUE`] above the diagonal before the softmax. In a with-past graph k and v
//! are the block's `past_key.{i}` / `past_value.{i}` state followed by the new rows.

use super::super::context::Emitter;
use super::super::MASK_VALUE;
use crate::error::Result;
use crate::gmlp::config::Precision;
use crate::gmlp::decoding::SequenceMode;
use crate::onnx::graph::{ElemType, Value};

impl Emitter {
    /// The additive causal mask [n, n] (0 on and below the diagonal, [`MASK_VALUE`] above),
    /// shared by the blocks.
    pub(crate) fn causal_mask(&mut self) -> Result<Value> {
        if let Some(v) = &self.causal_mask {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let mut mask = vec![0f32; n * n];
        for i in 0..n {
            mask[i * n + i + 1..(i + 1) * n].fill(MASK_VALUE);
        }
        let v = self
            .g
            .scoped("shared", |g| g.const_f32("causal_mask", &[n, n], mask))?;
        self.causal_mask = Some(v.clone());
        Ok(v)
    }

    /// The tiny attention of block `i` (prefix `p`, size `a`) on its normalized input `h`.
    pub(crate) fn attention(&mut self, p: &str, h: &Value, a: usize, i: usize) -> Result<Value> {
        // q, k, v from column slices of Wqkv (three MatMuls, no Split).
        let quantize = self.cfg.dtype == Precision::Int8;
        let mut parts = Vec::with_capacity(3);
        for (k, part) in ["q", "k", "v"].into_iter().enumerate() {
            let weight = format!("{p}.attn.qkv.weight");
            let cols = Some((k * a, (k + 1) * a));
            parts.push(self.dense(part, h, &weight, None, cols, quantize)?);
        }
        let elem = parts[0].elem;
        let scale = self
            .g
            .const_float("scale_value", &[], vec![(a as f32).powf(-0.5)], elem)?;
        let q = self.g.mul("q_scale", &parts[0], &scale)?;
        let (keys, values) = if self.mode == SequenceMode::WithPast {
            (
                self.with_past(&format!("past_key.{i}"), "key", &parts[1])?,
                self.with_past(&format!("past_value.{i}"), "value", &parts[2])?,
            )
        } else {
            (parts[1].clone(), parts[2].clone())
        };
        let kt = self.g.transpose("k_transpose", &keys, &[0, 2, 1])?;
        let scores = self.g.matmul("scores", &q, &kt)?;
        // Mask and softmax in f32 (an f16 model casts around them).
        let mut scores = self.cast_to("scores_to_f32", &scores, ElemType::F32)?;
        if self.cfg.causal {
            let mask = if self.mode == SequenceMode::Fixed {
                self.causal_mask()?
            } else {
                self.mask_rows()?
            };
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
}
