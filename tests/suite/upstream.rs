//! Checkpoints written by g-mlp-gpt 0.0.15 and gmlp-tinygrad 0.9.2 themselves (fixtures/gpt_*,
//! fixtures/tiny_*, and g-mlp-pytorch's gate activation in fixtures/lucid_act_tanh; made by
//! scripts/make_fixtures.py): built with the CLI as a user would (the flags the weights
//! cannot show come from each fixture's meta.json), they reproduce the library's own
//! outputs in tract and ONNX Runtime — the whole sequence, a shorter one, and token by
//! token from empty state — `.pt` and safetensors give the same file, `--save-weights`
//! round-trips, and `generate --json` gives the library's greedy continuation.

use std::path::Path;

use crate::common::*;
use gmlp_onnx::onnx::reader::read_model;
use gmlp_onnx::runtime::decoder::Decoder;
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{concatenate, s, Array2, Array3, ArrayD, Axis};
use safetensors::SafeTensors;

/// max|ours − upstream| / max|upstream| allowed (expect ~3e-7).
const UPSTREAM_RTOL: f64 = 1e-4;

const GPT_FIXTURES: [&str; 8] = [
    "gpt_tokens",
    "gpt_heads2_attn",
    "gpt_window",
    "gpt_fold",
    "gpt_reversible",
    "gpt_act_tanh",
    "gpt_act_sigmoid",
    "lucid_act_tanh",
];

const TINYGRAD_FIXTURES: [&str; 3] = ["tiny_gmlp", "tiny_amlp", "tiny_amlp_causal"];

/// The build flags a user passes for `name`: those its meta.json records.
fn flags(name: &str) -> Vec<String> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("meta.json")).unwrap())
            .unwrap();
    let mut out = Vec::new();
    for (key, value) in meta["flags"].as_object().unwrap() {
        out.push(format!("--{}", key.replace('_', "-")));
        match value {
            serde_json::Value::Bool(true) => {}
            serde_json::Value::String(s) => out.push(s.clone()),
            other => out.push(other.to_string()),
        }
    }
    out
}

/// `gmlp-onnx build --weights CHECKPOINT [flags] [extra] -o OUT`.
fn build(name: &str, checkpoint: &str, extra: &[&str], out: &Path) {
    let weights = fixture(name).join(checkpoint);
    let mut args = vec![
        "build".to_string(),
        "-q".into(),
        "--weights".into(),
        weights.display().to_string(),
        "-o".into(),
        out.display().to_string(),
    ];
    args.extend(flags(name));
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = gmlp(&refs);
    assert!(o.status.success(), "{name}: {}", output_text(&o));
}

fn io(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name).join("io.safetensors")).unwrap()
}

fn tensor(st: &SafeTensors, key: &str) -> TensorValue {
    safetensors_tensor(st, key).unwrap_or_else(|| panic!("io.safetensors has no {key}"))
}

fn f32_of(v: TensorValue) -> ArrayD<f32> {
    let TensorValue::F32(a) = v else {
        panic!("f32")
    };
    a
}

fn ids_of(v: TensorValue) -> Array2<i64> {
    let TensorValue::I64(a) = v else {
        panic!("i64")
    };
    a.into_dimensionality().unwrap()
}

fn logits(kind: gmlp_onnx::runtime::RuntimeKind, path: &Path, ids: &Array2<i64>) -> ArrayD<f32> {
    let feed = [NamedTensor {
        name: "input_ids".into(),
        value: TensorValue::I64(ids.clone().into_dyn()),
    }];
    f32_output(&run(kind, path, &feed))
}

