//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod decoding;
pub mod fixture;

// The fixtures are read by tests of the test-onnxruntime tier only.
#[allow(unused_imports)]
pub use fixture::{Fixture, PYTORCH_RTOL};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use gmlp_onnx::gmlp::export::export;
use gmlp_onnx::gmlp::Precision;
use gmlp_onnx::gmlp::{GmlpConfig, InitScheme, SeededInit, SpatialForm, Task};
use gmlp_onnx::onnx::graph::Graph;
use gmlp_onnx::onnx::writer::{write_model, ModelInfo};
use gmlp_onnx::runtime::{self, RuntimeKind, RuntimeOptions};
use gmlp_onnx::tensor::{NamedTensor, TensorValue};

/// Runtime options for tests: the ONNX Runtime library comes from ORT_DYLIB_PATH or the
/// Python package (scripts/test sets both up).
pub fn options() -> RuntimeOptions {
    RuntimeOptions::default()
}

/// A small token model (n = 12) that runs in milliseconds.
pub fn tiny_tokens(spatial: SpatialForm, attn: Option<usize>, causal: bool) -> GmlpConfig {
    GmlpConfig {
        task: Task::Tokens {
            vocab_size: 50,
            seq_len: 12,
            tied_embedding: true,
        },
        layers: 2,
        d_model: 16,
        d_ffn: 32,
        attn_dim: attn,
        causal,
        heads: 1,
        shift_tokens: 0,
        spatial,
        norm_eps: 1e-5,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    }
}

/// A small vision model: 16x16 images, 4x4 patches (n = 16), 3 channels, 7 classes.
pub fn tiny_vision(spatial: SpatialForm) -> GmlpConfig {
    GmlpConfig {
        task: Task::Vision {
            image_size: 16,
            patch_size: 4,
            in_chans: 3,
            num_classes: 7,
        },
        layers: 2,
        d_model: 16,
        d_ffn: 32,
        attn_dim: None,
        causal: false,
        heads: 1,
        shift_tokens: 0,
        spatial,
        norm_eps: 1e-6,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    }
}

/// The weights every model test uses: spread init, so a wiring mistake shows.
pub fn spread(seed: u64) -> SeededInit {
    SeededInit {
        seed,
        scheme: InitScheme::Spread,
    }
}

/// Writes the model for `cfg` to `dir/name` and returns its path.
pub fn write_config(cfg: &GmlpConfig, seed: u64, opset: i64, dir: &Path, name: &str) -> PathBuf {
    let model = export(cfg, Arc::new(spread(seed)), "test", None, opset).expect("export");
    let path = dir.join(name);
    write_model(&model.graph, &model.info, &path, |_, _| {}).expect("write");
    path
}

/// Writes a bare graph (op tests) to `dir/name`.
pub fn write_graph(graph: &Graph, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    write_model(graph, &ModelInfo::default(), &path, |_, _| {}).expect("write");
    path
}

/// Runs `path` in `kind` with `inputs`.
pub fn run(kind: RuntimeKind, path: &Path, inputs: &[NamedTensor]) -> Vec<NamedTensor> {
    let mut rt = runtime::open(kind, path, &options())
        .unwrap_or_else(|e| panic!("open {} in {}: {e}", path.display(), kind.name()));
    rt.run(inputs)
        .unwrap_or_else(|e| panic!("run {} in {}: {e}", path.display(), kind.name()))
}

/// The single f32 output of a result.
pub fn f32_output(outputs: &[NamedTensor]) -> ndarray::ArrayD<f32> {
    assert_eq!(outputs.len(), 1, "one output expected");
    match &outputs[0].value {
        TensorValue::F32(a) => a.clone(),
        other => panic!("expected f32 output, got {other:?}"),
    }
}

/// Normwise relative difference max|a − b| / max|b|.
pub fn rel_diff(a: &ndarray::ArrayD<f32>, b: &ndarray::ArrayD<f32>) -> f64 {
    assert_eq!(a.shape(), b.shape(), "shapes differ");
    let max_b = b.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let max_d = a
        .iter()
        .zip(b.iter())
        .fold(0f64, |m, (x, y)| m.max(f64::from((x - y).abs())));
    assert!(max_b > 0.0, "reference is all zero");
    max_d / max_b
}

