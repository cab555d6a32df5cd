//! Editing a decoded model in place, to wrap a graph read back from a file rather than built
//! here: nodes in the builder's [`Node`] form placed before and after the graph's own nodes,
//! i64 initializers, renames of values inside the graph (its inputs and outputs keep their
//! names), added outputs, the declared shapes of its interface, external data locations
//! and metadata.
//!
//! The operator helpers ([`slice_node`], [`concat_node`], [`shape_node`], [`gather_node`],
//! [`reshape_node`], [`add_node`]) document what they emit like those
//! of the op files (`ops/`), but take value names instead of shaped values: a read graph
//! declares shapes only at its interface. Nodes become `NodeProto`s through the writer's
//! conversion.

use std::collections::HashSet;

use crate::onnx::dtype::DataType;
use crate::onnx::graph::{Attr, Dim, Node};
use crate::onnx::proto as onnx;
use crate::onnx::writer::node_proto;

/// A decoded model's main graph and metadata, open for editing.
pub struct ModelEdit<'m> {
    graph: &'m mut onnx::GraphProto,
    metadata: &'m mut Vec<onnx::StringStringEntryProto>,
}

impl<'m> ModelEdit<'m> {
    /// Opens `model` for editing; `None` when it has no graph.
    pub fn new(model: &'m mut onnx::ModelProto) -> Option<Self> {
        Some(ModelEdit {
            graph: model.graph.as_mut()?,
            metadata: &mut model.metadata_props,
        })
    }

    /// Every value name the graph reads or defines: node inputs and outputs, initializers
    /// and graph inputs (the names a value added by an edit must avoid).
    pub fn value_names(&self) -> HashSet<String> {
        value_names(self.graph)
    }

    /// True when a node carries a subgraph (`If`, `Loop`, `Scan`), whose values the renames
    /// here do not reach.
    pub fn has_subgraphs(&self) -> bool {
        self.graph.node.iter().any(|n| {
            n.attribute
                .iter()
                .any(|a| a.g.is_some() || !a.graphs.is_empty())
        })
    }

    /// True when a node of the graph computes `value`.
    pub fn is_computed(&self, value: &str) -> bool {
        self.graph
            .node
            .iter()
            .any(|n| n.output.iter().any(|o| o == value))
    }

    /// Makes every node that reads `from` read `to` instead; a graph input `from` keeps its
    /// name (a node added before the graph then computes `to` from it).
    pub fn redirect_reads(&mut self, from: &str, to: &str) {
        for i in self.graph.node.iter_mut().flat_map(|n| n.input.iter_mut()) {
            if i == from {
                *i = to.to_string();
            }
        }
    }

    /// Renames the computed value `from` to `to` inside the graph: in the node that computes
    /// it, the nodes that read it and its `value_info`. A graph output `from` keeps its
    /// name (a node added after the graph then computes it from `to`).
    pub fn rename_computed(&mut self, from: &str, to: &str) {
        for n in &mut self.graph.node {
            for v in n.input.iter_mut().chain(n.output.iter_mut()) {
                if v == from {
                    *v = to.to_string();
                }
            }
        }
        for v in &mut self.graph.value_info {
            if v.name() == from {
                v.name = Some(to.to_string());
            }
        }
    }

    /// Declares axis `axis` of graph input `name` as the symbol `symbol` (nothing happens
    /// when the input has no such declared axis).
    pub fn set_input_dim(&mut self, name: &str, axis: usize, symbol: &str) {
        for v in self.graph.input.iter_mut().filter(|v| v.name() == name) {
            set_dim_param(v, axis, symbol);
        }
    }

    /// Declares axis `axis` of graph output `name` as the symbol `symbol` (nothing happens
    /// when the output has no such declared axis).
    pub fn set_output_dim(&mut self, name: &str, axis: usize, symbol: &str) {
        for v in self.graph.output.iter_mut().filter(|v| v.name() == name) {
            set_dim_param(v, axis, symbol);
        }
    }

