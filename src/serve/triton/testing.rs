//! Models for the unit tests of this module: declared inputs and outputs, and nothing else
//! unless a test adds nodes.

use crate::error::Error;
use crate::message::Setting;
use crate::onnx::dtype::DataType;
use crate::onnx::graph::Dim;
use crate::onnx::proto as onnx;
use crate::onnx::reader::DeclaredTensor;

/// Whether `e` is an [`Error::Setting`] naming exactly `settings`, in order: the kind of a
/// refusal, which the tests assert instead of its words.
pub fn names_settings(e: &Error, settings: &[Setting]) -> bool {
    matches!(e, Error::Setting(p) if p.settings().eq(settings.iter().copied()))
}

/// A tensor of element type `elem` and shape `shape` (numbers fixed, anything else a symbol).
pub fn tensor(name: &str, elem: DataType, shape: &[&str]) -> DeclaredTensor {
    DeclaredTensor {
        name: name.into(),
        elem_type: elem as i32,
        shape: shape
            .iter()
            .map(|d| match d.parse::<usize>() {
                Ok(n) => Dim::Fixed(n),
                Err(_) => Dim::Symbol(d.to_string()),
            })
            .collect(),
    }
}

fn value_info(t: &DeclaredTensor) -> onnx::ValueInfoProto {
    use onnx::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
    onnx::ValueInfoProto {
        name: Some(t.name.clone()),
        r#type: Some(onnx::TypeProto {
            value: Some(onnx::type_proto::Value::TensorType(
                onnx::type_proto::Tensor {
                    elem_type: Some(t.elem_type),
                    shape: Some(onnx::TensorShapeProto {
                        dim: t
                            .shape
                            .iter()
                            .map(|d| Dimension {
                                value: Some(match d {
                                    Dim::Fixed(n) => DimValue::DimValue(*n as i64),
                                    Dim::Symbol(s) => DimValue::DimParam(s.clone()),
                                }),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A model with these graph inputs and outputs and no node.
pub fn model(inputs: &[DeclaredTensor], outputs: &[DeclaredTensor]) -> onnx::ModelProto {
    onnx::ModelProto {
        graph: Some(onnx::GraphProto {
            input: inputs.iter().map(value_info).collect(),
            output: outputs.iter().map(value_info).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Token ids in, logits out: `input_ids [batch, 12]` (i64) → `logits [batch, 12, 50]` (f32).
pub fn token_model() -> onnx::ModelProto {
    model(
        &[tensor("input_ids", DataType::Int64, &["batch", "12"])],
        &[tensor("logits", DataType::Float, &["batch", "12", "50"])],
    )
}