/// The Python interpreter with `onnx` and `onnxruntime` (scripts/test sets GMLP_ONNX_PYTHON).
pub fn python() -> String {
    std::env::var("GMLP_ONNX_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `onnx.checker.check_model(full_check=True)` on each file; panics with the
/// checker's message on any failure.
pub fn onnx_check(paths: &[PathBuf]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check_onnx.py");
    let out = Command::new(python())
        .arg(script)
        .args(paths)
        .output()
        .expect("run python (set GMLP_ONNX_PYTHON or run scripts/test)");
    assert!(
        out.status.success(),
        "onnx checker failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The two runtimes that need no GPU: tract and ONNX Runtime on its CPU execution provider.
pub const CPU_RUNTIMES: [RuntimeKind; 2] = [RuntimeKind::Tract, RuntimeKind::OrtCpu];

/// Runs the `gmlp-onnx` binary with `args`.
pub fn gmlp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .args(args)
        .output()
        .expect("run gmlp-onnx")
}

/// stdout then stderr of a finished command, for assertion messages.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every file and folder under `dir`, sorted, for "nothing was written" checks.
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            out.push(e.path());
            out.extend(tree(&e.path()));
        }
    }
    out.sort();
    out
}

/// Runs `gmlp-onnx args` and checks that it is refused in one line naming `expected`,
/// with exit code 2.
pub fn assert_refused(args: &[&str], expected: &str) {
    let o = gmlp(args);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {text}");
    assert!(text.contains(expected), "{args:?}: {text}");
    assert_eq!(text.trim().lines().count(), 1, "one line: {text}");
    assert!(text.starts_with("gmlp-onnx: error: "), "{text}");
}

/// A path as `&str` for command lines.
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Runs a Python snippet (NumPy, onnx, onnxruntime) with `args` as sys.argv[1:];
/// panics with its output on failure, returns its stdout.
pub fn run_python(script: &str, args: &[&Path]) -> String {
    let o = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python (set GMLP_ONNX_PYTHON or run scripts/test)");
    assert!(o.status.success(), "python failed: {}", output_text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The sizes of the small aMLPs the tests build from `--preset amlp-base`.
#[derive(Clone, Copy, Debug)]
pub enum Amlp {
    /// d_model 16, d_ffn 32, attn_dim 4, n = 8, vocabulary 20: builds and runs in
    /// milliseconds.
    Tiny,
    /// The preset's widths with n = 32 and a vocabulary of 300.
    Short,
    /// d_model 64, d_ffn 256, attn_dim 32, n = 64, vocabulary 256: the docs' decoding
    /// loops and the examples/web page.
    Medium,
}

impl Amlp {
    /// The build flags after `--preset amlp-base --layers L`.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Amlp::Tiny => &[
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
            ],
            Amlp::Short => &["--seq-len", "32", "--vocab-size", "300"],
            Amlp::Medium => &[
                "--d-model",
                "64",
                "--d-ffn",
                "256",
                "--attn-dim",
                "32",
                "--seq-len",
                "64",
                "--vocab-size",
                "256",
            ],
        }
    }
}

/// A `gmlp-onnx build` command line: a preset (or [`Build::amlp`]'s small sizes) or a
/// checkpoint, and the test's own flags; [`Build::write`] runs it and asserts success,
/// [`Build::run`] returns what happened.
#[derive(Clone, Debug)]
pub struct Build(Vec<String>);

impl Build {
    /// `build --preset NAME`.
    pub fn preset(name: &str) -> Build {
        Build(vec!["build".into(), "--preset".into(), name.into()])
    }

    /// `build --weights CHECKPOINT`.
    pub fn weights(checkpoint: &Path) -> Build {
        Build(vec![
            "build".into(),
            "--weights".into(),
            path_str(checkpoint).into(),
        ])
    }

    /// `build --preset amlp-base --layers LAYERS` at one of the tests' small sizes.
    pub fn amlp(layers: usize, size: Amlp) -> Build {
        Build::preset("amlp-base")
            .args(&["--layers", &layers.to_string()])
            .args(size.flags())
    }