    /// Declares graph input `name` with the shape `shape` instead of its own (nothing
    /// happens when there is no such input; its element type stays).
    pub fn set_input_shape(&mut self, name: &str, shape: &[Dim]) {
        for v in self.graph.input.iter_mut().filter(|v| v.name() == name) {
            if let Some(onnx::type_proto::Value::TensorType(t)) =
                v.r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                t.shape = Some(shape_proto(shape));
            }
        }
    }

    /// Declares the graph output `name`: a tensor of element type `elem` and shape `shape`
    /// (a node added by the edit must compute it).
    pub fn add_output(&mut self, name: &str, elem: DataType, shape: &[Dim]) {
        self.graph.output.push(tensor_value_info(name, elem, shape));
    }

    /// Declares the graph output `name` with the declared type and shape of the graph input
    /// `like` (a node added by the edit must compute it); false when there is no such input.
    pub fn add_output_like(&mut self, name: &str, like: &str) -> bool {
        let Some(input) = self.graph.input.iter().find(|v| v.name() == like) else {
            return false;
        };
        let output = onnx::ValueInfoProto {
            name: Some(name.to_string()),
            r#type: input.r#type.clone(),
            ..Default::default()
        };
        self.graph.output.push(output);
        true
    }

    /// Adds the i64 vector `values` as the initializer `name` (stored in `int64_data`).
    pub fn add_i64_initializer(&mut self, name: &str, values: &[i64]) {
        self.graph.initializer.push(onnx::TensorProto {
            name: Some(name.to_string()),
            data_type: Some(DataType::Int64 as i32),
            dims: vec![i64::try_from(values.len()).unwrap_or(i64::MAX)],
            int64_data: values.to_vec(),
            ..Default::default()
        });
    }

    /// Places `before` ahead of the graph's own nodes and `after` behind them, in order
    /// (the caller keeps the node list topologically sorted: `before` may read only graph
    /// inputs and initializers).
    pub fn wrap_nodes(&mut self, before: &[Node], after: &[Node]) {
        let own = std::mem::take(&mut self.graph.node);
        self.graph.node = before
            .iter()
            .map(node_proto)
            .chain(own)
            .chain(after.iter().map(node_proto))
            .collect();
    }

    /// Places `nodes` immediately before the node that computes `value` (so they may read
    /// what that node reads); false when no node computes it.
    pub fn insert_before(&mut self, value: &str, nodes: &[Node]) -> bool {
        self.insert_at(value, nodes, 0)
    }

    /// Places `nodes` immediately after the node that computes `value` (so they may read
    /// it); false when no node computes it.
    pub fn insert_after(&mut self, value: &str, nodes: &[Node]) -> bool {
        self.insert_at(value, nodes, 1)
    }

    fn insert_at(&mut self, value: &str, nodes: &[Node], offset: usize) -> bool {
        let Some(at) = self.producer_index(value) else {
            return false;
        };
        let tail = self.graph.node.split_off(at + offset);
        self.graph.node.extend(nodes.iter().map(node_proto));
        self.graph.node.extend(tail);
        true
    }

    fn producer_index(&self, value: &str) -> Option<usize> {
        self.graph
            .node
            .iter()
            .position(|n| n.output.iter().any(|o| o == value))
    }

    /// The node that computes `value`, if any.
    pub fn producer(&self, value: &str) -> Option<&onnx::NodeProto> {
        self.producer_index(value).map(|i| &self.graph.node[i])
    }

    /// The nodes that read `value`.
    pub fn readers(&self, value: &str) -> Vec<&onnx::NodeProto> {
        self.graph
            .node
            .iter()
            .filter(|n| n.input.iter().any(|i| i == value))
            .collect()
    }

    /// Renames the output `from` of the node that computes it to `to`, and nothing else:
    /// the nodes that read `from` keep reading `from` (a node added after it must compute
    /// `from` again, e.g. from `to`).
    pub fn rename_producer_output(&mut self, from: &str, to: &str) {
        if let Some(i) = self.producer_index(from) {
            for o in self.graph.node[i].output.iter_mut().filter(|o| *o == from) {
                *o = to.to_string();
            }
        }
    }

    /// Replaces input `index` of the node that computes `value` by `input` (nothing happens
    /// when no node computes `value` or it has fewer inputs).
    pub fn set_producer_input(&mut self, value: &str, index: usize, input: &str) {
        if let Some(i) = self.producer_index(value) {
            if let Some(slot) = self.graph.node[i].input.get_mut(index) {
                *slot = input.to_string();
            }
        }
    }

    /// Sets the integer attribute `attribute` of the node that computes `value` (added when
    /// the node has none).
    pub fn set_producer_int_attribute(&mut self, value: &str, attribute: &str, to: i64) {
        let Some(i) = self.producer_index(value) else {
            return;
        };
        let n = &mut self.graph.node[i];
        match n.attribute.iter_mut().find(|a| a.name() == attribute) {
            Some(a) => a.i = Some(to),
            None => n.attribute.push(onnx::AttributeProto {
                name: Some(attribute.to_string()),
                r#type: Some(onnx::attribute_proto::AttributeType::Int as i32),
                i: Some(to),
                ..Default::default()
            }),
        }
    }

    /// Renames the graph input `from` to `to`, in its declaration and in every node that
    /// reads it.
    pub fn rename_input(&mut self, from: &str, to: &str) {
        for v in self.graph.input.iter_mut().filter(|v| v.name() == from) {
            v.name = Some(to.to_string());
        }
        self.redirect_reads(from, to);
    }

    /// Declares the graph input `name`: a tensor of element type `elem` and shape `shape`.
    pub fn add_input(&mut self, name: &str, elem: DataType, shape: &[Dim]) {
        self.graph.input.push(tensor_value_info(name, elem, shape));
    }

    /// Removes the graph input `name` from the interface (a node added by the edit must
    /// then compute the value, or no node may read it).
    pub fn remove_input(&mut self, name: &str) {
        self.graph.input.retain(|v| v.name() != name);
    }

    /// Removes the graph output `name` from the interface (the value stays computed).
    pub fn remove_output(&mut self, name: &str) {
        self.graph.output.retain(|v| v.name() != name);
    }

    /// Declares graph output `name` with the shape `shape` instead of its own (nothing
    /// happens when there is no such output; its element type stays).
    pub fn set_output_shape(&mut self, name: &str, shape: &[Dim]) {
        for v in self.graph.output.iter_mut().filter(|v| v.name() == name) {
            if let Some(onnx::type_proto::Value::TensorType(t)) =
                v.r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                t.shape = Some(shape_proto(shape));
            }
        }
    }

    /// Adds the i64 scalar `value` as the initializer `name` (dims `[]`).
    pub fn add_i64_scalar_initializer(&mut self, name: &str, value: i64) {
        self.graph.initializer.push(onnx::TensorProto {
            name: Some(name.to_string()),
            data_type: Some(DataType::Int64 as i32),
            dims: vec![],
            int64_data: vec![value],
            ..Default::default()
        });
    }

    /// Adds the scalar `value` of the float type `elem` (float32 or float16) as the
    /// initializer `name` (dims `[]`); false for another type.
    pub fn add_float_scalar_initializer(&mut self, name: &str, elem: DataType, value: f32) -> bool {
        let mut t = onnx::TensorProto {
            name: Some(name.to_string()),
            data_type: Some(elem as i32),
            dims: vec![],
            ..Default::default()
        };
        match elem {
            DataType::Float => t.float_data = vec![value],
            // float16 values are stored as their bit patterns in int32_data.
            DataType::Float16 => {
                t.int32_data = vec![i32::from(half::f16::from_f32(value).to_bits())]
            }
            _ => return false,
        }
        self.graph.initializer.push(t);
        true
    }

    /// Removes the metadata properties `key`.
    pub fn remove_metadata(&mut self, key: &str) {
        self.metadata.retain(|p| p.key() != key);
    }

    /// Appends the metadata property `key` = `value`.
    pub fn add_metadata(&mut self, key: &str, value: &str) {
        self.metadata.push(onnx::StringStringEntryProto {
            key: Some(key.to_string()),
            value: Some(value.to_string()),
        });
    }
}

