//! The static-state step in ONNX Runtime's fused kernels (`--target onnxruntime`;
//! docs/static-state.md, "The onnxruntime step"). The same network and interface as
//! static_state.rs's graph, fewer nodes: on a GPU every node is at least one kernel launch,
//! and a decode step of a small model is bound by launches, not bytes. Per block:
//!
//! ```text
//! h, x  = SkipLayerNormalization(x, y_prev, bias = b_V,prev)   (block 0: LayerNormalization)
//! pre   = h · [U | W_qkv] + [b_U | b_qkv]   one MatMul + Add (MatMulNBits with its bias)
//! z1, z2, q, k, v = Split(pre)
//! u     = TensorScatter(past_sgu, LN(GELU(z2)))            written rows only, in place
//! gate  = Sum(W[P_b + t, :] · u, b[P_b + t], Attention(q, K, V, mask) · W_o, b_o)
//! y     = (z1 ⊙ act(gate)) · V                              b_V goes to the next SkipLN
//! ```
//!
//! with K and V the keys and values written by `TensorScatter`, the spatial biases of all
//! blocks read at once (a stacked table, one `Gather`, one `Split`) and the mask additive
//! (−10⁹ after each sequence's row P_b + t) over all n rows. The positions are i64
//! arithmetic (this file is for ONNX Runtime alone, CPU or CUDA, whose CUDA provider has the
//! i64 kernels; the WebGPU provider's lack of them is why static_state.rs computes in f32),
//! checked as there: a row outside 0..n fails at a `Gather`.
//!
//! **Unwritten rows are not guarded here.** The state is read as it is: the rows after each
//! sequence's last one count with a weight of 0 (the causal W, the mask), which hides any
//! finite value there but not a NaN (0 × NaN = NaN). The file therefore declares in its
//! metadata that its state buffers must start zeroed ([`StateStart::Zeroed`]), which every
//! loop the project ships guarantees (our decoder allocates and resets them as zeros,
//! Triton's `initial_state` is `zero_data`; genai, which leaves them unfilled on some
//! devices, refuses such a file). That saves static_state.rs's copy of every state every
//! step (its cost grows with the state, not with the rows a step writes).
//!
//! [`StateStart::Zeroed`]: crate::gmlp::interface::StateStart::Zeroed

use std::collections::HashMap;

use super::context::Emitter;
use super::linear::JoinedColumns;
use super::static_state::{static_state_input, StaticInputs};
use super::{BATCH, INPUT_IDS, MASK_VALUE};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, NormKind, Precision, SpatialForm, StackKind, Task};
use crate::gmlp::interface::{SequenceMode, SEQUENCE};
use crate::onnx::forms::{Fusions, OpForms};
use crate::onnx::graph::{Dim, ElemType, Value};
use crate::onnx::ops::TENSOR_SCATTER_OPSET;

/// Whether `cfg`, emitted in `mode` at `opset` with `forms`, gets the fused step: a static
/// state at an opset with `TensorScatter` (24, after `Attention`'s 23) for a profile that
/// asks for ONNX Runtime's fusions, in a token model of sequential blocks with LayerNorm,
/// no token shift, and f32 or block-quantized (`MatMulNBits`) projections. Other models
/// keep static_state.rs's graph.
pub fn fused_step_applies(
    cfg: &GmlpConfig,
    mode: SequenceMode,
    opset: i64,
    forms: OpForms,
) -> bool {
    forms.fusions == Fusions::OnnxRuntime
        && mode == SequenceMode::Static
        && opset >= TENSOR_SCATTER_OPSET
        && matches!(cfg.task, Task::Tokens { .. })
        && cfg.block.norm == NormKind::LayerNorm
        && matches!(cfg.block.stack, StackKind::Sequential)
        && cfg.shift_tokens == 0
        && matches!(
            cfg.dtype,
            Precision::F32 | Precision::Int4 | Precision::Int8WeightOnly
        )
}

/// The checked rows of a fused step's new tokens and what the blocks derive from them.
struct FusedRows {
    /// P_b + t, i64 [batch, sequence], checked within 0..n.
    rows: Value,
    /// P_b, i64 [batch]: `TensorScatter`'s write indices (the first checked row).
    start: Value,
    /// `s − (P_b + t) + n − 1`, i64 [batch, sequence, n] (the Toeplitz vector's index, and
    /// the mask's), made on first use.
    toeplitz_index: Option<Value>,
    /// The additive mask f32 [batch, 1, sequence, n] of the attention, made on first use.
    mask: Option<Value>,
}

/// The step's state: the rows, the `past_*` inputs by name, the `present_*` outputs made,
/// and every block's spatial bias at the new rows when they were gathered together.
struct FusedState {
    rows: FusedRows,
    past: HashMap<String, Value>,
    present: Vec<(String, Value)>,
    /// `b_i[P_b + t]` of each block i, f32 [batch, sequence, 1] (one gating head).
    spatial_biases: Option<Vec<Value>>,
}

