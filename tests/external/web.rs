//! The browser as a deployment stack (docs/web.md): the examples/web page, prepared with
//! examples/web/prepare.sh and served by `python3 -m http.server` on 127.0.0.1, opened in
//! headless Chromium (Debian's, driven by puppeteer-core: tests/web/drive_page.js). A prompt
//! is typed into it, and the bytes the page generates with ONNX Runtime Web, its state fed
//! back step by step in JavaScript, must equal those of `gmlp-onnx generate --prompt-text`
//! (ONNX Runtime, native) with the same model: greedy, and top-k with a seed. The page runs
//! on WebGPU where the browser offers an adapter (Chromium started with WebGPU: SwiftShader's
//! adapter, no GPU needed) and on WebAssembly (one thread) where it does not: the static-state
//! fixture is generated both ways. Screenshots stay in target/tmp/web/.
//!
//! Needs `GMLP_CONSUMER_ORT_WEB` (node_modules with onnxruntime-web and puppeteer-core)
//! from scripts/consumers_setup.sh, and Chromium (`chromium`, or GMLP_CHROMIUM): scripts/test
//! and .ci/run set both up, and run these with the consumer matrix's feature
//! (`test-consumers`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{gmlp, output_text, path_str, Amlp, Build};
use gmlp_onnx::rng::SplitMix64;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn modules() -> String {
    std::env::var("GMLP_CONSUMER_ORT_WEB").expect(
        "GMLP_CONSUMER_ORT_WEB is not set: run `scripts/test --test external web` \
         (it evals scripts/consumers_setup.sh, which installs onnxruntime-web and puppeteer-core)",
    )
}

