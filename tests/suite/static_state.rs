//! The static state form (`--with-past static`, docs/static-state.md): fixed-size state
//! [batch, n, ·] written in place, one position per sequence. Decoded token by token and in
//! chunks (from position 0 and after a prefix) it equals the whole-sequence run and the
//! f64 reference, in tract and ONNX Runtime (`ScatterND` form) and in ONNX Runtime alone
//! (opset 24's `TensorScatter`, which tract 0.23 does not have); writing in place equals
//! copying; the trained causal g-mlp-pytorch fixtures equal PyTorch's logits; positions
//! outside 0..n fail in the graph.

use std::sync::Arc;

use crate::common::decoding::*;
use crate::common::*;
use gmlp_onnx::gmlp::targets::{BuildTarget, Target};
use gmlp_onnx::gmlp::{SequenceMode, WeightSource};
use gmlp_onnx::onnx::reader::{read_model, updates_in_place};

/// `cfg` (called `name`) written in the static form for each of [`targets`] into `dir`:
/// each file's name, path and target.
fn static_files(
    cfg: &gmlp_onnx::gmlp::GmlpConfig,
    name: &str,
    source: Arc<dyn WeightSource>,
    dir: &std::path::Path,
) -> Vec<(String, std::path::PathBuf, BuildTarget)> {
    targets(cfg)
        .into_iter()
        .map(|(label, cfg, target, _)| {
            let file = format!("{name}-{label}.onnx");
            let path = write_for(
                &cfg,
                source.clone(),
                SequenceMode::Static,
                &target,
                dir,
                &file,
            );
            (file, path, target)
        })
        .collect()
}

/// The in-place check reads the graph: each past_* input of a static file is read only by
/// the scatter that makes its present_* output; a growing file's is read by a Concat.
#[test]
fn the_in_place_check_reads_the_graph() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cfg) = causal_configs().swap_remove(4);
    let source: Arc<dyn WeightSource> = Arc::new(spread(3));
    let target = BuildTarget::at_opset(17);
    let s = write_for(
        &cfg,
        source.clone(),
        SequenceMode::Static,
        &target,
        dir.path(),
        "s.onnx",
    );
    let g = write_for(
        &cfg,
        source,
        SequenceMode::Growing,
        &target,
        dir.path(),
        "g.onnx",
    );
    let (s, g) = (read_model(&s).unwrap(), read_model(&g).unwrap());
    assert!(updates_in_place(&s, "past_sgu.0", "present_sgu.0"));
    assert!(updates_in_place(&s, "past_shift.1", "present_shift.1"));
    assert!(!updates_in_place(&s, "past_sgu.0", "present_sgu.1"));
    assert!(!updates_in_place(&s, "input_ids", "logits"));
    assert!(!updates_in_place(&g, "past_sgu.0", "present_sgu.0"));
}

/// A static-state graph reads no shape: no `Shape` or `Size` node (so nothing is computed
/// from one) and no `Range`, in every small causal configuration (heads, token shift,
/// every spatial form), at opsets 17 (`ScatterND`) and 24 (`TensorScatter`) and for the
/// portable target: its positions, masks and scatter indices come from data ops, so every
/// node can be placed on a GPU and a step captured as a CUDA graph. `--target tract`'s
/// has one `Range`, the rows up to the furthest sequence's that its step reads (sizes that
/// follow the position: not a file for a CUDA graph). The growing form, which needs the
/// state's length, keeps its `Shape` nodes.
#[test]
fn static_state_graphs_read_no_shape() {
    let dir = tempfile::tempdir().unwrap();
    let source: Arc<dyn WeightSource> = Arc::new(spread(3));
    let op_types = |path: &std::path::Path| -> Vec<String> {
        read_model(path)
            .unwrap()
            .graph
            .unwrap()
            .node
            .iter()
            .map(|n| n.op_type.clone().unwrap_or_default())
            .collect()
    };
    for (name, cfg) in causal_configs() {
        for (file, path, target) in static_files(&cfg, name, source.clone(), dir.path()) {
            let ops = op_types(&path);
            for banned in ["Shape", "Size"] {
                assert!(!ops.iter().any(|o| o == banned), "{file}: a {banned} node");
            }
            let ranges = ops.iter().filter(|o| *o == "Range").count();
            let reads_rows_reached = usize::from(target.target == Target::Tract);
            assert_eq!(ranges, reads_rows_reached, "{file}: Range nodes");
            let scatter = if target.opset >= 24 {
                "TensorScatter"
            } else {
                "ScatterND"
            };
            assert!(ops.iter().any(|o| o == scatter), "{file}: no {scatter}");
        }
        let growing = write_for(
            &cfg,
            source.clone(),
            SequenceMode::Growing,
            &BuildTarget::at_opset(17),
            dir.path(),
            &format!("{name}-growing.onnx"),
        );
        assert!(
            op_types(&growing).iter().any(|o| o == "Shape"),
            "{name}: growing"
        );
    }
}

