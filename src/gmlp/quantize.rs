//! Build-time int8 weight quantization for `--dtype int8`: symmetric, per output channel;
//! and the metadata that describes a weight-quantized (`--dtype int4`) model's weights
//! (their block quantization is [`crate::onnx::nbits`]).
//!
//! A MatMul weight `W` is stored `[in, out]`; each output column `c` gets one scale
//! `s[c] = max_r |W[r, c]| / 127` and the stored values are `q = round(W / s)` clamped to
//! [−127, 127] (−128 is never used, so the grid is symmetric and a zero point of 0 is exact).
//! A column whose weights are all zero would give `s = 0` (and `W / s` = NaN): it gets
//! `s = 1` instead, which stores the zeros exactly; no NaN or infinity ever reaches the file.
//! Non-finite weights are refused before this point (`check_values`).
//!
//! At run time the graph quantizes each activation tensor on the fly
//! (`DynamicQuantizeLinear`: u8, per tensor, asymmetric), multiplies in integers
//! (`MatMulInteger`, i32 accumulators) and scales back with `x_scale · s[c]`.

use serde_json::json;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision};
use crate::onnx::graph::Graph;
use crate::onnx::nbits::BLOCK_SIZE;

/// Largest stored magnitude (the symmetric int8 grid is [−127, 127]).
pub const QMAX: f32 = 127.0;

/// Per-column scales of a row-major `[rows, cols]` matrix: `max |column| / 127`, or 1 for
/// an all-zero column (the documented fallback, so that no scale is 0).
pub fn column_scales(w: &[f32], cols: usize) -> Vec<f32> {
    let mut max = vec![0f32; cols];
    for row in w.chunks_exact(cols) {
        for (m, x) in max.iter_mut().zip(row) {
            *m = m.max(x.abs());
        }
    }
    max.into_iter().map(scale_for).collect()
}

/// The scale for a column whose largest magnitude is `max_abs`.
pub fn scale_for(max_abs: f32) -> f32 {
    let s = max_abs / QMAX;
    if s > 0.0 && s.is_finite() {
        s
    } else {
        1.0
    }
}

/// Quantizes a row-major `[rows, cols]` matrix with the given per-column scales; the
/// integers are returned as f32 (the writer stores them as int8).
pub fn quantize_columns(mut w: Vec<f32>, scales: &[f32]) -> Vec<f32> {
    let cols = scales.len();
    for row in w.chunks_exact_mut(cols) {
        for (x, s) in row.iter_mut().zip(scales) {
            *x = (*x / s).round().clamp(-QMAX, QMAX);
        }
    }
    w
}

/// Columns `[start, end)` of a row-major matrix with `cols` columns.
pub fn column_range(w: &[f32], cols: usize, start: usize, end: usize) -> Vec<f32> {
    w.chunks_exact(cols)
        .flat_map(|row| row[start..end].iter().copied())
        .collect()
}

/// The transpose of a row-major `[rows, cols]` matrix.
pub fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

