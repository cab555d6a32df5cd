//! Array operators for sizes known only at run time (a sequence length read from an
//! input's shape): `Shape`, `Range`, `Slice` with computed bounds, and `Pad` / `Concat`
//! along a symbolic axis. The caller names the symbolic dimensions of the results (a
//! derived size gets its own symbol, so `value_info` never claims a size it cannot know).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{fmt_shape, normalize_axis, shape_error};

impl GraphBuilder {
    /// `Shape` of `x` restricted to the axes `[start, end)`: an i64 vector of `end − start`
    /// sizes, spelled as the whole `Shape` followed by a constant `Slice` at every opset.
    ///
    /// [Shape](https://onnx.ai/onnx/operators/onnx__Shape.html): versions 1, 13 (types), 15 (`start` / `end` attributes), 19, 21, 23. The
    /// `start`/`end` attributes (15+) are not used: candle-onnx 0.11 ignores them and returns
    /// the whole shape (found by the consumer matrix), and opsets 13–14 lack them.
    pub fn shape_of(&mut self, local: &str, x: &Value, start: usize, end: usize) -> Result<Value> {
        let rank = x.shape.len();
        if !(start < end && end <= rank) {
            return Err(shape_error(
                "Shape",
                format!("axes [{start}, {end}) of {}", fmt_shape(&x.shape)),
            ));
        }
        let whole = self.single(
            &format!("{local}_all"),
            "Shape",
            &[x],
            vec![],
            (ElemType::I64, vec![Dim::Fixed(rank)]),
            0,
        );
        self.slice(local, &whole, 0, start, end)
    }

    /// `Range(start, limit, delta)` of i64 or f32 scalars (all of one type): a vector of
    /// `length` elements of that type (a symbol chosen by the caller).
    ///
    /// [Range](https://onnx.ai/onnx/operators/onnx__Range.html): new in opset 11 (its only version); the same form in every opset here.
    pub fn range(
        &mut self,
        local: &str,
        start: &Value,
        limit: &Value,
        delta: &Value,
        length: Dim,
    ) -> Result<Value> {
        let elem = start.elem;
        for v in [start, limit, delta] {
            if !v.shape.is_empty()
                || v.elem != elem
                || !matches!(elem, ElemType::I64 | ElemType::F32)
            {
                return Err(shape_error(
                    "Range",
                    format!(
                        "operands must be i64 or f32 scalars of one type, got {:?} {}",
                        v.elem,
                        fmt_shape(&v.shape)
                    ),
                ));
            }
        }
        Ok(self.single(
            local,
            "Range",
            &[start, limit, delta],
            vec![],
            (elem, vec![length]),
            0,
        ))
    }