/// The int64 values of a static-state graph: which node makes each one ("input",
/// "initializer", or the op type), found by propagating element types from the inputs,
/// initializers, `Constant`s and `Cast`s (every other op here keeps its first input's type).
fn int64_values(model: &gmlp_onnx::onnx::proto::ModelProto) -> Vec<(String, String)> {
    use std::collections::HashMap;
    const INT64: i32 = 7;
    let g = model.graph.as_ref().unwrap();
    let mut elem: HashMap<String, i32> = HashMap::new();
    for i in gmlp_onnx::onnx::reader::declared_inputs(model) {
        elem.insert(i.name, i.elem_type);
    }
    for init in &g.initializer {
        elem.insert(init.name().to_string(), init.data_type());
    }
    let mut made = Vec::new();
    for n in &g.node {
        let out_type = match n.op_type() {
            "Constant" => n
                .attribute
                .iter()
                .find_map(|a| a.t.as_ref().map(|t| t.data_type()))
                .unwrap_or(0),
            "Cast" => n
                .attribute
                .iter()
                .find(|a| a.name() == "to")
                .map_or(0, |a| a.i() as i32),
            "ArgMax" | "Shape" | "Size" => INT64,
            "Less" | "Greater" | "Equal" => 9,
            "Where" => n
                .input
                .get(1)
                .and_then(|i| elem.get(i))
                .copied()
                .unwrap_or(0),
            _ => n
                .input
                .first()
                .and_then(|i| elem.get(i))
                .copied()
                .unwrap_or(0),
        };
        for o in &n.output {
            elem.insert(o.clone(), out_type);
            if out_type == INT64 {
                made.push((o.clone(), n.op_type().to_string()));
            }
        }
    }
    made
}

/// A static-state graph does its position arithmetic in f32: its only int64 values are the
/// inputs, constants (shapes, axes) and the `Cast`s that make indices, so ONNX Runtime
/// Web's WebGPU provider (no int64 arithmetic without `enableInt64`) runs every node but
/// the two `Cast`s of the int64 inputs (docs/web.md, "WebGPU"; the consumer matrix counts
/// them in the browser). Every small causal configuration, opsets 17 and 24 and the
/// portable target; not `--target ort-gpu`, for ONNX Runtime alone (CPU and CUDA, which
/// have the int64 kernels), whose fused step computes its positions in int64.
#[test]
fn static_state_graphs_make_int64_values_by_cast_alone() {
    let dir = tempfile::tempdir().unwrap();
    let source: Arc<dyn WeightSource> = Arc::new(spread(3));
    for (name, cfg) in causal_configs() {
        for (file, path, target) in static_files(&cfg, name, source.clone(), dir.path()) {
            if target.target == Target::OnnxRuntime {
                continue;
            }
            let made = int64_values(&read_model(&path).unwrap());
            let computed: Vec<_> = made
                .iter()
                .filter(|(_, op)| op != "Cast" && op != "Constant")
                .collect();
            assert!(
                computed.is_empty(),
                "{file}: int64 values computed by {computed:?}"
            );
            assert!(
                made.iter().any(|(_, op)| op == "Cast"),
                "{file}: no index made"
            );
        }
    }
}

