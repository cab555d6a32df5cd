//! Unit tests of the writer: streamed bytes equal prost's encoding, external data
//! layout and alignment, atomic writes.

use super::*;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Dim, ElemType};

/// A graph with every kind of field the writer streams: inputs, value_info, nodes with
/// each attribute type, an f32 and an f16 initializer (one large enough for a
/// multi-byte length varint), a lazily produced one, and metadata.
fn sample() -> (Graph, ModelInfo) {
    let mut g = GraphBuilder::new(17).unwrap();
    let x = g
        .input(
            "x",
            ElemType::F32,
            vec![Dim::Symbol("batch".into()), Dim::Fixed(300)],
        )
        .unwrap();
    let w = g
        .weight(
            "w",
            &[300, 300],
            TensorData::F32((0..90_000).map(|k| k as f32).collect()),
        )
        .unwrap();
    let lazy = TensorData::produced(|| Ok(vec![0.5; 300]));
    let b = g.weight_as("b", &[300], ElemType::F16, lazy).unwrap();
    let y = g.matmul("mm", &x, &w).unwrap();
    let y = g.cast("to16", &y, ElemType::F16).unwrap();
    let y = g.add("bias", &y, &b).unwrap();
    let y = g.transpose("t", &y, &[1, 0]).unwrap();
    let y = g.reduce_mean("mean", &y, &[0]).unwrap();
    let info = ModelInfo {
        producer_name: "test".into(),
        producer_version: "0".into(),
        doc_string: "a doc".into(),
        metadata: vec![("k".into(), "v".repeat(200))],
    };
    (g.finish("sample", vec![y]), info)
}

#[test]
fn streamed_length_arithmetic_matches_prost() {
    let (graph, info) = sample();
    let bytes = encode_model_to_vec(&graph, &info).unwrap();
    assert_eq!(
        encoded_size(&graph, &info, &DataLayout::Inline),
        bytes.len() as u64
    );
    // Decoding proves every length prefix was right; prost re-encodes the same fields
    // (in its own field order) to exactly as many bytes.
    let decoded = onnx::ModelProto::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.encode_to_vec().len(), bytes.len());
    let g = decoded.graph.unwrap();
    assert_eq!(g.initializer.len(), 2);
    assert_eq!(g.initializer[0].raw_data().len(), 90_000 * 4);
    assert_eq!(g.initializer[1].raw_data().len(), 300 * 2);
    assert_eq!(
        half::f16::from_le_bytes([
            g.initializer[1].raw_data()[0],
            g.initializer[1].raw_data()[1]
        ]),
        half::f16::from_f32(0.5)
    );
    assert_eq!(decoded.ir_version, Some(ir_version_for(17)));
    assert_eq!(decoded.metadata_props.len(), 1);
}

#[test]
fn external_layout_aligns_tensors_and_keeps_lengths_exact() {
    let (graph, info) = sample();
    let layout = DataLayout::External {
        location: "m.onnx.data".into(),
    };
    let mut model = Vec::new();
    let mut data = Vec::new();
    let written = encode_model(
        &graph,
        &info,
        &layout,
        &mut model,
        Some(&mut data),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(written, model.len() as u64);
    assert_eq!(encoded_size(&graph, &info, &layout), model.len() as u64);
    let decoded = onnx::ModelProto::decode(model.as_slice()).unwrap();
    assert_eq!(decoded.encode_to_vec().len(), model.len());
    let offsets: Vec<u64> = decoded
        .graph
        .unwrap()
        .initializer
        .iter()
        .map(|t| {
            let e = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key() == k)
                    .unwrap()
                    .value()
                    .to_string()
            };
            assert_eq!(e("location"), "m.onnx.data");
            e("offset").parse().unwrap()
        })
        .collect();
    assert_eq!(offsets, vec![0, 360_448]); // 360 000 bytes rounded up to 88 · 4096
    assert_eq!(data.len(), 360_448 + 600);
}

#[test]
fn a_tensor_producing_the_wrong_count_is_refused() {
    let mut g = GraphBuilder::new(17).unwrap();
    let bad = TensorData::produced(|| Ok(vec![1.0; 3]));
    let w = g.weight("w", &[4], bad).unwrap();
    let y = g.add("y", &w, &w).unwrap();
    let err = encode_model_to_vec(&g.finish("g", vec![y]), &ModelInfo::default()).unwrap_err();
    assert!(matches!(err, Error::BadTensor(_)), "{err:?}");
}

/// A write that fails while the producer is more than its runs ahead stops the producer
/// (it waits for room no longer): the error comes back instead of a hang.
#[test]
fn a_failing_write_stops_a_producer_waiting_for_room() {
    /// Takes the headers, then fails: the disk is full at the first run of values.
    struct Fails(usize);
    impl std::io::Write for Fails {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.0 + bytes.len() > 4096 {
                // Late enough that the producer is as far ahead as it may be.
                std::thread::sleep(std::time::Duration::from_millis(100));
                return Err(std::io::Error::other("disk full"));
            }
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let len = 40 * crate::tensor::RUN; // more than the producer may be ahead
    let values = std::sync::Arc::new(vec![0.25f32; len]);
    let stream = TensorData::LazyF32(std::sync::Arc::new(
        move |sink: &mut crate::tensor::F32Sink<'_>| {
            sink(std::borrow::Cow::Borrowed(values.as_slice()))
        },
    ));
    let mut g = GraphBuilder::new(17).unwrap();
    let w = g.weight("w", &[len], stream).unwrap();
    let y = g.add("y", &w, &w).unwrap();
    let graph = g.finish("g", vec![y]);
    let err = encode_model(
        &graph,
        &ModelInfo::default(),
        &DataLayout::Inline,
        &mut Fails(0),
        None,
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}
