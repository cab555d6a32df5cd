//! A graph encoded with the initializers of a model already decoded, instead of producing
//! its own: the same weights under another interface (src/rebuild.rs), each tensor as the
//! file stores it (its inline bytes, or where its external data lies), matched by name.

use std::collections::HashMap;

use prost::Message;

use super::{
    graph_header, model_header, too_large, varint_len, ModelInfo, GRAPH_INITIALIZER_KEY,
    MODEL_GRAPH_KEY, PROTOBUF_LIMIT,
};
use crate::error::{Error, Result};
use crate::onnx::graph::Graph;
use crate::onnx::proto as onnx;

/// The first way the tensors `stored` differ from the initializers `graph` declares: one
/// missing, one of another element type or dimensions, or one the graph does not declare;
/// `None` when they are the same tensors by name.
pub fn stored_mismatch(graph: &Graph, stored: &[onnx::TensorProto]) -> Option<String> {
    let by_name: HashMap<&str, &onnx::TensorProto> = stored.iter().map(|t| (t.name(), t)).collect();
    for init in &graph.initializers {
        let Some(t) = by_name.get(init.name.as_str()) else {
            return Some(format!("it has no initializer {}", init.name));
        };
        let dims: Vec<i64> = init.dims.iter().map(|&d| d as i64).collect();
        if t.data_type() != init.elem.onnx_code() || t.dims != dims {
            return Some(format!(
                "its initializer {} is element type {} {:?}, where {:?} {:?} is built",
                init.name,
                t.data_type(),
                t.dims,
                init.elem,
                init.dims
            ));
        }
    }
    if stored.len() != graph.initializers.len() || by_name.len() != stored.len() {
        let declared: std::collections::HashSet<&str> =
            graph.initializers.iter().map(|i| i.name.as_str()).collect();
        let extra = stored
            .iter()
            .find(|t| !declared.contains(t.name()))
            .map_or("a repeated name", |t| t.name());
        return Some(format!(
            "it has an initializer the model does not build: {extra}"
        ));
    }
    None
}

/// Encodes `graph` and `info` with the tensors of `stored` as its initializers, in the
/// graph's order, each encoded as it is; [`stored_mismatch`] must have found nothing.
pub fn encode_with_stored(
    graph: &Graph,
    info: &ModelInfo,
    stored: &[onnx::TensorProto],
) -> Result<Vec<u8>> {
    let by_name: HashMap<&str, &onnx::TensorProto> = stored.iter().map(|t| (t.name(), t)).collect();
    let tensors = graph
        .initializers
        .iter()
        .map(|i| {
            by_name.get(i.name.as_str()).copied().ok_or_else(|| {
                Error::Internal(format!("{}: no stored tensor of that name", i.name))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let model_head = model_header(graph, info).encode_to_vec();
    let graph_head = graph_header(graph).encode_to_vec();
    let mut graph_len = graph_head.len() as u64;
    for t in &tensors {
        let t = t.encoded_len() as u64;
        graph_len += 1 + varint_len(t) + t;
    }
    let total = model_head.len() as u64 + 1 + varint_len(graph_len) + graph_len;
    if total > PROTOBUF_LIMIT {
        return Err(too_large(total));
    }
    let mut bytes = Vec::with_capacity(total as usize);
    bytes.extend_from_slice(&model_head);
    bytes.push(MODEL_GRAPH_KEY);
    prost::encoding::encode_varint(graph_len, &mut bytes);
    bytes.extend_from_slice(&graph_head);
    for t in tensors {
        bytes.push(GRAPH_INITIALIZER_KEY);
        prost::encoding::encode_varint(t.encoded_len() as u64, &mut bytes);
        t.encode(&mut bytes)
            .map_err(|e| Error::Internal(format!("encoding {}: {e}", t.name())))?;
    }
    Ok(bytes)
}
