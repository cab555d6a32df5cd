//! Dense (fully connected) layers of the emitter: `x · W + b` with `W` stored `[in, out]`,
//! optionally on a range of W's output columns (proj_in's two halves are two MatMuls on
//! column slices of U instead of one MatMul and a `Split`), in f32/f16 or, for
//! `--dtype int8`, as a dynamically quantized integer MatMul with int8 weights quantized
//! at build time (symmetric per output channel, [`crate::gmlp::quantize`]).

use super::Emitter;
use crate::error::{Error, Result};
use crate::gmlp::config::SpatialForm;
use crate::gmlp::quantize::{column_range, column_scales, quantize_columns, transpose};
use crate::gmlp::toeplitz::{mask_upper, toeplitz_expand};
use crate::gmlp::weights::check_values;
use crate::onnx::graph::{ElemType, TensorData, Value};
use crate::onnx::quant_ops::MIN_INT8_OPSET;
use std::sync::Arc;

/// Output columns `[start, end)` of a weight (and its bias).
pub(super) type Columns = Option<(usize, usize)>;

impl Emitter {
    /// An initializer named `init_name` whose values are those of the parameter `param`
    /// (checked), passed through `post` when the file is written, stored as `elem`.
    fn derived_param(
        &mut self,
        init_name: &str,
        param: &str,
        dims: &[usize],
        elem: ElemType,
        post: impl Fn(Vec<f32>) -> Vec<f32> + Send + Sync + 'static,
    ) -> Result<Value> {
        let spec = self.spec(param)?;
        let source = self.source.clone();
        let produce = move || {
            let v = source.values(&spec)?;
            check_values(&spec, &v)?;
            Ok(post(v))
        };
        self.g.weight_as(
            init_name,
            dims,
            elem,
            TensorData::LazyF32(Arc::new(produce)),
        )
    }

    /// Refuses int8 emission at an opset without the integer operators.
    fn require_int8_opset(&self) -> Result<()> {
        if self.g.opset() < MIN_INT8_OPSET {
            return Err(Error::InvalidArgument(format!(
                "--dtype int8 needs opset {MIN_INT8_OPSET} or later (DynamicQuantizeLinear, MatMulInteger); this build targets opset {}",
                self.g.opset()
            )));
        }
        Ok(())
    }

    /// `x · W[:, cols] (+ b[cols])`. Without `cols` (the whole W) and in f32/f16 the
    /// parameters keep their own names; a slice is stored as `NAME.cols{start}_{end}`, int8
    /// weights as `NAME[.cols…].int8` with their per-column scales in `NAME[.cols…].scale`.
    pub(super) fn dense(
        &mut self,
        local: &str,
        x: &Value,
        weight: &str,
        bias: Option<&str>,
        cols: Columns,
        quantize: bool,
    ) -> Result<Value> {
        let shape = self.spec(weight)?.shape;
        let [rows, total] = shape[..] else {
            return Err(Error::Internal(format!("{weight}: a dense weight is 2-D")));
        };
        let (start, end) = cols.unwrap_or((0, total));
        let width = end - start;
        let suffix = match cols {
            Some((s, e)) => format!(".cols{s}_{e}"),
            None => String::new(),
        };
        let slice = move |v: Vec<f32>| {
            if (start, end) == (0, total) {
                v
            } else {
                column_range(&v, total, start, end)
            }
        };
        let y = if quantize {
            self.require_int8_opset()?;
            let scales = self.derived_param(
                &format!("{weight}{suffix}.scale"),
                weight,
                &[width],
                ElemType::F32,
                move |v| column_scales(&slice(v), width),
            )?;
            let q = self.derived_param(
                &format!("{weight}{suffix}.int8"),
                weight,
                &[rows, width],
                ElemType::I8,
                move |v| {
                    let w = slice(v);
                    let s = column_scales(&w, width);
                    quantize_columns(w, &s)
                },
            )?;
            self.int8_matmul(local, x, &q, &scales)?
        } else {
            let elem = self.cfg.dtype.elem();
            let w = self.derived_param(
                &format!("{weight}{suffix}"),
                weight,
                &[rows, width],
                elem,
                slice,
            )?;
            self.g.matmul(local, x, &w)?
        };
        match bias {
            Some(b) => {
                let elem = self.cfg.dtype.elem();
                let b =
                    self.derived_param(&format!("{b}{suffix}"), b, &[width], elem, move |v| {
                        v[start..end].to_vec()
                    })?;
                self.g.add(&format!("{local}_bias"), &y, &b)
            }
            None => Ok(y),
        }
    }

