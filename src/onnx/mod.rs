//! Everything ONNX, and nothing about any one model: the protobuf types ([`proto`]), element
//! types ([`dtype`]), the in-memory graph ([`graph`]) and its builder ([`builder`], with one
//! helper per operator in [`ops`], grouped by family; block-quantized weights in [`nbits`];
//! the shape rules in [`shape`]), the streaming writer ([`writer`]), the reader ([`reader`], stored
//! values in [`values`]) and what a read model still gets changed ([`edit`]: its external data
//! relocated; [`dequantize`] for a
//! runtime that cannot read a quantized node); the opset range and IR version table
//! ([`versions`]) and the op forms a target can ask for ([`forms`]).

pub mod builder;
pub mod dequantize;
pub mod dtype;
pub mod edit;
pub mod forms;
pub mod graph;
pub mod nbits;
pub mod ops;
pub mod proto;
pub mod reader;
pub mod shape;
pub mod values;
pub mod versions;
pub mod writer;
