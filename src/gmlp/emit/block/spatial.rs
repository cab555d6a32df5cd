//! The spatial projection of the gating unit, `W · u + b` over the tokens (paper eq. 2–3):
//! W is n×n per gating head (g-mlp-pytorch's `heads` split the e gate channels into
//! contiguous groups, each with its own W and b), stored dense, as a Toeplitz matrix
//! expanded to n×n, or as its [2n−1] vector gathered through an index table
//! `W[i, j] = w[j − i + n − 1]` (paper §4). Causal models have W[i, j] = 0 for j > i in
//! the stored values. A variable-length or with-past graph reads rows P..P+T−1 and columns
//! 0..P+T−1 of W (see [`super::super::sequence`]); its state is u = LN(z2), `past_sgu.{i}`.
//! A static-state graph reads each sequence's rows P_b..P_b+T−1 and all n columns.

use super::super::context::Emitter;
use super::super::sequence::{GrowingState, LocalSequence, Positions, Sequence};
use super::super::static_state::{StaticState, Written};
use crate::error::Result;
use crate::gmlp::config::{Precision, SpatialForm, TokenMixing};
use crate::gmlp::emit::block::LocalMixing;
use crate::gmlp::emit::sequence::SequenceAxis;
use crate::gmlp::emit::static_state::StaticStatePart;
use crate::gmlp::toeplitz::{mask_upper, toeplitz_expand, toeplitz_index};
use crate::onnx::graph::{Dim, Value};

/// The spatial projection `W·LN(z2) + b` of the gating unit (paper eq. 2): W dense or Toeplitz (expanded or gathered), per head, over the rows the sequence mode needs.
pub(crate) struct SpatialProjection;

impl SpatialProjection {
    /// Leading `[heads]` dimension when the gate has more than one head.
    fn head_dims(em: &Emitter, rest: &[usize]) -> Vec<usize> {
        let mut dims = rest.to_vec();
        if em.cfg.heads > 1 {
            dims.insert(0, em.cfg.heads);
        }
        dims
    }

    /// The spatial bias b, stored as [n, 1] (or [h, n, 1]) so it broadcasts over channels;
    /// `None` for models without it (gmlp-tinygrad).
    pub(crate) fn bias(em: &mut Emitter, name: &str) -> Result<Option<Value>> {
        if !em.cfg.block.spatial_bias {
            return Ok(None);
        }
        let dims = SpatialProjection::head_dims(em, &[em.cfg.seq_len(), 1]);
        em.reshaped_param(name, &dims).map(Some)
    }

    /// The Toeplitz vector w [2n−1] (or [h, 2n−1]) of the gather form, causal part only
    /// for causal models.
    pub(crate) fn toeplitz_vector(em: &mut Emitter, name: &str) -> Result<Value> {
        let n = em.cfg.seq_len();
        let causal = em.cfg.causal;
        let dims = SpatialProjection::head_dims(em, &[2 * n - 1]);
        em.lazy_param(name, &dims, move |mut w| {
            if causal {
                // w[k] serves j − i = k − (n − 1); k > n − 1 is above the diagonal.
                w.chunks_mut(2 * n - 1).for_each(|v| v[n..].fill(0.0));
            }
            w
        })
    }

    /// The spatial weight W as an [n, n] (or [h, n, n]) value in the configured form.
    pub(crate) fn weight(em: &mut Emitter, name: &str) -> Result<Value> {
        let n = em.cfg.seq_len();
        let causal = em.cfg.causal;
        let mask_each = move |mut w: Vec<f32>| {
            if causal {
                w.chunks_mut(n * n).for_each(|m| mask_upper(m, n));
            }
            w
        };
        match em.cfg.spatial {
            SpatialForm::Dense => {
                let dims = SpatialProjection::head_dims(em, &[n, n]);
                em.lazy_param(name, &dims, mask_each)
            }
            SpatialForm::ToeplitzExpand => {
                let dims = SpatialProjection::head_dims(em, &[n, n]);
                em.lazy_param(name, &dims, move |w| {
                    let full = w
                        .chunks(2 * n - 1)
                        .flat_map(|v| toeplitz_expand(v, n))
                        .collect();
                    mask_each(full)
                })
            }
            SpatialForm::ToeplitzGather => {
                let vector = SpatialProjection::toeplitz_vector(em, name)?;
                let index = match &em.toeplitz_index {
                    Some(v) => v.clone(),
                    None => {
                        let v = em.g.scoped("shared", |g| {
                            g.const_i64("toeplitz_index", &[n, n], toeplitz_index(n))
                        })?;
                        em.toeplitz_index = Some(v.clone());
                        v
                    }
                };
                let axis = vector.shape.len() - 1;
                em.g.gather("spatial_weight_gather", &vector, &index, axis)
            }
        }
    }

