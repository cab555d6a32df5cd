//! onnxruntime-genai folders (`gmlp-onnx genai`, `build --genai-dir`; docs/genai.md) from
//! the upstream libraries' causal checkpoints, checked against onnxruntime-genai 0.18 itself
//! (PyPI's CPU build, pinned in scripts/requirements-test.txt; tests/genai_check.py drives
//! it): its greedy tokens equal `gmlp-onnx generate --runtime ort-cpu`'s, for one prompt up
//! to n and for a right-padded batch of prompts of different lengths (each equal to the
//! prompt alone); the folder's model through plain ONNX Runtime with genai's inputs gives
//! the built file's logits and tokens, and the built file, the folder's model and Triton's
//! repository model give the same tokens when every state buffer starts as NaN; the
//! byte-level tokenizer round-trips text; an end token stops both loops at the same place;
//! a rewind (`rewind_to`, then the rest appended) gives the first run's tokens and logits;
//! files genai cannot run are refused with one line and nothing written.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::*;

/// Every causal token fixture whose blocks mix tokens globally (the static state):
/// g-mlp-pytorch's aMLP and gMLP (with token shift, and tanh gates) and g-mlp-gpt's global
/// ones (with attention heads, other gate activations). g-mlp-gpt's reversible fixture has
/// local windows (the growing state only), gmlp-tinygrad's causal aMLP is a backbone
/// without embedding.
const STATIC_FIXTURES: [&str; 8] = [
    "lucid_amlp_causal",
    "lucid_tokens_causal",
    "lucid_shift_causal",
    "lucid_act_tanh",
    "gpt_tokens",
    "gpt_heads2_attn",
    "gpt_act_tanh",
    "gpt_act_sigmoid",
];

