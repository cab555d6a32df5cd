//! `Runtime::run_into`: repeated runs write their outputs into the arrays they are given
//! (ONNX Runtime through its I/O binding, tract by a copy) and give what a plain `run` of
//! the same inputs gives, whatever shapes the runs before had.

use crate::common::*;
use gmlp_onnx::gmlp::SpatialForm;
use gmlp_onnx::onnx::proto::{
    tensor_shape_proto::{dimension::Value as DimValue, Dimension},
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use gmlp_onnx::runtime::{self, Runtime};
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{Array2, ArrayD, IxDyn};
use prost::Message;

/// Token ids [batch, 12] below the tiny vocabulary (50), different for each `seed`.
fn ids(batch: usize, seed: i64) -> Vec<NamedTensor> {
    vec![NamedTensor {
        name: "input_ids".into(),
        value: TensorValue::I64(
            Array2::from_shape_fn((batch, 12), |(b, t)| {
                (seed * 7 + b as i64 * 13 + t as i64 * 5) % 50
            })
            .into_dyn(),
        ),
    }]
}

/// Where an output's elements are.
fn data_address(t: &NamedTensor) -> usize {
    match &t.value {
        TensorValue::F32(a) => a.as_ptr() as usize,
        other => panic!("expected an f32 output, got {}", other.dtype()),
    }
}

#[test]
fn runs_into_given_arrays_write_them_in_place_and_equal_plain_runs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
    let path = write_config(&cfg, 3, 17, dir.path(), "tiny.onnx");
    for kind in CPU_RUNTIMES {
        let what = kind.name();
        let mut rt = runtime::open(kind, &path, &options()).unwrap();
        // The reference: a plain run of each input, in a runtime of its own.
        let mut reference = runtime::open(kind, &path, &options()).unwrap();
        let expect = |rt: &mut Box<dyn Runtime>, inputs: &[NamedTensor]| rt.run(inputs).unwrap();
        let first = rt.run(&ids(2, 1)).unwrap();
        assert_eq!(first, expect(&mut reference, &ids(2, 1)), "{what}");
        let mut outputs = first.clone();
        let address = data_address(&outputs[0]);
        for seed in [2, 3] {
            rt.run_into(&ids(2, seed), &mut outputs).unwrap();
            assert_eq!(
                outputs,
                expect(&mut reference, &ids(2, seed)),
                "{what}, seed {seed}"
            );
            assert_eq!(
                data_address(&outputs[0]),
                address,
                "{what}: the logits were not written into the array given"
            );
        }
        // Another batch: new arrays of the new shape, then written in place again.
        rt.run_into(&ids(3, 4), &mut outputs).unwrap();
        assert_eq!(outputs[0].value.shape(), [3, 12, 50], "{what}");
        assert_eq!(outputs, expect(&mut reference, &ids(3, 4)), "{what}");
        let address = data_address(&outputs[0]);
        rt.run_into(&ids(3, 5), &mut outputs).unwrap();
        assert_eq!(outputs, expect(&mut reference, &ids(3, 5)), "{what}");
        assert_eq!(data_address(&outputs[0]), address, "{what}");
        // Arrays of another run's shapes are replaced, not written past.
        let mut small = first.clone();
        rt.run_into(&ids(3, 6), &mut small).unwrap();
        assert_eq!(small, expect(&mut reference, &ids(3, 6)), "{what}");
        // A plain run after runs of the same shapes.
        assert_eq!(
            rt.run(&ids(3, 7)).unwrap(),
            expect(&mut reference, &ids(3, 7)),
            "{what}"
        );
        // No device to keep the outputs on.
        assert!(rt.on_device(&ids(2, 1)).unwrap().is_none(), "{what}");
    }
}

/// A tensor declaration of element type `elem_type` with the given dimensions (a name is
/// symbolic).
fn declared(name: &str, elem_type: i32, dims: &[&str]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d.parse::<i64>() {
                                Ok(n) => DimValue::DimValue(n),
                                Err(_) => DimValue::DimParam(d.to_string()),
                            }),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The positions [1, m] of `x`'s m non-zero values: `y = NonZero(x)`.
fn nonzero_positions(x: &[f32]) -> ArrayD<i64> {
    let at: Vec<i64> = (0..x.len() as i64)
        .filter(|&i| x[i as usize] != 0.0)
        .collect();
    ArrayD::from_shape_vec(IxDyn(&[1, at.len()]), at).unwrap()
}

#[test]
fn an_output_whose_shape_follows_the_input_values_is_not_forced_into_the_last_shape() {
    // y = NonZero(x): inputs of one shape give outputs of as many columns as non-zeros.
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(13),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![NodeProto {
                op_type: Some("NonZero".into()),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![declared("x", 1, &["n"])],
            output: vec![declared("y", 7, &["1", "m"])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nonzero.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    let x = |v: &[f32]| {
        vec![NamedTensor {
            name: "x".into(),
            value: TensorValue::F32(ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.to_vec()).unwrap()),
        }]
    };
    for kind in CPU_RUNTIMES {
        let what = kind.name();
        let mut rt = runtime::open(kind, &path, &options()).unwrap();
        let mut outputs = rt.run(&x(&[1.0, 0.0, 1.0, 1.0])).unwrap();
        assert_eq!(
            outputs[0].value,
            TensorValue::I64(nonzero_positions(&[1.0, 0.0, 1.0, 1.0])),
            "{what}"
        );
        for v in [
            [1.0, 0.0, 0.0, 1.0],
            [1.0, 2.0, 3.0, 4.0],
            [0.0, 0.0, 0.0, 5.0],
        ] {
            rt.run_into(&x(&v), &mut outputs).unwrap();
            assert_eq!(
                outputs[0].value,
                TensorValue::I64(nonzero_positions(&v)),
                "{what}, x = {v:?}"
            );
        }
    }
}