/// What a block hands the next one: its branch y and the bias its output projection
/// leaves to the next `SkipLayerNormalization`.
struct Branch {
    y: Value,
    bias: Value,
}

impl Emitter {
    /// The whole fused step: the logits and the `present_*` outputs (in the order made).
    pub(crate) fn fused_step(&mut self) -> Result<(Value, Vec<(String, Value)>)> {
        let batch = Dim::Symbol(BATCH.into());
        let seq = Dim::Symbol(SEQUENCE.into());
        let ids = self
            .g
            .input(INPUT_IDS, ElemType::I64, vec![batch.clone(), seq])?;
        let StaticInputs { position, past } = self.declare_static_inputs(&batch)?;
        let table = self.param("embed.weight")?;
        let mut x = self.scoped("embed", |s| s.g.gather("gather", &table, &ids, 0))?;
        let rows = self.scoped("positions", |s| s.fused_rows(&position, &ids))?;
        let spatial_biases = self.scoped("shared", |s| s.stacked_spatial_biases(&rows.rows))?;
        let mut state = FusedState {
            rows,
            past,
            present: Vec::new(),
            spatial_biases,
        };
        let mut branch: Option<Branch> = None;
        for i in 0..self.cfg.layers {
            let p = format!("blocks.{i}");
            let next = self.scoped(&p, |s| {
                let h = match branch.take() {
                    None => s.norm("norm", &x, &format!("{p}.norm"), s.cfg.norm_eps)?,
                    Some(b) => {
                        let (h, sum) = s.skip_norm("norm", &x, &b, &format!("{p}.norm"))?;
                        x = sum;
                        h
                    }
                };
                s.fused_block(i, &p, &h, &mut state)
            })?;
            branch = Some(next);
        }
        let last = branch.ok_or_else(|| Error::Internal("a model without blocks".into()))?;
        let (h, _) = self.skip_norm("final_norm", &x, &last, "norm")?;
        let logits = self.head(&h, Some(table))?;
        Ok((logits, state.present))
    }

    /// `SkipLayerNormalization` of `x + y + bias` with the LayerNorm parameters
    /// `{prefix}.weight` and `{prefix}.bias`: the normalized value and the sum.
    fn skip_norm(
        &mut self,
        local: &str,
        x: &Value,
        branch: &Branch,
        prefix: &str,
    ) -> Result<(Value, Value)> {
        let (w, b) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let dims = self.spec(&w)?.shape;
        let scale = self.lazy_param_as(&w, &dims, ElemType::F32, |v| v)?;
        let shift = self.lazy_param_as(&b, &dims, ElemType::F32, |v| v)?;
        let eps = self.cfg.norm_eps;
        self.g
            .skip_layer_norm(local, x, &branch.y, &scale, &shift, Some(&branch.bias), eps)
    }

    /// The checked rows P_b + t of the new tokens `ids` (i64 arithmetic; see the module
    /// doc): the offsets t are an exclusive running sum of ones made from the ids' values
    /// (no `Shape`, so every node can run on the GPU), and each row is looked up in the
    /// table 0..n−1 at the row and at the row − n, which fails for a row ≥ n or < 0.
    fn fused_rows(&mut self, position: &Value, ids: &Value) -> Result<FusedRows> {
        let n = self.cfg.seq_len();
        let batch = ids.shape[0].clone();
        let g = &mut self.g;
        let zero = g.const_i64("zero", &[], vec![0])?;
        let one = g.const_i64("one", &[], vec![1])?;
        let axis1 = g.const_i64("axis_tokens", &[], vec![1])?;
        let ids_zero = g.mul("token_zero", ids, &zero)?;
        let ones = g.add("token_one", &ids_zero, &one)?;
        let offsets = g.cum_sum("offsets", &ones, &axis1, true)?;
        let column = g.reshape(
            "position_column",
            position,
            &[-1, 1],
            vec![batch.clone(), 1.into()],
        )?;
        let raw = g.add("rows_unchecked", &column, &offsets)?;
        let table = g.const_i64("table", &[n], (0..n as i64).collect())?;
        let n_c = g.const_i64("n", &[], vec![n as i64])?;
        let below = g.sub("rows_minus_n", &raw, &n_c)?;
        let upper = g.gather("check_below_n", &table, &raw, 0)?;
        let lower = g.gather("check_not_negative", &table, &below, 0)?;
        let rows = g.max("rows", &upper, &lower)?;
        let first = g.const_i64("start_token", &[], vec![0])?;
        let start = g.gather("start", &rows, &first, 1)?;
        Ok(FusedRows {
            rows,
            start,
            toeplitz_index: None,
            mask: None,
        })
    }

