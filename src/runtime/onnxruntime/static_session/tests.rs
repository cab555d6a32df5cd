//! Unit tests of `static_session` (in their own file: the module itself stays under 600 lines).

use super::*;
use crate::gmlp::SequenceMode;
use crate::runtime::testing::{first_largest, tiny_layout, write_tiny};

const NAMES: [&str; 3] = ["input_ids", "position", "past_0"];

#[test]
fn inputs_read_elsewhere_are_bound_again_before_each_run() {
    let (host, gpu) = (Location::Host, Location::Cuda { device: 0 });
    let check = |wanted: [Location; 3], graphs| {
        input_binding(
            "ort-cuda",
            &NAMES,
            &wanted,
            gpu,
            &["past_0"],
            &NAMES[..2],
            graphs,
        )
    };
    let refusal = |wanted, graphs| check(wanted, graphs).unwrap_err().to_string();
    assert_eq!(check([gpu, gpu, gpu], true).unwrap(), InputBinding::Once);
    // The CUDA-graph fallback: a graph whose position feeds a node on the CPU.
    assert_eq!(
        check([gpu, host, gpu], false).unwrap(),
        InputBinding::EachRun
    );
    assert!(refusal([gpu, host, gpu], true).contains("a CUDA graph replays fixed input addresses"));
    assert!(refusal([gpu, gpu, host], false).contains("its state cannot be written in place"));
    assert_eq!(
        input_binding(
            "ort-cpu",
            &NAMES,
            &[host; 3],
            host,
            &["past_0"],
            &NAMES[..2],
            false
        )
        .unwrap(),
        InputBinding::Once
    );
}

/// Greedy tokens and the last step's logits of a prompt and `steps` single steps.
fn greedy_run(session: &mut BoundStatic, steps: usize) -> (Vec<i64>, Array2<f32>) {
    session
        .run(ndarray::array![[1i64, 7, 3]].view(), &[0])
        .unwrap();
    let mut tokens = Vec::new();
    let mut next = session.greedy().unwrap();
    if next.is_none() {
        let row = session.logits_at(&[2]).unwrap();
        next = Some(vec![first_largest(&row.row(0).to_vec()) as i64]);
    }
    for position in 3..3 + steps as i64 {
        let id = next.clone().unwrap()[0];
        tokens.push(id);
        session
            .run(ndarray::array![[id]].view(), &[position])
            .unwrap();
        next = session.greedy().unwrap();
    }
    (tokens, session.logits_at(&[0]).unwrap())
}

/// On the CPU the session reads every bound buffer where it is (ONNX Runtime's own
/// account of its inputs' memory), so the buffers are bound once; binding the ids and
/// positions again before each run (the CUDA fallback's way) gives the same tokens
/// and logits.
#[test]
#[cfg_attr(
    not(feature = "test-onnxruntime"),
    ignore = "needs ONNX Runtime's library (the test Python environment): scripts/test"
)]
fn host_buffers_stay_bound_and_binding_each_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), SequenceMode::Static);
    let layout = tiny_layout(&path, 1);
    let open = || {
        BoundStatic::open(
            ModelFile::from(&path),
            Provider::Cpu,
            &RuntimeOptions::default(),
            &layout,
        )
        .unwrap()
    };
    let mut once = open();
    assert_eq!(once.inputs, InputBinding::Once);
    let wanted = input_locations(&once.runtime.session).unwrap();
    assert_eq!(wanted.len(), 2 + layout.state.len());
    assert!(wanted.iter().all(|&w| w == Location::Host), "{wanted:?}");
    let mut each = open();
    each.inputs = InputBinding::EachRun;
    let (a, logits_a) = greedy_run(&mut once, 6);
    let (b, logits_b) = greedy_run(&mut each, 6);
    assert_eq!(a, b);
    assert_eq!(logits_a, logits_b);
}
