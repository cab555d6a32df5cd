//! Everything ONNX, and nothing about any one model: the protobuf types ([`proto`]), element
//! types ([`dtype`]), the in-memory graph ([`graph`]) and its builder ([`builder`], with one
//! helper per operator in [`ops`], [`primitive`], [`quant_ops`] (block-quantized weights in
//! [`nbits`]) and [`scatter`], and, for sizes known only at run time, [`dynamic`]; the shape
//! rules in [`shape`]), the streaming writer ([`writer`]), the reader ([`reader`], stored
//! values in [`values`]) and in-place edits of a read model ([`edit`], and [`dequantize`] for a
//! runtime that cannot read a quantized node); the opset range and IR version table
//! ([`versions`]) and the op forms a target can ask for ([`forms`]).

pub mod activation;
pub mod builder;
pub mod dequantize;
pub mod dtype;
pub mod dynamic;
pub mod edit;
pub mod forms;
pub mod graph;
pub mod nbits;
pub mod ops;
pub mod primitive;
pub mod proto;
pub mod quant_ops;
pub mod reader;
pub mod scatter;
pub mod shape;
pub mod values;
pub mod versions;
pub mod writer;
