//! The tool's in-memory ONNX graph: values with static shapes, nodes, initializers whose data
//! may be produced lazily at write time, and constants. Built by the graph builder
//! (`builder.rs`), written by the writer (`writer/`).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::onnx::dtype::DataType;

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
    /// i8 (`TensorProto.INT8` = 3): quantized weights (values given as f32 integers).
    I8,
    /// u8 (`TensorProto.UINT8` = 2): dynamically quantized activations, and packed
    /// block-quantized weights (values given as f32 integers in [0, 255]).
    U8,
    /// i32 (`TensorProto.INT32` = 6): integer MatMul accumulators.
    I32,
}

impl ElemType {
    /// The ONNX element type.
    pub fn data_type(self) -> DataType {
        match self {
            ElemType::F32 => DataType::Float,
            ElemType::F16 => DataType::Float16,
            ElemType::I64 => DataType::Int64,
            ElemType::I8 => DataType::Int8,
            ElemType::U8 => DataType::Uint8,
            ElemType::I32 => DataType::Int32,
        }
    }
    /// The `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        self.data_type() as i32
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::F16 => 2,
            ElemType::F32 => 4,
            ElemType::I64 => 8,
            ElemType::I8 | ElemType::U8 => 1,
            ElemType::I32 => 4,
        }
    }
    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, ElemType::F32 | ElemType::F16)
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

pub use crate::tensor::F32Sink;

/// Produces the f32 contents of an initializer when the model is written: calls the sink
/// with its values in order, all of them at once or a run at a time.
pub type F32Stream = Arc<dyn Fn(&mut F32Sink<'_>) -> Result<()> + Send + Sync>;

/// The contents of an initializer.
#[derive(Clone)]
pub enum TensorData {
    /// f32 values already in memory.
    F32(Vec<f32>),
    /// f32 values produced at write time, one tensor (or one run of a tensor) at a time,
    /// so that a model never needs all of its weights in memory at once.
    LazyF32(F32Stream),
}

impl TensorData {
    /// Values produced whole at write time by `produce` (a transform of a whole tensor:
    /// a quantization, a join).
    pub fn produced(produce: impl Fn() -> Result<Vec<f32>> + Send + Sync + 'static) -> Self {
        TensorData::LazyF32(Arc::new(move |sink: &mut F32Sink<'_>| {
            sink(Cow::Owned(produce()?))
        }))
    }
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
/// as f32, stored as `elem`: F32, F16, I8 for quantized weights whose f32 values are
/// integers in [−127, 127], or U8 for packed block-quantized weights whose f32 values are
/// integers in [0, 255]). Constants that are not parameters (index tables, shapes,
/// scalars, masks) are `Constant` nodes.
#[derive(Clone, Debug)]
pub struct Initializer {
    /// Name (also the value name nodes refer to).
    pub name: String,
    /// Stored element type (F32, F16, I8 or U8).
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
    /// `STRING` (UTF-8).
    String(String),
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

/// Operators outside the default `ai.onnx` domain that the builder emits, with their
/// domain and its opset version: ONNX Runtime's contrib operators
/// (the onnxruntime repository's docs/ContribOperators.md).
pub const CONTRIB_OPS: &[(&str, &str, i64)] = &[
    ("MatMulNBits", "com.microsoft", 1),
    ("SkipLayerNormalization", "com.microsoft", 1),
];

/// The domain and its opset version of `op_type` when it is one of [`CONTRIB_OPS`];
/// `None` for the default domain.
pub fn contrib_domain(op_type: &str) -> Option<(&'static str, i64)> {
    CONTRIB_OPS
        .iter()
        .find(|(op, _, _)| *op == op_type)
        .map(|(_, domain, version)| (*domain, *version))
}

/// One operator application.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique node name, by place: `blocks.3/sgu/spatial_matmul`.
    pub name: String,
    /// ONNX operator type (default domain, or one of [`CONTRIB_OPS`]).
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

/// A finished graph: what the writer (`writer/`) writes as an ONNX model.
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
    /// Number of values stored as initializers (f32, f16, or int8 with their f32 scales): the
    /// model's parameter count as stored in the file (constants such as index tables and
    /// scalars are nodes, not parameters).
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

    /// The domains other than the default one that the nodes use, with their opset
    /// versions, in first-use order (see [`CONTRIB_OPS`]).
    pub fn extra_domains(&self) -> Vec<(&'static str, i64)> {
        let mut out: Vec<(&'static str, i64)> = Vec::new();
        for d in self.nodes.iter().filter_map(|n| contrib_domain(&n.op_type)) {
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// Total bytes of initializer data.
    pub fn initializer_bytes(&self) -> u64 {
        self.initializers.iter().map(|i| i.byte_len() as u64).sum()
    }
}