    /// `W · LN(z2) + b` of the block with prefix `p` (index `i`) over the sequence `seq`,
    /// one W and b per head, as the gate's terms ([`Self::mix_per_head`]).
    pub(crate) fn emit(
        em: &mut Emitter,
        z2: &Value,
        p: &str,
        i: usize,
        seq: &mut Sequence,
    ) -> Result<Vec<Value>> {
        let mixing = em.cfg.block.mixing(i);
        if !mixing.is_global() {
            let local = seq.local(&em.cfg)?;
            return SpatialProjection::local(em, z2, p, i, mixing, local);
        }
        match seq {
            Sequence::Fixed(_) => SpatialProjection::full(em, z2, p),
            Sequence::Variable(pos) => SpatialProjection::rows(em, z2, p, i, pos, None),
            Sequence::Growing(pos, state) => {
                SpatialProjection::rows(em, z2, p, i, pos, Some(state))
            }
            Sequence::Static(state) => SpatialProjection::static_rows(em, z2, p, i, state),
        }
    }

    /// `W · u + b` over the whole sequence of n tokens.
    fn full(em: &mut Emitter, z2: &Value, p: &str) -> Result<Vec<Value>> {
        let name = format!("{p}.sgu.spatial.weight");
        // int8 models quantize W at build time (spatial_int8.rs) instead of emitting it.
        let w = match em.cfg.dtype {
            Precision::Int8 => None,
            _ => Some(SpatialProjection::weight(em, &name)?),
        };
        let b = SpatialProjection::bias(em, &format!("{p}.sgu.spatial.bias"))?;
        let mix = |s: &mut Emitter, u: &Value| match &w {
            Some(w) => s.g.matmul("spatial_matmul", w, u),
            None => SpatialProjection::matmul_int8(s, "spatial_matmul", &name, u),
        };
        let n = em.cfg.seq_len();
        let rows = (n as i64, Dim::Fixed(n));
        SpatialProjection::mix_per_head(em, z2, mix, b.as_ref(), rows.clone(), rows)
    }

    /// W[P:P+T, 0:P+T] · u[0:P+T] + b[P:P+T] with u = the past of a growing `state` (if
    /// any) followed by `z2`.
    fn rows(
        em: &mut Emitter,
        z2: &Value,
        p: &str,
        i: usize,
        pos: &mut Positions,
        state: Option<&mut GrowingState>,
    ) -> Result<Vec<Value>> {
        let name = format!("{p}.sgu.spatial.weight");
        let row_axis = usize::from(em.cfg.heads > 1);
        // int8 models: Wᵀ's columns P..P+T−1 (rows 0..P+T−1) of the quantized matrix
        // (spatial_int8.rs); f32/f16: W's rows P..P+T−1 (columns 0..P+T−1).
        let int8 = em.cfg.dtype == Precision::Int8;
        let w = match em.cfg.spatial {
            _ if int8 => None,
            SpatialForm::ToeplitzGather => {
                let vector = SpatialProjection::toeplitz_vector(em, &name)?;
                let index = pos.toeplitz_index_rows(&mut em.g, em.cfg.seq_len())?;
                let axis = vector.shape.len() - 1;
                Some(em.g.gather("spatial_weight_gather", &vector, &index, axis)?)
            }
            SpatialForm::Dense | SpatialForm::ToeplitzExpand => {
                let full = SpatialProjection::weight(em, &name)?;
                let rows = pos.rows_of(&mut em.g, "spatial_weight_rows", &full, row_axis)?;
                Some(pos.first_columns(&mut em.g, "spatial_weight_columns", &rows)?)
            }
        };
        let mix = |s: &mut Emitter, u: &Value| match &w {
            Some(w) => s.g.matmul("spatial_matmul", w, u),
            None => SpatialProjection::matmul_int8_rows(s, "spatial_matmul", &name, u, pos),
        };
        let b = match SpatialProjection::bias(em, &format!("{p}.sgu.spatial.bias"))? {
            Some(b) => Some(pos.rows_of(&mut em.g, "spatial_bias_rows", &b, row_axis)?),
            None => None,
        };
        let u = match state {
            Some(state) => {
                SequenceAxis::with_past(em, pos, state, &format!("past_sgu.{i}"), "sgu", z2)?
            }
            None => z2.clone(),
        };
        let (total, seq) = (u.shape[1].clone(), z2.shape[1].clone());
        SpatialProjection::mix_per_head(em, &u, mix, b.as_ref(), (-1, total), (-1, seq))
    }