    /// Every block's spatial bias at the new rows `rows`, read together: the L vectors b_i
    /// [n] side by side in one table [n, L], one `Gather` of its rows and one `Split` into
    /// the blocks' [batch, sequence, 1] columns (two nodes where one `Gather` per block would
    /// be L). `None` with several gating heads or without the bias.
    fn stacked_spatial_biases(&mut self, rows: &Value) -> Result<Option<Vec<Value>>> {
        let layers = self.cfg.layers;
        if self.cfg.heads > 1 || !self.cfg.block.spatial_bias || layers < 2 {
            return Ok(None);
        }
        let n = self.cfg.seq_len();
        let params: Vec<String> = (0..layers)
            .map(|i| format!("blocks.{i}.sgu.spatial.bias"))
            .collect();
        let elem = self.cfg.dtype.elem();
        let table = self.joined_param(
            "sgu.spatial.bias.stacked",
            &params,
            &[n, layers],
            elem,
            move |v| Ok((0..n).flat_map(|r| v.iter().map(move |b| b[r])).collect()),
        )?;
        let picked = self.g.gather("spatial_bias_rows", &table, rows, 0)?;
        let columns = self
            .g
            .split("spatial_bias_blocks", &picked, -1, &vec![1; layers])?;
        Ok(Some(columns))
    }

