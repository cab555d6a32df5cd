//! The static state form (`--with-past static`, docs/static-state.md): fixed-size state
//! [batch, n, ·] written in place, one position per sequence. Decoded token by token and in
//! chunks (from position 0 and after a prefix) it equals the whole-sequence run and the
//! f64 reference, in tract and ONNX Runtime (`ScatterND` form) and in ONNX Runtime alone
//! (opset 24's `TensorScatter`, which tract 0.23 does not have); the trained causal
//! g-mlp-pytorch fixtures equal PyTorch's logits; a batch of sequences at different
//! positions equals each sequence decoded alone; positions outside 0..n fail in the graph.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use gmlp_onnx::checkpoint::{Import, ImportHints};
use gmlp_onnx::gmlp::export::export_for;
use gmlp_onnx::gmlp::reference::{forward_tokens, forward_tokens_stepwise};
use gmlp_onnx::gmlp::targets::{BuildTarget, Target};
use gmlp_onnx::gmlp::{GmlpConfig, Precision, SequenceMode, SpatialForm, Task, WeightSource};
use gmlp_onnx::onnx::reader::{read_model, updates_in_place};
use gmlp_onnx::onnx::writer::write_model;
use gmlp_onnx::runtime::decoder::{Decoder, DecodingModel};
use gmlp_onnx::runtime::{self, RuntimeKind};
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use gmlp_onnx::validate::Tolerance;
use ndarray::{concatenate, s, Array1, Array2, Array3, ArrayD, Axis, IxDyn};
use safetensors::SafeTensors;

/// max|ours − PyTorch| / max|PyTorch| allowed (expect ~1e-6).
const PYTORCH_RTOL: f64 = 1e-4;
/// Runtimes against the f64 reference, and decoding against the whole run (f32 rounding).
const RTOL: f64 = 1e-5;

fn write_for(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    mode: SequenceMode,
    target: &BuildTarget,
    dir: &Path,
    name: &str,
) -> PathBuf {
    let model = export_for(cfg, source, "test", None, target, mode).expect("export");
    let path = dir.join(name);
    write_model(&model.graph, &model.info, &path, |_, _| {}).expect("write");
    path
}

fn ids_for(batch: usize, len: usize, vocab: usize, salt: usize) -> Array2<i64> {
    Array2::from_shape_fn((batch, len), |(b, t)| {
        ((b * 31 + t * 17 + salt * 7 + t * t) % vocab) as i64
    })
}

/// Feeds `ids` in `chunks` and returns the logits of every position.
fn decode(decoder: &mut Decoder, ids: &Array2<i64>, chunks: &[usize]) -> Array3<f32> {
    let mut parts = Vec::new();
    let mut start = 0;
    for &len in chunks {
        let logits = decoder
            .feed(ids.slice(s![.., start..start + len]))
            .unwrap_or_else(|e| panic!("{} chunk {start}+{len}: {e}", decoder.runtime_name()));
        parts.push(logits);
        start += len;
    }
    let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
    concatenate(Axis(1), &views).unwrap()
}

fn rel(a: &Array3<f32>, b: &Array3<f32>) -> f64 {
    rel_diff(&a.clone().into_dyn(), &b.clone().into_dyn())
}

fn f32_of(t: &NamedTensor) -> &ArrayD<f32> {
    match &t.value {
        TensorValue::F32(a) => a,
        other => panic!("{}: f32 expected, got {other:?}", t.name),
    }
}

/// The small causal models of tests/generation.rs: gMLP and aMLP, the three spatial forms,
/// heads 1 and 2, untied head, token shift 1 and 2.
fn causal_configs() -> Vec<(&'static str, GmlpConfig)> {
    let mut out = Vec::new();
    for (name, spatial, attn, heads, shift) in [
        ("gmlp-gather", SpatialForm::ToeplitzGather, None, 1, 0),
        ("amlp-gather", SpatialForm::ToeplitzGather, Some(8), 1, 0),
        ("amlp-dense-heads2", SpatialForm::Dense, Some(8), 2, 0),
        (
            "gmlp-expand-heads2",
            SpatialForm::ToeplitzExpand,
            None,
            2,
            0,
        ),
        (
            "amlp-gather-shift2",
            SpatialForm::ToeplitzGather,
            Some(8),
            1,
            2,
        ),
        ("gmlp-dense-heads2-shift1", SpatialForm::Dense, None, 2, 1),
    ] {
        let mut cfg = tiny_tokens(spatial, attn, true);
        cfg.heads = heads;
        cfg.shift_tokens = shift;
        if heads > 1 {
            if let Task::Tokens { tied_embedding, .. } = &mut cfg.task {
                *tied_embedding = false;
            }
        }
        out.push((name, cfg));
    }
    out
}

