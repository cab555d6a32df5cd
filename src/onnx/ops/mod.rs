//! One helper per ONNX operator the tool emits, as `impl GraphBuilder` methods grouped by
//! operator family as tract's onnx crate groups them: [`array`](mod@array) (cast, shape, layout,
//! indexing, scatter) and [`array_dynamic`] (sizes known only at run time), [`math`] (MatMul, element-wise arithmetic
//! and unary functions), [`nn`] (normalizations, activations, softmax, convolutions),
//! [`reduce`] (reductions) and [`quant`] (integer and block-quantized MatMuls).
//!
//! Each helper documents the operator's version history (from the
//! [ONNX operator changelog](https://onnx.ai/onnx/operators/)) and the form it emits for
//! the target opset, in the manner of burn's onnx-ir node docs; each checks its operands'
//! shapes and records the output shape (and, for MatMul and Conv, the FLOPs). A shape or
//! type mismatch is a bug in the caller and an error naming the node, never a panic.

pub mod array;
pub mod array_dynamic;
pub mod math;
pub mod nn;
pub mod quant;
pub mod reduce;

pub use array::TENSOR_SCATTER_OPSET;
pub use nn::ATTENTION_OPSET;
pub use quant::{NBits, MIN_INT8_OPSET};
