//! Each operator pattern the builder emits, as a one-op graph run in tract and ONNX
//! Runtime and compared with a plain Rust computation of the ONNX operator definition.

use gmlp_onnx::onnx::builder::GraphBuilder;
use gmlp_onnx::onnx::graph::{Dim, ElemType, TensorData};

fn fixed(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&d| Dim::Fixed(d)).collect()
}

#[test]
fn builder_rejects_bad_shapes_and_opsets() {
    assert!(GraphBuilder::new(12).is_err());
    assert!(GraphBuilder::new(25).is_err());
    assert!(GraphBuilder::new(24).is_ok());
    let mut g = GraphBuilder::new(17).unwrap();
    let a = g.input("a", ElemType::F32, fixed(&[2, 3])).unwrap();
    let b = g.input("b", ElemType::F32, fixed(&[4, 5])).unwrap();
    assert!(g.matmul("mm", &a, &b).is_err());
    assert!(g.add("add", &a, &b).is_err());
    assert!(g.split("split", &a, -1, &[1, 1]).is_err());
    assert!(g.transpose("t", &a, &[0, 0]).is_err());
    // Parameter names are never silently renamed.
    g.weight("w", &[1], TensorData::F32(vec![0.0])).unwrap();
    assert!(g.weight("w", &[1], TensorData::F32(vec![0.0])).is_err());
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use crate::common::*;
    use gmlp_onnx::gmlp::toeplitz::{toeplitz_expand, toeplitz_index};
    use gmlp_onnx::onnx::forms::{LayerNormForm, MeanForm, OpForms};
    use gmlp_onnx::onnx::graph::Value;
    use gmlp_onnx::rng::SplitMix64;
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use ndarray::{ArrayD, IxDyn};

    const OP_RTOL: f64 = 2e-6;

    fn random(shape: &[usize], seed: u64) -> ArrayD<f32> {
        let mut rng = SplitMix64::keyed(seed, "op-test");
        ArrayD::from_shape_fn(IxDyn(shape), |_| rng.uniform(-2.0, 2.0) as f32)
    }

    /// Writes the graph, checks it with onnx.checker, runs it in both runtimes with `x` as
    /// input `x`, and compares with `expected`; returns the graph's operator types.
    fn check(
        g: GraphBuilder,
        out: Value,
        x: ArrayD<f32>,
        expected: ArrayD<f32>,
        name: &str,
    ) -> Vec<String> {
        let out = {
            let mut g = g;
            let out = g.rename(&out, "y").unwrap();
            (g, out)
        };
        let graph = out.0.finish(name, vec![out.1]);
        let dir = tempfile::tempdir().unwrap();
        let path = write_graph(&graph, dir.path(), &format!("{name}.onnx"));
        onnx_check(std::slice::from_ref(&path));
        let inputs = [NamedTensor {
            name: "x".into(),
            value: TensorValue::F32(x),
        }];
        for kind in CPU_RUNTIMES {
            let y = f32_output(&run(kind, &path, &inputs));
            let d = rel_diff(&y, &expected);
            assert!(
                d <= OP_RTOL,
                "{name} in {}: relative difference {d:e}",
                kind.name()
            );
        }
        graph.nodes.iter().map(|n| n.op_type.clone()).collect()
    }

    /// The LayerNorm forms: the operator (opset 17), the decomposition with `ReduceMean` in
    /// its attribute (13) and input (18) forms, and with `ReduceSum` then `Div` (13, 21).
    const LAYER_NORM_FORMS: [(i64, LayerNormForm, MeanForm, &str); 5] = [
        (
            17,
            LayerNormForm::Operator,
            MeanForm::ReduceMean,
            "LayerNormalization",
        ),
        (
            13,
            LayerNormForm::Operator,
            MeanForm::ReduceMean,
            "ReduceMean",
        ),
        (
            18,
            LayerNormForm::Decomposed,
            MeanForm::ReduceMean,
            "ReduceMean",
        ),
        (
            13,
            LayerNormForm::Decomposed,
            MeanForm::SumThenDivide,
            "ReduceSum",
        ),
        (
            21,
            LayerNormForm::Decomposed,
            MeanForm::SumThenDivide,
            "ReduceSum",
        ),
    ];

    #[test]
    fn layer_normalization() {
        for (opset, layer_norm, mean, op) in LAYER_NORM_FORMS {
            let forms = OpForms {
                layer_norm,
                mean,
                ..OpForms::default()
            };
            layer_normalization_in(GraphBuilder::with_forms(opset, forms).unwrap(), op);
        }
    }

    fn layer_normalization_in(mut g: GraphBuilder, op: &str) {
        let name = format!("layer_norm_opset{}_{op}", g.opset());
        let x = g.input("x", ElemType::F32, fixed(&[3, 5, 8])).unwrap();
        let gamma = random(&[8], 1);
        let beta = random(&[8], 2);
        let s = g
            .weight(
                "gamma",
                &[8],
                TensorData::F32(gamma.iter().copied().collect()),
            )
            .unwrap();
        let b = g
            .weight(
                "beta",
                &[8],
                TensorData::F32(beta.iter().copied().collect()),
            )
            .unwrap();
        let y = g.layer_norm("ln", &x, &s, &b, 1e-5).unwrap();
        let xv = random(&[3, 5, 8], 3);
        let mut expected = xv.clone();
        for mut row in expected.rows_mut() {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / 8.0;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / 8.0;
            for (k, v) in row.iter_mut().enumerate() {
                *v = ((f64::from(*v) - mean) / (var + 1e-5).sqrt() * f64::from(gamma[k])
                    + f64::from(beta[k])) as f32;
            }
        }
        let graph_ops = check(g, y, xv, expected, &name);
        assert!(
            graph_ops.iter().any(|o| o == op),
            "{name}: no {op} in {graph_ops:?}"
        );
        if op != "LayerNormalization" {
            assert!(
                !graph_ops.iter().any(|o| o == "LayerNormalization"),
                "{name}: {graph_ops:?}"
            );
        }
    }

    #[test]
    fn gelu_exact_at_opset_17_and_20() {
        for opset in [13, 17, 20, 21] {
            let mut g = GraphBuilder::new(opset).unwrap();
            let x = g.input("x", ElemType::F32, fixed(&[4, 6])).unwrap();
            let y = g.gelu("gelu", &x).unwrap();
            let xv = random(&[4, 6], 4) * 3.0;
            let expected = xv.mapv(|v| {
                let v = f64::from(v);
                (0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))) as f32
            });
            check(g, y, xv, expected, &format!("gelu_opset{opset}"));
        }
    }

    #[test]
    fn split_then_multiply_halves() {
        let mut g = GraphBuilder::new(17).unwrap();
        let x = g.input("x", ElemType::F32, fixed(&[2, 3, 10])).unwrap();
        let parts = g.split("split", &x, -1, &[5, 5]).unwrap();
        let y = g.mul("gate", &parts[0], &parts[1]).unwrap();
        let xv = random(&[2, 3, 10], 5);
        let expected = ArrayD::from_shape_fn(IxDyn(&[2, 3, 5]), |i| {
            xv[[i[0], i[1], i[2]]] * xv[[i[0], i[1], i[2] + 5]]
        });
        check(g, y, xv, expected, "split_mul");
    }

    #[test]
    fn toeplitz_gather_then_spatial_matmul_with_bias() {
        let n = 7;
        let mut g = GraphBuilder::new(17).unwrap();
        let x = g
            .input(
                "x",
                ElemType::F32,
                vec![Dim::Fixed(2), Dim::Fixed(n), Dim::Fixed(4)],
            )
            .unwrap();
        let w: Vec<f32> = random(&[2 * n - 1], 6).iter().copied().collect();
        let wv = g
            .weight("w", &[2 * n - 1], TensorData::F32(w.clone()))
            .unwrap();
        let idx = g.const_i64("idx", &[n, n], toeplitz_index(n)).unwrap();
        let full = g.gather("gather", &wv, &idx, 0).unwrap();
        let mixed = g.matmul("spatial", &full, &x).unwrap();
        let bias: Vec<f32> = random(&[n], 7).iter().copied().collect();
        let bv = g
            .weight("b", &[n, 1], TensorData::F32(bias.clone()))
            .unwrap();
        let y = g.add("bias", &mixed, &bv).unwrap();
        let xv = random(&[2, n, 4], 8);
        // W[i, j] = w[j − i + n − 1], computed here without the index table.
        let expected = ArrayD::from_shape_fn(IxDyn(&[2, n, 4]), |ix| {
            let (b, i, c) = (ix[0], ix[1], ix[2]);
            let s: f64 = (0..n)
                .map(|j| f64::from(w[j + n - 1 - i]) * f64::from(xv[[b, j, c]]))
                .sum();
            (s + f64::from(bias[i])) as f32
        });
        // The helper used by the expand form agrees with the formula too.
        let dense = toeplitz_expand(&w, n);
        for i in 0..n {
            for j in 0..n {
                assert_eq!(dense[i * n + j], w[j + n - 1 - i]);
            }
        }
        check(g, y, xv, expected, "toeplitz_gather");
    }

    #[test]
    fn attention_pattern_transpose_matmul_softmax() {
        let mut g = GraphBuilder::new(17).unwrap();
        let x = g.input("x", ElemType::F32, fixed(&[2, 5, 3])).unwrap();
        let xt = g.transpose("t", &x, &[0, 2, 1]).unwrap();
        let s = g.matmul("scores", &x, &xt).unwrap();
        let y = g.softmax("softmax", &s, -1).unwrap();
        let xv = random(&[2, 5, 3], 9);
        let mut expected = ArrayD::<f32>::zeros(IxDyn(&[2, 5, 5]));
        for b in 0..2 {
            for i in 0..5 {
                let row: Vec<f64> = (0..5)
                    .map(|j| {
                        (0..3)
                            .map(|c| f64::from(xv[[b, i, c]]) * f64::from(xv[[b, j, c]]))
                            .sum()
                    })
                    .collect();
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = row.iter().map(|v| (v - max).exp()).sum();
                for j in 0..5 {
                    expected[[b, i, j]] = ((row[j] - max).exp() / z) as f32;
                }
            }
        }
        check(g, y, xv, expected, "attention");
    }

    #[test]
    fn patch_embedding_conv_reshape_transpose() {
        let (c, hw, p, d) = (2, 6, 3, 4);
        let n = (hw / p) * (hw / p);
        let mut g = GraphBuilder::new(17).unwrap();
        let x = g
            .input(
                "x",
                ElemType::F32,
                vec![
                    Dim::Symbol("batch".into()),
                    Dim::Fixed(c),
                    Dim::Fixed(hw),
                    Dim::Fixed(hw),
                ],
            )
            .unwrap();
        let w = random(&[d, c, p, p], 10);
        let bias = random(&[d], 11);
        let wv = g
            .weight(
                "w",
                &[d, c, p, p],
                TensorData::F32(w.iter().copied().collect()),
            )
            .unwrap();
        let bv = g
            .weight("b", &[d], TensorData::F32(bias.iter().copied().collect()))
            .unwrap();
        let f = g.conv2d("conv", &x, &wv, &bv, p, p).unwrap();
        let flat = g
            .reshape(
                "flatten",
                &f,
                &[0, d as i64, -1],
                vec![Dim::Symbol("batch".into()), Dim::Fixed(d), Dim::Fixed(n)],
            )
            .unwrap();
        let y = g.transpose("tokens", &flat, &[0, 2, 1]).unwrap();
        let xv = random(&[2, c, hw, hw], 12);
        let side = hw / p;
        let expected = ArrayD::from_shape_fn(IxDyn(&[2, n, d]), |ix| {
            let (b, t, o) = (ix[0], ix[1], ix[2]);
            let (py, px) = (t / side, t % side);
            let mut s = f64::from(bias[o]);
            for ch in 0..c {
                for ky in 0..p {
                    for kx in 0..p {
                        s += f64::from(w[[o, ch, ky, kx]])
                            * f64::from(xv[[b, ch, py * p + ky, px * p + kx]]);
                    }
                }
            }
            s as f32
        });
        check(g, y, xv, expected, "patch_embed");
    }

    #[test]
    fn reduce_mean_attribute_and_input_forms() {
        for opset in [13, 17, 18, 21] {
            let mut g = GraphBuilder::new(opset).unwrap();
            let x = g.input("x", ElemType::F32, fixed(&[2, 5, 3])).unwrap();
            let y = g.reduce_mean("mean", &x, &[1]).unwrap();
            let xv = random(&[2, 5, 3], 13);
            let expected = xv.mean_axis(ndarray::Axis(1)).unwrap();
            check(g, y, xv, expected, &format!("reduce_mean_opset{opset}"));
        }
    }

    #[test]
    fn mean_as_sum_then_divide_keeps_or_drops_the_axes() {
        for (opset, keep) in [(13, true), (21, false)] {
            let forms = OpForms {
                mean: MeanForm::SumThenDivide,
                ..OpForms::default()
            };
            let mut g = GraphBuilder::with_forms(opset, forms).unwrap();
            let x = g.input("x", ElemType::F32, fixed(&[2, 5, 3])).unwrap();
            let y = g.mean("mean", &x, &[1], keep).unwrap();
            let xv = random(&[2, 5, 3], 14);
            let mut expected = xv.mean_axis(ndarray::Axis(1)).unwrap();
            if keep {
                expected = expected.insert_axis(ndarray::Axis(1));
            }
            let ops = check(g, y, xv, expected, &format!("mean_sum_opset{opset}"));
            assert_eq!(ops, ["Constant", "ReduceSum", "Constant", "Div"]);
        }
    }
}