/// The parameters whose quantized forms `graph` stores under names ending in `suffix`
/// (`.int4`, `.int8`), less the `.cols{a}_{b}` / `.transposed` suffixes, with the block
/// index written `*` (`blocks.*.proj_in.weight`), each once, in file order.
pub fn quantized_parameters(graph: &Graph, suffix: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for init in &graph.initializers {
        let Some(base) = init.name.strip_suffix(suffix) else {
            continue;
        };
        let base = base.strip_suffix(".transposed").unwrap_or(base);
        let base = match base.rsplit_once(".cols") {
            Some((b, range)) if range.split('_').all(|p| p.parse::<usize>().is_ok()) => b,
            _ => base,
        };
        let name = match base.split_once('.') {
            Some(("blocks", rest)) => match rest.split_once('.') {
                Some((i, tail)) if i.parse::<usize>().is_ok() => format!("blocks.*.{tail}"),
                _ => base.to_string(),
            },
            _ => base.to_string(),
        };
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// What a weight-quantized model records about its weights (metadata
/// `gmlp_onnx.quantization`): for `--dtype int4`, the block-quantized projections
/// (operator, bits, block, scale rule, `accuracy_level`, parameters), the int8 head and what
/// stays float. `None` for other precisions (int8 files carry their form in the config).
pub fn quantization_json(
    cfg: &GmlpConfig,
    graph: &Graph,
    accuracy_level: i64,
) -> Result<Option<String>> {
    if cfg.dtype != Precision::Int4 {
        return Ok(None);
    }
    let value = json!({
        "dtype": "int4",
        "projections": {
            "op": "com.microsoft.MatMulNBits",
            "bits": 4,
            "block_size": BLOCK_SIZE,
            "block_axis": "K (input features)",
            "scales": "f32 [N, K/32], m/-8 for the block's largest-magnitude value m, rounded to f16",
            "zero_points": "none (the default 8: symmetric)",
            "accuracy_level": accuracy_level,
            "parameters": quantized_parameters(graph, ".int4"),
        },
        "head": {
            "op": "DynamicQuantizeLinear + MatMulInteger",
            "bits": 8,
            "scales": "f32 per output channel, max|w|/127",
            "parameters": quantized_parameters(graph, ".int8"),
        },
        "float": "embedding gather, spatial projection, norms, biases, attention scores and softmax, activations, logits",
    });
    serde_json::to_string(&value)
        .map(Some)
        .map_err(|e| Error::Internal(format!("quantization metadata: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_per_column_and_zero_columns_fall_back_to_one() {
        // [3, 3]: column 0 max 2.54, column 1 all zero, column 2 max 1.27.
        let w = [2.54, 0.0, -1.27, -1.0, 0.0, 0.5, 0.0, 0.0, 1.0];
        let s = column_scales(&w, 3);
        assert!((s[0] - 0.02).abs() < 1e-7 && s[1] == 1.0 && (s[2] - 0.01).abs() < 1e-7);
        let q = quantize_columns(w.to_vec(), &s);
        assert_eq!(
            q,
            vec![127.0, 0.0, -127.0, -50.0, 0.0, 50.0, 0.0, 0.0, 100.0]
        );
    }

    #[test]
    fn round_trip_error_is_at_most_half_a_step() {
        let w: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.013)
            .collect();
        let s = column_scales(&w, 8);
        let q = quantize_columns(w.clone(), &s);
        for (k, (x, qv)) in w.iter().zip(&q).enumerate() {
            assert!(qv.abs() <= QMAX && qv.fract() == 0.0);
            assert!((x - qv * s[k % 8]).abs() <= 0.5 * s[k % 8] + 1e-7);
        }
    }

    #[test]
    fn scale_is_never_zero_nan_or_infinite() {
        for m in [0.0, f32::MIN_POSITIVE / 1e3, f32::NAN, f32::INFINITY] {
            let s = scale_for(m);
            assert!(s > 0.0 && s.is_finite(), "{m} -> {s}");
        }
        let tiny = 1e-30f32;
        let q = quantize_columns(vec![tiny, -tiny], &[scale_for(tiny)]);
        assert!(q.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn quantized_parameter_names_collapse_slices_and_block_indices() {
        use crate::onnx::builder::GraphBuilder;
        use crate::onnx::graph::{ElemType, TensorData};
        let mut g = GraphBuilder::new(17).unwrap();
        for name in [
            "blocks.0.proj_in.weight.cols0_8.int4",
            "blocks.0.proj_in.weight.cols8_16.int4",
            "blocks.1.proj_in.weight.cols0_8.int4",
            "blocks.1.attn.out.weight.int4",
            "embed.weight.transposed.int8",
            "blocks.1.attn.out.weight.scale",
        ] {
            g.weight_as(name, &[1], ElemType::U8, TensorData::F32(vec![0.0]))
                .unwrap();
        }
        let graph = g.finish("g", vec![]);
        assert_eq!(
            quantized_parameters(&graph, ".int4"),
            vec!["blocks.*.proj_in.weight", "blocks.*.attn.out.weight"]
        );
        assert_eq!(quantized_parameters(&graph, ".int8"), vec!["embed.weight"]);
    }

    #[test]
    fn slicing_and_transposing() {
        let w: Vec<f32> = (0..6).map(|i| i as f32).collect(); // [2, 3]
        assert_eq!(column_range(&w, 3, 1, 3), vec![1.0, 2.0, 4.0, 5.0]);
        assert_eq!(transpose(&w, 2, 3), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