/// The builds every decoding check runs on: opset 17 (`ScatterND`, both runtimes), the
/// portable target (opset 13, Toeplitz W expanded, primitive LayerNorm) and opset 24
/// (`TensorScatter`: ONNX Runtime only).
fn targets(cfg: &GmlpConfig) -> Vec<(&'static str, GmlpConfig, BuildTarget, Vec<RuntimeKind>)> {
    let mut portable = cfg.clone();
    portable.spatial = Target::Portable.spatial_for(portable.spatial);
    vec![
        (
            "opset17",
            cfg.clone(),
            BuildTarget::at_opset(17),
            CPU_RUNTIMES.to_vec(),
        ),
        (
            "portable",
            portable,
            BuildTarget::resolve(Target::Portable, None).unwrap(),
            CPU_RUNTIMES.to_vec(),
        ),
        (
            "opset24",
            cfg.clone(),
            BuildTarget::at_opset(24),
            vec![RuntimeKind::OrtCpu],
        ),
    ]
}

#[test]
fn static_decoding_equals_the_whole_sequence_and_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for (name, cfg) in causal_configs() {
        for (target_name, cfg, target, kinds) in targets(&cfg) {
            let name = format!("{name} {target_name}");
            let source: Arc<dyn WeightSource> = Arc::new(spread(9));
            let path = write_for(
                &cfg,
                source.clone(),
                SequenceMode::Static,
                &target,
                dir.path(),
                "s.onnx",
            );
            onnx_check(std::slice::from_ref(&path));
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
            let ids = ids_for(2, 12, 50, 2);
            let reference = forward_tokens(&cfg, source.as_ref(), ids.view()).unwrap();
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
                decoder.reset();
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
                assert!(
                    err.to_string()
                        .contains("would pass the model's 12 positions"),
                    "{err}"
                );
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
            let path = write_for(
                &q,
                source.clone(),
                SequenceMode::Static,
                &BuildTarget::at_opset(17),
                dir.path(),
                "q.onnx",
            );
            onnx_check(std::slice::from_ref(&path));
            let ids = ids_for(2, 12, 50, 3);
            let reference = forward_tokens(&cfg, source.as_ref(), ids.view()).unwrap();
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
        for in_place in [true, false] {
            let mut decoder = Decoder::open(RuntimeKind::OrtCpu, &path, &options(), 2).unwrap();
            decoder.set_in_place(in_place);
            assert_eq!(decoder.in_place(), in_place);
            let logits = decode(&mut decoder, &ids, &[4, 1, 1, 1, 5]);
            results.push((logits, decoder.state().unwrap()));
        }
        assert_eq!(results[0].0, results[1].0, "opset {opset}");
        for (a, b) in results[0].1.iter().zip(&results[1].1) {
            assert_eq!(f32_of(a), f32_of(b), "opset {opset} {}", a.name);
        }
    }
}

/// Greedy continuation of every sequence: prompts fed together, then `steps` tokens.
fn greedy(
    decoder: &mut Decoder,
    prompts: &[Vec<i64>],
    steps: usize,
) -> (Vec<Vec<i64>>, Vec<Array2<f32>>) {
    let mut logits = decoder.feed_prompts(prompts).unwrap();
    let mut tokens = vec![Vec::new(); prompts.len()];
    let mut all = vec![logits.clone()];
    for k in 0..steps {
        let next: Vec<i64> = logits
            .outer_iter()
            .map(|row| {
                row.iter()
                    .enumerate()
                    .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
                    .0 as i64
            })
            .collect();
        for (t, n) in tokens.iter_mut().zip(&next) {
            t.push(*n);
        }
        if k + 1 == steps {
            break;
        }
        let ids = Array2::from_shape_vec((prompts.len(), 1), next).unwrap();
        logits = decoder
            .feed(ids.view())
            .unwrap()
            .index_axis(Axis(1), 0)
            .to_owned();
        all.push(logits.clone());
    }
    (tokens, all)
}

