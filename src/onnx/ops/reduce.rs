//! Reductions: `ArgMax`, `ReduceMean` (axes as an attribute below opset 18, as an input from 18),
//! `ReduceSum` (axes as an input from 13), and a mean spelled as a sum and a division
//! where a target's consumers need it.

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::MeanForm;
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{normalize_axis, shape_error};

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

impl GraphBuilder {
    /// `ArgMax` of `x` along `axis`, the axis removed: the i64 index of the first largest
    /// element (`select_last_index` 0).
    ///
    /// [ArgMax](https://onnx.ai/onnx/operators/onnx__ArgMax.html): versions 1, 11 (negative axes), 12 (`select_last_index`), 13 (bfloat16); the same form in every opset here.
    pub fn arg_max(&mut self, local: &str, x: &Value, axis: i64) -> Result<Value> {
        let axis_index = normalize_axis("ArgMax", axis, x.shape.len())?;
        Ok(self.single(
            local,
            "ArgMax",
            &[x],
            vec![
                ("axis".to_string(), Attr::Int(axis)),
                ("keepdims".to_string(), Attr::Int(0)),
            ],
            (ElemType::I64, reduced_shape(&x.shape, &[axis_index], false)),
            0,
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
        self.reduce_opset_form(local, "ReduceMean", x, axes, keep)
    }

    /// `ReduceMax` over `axes`, keeping them as size-1 dimensions when `keep` is set: `axes`
    /// is an attribute up to opset 17 and an i64 input from opset 18.
    ///
    /// [ReduceMax](https://onnx.ai/onnx/operators/onnx__ReduceMax.html): versions 1, 11, 12 (integer types), 13, 18 (`axes` moves from an attribute to an optional input), 20 (bool).
    pub fn reduce_max_keeping(
        &mut self,
        local: &str,
        x: &Value,
        axes: &[i64],
        keep: bool,
    ) -> Result<Value> {
        self.reduce_opset_form(local, "ReduceMax", x, axes, keep)
    }

    /// A reduction whose `axes` is an attribute up to opset 17 and an i64 input from 18.
    fn reduce_opset_form(
        &mut self,
        local: &str,
        op: &str,
        x: &Value,
        axes: &[i64],
        keep: bool,
    ) -> Result<Value> {
        let rank = x.shape.len();
        let norm: Vec<usize> = axes
            .iter()
            .map(|&a| normalize_axis(op, a, rank))
            .collect::<Result<_>>()?;
        let shape = reduced_shape(&x.shape, &norm, keep);
        let keepdims = ("keepdims".to_string(), Attr::Int(i64::from(keep)));
        if self.opset() >= 18 {
            let axes_value =
                self.const_i64(&format!("{local}_axes"), &[axes.len()], axes.to_vec())?;
            Ok(self.single(
                local,
                op,
                &[x, &axes_value],
                vec![keepdims],
                (x.elem, shape),
                0,
            ))
        } else {
            Ok(self.single(
                local,
                op,
                &[x],
                vec![("axes".to_string(), Attr::Ints(axes.to_vec())), keepdims],
                (x.elem, shape),
                0,
            ))
        }
    }

    /// `ReduceSum` over `axes` (kept as size-1 dimensions when `keep` is set). The axes are
    /// written non-negative (candle-onnx 0.11 casts them to unsigned).
    ///
    /// [ReduceSum](https://onnx.ai/onnx/operators/onnx__ReduceSum.html): versions 1, 11, 13 (`axes` moves from an attribute to an optional input, five opsets before the other reductions); the input form is valid over the whole range here.
    pub fn reduce_sum(
        &mut self,
        local: &str,
        x: &Value,
        axes: &[i64],
        keep: bool,
    ) -> Result<Value> {
        let rank = x.shape.len();
        let norm: Vec<usize> = axes
            .iter()
            .map(|&a| normalize_axis("ReduceSum", a, rank))
            .collect::<Result<_>>()?;
        let axes_value = self.const_i64(
            &format!("{local}_axes"),
            &[norm.len()],
            norm.iter().map(|&a| a as i64).collect(),
        )?;
        let shape = reduced_shape(&x.shape, &norm, keep);
        Ok(self.single(
            local,
            "ReduceSum",
            &[x, &axes_value],
            vec![("keepdims".to_string(), Attr::Int(i64::from(keep)))],
            (x.elem, shape),
            0,
        ))
    }

    /// The mean over `axes` (kept as size-1 dimensions when `keep` is set), in the graph's
    /// [`MeanForm`]: `ReduceMean` in its opset's form, or `ReduceSum` then `Div` by the
    /// (fixed) number of elements reduced. Both are the sum divided by the count, up to
    /// the order of the additions.
    pub fn mean(&mut self, local: &str, x: &Value, axes: &[i64], keep: bool) -> Result<Value> {
        match self.forms().mean {
            MeanForm::ReduceMean => self.reduce_mean_keeping(local, x, axes, keep),
            MeanForm::SumThenDivide => {
                let rank = x.shape.len();
                let mut count = 1usize;
                for &a in axes {
                    match &x.shape[normalize_axis("ReduceSum", a, rank)?] {
                        Dim::Fixed(n) => count *= n,
                        d => {
                            return Err(shape_error(
                                "ReduceSum",
                                format!("a mean over the symbolic dimension {d}"),
                            ))
                        }
                    }
                }
                let sum = self.reduce_sum(&format!("{local}_sum"), x, axes, keep)?;
                let n =
                    self.const_float(&format!("{local}_count"), &[], vec![count as f32], x.elem)?;
                self.div(local, &sum, &n)
            }
        }
    }
}