fn tensor_value_info(name: &str, elem: DataType, shape: &[Dim]) -> onnx::ValueInfoProto {
    onnx::ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(onnx::TypeProto {
            value: Some(onnx::type_proto::Value::TensorType(
                onnx::type_proto::Tensor {
                    elem_type: Some(elem as i32),
                    shape: Some(shape_proto(shape)),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn shape_proto(shape: &[Dim]) -> onnx::TensorShapeProto {
    use onnx::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
    let dim = shape
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => DimValue::DimValue(i64::try_from(*n).unwrap_or(i64::MAX)),
                Dim::Symbol(s) => DimValue::DimParam(s.clone()),
            }),
            ..Default::default()
        })
        .collect();
    onnx::TensorShapeProto { dim }
}

fn set_dim_param(v: &mut onnx::ValueInfoProto, axis: usize, symbol: &str) {
    use onnx::tensor_shape_proto::dimension::Value as DimValue;
    if let Some(onnx::type_proto::Value::TensorType(t)) =
        v.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        if let Some(d) = t.shape.as_mut().and_then(|s| s.dim.get_mut(axis)) {
            d.value = Some(DimValue::DimParam(symbol.to_string()));
        }
    }
}

/// The node `name` computing `output` as `data[starts:ends]` on `axes`, each of the three
/// an i64 vector value (one entry per sliced axis).
///
/// [Slice](https://onnx.ai/onnx/operators/onnx__Slice.html): versions 1, 10 (`starts`/`ends`/`axes` become inputs), 11, 13; the input form is valid from 10 on.
pub fn slice_node(
    name: &str,
    data: &str,
    starts: &str,
    ends: &str,
    axes: &str,
    output: &str,
) -> Node {
    node(name, "Slice", &[data, starts, ends, axes], vec![], output)
}

/// The node `name` computing `output` as the concatenation of `parts` along `axis`.
///
/// [Concat](https://onnx.ai/onnx/operators/onnx__Concat.html): versions 1, 4, 11 (negative axis), 13; the same form in every opset here.
pub fn concat_node(name: &str, parts: &[&str], axis: i64, output: &str) -> Node {
    let attributes = vec![("axis".to_string(), Attr::Int(axis))];
    node(name, "Concat", parts, attributes, output)
}

/// The node `name` computing `output`, the shape of `data` as an i64 vector.
///
/// [Shape](https://onnx.ai/onnx/operators/onnx__Shape.html): versions 1, 13 (types), 15 (`start` / `end` attributes), 19, 21, 23; the form without attributes in every opset here.
pub fn shape_node(name: &str, data: &str, output: &str) -> Node {
    node(name, "Shape", &[data], vec![], output)
}

/// The node `name` computing `output` as the entries `indices` of `data` along axis 0.
///
/// [Gather](https://onnx.ai/onnx/operators/onnx__Gather.html): versions 1, 11 (negative indices), 13; the same form in every opset here.
pub fn gather_node(name: &str, data: &str, indices: &str, output: &str) -> Node {
    let attributes = vec![("axis".to_string(), Attr::Int(0))];
    node(name, "Gather", &[data, indices], attributes, output)
}

/// The node `name` computing `output` as `data` with the shape `shape` (an i64 vector
/// value; −1 takes the rest).
///
/// [Reshape](https://onnx.ai/onnx/operators/onnx__Reshape.html): versions 1, 5 (`shape` becomes an input), 13, 14 (`allowzero`), 19, 21, 23; the input form without `allowzero` from 5 on.
pub fn reshape_node(name: &str, data: &str, shape: &str, output: &str) -> Node {
    node(name, "Reshape", &[data, shape], vec![], output)
}

/// Points every initializer of `model`'s graph with external data at the file `location`
/// beside the model (a data file copied under another name: any ONNX file's, this tool's
/// or not).
pub fn relocate_external_data(model: &mut onnx::ModelProto, location: &str) {
    let Some(graph) = model.graph.as_mut() else {
        return;
    };
    for t in &mut graph.initializer {
        for entry in &mut t.external_data {
            if entry.key() == "location" {
                entry.value = Some(location.to_string());
            }
        }
    }
}

/// Every value name `g` reads or defines: node inputs and outputs, initializers and graph
/// inputs (the names a value added by an edit must avoid).
fn value_names(g: &onnx::GraphProto) -> HashSet<String> {
    g.node
        .iter()
        .flat_map(|n| n.input.iter().chain(&n.output).cloned())
        .chain(g.initializer.iter().map(|t| t.name().to_string()))
        .chain(g.input.iter().map(|v| v.name().to_string()))
        .collect()
}

/// The node `name` computing `output` = `a` + `b` (numpy broadcasting).
///
/// [Add](https://onnx.ai/onnx/operators/onnx__Add.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
pub fn add_node(name: &str, a: &str, b: &str, output: &str) -> Node {
    node(name, "Add", &[a, b], vec![], output)
}

/// The node `name` computing `output` as the entries `indices` of `data` along `axis`.
///
/// [Gather](https://onnx.ai/onnx/operators/onnx__Gather.html): versions 1, 11 (negative indices), 13; the same form in every opset here.
pub fn gather_axis_node(name: &str, data: &str, indices: &str, axis: i64, output: &str) -> Node {
    let attributes = vec![("axis".to_string(), Attr::Int(axis))];
    node(name, "Gather", &[data, indices], attributes, output)
}

/// The node `name` computing `output` = `a` · `b` (numpy broadcasting).
///
/// [Mul](https://onnx.ai/onnx/operators/onnx__Mul.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
pub fn mul_node(name: &str, a: &str, b: &str, output: &str) -> Node {
    node(name, "Mul", &[a, b], vec![], output)
}

/// The node `name` computing `output` = min(`a`, `b`) elementwise (numpy broadcasting).
///
/// [Min](https://onnx.ai/onnx/operators/onnx__Min.html): versions 1, 6, 8 (broadcasting), 12 (integer types), 13; int64 inputs from 12 on.
pub fn min_node(name: &str, a: &str, b: &str, output: &str) -> Node {
    node(name, "Min", &[a, b], vec![], output)
}

/// The node `name` computing `output` = `data` unchanged.
///
/// [Identity](https://onnx.ai/onnx/operators/onnx__Identity.html): versions 1, 13, 14, 16, 19, 21, 23; the same form in every opset here.
pub fn identity_node(name: &str, data: &str, output: &str) -> Node {
    node(name, "Identity", &[data], vec![], output)
}

/// The node `name` computing `output` as `data` with a new axis of size 1 at each of
/// `axes` (an i64 vector value).
///
/// [Unsqueeze](https://onnx.ai/onnx/operators/onnx__Unsqueeze.html): versions 1, 11 (negative axes), 13 (`axes` becomes an input), 21, 23; the input form from 13 on.
pub fn unsqueeze_node(name: &str, data: &str, axes: &str, output: &str) -> Node {
    node(name, "Unsqueeze", &[data, axes], vec![], output)
}

fn node(
    name: &str,
    op_type: &str,
    inputs: &[&str],
    attributes: Vec<(String, Attr)>,
    output: &str,
) -> Node {
    Node {
        name: name.to_string(),
        op_type: op_type.to_string(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: vec![output.to_string()],
        attributes,
        flops: 0,
    }
}

#[cfg(test)]
mod tests;
