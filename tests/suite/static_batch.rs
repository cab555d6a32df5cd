//! Batches of sequences with static state (docs/static-state.md): prompts of different
//! lengths decoded together equal each sequence decoded alone (logits, greedy tokens, the
//! f64 reference), in tract and ONNX Runtime; a growing-state model refuses them; the
//! command line (`build --with-past`, `validate`, `generate --prompts-file`) and its
//! refusals of bad input (one line, exit 2).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::decoding::*;
use crate::common::*;
use gmlp_onnx::generation::{Decoder, DecodingModel};
use gmlp_onnx::gmlp::reference::forward_tokens;
use gmlp_onnx::gmlp::targets::BuildTarget;
use gmlp_onnx::gmlp::{SequenceMode, WeightSource};
use gmlp_onnx::runtime::RuntimeKind;
use ndarray::{s, Array2};

/// Decoding against the whole run and the f64 reference (f32 rounding).
const RTOL: f64 = 1e-5;

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
            let together = Decoder::open(kind, &path, &options(), prompts.len()).unwrap();
            let (tokens, logits, positions) = greedy(together, &prompts, steps);
            assert_eq!(
                positions,
                [3 + steps - 1, 7 + steps - 1, steps, 5 + steps - 1]
            );
            for (b, prompt) in prompts.iter().enumerate() {
                let alone = Decoder::open(kind, &path, &options(), 1).unwrap();
                let (own_tokens, own_logits, _) =
                    greedy(alone, std::slice::from_ref(prompt), steps);
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
    let path = write_small_amlp(SequenceMode::Growing, dir.path(), "g.onnx");
    let mut decoder = Decoder::open(RuntimeKind::OrtCpu, &path, &options(), 2).unwrap();
    let err = decoder.feed_prompts(&[vec![1, 2, 3], vec![4]]).unwrap_err();
    assert!(
        matches!(
            err,
            gmlp_onnx::Error::NeedsRebuild {
                remedy: gmlp_onnx::Remedy::BuildStaticState,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "prompts of different lengths (1 and 3 tokens) need a static-state model; in a growing-state model every sequence of a batch is at the same position; build it with the static state (SequenceMode::Static)"
    );
    let logits = decoder
        .feed_prompts(&[vec![1, 2, 3], vec![4, 5, 6]])
        .unwrap();
    assert_eq!(logits.dim(), (2, 50));
    assert_eq!(decoder.positions(), &[3, 3][..]);
    assert!(!DecodingModel::read(&path).unwrap().in_place);
}

/// The command line: a plain `--with-past` is the static form (inspect says so, validate
/// decodes it with the state written in place in ONNX Runtime, tract agreeing), and
/// `generate --prompts-file` decodes prompts of different lengths together with the
/// tokens each gets alone, in both runtimes.
#[test]
fn cli_builds_validates_and_generates_a_batch_with_static_state() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("static.onnx");
    let checkpoint = fixture("lucid_amlp_causal").join("model.safetensors");
    let o = Build::weights(&checkpoint)
        .args(&["--causal", "--with-past"])
        .run(&model);
    // The build line names the form, and a note how to get the earlier one.
    assert!(
        output_text(&o).contains("static state")
            && String::from_utf8_lossy(&o.stderr)
                .contains("note: --with-past builds the static state")
            && String::from_utf8_lossy(&o.stderr)
                .contains("--with-past growing builds the growing state of earlier builds"),
        "{}",
        output_text(&o)
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let summary = inspect_json(&model);
    let decoding = &summary["decoding"];
    assert_eq!(
        (&decoding["mode"], &decoding["max_sequence"]),
        (&"static".into(), &32.into())
    );
    let block0: Vec<(&str, u64)> = decoding["state"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["block"] == 0)
        .map(|t| (t["past"].as_str().unwrap(), t["width"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        block0,
        [("past_sgu.0", 48), ("past_key.0", 16), ("past_value.0", 16)]
    );
    // n = 32, e = 48, a = 16: 2 blocks · 32 rows · (48 + 2·16) · 4 bytes = 20480 bytes per
    // sequence.
    let blocks = decoding["state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["block"].as_u64().unwrap() + 1)
        .max();
    assert_eq!(blocks, Some(2));
    assert_eq!(decoding["state_bytes_per_token_per_block"], 320);
    assert!(
        summary["inputs"].as_array().unwrap().contains(
            &serde_json::json!({"name": "position", "dtype": "int64", "shape": ["batch"]})
        ),
        "{summary}"
    );
    let json = validate_report(&model, &["--decode-steps", "5"]);
    assert_eq!(json["decoding"]["pass"], true);
    let in_place: Vec<(&str, bool)> = json["decoding"]["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["state_in_place"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(in_place, [("tract", false), ("ort-cpu", true)]);
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
    let json = generate_json(
        &model,
        &[
            "--prompts-file",
            path_str(&file),
            "--max-new-tokens",
            "9",
            "--compare",
            "tract,ort-cpu",
        ],
    );
    let runs = json.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["batch"], 3);
    assert_eq!(runs[0]["prompt_tokens"], serde_json::json!([6, 3, 11]));
    assert_eq!(runs[1]["state_in_place"], true);
    assert_eq!(runs[0]["steps"], 8);
    assert!(runs[0]["step_tokens_per_s"].as_f64().unwrap() > 0.0);
    for (b, prompt) in prompts.iter().enumerate() {
        let alone = generate_json(&model, &["--prompt-ids", prompt, "--max-new-tokens", "9"]);
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
        Build::amlp(1, Amlp::Tiny)
            .args(&["--causal", "--with-past", form])
            .write(path);
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
    let window = Build::weights(&fixture("gpt_window").join("model.safetensors")).args(&[
        "--seq-len",
        "32",
        "-q",
        "--with-past",
    ]);
    let out = d.join("w.onnx");
    let o = window.clone().args(&["static"]).run(&out);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(output_text(&o).contains("--with-past static does not support local token mixing"));
    assert!(!out.exists());
    let o = window.run(&out);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        output_text(&o).contains(
            "note: --with-past builds the growing state: block 0 has a window or an axial fold"
        ),
        "{}",
        output_text(&o)
    );
    let decoding = &inspect_json(&out)["decoding"];
    assert_eq!(
        (&decoding["mode"], &decoding["max_sequence"]),
        (&"with-past".into(), &32.into())
    );
}

/// Inputs given to `validate` for a static file: a position that leaves 0..n and a state of
/// the wrong size are refused before any run, in one line, exit 2.
#[test]
fn validate_refuses_bad_positions_and_state_sizes_in_given_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_small_amlp(SequenceMode::Static, dir.path(), "v.onnx");
    let info = DecodingModel::read(&path).unwrap().info;
    for (name, positions, rows, needle) in [
        (
            "late.npz",
            [0, 10],
            12,
            "position[1] = 10 with 3 tokens leaves the model's 12 positions",
        ),
        ("negative.npz", [-1, 0], 12, "position[0] = -1"),
        (
            "rows.npz",
            [0, 0],
            11,
            "input past_sgu.0: the model declares shape [batch, 12, 16]",
        ),
    ] {
        let file = dir.path().join(name);
        gmlp_onnx::npz::save_npz(&file, &static_feed(&info, 3, &positions, rows)).unwrap();
        let o = gmlp(&["validate", path_str(&path), "--inputs", path_str(&file)]);
        let text = output_text(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {text}");
        assert!(text.contains(needle), "{name}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
    }
    // In range, the same inputs validate in both runtimes.
    let file = dir.path().join("good.npz");
    gmlp_onnx::npz::save_npz(&file, &static_feed(&info, 3, &[0, 9], 12)).unwrap();
    let o = gmlp(&["validate", path_str(&path), "--inputs", path_str(&file)]);
    assert!(o.status.success(), "{}", output_text(&o));
}
