//! Unit tests of `rebuild`: a file emitted again with its own interface is the file, byte
//! for byte; the bound step's outputs come after the file's own; a file whose weights or
//! metadata are not this tool's is refused.

use std::path::Path;
use std::sync::Arc;

use prost::Message;

use super::*;
use crate::gmlp::export::export_for;
use crate::gmlp::init::{InitScheme, SeededInit};
use crate::gmlp::interface::{NEXT_INPUT_IDS, NEXT_POSITION, POSITION};
use crate::gmlp::targets::{BuildTarget, Target};
use crate::gmlp::{GmlpConfig, Precision, SequenceMode, SpatialForm, Task};
use crate::onnx::reader::read_model;
use crate::onnx::writer::{encode_model_to_vec, write_model_with, ExternalData};

/// A small causal aMLP (n = 12, vocabulary 50, d 32 so that int4's blocks fit).
fn small(dtype: Precision, spatial: SpatialForm) -> GmlpConfig {
    GmlpConfig {
        task: Task::Tokens {
            vocab_size: 50,
            seq_len: 12,
            tied_embedding: false,
        },
        layers: 2,
        d_model: 32,
        d_ffn: 64,
        attn_dim: Some(8),
        causal: true,
        heads: 1,
        shift_tokens: 0,
        spatial,
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype,
        block: Default::default(),
    }
}

/// `cfg` built for `target` in `mode`, encoded with its data inline.
fn built(cfg: &GmlpConfig, target: Target, mode: SequenceMode) -> Vec<u8> {
    let weights = Arc::new(SeededInit {
        seed: 5,
        scheme: InitScheme::Spread,
    });
    let target = BuildTarget::resolve(target, None).unwrap();
    let model = export_for(cfg, weights, "test", None, &target, mode).unwrap();
    encode_model_to_vec(&model.graph, &model.info).unwrap()
}

fn decoded(bytes: &[u8]) -> ModelProto {
    ModelProto::decode(bytes).unwrap()
}

/// Every target, dtype and sequence mode of the small model: emitted again with the file's
/// own interface, the encoded model is the file's bytes.
#[test]
fn a_file_emitted_again_with_its_own_interface_is_the_same_bytes() {
    let cases = [
        (Precision::F32, SpatialForm::ToeplitzGather, Target::Ort),
        (Precision::F16, SpatialForm::Dense, Target::Ort),
        (Precision::Int8, SpatialForm::Dense, Target::Ort),
        (Precision::Int8, SpatialForm::ToeplitzGather, Target::Ort),
        (Precision::Int4, SpatialForm::ToeplitzGather, Target::Ort),
        (Precision::F32, SpatialForm::Dense, Target::Portable),
        (
            Precision::F32,
            SpatialForm::ToeplitzGather,
            Target::OnnxRuntime,
        ),
    ];
    let modes = [
        SequenceMode::Fixed,
        SequenceMode::Variable,
        SequenceMode::Growing,
        SequenceMode::Static,
    ];
    let path = Path::new("m.onnx");
    for (dtype, spatial, target) in cases {
        for mode in modes {
            let spatial = target.spatial_for(spatial);
            let file = built(&small(dtype, spatial), target, mode);
            let again = rebuild(&decoded(&file), path, Interface::File, &[]).unwrap();
            assert!(again == file, "{dtype:?} {spatial:?} {target:?} {mode:?}");
        }
    }
}

/// A file whose weights lie in an external data file: emitted again, the model is the
/// file's bytes, its tensors still pointing into the data file.
#[test]
fn a_file_with_external_data_is_emitted_again_pointing_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let weights = Arc::new(SeededInit {
        seed: 5,
        scheme: InitScheme::Spread,
    });
    let cfg = small(Precision::F32, SpatialForm::ToeplitzGather);
    let model = export_for(
        &cfg,
        weights,
        "test",
        None,
        &BuildTarget::at_opset(17),
        SequenceMode::Static,
    )
    .unwrap();
    let path = dir.path().join("m.onnx");
    write_model_with(
        &model.graph,
        &model.info,
        &path,
        ExternalData::Always,
        |_, _| {},
    )
    .unwrap();
    let file = std::fs::read(&path).unwrap();
    let again = rebuild(&read_model(&path).unwrap(), &path, Interface::File, &[]).unwrap();
    assert!(again == file);
}

