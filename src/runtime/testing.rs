//! Small causal token models written for the unit tests of decoding (tract runs them; no
//! Python, no ONNX Runtime).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::gmlp::export::export_for;
use crate::gmlp::init::{InitScheme, SeededInit};
use crate::gmlp::interface::DecodingInfo;
use crate::gmlp::metadata::DECODING_KEY;
use crate::gmlp::targets::BuildTarget;
use crate::gmlp::{GmlpConfig, Precision, SequenceMode, SpatialForm, Task};
use crate::onnx::reader::{metadata_value, read_model};
use crate::onnx::writer::write_model;

/// A small causal aMLP (n = 12, vocabulary 50) with spread seeded weights, so that its
/// greedy continuations vary.
pub(crate) fn tiny() -> GmlpConfig {
    GmlpConfig {
        task: Task::Tokens {
            vocab_size: 50,
            seq_len: 12,
            tied_embedding: false,
        },
        layers: 2,
        d_model: 16,
        d_ffn: 32,
        attn_dim: Some(8),
        causal: true,
        heads: 1,
        shift_tokens: 0,
        spatial: SpatialForm::ToeplitzGather,
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    }
}

/// Writes [`tiny`] in the sequence form `mode` (opset 17) to `dir`/`<mode>.onnx`.
pub(crate) fn write_tiny(dir: &Path, mode: SequenceMode) -> PathBuf {
    let source = Arc::new(SeededInit {
        seed: 3,
        scheme: InitScheme::Spread,
    });
    let model = export_for(
        &tiny(),
        source,
        "test",
        None,
        &BuildTarget::at_opset(17),
        mode,
    )
    .unwrap();
    let path = dir.join(format!("{}.onnx", mode.as_str()));
    write_model(&model.graph, &model.info, &path, |_, _| {}).unwrap();
    path
}

/// The decoding description in the metadata of a model [`write_tiny`] wrote (read here,
/// not through the decoding layer, which the engine's tests do not use).
pub(crate) fn tiny_info(path: &Path) -> DecodingInfo {
    let model = read_model(path).unwrap();
    DecodingInfo::parse(metadata_value(&model, DECODING_KEY).unwrap()).unwrap()
}

/// The index of the first largest value of `row` (the greedy pick, computed here
/// independently of the decoding layer's sampler).
pub(crate) fn first_largest(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}
