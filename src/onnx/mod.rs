//! Everything ONNX, and nothing about any one model: the protobuf types ([`proto`]), element
//! types ([`dtype`]), the in-memory graph ([`graph`]) and its builder ([`builder`], with one
//! helper per operator in [`ops`] and, for sizes known only at run time,
//! [`dynamic`] and the shape rules in [`shape`]), the streaming writer
//! ([`writer`]) and the reader ([`reader`]).

pub mod builder;
pub mod dtype;
pub mod dynamic;
pub mod graph;
pub mod ops;
pub mod proto;
pub mod reader;
pub mod shape;
pub mod writer;
