//! Linear (fully connected) layers of the emitter: `x · W + b` with `W` stored `[in, out]`,
//! optionally on a range of W's output columns (proj_in's two halves are two MatMuls on
//! column slices of U instead of one MatMul and a `Split`), in f32/f16 or, for
//! `--dtype int8`, as a dynamically quantized integer MatMul with int8 weights quantized
//! at build time (symmetric per output channel, [`crate::gmlp::quantize`]), or, for
//! `--dtype int4` and `int8-weight-only`, as ONNX Runtime's `MatMulNBits` on weights
//! quantized in blocks along the input features ([`crate::onnx::nbits`]).

use std::sync::{Arc, Mutex};

use super::context::Emitter;
use crate::error::{Error, Result};
use crate::gmlp::config::Precision;
use crate::gmlp::quantize::{column_range, column_scales, quantize_columns, transpose};
use crate::message::{Phrase, Setting};
use crate::onnx::graph::{ElemType, Value};
use crate::onnx::nbits::{self, BLOCK_SIZE};
use crate::onnx::ops::{NBits, MIN_INT8_OPSET};

/// Inputs per block of a token model's 8-bit vocabulary head (`--dtype int4` and
/// `int8-weight-only`): 128, four times the projections' [`BLOCK_SIZE`]. Measured on
/// amlp-base's 32000 × 512 head (BENCHMARKS.md, "The vocabulary head in 8-bit blocks of
/// 128"): ONNX Runtime's batch-1 kernel takes 0.63× the time of the dynamic int8 head with
/// blocks of 128 and 0.98× with blocks of 32; a static int4 step 0.84× the time; the logits
/// error stays below the dynamic int8 head's.
pub const HEAD_BLOCK_SIZE: usize = 128;

/// Output columns `[start, end)` of a weight (and its bias).
pub(crate) type Columns = Option<(usize, usize)>;

/// `accuracy_level` of the MatMulNBits nodes: ONNX Runtime's CPU kernel may quantize the
/// activations to int8 per block of 32 inside the node (measured in BENCHMARKS.md,
/// "Weight-only int4"); the file's activations and outputs stay f32.
pub const NBITS_ACCURACY_LEVEL: i64 = 4;

/// Output columns `cols` of the parameter `weight` (and of its `bias`, if any): one part
/// of a joined projection ([`Emitter::dense_joined`]).
pub(crate) struct JoinedColumns {
    /// The weight parameter `[in, out]`.
    pub(crate) weight: String,
    /// Its bias parameter `[out]`, if it has one.
    pub(crate) bias: Option<String>,
    /// The columns `[start, end)` taken.
    pub(crate) cols: (usize, usize),
}

/// How a dense layer's weight is stored and multiplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightForm {
    /// In the model's storage type (f32 or f16), a plain `MatMul`.
    Float,
    /// int8 per output channel, activations quantized on the fly
    /// (`DynamicQuantizeLinear`, `MatMulInteger`).
    DynamicInt8,
    /// Blocks of `block_size` inputs along K with `bits`-bit codes, `MatMulNBits`.
    Block {
        /// Bits per code.
        bits: usize,
        /// Inputs per block ([`BLOCK_SIZE`] for projections, [`HEAD_BLOCK_SIZE`] for heads).
        block_size: usize,
    },
}

impl Emitter {
    /// The form of the channel and attention projections (proj_in, q, k, v, attention out,
    /// the first projection of a reversible block's feed-forward; proj_out:
    /// [`Self::output_projection_form`]).
    pub(crate) fn projection_form(&self) -> WeightForm {
        match self.cfg.dtype {
            Precision::F32 | Precision::F16 => WeightForm::Float,
            Precision::Int8 => WeightForm::DynamicInt8,
            Precision::Int4 => WeightForm::Block {
                bits: 4,
                block_size: BLOCK_SIZE,
            },
            Precision::Int8WeightOnly => WeightForm::Block {
                bits: 8,
                block_size: BLOCK_SIZE,
            },
        }
    }