#[test]
#[cfg_attr(
    not(feature = "test-onnxruntime"),
    ignore = "needs the test Python environment (ONNX Runtime, onnx): scripts/test"
)]
fn gpt_checkpoints_reproduce_the_library_whole_and_shorter() {
    let dir = tempfile::tempdir().unwrap();
    for name in GPT_FIXTURES {
        let bytes = io(name);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let whole = ids_of(tensor(&st, "input_ids"));
        let expected = f32_of(tensor(&st, "logits"));
        let path = dir.path().join(format!("{name}.onnx"));
        build(name, "model.safetensors", &[], &path);
        onnx_check(std::slice::from_ref(&path));
        for kind in CPU_RUNTIMES {
            let d = rel_diff(&logits(kind, &path, &whole), &expected);
            eprintln!("{name}: {} whole vs upstream {d:.2e}", kind.name());
            assert!(d <= UPSTREAM_RTOL, "{name} {} whole: {d:e}", kind.name());
            if name.starts_with("gpt_") {
                let short = ids_of(tensor(&st, "input_ids_short"));
                let expected_short = f32_of(tensor(&st, "logits_short"));
                let d = rel_diff(&logits(kind, &path, &short), &expected_short);
                assert!(d <= UPSTREAM_RTOL, "{name} {} short: {d:e}", kind.name());
            }
        }
        // torch.save's file gives the same graph and weights (only the metadata naming the
        // source file differs).
        if fixture(name).join("model.pt").exists() {
            let from_pt = dir.path().join(format!("{name}-pt.onnx"));
            build(name, "model.pt", &[], &from_pt);
            let (a, b) = (read_model(&path).unwrap(), read_model(&from_pt).unwrap());
            assert!(
                a.graph == b.graph,
                "{name}: .pt and safetensors graphs differ"
            );
        }
        // --save-weights writes the native layout, which builds the same file again.
        let native = dir.path().join(format!("{name}-native.safetensors"));
        let first = dir.path().join(format!("{name}-a.onnx"));
        build(
            name,
            "model.safetensors",
            &["--save-weights", native.to_str().unwrap()],
            &first,
        );
        let o = gmlp(&[
            "build",
            "-q",
            "--weights",
            native.to_str().unwrap(),
            "-o",
            dir.path().join(format!("{name}-b.onnx")).to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name} native: {}", output_text(&o));
        let again = dir.path().join(format!("{name}-b.onnx"));
        for kind in CPU_RUNTIMES {
            let d = rel_diff(&logits(kind, &again, &whole), &expected);
            assert!(d <= UPSTREAM_RTOL, "{name} native round trip: {d:e}");
        }
    }
}

/// Token by token from empty state, present fed back as past, as a Python loop would.
#[test]
#[cfg_attr(
    not(feature = "test-onnxruntime"),
    ignore = "needs the test Python environment (ONNX Runtime, onnx): scripts/test"
)]
fn gpt_checkpoints_decode_token_by_token_to_the_library_logits() {
    let dir = tempfile::tempdir().unwrap();
    for name in GPT_FIXTURES {
        let bytes = io(name);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let whole = ids_of(tensor(&st, "input_ids"));
        let expected: Array3<f32> = f32_of(tensor(&st, "logits")).into_dimensionality().unwrap();
        let path = dir.path().join(format!("{name}-past.onnx"));
        build(name, "model.safetensors", &["--with-past"], &path);
        for kind in CPU_RUNTIMES {
            let mut decoder = Decoder::open(kind, &path, &options(), whole.nrows()).unwrap();
            for chunks in [vec![1; whole.ncols()], vec![5, 1, 10, 3, 13]] {
                decoder.reset().unwrap();
                let mut parts = Vec::new();
                let mut start = 0;
                for len in chunks.iter().copied() {
                    parts.push(
                        decoder
                            .feed(whole.slice(s![.., start..start + len]))
                            .unwrap(),
                    );
                    start += len;
                }
                let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
                let out = concatenate(Axis(1), &views).unwrap();
                let d = rel_diff(&out.into_dyn(), &expected.clone().into_dyn());
                eprintln!("{name}: {} {chunks:?} vs upstream {d:.2e}", kind.name());
                assert!(
                    d <= UPSTREAM_RTOL,
                    "{name} {} {chunks:?}: {d:e}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(feature = "test-onnxruntime"),
    ignore = "needs the test Python environment (ONNX Runtime, onnx): scripts/test"
)]
fn generate_gives_the_library_greedy_continuation() {
    let dir = tempfile::tempdir().unwrap();
    for name in GPT_FIXTURES.iter().filter(|n| n.starts_with("gpt_")) {
        let bytes = io(name);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let prompt = ids_of(tensor(&st, "greedy_prompt"));
        let expected = ids_of(tensor(&st, "greedy_tokens"));
        let path = dir.path().join(format!("{name}-gen.onnx"));
        build(name, "model.safetensors", &["--with-past"], &path);
        let prompt_ids: Vec<String> = prompt.iter().map(i64::to_string).collect();
        let o = gmlp(&[
            "generate",
            path.to_str().unwrap(),
            "--prompt-ids",
            &prompt_ids.join(","),
            "--max-new-tokens",
            &expected.ncols().to_string(),
            "--compare",
            "tract,ort-cpu",
            "--json",
        ]);
        assert!(o.status.success(), "{name}: {}", output_text(&o));
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for run in json.as_array().unwrap() {
            let tokens: Vec<i64> = run["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap())
                .collect();
            assert_eq!(tokens, expected.row(0).to_vec(), "{name}: {run}");
        }
    }
}

#[test]
#[cfg_attr(
    not(feature = "test-onnxruntime"),
    ignore = "needs the test Python environment (ONNX Runtime, onnx): scripts/test"
)]
fn tinygrad_backbones_reproduce_the_library() {
    let dir = tempfile::tempdir().unwrap();
    for name in TINYGRAD_FIXTURES {
        let bytes = io(name);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let embeds = tensor(&st, "inputs_embeds");
        let expected = f32_of(tensor(&st, "last_hidden_state"));
        let path = dir.path().join(format!("{name}.onnx"));
        build(name, "model.safetensors", &[], &path);
        onnx_check(std::slice::from_ref(&path));
        let feed = [NamedTensor {
            name: "inputs_embeds".into(),
            value: embeds,
        }];
        for kind in CPU_RUNTIMES {
            let outputs = run(kind, &path, &feed);
            assert_eq!(outputs[0].name, "last_hidden_state");
            let d = rel_diff(&f32_output(&outputs), &expected);
            eprintln!("{name}: {} vs tinygrad {d:.2e}", kind.name());
            assert!(d <= UPSTREAM_RTOL, "{name} {}: {d:e}", kind.name());
        }
    }
}
