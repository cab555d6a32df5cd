//! Rewrites `com.microsoft.MatMulNBits` nodes of a decoded model as plain `MatMul`s on f32
//! weights dequantized from the node's packed blocks ([`crate::onnx::nbits`]), for a
//! runtime that cannot read the node as it is (tract 0.23 reads 2- and 4-bit codes, not
//! 8-bit ones). The weight values are the file's own: its bytes and scales, unpacked here.
//! Only the form this tool writes is accepted (constant `B` and `scales` initializers, no
//! zero points, no `g_idx`); an optional bias becomes an `Add`.

use std::path::Path;

use crate::error::{Error, Result};
use crate::onnx::nbits::dequantize_packed;
use crate::onnx::proto as onnx;
use crate::onnx::values::tensor_f32;

/// The op type and domain rewritten.
const OP: (&str, &str) = ("MatMulNBits", "com.microsoft");

/// A MatMulNBits node this cannot rewrite.
fn bad(reason: String) -> Error {
    Error::BadTensor(format!("dequantizing MatMulNBits: {reason}"))
}

/// The integer attribute `name` of `node`, if it has one.
fn attr_int(node: &onnx::NodeProto, name: &str) -> Option<i64> {
    node.attribute
        .iter()
        .find(|a| a.name() == name)
        .map(|a| a.i())
}

/// The code widths (`bits`) of the model's MatMulNBits nodes, each once.
pub fn nbits_widths(model: &onnx::ModelProto) -> Vec<i64> {
    let mut out = Vec::new();
    for node in model.graph.iter().flat_map(|g| &g.node) {
        if (node.op_type(), node.domain()) == OP {
            let bits = attr_int(node, "bits").unwrap_or(4);
            if !out.contains(&bits) {
                out.push(bits);
            }
        }
    }
    out
}

/// Replaces every MatMulNBits node whose `bits` `keep` refuses by `MatMul(A, W)` with
/// `W = dequant(B)` as a new f32 `[K, N]` initializer named `{B}.dequantized` (and `Add`
/// of the bias, if any); drops the packed initializers nothing reads any more.
/// `model_path` locates external data (its values are read by [`tensor_f32`], sizes
/// checked). Returns how many nodes were rewritten; on error the model is
/// left half edited (callers drop it).
pub fn dequantize_matmul_nbits(
    model: &mut onnx::ModelProto,
    model_path: &Path,
    keep: impl Fn(i64) -> bool,
) -> Result<usize> {
    let Some(graph) = model.graph.as_mut() else {
        return Ok(0);
    };
    let mut rewritten = 0;
    let mut replaced: Vec<String> = Vec::new();
    let mut nodes = Vec::with_capacity(graph.node.len());
    for node in std::mem::take(&mut graph.node) {
        let bits = attr_int(&node, "bits").unwrap_or(4);
        if (node.op_type(), node.domain()) != OP || keep(bits) {
            nodes.push(node);
            continue;
        }
        let Dequantized { a, packed, weight } =
            dequantized_weight(&node, bits, &graph.initializer, model_path)?;
        replaced.extend(packed);
        let w_name = weight.name().to_string();
        graph.initializer.push(weight);
        nodes.extend(matmul_nodes(&node, a, w_name));
        rewritten += 1;
    }
    graph.node = nodes;
    drop_unread(graph, &replaced);
    Ok(rewritten)
}

/// A MatMulNBits node's weight, dequantized.
struct Dequantized {
    /// The node's input `A`.
    a: String,
    /// Its inputs `B` and `scales`, the packed initializers the weight replaces.
    packed: [String; 2],
    /// The f32 `[K, N]` initializer `{B}.dequantized`.
    weight: onnx::TensorProto,
}

/// Dequantizes the weight of the MatMulNBits `node` of width `bits` from its `B` and
/// `scales` among `initializers`; refuses a node not of the form this tool writes.
fn dequantized_weight(
    node: &onnx::NodeProto,
    bits: i64,
    initializers: &[onnx::TensorProto],
    model_path: &Path,
) -> Result<Dequantized> {
    let name = node.name();
    let input = |k: usize| node.input.get(k).filter(|s| !s.is_empty());
    if input(3).is_some() || input(4).is_some() {
        return Err(bad(format!(
            "{name}: zero points and g_idx are not supported"
        )));
    }
    let (Some(a), Some(b), Some(s)) = (input(0), input(1), input(2)) else {
        return Err(bad(format!("{name}: needs inputs A, B and scales")));
    };
    let dims = |key: &str| {
        attr_int(node, key)
            .filter(|&v| v > 0)
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("{name}: no positive {key} attribute")))
    };
    let (k, n, block) = (dims("K")?, dims("N")?, dims("block_size")?);
    let find = |value: &str| {
        initializers
            .iter()
            .find(|t| t.name() == value)
            .ok_or_else(|| bad(format!("{name}: {value} is not a constant initializer")))
    };
    let (b_t, s_t) = (find(b)?, find(s)?);
    let float = onnx::tensor_proto::DataType::Float as i32;
    if b_t.data_type() != onnx::tensor_proto::DataType::Uint8 as i32 || s_t.data_type() != float {
        return Err(bad(format!(
            "{name}: B is not uint8 or scales are not float32"
        )));
    }
    let packed: Vec<u8> = tensor_f32(b_t, model_path)?
        .into_iter()
        .map(|v| v as u8)
        .collect();
    let scales = tensor_f32(s_t, model_path)?;
    let w = dequantize_packed(&packed, &scales, k, n, bits as usize, block)?;
    Ok(Dequantized {
        a: a.clone(),
        packed: [b.clone(), s.clone()],
        weight: onnx::TensorProto {
            name: Some(format!("{b}.dequantized")),
            dims: vec![k as i64, n as i64],
            data_type: Some(onnx::tensor_proto::DataType::Float as i32),
            raw_data: Some(w.iter().flat_map(|x| x.to_le_bytes()).collect()),
            ..Default::default()
        },
    })
}

