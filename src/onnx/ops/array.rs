//! Array operators: element type (`Cast`), shape and layout (`Reshape`, `Transpose`,
//! `Split`, `Concat`, `Slice`, `Pad`), indexing (`Gather`), and rows written into a tensor
//! of fixed size
//! (`ScatterND` in every opset here, `TensorScatter` at opset 24; both return a new tensor
//! in ONNX's value semantics, and ONNX Runtime's CPU kernels of both skip the copy of the
//! input when the output is bound to the input's own buffer: docs/static-state.md).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{fmt_shape, normalize_axis, shape_error};

/// First opset with `TensorScatter`.
pub const TENSOR_SCATTER_OPSET: i64 = 24;

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

    /// `Identity`: `x` as it is, under a new name (a graph output that passes an input
    /// through).
    ///
    /// [Identity](https://onnx.ai/onnx/operators/onnx__Identity.html): versions 1, 13, 14, 16, 19, 21, 23 (types only); the same form in every opset here.
    pub fn identity(&mut self, local: &str, x: &Value) -> Result<Value> {
        Ok(self.single(
            local,
            "Identity",
            &[x],
            vec![],
            (x.elem, x.shape.clone()),
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

    /// `ScatterND(data, indices, updates)` without reduction: a copy of `data` with the
    /// slices `indices[..., :]` replaced by `updates`. `indices` is i64 `[..., k]` with a
    /// fixed k ≤ rank(data); `updates` has shape `indices.shape[..-1] ++ data.shape[k..]`.
    ///
    /// [ScatterND](https://onnx.ai/onnx/operators/onnx__ScatterND.html): versions 11, 13
    /// (types), 16 (`reduction` attribute, default `none`), 18 (`max` / `min`
    /// reductions); the form without the attribute means the same in every opset here.
    pub fn scatter_nd(
        &mut self,
        local: &str,
        data: &Value,
        indices: &Value,
        updates: &Value,
    ) -> Result<Value> {
        let k = match indices.shape.last() {
            Some(Dim::Fixed(k)) if *k <= data.shape.len() => *k,
            _ => {
                return Err(shape_error(
                    "ScatterND",
                    format!(
                        "indices {} for data {}",
                        fmt_shape(&indices.shape),
                        fmt_shape(&data.shape)
                    ),
                ))
            }
        };
        let mut expected = indices.shape[..indices.shape.len() - 1].to_vec();
        expected.extend_from_slice(&data.shape[k..]);
        if indices.elem != ElemType::I64 || updates.elem != data.elem || updates.shape != expected {
            return Err(shape_error(
                "ScatterND",
                format!(
                    "updates {} for indices {} into {}",
                    fmt_shape(&updates.shape),
                    fmt_shape(&indices.shape),
                    fmt_shape(&data.shape)
                ),
            ));
        }
        Ok(self.single(
            local,
            "ScatterND",
            &[data, indices, updates],
            vec![],
            (data.elem, data.shape.clone()),
            0,
        ))
    }

    /// `TensorScatter(past, update, write_indices)` in `linear` mode along `axis`: a copy of
    /// `past` whose rows `write_indices[b] .. write_indices[b] + T` along `axis` are
    /// `update`'s (T = update's size on that axis, which may differ from past's; every
    /// other dimension the same).
    ///
    /// [TensorScatter](https://onnx.ai/onnx/operators/onnx__TensorScatter.html): new in
    /// opset 24 (its only version); refused below.
    pub fn tensor_scatter(
        &mut self,
        local: &str,
        past: &Value,
        update: &Value,
        write_indices: &Value,
        axis: usize,
    ) -> Result<Value> {
        let rank = past.shape.len();
        let same_rest = update.shape.len() == rank
            && (0..rank).all(|k| k == axis || update.shape[k] == past.shape[k]);
        let ok = self.opset() >= TENSOR_SCATTER_OPSET
            && axis > 0
            && axis < rank
            && same_rest
            && update.elem == past.elem
            && write_indices.elem == ElemType::I64
            && write_indices.shape.len() == 1
            && write_indices.shape[0] == past.shape[0];
        if !ok {
            return Err(shape_error(
                "TensorScatter",
                format!(
                    "update {} at write_indices {} along axis {axis} of {} (opset {}, needs {TENSOR_SCATTER_OPSET})",
                    fmt_shape(&update.shape),
                    fmt_shape(&write_indices.shape),
                    fmt_shape(&past.shape),
                    self.opset()
                ),
            ));
        }
        Ok(self.single(
            local,
            "TensorScatter",
            &[past, update, write_indices],
            vec![
                ("axis".to_string(), Attr::Int(axis as i64)),
                ("mode".to_string(), Attr::String("linear".into())),
            ],
            (past.elem, past.shape.clone()),
            0,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_helpers_check_their_shapes_and_opset() {
        let sym = |s: &str| Dim::Symbol(s.into());
        let mut g = GraphBuilder::new(17).unwrap();
        let past = g
            .input(
                "past",
                ElemType::F32,
                vec![sym("batch"), Dim::Fixed(8), Dim::Fixed(4)],
            )
            .unwrap();
        let new = g
            .input(
                "new",
                ElemType::F32,
                vec![sym("batch"), sym("t"), Dim::Fixed(4)],
            )
            .unwrap();
        let idx = g
            .input(
                "idx",
                ElemType::I64,
                vec![sym("batch"), sym("t"), Dim::Fixed(2)],
            )
            .unwrap();
        let pos = g.input("pos", ElemType::I64, vec![sym("batch")]).unwrap();
        let out = g.scatter_nd("s", &past, &idx, &new).unwrap();
        assert_eq!(out.shape, past.shape);
        assert!(g.scatter_nd("bad", &past, &idx, &past).is_err());
        // TensorScatter needs opset 24.
        assert!(g.tensor_scatter("t", &past, &new, &pos, 1).is_err());
        let mut g24 = GraphBuilder::new(24).unwrap();
        let past = g24
            .input(
                "past",
                ElemType::F32,
                vec![sym("batch"), Dim::Fixed(8), Dim::Fixed(4)],
            )
            .unwrap();
        let new = g24
            .input(
                "new",
                ElemType::F32,
                vec![sym("batch"), sym("t"), Dim::Fixed(4)],
            )
            .unwrap();
        let pos = g24.input("pos", ElemType::I64, vec![sym("batch")]).unwrap();
        let out = g24.tensor_scatter("t", &past, &new, &pos, 1).unwrap();
        assert_eq!(out.shape, past.shape);
        assert!(g24.tensor_scatter("t0", &past, &new, &pos, 0).is_err());
        assert!(g24.tensor_scatter("t2", &past, &new, &pos, 2).is_err());
    }
}
