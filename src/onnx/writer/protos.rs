//! The writer's conversion of graph parts (shapes, values, attributes, nodes, tensor
//! headers) into their protobuf messages.

use crate::onnx::graph::{
    contrib_domain, Attr, ConstData, Dim, ElemType, Initializer, Node, Value,
};
use crate::onnx::proto as onnx;

fn tensor_shape(shape: &[Dim]) -> onnx::TensorShapeProto {
    use onnx::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
    onnx::TensorShapeProto {
        dim: shape
            .iter()
            .map(|d| Dimension {
                value: Some(match d {
                    Dim::Fixed(n) => DimValue::DimValue(*n as i64),
                    Dim::Symbol(s) => DimValue::DimParam(s.clone()),
                }),
                denotation: None,
            })
            .collect(),
    }
}

pub(super) fn value_info(v: &Value) -> onnx::ValueInfoProto {
    use onnx::type_proto::{Tensor, Value as TypeValue};
    onnx::ValueInfoProto {
        name: Some(v.name.clone()),
        r#type: Some(onnx::TypeProto {
            value: Some(TypeValue::TensorType(Tensor {
                elem_type: Some(v.elem.onnx_code()),
                shape: Some(tensor_shape(&v.shape)),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn attribute(name: &str, attr: &Attr) -> onnx::AttributeProto {
    use onnx::attribute_proto::AttributeType;
    let mut a = onnx::AttributeProto {
        name: Some(name.to_string()),
        ..Default::default()
    };
    match attr {
        Attr::Int(i) => {
            a.i = Some(*i);
            a.r#type = Some(AttributeType::Int as i32);
        }
        Attr::Float(f) => {
            a.f = Some(*f);
            a.r#type = Some(AttributeType::Float as i32);
        }
        Attr::Ints(v) => {
            a.ints = v.clone();
            a.r#type = Some(AttributeType::Ints as i32);
        }
        Attr::String(text) => {
            a.s = Some(text.clone().into_bytes());
            a.r#type = Some(AttributeType::String as i32);
        }
        Attr::Tensor { dims, data } => {
            let (elem, raw_data): (ElemType, Vec<u8>) = match data {
                ConstData::F32(v) => (
                    ElemType::F32,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                ConstData::F16(v) => (
                    ElemType::F16,
                    v.iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                        .collect(),
                ),
                ConstData::I64(v) => (
                    ElemType::I64,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            };
            a.t = Some(onnx::TensorProto {
                dims: dims.iter().map(|&d| d as i64).collect(),
                data_type: Some(elem.onnx_code()),
                raw_data: Some(raw_data),
                ..Default::default()
            });
            a.r#type = Some(AttributeType::Tensor as i32);
        }
    }
    a
}

/// A node as a `NodeProto`: its `domain` field unset for the default domain (which the
/// writer also spells out as `""`; the model editor (`edit.rs`) leaves it unset), set for a
/// contrib operator.
pub(crate) fn node_proto(n: &Node) -> onnx::NodeProto {
    onnx::NodeProto {
        name: Some(n.name.clone()),
        domain: contrib_domain(&n.op_type).map(|(d, _)| d.to_string()),
        op_type: Some(n.op_type.clone()),
        input: n.inputs.clone(),
        output: n.outputs.clone(),
        attribute: n.attributes.iter().map(|(k, a)| attribute(k, a)).collect(),
        ..Default::default()
    }
}

pub(super) fn tensor_header(init: &Initializer) -> onnx::TensorProto {
    onnx::TensorProto {
        dims: init.dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(init.elem.onnx_code()),
        name: Some(init.name.clone()),
        ..Default::default()
    }
}