/// Prompts of different lengths decoded together (one state batch, each sequence at its
/// own position) give each sequence the logits and greedy tokens it gets alone.
#[test]
fn batched_sequences_at_different_positions_equal_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    for (name, cfg) in causal_configs() {
        let source: Arc<dyn WeightSource> = Arc::new(spread(11));
        let path = write_for(
            &cfg,
            source.clone(),
            SequenceMode::Static,
            &BuildTarget::at_opset(17),
            dir.path(),
            "b.onnx",
        );
        let prompts: Vec<Vec<i64>> = [3usize, 7, 1, 5]
            .iter()
            .enumerate()
            .map(|(b, &len)| {
                (0..len)
                    .map(|t| ((b * 13 + t * 7 + 1) % 50) as i64)
                    .collect()
            })
            .collect();
        let steps = 4;
        for kind in CPU_RUNTIMES {
            let mut together = Decoder::open(kind, &path, &options(), prompts.len()).unwrap();
            let (tokens, logits) = greedy(&mut together, &prompts, steps);
            assert_eq!(
                together.positions(),
                &[3 + steps - 1, 7 + steps - 1, steps, 5 + steps - 1][..]
            );
            for (b, prompt) in prompts.iter().enumerate() {
                let mut alone = Decoder::open(kind, &path, &options(), 1).unwrap();
                let (own_tokens, own_logits) =
                    greedy(&mut alone, std::slice::from_ref(prompt), steps);
                assert_eq!(
                    own_tokens[0],
                    tokens[b],
                    "{name} {} sequence {b}",
                    kind.name()
                );
                for (k, (a, o)) in logits.iter().zip(&own_logits).enumerate() {
                    let a = a.row(b).to_owned().into_dyn();
                    let o = o.row(0).to_owned().into_dyn();
                    let d = rel_diff(&a, &o);
                    assert!(
                        d <= RTOL,
                        "{name} {} sequence {b} step {k}: {d:e}",
                        kind.name()
                    );
                }
                // And the f64 reference on the sequence's own tokens.
                let mut seq = prompt.clone();
                seq.extend(&own_tokens[0][..steps - 1]);
                let ids = Array2::from_shape_vec((1, seq.len()), seq.clone()).unwrap();
                let reference = forward_tokens(&cfg, source.as_ref(), ids.view()).unwrap();
                let last = reference
                    .slice(s![0, seq.len() - 1, ..])
                    .to_owned()
                    .into_dyn();
                let got = logits[steps - 1].row(b).to_owned().into_dyn();
                let d = rel_diff(&got, &last);
                assert!(
                    d <= RTOL,
                    "{name} {} sequence {b} vs reference: {d:e}",
                    kind.name()
                );
            }
        }
    }
}

/// A growing-state model has one position for the whole batch: prompts of different
/// lengths are refused with a one-line message, prompts of one length decode.
#[test]
fn growing_state_refuses_prompts_of_different_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cfg) = causal_configs().swap_remove(1);
    let path = write_for(
        &cfg,
        Arc::new(spread(3)),
        SequenceMode::WithPast,
        &BuildTarget::at_opset(17),
        dir.path(),
        "g.onnx",
    );
    let mut decoder = Decoder::open(RuntimeKind::OrtCpu, &path, &options(), 2).unwrap();
    let err = decoder
        .feed_prompts(&[vec![1, 2, 3], vec![4]])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prompts of different lengths (1 and 3 tokens) need a static-state model"),
        "{err}"
    );
    assert!(!err.contains('\n'));
    let logits = decoder
        .feed_prompts(&[vec![1, 2, 3], vec![4, 5, 6]])
        .unwrap();
    assert_eq!(logits.dim(), (2, 50));
    assert_eq!(decoder.positions(), &[3, 3][..]);
    assert!(!DecodingModel::read(&path).unwrap().in_place);
}