fn build(out: &Path, args: &[&str]) -> PathBuf {
    let mut all = vec!["build"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-q", "-o", path_str(out)]);
    let o = gmlp(&all);
    assert!(o.status.success(), "build {args:?}: {}", output_text(&o));
    out.to_path_buf()
}

/// `gmlp-onnx generate MODEL --prompt-text PROMPT --json EXTRA...`: its tokens.
fn cli_tokens(model: &Path, prompt: &str, extra: &[&str]) -> Vec<i64> {
    let mut args = vec![
        "generate",
        path_str(model),
        "--prompt-text",
        prompt,
        "--runtime",
        "ort-cpu",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = gmlp(&args);
    assert!(o.status.success(), "generate: {}", output_text(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    json[0]["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

/// A folder made by examples/web/prepare.sh for `model`.
fn prepare(site: &Path, model: &Path) {
    if site.exists() {
        std::fs::remove_dir_all(site).unwrap();
    }
    let o = Command::new("bash")
        .arg(format!("{ROOT}/examples/web/prepare.sh"))
        .args([path_str(site), path_str(model), &modules()])
        .output()
        .expect("run bash");
    assert!(o.status.success(), "prepare.sh: {}", output_text(&o));
}

/// Opens the page served from `site` in a Chromium that offers WebGPU (`webgpu`) or not,
/// types `prompt` in each run's settings (a query string) and returns each run's generated
/// tokens; asserts that the page ran on WebGPU exactly when it was offered.
fn page_tokens(
    site: &Path,
    prompt: &str,
    runs: &[(&str, &str)],
    dir: &Path,
    webgpu: bool,
) -> Vec<Vec<i64>> {
    let result = dir.join("page.json");
    let spec = serde_json::json!({
        "prompt": prompt,
        "out": result,
        "webgpu": webgpu,
        "runs": runs.iter().map(|(name, query)| serde_json::json!({
            "name": name,
            "query": query,
            "screenshot": dir.join(format!("{name}.png")),
        })).collect::<Vec<_>>(),
    });
    let o = Command::new("node")
        .arg(format!("{ROOT}/tests/web/drive_page.js"))
        .args([&modules(), path_str(site), &spec.to_string()])
        .output()
        .expect("run node");
    assert!(o.status.success(), "drive_page.js: {}", output_text(&o));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    let out: Vec<Vec<i64>> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            println!(
                "{} ({}): {} | {} | {} generations while typing",
                r["name"],
                r["backend"],
                r["model"].as_str().unwrap_or(""),
                r["status"].as_str().unwrap_or(""),
                r["generations"]
            );
            let expected = if webgpu { "webgpu" } else { "wasm" };
            assert_eq!(r["backend"], expected, "the page's backend: {r}");
            // Typed one key per 200 ms, past the page's 120 ms pause: it generated for
            // the growing prompt, not only once at the end.
            assert!(
                r["generations"].as_u64().unwrap_or(0) >= 2,
                "the page did not generate as the prompt was typed: {r}"
            );
            r["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(out.len(), runs.len());
    for (name, _) in runs {
        assert!(
            dir.join(format!("{name}.png")).exists(),
            "no screenshot {name}"
        );
    }
    out
}

fn work_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("web")
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_page_generates_the_bytes_of_gmlp_onnx_generate() {
    let dir = work_dir("fixture");
    // g-mlp-pytorch aMLP trained on bytes (fixtures/lucid_amlp_causal): n = 32, static
    // state sgu, key and value per block, with a position input.
    let checkpoint = format!("{ROOT}/fixtures/lucid_amlp_causal/model.safetensors");
    let model = build(
        &dir.join("model.onnx"),
        &["--weights", &checkpoint, "--causal", "--with-past"],
    );
    let prompt = "Permission is";
    let top_k = ["--top-k", "5", "--temperature", "0.9", "--seed", "3"];
    let greedy_cli = cli_tokens(&model, prompt, &[]);
    let top_k_cli = cli_tokens(&model, prompt, &top_k);
    assert_eq!(greedy_cli.len(), 32 - prompt.len(), "fills the n positions");
    assert_ne!(greedy_cli, top_k_cli, "the settings must matter");
    let site = dir.join("site");
    prepare(&site, &model);
    let runs = [
        ("greedy", ""),
        ("top-k", "sampling=top-k&k=5&temperature=0.9&seed=3"),
    ];
    // WebAssembly (no adapter offered), then WebGPU (SwiftShader's adapter).
    for webgpu in [false, true] {
        let run_dir = dir.join(if webgpu { "webgpu" } else { "wasm" });
        std::fs::create_dir_all(&run_dir).unwrap();
        let page = page_tokens(&site, prompt, &runs, &run_dir, webgpu);
        assert_eq!(
            page[0], greedy_cli,
            "greedy (WebGPU offered: {webgpu}): the page and gmlp-onnx generate"
        );
        assert_eq!(
            page[1], top_k_cli,
            "top-k (WebGPU offered: {webgpu}): the page and gmlp-onnx generate"
        );
    }
}

#[test]
fn the_page_generates_any_bytes_up_to_n() {
    let dir = work_dir("seeded");
    // A seeded 256-token aMLP (paper init, seed 5) whose greedy bytes vary and are not
    // UTF-8: the page compares bytes, not text, over n = 64 positions. Growing state here,
    // the static state (a plain --with-past) in the test above: the page drives both.
    let model = Build::amlp(2, Amlp::Medium)
        .args(&["--causal", "--with-past", "growing", "--seed", "5"])
        .write(&dir.join("model.onnx"));
    let prompt = "Über 10 €";
    let cli = cli_tokens(&model, prompt, &[]);
    assert_eq!(cli.len(), 64 - prompt.len());
    let mut distinct = cli.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 8, "a varied continuation: {cli:?}");
    assert!(
        std::str::from_utf8(&cli.iter().map(|&t| t as u8).collect::<Vec<_>>()).is_err(),
        "some generated bytes are not UTF-8: {cli:?}"
    );
    let site = dir.join("site");
    prepare(&site, &model);
    let page = page_tokens(&site, prompt, &[("greedy", "")], &dir, false);
    assert_eq!(page[0], cli, "greedy: the page and gmlp-onnx generate");
}

#[test]
fn the_page_script_reads_metadata_and_refuses_what_it_cannot_drive() {
    let dir = work_dir("checks");
    let checkpoint = format!("{ROOT}/fixtures/lucid_amlp_causal/model.safetensors");
    let with_past = build(
        &dir.join("with_past.onnx"),
        &["--weights", &checkpoint, "--causal", "--with-past"],
    );
    let variable = build(
        &dir.join("variable.onnx"),
        &["--weights", &checkpoint, "--causal"],
    );
    let vision = crate::common::small_vision_model(&dir);
    let vocab300 = build(
        &dir.join("vocab300.onnx"),
        &[
            "--preset",
            "gmlp-base",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--d-ffn",
            "64",
            "--seq-len",
            "16",
            "--vocab-size",
            "300",
            "--causal",
            "--with-past",
        ],
    );
    let mut rng = SplitMix64::keyed(3, "sampling");
    let values: Vec<String> = (0..4).map(|_| rng.next_u64().to_string()).collect();
    let spec = serde_json::json!({
        "with_past": with_past, "variable": variable, "vision": vision, "vocab300": vocab300,
        "stream": {"seed": 3, "key": "sampling", "values": values},
    });
    let o = Command::new("node")
        .arg(format!("{ROOT}/tests/web/gmlp_checks.mjs"))
        .arg(format!("{ROOT}/examples/web/gmlp.js"))
        .arg(spec.to_string())
        .output()
        .expect("run node");
    let text = output_text(&o);
    println!("{text}");
    assert!(o.status.success(), "gmlp_checks.mjs: {text}");
    assert!(text.contains("13 checks passed"), "{text}");
}
