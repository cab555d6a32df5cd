//! One helper per ONNX operator the tool emits, each documented with the operator's
//! version history (from the [ONNX operator changelog](https://onnx.ai/onnx/operators/))
//! and the form it emits for the target opset, in the manner of burn's onnx-ir node docs.
//! Each helper checks its operands' shapes and records the output shape (and, for MatMul
//! and Conv, the FLOPs).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::LayerNormForm;
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{broadcast, fmt_shape, normalize_axis, shape_error};

impl GraphBuilder {
    /// `Cast` to `to`.
    ///
    /// [Cast](https://onnx.ai/onnx/operators/onnx__Cast.html): versions 1, 6, 9, 13, 19 (`saturate` for float8), 21, 23, 24, 25; only `to` is emitted, valid in every opset here.
    pub fn cast(&mut self, local: &str, x: &Value, to: ElemType) -> Result<Value> {
        Ok(self.single(
            local,
            "Cast",
            &[x],
            vec![("to".to_string(), Attr::Int(i64::from(to.onnx_code())))],
            (to, x.shape.clone()),
            0,
        ))
    }

    /// LayerNorm over the last axis: `(x − mean) / √(var + eps) · scale + bias`, as the
    /// `LayerNormalization` operator from opset 17, and as primitive ops (see
    /// [`GraphBuilder::layer_norm_decomposed`]) below 17 or when the op forms ask for it.
    ///
    /// [LayerNormalization](https://onnx.ai/onnx/operators/onnx__LayerNormalization.html): new in opset 17 (its only version); below 17 it does not exist.
    pub fn layer_norm(
        &mut self,
        local: &str,
        x: &Value,
        scale: &Value,
        bias: &Value,
        epsilon: f32,
    ) -> Result<Value> {
        let last = x.shape.last().cloned();
        if last.is_none() || scale.shape.last() != last.as_ref() || bias.shape != scale.shape {
            return Err(shape_error(
                "LayerNormalization",
                format!(
                    "x {} with scale {} and bias {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&scale.shape),
                    fmt_shape(&bias.shape)
                ),
            ));
        }
        if self.opset() < 17 || self.forms().layer_norm == LayerNormForm::Decomposed {
            return self.layer_norm_decomposed(local, x, scale, bias, epsilon);
        }
        let attrs = vec![
            ("axis".to_string(), Attr::Int(-1)),
            ("epsilon".to_string(), Attr::Float(epsilon)),
        ];
        Ok(self.single(
            local,
            "LayerNormalization",
            &[x, scale, bias],
            attrs,
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// `MatMul` with numpy broadcasting of the batch dimensions; records 2·M·K·N FLOPs per
    /// broadcast batch element (symbolic dimensions count as 1).
    ///
    /// [MatMul](https://onnx.ai/onnx/operators/onnx__MatMul.html): versions 1, 9, 13 (types only); the same form in every opset here.
    pub fn matmul(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        if a.shape.len() < 2 || b.shape.len() < 2 {
            return Err(shape_error("MatMul", "operands must have rank >= 2".into()));
        }
        let (ar, br) = (a.shape.len(), b.shape.len());
        let (m, k) = (&a.shape[ar - 2], &a.shape[ar - 1]);
        let (k2, n) = (&b.shape[br - 2], &b.shape[br - 1]);
        if k != k2 || a.elem != b.elem {
            return Err(shape_error(
                "MatMul",
                format!("{} x {}", fmt_shape(&a.shape), fmt_shape(&b.shape)),
            ));
        }
        let mut shape = broadcast("MatMul", &a.shape[..ar - 2], &b.shape[..br - 2])?;
        let batch: u64 = shape.iter().map(|d| d.size_or_one() as u64).product();
        let flops = 2 * batch * (m.size_or_one() * k.size_or_one() * n.size_or_one()) as u64;
        shape.push(m.clone());
        shape.push(n.clone());
        Ok(self.single(local, "MatMul", &[a, b], vec![], (a.elem, shape), flops))
    }

    pub(crate) fn binary(&mut self, local: &str, op: &str, a: &Value, b: &Value) -> Result<Value> {
        if a.elem != b.elem {
            return Err(shape_error(
                op,
                format!("element types {:?} and {:?} differ", a.elem, b.elem),
            ));
        }
        let shape = broadcast(op, &a.shape, &b.shape)?;
        Ok(self.single(local, op, &[a, b], vec![], (a.elem, shape), 0))
    }

    /// Elementwise `Add` with broadcasting.
    ///
    /// [Add](https://onnx.ai/onnx/operators/onnx__Add.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
    pub fn add(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Add", a, b)
    }

    /// Elementwise `Mul` with broadcasting.
    ///
    /// [Mul](https://onnx.ai/onnx/operators/onnx__Mul.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
    pub fn mul(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Mul", a, b)
    }

    /// Exact GELU `0.5·x·(1 + erf(x/√2))`: the `Gelu` operator (approximate = "none") from
    /// opset 20, the same formula spelled with `Div`/`Erf`/`Add`/`Mul` below it, in the
    /// exact node pattern ONNX Runtime's `GeluFusion` rewrites into one `Gelu` kernel
    /// (`Div(x, √2) → Erf → Add(1) → Mul(x, ·) → Mul(·, 0.5)`, its "pattern 2"; a `Mul` by
    /// 1/√2 is not matched), which its `BiasGeluFusion` then merges with a preceding bias
    /// `Add`. The other order, `Mul(Mul(x, 0.5), ·)`, which ONNX Runtime fuses too, crashes
    /// OpenCV 4.14 and 5.0 dnn (segmentation fault on import; found by the consumer matrix).
    ///
    /// [Gelu](https://onnx.ai/onnx/operators/onnx__Gelu.html): new in opset 20 (`approximate = "none"` is the default); below 20 the formula is spelled with [Div](https://onnx.ai/onnx/operators/onnx__Div.html) and [Erf](https://onnx.ai/onnx/operators/onnx__Erf.html) (versions 9, 13).
    pub fn gelu(&mut self, local: &str, x: &Value) -> Result<Value> {
        if self.opset() >= 20 {
            return Ok(self.single(local, "Gelu", &[x], vec![], (x.elem, x.shape.clone()), 0));
        }
        let sqrt2 = self.const_float(
            &format!("{local}_sqrt2"),
            &[],
            vec![std::f32::consts::SQRT_2],
            x.elem,
        )?;
        let one = self.const_float(&format!("{local}_one"), &[], vec![1.0], x.elem)?;
        let half = self.const_float(&format!("{local}_half"), &[], vec![0.5], x.elem)?;
        let scaled = self.binary(&format!("{local}_scale"), "Div", x, &sqrt2)?;
        let erf = self.single(
            &format!("{local}_erf"),
            "Erf",
            &[&scaled],
            vec![],
            (x.elem, x.shape.clone()),
            0,
        );
        let one_plus = self.add(&format!("{local}_one_plus"), &erf, &one)?;
        let x_one_plus = self.mul(&format!("{local}_x_one_plus"), x, &one_plus)?;
        self.mul(local, &x_one_plus, &half)
    }

    /// `Split` along `axis` into pieces of the given sizes (sizes as an i64 input, opset ≥ 13).
    ///
    /// [Split](https://onnx.ai/onnx/operators/onnx__Split.html): versions 1, 2, 11, 13 (`split` sizes move from an attribute to an input), 18 (`num_outputs` attribute added); the sizes-as-input form is valid from 13 on.
    pub fn split(
        &mut self,
        local: &str,
        x: &Value,
        axis: i64,
        sizes: &[usize],
    ) -> Result<Vec<Value>> {
        let ax = normalize_axis("Split", axis, x.shape.len())?;
        if x.shape[ax] != Dim::Fixed(sizes.iter().sum()) {
            return Err(shape_error(
                "Split",
                format!(
                    "sizes {sizes:?} do not cover axis {ax} of {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let sizes_value = self.const_i64(
            &format!("{local}_sizes"),
            &[sizes.len()],
            sizes.iter().map(|&s| s as i64).collect(),
        )?;
        let outputs = sizes
            .iter()
            .map(|&s| {
                let mut shape = x.shape.clone();
                shape[ax] = Dim::Fixed(s);
                (x.elem, shape)
            })
            .collect();
        Ok(self.node(
            local,
            "Split",
            &[x, &sizes_value],
            vec![("axis".to_string(), Attr::Int(axis))],
            outputs,
            0,
        ))
    }

    /// `Gather` along `axis`: output shape is
    /// `data.shape[..axis] ++ indices.shape ++ data.shape[axis + 1..]`.
    ///
    /// [Gather](https://onnx.ai/onnx/operators/onnx__Gather.html): versions 1, 11 (negative indices), 13; the same form in every opset here.
    pub fn gather(
        &mut self,
        local: &str,
        data: &Value,
        indices: &Value,
        axis: usize,
    ) -> Result<Value> {
        if indices.elem != ElemType::I64 || axis >= data.shape.len() {
            return Err(shape_error(
                "Gather",
                format!(
                    "needs i64 indices and an axis below rank {}",
                    data.shape.len()
                ),
            ));
        }
        let mut shape = data.shape[..axis].to_vec();
        shape.extend_from_slice(&indices.shape);
        shape.extend_from_slice(&data.shape[axis + 1..]);
        Ok(self.single(
            local,
            "Gather",
            &[data, indices],
            vec![("axis".to_string(), Attr::Int(axis as i64))],
            (data.elem, shape),
            0,
        ))
    }

    /// `Slice` of `[start, end)` along one axis of fixed size.
    ///
    /// [Slice](https://onnx.ai/onnx/operators/onnx__Slice.html): versions 1, 10 (`starts`/`ends`/`axes` become inputs), 11, 13; the input form is valid from 10 on.
    pub fn slice(
        &mut self,
        local: &str,
        x: &Value,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<Value> {
        match x.shape.get(axis) {
            Some(Dim::Fixed(n)) if start < end && end <= *n => {}
            _ => {
                return Err(shape_error(
                    "Slice",
                    format!("[{start}, {end}) on axis {axis} of {}", fmt_shape(&x.shape)),
                ))
            }
        }
        let starts = self.const_i64(&format!("{local}_starts"), &[1], vec![start as i64])?;
        let ends = self.const_i64(&format!("{local}_ends"), &[1], vec![end as i64])?;
        let axes = self.const_i64(&format!("{local}_axes"), &[1], vec![axis as i64])?;
        let mut shape = x.shape.clone();
        shape[axis] = Dim::Fixed(end - start);
        Ok(self.single(
            local,
            "Slice",
            &[x, &starts, &ends, &axes],
            vec![],
            (x.elem, shape),
            0,
        ))
    }

    /// Zero `Pad` (mode constant) of `before` / `after` elements on one axis of fixed size.
    ///
    /// [Pad](https://onnx.ai/onnx/operators/onnx__Pad.html): versions 1, 2, 11 (`pads` becomes an input), 13, 18 (optional `axes` input), 19 (`wrap` mode), 21, 23; the `pads`-input form without `axes` is valid from 11 on.
    pub fn pad_axis(
        &mut self,
        local: &str,
        x: &Value,
        axis: usize,
        before: usize,
        after: usize,
    ) -> Result<Value> {
        let Some(Dim::Fixed(n)) = x.shape.get(axis) else {
            return Err(shape_error(
                "Pad",
                format!("axis {axis} of {}", fmt_shape(&x.shape)),
            ));
        };
        let padded = Dim::Fixed(n + before + after);
        self.pad_axis_symbolic(local, x, axis, (before, after), padded)
    }

    /// `Concat` along `axis` (negative counts from the end).
    ///
    /// [Concat](https://onnx.ai/onnx/operators/onnx__Concat.html): versions 1, 4, 11 (negative axis), 13; the same form in every opset here.
    pub fn concat(&mut self, local: &str, parts: &[&Value], axis: i64) -> Result<Value> {
        let first = parts
            .first()
            .ok_or_else(|| shape_error("Concat", "no input".into()))?;
        let ax = normalize_axis("Concat", axis, first.shape.len())?;
        let mut total = 0;
        for p in parts {
            let same_rest = p.shape.len() == first.shape.len()
                && p.shape
                    .iter()
                    .zip(&first.shape)
                    .enumerate()
                    .all(|(k, (a, b))| k == ax || a == b);
            match (&p.shape.get(ax), same_rest) {
                (Some(Dim::Fixed(n)), true) => total += n,
                _ => {
                    return Err(shape_error(
                        "Concat",
                        format!("{} with {}", fmt_shape(&first.shape), fmt_shape(&p.shape)),
                    ))
                }
            }
        }
        let mut shape = first.shape.clone();
        shape[ax] = Dim::Fixed(total);
        Ok(self.single(
            local,
            "Concat",
            parts,
            vec![("axis".to_string(), Attr::Int(axis))],
            (first.elem, shape),
            0,
        ))
    }

    /// `Transpose` with an explicit permutation.
    ///
    /// [Transpose](https://onnx.ai/onnx/operators/onnx__Transpose.html): versions 1, 13, 21, 23 (types only); the same form in every opset here.
    pub fn transpose(&mut self, local: &str, x: &Value, perm: &[usize]) -> Result<Value> {
        let mut sorted = perm.to_vec();
        sorted.sort_unstable();
        if sorted != (0..x.shape.len()).collect::<Vec<_>>() {
            return Err(shape_error(
                "Transpose",
                format!("bad permutation {perm:?}"),
            ));
        }
        let shape = perm.iter().map(|&p| x.shape[p].clone()).collect();
        Ok(self.single(
            local,
            "Transpose",
            &[x],
            vec![(
                "perm".to_string(),
                Attr::Ints(perm.iter().map(|&p| p as i64).collect()),
            )],
            (x.elem, shape),
            0,
        ))
    }

    /// `Softmax` along `axis` (opset ≥ 13 semantics: over that one axis).
    ///
    /// [Softmax](https://onnx.ai/onnx/operators/onnx__Softmax.html): versions 1, 11, 13 (from 13 over the one `axis`, before it over the flattened trailing axes).
    pub fn softmax(&mut self, local: &str, x: &Value, axis: i64) -> Result<Value> {
        normalize_axis("Softmax", axis, x.shape.len())?;
        Ok(self.single(
            local,
            "Softmax",
            &[x],
            vec![("axis".to_string(), Attr::Int(axis))],
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// `Reshape` to `target`, where entries are ONNX shape codes (0 copies the input
    /// dimension, −1 is inferred) and `result` is the known output shape.
    ///
    /// [Reshape](https://onnx.ai/onnx/operators/onnx__Reshape.html): versions 1, 5 (`shape` becomes an input), 13, 14 (`allowzero`, default 0 as here), 19, 21, 23; the same form from 5 on.
    pub fn reshape(
        &mut self,
        local: &str,
        x: &Value,
        target: &[i64],
        result: Vec<Dim>,
    ) -> Result<Value> {
        let shape = self.const_i64(&format!("{local}_shape"), &[target.len()], target.to_vec())?;
        Ok(self.single(local, "Reshape", &[x, &shape], vec![], (x.elem, result), 0))
    }

    /// 2-D `Conv` (NCHW) with square kernel `kernel`, stride `stride`, no padding.
    ///
    /// [Conv](https://onnx.ai/onnx/operators/onnx__Conv.html): versions 1, 11, 22 (types only); the same form in every opset here.
    pub fn conv2d(
        &mut self,
        local: &str,
        x: &Value,
        weight: &Value,
        bias: &Value,
        kernel: usize,
        stride: usize,
    ) -> Result<Value> {
        let (c_out, c_in) = match (&weight.shape[..], x.shape.len()) {
            ([Dim::Fixed(o), Dim::Fixed(i), Dim::Fixed(kh), Dim::Fixed(kw)], 4)
                if *kh == kernel && *kw == kernel && x.shape[1] == Dim::Fixed(*i) =>
            {
                (*o, *i)
            }
            _ => {
                return Err(shape_error(
                    "Conv",
                    format!(
                        "x {} with weight {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&weight.shape)
                    ),
                ))
            }
        };
        let out_hw = |d: &Dim| match d {
            Dim::Fixed(n) if *n >= kernel => Ok(Dim::Fixed((n - kernel) / stride + 1)),
            _ => Err(shape_error(
                "Conv",
                format!("spatial size {d} with kernel {kernel}"),
            )),
        };
        let (h, w) = (out_hw(&x.shape[2])?, out_hw(&x.shape[3])?);
        let positions = (h.size_or_one() * w.size_or_one()) as u64;
        let flops = 2 * positions * (c_out * c_in * kernel * kernel) as u64;
        let k = kernel as i64;
        let s = stride as i64;
        Ok(self.single(
            local,
            "Conv",
            &[x, weight, bias],
            vec![
                ("kernel_shape".to_string(), Attr::Ints(vec![k, k])),
                ("strides".to_string(), Attr::Ints(vec![s, s])),
            ],
            (x.elem, vec![x.shape[0].clone(), Dim::Fixed(c_out), h, w]),
            flops,
        ))
    }

    /// `ReduceMean` over `axes` without keeping them: `axes` is an attribute up to opset 17
    /// and an i64 input from opset 18.
    ///
    /// [ReduceMean](https://onnx.ai/onnx/operators/onnx__ReduceMean.html): versions 1, 11, 13, 18 (`axes` moves from an attribute to an optional input).
    pub fn reduce_mean(&mut self, local: &str, x: &Value, axes: &[i64]) -> Result<Value> {
        self.reduce_mean_keeping(local, x, axes, false)
    }

    /// `ReduceMean` over `axes`, keeping them as size-1 dimensions when `keep` is set; the
    /// opset forms of [`GraphBuilder::reduce_mean`].
    pub fn reduce_mean_keeping(
        &mut self,
        local: &str,
        x: &Value,
        axes: &[i64],
        keep: bool,
    ) -> Result<Value> {
        let rank = x.shape.len();
        let norm: Vec<usize> = axes
            .iter()
            .map(|&a| normalize_axis("ReduceMean", a, rank))
            .collect::<Result<_>>()?;
        let shape = reduced_shape(&x.shape, &norm, keep);
        let keepdims = ("keepdims".to_string(), Attr::Int(i64::from(keep)));
        if self.opset() >= 18 {
            let axes_value =
                self.const_i64(&format!("{local}_axes"), &[axes.len()], axes.to_vec())?;
            Ok(self.single(
                local,
                "ReduceMean",
                &[x, &axes_value],
                vec![keepdims],
                (x.elem, shape),
                0,
            ))
        } else {
            Ok(self.single(
                local,
                "ReduceMean",
                &[x],
                vec![("axes".to_string(), Attr::Ints(axes.to_vec())), keepdims],
                (x.elem, shape),
                0,
            ))
        }
    }
}

/// The shape left by reducing `axes` (normalized) of `shape`: removed, or kept as 1.
pub(crate) fn reduced_shape(shape: &[Dim], axes: &[usize], keep: bool) -> Vec<Dim> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keep) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Fixed(1)),
            (true, false) => None,
        })
        .collect()
}
