//! A thin typed layer over the ONNX graph: one helper per operator we emit, initializers
//! whose data may be produced lazily at write time, unique readable names, static shape
//! tracking (for output `value_info` and FLOP counts), and nothing about any one model.
//!
//! Operator versions follow the ONNX operator changelog; where an operator changed in the
//! opset range we support (17..=21) the helper emits the form of the target opset:
//! - `ReduceMean`: `axes` attribute up to opset 17, `axes` input from opset 18.
//! - `Gelu`: exists from opset 20; below it [`GraphBuilder::gelu`] emits the exact erf form
//!   `0.5·x·(1 + erf(x/√2))`.
//! - `LayerNormalization`: from opset 17 (our minimum).
//! - `Split`: `split` sizes as an input since opset 13.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Lowest and highest opset the builder can target.
pub const OPSET_RANGE: std::ops::RangeInclusive<i64> = 17..=21;

/// One dimension of a tensor shape: known, or a named symbol such as `batch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A symbolic size (`dim_param`), bound at run time.
    Symbol(String),
}

impl Dim {
    /// The size, taking every symbol as 1 (used for per-example FLOP counts).
    pub fn size_or_one(&self) -> usize {
        match self {
            Dim::Fixed(n) => *n,
            Dim::Symbol(_) => 1,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Symbol(s) => f.write_str(s),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Fixed(n)
    }
}

/// Element types the builder emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    /// IEEE f32 (`TensorProto.FLOAT` = 1).
    F32,
    /// IEEE f16 (`TensorProto.FLOAT16` = 10).
    F16,
    /// i64 (`TensorProto.INT64` = 7).
    I64,
}

impl ElemType {
    /// The `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            ElemType::F32 => 1,
            ElemType::F16 => 10,
            ElemType::I64 => 7,
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::F16 => 2,
            ElemType::F32 => 4,
            ElemType::I64 => 8,
        }
    }
    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        self != ElemType::I64
    }
}

/// A value flowing in the graph, with its element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    /// Unique value name.
    pub name: String,
    /// Element type.
    pub elem: ElemType,
    /// Shape, with symbolic dimensions where the size is bound at run time.
    pub shape: Vec<Dim>,
}

/// Produces the f32 contents of an initializer when the model is written.
pub type F32Producer = Arc<dyn Fn() -> Result<Vec<f32>> + Send + Sync>;

/// The contents of an initializer.
#[derive(Clone)]
pub enum TensorData {
    /// f32 values already in memory.
    F32(Vec<f32>),
    /// f32 values produced at write time, one tensor at a time, so that a model never
    /// needs all of its weights in memory at once.
    LazyF32(F32Producer),
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorData::F32(v) => write!(f, "F32({} values)", v.len()),
            TensorData::LazyF32(_) => f.write_str("LazyF32"),
        }
    }
}

/// A named parameter tensor stored in the model file as an initializer (values produced
/// as f32, stored as `elem`). Constants that are not parameters (index tables, shapes,
/// scalars, masks) are `Constant` nodes.
#[derive(Clone, Debug)]
pub struct Initializer {
    /// Name (also the value name nodes refer to).
    pub name: String,
    /// Stored element type (F32 or F16).
    pub elem: ElemType,
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Contents.
    pub data: TensorData,
}

impl Initializer {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }
    /// True if the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Size of the raw data in bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.elem.size()
    }
}

/// One attribute value of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// `INT`.
    Int(i64),
    /// `FLOAT`.
    Float(f32),
    /// `INTS`.
    Ints(Vec<i64>),
    /// `TENSOR` (the `value` of a `Constant` node).
    Tensor {
        /// Dimensions.
        dims: Vec<usize>,
        /// Contents.
        data: ConstData,
    },
}

/// Contents of a constant tensor embedded in a node.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstData {
    /// f32 values.
    F32(Vec<f32>),
    /// Values stored as f16.
    F16(Vec<f32>),
    /// i64 values.
    I64(Vec<i64>),
}

/// One operator application.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique node name, by place: `blocks.3/sgu/spatial_matmul`.
    pub name: String,
    /// ONNX operator type (default domain).
    pub op_type: String,
    /// Input value names.
    pub inputs: Vec<String>,
    /// Output value names.
    pub outputs: Vec<String>,
    /// Attributes, in emission order.
    pub attributes: Vec<(String, Attr)>,
    /// Multiply-add FLOPs (2 per multiply-add) of this node for one example, where the
    /// operator is a MatMul or a Conv; 0 otherwise.
    pub flops: u64,
}

