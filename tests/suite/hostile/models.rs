//! Broken and hostile ONNX files given to `inspect` and `validate`: not protobuf, truncated,
//! structurally empty, absurd input shapes, external data that escapes the model's
//! directory or lies about its size, graphs the runtimes reject.

use std::path::{Path, PathBuf};

use gmlp_onnx::onnx::proto::{
    self as onnx, tensor_proto::DataLocation, tensor_shape_proto::dimension::Value as DimValue,
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

use super::{assert_refusal, assert_refused, file, run_limited, s, HANG_LIMIT};

/// A float tensor value declaration with fixed `dims`.
fn value(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| onnx::tensor_shape_proto::Dimension {
                            value: Some(DimValue::DimValue(d)),
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

/// `y = Identity(x)` (or `op`), opset 17, with the given initializers.
fn model(op: &str, x: ValueInfoProto, initializer: Vec<TensorProto>) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![NodeProto {
                op_type: Some(op.into()),
                input: vec![x.name().to_string()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![x],
            output: vec![value("y", &[])],
            initializer,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A float initializer `w` of `dims` stored in `location` at `offset`/`length`.
fn external(dims: &[i64], location: &str, offset: u64, length: u64) -> TensorProto {
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v),
    };
    TensorProto {
        name: Some("w".into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        data_location: Some(DataLocation::External as i32),
        external_data: vec![
            entry("location", location.into()),
            entry("offset", offset.to_string()),
            entry("length", length.to_string()),
        ],
        ..Default::default()
    }
}

fn write(dir: &Path, name: &str, m: &ModelProto) -> PathBuf {
    file(dir, name, &m.encode_to_vec())
}

/// Refused by both `inspect` and `validate`.
fn refuse_everywhere(dir: &Path, path: &Path, needle: &str) {
    assert_refused(dir, &["inspect", s(path)], 2, needle);
    assert_refused(dir, &["validate", s(path)], 2, needle);
}

#[test]
fn files_that_are_not_models_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    refuse_everywhere(d, &d.join("missing.onnx"), "missing.onnx: No such file");
    refuse_everywhere(d, d, "Is a directory");
    let empty = file(d, "empty.onnx", b"");
    refuse_everywhere(d, &empty, "the file is empty");
    let garbage = file(d, "garbage.onnx", &[0xff; 64]);
    refuse_everywhere(d, &garbage, "protobuf decoding failed");
    let header_only = ModelProto {
        ir_version: Some(8),
        ..Default::default()
    };
    let no_graph = write(d, "no_graph.onnx", &header_only);
    refuse_everywhere(d, &no_graph, "it has no graph");
    let mut m = model("Identity", value("x", &[2]), vec![]);
    m.graph.as_mut().unwrap().output.clear();
    let no_output = write(d, "no_output.onnx", &m);
    refuse_everywhere(d, &no_output, "its graph has no output");
}

#[test]
fn truncated_models_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = crate::common::small_vision_model(d);
    let bytes = std::fs::read(&good).unwrap();
    std::fs::remove_file(&good).unwrap();
    for keep in [bytes.len() / 2, bytes.len() - 3, 40] {
        let cut = file(d, "cut.onnx", &bytes[..keep]);
        refuse_everywhere(d, &cut, "not a usable ONNX model");
        std::fs::remove_file(cut).unwrap();
    }
}

#[test]
fn deeply_nested_subgraphs_are_refused_not_recursed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut graph = GraphProto::default();
    for _ in 0..200 {
        graph = GraphProto {
            node: vec![NodeProto {
                op_type: Some("If".into()),
                attribute: vec![onnx::AttributeProto {
                    name: Some("then_branch".into()),
                    g: Some(graph),
                    r#type: Some(onnx::attribute_proto::AttributeType::Graph as i32),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            output: vec![value("y", &[])],
            ..Default::default()
        };
    }
    let nested = write(
        d,
        "nested.onnx",
        &ModelProto {
            graph: Some(graph),
            ..Default::default()
        },
    );
    refuse_everywhere(d, &nested, "recursion limit");
}

#[test]
fn absurd_input_shapes_are_refused_before_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let huge = write(
        d,
        "huge.onnx",
        &model("Identity", value("x", &[1 << 20, 1 << 20]), vec![]),
    );
    assert_refused(d, &["validate", s(&huge)], 2, "too large to generate");
    // Many inputs, each under the limit, together far over it.
    let mut m = model("Identity", value("x0", &[1 << 24]), vec![]);
    let g = m.graph.as_mut().unwrap();
    for i in 1..64 {
        g.input.push(value(&format!("x{i}"), &[1 << 24]));
    }
    let many = write(d, "many.onnx", &m);
    assert_refused(d, &["validate", s(&many)], 2, "for all inputs together");
    // --batch and --dim values that multiply past the limit.
    let small = crate::common::small_vision_model(d);
    assert_refused(
        d,
        &["validate", s(&small), "--batch", "1000000000"],
        2,
        "too large to generate",
    );
    // A negative dimension reads as unknown and must be given.
    let negative = write(
        d,
        "negative.onnx",
        &model("Identity", value("x", &[-5]), vec![]),
    );
    assert_refused(
        d,
        &["validate", s(&negative)],
        2,
        "symbolic dimension '?' needs a value",
    );
}

#[test]
fn external_data_outside_the_model_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, location) in [
        ("parent", "../../../../etc/passwd"),
        ("absolute", "/etc/passwd"),
        ("inner_parent", "sub/../../x.data"),
        ("empty", ""),
    ] {
        let m = model(
            "Identity",
            value("x", &[2]),
            vec![external(&[2], location, 0, 8)],
        );
        let path = write(d, &format!("{name}.onnx"), &m);
        refuse_everywhere(d, &path, "outside the model's directory");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn external_data_that_is_missing_or_short_is_refused_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let x = || value("x", &[2]);
    let missing = write(
        d,
        "missing.onnx",
        &model("Identity", x(), vec![external(&[2], "nope.data", 0, 8)]),
    );
    assert_refused(d, &["validate", s(&missing)], 2, "external data file");
    std::fs::remove_file(missing).unwrap();
    file(d, "w.data", &[0u8; 8]);
    for (name, dims, offset, length, needle) in [
        (
            "past_end",
            &[2i64][..],
            4u64,
            8u64,
            "lie past the end of w.data",
        ),
        ("offset_overflow", &[2], u64::MAX - 2, 8, "lie past the end"),
        (
            "wrong_length",
            &[3],
            0,
            8,
            "8 external bytes for dims [3] (12 expected)",
        ),
        (
            "dims_overflow",
            &[i64::MAX, 4],
            0,
            8,
            "have no valid byte size",
        ),
    ] {
        let path = write(
            d,
            &format!("{name}.onnx"),
            &model(
                "Identity",
                x(),
                vec![external(dims, "w.data", offset, length)],
            ),
        );
        assert_refused(d, &["validate", s(&path)], 2, needle);
        std::fs::remove_file(path).unwrap();
    }
    let bad_number = {
        let mut t = external(&[2], "w.data", 0, 8);
        t.external_data[1].value = Some("-1".into());
        write(d, "bad_number.onnx", &model("Identity", x(), vec![t]))
    };
    refuse_everywhere(
        d,
        &bad_number,
        "external data offset \"-1\" is not a byte count",
    );
}

#[test]
fn inspect_survives_overflowing_dims_and_validate_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let t = TensorProto {
        name: Some("w".into()),
        dims: vec![i64::MAX, 4],
        data_type: Some(1),
        raw_data: Some(vec![0; 16]),
        ..Default::default()
    };
    let path = write(
        d,
        "overflow.onnx",
        &model("Identity", value("x", &[2]), vec![t]),
    );
    let o = run_limited(&["inspect", s(&path)], HANG_LIMIT);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run_limited(&["validate", s(&path)], HANG_LIMIT);
    assert_refusal(
        &o,
        2,
        "runtime",
        "validate of an initializer with overflowing dims",
    );
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;

    #[test]
    fn graphs_the_runtimes_reject_give_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let unknown_op = write(
            d,
            "unknown_op.onnx",
            &model("NoSuchOp", value("x", &[2]), vec![]),
        );
        for runtime in ["tract", "ort-cpu"] {
            assert_refused(
                d,
                &["validate", s(&unknown_op), "--runtimes", runtime],
                2,
                &format!("runtime {runtime} failed"),
            );
        }
        let mut m = model("Add", value("x", &[2]), vec![]);
        m.graph.as_mut().unwrap().node[0]
            .input
            .push("undefined".into());
        let dangling = write(d, "dangling.onnx", &m);
        for runtime in ["tract", "ort-cpu"] {
            assert_refused(
                d,
                &["validate", s(&dangling), "--runtimes", runtime],
                2,
                &format!("runtime {runtime} failed"),
            );
        }
    }

    /// A graph that asks for a 4 TB tensor at run time (ConstantOfShape [10^6, 10^6]): both
    /// runtimes must refuse it with an error (tract's allocation failure is a panic inside
    /// tract, which gmlp-onnx contains), not abort the process.
    #[test]
    fn a_graph_that_allocates_terabytes_is_a_runtime_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let shape = TensorProto {
            name: Some("shape".into()),
            dims: vec![2],
            data_type: Some(7),
            int64_data: vec![1_000_000, 1_000_000],
            ..Default::default()
        };
        let mut m = model("Add", value("x", &[1]), vec![shape]);
        let g = m.graph.as_mut().unwrap();
        g.node[0].input.push("big".into());
        g.node.insert(
            0,
            NodeProto {
                op_type: Some("ConstantOfShape".into()),
                input: vec!["shape".into()],
                output: vec!["big".into()],
                ..Default::default()
            },
        );
        let bomb = write(d, "bomb.onnx", &m);
        for runtime in ["tract", "ort-cpu"] {
            assert_refused(
                d,
                &["validate", s(&bomb), "--runtimes", runtime],
                2,
                &format!("runtime {runtime} failed"),
            );
        }
    }
}
