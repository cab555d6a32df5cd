//! Checkpoints written by g-mlp-gpt 0.0.15 and gmlp-tinygrad 0.9.2 themselves (fixtures/gpt_*,
//! fixtures/tiny_*, and g-mlp-pytorch's gate activation in fixtures/lucid_act_tanh; made by
//! scripts/make_fixtures.py): built with the CLI as a user would (the flags the weights
//! cannot show come from each fixture's meta.json), they reproduce the library's own
//! outputs in tract and ONNX Runtime — the whole sequence, a shorter one, and token by
//! token from empty state — `.pt` and safetensors give the same file, `--save-weights`
//! round-trips, and `generate --json` gives the library's greedy continuation.

use std::path::Path;

use crate::common::*;
use gmlp_onnx::generation::Decoder;
use gmlp_onnx::onnx::reader::read_model;
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use ndarray::{concatenate, s, Array2, Array3, ArrayD, Axis};

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

fn logits(kind: gmlp_onnx::runtime::RuntimeKind, path: &Path, ids: &Array2<i64>) -> ArrayD<f32> {
    let feed = [NamedTensor {
        name: "input_ids".into(),
        value: TensorValue::I64(ids.clone().into_dyn()),
    }];
    f32_output(&run(kind, path, &feed))
}

#[test]
fn gpt_checkpoints_reproduce_the_library_whole_and_shorter() {
    let dir = tempfile::tempdir().unwrap();
    for name in GPT_FIXTURES {
        let fx = Fixture::open(name);
        let whole = fx.ids("input_ids");
        let expected = fx.logits();
        let path = dir.path().join(format!("{name}.onnx"));
        fx.build("model.safetensors", &[], &path);
        onnx_check(std::slice::from_ref(&path));
        for kind in CPU_RUNTIMES {
            let d = rel_diff(&logits(kind, &path, &whole), &expected);
            eprintln!("{name}: {} whole vs upstream {d:.2e}", kind.name());
            assert!(d <= PYTORCH_RTOL, "{name} {} whole: {d:e}", kind.name());
            if name.starts_with("gpt_") {
                let short = fx.ids("input_ids_short");
                let expected_short = fx.f32("logits_short");
                let d = rel_diff(&logits(kind, &path, &short), &expected_short);
                assert!(d <= PYTORCH_RTOL, "{name} {} short: {d:e}", kind.name());
            }
        }
        // torch.save's file gives the same graph and weights (only the metadata naming the
        // source file differs).
        if fx.dir.join("model.pt").exists() {
            let from_pt = dir.path().join(format!("{name}-pt.onnx"));
            fx.build("model.pt", &[], &from_pt);
            let (a, b) = (read_model(&path).unwrap(), read_model(&from_pt).unwrap());
            assert!(
                a.graph == b.graph,
                "{name}: .pt and safetensors graphs differ"
            );
        }
        // --save-weights writes the native layout, which builds the same file again.
        let native = dir.path().join(format!("{name}-native.safetensors"));
        let first = dir.path().join(format!("{name}-a.onnx"));
        fx.build(
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
            assert!(d <= PYTORCH_RTOL, "{name} native round trip: {d:e}");
        }
    }
}

/// Token by token from empty state, present fed back as past, as a Python loop would.
#[test]
fn gpt_checkpoints_decode_token_by_token_to_the_library_logits() {
    let dir = tempfile::tempdir().unwrap();
    for name in GPT_FIXTURES {
        let fx = Fixture::open(name);
        let whole = fx.ids("input_ids");
        let expected: Array3<f32> = fx.logits().into_dimensionality().unwrap();
        let path = dir.path().join(format!("{name}-past.onnx"));
        fx.build("model.safetensors", &["--with-past"], &path);
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
                    d <= PYTORCH_RTOL,
                    "{name} {} {chunks:?}: {d:e}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn generate_gives_the_library_greedy_continuation() {
    let dir = tempfile::tempdir().unwrap();
    for name in GPT_FIXTURES.iter().filter(|n| n.starts_with("gpt_")) {
        let fx = Fixture::open(name);
        let prompt = fx.ids("greedy_prompt");
        let expected = fx.ids("greedy_tokens");
        let path = dir.path().join(format!("{name}-gen.onnx"));
        fx.build("model.safetensors", &["--with-past"], &path);
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
fn tinygrad_backbones_reproduce_the_library() {
    let dir = tempfile::tempdir().unwrap();
    for name in TINYGRAD_FIXTURES {
        let fx = Fixture::open(name);
        let embeds = fx.tensor("inputs_embeds");
        let expected = fx.f32("last_hidden_state");
        let path = dir.path().join(format!("{name}.onnx"));
        fx.build("model.safetensors", &[], &path);
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
            assert!(d <= PYTORCH_RTOL, "{name} {}: {d:e}", kind.name());
        }
    }
}