/// The bound step: the file's outputs, then the greedy tokens (declared like `input_ids`)
/// and the next positions (declared like `position`), from an `ArgMax` and an `Add` after
/// the file's nodes; the initializers are the file's.
#[test]
fn the_bound_step_adds_its_two_outputs_after_the_files_own() {
    let file = built(
        &small(Precision::F32, SpatialForm::ToeplitzGather),
        Target::Ort,
        SequenceMode::Static,
    );
    let before = decoded(&file);
    let step = decoded(&rebuild(&before, Path::new("m.onnx"), Interface::BoundStep, &[]).unwrap());
    let (before, step) = (before.graph.unwrap(), step.graph.unwrap());
    let names = |g: &crate::onnx::proto::GraphProto| -> Vec<String> {
        g.output.iter().map(|o| o.name().to_string()).collect()
    };
    let mut expected = names(&before);
    expected.extend([NEXT_INPUT_IDS.to_string(), NEXT_POSITION.to_string()]);
    assert_eq!(names(&step), expected);
    let declared = |list: &[crate::onnx::proto::ValueInfoProto], name: &str| {
        list.iter()
            .find(|v| v.name() == name)
            .unwrap()
            .r#type
            .clone()
    };
    assert_eq!(
        declared(&step.output, NEXT_INPUT_IDS),
        declared(&step.input, crate::gmlp::emit::INPUT_IDS)
    );
    assert_eq!(
        declared(&step.output, NEXT_POSITION),
        declared(&step.input, POSITION)
    );
    assert_eq!(step.node[..before.node.len()], before.node[..]);
    let added: Vec<&str> = step.node[before.node.len()..]
        .iter()
        .map(|n| n.op_type())
        .collect();
    assert_eq!(added, ["ArgMax", "Constant", "Add"]);
    assert_eq!(step.initializer, before.initializer);
}

/// Refusals: a file without this tool's configuration, and one whose stored weights are
/// not the ones its configuration builds (a tensor renamed, one reshaped).
#[test]
fn a_foreign_file_and_one_whose_weights_differ_are_refused() {
    let file = built(
        &small(Precision::F32, SpatialForm::ToeplitzGather),
        Target::Ort,
        SequenceMode::Static,
    );
    let path = Path::new("m.onnx");
    let mut foreign = decoded(&file);
    foreign.metadata_props.clear();
    let err = rebuild(&foreign, path, Interface::File, &[]).unwrap_err();
    assert!(matches!(err, Error::ForeignModel(_)), "{err:?}");

    let mut renamed = decoded(&file);
    let first = &mut renamed.graph.as_mut().unwrap().initializer[0];
    let name = first.name().to_string();
    first.name = Some(format!("{name}.old"));
    let err = rebuild(&renamed, path, Interface::File, &[]).unwrap_err();
    let Error::NeedsRebuild { reason, remedy } = err else {
        panic!("{err:?}")
    };
    assert!(
        reason.contains(&format!("no initializer {name}")),
        "{reason}"
    );
    assert_eq!(remedy, Remedy::RebuildWithThisVersion);

    let mut reshaped = decoded(&file);
    let first = &mut reshaped.graph.as_mut().unwrap().initializer[0];
    first.dims.reverse();
    first.dims.push(1);
    let err = rebuild(&reshaped, path, Interface::File, &[]).unwrap_err();
    assert!(
        matches!(&err, Error::NeedsRebuild { reason, .. } if reason.contains(&name)),
        "{err:?}"
    );
}