/// A finished graph: what [`crate::model_io`] writes as an ONNX model.
#[derive(Clone, Debug)]
pub struct Graph {
    /// Graph name.
    pub name: String,
    /// Target opset of the default domain.
    pub opset: i64,
    /// Graph inputs (initializers are not listed here).
    pub inputs: Vec<Value>,
    /// Graph outputs.
    pub outputs: Vec<Value>,
    /// Shapes of every intermediate value (for viewers and shape checks).
    pub value_info: Vec<Value>,
    /// Nodes in topological order.
    pub nodes: Vec<Node>,
    /// Initializers in creation order.
    pub initializers: Vec<Initializer>,
}

impl Graph {
    /// Number of values stored as initializers (f32 or f16): the model's parameter count as stored in
    /// the file (constants such as index tables and scalars are nodes, not parameters).
    pub fn stored_f32_count(&self) -> u64 {
        self.initializers.iter().map(|i| i.len() as u64).sum()
    }

    /// FLOPs for one example of the nodes whose name satisfies `keep`.
    pub fn flops_where(&self, keep: impl Fn(&str) -> bool) -> u64 {
        self.nodes
            .iter()
            .filter(|n| keep(&n.name))
            .map(|n| n.flops)
            .sum()
    }

    /// Total bytes of initializer data.
    pub fn initializer_bytes(&self) -> u64 {
        self.initializers.iter().map(|i| i.byte_len() as u64).sum()
    }
}

/// Builds a [`Graph`] node by node, tracking static shapes.
pub struct GraphBuilder {
    opset: i64,
    scope: Vec<String>,
    names: HashSet<String>,
    inputs: Vec<Value>,
    value_info: Vec<Value>,
    nodes: Vec<Node>,
    initializers: Vec<Initializer>,
}

fn shape_error(op: &str, detail: String) -> Error {
    Error::InvalidConfig(format!("shape mismatch in {op}: {detail}"))
}

fn fmt_shape(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Numpy-style broadcast of two shapes.
fn broadcast(op: &str, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.len()).checked_sub(rank).map(|k| &a[k]);
        let db = (i + b.len()).checked_sub(rank).map(|k| &b[k]);
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Fixed(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Fixed(1))) => x.clone(),
            _ => {
                return Err(shape_error(
                    op,
                    format!("cannot broadcast {} with {}", fmt_shape(a), fmt_shape(b)),
                ))
            }
        };
        out.push(d);
    }
    Ok(out)
}

fn normalize_axis(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(shape_error(
            op,
            format!("axis {axis} out of range for rank {rank}"),
        ))
    }
}

