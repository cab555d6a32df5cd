//! Operator helpers that write rows into a tensor of fixed size: `ScatterND` (every opset
//! here) and `TensorScatter` (opset 24, made for key/value caches). Both return a new
//! tensor in ONNX's value semantics; ONNX Runtime's CPU kernels of both skip the copy of
//! the input when the output is bound to the input's own buffer (measured in
//! docs/static-state.md), which is what makes a state updated in place possible.

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{fmt_shape, shape_error};

/// First opset with `TensorScatter`.
pub const TENSOR_SCATTER_OPSET: i64 = 24;

impl GraphBuilder {
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