/// A position outside 0..n, or one whose T rows would pass n, fails at the graph's
/// checking `Gather` in both runtimes (an error, no out-of-bounds read or write).
#[test]
fn positions_outside_the_state_fail_in_the_graph() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cfg) = causal_configs().swap_remove(1);
    let path = write_for(
        &cfg,
        Arc::new(spread(3)),
        SequenceMode::Static,
        &BuildTarget::at_opset(17),
        dir.path(),
        "p.onnx",
    );
    let info = DecodingModel::read(&path).unwrap().info;
    let state: Vec<NamedTensor> = info
        .state
        .iter()
        .map(|s| NamedTensor {
            name: s.past.clone(),
            value: TensorValue::F32(ArrayD::zeros(IxDyn(&[2, 12, s.width]))),
        })
        .collect();
    for kind in CPU_RUNTIMES {
        let mut rt = runtime::open(kind, &path, &options()).unwrap();
        for (positions, tokens) in [([0, 12], 1), ([-1, 0], 1), ([0, 10], 3), ([-100, 0], 1)] {
            let mut feed = vec![
                NamedTensor {
                    name: "input_ids".into(),
                    value: TensorValue::I64(Array2::<i64>::ones((2, tokens)).into_dyn()),
                },
                NamedTensor {
                    name: "position".into(),
                    value: TensorValue::I64(Array1::from(positions.to_vec()).into_dyn()),
                },
            ];
            feed.extend(state.iter().cloned());
            let err = rt.run(&feed);
            assert!(err.is_err(), "{} positions {positions:?}", kind.name());
        }
        // In range, the same file runs.
        let mut feed = vec![
            NamedTensor {
                name: "input_ids".into(),
                value: TensorValue::I64(Array2::<i64>::ones((2, 2)).into_dyn()),
            },
            NamedTensor {
                name: "position".into(),
                value: TensorValue::I64(Array1::from(vec![0i64, 10]).into_dyn()),
            },
        ];
        feed.extend(state.iter().cloned());
        rt.run(&feed).unwrap();
    }
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
        SequenceMode::WithPast,
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

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn fixture_io(name: &str) -> (Array2<i64>, Array3<f32>) {
    let bytes = std::fs::read(fixture(name).join("io.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let Some(TensorValue::I64(ids)) = safetensors_tensor(&st, "input_ids") else {
        panic!("{name}: input_ids")
    };
    let Some(TensorValue::F32(logits)) = safetensors_tensor(&st, "logits") else {
        panic!("{name}: logits")
    };
    (
        ids.into_dimensionality().unwrap(),
        logits.into_dimensionality().unwrap(),
    )
}

/// The trained causal g-mlp-pytorch fixtures through the static form, prefill, single
/// steps and a last chunk, equal PyTorch's stored logits at every position (both
/// runtimes at opset 17, ONNX Runtime at opset 24).
#[test]
fn causal_pytorch_fixtures_through_static_state_match_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    for (name, shift_tokens) in [
        ("lucid_tokens_causal", 0),
        ("lucid_amlp_causal", 0),
        ("lucid_shift_causal", 2),
    ] {
        let hints = ImportHints {
            causal: true,
            shift_tokens,
            ..ImportHints::default()
        };
        let import = Import::open(&fixture(name).join("model.safetensors"), &hints).unwrap();
        let cfg = import.config.clone();
        let weights: Arc<dyn WeightSource> = Arc::new(import.weights(&cfg));
        let (ids, pytorch) = fixture_io(name);
        let (batch, n) = ids.dim();
        let mut chunks = vec![n / 2];
        chunks.extend(std::iter::repeat_n(1, 8));
        chunks.push(n - n / 2 - 8);
        for (opset, kinds) in [(17, CPU_RUNTIMES.to_vec()), (24, vec![RuntimeKind::OrtCpu])] {
            let path = write_for(
                &cfg,
                weights.clone(),
                SequenceMode::Static,
                &BuildTarget::at_opset(opset),
                dir.path(),
                "f.onnx",
            );
            for kind in kinds {
                let mut decoder = Decoder::open(kind, &path, &options(), batch).unwrap();
                let logits = decode(&mut decoder, &ids, &chunks);
                let d = rel(&logits, &pytorch);
                eprintln!(
                    "{name} opset {opset}: {} static vs PyTorch: {d:.2e}",
                    kind.name()
                );
                assert!(d <= PYTORCH_RTOL, "{name} {}: {d:e}", kind.name());
                for t in 0..n {
                    let d = rel_diff(
                        &logits.slice(s![.., t, ..]).to_owned().into_dyn(),
                        &pytorch.slice(s![.., t, ..]).to_owned().into_dyn(),
                    );
                    assert!(
                        d <= PYTORCH_RTOL,
                        "{name} {} position {t}: {d:e}",
                        kind.name()
                    );
                }
            }
        }
    }
}