impl GraphBuilder {
    /// A new, empty graph targeting `opset` (within [`OPSET_RANGE`]).
    pub fn new(opset: i64) -> Result<Self> {
        if !OPSET_RANGE.contains(&opset) {
            return Err(Error::InvalidArgument(format!(
                "opset {opset} is not supported (supported: {}..={})",
                OPSET_RANGE.start(),
                OPSET_RANGE.end()
            )));
        }
        Ok(GraphBuilder {
            opset,
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
            Err(Error::InvalidConfig(format!("duplicate value name {name}")))
        }
    }

    /// Adds an f32 initializer named exactly `name` (parameter names are part of the
    /// weight layout, so they are never renamed).
    pub fn weight(&mut self, name: &str, dims: &[usize], data: TensorData) -> Result<Value> {
        self.weight_as(name, dims, ElemType::F32, data)
    }

    /// Adds an initializer stored as `elem` (F32 or F16; values are given as f32).
    pub fn weight_as(
        &mut self,
        name: &str,
        dims: &[usize],
        elem: ElemType,
        data: TensorData,
    ) -> Result<Value> {
        if !elem.is_float() {
            return Err(Error::InvalidConfig(format!(
                "{name}: weights are f32 or f16"
            )));
        }
        if let TensorData::F32(v) = &data {
            let n: usize = dims.iter().product();
            if v.len() != n {
                return Err(Error::BadTensor(format!(
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
            return Err(Error::InvalidConfig(format!(
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

    /// `Cast` to `to`.
    pub fn cast(&mut self, local: &str, x: &Value, to: ElemType) -> Result<Value> {
        Ok(self.single(
            local,
            "Cast",
            &[x],
            vec![("to".to_string(), Attr::Int(i64::from(to.onnx_code())))],
            (to, x.shape.clone()),
            0,
        ))
    }

    fn node(
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

    fn single(
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

    /// `LayerNormalization` (opset 17) over the last axis: `(x − mean) / √(var + eps) · scale + bias`.
    pub fn layer_norm(
        &mut self,
        local: &str,
        x: &Value,
        scale: &Value,
        bias: &Value,
        epsilon: f32,
    ) -> Result<Value> {
        let last = x.shape.last().cloned();
        if last.is_none() || scale.shape.last() != last.as_ref() || bias.shape != scale.shape {
            return Err(shape_error(
                "LayerNormalization",
                format!(
                    "x {} with scale {} and bias {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&scale.shape),
                    fmt_shape(&bias.shape)
                ),
            ));
        }
        let attrs = vec![
            ("axis".to_string(), Attr::Int(-1)),
            ("epsilon".to_string(), Attr::Float(epsilon)),
        ];
        Ok(self.single(
            local,
            "LayerNormalization",
            &[x, scale, bias],
            attrs,
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// `MatMul` with numpy broadcasting of the batch dimensions; records 2·M·K·N FLOPs per
    /// broadcast batch element (symbolic dimensions count as 1).
    pub fn matmul(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        if a.shape.len() < 2 || b.shape.len() < 2 {
            return Err(shape_error("MatMul", "operands must have rank >= 2".into()));
        }
        let (ar, br) = (a.shape.len(), b.shape.len());
        let (m, k) = (&a.shape[ar - 2], &a.shape[ar - 1]);
        let (k2, n) = (&b.shape[br - 2], &b.shape[br - 1]);
        if k != k2 || a.elem != b.elem {
            return Err(shape_error(
                "MatMul",
                format!("{} x {}", fmt_shape(&a.shape), fmt_shape(&b.shape)),
            ));
        }
        let mut shape = broadcast("MatMul", &a.shape[..ar - 2], &b.shape[..br - 2])?;
        let batch: u64 = shape.iter().map(|d| d.size_or_one() as u64).product();
        let flops = 2 * batch * (m.size_or_one() * k.size_or_one() * n.size_or_one()) as u64;
        shape.push(m.clone());
        shape.push(n.clone());
        Ok(self.single(local, "MatMul", &[a, b], vec![], (a.elem, shape), flops))
    }

    fn binary(&mut self, local: &str, op: &str, a: &Value, b: &Value) -> Result<Value> {
        if a.elem != b.elem {
            return Err(shape_error(
                op,
                format!("element types {:?} and {:?} differ", a.elem, b.elem),
            ));
        }
        let shape = broadcast(op, &a.shape, &b.shape)?;
        Ok(self.single(local, op, &[a, b], vec![], (a.elem, shape), 0))
    }

    /// Elementwise `Add` with broadcasting.
    pub fn add(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Add", a, b)
    }

    /// Elementwise `Mul` with broadcasting.
    pub fn mul(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Mul", a, b)
    }

    /// Exact GELU `0.5·x·(1 + erf(x/√2))`: the `Gelu` operator (approximate = "none") from
    /// opset 20, the same formula spelled with `Mul`/`Erf`/`Add` below it.
    pub fn gelu(&mut self, local: &str, x: &Value) -> Result<Value> {
        if self.opset >= 20 {
            return Ok(self.single(local, "Gelu", &[x], vec![], (x.elem, x.shape.clone()), 0));
        }
        let inv_sqrt2 = self.const_float(
            &format!("{local}_inv_sqrt2"),
            &[],
            vec![std::f32::consts::FRAC_1_SQRT_2],
            x.elem,
        )?;
        let one = self.const_float(&format!("{local}_one"), &[], vec![1.0], x.elem)?;
        let half = self.const_float(&format!("{local}_half"), &[], vec![0.5], x.elem)?;
        let scaled = self.mul(&format!("{local}_scale"), x, &inv_sqrt2)?;
        let erf = self.single(
            &format!("{local}_erf"),
            "Erf",
            &[&scaled],
            vec![],
            (x.elem, x.shape.clone()),
            0,
        );
        let one_plus = self.add(&format!("{local}_one_plus"), &erf, &one)?;
        let half_x = self.mul(&format!("{local}_half_x"), x, &half)?;
        self.mul(local, &half_x, &one_plus)
    }

    /// `Split` along `axis` into pieces of the given sizes (sizes as an i64 input, opset ≥ 13).
    pub fn split(
        &mut self,
        local: &str,
        x: &Value,
        axis: i64,
        sizes: &[usize],
    ) -> Result<Vec<Value>> {
        let ax = normalize_axis("Split", axis, x.shape.len())?;
        if x.shape[ax] != Dim::Fixed(sizes.iter().sum()) {
            return Err(shape_error(
                "Split",
                format!(
                    "sizes {sizes:?} do not cover axis {ax} of {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let sizes_value = self.const_i64(
            &format!("{local}_sizes"),
            &[sizes.len()],
            sizes.iter().map(|&s| s as i64).collect(),
        )?;
        let outputs = sizes
            .iter()
            .map(|&s| {
                let mut shape = x.shape.clone();
                shape[ax] = Dim::Fixed(s);
                (x.elem, shape)
            })
            .collect();
        Ok(self.node(
            local,
            "Split",
            &[x, &sizes_value],
            vec![("axis".to_string(), Attr::Int(axis))],
            outputs,
            0,
        ))
    }

    /// `Gather` along `axis`: output shape is
    /// `data.shape[..axis] ++ indices.shape ++ data.shape[axis + 1..]`.
    pub fn gather(
        &mut self,
        local: &str,
        data: &Value,
        indices: &Value,
        axis: usize,
    ) -> Result<Value> {
        if indices.elem != ElemType::I64 || axis >= data.shape.len() {
            return Err(shape_error(
                "Gather",
                format!(
                    "needs i64 indices and an axis below rank {}",
                    data.shape.len()
                ),
            ));
        }
        let mut shape = data.shape[..axis].to_vec();
        shape.extend_from_slice(&indices.shape);
        shape.extend_from_slice(&data.shape[axis + 1..]);
        Ok(self.single(
            local,
            "Gather",
            &[data, indices],
            vec![("axis".to_string(), Attr::Int(axis as i64))],
            (data.elem, shape),
            0,
        ))
    }

    /// `Slice` of `[start, end)` along one axis of fixed size.
    pub fn slice(
        &mut self,
        local: &str,
        x: &Value,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<Value> {
        match x.shape.get(axis) {
            Some(Dim::Fixed(n)) if start < end && end <= *n => {}
            _ => {
                return Err(shape_error(
                    "Slice",
                    format!("[{start}, {end}) on axis {axis} of {}", fmt_shape(&x.shape)),
                ))
            }
        }
        let starts = self.const_i64(&format!("{local}_starts"), &[1], vec![start as i64])?;
        let ends = self.const_i64(&format!("{local}_ends"), &[1], vec![end as i64])?;
        let axes = self.const_i64(&format!("{local}_axes"), &[1], vec![axis as i64])?;
        let mut shape = x.shape.clone();
        shape[axis] = Dim::Fixed(end - start);
        Ok(self.single(
            local,
            "Slice",
            &[x, &starts, &ends, &axes],
            vec![],
            (x.elem, shape),
            0,
        ))
    }

    /// Zero `Pad` (mode constant) of `before` / `after` elements on one axis of fixed size.
    pub fn pad_axis(
        &mut self,
        local: &str,
        x: &Value,
        axis: usize,
        before: usize,
        after: usize,
    ) -> Result<Value> {
        let rank = x.shape.len();
        let Some(Dim::Fixed(n)) = x.shape.get(axis) else {
            return Err(shape_error(
                "Pad",
                format!("axis {axis} of {}", fmt_shape(&x.shape)),
            ));
        };
        let mut pads = vec![0i64; 2 * rank];
        pads[axis] = before as i64;
        pads[rank + axis] = after as i64;
        let mut shape = x.shape.clone();
        shape[axis] = Dim::Fixed(n + before + after);
        let pads = self.const_i64(&format!("{local}_pads"), &[2 * rank], pads)?;
        Ok(self.single(local, "Pad", &[x, &pads], vec![], (x.elem, shape), 0))
    }

    /// `Concat` along `axis` (negative counts from the end).
    pub fn concat(&mut self, local: &str, parts: &[&Value], axis: i64) -> Result<Value> {
        let first = parts
            .first()
            .ok_or_else(|| shape_error("Concat", "no input".into()))?;
        let ax = normalize_axis("Concat", axis, first.shape.len())?;
        let mut total = 0;
        for p in parts {
            let same_rest = p.shape.len() == first.shape.len()
                && p.shape
                    .iter()
                    .zip(&first.shape)
                    .enumerate()
                    .all(|(k, (a, b))| k == ax || a == b);
            match (&p.shape.get(ax), same_rest) {
                (Some(Dim::Fixed(n)), true) => total += n,
                _ => {
                    return Err(shape_error(
                        "Concat",
                        format!("{} with {}", fmt_shape(&first.shape), fmt_shape(&p.shape)),
                    ))
                }
            }
        }
        let mut shape = first.shape.clone();
        shape[ax] = Dim::Fixed(total);
        Ok(self.single(
            local,
            "Concat",
            parts,
            vec![("axis".to_string(), Attr::Int(axis))],
            (first.elem, shape),
            0,
        ))
    }

    /// `Transpose` with an explicit permutation.
    pub fn transpose(&mut self, local: &str, x: &Value, perm: &[usize]) -> Result<Value> {
        let mut sorted = perm.to_vec();
        sorted.sort_unstable();
        if sorted != (0..x.shape.len()).collect::<Vec<_>>() {
            return Err(shape_error(
                "Transpose",
                format!("bad permutation {perm:?}"),
            ));
        }
        let shape = perm.iter().map(|&p| x.shape[p].clone()).collect();
        Ok(self.single(
            local,
            "Transpose",
            &[x],
            vec![(
                "perm".to_string(),
                Attr::Ints(perm.iter().map(|&p| p as i64).collect()),
            )],
            (x.elem, shape),
            0,
        ))
    }

    /// `Softmax` along `axis` (opset ≥ 13 semantics: over that one axis).
    pub fn softmax(&mut self, local: &str, x: &Value, axis: i64) -> Result<Value> {
        normalize_axis("Softmax", axis, x.shape.len())?;
        Ok(self.single(
            local,
            "Softmax",
            &[x],
            vec![("axis".to_string(), Attr::Int(axis))],
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// `Reshape` to `target`, where entries are ONNX shape codes (0 copies the input
    /// dimension, −1 is inferred) and `result` is the known output shape.
    pub fn reshape(
        &mut self,
        local: &str,
        x: &Value,
        target: &[i64],
        result: Vec<Dim>,
    ) -> Result<Value> {
        let shape = self.const_i64(&format!("{local}_shape"), &[target.len()], target.to_vec())?;
        Ok(self.single(local, "Reshape", &[x, &shape], vec![], (x.elem, result), 0))
    }

    /// 2-D `Conv` (NCHW) with square kernel `kernel`, stride `stride`, no padding.
    pub fn conv2d(
        &mut self,
        local: &str,
        x: &Value,
        weight: &Value,
        bias: &Value,
        kernel: usize,
        stride: usize,
    ) -> Result<Value> {
        let (c_out, c_in) = match (&weight.shape[..], x.shape.len()) {
            ([Dim::Fixed(o), Dim::Fixed(i), Dim::Fixed(kh), Dim::Fixed(kw)], 4)
                if *kh == kernel && *kw == kernel && x.shape[1] == Dim::Fixed(*i) =>
            {
                (*o, *i)
            }
            _ => {
                return Err(shape_error(
                    "Conv",
                    format!(
                        "x {} with weight {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&weight.shape)
                    ),
                ))
            }
        };
        let out_hw = |d: &Dim| match d {
            Dim::Fixed(n) if *n >= kernel => Ok(Dim::Fixed((n - kernel) / stride + 1)),
            _ => Err(shape_error(
                "Conv",
                format!("spatial size {d} with kernel {kernel}"),
            )),
        };
        let (h, w) = (out_hw(&x.shape[2])?, out_hw(&x.shape[3])?);
        let positions = (h.size_or_one() * w.size_or_one()) as u64;
        let flops = 2 * positions * (c_out * c_in * kernel * kernel) as u64;
        let k = kernel as i64;
        let s = stride as i64;
        Ok(self.single(
            local,
            "Conv",
            &[x, weight, bias],
            vec![
                ("kernel_shape".to_string(), Attr::Ints(vec![k, k])),
                ("strides".to_string(), Attr::Ints(vec![s, s])),
            ],
            (x.elem, vec![x.shape[0].clone(), Dim::Fixed(c_out), h, w]),
            flops,
        ))
    }

    /// `ReduceMean` over `axes` without keeping them: `axes` is an attribute up to opset 17
    /// and an i64 input from opset 18.
    pub fn reduce_mean(&mut self, local: &str, x: &Value, axes: &[i64]) -> Result<Value> {
        let rank = x.shape.len();
        let norm: Vec<usize> = axes
            .iter()
            .map(|&a| normalize_axis("ReduceMean", a, rank))
            .collect::<Result<_>>()?;
        let shape = x
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !norm.contains(i))
            .map(|(_, d)| d.clone())
            .collect();
        let keepdims = ("keepdims".to_string(), Attr::Int(0));
        if self.opset >= 18 {
            let axes_value =
                self.const_i64(&format!("{local}_axes"), &[axes.len()], axes.to_vec())?;
            Ok(self.single(
                local,
                "ReduceMean",
                &[x, &axes_value],
                vec![keepdims],
                (x.elem, shape),
                0,
            ))
        } else {
            Ok(self.single(
                local,
                "ReduceMean",
                &[x],
                vec![("axes".to_string(), Attr::Ints(axes.to_vec())), keepdims],
                (x.elem, shape),
                0,
            ))
        }
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