    /// The tied vocabulary projection `h · Eᵀ` of an int8 model: an int8 copy of the
    /// embedding, transposed to `[d, vocab]` and quantized per vocabulary entry, stored
    /// beside the exact f32 table that the input `Gather` keeps using.
    pub(super) fn tied_head_int8(&mut self, local: &str, h: &Value, table: &str) -> Result<Value> {
        self.require_int8_opset()?;
        let shape = self.spec(table)?.shape;
        let [vocab, d] = shape[..] else {
            return Err(Error::Internal(format!("{table}: the embedding is 2-D")));
        };
        let scales = self.derived_param(
            &format!("{table}.transposed.scale"),
            table,
            &[vocab],
            ElemType::F32,
            move |v| column_scales(&transpose(&v, vocab, d), vocab),
        )?;
        let q = self.derived_param(
            &format!("{table}.transposed.int8"),
            table,
            &[d, vocab],
            ElemType::I8,
            move |v| {
                let t = transpose(&v, vocab, d);
                let s = column_scales(&t, vocab);
                quantize_columns(t, &s)
            },
        )?;
        self.int8_matmul(local, h, &q, &scales)
    }

    /// The spatial mixing `W · u` of an int8 model, for `u` of shape `[…, n, c]` (heads
    /// first when there are several) and W of any stored form: computed transposed,
    /// `(uᵀ · Wᵀ)ᵀ`, so that the constant int8 matrix is MatMulInteger's second operand
    /// (ONNX Runtime has no fast kernel with a constant int8 first operand; measured in
    /// BENCHMARKS.md). Wᵀ is materialized `[n, n]` per head (Toeplitz forms expanded,
    /// causal mask applied) and quantized per column of Wᵀ, i.e. per output token.
    pub(super) fn spatial_matmul_int8(
        &mut self,
        local: &str,
        weight: &str,
        u: &Value,
    ) -> Result<Value> {
        let (q, scales) = self.spatial_int8_weights(weight)?;
        self.spatial_int8_transposed(local, u, &q, &scales)
    }

    /// [`Self::spatial_matmul_int8`] for the new positions P..P+T−1 of a variable-length
    /// or with-past graph, `u` holding positions 0..P+T−1: Wᵀ's columns P..P+T−1 and
    /// their scales are gathered, and its rows cut to 0..P+T−1 (never n×n per step).
    pub(super) fn spatial_matmul_int8_rows(
        &mut self,
        local: &str,
        weight: &str,
        u: &Value,
    ) -> Result<Value> {
        let (q, scales) = self.spatial_int8_weights(weight)?;
        let last = q.shape.len() - 1;
        let rows = self.positions()?.rows.clone();
        let (total, total_dim) = {
            let pos = self.positions()?;
            (pos.total.clone(), pos.total_dim.clone())
        };
        let q_cols = self
            .g
            .gather(&format!("{local}_weight_columns"), &q, &rows, last)?;
        let zero = self
            .g
            .const_i64(&format!("{local}_weight_rows_start"), &[1], vec![0])?;
        let mut shape = q_cols.shape.clone();
        shape[last - 1] = total_dim;
        let q_rows = self.g.slice_dynamic(
            &format!("{local}_weight_rows"),
            &q_cols,
            &zero,
            &total,
            &[last as i64 - 1],
            shape,
        )?;
        let scales = self
            .g
            .gather(&format!("{local}_scale_columns"), &scales, &rows, last)?;
        self.spatial_int8_transposed(local, u, &q_rows, &scales)
    }