/// The command line: a plain `--with-past` is the static form (inspect says so, validate
/// decodes it with the state written in place in ONNX Runtime, tract agreeing), and
/// `generate --prompts-file` decodes prompts of different lengths together with the
/// tokens each gets alone, in both runtimes.
#[test]
fn cli_builds_validates_and_generates_a_batch_with_static_state() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("static.onnx");
    let report = dir.path().join("report.json");
    let checkpoint = fixture("lucid_amlp_causal").join("model.safetensors");
    let o = gmlp(&[
        "build",
        "--weights",
        path_str(&checkpoint),
        "--causal",
        "--with-past",
        "-q",
        "-o",
        path_str(&model),
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    let o = gmlp(&["inspect", path_str(&model)]);
    let text = output_text(&o);
    // n = 32, e = 48, a = 16: 2 blocks · 32 rows · (48 + 2·16) · 4 bytes.
    assert!(
        text.contains("sequence    static, up to 32 positions")
            && text.contains("past_sgu.0 [batch, 32, 48], past_key.0 [batch, 32, 16]")
            && text.contains("20480 bytes per sequence for all 2 blocks")
            && text.contains("input       position int64 [batch]"),
        "{text}"
    );
    let o = gmlp(&[
        "validate",
        path_str(&model),
        "--decode-steps",
        "5",
        "--report",
        path_str(&report),
    ]);
    let text = output_text(&o);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("ort-cpu stepwise vs whole sequence"),
        "{text}"
    );
    assert!(text.contains("state written in place"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["decoding"]["pass"], true);
    let inputs = json["inputs"].as_array().unwrap();
    assert!(inputs.iter().any(|i| i["name"] == "position"), "{json}");
    // Three prompts of different lengths, together and alone.
    let prompts = [
        "80,101,114,109,105,115",
        "84,104,101",
        "73,110,32,110,111,32,101,118,101,110,116",
    ];
    let file = dir.path().join("prompts.txt");
    std::fs::write(
        &file,
        format!("{}\n\n{}\n{}\n", prompts[0], prompts[1], prompts[2]),
    )
    .unwrap();
    let o = gmlp(&[
        "generate",
        path_str(&model),
        "--prompts-file",
        path_str(&file),
        "--max-new-tokens",
        "9",
        "--compare",
        "tract,ort-cpu",
        "--json",
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = json.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["batch"], 3);
    assert_eq!(runs[0]["prompt_tokens"], serde_json::json!([6, 3, 11]));
    assert_eq!(runs[1]["state_in_place"], true);
    assert_eq!(runs[0]["steps"], 8);
    assert!(runs[0]["step_tokens_per_s"].as_f64().unwrap() > 0.0);
    for (b, prompt) in prompts.iter().enumerate() {
        let o = gmlp(&[
            "generate",
            path_str(&model),
            "--prompt-ids",
            prompt,
            "--max-new-tokens",
            "9",
            "--json",
        ]);
        assert!(o.status.success(), "{}", output_text(&o));
        let alone: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for run in runs {
            assert_eq!(
                run["tokens"][b], alone[0]["tokens"],
                "sequence {b} in {}",
                run["runtime"]
            );
        }
    }
}

/// Bad input to the batch path: one line, exit 2.
#[test]
fn cli_refuses_bad_prompt_files_and_mixed_lengths_in_a_growing_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("s.onnx");
    let growing = d.join("g.onnx");
    for (path, form) in [(&model, "static"), (&growing, "growing")] {
        let o = gmlp(&[
            "build",
            "--preset",
            "amlp-base",
            "--layers",
            "1",
            "--d-model",
            "16",
            "--d-ffn",
            "32",
            "--attn-dim",
            "4",
            "--seq-len",
            "8",
            "--vocab-size",
            "20",
            "--causal",
            "--with-past",
            form,
            "-q",
            "-o",
            path_str(path),
        ]);
        assert!(o.status.success(), "{}", output_text(&o));
    }
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let many = write("many.txt", &"1\n".repeat(65));
    let cases: Vec<(PathBuf, &Path, Vec<&str>, &str)> = vec![
        (
            write("word.txt", "1,x\n"),
            &model,
            vec![],
            "line 1: 'x' is not a token id",
        ),
        (
            write("vocab.txt", "1\n2,20\n"),
            &model,
            vec![],
            "line 2: token id 20 is outside the vocabulary 0..20",
        ),
        (write("empty.txt", "\n \n"), &model, vec![], "no prompt"),
        (
            write("long.txt", "1,2,3,4,5,6,7,8,9\n"),
            &model,
            vec![],
            "line 1: 9 tokens, more than the model's 8 positions",
        ),
        (many, &model, vec![], "more than 64 prompts"),
        (
            write("room.txt", "1,2,3\n1,2,3,4,5\n"),
            &model,
            vec!["--max-new-tokens", "4"],
            "the longest prompt, 5 tokens, leaves room for 3",
        ),
        (
            write("mixed.txt", "1,2,3\n4\n"),
            &growing,
            vec![],
            "prompts of different lengths (1 and 3 tokens) need a static-state model",
        ),
        (d.join("missing.txt"), &model, vec![], "missing.txt"),
    ];
    for (file, m, extra, needle) in cases {
        let mut args = vec!["generate", path_str(m), "--prompts-file", path_str(&file)];
        args.extend(extra);
        let o = gmlp(&args);
        let text = output_text(&o);
        assert_eq!(o.status.code(), Some(2), "{needle}: {text}");
        assert!(text.contains(needle), "{needle}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
    }
    // Prompts of one length decode in a growing model too.
    let same = write("same.txt", "1,2,3\n4,5,6\n");
    let o = gmlp(&[
        "generate",
        path_str(&growing),
        "--prompts-file",
        path_str(&same),
        "--max-new-tokens",
        "2",
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    // --with-past static refuses local mixing; a plain --with-past builds it growing.
    let window = fixture("gpt_window").join("model.safetensors");
    let out = d.join("w.onnx");
    let o = gmlp(&[
        "build",
        "--weights",
        path_str(&window),
        "--seq-len",
        "32",
        "--with-past",
        "static",
        "-q",
        "-o",
        path_str(&out),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(output_text(&o).contains("--with-past static does not support local token mixing"));
    assert!(!out.exists());
    let o = gmlp(&[
        "build",
        "--weights",
        path_str(&window),
        "--seq-len",
        "32",
        "--with-past",
        "-q",
        "-o",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    let o = gmlp(&["inspect", path_str(&out)]);
    assert!(
        output_text(&o).contains("sequence    with-past, up to 32"),
        "{}",
        output_text(&o)
    );
}

/// Inputs given to `validate` for a static file: a position that leaves 0..n and a state of
/// the wrong size are refused before any run, in one line, exit 2.
#[test]
fn validate_refuses_bad_positions_and_state_sizes_in_given_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cfg) = causal_configs().swap_remove(1);
    let path = write_for(
        &cfg,
        Arc::new(spread(3)),
        SequenceMode::Static,
        &BuildTarget::at_opset(17),
        dir.path(),
        "v.onnx",
    );
    let info = DecodingModel::read(&path).unwrap().info;
    let inputs = |positions: Vec<i64>, rows: usize| {
        let mut all = vec![
            NamedTensor {
                name: "input_ids".into(),
                value: TensorValue::I64(Array2::<i64>::ones((2, 3)).into_dyn()),
            },
            NamedTensor {
                name: "position".into(),
                value: TensorValue::I64(Array1::from(positions).into_dyn()),
            },
        ];
        all.extend(info.state.iter().map(|s| NamedTensor {
            name: s.past.clone(),
            value: TensorValue::F32(ArrayD::zeros(IxDyn(&[2, rows, s.width]))),
        }));
        all
    };
    for (name, positions, rows, needle) in [
        (
            "late.npz",
            vec![0, 10],
            12,
            "position[1] = 10 with 3 tokens leaves the model's 12 positions",
        ),
        ("negative.npz", vec![-1, 0], 12, "position[0] = -1"),
        (
            "rows.npz",
            vec![0, 0],
            11,
            "input past_sgu.0: the model declares shape [batch, 12, 16]",
        ),
    ] {
        let file = dir.path().join(name);
        gmlp_onnx::npz::save_npz(&file, &inputs(positions, rows)).unwrap();
        let o = gmlp(&["validate", path_str(&path), "--inputs", path_str(&file)]);
        let text = output_text(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {text}");
        assert!(text.contains(needle), "{name}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
    }
    // In range, the same inputs validate in both runtimes.
    let file = dir.path().join("good.npz");
    gmlp_onnx::npz::save_npz(&file, &inputs(vec![0, 9], 12)).unwrap();
    let o = gmlp(&["validate", path_str(&path), "--inputs", path_str(&file)]);
    assert!(o.status.success(), "{}", output_text(&o));
}
