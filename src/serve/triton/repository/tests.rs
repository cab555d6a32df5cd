//! Unit tests of `repository`: the served model of a stateful file is the file's model
//! emitted again with Triton's interface (tract runs both: the served one answers as the
//! file does, with the state Triton keeps), and a stateful file this tool did not write is
//! refused with nothing written.

use ndarray::{s, Array1, Array2, Array3, ArrayD, Axis, IxDyn};

use super::*;
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::interface::{DecodingInfo, POSITION};
use crate::gmlp::metadata::DECODING_KEY;
use crate::gmlp::SequenceMode;
use crate::onnx::graph::Dim;
use crate::onnx::reader::{declared_inputs, declared_outputs, read_model};
use crate::runtime::testing::write_tiny;
use crate::runtime::{open, RuntimeKind, RuntimeOptions};
use crate::serve::triton::{TritonOptions, NEXT_POSITION};
use crate::tensor::{NamedTensor, TensorValue};

fn i64s(name: &str, value: ArrayD<i64>) -> NamedTensor {
    NamedTensor {
        name: name.into(),
        value: TensorValue::I64(value),
    }
}

fn f32s(name: &str, value: ArrayD<f32>) -> NamedTensor {
    NamedTensor {
        name: name.into(),
        value: TensorValue::F32(value),
    }
}

/// The outputs of one tract run of `path`, by name.
fn run(path: &Path, inputs: &[NamedTensor]) -> Vec<NamedTensor> {
    let mut rt = open(RuntimeKind::Tract, path, &RuntimeOptions::default()).unwrap();
    rt.run(inputs).unwrap()
}

fn output<'a>(outputs: &'a [NamedTensor], name: &str) -> &'a TensorValue {
    &outputs.iter().find(|o| o.name == name).unwrap().value
}

/// Normwise relative difference of two f32 outputs (the served graph slices the state,
/// which may change tract's order of sums in the last bits).
fn rel(a: &TensorValue, b: &TensorValue) -> f32 {
    let (TensorValue::F32(a), TensorValue::F32(b)) = (a, b) else {
        panic!("f32 outputs")
    };
    assert_eq!(a.shape(), b.shape());
    let diff = (a - b).mapv(|x| x * x).sum().sqrt();
    diff / b.mapv(|x| x * x).sum().sqrt()
}

fn info(path: &Path) -> DecodingInfo {
    let model = read_model(path).unwrap();
    DecodingInfo::parse(metadata_value(&model, DECODING_KEY).unwrap()).unwrap()
}

/// A growing-state file served: each `past_*` declared with one leading slot more, the
/// metadata marked; run on a past of one zero slot followed by the file's own present
/// after a first request, it gives the file's logits and its present behind the slot.
#[test]
fn a_growing_state_is_served_behind_one_leading_slot() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_tiny(dir.path(), SequenceMode::Growing);
    let written =
        write_repository(&file, &dir.path().join("repo"), &TritonOptions::new("lm")).unwrap();
    let served = read_model(&written.paths.model).unwrap();
    assert!(metadata_value(&served, ADAPTER_METADATA_KEY).is_some());
    let state = info(&file).state;
    for input in declared_inputs(&served) {
        if let Some(s) = state.iter().find(|s| s.past == input.name) {
            assert_eq!(
                input.shape[1],
                Dim::Symbol(format!("1 + {}", s.past_rows_symbol())),
                "{}",
                input.name
            );
        }
    }
    // The file's first request (3 tokens, empty past), then a second (2 tokens).
    let first = Array2::from_shape_vec((1, 3), vec![3i64, 17, 5])
        .unwrap()
        .into_dyn();
    let second = Array2::from_shape_vec((1, 2), vec![40i64, 2])
        .unwrap()
        .into_dyn();
    let empty = |w| ArrayD::<f32>::zeros(IxDyn(&[1, 0, w]));
    let slot = |w| ArrayD::<f32>::zeros(IxDyn(&[1, 1, w]));
    let mut inputs = vec![i64s(INPUT_IDS, first.clone())];
    inputs.extend(state.iter().map(|s| f32s(&s.past, empty(s.width))));
    let own_first = run(&file, &inputs);
    let mut inputs = vec![i64s(INPUT_IDS, first)];
    inputs.extend(state.iter().map(|s| f32s(&s.past, slot(s.width))));
    let served_first = run(&written.paths.model, &inputs);
    assert!(rel(output(&served_first, LOGITS), output(&own_first, LOGITS)) <= 1e-6);
    let mut own_inputs = vec![i64s(INPUT_IDS, second.clone())];
    let mut served_inputs = vec![i64s(INPUT_IDS, second)];
    for s in &state {
        let (TensorValue::F32(own), TensorValue::F32(served)) = (
            output(&own_first, &s.present),
            output(&served_first, &s.present),
        ) else {
            panic!("f32 states")
        };
        assert_eq!(
            served.index_axis(Axis(1), 0),
            slot(s.width).index_axis(Axis(1), 0)
        );
        let rows = TensorValue::F32(served.slice_axis(Axis(1), (1..).into()).to_owned());
        assert!(
            rel(&rows, &TensorValue::F32(own.clone())) <= 1e-6,
            "{}",
            s.present
        );
        own_inputs.push(f32s(&s.past, own.clone()));
        served_inputs.push(f32s(&s.past, served.clone()));
    }
    let (own, served) = (
        run(&file, &own_inputs),
        run(&written.paths.model, &served_inputs),
    );
    assert!(rel(output(&served, LOGITS), output(&own, LOGITS)) <= 1e-6);
}

