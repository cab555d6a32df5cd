//! [`GraphBuilder`]: builds a [`Graph`] node by node with unique, readable names by place
//! (`blocks.3/sgu/spatial_matmul`), static shape tracking for `value_info` and FLOP counts,
//! parameters as initializers and everything else as `Constant` nodes. It knows nothing of
//! any one model; the operator helpers (`impl GraphBuilder` blocks) are in the op files beside it.
//!
//! A shape or type mismatch between helpers is a bug in the caller, not bad input, and is
//! reported as [`Error::Internal`].

use std::collections::HashSet;

use crate::error::{Error, Result};
use crate::onnx::graph::{
    Attr, ConstData, Dim, ElemType, Graph, Initializer, Node, TensorData, Value,
};

use crate::onnx::forms::OpForms;
pub use crate::onnx::versions::OPSET_RANGE;

/// Builds a [`Graph`] node by node, tracking static shapes.
pub struct GraphBuilder {
    opset: i64,
    forms: OpForms,
    scope: Vec<String>,
    names: HashSet<String>,
    inputs: Vec<Value>,
    value_info: Vec<Value>,
    nodes: Vec<Node>,
    initializers: Vec<Initializer>,
}

impl GraphBuilder {
    /// A new, empty graph targeting `opset` (within [`OPSET_RANGE`]), with the default op
    /// forms (each operator as itself where the opset has it).
    pub fn new(opset: i64) -> Result<Self> {
        Self::with_forms(opset, OpForms::default())
    }

    /// A new, empty graph targeting `opset` that spells operations in `forms`.
    pub fn with_forms(opset: i64, forms: OpForms) -> Result<Self> {
        if !OPSET_RANGE.contains(&opset) {
            return Err(Error::OutOfRange(format!(
                "opset {opset} is not supported (supported: {}..={})",
                OPSET_RANGE.start(),
                OPSET_RANGE.end()
            )));
        }
        Ok(GraphBuilder {
            opset,
            forms,
            scope: Vec::new(),
            names: HashSet::new(),
            inputs: Vec::new(),
            value_info: Vec::new(),
            nodes: Vec::new(),
            initializers: Vec::new(),
        })
    }

    /// The target opset.
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The op forms this graph is built with.
    pub fn forms(&self) -> OpForms {
        self.forms
    }

    /// Appends `name` to the node-name scope; undo with [`GraphBuilder::pop_scope`].
    pub fn push_scope(&mut self, name: &str) {
        self.scope.push(name.to_string());
    }

    /// Removes the innermost node-name scope.
    pub fn pop_scope(&mut self) {
        self.scope.pop();
    }

