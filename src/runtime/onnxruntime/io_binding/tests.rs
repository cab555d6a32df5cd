//! Unit tests of `bound` (in their own file, as the other modules of the engine keep theirs
//! when they grow).

use super::*;
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::interface::POSITION;
use crate::gmlp::SequenceMode;
use crate::runtime::testing::{first_largest, tiny_info, write_tiny};
use crate::runtime::ModelSource;

#[test]
fn inputs_read_elsewhere_are_bound_again_before_each_run_or_refused() {
    let (host, gpu) = (Location::Host, Location::Cuda { device: 0 });
    let check = |wanted, in_place, graphs| {
        input_binding("ort-cuda", "position", (wanted, gpu), in_place, graphs)
    };
    assert_eq!(check(gpu, true, true).unwrap(), InputBinding::Once);
    // The CUDA-graph fallback: a graph whose position feeds a node on the CPU.
    assert_eq!(check(host, false, false).unwrap(), InputBinding::EachRun);
    // A CUDA graph replays fixed addresses; a buffer written in place must be read where
    // it is: both refused, as the runtime's failure.
    for (in_place, graphs) in [(false, true), (true, false)] {
        let err = check(host, in_place, graphs).unwrap_err();
        assert!(matches!(err, Error::RuntimeFailed { .. }), "{err:?}");
    }
    assert_eq!(
        input_binding("ort-cpu", "past_0", (host, host), true, false).unwrap(),
        InputBinding::Once
    );
}

/// A prompt and `steps` single steps of the tiny static-state model, each next token
/// picked on the host from the logits read back; the tokens and the last logits.
fn greedy_run(path: &std::path::Path, steps: usize, each_run: bool) -> (Vec<i64>, Vec<f32>) {
    let info = tiny_info(path);
    let mut session = OrtBound::open(
        ModelSource::File(path),
        Provider::Cpu,
        &RuntimeOptions::default(),
    )
    .unwrap();
    assert!(session
        .wanted
        .iter()
        .all(|&(_, location)| location == Location::Host));
    let n = info.max_sequence;
    let state: Vec<(&str, &str, BufferId)> = info
        .state
        .iter()
        .map(|s| {
            let buffer = session.buffer(Element::F32, &[1, n, s.width]).unwrap();
            (s.past.as_str(), s.present.as_str(), buffer)
        })
        .collect();
    let vocab = 50;
    let mut run = |ids: &[i64], at: i64| -> Vec<f32> {
        let t = ids.len();
        let ids_buffer = session.buffer(Element::I64, &[1, t]).unwrap();
        let position = session.buffer(Element::I64, &[1]).unwrap();
        let logits = session.buffer(Element::F32, &[1, t, vocab]).unwrap();
        let mut inputs = vec![(INPUT_IDS, ids_buffer), (POSITION, position)];
        inputs.extend(state.iter().map(|&(past, _, b)| (past, b)));
        let mut outputs = vec![(LOGITS, logits)];
        outputs.extend(state.iter().map(|&(_, present, b)| (present, b)));
        let binding = session.bind(&inputs, &outputs, Replay::Uncaptured).unwrap();
        let bound = session.bindings[binding.0].as_mut().unwrap();
        assert!(
            bound.each_run.is_empty(),
            "host buffers are read where they are"
        );
        if each_run {
            bound.each_run = vec![(INPUT_IDS.into(), ids_buffer), (POSITION.into(), position)];
        }
        session.write_i64(ids_buffer, ids).unwrap();
        session.write_i64(position, &[at]).unwrap();
        session.run(binding).unwrap();
        let mut row = vec![0f32; vocab];
        session.read_f32(logits, (t - 1) * vocab, &mut row).unwrap();
        session.unbind(binding);
        for b in [ids_buffer, position, logits] {
            session.release(b);
        }
        row
    };
    let prompt = [1, 7, 3];
    let mut row = run(&prompt, 0);
    let mut tokens = Vec::new();
    for at in prompt.len()..prompt.len() + steps {
        let id = first_largest(&row) as i64;
        tokens.push(id);
        row = run(&[id], at as i64);
    }
    (tokens, row)
}

/// On the CPU the session reads every bound buffer where it is (ONNX Runtime's own
/// account of its inputs' memory), so buffers are bound once, and the state bound as both
/// input and output carries the tokens from run to run; binding the ids and positions
/// again before each run (the CUDA fallback's way) gives the same tokens and logits, and
/// the tokens vary (the state is read).
#[test]
#[cfg_attr(
    not(feature = "test-onnxruntime"),
    ignore = "needs ONNX Runtime's library (the test Python environment): scripts/test"
)]
fn host_buffers_stay_bound_and_binding_each_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), SequenceMode::Static);
    let (a, logits_a) = greedy_run(&path, 6, false);
    let (b, logits_b) = greedy_run(&path, 6, true);
    assert_eq!(a, b);
    assert_eq!(logits_a, logits_b);
    let distinct: std::collections::BTreeSet<i64> = a.iter().copied().collect();
    assert!(distinct.len() >= 3, "tokens that vary: {a:?}");
}
