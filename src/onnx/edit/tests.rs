//! Unit tests of `edit` (in their own file: the module itself stays under 600 lines).

use super::*;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Dim, ElemType};
use crate::onnx::reader::{declared_inputs, declared_outputs, metadata_value};
use crate::onnx::writer::{encode_model_to_vec, ModelInfo};
use prost::Message;

/// `y = x + x` read back from its bytes.
fn read_model() -> onnx::ModelProto {
    let mut g = GraphBuilder::new(17).unwrap();
    let x = g
        .input(
            "x",
            ElemType::F32,
            vec![Dim::Symbol("batch".into()), Dim::Fixed(4)],
        )
        .unwrap();
    let sum = g.add("sum", &x, &x).unwrap();
    let y = g.rename(&sum, "y").unwrap();
    let bytes = encode_model_to_vec(&g.finish("g", vec![y]), &ModelInfo::default()).unwrap();
    onnx::ModelProto::decode(bytes.as_slice()).unwrap()
}

#[test]
fn a_read_graph_is_wrapped_between_added_nodes() {
    let mut m = read_model();
    let mut e = ModelEdit::new(&mut m).unwrap();
    assert!(!e.has_subgraphs());
    assert!(e.is_computed("y") && !e.is_computed("x"));
    assert!(e.value_names().contains("x") && !e.value_names().contains("k"));
    e.redirect_reads("x", "x_inner");
    e.rename_computed("y", "y_inner");
    e.add_i64_initializer("k", &[0, 2]);
    e.wrap_nodes(
        &[slice_node("cut", "x", "k", "k", "k", "x_inner")],
        &[concat_node("join", &["y_inner", "y_inner"], 1, "y")],
    );
    e.set_input_dim("x", 1, "n");
    e.set_output_dim("y", 0, "b");
    e.add_metadata("key", "value");
    let g = m.graph.as_ref().unwrap();
    let nodes: Vec<(&str, &str, Vec<&str>, Vec<&str>)> = g
        .node
        .iter()
        .map(|n| {
            (
                n.name(),
                n.op_type(),
                n.input.iter().map(String::as_str).collect(),
                n.output.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        vec![
            ("cut", "Slice", vec!["x", "k", "k", "k"], vec!["x_inner"]),
            ("sum", "Add", vec!["x_inner", "x_inner"], vec!["y_inner"]),
            ("join", "Concat", vec!["y_inner", "y_inner"], vec!["y"]),
        ]
    );
    assert_eq!(g.node[2].attribute[0].i, Some(1));
    assert_eq!(g.node[0].domain, None);
    let k = &g.initializer[0];
    assert_eq!(
        (k.dims.as_slice(), k.int64_data.as_slice()),
        (&[2][..], &[0, 2][..])
    );
    assert_eq!(k.data_type, Some(DataType::Int64 as i32));
    assert_eq!(declared_inputs(&m)[0].shape[1], Dim::Symbol("n".into()));
    assert_eq!(declared_outputs(&m)[0].shape[0], Dim::Symbol("b".into()));
    assert_eq!(metadata_value(&m, "key"), Some("value"));
}

#[test]
fn external_data_is_relocated_and_a_model_without_graph_is_not_opened() {
    let mut m = read_model();
    let entry = |k: &str, v: &str| onnx::StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    };
    m.graph
        .as_mut()
        .unwrap()
        .initializer
        .push(onnx::TensorProto {
            external_data: vec![entry("location", "a.data"), entry("offset", "0")],
            ..Default::default()
        });
    relocate_external_data(&mut m, "b.data");
    let t = &m.graph.as_ref().unwrap().initializer[0];
    assert_eq!(t.external_data[0].value(), "b.data");
    assert_eq!(t.external_data[1].value(), "0");
    assert!(ModelEdit::new(&mut onnx::ModelProto::default()).is_none());
}