    /// W[P_b + t, :] · u + b[P_b + t] for the new rows of a static-state graph (see
    /// [`super::super::static_state`]), u = the block's whole `sgu` state [batch, n, e]
    /// with the new rows written first: each sequence's rows of W (a `Gather` of W, or of
    /// the Toeplitz vector at `s − (P_b + t) + n − 1`) are zero past the diagonal, so the
    /// rows after P_b + t never count, and u is read with every row after the last
    /// written one read as that row (`Written::Only`: a state that may hold anything
    /// there), so what the buffer holds never reaches the result. int8 models keep this W
    /// in f32 (a step reads one row of it). The biases of all blocks may have been read
    /// together ([`StaticState::stacked_spatial_bias`]).
    fn static_rows(
        em: &mut Emitter,
        z2: &Value,
        p: &str,
        i: usize,
        state: &mut StaticState,
    ) -> Result<Vec<Value>> {
        let name = format!("{p}.sgu.spatial.weight");
        let n = em.cfg.seq_len();
        let heads = em.cfg.heads > 1;
        let row_axis = usize::from(heads);
        let rows = state.rows().clone();
        let toeplitz_index = match em.cfg.spatial {
            SpatialForm::ToeplitzGather => Some(StaticStatePart::toeplitz_index(em, state)?),
            SpatialForm::Dense | SpatialForm::ToeplitzExpand => None,
        };
        let w = SpatialProjection::weight_rows(em, &name, &rows, toeplitz_index.as_ref())?;
        // The gather form's index already spans the rows the state is read at.
        let w = match toeplitz_index {
            Some(_) => w,
            None => StaticStatePart::read_columns(em, state, w)?,
        };
        // [h, batch, T, ·] → [batch, h, T, ·], the layout of mix_per_head's heads.
        let heads_second = |s: &mut Emitter, local: &str, v: Value| {
            if heads {
                s.g.transpose(local, &v, &[1, 0, 2, 3])
            } else {
                Ok(v)
            }
        };
        let w = heads_second(em, "spatial_weight_heads", w)?;
        let b = match state.stacked_spatial_bias(i) {
            Some(b) => Some(b),
            None => match SpatialProjection::bias(em, &format!("{p}.sgu.spatial.bias"))? {
                Some(b) => {
                    let picked = em.g.gather("spatial_bias_rows", &b, &rows, row_axis)?;
                    Some(heads_second(em, "spatial_bias_heads", picked)?)
                }
                None => None,
            },
        };
        let u = StaticStatePart::update(em, state, i, "sgu", z2, Written::Only)?;
        let seq = z2.shape[1].clone();
        let mix = |s: &mut Emitter, u: &Value| s.g.matmul("spatial_matmul", &w, u);
        // All n rows, or the rows the state is read at (`--target tract`).
        let rows_in = match &u.shape[1] {
            Dim::Fixed(_) => (n as i64, Dim::Fixed(n)),
            read => (-1, read.clone()),
        };
        SpatialProjection::mix_per_head(em, &u, mix, b.as_ref(), rows_in, (-1, seq))
    }

    /// The rows of W (parameter `name`) at each sequence's rows `rows` i64 [batch, T] of a
    /// static-state step: the Toeplitz vector gathered at `toeplitz_index` (`s − row + n − 1`,
    /// the gather form, which needs it), else the stored W's rows.
    pub(crate) fn weight_rows(
        em: &mut Emitter,
        name: &str,
        rows: &Value,
        toeplitz_index: Option<&Value>,
    ) -> Result<Value> {
        match (em.cfg.spatial, toeplitz_index) {
            (SpatialForm::ToeplitzGather, Some(index)) => {
                let vector = SpatialProjection::toeplitz_vector(em, name)?;
                let axis = vector.shape.len() - 1;
                em.g.gather("spatial_weight_gather", &vector, index, axis)
            }
            (SpatialForm::ToeplitzGather, None) => Err(crate::error::Error::Internal(format!(
                "{name}: the gather form reads W at a Toeplitz index"
            ))),
            (SpatialForm::Dense | SpatialForm::ToeplitzExpand, _) => {
                let full = SpatialProjection::weight(em, name)?;
                let row_axis = usize::from(em.cfg.heads > 1);
                em.g.gather("spatial_weight_rows", &full, rows, row_axis)
            }
        }
    }