    /// Runs `f` with `name` appended to the node-name scope (`blocks.3` then `sgu` gives
    /// nodes named `blocks.3/sgu/...`).
    pub fn scoped<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.scope.push(name.to_string());
        let out = f(self);
        self.scope.pop();
        out
    }

    fn unique(&mut self, base: String) -> String {
        if self.names.insert(base.clone()) {
            return base;
        }
        (1..)
            .map(|k| format!("{base}_{k}"))
            .find(|candidate| self.names.insert(candidate.clone()))
            .expect("an unused name exists")
    }

    fn scoped_name(&self, local: &str) -> String {
        if self.scope.is_empty() {
            local.to_string()
        } else {
            format!("{}/{}", self.scope.join("/"), local)
        }
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem: ElemType, shape: Vec<Dim>) -> Result<Value> {
        let name = self.claim_exact(name)?;
        let v = Value { name, elem, shape };
        self.inputs.push(v.clone());
        Ok(v)
    }

    fn claim_exact(&mut self, name: &str) -> Result<String> {
        if self.names.insert(name.to_string()) {
            Ok(name.to_string())
        } else {
            Err(Error::Internal(format!("duplicate value name {name}")))
        }
    }

    /// Adds an f32 initializer named exactly `name` (parameter names are part of the
    /// weight layout, so they are never renamed).
    pub fn weight(&mut self, name: &str, dims: &[usize], data: TensorData) -> Result<Value> {
        self.weight_as(name, dims, ElemType::F32, data)
    }

    /// Adds an initializer stored as `elem` (F32, F16, I8 for quantized weights or U8 for
    /// packed ones; values are given as f32, integers in [−127, 127] for I8 and in [0, 255]
    /// for U8).
    pub fn weight_as(
        &mut self,
        name: &str,
        dims: &[usize],
        elem: ElemType,
        data: TensorData,
    ) -> Result<Value> {
        if !elem.is_float() && !matches!(elem, ElemType::I8 | ElemType::U8) {
            return Err(Error::Internal(format!(
                "{name}: weights are f32, f16, i8 or u8"
            )));
        }
        if let TensorData::F32(v) = &data {
            let n: usize = dims.iter().product();
            if v.len() != n {
                return Err(Error::Internal(format!(
                    "{name}: {} values for shape {dims:?}",
                    v.len()
                )));
            }
        }
        let name = self.claim_exact(name)?;
        self.initializers.push(Initializer {
            name: name.clone(),
            elem,
            dims: dims.to_vec(),
            data,
        });
        Ok(Value {
            name,
            elem,
            shape: dims.iter().map(|&d| Dim::Fixed(d)).collect(),
        })
    }

    fn constant(&mut self, local: &str, dims: &[usize], data: ConstData) -> Result<Value> {
        let (len, elem) = match &data {
            ConstData::F32(v) => (v.len(), ElemType::F32),
            ConstData::F16(v) => (v.len(), ElemType::F16),
            ConstData::I64(v) => (v.len(), ElemType::I64),
        };
        if len != dims.iter().product::<usize>() {
            return Err(Error::Internal(format!(
                "{local}: {len} values for shape {dims:?}"
            )));
        }
        let shape = dims.iter().map(|&d| Dim::Fixed(d)).collect();
        let attr = Attr::Tensor {
            dims: dims.to_vec(),
            data,
        };
        Ok(self.single(
            local,
            "Constant",
            &[],
            vec![("value".to_string(), attr)],
            (elem, shape),
            0,
        ))
    }

    /// An i64 `Constant` node (index table or shape), named by the current scope.
    pub fn const_i64(&mut self, local: &str, dims: &[usize], values: Vec<i64>) -> Result<Value> {
        self.constant(local, dims, ConstData::I64(values))
    }

    /// An f32 `Constant` node (scalars of the GELU formula, masks), named by the current scope.
    pub fn const_f32(&mut self, local: &str, dims: &[usize], values: Vec<f32>) -> Result<Value> {
        self.constant(local, dims, ConstData::F32(values))
    }

    /// A float `Constant` node of type `elem` (F32 or F16), values given as f32.
    pub fn const_float(
        &mut self,
        local: &str,
        dims: &[usize],
        values: Vec<f32>,
        elem: ElemType,
    ) -> Result<Value> {
        match elem {
            ElemType::F16 => self.constant(local, dims, ConstData::F16(values)),
            _ => self.constant(local, dims, ConstData::F32(values)),
        }
    }

    pub(crate) fn node(
        &mut self,
        local: &str,
        op_type: &str,
        inputs: &[&Value],
        attributes: Vec<(String, Attr)>,
        outputs: Vec<(ElemType, Vec<Dim>)>,
        flops: u64,
    ) -> Vec<Value> {
        let name = self.unique(self.scoped_name(local));
        let out_values: Vec<Value> = outputs
            .into_iter()
            .enumerate()
            .map(|(k, (elem, shape))| {
                let vname = if k == 0 {
                    name.clone()
                } else {
                    self.unique(format!("{name}:{k}"))
                };
                Value {
                    name: vname,
                    elem,
                    shape,
                }
            })
            .collect();
        self.value_info.extend(out_values.iter().cloned());
        self.nodes.push(Node {
            name,
            op_type: op_type.to_string(),
            inputs: inputs.iter().map(|v| v.name.clone()).collect(),
            outputs: out_values.iter().map(|v| v.name.clone()).collect(),
            attributes,
            flops,
        });
        out_values
    }

    /// [`Self::node`] with the optional outputs at `skipped` left unnamed (not asked
    /// for): the returned values are the named ones, in order.
    pub(crate) fn node_skipping_outputs(
        &mut self,
        local: &str,
        op_type: &str,
        inputs: &[&Value],
        attributes: Vec<(String, Attr)>,
        outputs: Vec<(ElemType, Vec<Dim>)>,
        skipped: &[usize],
    ) -> Vec<Value> {
        let values = self.node(local, op_type, inputs, attributes, outputs, 0);
        let node = self.nodes.last_mut().expect("the node just added");
        let mut kept = Vec::new();
        for (k, v) in values.into_iter().enumerate() {
            if skipped.contains(&k) {
                node.outputs[k] = String::new();
                self.value_info.retain(|i| i.name != v.name);
            } else {
                kept.push(v);
            }
        }
        kept
    }

    pub(crate) fn single(
        &mut self,
        local: &str,
        op_type: &str,
        inputs: &[&Value],
        attributes: Vec<(String, Attr)>,
        output: (ElemType, Vec<Dim>),
        flops: u64,
    ) -> Value {
        self.node(local, op_type, inputs, attributes, vec![output], flops)
            .pop()
            .expect("one output")
    }

    /// Renames the value `v` (which must be produced by a node) to `name`, e.g. to expose
    /// it as the graph output `logits`.
    pub fn rename(&mut self, v: &Value, name: &str) -> Result<Value> {
        let new = self.claim_exact(name)?;
        for node in &mut self.nodes {
            for o in node.outputs.iter_mut().chain(node.inputs.iter_mut()) {
                if *o == v.name {
                    *o = new.clone();
                }
            }
        }
        for info in &mut self.value_info {
            if info.name == v.name {
                info.name = new.clone();
            }
        }
        Ok(Value {
            name: new,
            ..v.clone()
        })
    }

    /// Finishes the graph with the given outputs.
    pub fn finish(self, name: &str, outputs: Vec<Value>) -> Graph {
        let output_names: HashSet<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
        let value_info = self
            .value_info
            .into_iter()
            .filter(|v| !output_names.contains(v.name.as_str()))
            .collect();
        Graph {
            name: name.to_string(),
            opset: self.opset,
            inputs: self.inputs,
            outputs,
            value_info,
            nodes: self.nodes,
            initializers: self.initializers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_that_disagree_on_shapes_are_internal_errors() {
        let mut g = GraphBuilder::new(17).unwrap();
        let a = g
            .input("a", ElemType::F32, vec![Dim::Fixed(2), Dim::Fixed(3)])
            .unwrap();
        let b = g
            .input("b", ElemType::F32, vec![Dim::Fixed(4), Dim::Fixed(5)])
            .unwrap();
        let err = g.matmul("mm", &a, &b).unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "internal error: shape mismatch in MatMul: [2, 3] x [4, 5]"
        );
        assert!(matches!(
            g.input("a", ElemType::F32, vec![]),
            Err(Error::Internal(_))
        ));
    }

    #[test]
    fn names_are_scoped_and_unique_and_opsets_are_checked() {
        let mut g = GraphBuilder::new(17).unwrap();
        let x = g.input("x", ElemType::F32, vec![Dim::Fixed(2)]).unwrap();
        let y = g.scoped("blocks.0", |g| g.add("residual", &x, &x)).unwrap();
        let z = g.scoped("blocks.0", |g| g.add("residual", &y, &x)).unwrap();
        assert_eq!(
            (y.name.as_str(), z.name.as_str()),
            ("blocks.0/residual", "blocks.0/residual_1")
        );
        let out = g.rename(&z, "logits").unwrap();
        let graph = g.finish("g", vec![out]);
        assert_eq!(graph.nodes[1].outputs, vec!["logits".to_string()]);
        assert!(graph.value_info.iter().all(|v| v.name != "logits"));
        assert!(matches!(GraphBuilder::new(12), Err(Error::OutOfRange(_))));
        assert!(matches!(GraphBuilder::new(25), Err(Error::OutOfRange(_))));
    }
}