    /// The command line with `args` appended.
    pub fn args(mut self, args: &[&str]) -> Build {
        self.0.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The arguments of `gmlp-onnx`, then `-o OUT`.
    pub fn argv<'a>(&'a self, out: &'a Path) -> Vec<&'a str> {
        let mut argv: Vec<&str> = self.0.iter().map(String::as_str).collect();
        argv.extend(["-o", path_str(out)]);
        argv
    }

    /// Runs `gmlp-onnx` with the arguments and `-o OUT`.
    pub fn run(&self, out: &Path) -> Output {
        gmlp(&self.argv(out))
    }

    /// Runs it quietly (`-q -o OUT`), asserts success and returns OUT.
    pub fn write(&self, out: &Path) -> PathBuf {
        let o = self.clone().args(&["-q"]).run(out);
        assert!(o.status.success(), "{:?}: {}", self.0, output_text(&o));
        out.to_path_buf()
    }
}

/// `dir/v.onnx`: gmlp-ti16 with one block on 32x32 images (pixel_values [batch, 3, 32, 32]).
pub fn small_vision_model(dir: &Path) -> PathBuf {
    Build::preset("gmlp-ti16")
        .args(&["--layers", "1", "--image-size", "32", "--init", "spread"])
        .write(&dir.join("v.onnx"))
}

/// `dir/t.onnx`: amlp-base with one block, n = 32, vocabulary 300 (input_ids [batch, 32]).
pub fn small_token_model(dir: &Path) -> PathBuf {
    Build::amlp(1, Amlp::Short)
        .args(&["--init", "spread"])
        .write(&dir.join("t.onnx"))
}

/// A tensor of a safetensors file written by the fixture scripts (F32 or I64), `None` when
/// the file has no tensor of that name.
pub fn safetensors_tensor(st: &safetensors::SafeTensors, name: &str) -> Option<TensorValue> {
    use ndarray::{ArrayD, IxDyn};
    use safetensors::tensor::Dtype;
    let t = st.tensor(name).ok()?;
    let shape = IxDyn(t.shape());
    Some(match t.dtype() {
        Dtype::F32 => TensorValue::F32(
            ArrayD::from_shape_vec(
                shape,
                t.data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
            .unwrap(),
        ),
        Dtype::I64 => TensorValue::I64(
            ArrayD::from_shape_vec(
                shape,
                t.data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
            .unwrap(),
        ),
        other => panic!("{name}: unexpected {other:?}"),
    })
}

/// `fixtures/NAME` in the repository (the trained checkpoints and their stored outputs).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The index of the largest value of each row (last axis) of `a`.
pub fn argmax_rows(a: &ndarray::ArrayD<f32>) -> Vec<usize> {
    let last = *a.shape().last().unwrap();
    a.as_slice()
        .unwrap()
        .chunks(last)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
                .0
        })
        .collect()
}

/// `gmlp-onnx inspect PATH --json`, parsed (the command must succeed).
pub fn inspect_json(path: &Path) -> serde_json::Value {
    let o = gmlp(&["inspect", path_str(path), "--json"]);
    assert!(o.status.success(), "{}", output_text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The JSON file at `path`, parsed.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `gmlp-onnx validate MODEL ARGS --report MODEL.report.json`: what happened and the parsed
/// report (written whether the runtimes agree or not).
pub fn validate_with_report(model: &Path, args: &[&str]) -> (Output, serde_json::Value) {
    let report = model.with_extension("report.json");
    let _ = std::fs::remove_file(&report);
    let mut argv = vec!["validate", path_str(model)];
    argv.extend_from_slice(args);
    argv.extend(["--report", path_str(&report)]);
    let o = gmlp(&argv);
    assert!(report.exists(), "no report: {}", output_text(&o));
    (o, read_json(&report))
}

/// [`validate_with_report`] of a validation that must pass: the parsed report.
pub fn validate_report(model: &Path, args: &[&str]) -> serde_json::Value {
    let (o, report) = validate_with_report(model, args);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(report["pass"], true);
    report
}

/// `gmlp-onnx generate MODEL ARGS --json`, parsed (the command must succeed): one result
/// per runtime.
pub fn generate_json(model: &Path, args: &[&str]) -> serde_json::Value {
    let mut argv = vec!["generate", path_str(model)];
    argv.extend_from_slice(args);
    argv.push("--json");
    let o = gmlp(&argv);
    assert!(o.status.success(), "{}", output_text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Exit code `code`, a one-line error on stderr containing every needle, no panic.
pub fn assert_fails(o: &Output, code: i32, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{}", output_text(o));
    for needle in needles {
        assert!(err.contains(needle), "expected '{needle}' in: {err}");
    }
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
}

/// How many nodes of the model at `path` have `op` as their type.
pub fn op_count(path: &Path, op: &str) -> usize {
    let m = gmlp_onnx::onnx::reader::read_model(path).unwrap();
    m.graph
        .unwrap()
        .node
        .iter()
        .filter(|n| n.op_type() == op)
        .count()
}

/// The ```python blocks of docs/`page`, in order (the docs' loops, run as written).
pub fn doc_python_blocks(page: &str) -> Vec<String> {
    use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(page);
    let text = std::fs::read_to_string(&path).expect("read the page");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) if &*lang == "python" => {
                current = Some(String::new())
            }
            Event::Text(t) => {
                if let Some(c) = current.as_mut() {
                    c.push_str(&t)
                }
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(current.take()),
            _ => {}
        }
    }
    blocks
}