    /// The form of a block's output projection V (`proj_out`, and the second projection of a
    /// reversible block's GEGLU feed-forward): the projections' form, except that int4 files
    /// keep it in 8-bit blocks of [`HEAD_BLOCK_SIZE`]. V reads the gated product, whose
    /// outliers 4-bit blocks cost most: on the ten trained token fixtures this takes int4's
    /// logits error from 1.9e-2 to 1.3e-2 at worst in L2 norm and from 3.5e-2 to 2.9e-2 in
    /// max-norm, for 4% more bytes a step on amlp-base and no measurable step time
    /// (docs/quantization.md).
    pub(crate) fn output_projection_form(&self) -> WeightForm {
        match self.cfg.dtype {
            Precision::Int4 => WeightForm::Block {
                bits: 8,
                block_size: HEAD_BLOCK_SIZE,
            },
            _ => self.projection_form(),
        }
    }

    /// The form of a token model's vocabulary projection: int8 (dynamic) in int8 models,
    /// 8-bit blocks of [`HEAD_BLOCK_SIZE`] in the weight-only ones, int4 included (4 bits
    /// there cost the trained fixtures about twice the logits error of the projections
    /// together; docs/quantization.md).
    pub(crate) fn head_form(&self) -> WeightForm {
        match self.cfg.dtype {
            Precision::F32 | Precision::F16 => WeightForm::Float,
            Precision::Int8 => WeightForm::DynamicInt8,
            Precision::Int4 | Precision::Int8WeightOnly => WeightForm::Block {
                bits: 8,
                block_size: HEAD_BLOCK_SIZE,
            },
        }
    }

    /// Refuses int8 emission at an opset without the integer operators.
    pub(crate) fn require_int8_opset(&self) -> Result<()> {
        if self.g.opset() < MIN_INT8_OPSET {
            return Err(Error::Setting(Phrase::setting(Setting::Dtype).then(format!(
                " int8 needs opset {MIN_INT8_OPSET} or later (DynamicQuantizeLinear, MatMulInteger); this build targets opset {}",
                self.g.opset()
            ))));
        }
        Ok(())
    }

    /// `x · W + b` for the parameters `weight` and `bias`, in the projections' form.
    pub(crate) fn linear(
        &mut self,
        local: &str,
        x: &Value,
        weight: &str,
        bias: Option<&str>,
    ) -> Result<Value> {
        let form = self.projection_form();
        self.dense(local, x, weight, bias, None, form)
    }