    /// `Slice` of `x` on `axes` with computed i64 `starts` and `ends` (vectors with one
    /// entry per axis); `result` is the output shape the caller knows.
    ///
    /// [Slice](https://onnx.ai/onnx/operators/onnx__Slice.html): versions 1, 10 (`starts`/`ends`/`axes` become inputs), 11, 13; the input form is valid from 10 on.
    pub fn slice_dynamic(
        &mut self,
        local: &str,
        x: &Value,
        starts: &Value,
        ends: &Value,
        axes: &[i64],
        result: Vec<Dim>,
    ) -> Result<Value> {
        let rank = x.shape.len();
        for &a in axes {
            normalize_axis("Slice", a, rank)?;
        }
        let count = Dim::Fixed(axes.len());
        if starts.shape != [count.clone()] || ends.shape != [count] || result.len() != rank {
            return Err(shape_error(
                "Slice",
                format!(
                    "starts {} and ends {} for axes {axes:?} of {}",
                    fmt_shape(&starts.shape),
                    fmt_shape(&ends.shape),
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let axes_value = self.const_i64(&format!("{local}_axes"), &[axes.len()], axes.to_vec())?;
        Ok(self.single(
            local,
            "Slice",
            &[x, starts, ends, &axes_value],
            vec![],
            (x.elem, result),
            0,
        ))
    }

    /// Zero `Pad` (mode constant) of `before` / `after` elements on one axis of any size;
    /// `padded` names the padded size.
    ///
    /// [Pad](https://onnx.ai/onnx/operators/onnx__Pad.html): versions 1, 2, 11 (`pads` becomes an input), 13, 18 (optional `axes` input), 19 (`wrap` mode), 21, 23; the `pads`-input form without `axes` is valid from 11 on.
    pub fn pad_axis_symbolic(
        &mut self,
        local: &str,
        x: &Value,
        axis: usize,
        (before, after): (usize, usize),
        padded: Dim,
    ) -> Result<Value> {
        let rank = x.shape.len();
        if axis >= rank {
            return Err(shape_error(
                "Pad",
                format!("axis {axis} of {}", fmt_shape(&x.shape)),
            ));
        }
        let mut pads = vec![0i64; 2 * rank];
        pads[axis] = before as i64;
        pads[rank + axis] = after as i64;
        let mut shape = x.shape.clone();
        shape[axis] = padded;
        let pads = self.const_i64(&format!("{local}_pads"), &[2 * rank], pads)?;
        Ok(self.single(local, "Pad", &[x, &pads], vec![], (x.elem, shape), 0))
    }

    /// `Concat` along `axis` where that axis may be symbolic: the other axes must agree,
    /// and the caller names the concatenated size `total`.
    ///
    /// [Concat](https://onnx.ai/onnx/operators/onnx__Concat.html): versions 1, 4, 11 (negative axis), 13; the same form in every opset here.
    pub fn concat_symbolic(
        &mut self,
        local: &str,
        parts: &[&Value],
        axis: i64,
        total: Dim,
    ) -> Result<Value> {
        let first = parts
            .first()
            .ok_or_else(|| shape_error("Concat", "no input".into()))?;
        let ax = normalize_axis("Concat", axis, first.shape.len())?;
        for p in parts {
            let same_rest = p.elem == first.elem
                && p.shape.len() == first.shape.len()
                && p.shape
                    .iter()
                    .zip(&first.shape)
                    .enumerate()
                    .all(|(k, (a, b))| k == ax || a == b);
            if !same_rest {
                return Err(shape_error(
                    "Concat",
                    format!("{} with {}", fmt_shape(&first.shape), fmt_shape(&p.shape)),
                ));
            }
        }
        let mut shape = first.shape.clone();
        shape[ax] = total;
        Ok(self.single(
            local,
            "Concat",
            parts,
            vec![("axis".to_string(), Attr::Int(axis))],
            (first.elem, shape),
            0,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn dynamic_helpers_track_symbols_and_refuse_mismatches() {
        let mut g = GraphBuilder::new(17).unwrap();
        let sym = |s: &str| Dim::Symbol(s.into());
        let ids = g
            .input("ids", ElemType::I64, vec![sym("batch"), sym("sequence")])
            .unwrap();
        let len = g.shape_of("len", &ids, 1, 2).unwrap();
        assert_eq!(len.shape, vec![Dim::Fixed(1)]);
        assert!(g.shape_of("bad", &ids, 1, 3).is_err());
        let zero = g.const_i64("zero", &[], vec![0]).unwrap();
        let one = g.const_i64("one", &[], vec![1]).unwrap();
        assert!(matches!(
            g.range("r", &zero, &len, &one, sym("sequence")),
            Err(Error::Internal(_))
        ));
        let r = g.range("r", &zero, &one, &one, sym("sequence")).unwrap();
        let col = g
            .reshape("col", &r, &[-1, 1], vec![sym("sequence"), Dim::Fixed(1)])
            .unwrap();
        let diff = g.sub("diff", &r, &col).unwrap();
        assert_eq!(diff.shape, vec![sym("sequence"), sym("sequence")]);
        let x = g
            .input(
                "x",
                ElemType::F32,
                vec![sym("batch"), sym("past"), Dim::Fixed(4)],
            )
            .unwrap();
        let y = g
            .input(
                "y",
                ElemType::F32,
                vec![sym("batch"), sym("sequence"), Dim::Fixed(4)],
            )
            .unwrap();
        let cat = g
            .concat_symbolic("cat", &[&x, &y], 1, sym("total"))
            .unwrap();
        assert_eq!(cat.shape, vec![sym("batch"), sym("total"), Dim::Fixed(4)]);
        let z = g
            .input(
                "z",
                ElemType::F32,
                vec![sym("batch"), sym("past"), Dim::Fixed(5)],
            )
            .unwrap();
        assert!(g.concat_symbolic("bad", &[&x, &z], 1, sym("t")).is_err());
        let s = g
            .slice_dynamic("s", &cat, &len, &len, &[1], cat.shape.clone())
            .unwrap();
        assert_eq!(s.shape, cat.shape);
        assert!(g
            .slice_dynamic("s2", &cat, &len, &len, &[1, 2], cat.shape.clone())
            .is_err());
    }
}