/// tests/genai_check.py's JSON answer.
fn genai_check(args: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/genai_check.py");
    let o = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("run python (set GMLP_ONNX_PYTHON or run scripts/test)");
    assert!(
        o.status.success(),
        "genai_check {args:?}: {}",
        output_text(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", output_text(&o)))
}

fn tokens(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a token list: {v}"))
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

fn ids_text(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// `generate --runtime ort-cpu --json` on `model`: the first result.
fn generate(model: &Path, args: &[&str]) -> Value {
    let mut argv = vec![
        "generate",
        path_str(model),
        "--runtime",
        "ort-cpu",
        "--json",
        "-q",
    ];
    argv.extend(args);
    let o = gmlp(&argv);
    assert!(o.status.success(), "{argv:?}: {}", output_text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v[0].clone()
}

fn write_folder(model: &Path, dir: &Path, extra: &[&str]) {
    let mut argv = vec!["genai", path_str(model), "--out", path_str(dir)];
    argv.extend(extra);
    let o = gmlp(&argv);
    assert!(o.status.success(), "{argv:?}: {}", output_text(&o));
}

#[test]
fn genai_generates_our_tokens_from_every_static_fixture() {
    let dir = tempfile::tempdir().unwrap();
    for name in STATIC_FIXTURES {
        let fx = Fixture::open(name);
        let built = dir.path().join(format!("{name}.onnx"));
        fx.build("model.safetensors", &["--with-past"], &built);
        let folder = dir.path().join(name);
        write_folder(&built, &folder, &[]);
        let ids = fx.ids("input_ids");
        let row: Vec<i64> = ids.row(0).to_vec();
        let prompts: Vec<Vec<i64>> = [3usize, 6, 1]
            .iter()
            .map(|&len| row[..len.min(row.len())].to_vec())
            .collect();
        let all = prompts
            .iter()
            .map(|p| ids_text(p))
            .collect::<Vec<_>>()
            .join(";");

        // One prompt up to n.
        let ours = generate(&built, &["--prompt-ids", &ids_text(&prompts[0])]);
        let theirs = genai_check(&["tokens", path_str(&folder), &ids_text(&prompts[0]), "0"]);
        assert_eq!(
            tokens(&theirs["single"][0]),
            tokens(&ours["tokens"]),
            "{name}: genai vs generate, one prompt up to n"
        );
        // A batch of prompts of different lengths, right-padded by genai.
        let new = 6;
        let file = dir.path().join(format!("{name}.prompts"));
        std::fs::write(&file, all.replace(';', "\n")).unwrap();
        let ours = generate(
            &built,
            &[
                "--prompts-file",
                path_str(&file),
                "--max-new-tokens",
                &new.to_string(),
            ],
        );
        let theirs = genai_check(&["tokens", path_str(&folder), &all, &new.to_string()]);
        for b in 0..prompts.len() {
            assert_eq!(
                tokens(&theirs["batch"][b]),
                tokens(&ours["tokens"][b]),
                "{name}: genai's batch row {b} vs generate --prompts-file"
            );
            assert_eq!(
                tokens(&theirs["batch"][b]),
                tokens(&theirs["single"][b]),
                "{name}: genai's batch row {b} vs the prompt alone"
            );
        }
        eprintln!("{name}: genai = generate (one prompt to n, a batch of 3)");
    }
}

#[test]
fn the_folder_model_holds_the_built_files_numbers_and_every_static_file_ignores_nan_state() {
    let dir = tempfile::tempdir().unwrap();
    // The default opset's state writes are ScatterND, opset 24's TensorScatter; the folder's
    // model is emitted again with the file's stored weights in every weight type.
    for (name, extra) in [
        ("lucid_amlp_causal", &[][..]),
        ("lucid_shift_causal", &[]),
        ("gpt_heads2_attn", &[]),
        ("lucid_amlp_causal", &["--opset", "24"]),
        ("lucid_amlp_causal", &["--dtype", "int8"]),
        ("lucid_amlp_causal", &["--dtype", "int4"]),
        ("lucid_amlp_causal", &["--dtype", "f16"]),
    ] {
        let fx = Fixture::open(name);
        let file = format!("{name}{}", extra.concat());
        let built = dir.path().join(format!("{file}.onnx"));
        fx.build(
            "model.safetensors",
            &[&["--with-past"], extra].concat(),
            &built,
        );
        let folder = dir.path().join(&file);
        write_folder(&built, &folder, &[]);
        // Triton's repository model of the same file (its position counter added).
        let repo = dir.path().join(format!("{file}-triton"));
        let o = gmlp(&["triton", path_str(&built), "--repo", path_str(&repo)]);
        assert!(o.status.success(), "{}", output_text(&o));
        let triton = repo.join(&file).join("1").join("model.onnx");
        let prompt: Vec<i64> = fx.ids("input_ids").row(0).iter().take(4).copied().collect();
        let r = genai_check(&[
            "state",
            path_str(&folder),
            path_str(&built),
            &ids_text(&prompt),
            path_str(&triton),
        ]);
        let zero = &r["zero"];
        assert_eq!(
            zero["max_abs_logit_diff"].as_f64(),
            Some(0.0),
            "{name}: {zero}"
        );
        let want = tokens(&zero["ours"]);
        assert!(want.len() > 4, "{name}: decoded to n");
        assert_eq!(tokens(&zero["genai_model"]), want, "{name}");
        assert_eq!(
            tokens(&zero["triton_model"]),
            want,
            "{name}: Triton's model"
        );
        // Every state buffer NaN before the prompt: the same tokens.
        let nan = &r["nan"];
        assert_eq!(
            tokens(&nan["ours"]),
            want,
            "{name}: built file from NaN state"
        );
        assert_eq!(
            tokens(&nan["genai_model"]),
            want,
            "{name}: folder model from NaN state"
        );
        assert_eq!(
            tokens(&nan["triton_model"]),
            want,
            "{name}: Triton's model from NaN state"
        );
        // Bit for bit: the unwritten rows never reach a logit.
        for (file, diff) in r["nan_vs_zero_max_abs_logit_diff"].as_object().unwrap() {
            assert_eq!(
                diff.as_f64(),
                Some(0.0),
                "{name}: {file}: logits from NaN state"
            );
        }
    }
}

#[test]
fn genai_rewinds_into_generated_tokens_and_into_the_prompt_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["lucid_amlp_causal", "gpt_heads2_attn"] {
        let fx = Fixture::open(name);
        let built = dir.path().join(format!("{name}.onnx"));
        fx.build("model.safetensors", &["--with-past"], &built);
        let folder = dir.path().join(name);
        write_folder(&built, &folder, &[]);
        let prompt: Vec<i64> = fx.ids("input_ids").row(0).iter().take(4).copied().collect();
        let r = genai_check(&["rewind", path_str(&folder), &ids_text(&prompt)]);
        // genai's tokens before any rewind are ours.
        let ours = generate(&built, &["--prompt-ids", &ids_text(&prompt)]);
        assert_eq!(tokens(&r["tokens"]), tokens(&ours["tokens"]), "{name}");
        let cases = r["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 2, "{name}: {r}");
        for case in cases {
            assert!(case["steps"].as_u64().unwrap() > 0, "{name}: {case}");
            assert_eq!(case["tokens_equal"], true, "{name}: {case}");
            assert_eq!(
                case["logits_equal"], true,
                "{name}: every step's logits after the rewind: {case}"
            );
        }
    }
}

#[test]
fn an_end_token_stops_generate_and_genai_at_the_same_place() {
    let dir = tempfile::tempdir().unwrap();
    let fx = Fixture::open("lucid_amlp_causal");
    let plain = dir.path().join("plain.onnx");
    fx.build("model.safetensors", &["--with-past"], &plain);
    let prompt: Vec<i64> = fx.ids("input_ids").row(0).iter().take(3).copied().collect();
    let prompt = ids_text(&prompt);
    let free = tokens(&generate(&plain, &["--prompt-ids", &prompt])["tokens"]);
    // The end token: the fourth token of the free continuation (first occurrence).
    let end = free[3];
    let stop = free.iter().position(|&t| t == end).unwrap();
    let ended = &free[..=stop];
    // generate --eos-token-id on the plain file.
    let g = generate(
        &plain,
        &["--prompt-ids", &prompt, "--eos-token-id", &end.to_string()],
    );
    assert_eq!(tokens(&g["tokens"]), ended);
    assert_eq!(g["stopped"], "end_token");
    let g = generate(&plain, &["--prompt-ids", &prompt, "--max-new-tokens", "2"]);
    assert_eq!(g["stopped"], "max_new_tokens");
    // build --eos-token-id records it: generate and the genai folder (build --genai-dir) stop there.
    let with_end = dir.path().join("end.onnx");
    let folder = dir.path().join("end-genai");
    fx.build(
        "model.safetensors",
        &[
            "--with-past",
            "--eos-token-id",
            &end.to_string(),
            "--genai-dir",
            path_str(&folder),
        ],
        &with_end,
    );
    let g = generate(&with_end, &["--prompt-ids", &prompt]);
    assert_eq!(tokens(&g["tokens"]), ended);
    let theirs = genai_check(&["tokens", path_str(&folder), &prompt, "0"]);
    assert_eq!(
        tokens(&theirs["single"][0]),
        ended,
        "genai stops at the same token"
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("genai_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["model"]["eos_token_id"], end);
}

#[test]
fn a_byte_level_folder_with_external_data_reads_and_writes_text_through_og_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let built = Build::amlp(2, Amlp::Medium)
        .args(&[
            "--causal",
            "--with-past",
            "--init",
            "spread",
            "--external-data",
        ])
        .write(&dir.path().join("bytes.onnx"));
    let folder = dir.path().join("bytes");
    write_folder(&built, &folder, &[]);
    // The weights travel as the folder's model.onnx.data (og.Model below loads them).
    assert!(folder.join("model.onnx.data").is_file());
    let text = "Pay attention to MLPs: gMLP ≈ Transformer\n";
    let r = genai_check(&["text", path_str(&folder), text]);
    let bytes: Vec<i64> = text.bytes().map(i64::from).collect();
    assert_eq!(
        tokens(&r["ids"]),
        bytes,
        "one token per UTF-8 byte, the byte's value"
    );
    assert_eq!(r["text"], text);
}

#[test]
fn files_genai_cannot_run_get_one_line_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let variable = Build::amlp(1, Amlp::Tiny)
        .args(&["--causal"])
        .write(&dir.path().join("variable.onnx"));
    let vision = small_vision_model(dir.path());
    // g-mlp-gpt's local window: --with-past builds the growing state.
    let fx = Fixture::open("gpt_window");
    let window = dir.path().join("window.onnx");
    fx.build("model.safetensors", &["--with-past"], &window);
    for (model, why) in [
        (&variable, "carries no state"),
        (&vision, "not a causal token model"),
        (&window, "grows with every token"),
    ] {
        let out = dir.path().join("refused");
        let o = gmlp(&["genai", path_str(model), "--out", path_str(&out)]);
        let text = output_text(&o);
        assert_eq!(o.status.code(), Some(2), "{text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        assert!(text.contains(why), "{text}");
        assert!(!out.exists(), "nothing written for {}", model.display());
    }
}