    /// `x · W[:, cols] (+ b[cols])`. Without `cols` (the whole W) and in f32/f16 the
    /// parameters keep their own names; a slice is stored as `NAME.cols{start}_{end}`, int8
    /// weights as `NAME[.cols…].int8` with their per-column scales in `NAME[.cols…].scale`,
    /// block-quantized ones as `NAME[.cols…].int4` (packed) with their block scales in
    /// `NAME[.cols…].scale`.
    pub(crate) fn dense(
        &mut self,
        local: &str,
        x: &Value,
        weight: &str,
        bias: Option<&str>,
        cols: Columns,
        form: WeightForm,
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
                column_range(v, total, start, end)
            }
        };
        let y = match form {
            WeightForm::Block { bits, block_size } => self.block_matmul(
                local,
                x,
                &format!("{weight}{suffix}"),
                &[weight.to_string()],
                (rows, width),
                (bits, block_size),
                move |mut v| slice(v.remove(0)),
                None,
            )?,
            WeightForm::DynamicInt8 => {
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
            }
            WeightForm::Float => {
                let elem = self.cfg.dtype.elem();
                let name = format!("{weight}{suffix}");
                let w = match cols {
                    Some(range) => self.column_param(&name, weight, range, elem)?,
                    None => self.stored_param(&name, weight, &[rows, width], elem)?,
                };
                self.g.matmul(local, x, &w)?
            }
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

    /// The rows every part of a joined projection shares and each part's (total columns,
    /// columns taken); refused unless every weight is 2-D with those rows and its columns
    /// lie within it.
    fn joined_layout(
        &self,
        name: &str,
        parts: &[JoinedColumns],
    ) -> Result<(usize, Vec<PartColumns>)> {
        let mut rows = None;
        let mut layout = Vec::with_capacity(parts.len());
        for part in parts {
            let shape = self.spec(&part.weight)?.shape;
            let [r, total] = shape[..] else {
                return Err(Error::Internal(format!(
                    "{}: a dense weight is 2-D",
                    part.weight
                )));
            };
            if *rows.get_or_insert(r) != r || part.cols.1 > total || part.cols.0 >= part.cols.1 {
                return Err(Error::Internal(format!(
                    "{name}: {} does not join",
                    part.weight
                )));
            }
            layout.push((total, part.cols));
        }
        let rows = rows.ok_or_else(|| Error::Internal(format!("{name}: no parts")))?;
        Ok((rows, layout))
    }

    /// `x · [W₁[:, c₁] | W₂[:, c₂] | …] + [b₁ | b₂ | …]`: several projections of one input
    /// as one MatMul and one bias `Add` (f32), or one `MatMulNBits` with its bias input
    /// (block-quantized forms; each column quantizes as it would alone, so the codes and
    /// scales are those of the separate layers). A part without a bias adds zeros. Stored as
    /// `name` (or `name.int4` and `name.scale`) and `name.bias`. Not for the dynamic int8
    /// form.
    pub(crate) fn dense_joined(
        &mut self,
        local: &str,
        x: &Value,
        name: &str,
        parts: &[JoinedColumns],
        form: WeightForm,
    ) -> Result<Value> {
        let (rows, layout) = self.joined_layout(name, parts)?;
        let width: usize = layout.iter().map(|(_, (a, b))| b - a).sum();
        let weights: Vec<String> = parts.iter().map(|p| p.weight.clone()).collect();
        let columns = layout.clone();
        let assemble = move |v: Vec<Vec<f32>>| {
            let mut out = Vec::with_capacity(rows * width);
            for r in 0..rows {
                for (w, &(total, (a, b))) in v.iter().zip(&columns) {
                    out.extend_from_slice(&w[r * total + a..r * total + b]);
                }
            }
            out
        };
        let biases: Vec<String> = parts.iter().filter_map(|p| p.bias.clone()).collect();
        let join_bias = bias_joiner(parts, width);
        if form == WeightForm::DynamicInt8 {
            return Err(Error::Internal(format!(
                "{name}: joined projections have no dynamic int8 form"
            )));
        }
        // The bias in the model's storage type beside a float MatMul; f32, MatMulNBits's.
        let bias_elem = match form {
            WeightForm::Float => self.cfg.dtype.elem(),
            _ => ElemType::F32,
        };
        let bias = self.joined_param(
            &format!("{name}.bias"),
            &biases,
            &[width],
            bias_elem,
            join_bias,
        )?;
        match form {
            WeightForm::Block { bits, block_size } => self.block_matmul(
                local,
                x,
                name,
                &weights,
                (rows, width),
                (bits, block_size),
                assemble,
                Some(&bias),
            ),
            _ => {
                let elem = self.cfg.dtype.elem();
                let w = self.joined_param(name, &weights, &[rows, width], elem, move |v| {
                    Ok(assemble(v))
                })?;
                let y = self.g.matmul(local, x, &w)?;
                self.g.add(&format!("{local}_bias"), &y, &bias)
            }
        }
    }

    /// `x · dequant(Q) (+ bias)` for the `[rows, width]` weight that `assemble` makes from
    /// the parameters `sources` (one weight's columns, or several weights side by side),
    /// quantized in blocks of `block_size` along its rows with `bits`-bit codes: the packed
    /// codes `BASE.int4` (`.int8` for 8 bits) and the scales `BASE.scale`, one
    /// `MatMulNBits` node (the bias, if any, its input 5).
    #[allow(clippy::too_many_arguments)]
    fn block_matmul(
        &mut self,
        local: &str,
        x: &Value,
        base: &str,
        sources: &[String],
        (rows, width): (usize, usize),
        (bits, block_size): (usize, usize),
        assemble: impl Fn(Vec<Vec<f32>>) -> Vec<f32> + Clone + Send + Sync + 'static,
        bias: Option<&Value>,
    ) -> Result<Value> {
        let attrs = NBits {
            k: rows,
            n: width,
            bits,
            block_size,
            accuracy_level: NBITS_ACCURACY_LEVEL,
        };
        let kb = rows.div_ceil(block_size);
        // The scales are produced first (the file's order): the quantization they come
        // from is kept for the codes produced next, so each weight's block scales are
        // searched once; the codes quantize afresh where it is not there.
        let done: Arc<Mutex<Option<nbits::BlockQuantized>>> = Arc::default();
        let quantize = {
            // A refusal names the parameter (or the joined weight made of several).
            let name = match sources {
                [one] => one.clone(),
                _ => base.to_string(),
            };
            move |v: Vec<Vec<f32>>| {
                nbits::quantize(&assemble(v), rows, width, bits, block_size)
                    .map_err(|e| in_param(&name, e))
            }
        };
        let (first, kept) = (quantize.clone(), done.clone());
        let scales = self.joined_param(
            &format!("{base}.scale"),
            sources,
            &[width, kb],
            ElemType::F32,
            move |v| {
                let q = first(v)?;
                let scales = q.scales.clone();
                *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(q);
                Ok(scales)
            },
        )?;
        let q = self.joined_param(
            &format!("{base}.int{bits}"),
            sources,
            &[width, kb, block_size * bits / 8],
            ElemType::U8,
            move |v| {
                let kept = done.lock().unwrap_or_else(|e| e.into_inner()).take();
                let q = match kept {
                    Some(q) => q,
                    None => quantize(v)?,
                };
                Ok(q.packed().into_iter().map(f32::from).collect())
            },
        )?;
        self.g.matmul_nbits(local, x, &q, &scales, bias, attrs)
    }

    /// The tied vocabulary projection `h · Eᵀ` in blocks of `(bits, block_size)`: the
    /// embedding transposed to `[d, vocab]` and quantized along d, stored as
    /// `embed.weight.transposed.int8` with its block scales, beside the exact f32 table that
    /// the input `Gather` keeps using.
    pub(crate) fn tied_head_block(
        &mut self,
        local: &str,
        h: &Value,
        table: &str,
        block: (usize, usize),
    ) -> Result<Value> {
        let shape = self.spec(table)?.shape;
        let [vocab, d] = shape[..] else {
            return Err(Error::Internal(format!("{table}: the embedding is 2-D")));
        };
        let t = move |mut v: Vec<Vec<f32>>| transpose(&v.remove(0), vocab, d);
        let base = format!("{table}.transposed");
        self.block_matmul(
            local,
            h,
            &base,
            &[table.to_string()],
            (d, vocab),
            block,
            t,
            None,
        )
    }

    /// The tied vocabulary projection `h · Eᵀ` of an int8 model: an int8 copy of the
    /// embedding, transposed to `[d, vocab]` and quantized per vocabulary entry, stored
    /// beside the exact f32 table that the input `Gather` keeps using.
    pub(crate) fn tied_head_int8(&mut self, local: &str, h: &Value, table: &str) -> Result<Value> {
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

    /// `x · dequant(q)` with `x` quantized on the fly: `DynamicQuantizeLinear(x)`,
    /// `MatMulInteger(x_q, q, x_zero_point)`, `Cast` to f32, `Mul` by `x_scale · scales`
    /// (the node order of ONNX Runtime's `quantize_dynamic`, which its
    /// `DynamicQuantizeMatMulFusion` turns into one `DynamicQuantizeMatMul` kernel).
    pub(crate) fn int8_matmul(
        &mut self,
        local: &str,
        x: &Value,
        q: &Value,
        scales: &Value,
    ) -> Result<Value> {
        let (xq, x_scale, x_zero) = self
            .g
            .dynamic_quantize_linear(&format!("{local}_quantize"), x)?;
        self.quantized_matmul(local, &xq, &x_scale, &x_zero, q, scales)
    }

    /// `dequant(x_q) · dequant(q)` for an activation already quantized to (`xq`, `x_scale`,
    /// `x_zero`): `MatMulInteger`, `Cast` to f32, `Mul` by `x_scale · scales`.
    pub(crate) fn quantized_matmul(
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

/// `e` with the parameter's name in front.
fn in_param(name: &str, e: Error) -> Error {
    match e {
        Error::BadTensor(m) => Error::BadTensor(format!("{name}: {m}")),
        other => other,
    }
}
/// One part of a joined projection: its weight's total columns, and the columns taken.
type PartColumns = (usize, (usize, usize));

/// The joined bias of `parts` (`width` values): each part's columns of its bias, in the
/// order of the biases present (`v`), zeros for a part without one.
fn bias_joiner(
    parts: &[JoinedColumns],
    width: usize,
) -> impl Fn(Vec<Vec<f32>>) -> Result<Vec<f32>> + Send + Sync + 'static {
    let bias_layout: Vec<(bool, (usize, usize))> =
        parts.iter().map(|p| (p.bias.is_some(), p.cols)).collect();
    move |v: Vec<Vec<f32>>| {
        let mut present = v.into_iter();
        let mut out = Vec::with_capacity(width);
        for &(has, (a, b)) in &bias_layout {
            let values = if has { present.next() } else { None };
            match values {
                Some(values) => out.extend_from_slice(&values[a..b]),
                None => out.extend(std::iter::repeat_n(0.0, b - a)),
            }
        }
        Ok(out)
    }
}