    /// The spatial projection of a block with a window or an axial fold (see
    /// [`super::local`]): W_eff's rows for the new positions and columns for the key rows
    /// (every earlier row, or a window's last rows in a with-past graph), gathered from the
    /// stored W through the index maps and zeroed where a row may not read a key.
    fn local(
        em: &mut Emitter,
        z2: &Value,
        p: &str,
        i: usize,
        mixing: TokenMixing,
        mut seq: LocalSequence,
    ) -> Result<Vec<Value>> {
        let name = format!("{p}.sgu.spatial.weight");
        let u = match &mut seq {
            LocalSequence::Growing(pos, state) => {
                SequenceAxis::with_block_state(em, pos, state, i, "sgu", z2)?
            }
            LocalSequence::Fixed(_) | LocalSequence::Variable(_) => z2.clone(),
        };
        let rows = SequenceAxis::row_positions(em, &mut seq)?;
        let cols = SequenceAxis::key_positions(em, &mut seq, &u)?;
        let maps = em.scoped("local", |s| {
            LocalMixing::local_maps(s, mixing, &rows, &cols)
        })?;
        let heads = em.cfg.heads;
        let flat = |shape: &[usize]| -> Vec<usize> {
            let keep = usize::from(heads > 1);
            let mut dims = shape[..keep].to_vec();
            dims.push(shape[keep..].iter().product());
            dims
        };
        let w_dims = flat(&em.spec(&name)?.shape);
        let w = em.reshaped_param(&name, &w_dims)?;
        let axis = w_dims.len() - 1;
        let gathered =
            em.g.gather("spatial_weight_gather", &w, &maps.weight_index, axis)?;
        let valid = em.g.cast("spatial_weight_valid", &maps.valid, w.elem)?;
        let w_eff = em.g.mul("spatial_weight_local", &gathered, &valid)?;
        let b = if em.cfg.block.spatial_bias {
            let b_name = format!("{p}.sgu.spatial.bias");
            let b_dims = flat(&em.spec(&b_name)?.shape);
            let b = em.reshaped_param(&b_name, &b_dims)?;
            let axis = b_dims.len() - 1;
            let picked =
                em.g.gather("spatial_bias_gather", &b, &maps.bias_index, axis)?;
            let mut shape = picked.shape.clone();
            shape.push(Dim::Fixed(1));
            let target: Vec<i64> = if heads > 1 {
                vec![heads as i64, -1, 1]
            } else {
                vec![-1, 1]
            };
            Some(em.g.reshape("spatial_bias_column", &picked, &target, shape)?)
        } else {
            None
        };
        let (s_rows, t_rows) = (u.shape[1].clone(), z2.shape[1].clone());
        let mix = |s: &mut Emitter, u: &Value| s.g.matmul("spatial_matmul", &w_eff, u);
        SpatialProjection::mix_per_head(em, &u, mix, b.as_ref(), (-1, s_rows), (-1, t_rows))
    }

    /// `mix(u) (+ b)` with one W and b per gating head: the gate channels are split into
    /// `heads` contiguous groups ([B, rows, e] → [B, h, rows, e/h]) around the mixing and
    /// merged back after the bias. `rows_in` / `rows_out` give the token axis before and
    /// after the mixing (the Reshape's entry and the static dimension). The gate's terms:
    /// one, or with one head in the fused static step the product and the bias apart (the
    /// gate's `Sum` adds them).
    pub(crate) fn mix_per_head(
        em: &mut Emitter,
        u: &Value,
        mix: impl FnOnce(&mut Emitter, &Value) -> Result<Value>,
        b: Option<&Value>,
        rows_in: (i64, Dim),
        rows_out: (i64, Dim),
    ) -> Result<Vec<Value>> {
        let heads = em.cfg.heads;
        let add_bias = |s: &mut Emitter, mixed: Value| match b {
            Some(b) => s.g.add("spatial_bias", &mixed, b),
            None => Ok(mixed),
        };
        if heads == 1 {
            let mixed = mix(em, u)?;
            return match b {
                Some(b) if em.joins_step() => Ok(vec![mixed, b.clone()]),
                _ => Ok(vec![add_bias(em, mixed)?]),
            };
        }
        let e = em.cfg.gate_dim();
        let c = e / heads;
        let batch = u.shape[0].clone();
        let split = em.g.reshape(
            "split_heads",
            u,
            &[0, rows_in.0, heads as i64, c as i64],
            vec![batch.clone(), rows_in.1, Dim::Fixed(heads), Dim::Fixed(c)],
        )?;
        let per_head = em.g.transpose("heads_first", &split, &[0, 2, 1, 3])?;
        let mixed = mix(em, &per_head)?;
        let biased = add_bias(em, mixed)?;
        let back = em.g.transpose("tokens_first", &biased, &[0, 2, 1, 3])?;
        let merged = em.g.reshape(
            "merge_heads",
            &back,
            &[0, rows_out.0, e as i64],
            vec![batch, rows_out.1, Dim::Fixed(e)],
        )?;
        Ok(vec![merged])
    }
}
