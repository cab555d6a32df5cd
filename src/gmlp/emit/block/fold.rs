//! The convolution that closes an axial fold (g-mlp-gpt 0.0.15 `AxiallyFold`): after the
//! block ran on the e interleaved sub-sequences (the fold itself is in the index maps of
//! [`super::local`]), its output goes through a causal depthwise Conv1d of kernel e, left
//! padded with e − 1 zeros (`nn.Conv1d(d, d, e, groups = d)` after `F.pad(x, (e − 1, 0))`).
//! A with-past graph keeps the last e − 1 block outputs as `past_fold.{i}`.

use super::super::context::Emitter;
use super::super::sequence::{LocalSequence, Sequence};
use crate::error::Result;
use crate::gmlp::emit::sequence::SequenceAxis;
use crate::onnx::graph::Value;

/// A block's axial fold: the convolution over the folded sequence axis.
pub(crate) struct AxialFold;

impl AxialFold {
    /// The fold's convolution of block `i` (prefix `p`) on the block output `y` [B, T, d],
    /// over the sequence `seq` (with a growing state: the last e − 1 outputs before `y`).
    pub(crate) fn fold_conv(
        em: &mut Emitter,
        p: &str,
        i: usize,
        y: &Value,
        seq: &mut Sequence,
    ) -> Result<Value> {
        let w = em.param(&format!("{p}.fold.weight"))?;
        let b = em.param(&format!("{p}.fold.bias"))?;
        let conv = |s: &mut Emitter, full: &Value| {
            let channels_first = s.g.transpose("channels_first", full, &[0, 2, 1])?;
            let conv =
                s.g.conv1d_causal_depthwise("conv", &channels_first, &w, &b)?;
            s.g.transpose("tokens_first", &conv, &[0, 2, 1])
        };
        let LocalSequence::Growing(pos, state) = seq.local(&em.cfg)? else {
            return conv(em, y);
        };
        let full = SequenceAxis::with_block_state(em, pos, state, i, "fold", y)?;
        let out = conv(em, &full)?;
        // Keep the rows of the new positions: the last T of past ‖ new.
        let all = em.g.shape_of("all_rows", &out, 1, 2)?;
        let new = em.g.shape_of("new_rows", y, 1, 2)?;
        let start = em.g.sub("new_start", &all, &new)?;
        em.g.slice_dynamic("new_positions", &out, &start, &all, &[1], y.shape.clone())
    }
}