/// What replaces the MatMulNBits `node`: `MatMul(a, w_name)`, then `Add` of its bias (the
/// sixth input) if it has one.
fn matmul_nodes(node: &onnx::NodeProto, a: String, w_name: String) -> Vec<onnx::NodeProto> {
    let name = node.name().to_string();
    let output = node.output.first().cloned().unwrap_or_default();
    let bias = node.input.get(5).filter(|s| !s.is_empty()).cloned();
    let product = match bias {
        Some(_) => format!("{output}_before_bias"),
        None => output.clone(),
    };
    let mut nodes = vec![onnx::NodeProto {
        name: Some(name.clone()),
        op_type: Some("MatMul".into()),
        domain: Some(String::new()),
        input: vec![a, w_name],
        output: vec![product.clone()],
        ..Default::default()
    }];
    if let Some(bias) = bias {
        nodes.push(onnx::NodeProto {
            name: Some(format!("{name}_bias")),
            op_type: Some("Add".into()),
            domain: Some(String::new()),
            input: vec![product, bias],
            output: vec![output],
            ..Default::default()
        });
    }
    nodes
}

/// Drops the `replaced` initializers (the rewritten nodes' packed weights and scales)
/// that nothing in the graph reads any more.
fn drop_unread(graph: &mut onnx::GraphProto, replaced: &[String]) {
    // The packed weights and scales of the rewritten nodes, where nothing else reads them.
    let read: std::collections::HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.input.iter().cloned())
        .chain(graph.output.iter().map(|o| o.name().to_string()))
        .collect();
    graph
        .initializer
        .retain(|t| read.contains(t.name()) || !replaced.iter().any(|r| r == t.name()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::builder::GraphBuilder;
    use crate::onnx::graph::{Dim, ElemType, TensorData};
    use crate::onnx::nbits::quantize;
    use crate::onnx::ops::NBits;
    use crate::onnx::writer::{encode_model_to_vec, ModelInfo};
    use prost::Message;

    /// `a [1, 40] · W [40, 3]` as one MatMulNBits node with `bits`, decoded back.
    fn model(bits: usize) -> (onnx::ModelProto, Vec<f32>) {
        let (k, n) = (40, 3);
        let w: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.37).sin()).collect();
        let q = quantize(&w, k, n, bits, 32).unwrap();
        let mut g = GraphBuilder::new(17).unwrap();
        let a = g
            .input("a", ElemType::F32, vec![Dim::Fixed(1), Dim::Fixed(k)])
            .unwrap();
        let packed = q.packed().into_iter().map(f32::from).collect();
        let b = g
            .weight_as("b", &q.packed_dims(), ElemType::U8, TensorData::F32(packed))
            .unwrap();
        let s = g
            .weight("s", &q.scale_dims(), TensorData::F32(q.scales.clone()))
            .unwrap();
        let attrs = NBits {
            k,
            n,
            bits,
            block_size: 32,
            accuracy_level: 4,
        };
        let y = g.matmul_nbits("y", &a, &b, &s, None, attrs).unwrap();
        let bytes = encode_model_to_vec(&g.finish("g", vec![y]), &ModelInfo::default()).unwrap();
        (
            onnx::ModelProto::decode(bytes.as_slice()).unwrap(),
            q.dequantized(),
        )
    }

    #[test]
    fn eight_bit_nodes_become_matmuls_on_the_dequantized_weights() {
        let (mut m, w) = model(8);
        assert_eq!(nbits_widths(&m), vec![8]);
        // With a bias input (the sixth), the node becomes MatMul then Add.
        let node = &mut m.graph.as_mut().unwrap().node[0];
        node.input.extend(["".into(), "".into(), "bias".into()]);
        let n = dequantize_matmul_nbits(&mut m, Path::new("m.onnx"), |b| b == 4).unwrap();
        assert_eq!(n, 1);
        let g = m.graph.as_ref().unwrap();
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type()).collect();
        assert_eq!(ops, ["MatMul", "Add"]);
        assert_eq!(g.node[0].input, ["a", "b.dequantized"]);
        assert_eq!(g.node[1].input, ["y_before_bias", "bias"]);
        assert_eq!(g.node[1].output, ["y"]);
        // The packed weight and scales are gone; the f32 weight is the dequantized one.
        let names: Vec<&str> = g.initializer.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["b.dequantized"]);
        let got: Vec<f32> = g.initializer[0]
            .raw_data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, w);
    }

    #[test]
    fn kept_widths_stay_and_zero_points_are_refused() {
        let (mut m, _) = model(4);
        let before = m.clone();
        assert_eq!(
            dequantize_matmul_nbits(&mut m, Path::new("m.onnx"), |b| b == 4).unwrap(),
            0
        );
        assert_eq!(m, before);
        m.graph.as_mut().unwrap().node[0].input.push("zp".into());
        let err = dequantize_matmul_nbits(&mut m, Path::new("m.onnx"), |_| false).unwrap_err();
        assert!(matches!(err, Error::BadTensor(_)), "{err:?}");
    }
}