    /// The int8 Wᵀ `[heads?, n, n]` and its per-column scales `[heads?, 1, n]`.
    fn spatial_int8_weights(&mut self, weight: &str) -> Result<(Value, Value)> {
        self.require_int8_opset()?;
        let n = self.cfg.seq_len();
        let (causal, dense) = (self.cfg.causal, self.cfg.spatial == SpatialForm::Dense);
        // W per head as dense [n, n], masked, transposed.
        let transposed = move |v: Vec<f32>| -> Vec<f32> {
            let per_head = if dense { n * n } else { 2 * n - 1 };
            v.chunks(per_head)
                .flat_map(|h| {
                    let mut w = if dense {
                        h.to_vec()
                    } else {
                        toeplitz_expand(h, n)
                    };
                    if causal {
                        mask_upper(&mut w, n);
                    }
                    transpose(&w, n, n)
                })
                .collect()
        };
        let heads = self.cfg.heads;
        let mut q_dims = vec![n, n];
        let mut s_dims = vec![1, n];
        if heads > 1 {
            q_dims.insert(0, heads);
            s_dims.insert(0, heads);
        }
        let scales = self.derived_param(
            &format!("{weight}.transposed.scale"),
            weight,
            &s_dims,
            ElemType::F32,
            move |v| {
                transposed(v)
                    .chunks(n * n)
                    .flat_map(|t| column_scales(t, n))
                    .collect()
            },
        )?;
        let q = self.derived_param(
            &format!("{weight}.transposed.int8"),
            weight,
            &q_dims,
            ElemType::I8,
            move |v| {
                transposed(v)
                    .chunks(n * n)
                    .flat_map(|t| quantize_columns(t.to_vec(), &column_scales(t, n)))
                    .collect()
            },
        )?;
        Ok((q, scales))
    }

    /// `(uᵀ · q)ᵀ` rescaled: the spatial mixing with the int8 Wᵀ as the second operand.
    fn spatial_int8_transposed(
        &mut self,
        local: &str,
        u: &Value,
        q: &Value,
        scales: &Value,
    ) -> Result<Value> {
        let rank = u.shape.len();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        // Quantize first (per tensor, so it commutes with the transpose), then transpose the
        // u8 tensor: a quarter of the bytes an f32 transpose moves.
        let (uq, u_scale, u_zero) = self
            .g
            .dynamic_quantize_linear(&format!("{local}_quantize"), u)?;
        let uq_t = self
            .g
            .transpose(&format!("{local}_transpose_in"), &uq, &perm)?;
        let mixed_t = self.quantized_matmul(local, &uq_t, &u_scale, &u_zero, q, scales)?;
        self.g
            .transpose(&format!("{local}_transpose_out"), &mixed_t, &perm)
    }

    /// `x · dequant(q)` with `x` quantized on the fly: `DynamicQuantizeLinear(x)`,
    /// `MatMulInteger(x_q, q, x_zero_point)`, `Cast` to f32, `Mul` by `x_scale · scales`
    /// (the node order of ONNX Runtime's `quantize_dynamic`, which its
    /// `DynamicQuantizeMatMulFusion` turns into one `DynamicQuantizeMatMul` kernel).
    fn int8_matmul(&mut self, local: &str, x: &Value, q: &Value, scales: &Value) -> Result<Value> {
        let (xq, x_scale, x_zero) = self
            .g
            .dynamic_quantize_linear(&format!("{local}_quantize"), x)?;
        self.quantized_matmul(local, &xq, &x_scale, &x_zero, q, scales)
    }

    /// `dequant(x_q) · dequant(q)` for an activation already quantized to (`xq`, `x_scale`,
    /// `x_zero`): `MatMulInteger`, `Cast` to f32, `Mul` by `x_scale · scales`.
    fn quantized_matmul(
        &mut self,
        local: &str,
        xq: &Value,
        x_scale: &Value,
        x_zero: &Value,
        q: &Value,
        scales: &Value,
    ) -> Result<Value> {
        let scale = self.g.mul(&format!("{local}_scale"), x_scale, scales)?;
        let acc = self.g.matmul_integer(local, xq, q, x_zero)?;
        let acc = self
            .g
            .cast(&format!("{local}_to_f32"), &acc, ElemType::F32)?;
        self.g.mul(&format!("{local}_rescale"), &acc, &scale)
    }
}