/// `--target ort-gpu` writes the static state with opset 24's `TensorScatter`, says so on
/// the build line, and tract (which has no `TensorScatter`) refuses the file in our words,
/// naming the runtimes that run it (exit 3: the runtime cannot run it), while the default
/// target's file says `ScatterND`.
#[test]
fn ort_gpu_files_name_their_scatter_and_tract_refuses_them_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = dir.path().join("gpu.onnx");
    let build =
        Build::amlp(1, Amlp::Tiny).args(&["--causal", "--with-past", "--target", "ort-gpu"]);
    let o = build.run(&gpu);
    assert!(o.status.success(), "{}", output_text(&o));
    let text = output_text(&o);
    assert!(
        text.contains("opset 24") && text.contains("static state (TensorScatter)"),
        "{text}"
    );
    assert_eq!(
        op_count(&gpu, "TensorScatter"),
        3,
        "sgu, key and value of the one block"
    );
    let o = gmlp(&["validate", path_str(&gpu), "--runtimes", "tract"]);
    assert_fails(
        &o,
        3,
        &[
            "tract 0.23 has no TensorScatter",
            "--runtimes ort-cpu or ort-cuda",
        ],
    );
    let ort = dir.path().join("ort.onnx");
    let o = Build::amlp(1, Amlp::Tiny)
        .args(&["--causal", "--with-past"])
        .run(&ort);
    assert!(
        output_text(&o).contains("static state (ScatterND)"),
        "{}",
        output_text(&o)
    );
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use gmlp_onnx::generation::{Decoder, DecodingModel, StateWrites};
    use gmlp_onnx::gmlp::reference::forward_tokens_stepwise;
    use gmlp_onnx::gmlp::{fused_gap, Precision};
    use gmlp_onnx::runtime::{self, RuntimeKind};
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use gmlp_onnx::validate::Tolerance;
    use ndarray::s;
    use ndarray::{Array1, Array2, ArrayD, IxDyn};

    /// Runtimes against the f64 reference, and decoding against the whole run (f32 rounding).
    const RTOL: f64 = 1e-5;

    #[test]
    fn static_decoding_equals_the_whole_sequence_and_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        for (name, cfg) in causal_configs() {
            for (target_name, cfg, target, kinds) in targets(&cfg) {
                let name = format!("{name} {target_name}");
                let source: Arc<dyn WeightSource> = Arc::new(spread(9));
                let path = checked(write_for(
                    &cfg,
                    source.clone(),
                    SequenceMode::Static,
                    &target,
                    dir.path(),
                    "s.onnx",
                ));
                let model = read_model(&path).unwrap();
                let op = if target.opset >= 24 {
                    "TensorScatter"
                } else {
                    "ScatterND"
                };
                let graph = model.graph.as_ref().unwrap();
                assert!(graph.node.iter().any(|n| n.op_type() == op), "{name}");
                assert!(
                    !graph.node.iter().any(|n| n.op_type() == "Concat"
                        && n.output.iter().any(|o| o.starts_with("present_"))),
                    "{name}: the state is not concatenated"
                );
                assert!(DecodingModel::of(&model).unwrap().in_place, "{name}");
                let (ids, reference) = ids_and_reference(&cfg, source.as_ref(), 2);
                let chunks = [5, 1, 1, 3, 2];
                let stepwise_reference =
                    forward_tokens_stepwise(&cfg, source.as_ref(), ids.view(), &chunks).unwrap();
                let mut states = Vec::new();
                for &kind in &kinds {
                    let mut decoder = Decoder::open(kind, &path, &options(), 2).unwrap();
                    assert_eq!(
                        decoder.in_place(),
                        kind == RuntimeKind::OrtCpu,
                        "{name} {}",
                        kind.name()
                    );
                    let whole = decode(&mut decoder, &ids, &[12]);
                    let whole_state = decoder.state().unwrap();
                    decoder.reset().unwrap();
                    // From position 0: a prompt, single steps, chunks after a prefix.
                    let stepwise = decode(&mut decoder, &ids, &chunks);
                    let d = rel(&stepwise, &whole);
                    assert!(d <= RTOL, "{name} {}: stepwise vs whole {d:e}", kind.name());
                    let d = rel(&stepwise, &reference);
                    assert!(d <= RTOL, "{name} {} vs reference: {d:e}", kind.name());
                    let d = rel(&stepwise, &stepwise_reference);
                    assert!(
                        d <= RTOL,
                        "{name} {} vs stepwise reference: {d:e}",
                        kind.name()
                    );
                    let state = decoder.state().unwrap();
                    assert_eq!(state.len(), whole_state.len());
                    for (a, b) in state.iter().zip(&whole_state) {
                        // Every state keeps all n = 12 rows.
                        assert_eq!(f32_of(a).shape(), &[2, 12, f32_of(a).shape()[2]]);
                        let d = rel_diff(f32_of(a), f32_of(b));
                        assert!(d <= RTOL, "{name} {} state {}: {d:e}", kind.name(), a.name);
                    }
                    let err = decoder.feed(ids.slice(s![.., ..1])).unwrap_err();
                    assert!(matches!(err, gmlp_onnx::Error::PastPositions(_)), "{err:?}");
                    states.push(state);
                }
                if states.len() == 2 {
                    for (a, b) in states[0].iter().zip(&states[1]) {
                        let d = rel_diff(f32_of(a), f32_of(b));
                        assert!(d <= RTOL, "{name}: tract vs ONNX Runtime state {d:e}");
                    }
                }
            }
        }
    }

    /// int8 static graphs (projections and head int8, spatial W in f32) track the f64
    /// reference within the int8 tolerance; f16 ones within f16's.
    #[test]
    fn int8_and_f16_static_graphs_track_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        for (name, cfg) in causal_configs() {
            for (dtype, tolerance) in [
                (Precision::Int8, Tolerance::INT8.rtol),
                (Precision::F16, 2e-2),
            ] {
                let mut q = cfg.clone();
                q.dtype = dtype;
                let source: Arc<dyn WeightSource> = Arc::new(spread(9));
                let path = checked(write_for(
                    &q,
                    source.clone(),
                    SequenceMode::Static,
                    &BuildTarget::at_opset(17),
                    dir.path(),
                    "q.onnx",
                ));
                let (ids, reference) = ids_and_reference(&cfg, source.as_ref(), 3);
                for kind in CPU_RUNTIMES {
                    let mut decoder = Decoder::open(kind, &path, &options(), 2).unwrap();
                    let stepwise = decode(&mut decoder, &ids, &[5, 1, 1, 3, 2]);
                    let d = rel(&stepwise, &reference);
                    assert!(d <= tolerance, "{name} {dtype:?} {}: {d:e}", kind.name());
                }
            }
        }
    }

    /// Writing the state in place (ONNX Runtime's I/O binding) and letting ONNX Runtime copy
    /// it every run give the same logits and state, bit for bit.
    #[test]
    fn in_place_and_copying_runs_agree_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let (_, cfg) = causal_configs().swap_remove(4);
        let source: Arc<dyn WeightSource> = Arc::new(spread(9));
        for opset in [17, 24] {
            let path = write_for(
                &cfg,
                source.clone(),
                SequenceMode::Static,
                &BuildTarget::at_opset(opset),
                dir.path(),
                "s.onnx",
            );
            let ids = ids_for(2, 12, 50, 4);
            let mut results = Vec::new();
            for writes in [StateWrites::InPlace, StateWrites::Copied] {
                let mut decoder =
                    Decoder::open_with(RuntimeKind::OrtCpu, &path, &options(), 2, writes).unwrap();
                assert_eq!(decoder.in_place(), writes == StateWrites::InPlace);
                let logits = decode(&mut decoder, &ids, &[4, 1, 1, 1, 5]);
                results.push((logits, decoder.state().unwrap()));
            }
            assert_eq!(results[0].0, results[1].0, "opset {opset}");
            for (a, b) in results[0].1.iter().zip(&results[1].1) {
                assert_eq!(f32_of(a), f32_of(b), "opset {opset} {}", a.name);
            }
        }
    }

    /// Greedy steps in ONNX Runtime take their tokens from the run itself: the session's
    /// copy of the graph ends in an `ArgMax` and a `position + 1` that write the next
    /// step's inputs, two sets used in turn. Over batches of prompts of different lengths
    /// (the sets alternate every step), two generations on one decoder (reset between) and
    /// sampled tokens (written over the graph's), the tokens equal tract's, picked on the
    /// host from its logits, at opsets 17 and 24; and a file with external data decodes
    /// through the edited copy in memory like its inline twin.
    #[test]
    fn tokens_picked_by_the_graph_equal_tracts_host_picks() {
        use gmlp_onnx::generation::{Generator, Sampling};
        use gmlp_onnx::onnx::writer::{write_model_with, ExternalData};
        let dir = tempfile::tempdir().unwrap();
        // Untied embedding and head (two heads): continuations that do not repeat the
        // last token.
        let (_, cfg) = causal_configs().swap_remove(2);
        let source: Arc<dyn WeightSource> = Arc::new(spread(9));
        let generate = |kind: RuntimeKind, path: &std::path::Path, sampling: Sampling| {
            let batches = [
                vec![vec![3, 17, 5], vec![40, 2, 9, 11, 1], vec![7]],
                vec![vec![8, 8], vec![1], vec![30, 4, 4, 12]],
            ];
            let decoder = Decoder::open(kind, path, &options(), 3).unwrap();
            assert_eq!(decoder.in_place(), kind != RuntimeKind::Tract);
            let mut generator = Generator::new(decoder, sampling).unwrap();
            batches
                .iter()
                .map(|prompts| generator.generate(prompts, 7, &mut |_| {}).unwrap().tokens)
                .collect::<Vec<_>>()
        };
        let sampled = Sampling {
            temperature: Some(1.0),
            top_k: Some(8),
            top_p: None,
            seed: 11,
        };
        let tract_file = write_for(
            &cfg,
            source.clone(),
            SequenceMode::Static,
            &BuildTarget::at_opset(17),
            dir.path(),
            "s17.onnx",
        );
        let expected = generate(RuntimeKind::Tract, &tract_file, Sampling::GREEDY);
        let distinct: std::collections::BTreeSet<i64> =
            expected.iter().flatten().flatten().copied().collect();
        assert!(distinct.len() >= 6, "continuations that vary: {expected:?}");
        let expected_sampled = generate(RuntimeKind::Tract, &tract_file, sampled);
        assert_ne!(expected_sampled, expected, "sampling differs from greedy");
        let opset24 = write_for(
            &cfg,
            source.clone(),
            SequenceMode::Static,
            &BuildTarget::at_opset(24),
            dir.path(),
            "s24.onnx",
        );
        for (opset, path) in [(17, &tract_file), (24, &opset24)] {
            let got = generate(RuntimeKind::OrtCpu, path, Sampling::GREEDY);
            assert_eq!(got, expected, "opset {opset} greedy");
            let got = generate(RuntimeKind::OrtCpu, path, sampled);
            assert_eq!(got, expected_sampled, "opset {opset} sampled");
        }
        let model = gmlp_onnx::gmlp::export::export_for(
            &cfg,
            source,
            "test",
            None,
            &BuildTarget::at_opset(17),
            SequenceMode::Static,
        )
        .unwrap();
        let external = dir.path().join("external.onnx");
        let written = write_model_with(
            &model.graph,
            &model.info,
            &external,
            ExternalData::Always,
            |_, _| {},
        )
        .unwrap();
        assert!(written.data_file.is_some());
        let got = generate(RuntimeKind::OrtCpu, &external, Sampling::GREEDY);
        assert_eq!(got, expected, "external data");
    }

    /// A position outside 0..n, or one whose T rows would pass n, fails at the graph's
    /// checking `Gather` in both runtimes (an error, no out-of-bounds read or write), and in
    /// ONNX Runtime for `--target ort-gpu`'s fused step.
    #[test]
    fn positions_outside_the_state_fail_in_the_graph() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_small_amlp(SequenceMode::Static, dir.path(), "p.onnx");
        let (_, cfg) = causal_configs().swap_remove(1);
        let fused = write_for(
            &cfg,
            Arc::new(spread(3)),
            SequenceMode::Static,
            &BuildTarget::resolve(Target::OnnxRuntime, None).unwrap(),
            dir.path(),
            "fused.onnx",
        );
        let files = CPU_RUNTIMES
            .into_iter()
            .map(|kind| (kind, &path))
            .chain([(RuntimeKind::OrtCpu, &fused)]);
        for (kind, path) in files {
            let info = DecodingModel::read(path).unwrap().info;
            let mut rt = runtime::open(kind, path, &options()).unwrap();
            for (positions, tokens) in [([0, 12], 1), ([-1, 0], 1), ([0, 10], 3), ([-100, 0], 1)] {
                let err = rt.run(&static_feed(&info, tokens, &positions, 12));
                assert!(err.is_err(), "{} positions {positions:?}", kind.name());
            }
            // In range, the same file runs.
            rt.run(&static_feed(&info, 2, &[0, 10], 12)).unwrap();
        }
    }

    /// The trained causal g-mlp-pytorch fixtures through the static form, prefill, single
    /// steps and a last chunk, equal PyTorch's stored logits at every position (both
    /// runtimes at opset 17, ONNX Runtime at opset 24 and in `--target ort-gpu`'s fused
    /// step).
    #[test]
    fn causal_pytorch_fixtures_through_static_state_match_pytorch() {
        let dir = tempfile::tempdir().unwrap();
        for name in LUCID_CAUSAL {
            let fx = CausalFixture::open(name);
            let builds = [
                ("opset 17", BuildTarget::at_opset(17), CPU_RUNTIMES.to_vec()),
                (
                    "opset 24",
                    BuildTarget::at_opset(24),
                    vec![RuntimeKind::OrtCpu],
                ),
                (
                    "ort-gpu",
                    BuildTarget::resolve(Target::OnnxRuntime, None).unwrap(),
                    vec![RuntimeKind::OrtCpu],
                ),
            ];
            for (label, target, kinds) in builds {
                // onnxruntime refuses the token shift's fixture (ort_gpu_step_equals_… checks it).
                if fused_gap(&fx.cfg, SequenceMode::Static, target.opset).is_some()
                    && target.target == Target::OnnxRuntime
                {
                    continue;
                }
                let path = write_for(
                    &fx.cfg,
                    fx.weights.clone(),
                    SequenceMode::Static,
                    &target,
                    dir.path(),
                    "f.onnx",
                );
                for kind in kinds {
                    let mut decoder =
                        Decoder::open(kind, &path, &options(), fx.ids.nrows()).unwrap();
                    let logits = decode(&mut decoder, &fx.ids, &fx.chunks);
                    let what = format!("{label} {}", kind.name());
                    let d = fx.assert_matches_pytorch(&logits, &what);
                    eprintln!("{name} {what} static vs PyTorch: {d:.2e}");
                }
            }
        }
    }

    /// The first quarter of each row of a fixture's `input_ids`: the prompts of the
    /// greedy checks.
    fn quarter_prompts(fx: &Fixture) -> Vec<Vec<i64>> {
        let ids = fx.ids("input_ids");
        ids.rows()
            .into_iter()
            .map(|r| r.iter().take(ids.ncols() / 4).copied().collect())
            .collect()
    }

    /// ‖a − b‖ / ‖b‖ over every value (b the reference), in f64.
    fn normwise(a: &Array2<f32>, b: &Array2<f32>) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (d / n).sqrt()
    }

    /// `--target ort-gpu`'s fused step equals the default file on every causal checkpoint
    /// fixture that has a static state (g-mlp-pytorch's gMLP, aMLP and token-shift aMLP;
    /// g-mlp-gpt's one- and two-head, attention and gate-activation models; gmlp-tinygrad's
    /// causal fixture is a backbone without tokens, and g-mlp-gpt's windowed, folded and reversible fixtures have local mixing, which only the
    /// growing state holds): the same greedy tokens (prompt a quarter of the fixture's ids, 8 new
    /// tokens, both sequences of the batch) in tract and ONNX Runtime for the default file and
    /// ONNX Runtime for the fused one, and prefill logits within 1e-5 (normwise relative).
    #[test]
    fn ort_gpu_step_equals_the_default_file_on_every_causal_fixture() {
        let dir = tempfile::tempdir().unwrap();
        for name in LUCID_CAUSAL.into_iter().chain([
            "gpt_tokens",
            "gpt_heads2_attn",
            "gpt_act_sigmoid",
            "gpt_act_tanh",
        ]) {
            let fx = Fixture::open(name);
            let prompts = quarter_prompts(&fx);
            let plain = dir.path().join(format!("{name}.onnx"));
            let fused = dir.path().join(format!("{name}-ort-gpu.onnx"));
            fx.build("model.safetensors", &["--with-past", "static"], &plain);
            let flags = fx.flags();
            let fused_build = Build::weights(&fx.dir.join("model.safetensors"))
                .args(&flags.iter().map(String::as_str).collect::<Vec<_>>())
                .args(&["--with-past", "static", "--target", "ort-gpu"]);
            if flags.iter().any(|f| f == "--shift-tokens") {
                // The fused kernels read a static state's rows in i64 and have no token
                // shift over them: refused, naming it, and nothing written.
                let o = fused_build.run(&fused);
                let text = output_text(&o);
                assert!(!o.status.success(), "{name}: {text}");
                assert!(
                    text.contains("do not cover the token shift of a static state"),
                    "{name}: {text}"
                );
                assert!(!fused.exists(), "{name}: a refused build wrote a file");
                continue;
            }
            fused_build.write(&fused);
            let run = |kind: RuntimeKind, path: &std::path::Path| {
                let decoder = Decoder::open(kind, path, &options(), prompts.len()).unwrap();
                greedy(decoder, &prompts, 8)
            };
            let (tokens, logits, _) = run(RuntimeKind::OrtCpu, &fused);
            for kind in CPU_RUNTIMES {
                let (want, want_logits, _) = run(kind, &plain);
                assert_eq!(
                    tokens,
                    want,
                    "{name}: ort-gpu vs default in {}",
                    kind.name()
                );
                let d = normwise(&logits[0], &want_logits[0]);
                eprintln!(
                    "{name}: prefill logits ort-gpu vs default in {}: {d:.2e}",
                    kind.name()
                );
                assert!(d <= 1e-5, "{name} {}: {d:.2e}", kind.name());
            }
        }
    }

    /// `--target tract`, the default file's step with each state read as written (no copy
    /// of every state every step), equals the default file on every causal checkpoint
    /// fixture with a static state, the token shift's included: the same greedy tokens
    /// (prompt a quarter of the fixture's ids, 8 new tokens, both sequences of the batch)
    /// and the logits of every run within 1e-6 (normwise relative), in tract and in ONNX
    /// Runtime; its file has no read of the written rows and declares `state_start:
    /// zeroed`.
    #[test]
    fn tract_target_step_equals_the_default_file_on_every_causal_fixture() {
        use gmlp_onnx::gmlp::interface::StateStart;
        let dir = tempfile::tempdir().unwrap();
        let written_row_reads = |p: &std::path::Path| {
            let model = read_model(p).unwrap();
            let graph = model.graph.unwrap();
            graph
                .node
                .iter()
                .filter(|n| n.name().ends_with("_written_rows"))
                .count()
        };
        for name in
            LUCID_CAUSAL
                .into_iter()
                .chain(["gpt_tokens", "gpt_heads2_attn", "gpt_act_tanh"])
        {
            let fx = Fixture::open(name);
            let prompts = quarter_prompts(&fx);
            let plain = dir.path().join(format!("{name}.onnx"));
            let tract = dir.path().join(format!("{name}-tract.onnx"));
            fx.build("model.safetensors", &["--with-past", "static"], &plain);
            fx.build(
                "model.safetensors",
                &["--with-past", "static", "--target", "tract"],
                &tract,
            );
            let start = |p: &std::path::Path| DecodingModel::read(p).unwrap().info.state_start;
            assert_eq!(start(&plain), StateStart::Any, "{name}");
            assert_eq!(start(&tract), StateStart::Zeroed, "{name}");
            assert!(
                written_row_reads(&plain) > 0,
                "{name}: the default file's guard"
            );
            assert_eq!(
                written_row_reads(&tract),
                0,
                "{name}: a copy left in the tract file"
            );
            for kind in CPU_RUNTIMES {
                let run = |path: &std::path::Path| {
                    let decoder = Decoder::open(kind, path, &options(), prompts.len()).unwrap();
                    greedy(decoder, &prompts, 8)
                };
                let (want, want_logits, _) = run(&plain);
                let (tokens, logits, _) = run(&tract);
                assert_eq!(
                    tokens,
                    want,
                    "{name}: tract target vs default in {}",
                    kind.name()
                );
                assert_eq!(logits.len(), want_logits.len());
                let worst = logits
                    .iter()
                    .zip(&want_logits)
                    .map(|(a, b)| normwise(a, b))
                    .fold(0.0, f64::max);
                eprintln!(
                    "{name}: every run's logits, tract target vs default in {}: {worst:.2e}",
                    kind.name()
                );
                assert!(worst <= 1e-6, "{name} {}: {worst:.2e}", kind.name());
            }
        }
    }

    /// One greedy continuation of `prompt` [batch, T] by `steps` tokens, driving the file
    /// run by run with every `past_*` buffer starting as `fill` (NaN or 0) and each run's
    /// `present_*` fed back: the tokens and every run's last logits. Also checks that the
    /// rows after the prompt still hold `fill` in the first run's `present_*` outputs (the
    /// buffer really reached the graph and was written only at the new rows).
    fn greedy_from_state(
        kind: RuntimeKind,
        path: &std::path::Path,
        prompt: &Array2<i64>,
        steps: usize,
        fill: f32,
    ) -> (Vec<Vec<i64>>, Vec<ArrayD<f32>>) {
        let info = DecodingModel::read(path).unwrap().info;
        let (batch, t) = prompt.dim();
        let n = info.max_sequence;
        let mut state: Vec<NamedTensor> = info
            .state
            .iter()
            .map(|s| NamedTensor {
                name: s.past.clone(),
                value: TensorValue::F32(ArrayD::from_elem(IxDyn(&[batch, n, s.width]), fill)),
            })
            .collect();
        let mut rt = runtime::open(kind, path, &options()).unwrap();
        let (mut ids, mut position) = (prompt.clone(), 0i64);
        let mut tokens = vec![Vec::new(); batch];
        let mut all_logits = Vec::new();
        for step in 0..=steps {
            let mut feed = vec![
                NamedTensor {
                    name: "input_ids".into(),
                    value: TensorValue::I64(ids.clone().into_dyn()),
                },
                NamedTensor {
                    name: "position".into(),
                    value: TensorValue::I64(Array1::from_elem(batch, position).into_dyn()),
                },
            ];
            feed.extend(state.iter().cloned());
            let out = rt
                .run(&feed)
                .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
            position += ids.ncols() as i64;
            let logits = out.iter().find(|o| o.name == "logits").unwrap();
            let logits = f32_of(logits);
            let last = logits
                .slice(s![.., logits.shape()[1] - 1, ..])
                .to_owned()
                .into_dyn();
            let picked = argmax_rows(&last);
            all_logits.push(last);
            for (b, &id) in picked.iter().enumerate() {
                tokens[b].push(id as i64);
            }
            for (past, s) in state.iter_mut().zip(&info.state) {
                let present = out.iter().find(|o| o.name == s.present).unwrap();
                if step == 0 {
                    let rest = f32_of(present).slice(s![.., t.., ..]).to_owned();
                    assert!(
                        rest.iter().all(|v| v.to_bits() == fill.to_bits()),
                        "{}: {} rows after the prompt changed",
                        kind.name(),
                        s.present
                    );
                }
                past.value = present.value.clone();
            }
            ids = Array2::from_shape_vec((batch, 1), picked.iter().map(|&i| i as i64).collect())
                .unwrap();
        }
        (tokens, all_logits)
    }

    /// Unwritten state rows never reach an output: with every `past_*` buffer NaN before
    /// the prompt, the greedy tokens and the logits of every run equal those from a state
    /// of zeros (the graph reads the rows after each sequence's last one as 0 through a
    /// `Where`; a causal weight of 0 times NaN would be NaN). Third-party causal checkpoints
    /// (g-mlp-pytorch gMLP, aMLP and token-shift aMLP; g-mlp-gpt global layers, one and two
    /// heads with attention) built by the CLI, in tract and ONNX Runtime at opset 17
    /// (`ScatterND`), in ONNX Runtime at opset 24 (`TensorScatter`).
    #[test]
    fn nan_in_unwritten_state_rows_changes_no_token() {
        let dir = tempfile::tempdir().unwrap();
        for name in LUCID_CAUSAL
            .into_iter()
            .chain(["gpt_tokens", "gpt_heads2_attn"])
        {
            let fx = Fixture::open(name);
            let ids = fx.ids("input_ids");
            let (batch, n) = ids.dim();
            let prompt = ids.slice(s![.., ..n / 4]).to_owned();
            let steps = 6;
            for (opset, kinds) in [(17, CPU_RUNTIMES.to_vec()), (24, vec![RuntimeKind::OrtCpu])] {
                let path = dir.path().join(format!("{name}-{opset}.onnx"));
                let opset_arg = opset.to_string();
                fx.build(
                    "model.safetensors",
                    &["--with-past", "static", "--opset", &opset_arg],
                    &path,
                );
                for &kind in &kinds {
                    let (zero_tokens, zero_logits) =
                        greedy_from_state(kind, &path, &prompt, steps, 0.0);
                    let (nan_tokens, nan_logits) =
                        greedy_from_state(kind, &path, &prompt, steps, f32::NAN);
                    eprintln!(
                        "{name} opset {opset} {}: tokens {:?}",
                        kind.name(),
                        zero_tokens
                    );
                    assert_eq!(zero_tokens.len(), batch);
                    assert_eq!(
                        nan_tokens,
                        zero_tokens,
                        "{name} opset {opset} {}",
                        kind.name()
                    );
                    for (step, (a, b)) in nan_logits.iter().zip(&zero_logits).enumerate() {
                        assert!(
                            a.iter().all(|v| v.is_finite()),
                            "{name} opset {opset} {} run {step}: non-finite logits",
                            kind.name()
                        );
                        assert_eq!(a, b, "{name} opset {opset} {} run {step}", kind.name());
                    }
                }
            }
        }
    }

    /// The same through ONNX Runtime's I/O binding, the state written in place (as
    /// `generate` and docs/static-state.md's loop run it): buffers that start as NaN
    /// (never written by the tool) give the greedy tokens and logits of zeroed ones.
    #[test]
    fn nan_buffers_bound_in_place_give_the_tokens_of_zeroed_ones() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "lucid_tokens_causal",
            "lucid_amlp_causal",
            "gpt_heads2_attn",
        ] {
            let fx = Fixture::open(name);
            let prompt = quarter_prompts(&fx);
            let path = dir.path().join(format!("{name}.onnx"));
            fx.build("model.safetensors", &["--with-past", "static"], &path);
            let prompt_json = serde_json::to_string(&prompt).unwrap();
            let out = run_python(NAN_LOOP, &[&path, std::path::Path::new(&prompt_json)]);
            let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            eprintln!("{name} in place: {r}");
            assert_eq!(r["nan_tokens"], r["tokens"], "{name}");
            assert_eq!(r["finite"], true, "{name}: non-finite logits");
            assert_eq!(r["equal"], true, "{name}: logits differ");
            if name == "lucid_amlp_causal" {
                zeroed_state_is_a_real_contract(&fx, &path, &prompt_json, &r, dir.path());
            }
        }
    }

    /// `--target ort-gpu`'s fused step and `--target tract`'s read the state as written, so
    /// their files declare `state_start: zeroed` (the default file does not), their logits
    /// do turn non-finite when a loop leaves NaN in the buffers (the contract is real), a
    /// loop that starts from zeros (as every loop the project ships does) gets the default
    /// file's greedy tokens, and genai, which does not zero its buffers on every device,
    /// refuses the files. The fused step reads all n rows, so NaN anywhere reaches its
    /// logits; the tract target's reads the rows up to the furthest sequence's last one, so
    /// NaN reaches them from the rows a sequence behind that one has not written (the loop
    /// holding the batch's last sequence at position 0), and not from the rows no sequence
    /// has reached (the plain loop stays finite).
    fn zeroed_state_is_a_real_contract(
        fx: &Fixture,
        plain: &std::path::Path,
        prompt_json: &str,
        plain_run: &serde_json::Value,
        dir: &std::path::Path,
    ) {
        use gmlp_onnx::gmlp::interface::StateStart;
        let fused = dir.join("fused.onnx");
        fx.build(
            "model.safetensors",
            &["--with-past", "static", "--target", "ort-gpu"],
            &fused,
        );
        let start = |p: &std::path::Path| DecodingModel::read(p).unwrap().info.state_start;
        assert_eq!(start(plain), StateStart::Any);
        assert_eq!(start(&fused), StateStart::Zeroed);
        let tract = dir.join("tract.onnx");
        fx.build(
            "model.safetensors",
            &["--with-past", "static", "--target", "tract"],
            &tract,
        );
        assert_eq!(start(&tract), StateStart::Zeroed);
        let nan_loop = |file: &std::path::Path, hold: bool| {
            let mut args = vec![file, std::path::Path::new(prompt_json)];
            if hold {
                args.push(std::path::Path::new("hold"));
            }
            let out = run_python(NAN_LOOP, &args);
            let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            r
        };
        for (label, file) in [("ort-gpu", &fused), ("tract target", &tract)] {
            let r = nan_loop(file, false);
            eprintln!("{label} in place: {r}");
            assert_eq!(r["tokens"], plain_run["tokens"], "{label}: zeroed buffers");
            let reads_every_row = label == "ort-gpu";
            assert_eq!(
                r["finite"], !reads_every_row,
                "{label}: NaN in the rows no sequence reached, read (fused) or not (tract)"
            );
            let held = nan_loop(file, true);
            eprintln!("{label} in place, last sequence held at 0: {held}");
            assert_eq!(
                held["finite"], false,
                "{label}: NaN buffers left no mark on a step that reads them as written"
            );
            let folder = dir.join(format!("genai-{}", label.replace(' ', "-")));
            let o = gmlp(&["genai", path_str(file), "--out", path_str(&folder)]);
            assert_fails(&o, 2, &["must start zeroed", "--target ort"]);
            assert!(!folder.exists(), "genai wrote a folder it refused");
        }
    }

    /// The in-place loop of docs/static-state.md run twice, every state buffer starting as
    /// 0 and then as NaN: the greedy tokens of both (`tokens`, `nan_tokens`), whether the
    /// NaN run's logits are all finite and equal the zero run's. With a third argument
    /// (`hold`) the batch's last sequence is kept at position 0 after the prompt, its row 0
    /// rewritten every step while the others advance (it never writes the rows after its
    /// prompt).
    const NAN_LOOP: &str = r#"