/// A static-state file served: `position` declared [batch, 1], the output
/// `triton_next_position` = position + the request's tokens, the logits the file's.
#[test]
fn a_static_state_is_served_with_its_position_counted() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_tiny(dir.path(), SequenceMode::Static);
    let written =
        write_repository(&file, &dir.path().join("repo"), &TritonOptions::new("lm")).unwrap();
    let served = read_model(&written.paths.model).unwrap();
    assert!(metadata_value(&served, COUNTER_METADATA_KEY).is_some());
    let position = declared_inputs(&served)
        .into_iter()
        .find(|t| t.name == POSITION)
        .unwrap();
    assert_eq!(position.shape[1..], [Dim::Fixed(1)]);
    let next = declared_outputs(&served)
        .into_iter()
        .find(|t| t.name == NEXT_POSITION)
        .unwrap();
    assert_eq!(next.shape[1..], [Dim::Fixed(1)]);
    let info = info(&file);
    let ids = Array2::from_shape_vec((2, 3), vec![3i64, 17, 5, 40, 2, 9])
        .unwrap()
        .into_dyn();
    let states: Vec<NamedTensor> = info
        .state
        .iter()
        .map(|s| {
            let values = Array3::from_shape_fn((2, info.max_sequence, s.width), |(b, r, c)| {
                ((b * 7 + r * 3 + c) % 11) as f32 / 11.0 - 0.5
            });
            f32s(&s.past, values.into_dyn())
        })
        .collect();
    let positions = Array1::from(vec![0i64, 4]);
    let mut own_inputs = vec![
        i64s(INPUT_IDS, ids.clone()),
        i64s(POSITION, positions.clone().into_dyn()),
    ];
    own_inputs.extend(states.iter().cloned());
    let column = positions.clone().insert_axis(Axis(1)).into_dyn();
    let mut served_inputs = vec![i64s(INPUT_IDS, ids), i64s(POSITION, column)];
    served_inputs.extend(states);
    let (own, served) = (
        run(&file, &own_inputs),
        run(&written.paths.model, &served_inputs),
    );
    assert!(rel(output(&served, LOGITS), output(&own, LOGITS)) <= 1e-6);
    let TensorValue::I64(next) = output(&served, NEXT_POSITION) else {
        panic!("i64 positions")
    };
    assert_eq!(next.slice(s![.., 0]).to_vec(), [3, 7]);
}

/// A stateful file without this tool's configuration: refused, naming why, and nothing
/// is written.
#[test]
fn a_stateful_file_gmlp_onnx_did_not_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_tiny(dir.path(), SequenceMode::Growing);
    let mut model = read_model(&file).unwrap();
    model.metadata_props.clear();
    let foreign = dir.path().join("foreign.onnx");
    std::fs::write(&foreign, model.encode_to_vec()).unwrap();
    let repo = dir.path().join("repo");
    let err = write_repository(&foreign, &repo, &TritonOptions::new("lm")).unwrap_err();
    assert!(
        matches!(&err, Error::Unservable(m) if m.contains("not written by gmlp-onnx")),
        "{err:?}"
    );
    assert!(!repo.join("lm").join("1").join(MODEL_FILE).exists());
}