    /// `s − (P_b + t) + n − 1`, i64 [batch, sequence, n] (shared).
    fn fused_toeplitz_index(&mut self, r: &mut FusedRows) -> Result<Value> {
        if let Some(v) = &r.toeplitz_index {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let v = self.g.scoped("positions", |g| {
            let mut shape = r.rows.shape.clone();
            shape.push(1.into());
            let rows3 = g.reshape("rows_column", &r.rows, &[0, 0, 1], shape)?;
            let diagonal = g.const_i64(
                "toeplitz_diagonal",
                &[n],
                (0..n as i64).map(|s| s + n as i64 - 1).collect(),
            )?;
            g.sub("toeplitz_index", &diagonal, &rows3)
        })?;
        r.toeplitz_index = Some(v.clone());
        Ok(v)
    }

    /// The attention's additive mask f32 [batch, 1, sequence, n]: 0 for rows s ≤ P_b + t,
    /// [`MASK_VALUE`] after, looked up at the Toeplitz index (≤ n − 1 exactly where s ≤
    /// P_b + t) in a table of 2n − 1 entries (shared).
    fn fused_mask(&mut self, r: &mut FusedRows) -> Result<Value> {
        if let Some(v) = &r.mask {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let index = self.fused_toeplitz_index(r)?;
        let v = self.g.scoped("positions", |g| {
            let values = (0..2 * n - 1)
                .map(|k| if k < n { 0.0 } else { MASK_VALUE })
                .collect();
            let table = g.const_f32("mask_table", &[2 * n - 1], values)?;
            let rows = g.gather("mask_rows", &table, &index, 0)?;
            let (b, t) = (index.shape[0].clone(), index.shape[1].clone());
            g.reshape(
                "attention_mask",
                &rows,
                &[0, 1, -1, n as i64],
                vec![b, 1.into(), t, Dim::Fixed(n)],
            )
        })?;
        r.mask = Some(v.clone());
        Ok(v)
    }

    /// Writes `new` into block `i`'s state of `kind` at the new rows (`TensorScatter`);
    /// the result, the `present_*` output, is the state the computation reads.
    fn fused_write(
        &mut self,
        state: &mut FusedState,
        i: usize,
        kind: &str,
        new: &Value,
    ) -> Result<Value> {
        let (tensor, past) = static_state_input(&self.cfg, &state.past, i, kind)?;
        let present =
            self.g
                .tensor_scatter(&format!("{kind}_update"), &past, new, &state.rows.start, 1)?;
        state.present.push((tensor.present, present.clone()));
        Ok(present)
    }

    /// Block `i` (prefix `p`) on its normalized input `h`: its branch y and b_V.
    fn fused_block(
        &mut self,
        i: usize,
        p: &str,
        h: &Value,
        state: &mut FusedState,
    ) -> Result<Branch> {
        let e = self.cfg.gate_dim();
        let mut parts = vec![JoinedColumns {
            weight: format!("{p}.proj_in.weight"),
            bias: Some(format!("{p}.proj_in.bias")),
            cols: (0, 2 * e),
        }];
        let mut sizes = vec![e, e];
        if let Some(a) = self.cfg.attn_dim {
            parts.push(JoinedColumns {
                weight: format!("{p}.attn.qkv.weight"),
                bias: self
                    .cfg
                    .block
                    .attn_qkv_bias
                    .then(|| format!("{p}.attn.qkv.bias")),
                cols: (0, 3 * a),
            });
            sizes.extend([a, a, a]);
        }
        let joined = match self.cfg.attn_dim {
            Some(_) => format!("{p}.proj_in_attn_qkv.weight"),
            None => format!("{p}.proj_in.weight"),
        };
        let form = self.projection_form();
        let pre = self.dense_joined("proj_in", h, &joined, &parts, form)?;
        let split = self.g.split("proj_in_split", &pre, -1, &sizes)?;
        let z1 = self.channel_gelu("gelu_z1", &split[0])?;
        let z2 = self.channel_gelu("gelu_z2", &split[1])?;
        let mut terms = self.scoped("sgu", |s| s.fused_spatial(i, p, &z2, state))?;
        if let Some(a) = self.cfg.attn_dim {
            let (q, k, v) = (&split[2], &split[3], &split[4]);
            let attn = self.scoped("attn", |s| {
                let keys = s.fused_write(state, i, "key", k)?;
                let values = s.fused_write(state, i, "value", v)?;
                let mask = s.fused_mask(&mut state.rows)?;
                let scale = (a as f32).powf(-0.5);
                let context =
                    s.g.attention("attention", q, &keys, &values, &mask, scale)?;
                let form = s.projection_form();
                let out = s.dense(
                    "out",
                    &context,
                    &format!("{p}.attn.out.weight"),
                    None,
                    None,
                    form,
                )?;
                let bias = s.param(&format!("{p}.attn.out.bias"))?;
                Ok([out, bias])
            })?;
            terms.extend(attn);
        }
        let gated = self.scoped("sgu", |s| {
            let refs: Vec<&Value> = terms.iter().collect();
            let gate = match refs[..] {
                [only] => only.clone(),
                [a, b] => s.g.add("gate_sum", a, b)?,
                _ => s.g.sum("gate_sum", &refs)?,
            };
            let gate = s.gate_activation(&gate)?;
            s.g.mul("gate", &z1, &gate)
        })?;
        let out_form = self.output_projection_form();
        let y = self.dense(
            "proj_out",
            &gated,
            &format!("{p}.proj_out.weight"),
            None,
            None,
            out_form,
        )?;
        let b = format!("{p}.proj_out.bias");
        let dims = self.spec(&b)?.shape;
        let bias = self.lazy_param_as(&b, &dims, ElemType::F32, |v| v)?;
        Ok(Branch { y, bias })
    }

    /// The spatial projection's terms for the new rows: `W[P_b + t, :] · u` and
    /// `b[P_b + t]` (one term, the bias added, with several gating heads), u = the block's
    /// `sgu` state with LN(z2) written at the new rows.
    fn fused_spatial(
        &mut self,
        i: usize,
        p: &str,
        z2: &Value,
        state: &mut FusedState,
    ) -> Result<Vec<Value>> {
        let name = format!("{p}.sgu.spatial.weight");
        let n = self.cfg.seq_len();
        let heads = self.cfg.heads > 1;
        let row_axis = usize::from(heads);
        let u_new = self.norm("norm", z2, &format!("{p}.sgu.norm"), self.cfg.sgu_norm_eps)?;
        let u = self.fused_write(state, i, "sgu", &u_new)?;
        let rows = state.rows.rows.clone();
        let toeplitz_index = match self.cfg.spatial {
            SpatialForm::ToeplitzGather => Some(self.fused_toeplitz_index(&mut state.rows)?),
            SpatialForm::Dense | SpatialForm::ToeplitzExpand => None,
        };
        let w = self.spatial_weight_rows(&name, &rows, toeplitz_index.as_ref())?;
        let bias = match &state.spatial_biases {
            Some(stacked) => Some(stacked[i].clone()),
            None => match self.spatial_bias(&format!("{p}.sgu.spatial.bias"))? {
                Some(b) => Some(self.g.gather("spatial_bias_rows", &b, &rows, row_axis)?),
                None => None,
            },
        };
        if !heads {
            let mixed = self.g.matmul("spatial_matmul", &w, &u)?;
            return Ok([Some(mixed), bias].into_iter().flatten().collect());
        }
        // [h, batch, T, ·] → [batch, h, T, ·], the layout of mix_per_head's heads.
        let w = self
            .g
            .transpose("spatial_weight_heads", &w, &[1, 0, 2, 3])?;
        let bias = match bias {
            Some(b) => Some(self.g.transpose("spatial_bias_heads", &b, &[1, 0, 2, 3])?),
            None => None,
        };
        let seq = z2.shape[1].clone();
        let mix = |s: &mut Self, u: &Value| s.g.matmul("spatial_matmul", &w, u);
        let mixed =
            self.mix_per_head(&u, mix, bias.as_ref(), (n as i64, Dim::Fixed(n)), (-1, seq))?;
        Ok(vec![mixed])
    }
}