import json, sys
import numpy as np, onnxruntime as ort
path, prompt = sys.argv[1], json.loads(sys.argv[2])
hold = len(sys.argv) > 3
so = ort.SessionOptions()
so.log_severity_level = 3
sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
pasts = [i for i in sess.get_inputs() if i.name.startswith("past_")]
batch = len(prompt)
runs = []
for fill in (0.0, float("nan")):
    values = {i.name: ort.OrtValue.ortvalue_from_numpy(np.full([batch] + i.shape[1:], fill, np.float32))
              for i in pasts}
    binding = sess.io_binding()
    binding.bind_output("logits")
    for name, v in values.items():
        binding.bind_ortvalue_input(name, v)
        binding.bind_ortvalue_output(name.replace("past_", "present_", 1), v)
    ids, position = np.array(prompt, np.int64), np.zeros([batch], np.int64)
    tokens, logits = [], []
    for _ in range(7):
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("position", position)
        binding.bind_output("logits")
        sess.run_with_iobinding(binding)
        last = binding.get_outputs()[0].numpy()[:, -1]
        position += ids.shape[1]
        if hold:
            position[-1] = 0
        ids = last.argmax(-1)[:, None]
        tokens.append(ids[:, 0].tolist())
        logits.append(last)
    runs.append((tokens, np.stack(logits)))
(zt, zl), (nt, nl) = runs
print(json.dumps({"tokens": zt, "nan_tokens": nt, "finite": bool(np.isfinite(nl).all()),
                  "equal": bool(np.array_equal(zl, nl))}))
"#;
}
