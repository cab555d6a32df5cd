//! Unit tests of `resident`: its step graph (tract runs it; ONNX Runtime runs the bound
//! state itself in tests/suite/static_state.rs; src/rebuild/tests.rs checks its interface).

use ndarray::{Array1, Array2, ArrayD, IxDyn};

use super::*;
use crate::gmlp::SequenceMode;
use crate::runtime::testing::{first_largest, tiny_info, write_tiny};
use crate::runtime::{open, RuntimeKind, RuntimeOptions};
use crate::tensor::{NamedTensor, TensorValue};

/// tract runs the step graph: its greedy tokens are the host's pick from its logits
/// at every row, and its next positions are one past the given ones.
#[test]
fn the_step_outputs_are_the_greedy_tokens_and_the_next_positions() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), SequenceMode::Static);
    let edited = dir.path().join("step.onnx");
    std::fs::write(&edited, step_graph(ModelFile::from(&path)).unwrap()).unwrap();
    let info = tiny_info(&path);
    let ids = Array2::from_shape_vec((2, 3), vec![3i64, 17, 5, 40, 2, 9]).unwrap();
    let mut inputs = vec![
        NamedTensor {
            name: INPUT_IDS.into(),
            value: TensorValue::I64(ids.into_dyn()),
        },
        NamedTensor {
            name: POSITION.into(),
            value: TensorValue::I64(Array1::from(vec![0i64, 4]).into_dyn()),
        },
    ];
    let n = info.max_sequence;
    inputs.extend(info.state.iter().map(|s| NamedTensor {
        name: s.past.clone(),
        value: TensorValue::F32(ArrayD::zeros(IxDyn(&[2, n, s.width]))),
    }));
    let mut rt = open(RuntimeKind::Tract, &edited, &RuntimeOptions::default()).unwrap();
    let out = rt.run(&inputs).unwrap();
    let find = |name: &str| &out.iter().find(|o| o.name == name).unwrap().value;
    let (TensorValue::F32(logits), TensorValue::I64(next), TensorValue::I64(position)) =
        (find(LOGITS), find(NEXT_INPUT_IDS), find(NEXT_POSITION))
    else {
        panic!("output types")
    };
    assert_eq!(next.shape(), [2, 3]);
    for b in 0..2 {
        for t in 0..3 {
            let row: Vec<f32> = (0..50).map(|v| logits[[b, t, v]]).collect();
            assert_eq!(next[[b, t]], first_largest(&row) as i64, "row {b}, {t}");
        }
    }
    let distinct: std::collections::BTreeSet<i64> = next.iter().copied().collect();
    assert!(distinct.len() >= 3, "tokens that vary: {next:?}");
    assert_eq!(position.iter().copied().collect::<Vec<_>>(), [1, 5]);
}
