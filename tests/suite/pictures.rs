//! Pictures: `inspect --plot` (one PNG per block of the spatial weights W and an overview)
//! on trained timm and g-mlp-pytorch checkpoints, the Toeplitz-ness `inspect` reports
//! against NumPy's computation on the upstream checkpoint or on the file's own initializers
//! (read by the `onnx` package), and `validate --plot` (one error histogram per output per
//! compared pair). Every PNG is decoded whole and its IHDR size checked against what the
//! command reported.
//!
//! Longer than ~500 lines: one module for one feature, its cases sharing the PNG decoder
//! and the NumPy-computed Toeplitz-ness helpers at the top.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::{gmlp, output_text as text, path_str as s, run_python as py, Build};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
        .join("model.safetensors")
}

fn build(out: &Path, args: &[&str]) {
    let mut all = vec!["build", "-q", "-o", s(out)];
    all.extend_from_slice(args);
    let o = gmlp(&all);
    assert!(o.status.success(), "{}", text(&o));
}

fn inspect_json(model: &Path, plot: Option<&Path>) -> serde_json::Value {
    let mut args = vec!["inspect", s(model), "--json"];
    if let Some(dir) = plot {
        args.extend_from_slice(&["--plot", s(dir)]);
    }
    let o = gmlp(&args);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The PNG's size from its IHDR, after checking the signature and decoding every row.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR", "{}", path.display());
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let (w, h) = (be(16), be(20));
    let mut reader = png::Decoder::new(std::io::Cursor::new(&bytes[..]))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut buf).unwrap();
    assert_eq!((frame.width, frame.height), (w, h));
    (w, h)
}

fn files_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Checks every picture the JSON lists (and that the directory holds exactly these).
fn check_plots(json: &serde_json::Value, dir: &Path, names: &[&str]) {
    let plots = json["plots"].as_array().unwrap();
    let expected: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    assert_eq!(files_in(dir), expected);
    assert_eq!(plots.len(), names.len());
    for p in plots {
        let file = Path::new(p["file"].as_str().unwrap());
        let size = png_size(file);
        assert_eq!(
            (size.0 as u64, size.1 as u64),
            (p["width"].as_u64().unwrap(), p["height"].as_u64().unwrap()),
            "{}",
            file.display()
        );
        assert!(size.0 >= 300 && size.1 >= 200, "{size:?}");
    }
}

/// NumPy: Toeplitz-ness per matrix, `‖T(W)‖² / ‖W‖²` over the cells where `mask`, T(W)
/// the mean of each diagonal. Input on stdin of the script: a list of (matrix, causal).
const TOEPLITZ_PY: &str = "
import numpy as np
def toeplitz_ness(w, causal):
    n, m = w.shape
    read = np.tril(np.ones((n, m), bool)) if causal else np.ones((n, m), bool)
    w = w.astype(np.float64)
    num = 0.0
    for k in range(-n + 1, m):
        cells = np.diagonal(w, k)[np.diagonal(read, k)]
        if cells.size:
            num += cells.sum() ** 2 / cells.size
    den = (w[read] ** 2).sum()
    return num / den
";

/// NumPy's Toeplitz-ness of each block (all heads together) of a safetensors checkpoint,
/// from the tensors whose names end with `suffix`, in block order.
fn reference_from_checkpoint(path: &Path, suffix: &str, causal: bool) -> Vec<f64> {
    let script = format!(
        "{TOEPLITZ_PY}
import json, re, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
blocks = []
for key, v in header.items():
    if key.endswith('{suffix}'):
        s, e = v['data_offsets']
        w = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v['shape'])
        w = w.reshape(-1, w.shape[-2], w.shape[-1])
        block = int(re.search(r'\\.(\\d+)\\.', key).group(1))
        blocks.append((block, w))
out = []
for _, w in sorted(blocks, key=lambda x: x[0]):
    read = np.tril(np.ones(w.shape[1:], bool)) if {causal} else np.ones(w.shape[1:], bool)
    num = sum(toeplitz_ness(h, {causal}) * (h.astype(np.float64)[read] ** 2).sum() for h in w)
    den = sum((h.astype(np.float64)[read] ** 2).sum() for h in w)
    out.append(num / den)
print(json.dumps(out))
",
        causal = if causal { "True" } else { "False" }
    );
    serde_json::from_str(&py(&script, &[path])).unwrap()
}

/// NumPy's Toeplitz-ness of each block of an ONNX file, from its own initializers as the
/// `onnx` package reads them (an int8 Wᵀ dequantized with its per-column scales).
fn reference_from_onnx(path: &Path, layers: usize, causal: bool) -> Vec<f64> {
    let script = format!(
        "{TOEPLITZ_PY}
import json, sys, onnx
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
init = {{t.name: numpy_helper.to_array(t) for t in m.graph.initializer}}
out = []
for i in range({layers}):
    name = f'blocks.{{i}}.sgu.spatial.weight'
    if name in init:
        w = init[name].astype(np.float64)
        n = w.shape[-1]
        w = w.reshape(-1, n, n)
    else:
        q = init[name + '.transposed.int8'].astype(np.float64)
        s = init[name + '.transposed.scale'].astype(np.float64)
        q = q.reshape(-1, q.shape[-2], q.shape[-1])
        s = s.reshape(q.shape[0], 1, q.shape[-1])
        w = np.transpose(q * s, (0, 2, 1))
    read = np.tril(np.ones(w.shape[1:], bool)) if {causal} else np.ones(w.shape[1:], bool)
    num = sum(toeplitz_ness(h, {causal}) * (h[read] ** 2).sum() for h in w)
    den = sum((h[read] ** 2).sum() for h in w)
    out.append(num / den)
print(json.dumps(out))
",
        causal = if causal { "True" } else { "False" }
    );
    serde_json::from_str(&py(&script, &[path])).unwrap()
}

fn scores(json: &serde_json::Value) -> Vec<f64> {
    json["spatial"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["toeplitz_ness"].as_f64().unwrap())
        .collect()
}

fn assert_close(ours: &[f64], reference: &[f64], tol: f64) {
    assert_eq!(ours.len(), reference.len(), "{ours:?} vs {reference:?}");
    for (a, b) in ours.iter().zip(reference) {
        assert!((a - b).abs() <= tol, "{ours:?} vs {reference:?}");
    }
}

#[test]
fn trained_timm_and_g_mlp_pytorch_checkpoints_give_one_picture_per_block_and_an_overview() {
    let dir = tempfile::tempdir().unwrap();
    // (fixture, import flags, tensor name suffix of W upstream, causal)
    let cases: [(&str, &[&str], &str, bool); 3] = [
        ("timm_gmlp_vision", &[], "gate.proj.weight", false),
        ("lucid_tokens_causal", &["--causal"], "sgu.weight", true),
        ("lucid_heads2", &[], "sgu.weight", false),
    ];
    for (name, flags, suffix, causal) in cases {
        let model = dir.path().join(format!("{name}.onnx"));
        let checkpoint = fixture(name);
        let mut args = vec!["--weights", s(&checkpoint)];
        args.extend_from_slice(flags);
        build(&model, &args);
        let pictures = dir.path().join(format!("{name}-pictures"));
        let json = inspect_json(&model, Some(&pictures));
        check_plots(
            &json,
            &pictures,
            &["block_0.png", "block_1.png", "overview.png"],
        );
        // Toeplitz-ness as NumPy computes it on the upstream tensors.
        let reference = reference_from_checkpoint(&checkpoint, suffix, causal);
        assert_close(&scores(&json), &reference, 1e-9);
        let blocks = json["spatial"].as_array().unwrap();
        let heads = if name == "lucid_heads2" { 2 } else { 1 };
        for b in blocks {
            assert_eq!(b["shape"][0], heads, "{b}");
            assert_eq!(b["head_toeplitz_ness"].as_array().unwrap().len(), heads);
            assert_eq!(b["reads"], if causal { "causal: j <= i" } else { "all" });
        }
    }
}

#[test]
fn a_toeplitz_model_scores_one_and_a_dense_random_one_well_below() {
    let dir = tempfile::tempdir().unwrap();
    let small = [
        "--preset",
        "gmlp-base",
        "--layers",
        "2",
        "--d-model",
        "32",
        "--d-ffn",
        "64",
        "--seq-len",
        "24",
        "--vocab-size",
        "50",
        "--init",
        "spread",
    ];
    for (form, causal) in [
        ("toeplitz-expand", false),
        ("toeplitz-expand", true),
        ("toeplitz-gather", false),
        ("toeplitz-gather", true),
    ] {
        let model = dir.path().join(format!("{form}-{causal}.onnx"));
        let mut args = small.to_vec();
        args.extend_from_slice(&["--spatial", form]);
        if causal {
            args.push("--causal");
        }
        build(&model, &args);
        let json = inspect_json(&model, None);
        let s = scores(&json);
        assert_eq!(s.len(), 2);
        assert!(
            s.iter().all(|v| (v - 1.0).abs() < 1e-6),
            "{form} {causal}: {s:?}"
        );
        // The file's own initializers, through onnx and NumPy (expanded by the reference).
        if form == "toeplitz-expand" {
            assert_close(&s, &reference_from_onnx(&model, 2, causal), 1e-9);
        }
    }
    let model = dir.path().join("dense.onnx");
    let mut args = small.to_vec();
    args.extend_from_slice(&["--spatial", "dense"]);
    build(&model, &args);
    let json = inspect_json(&model, None);
    let s = scores(&json);
    assert_close(&s, &reference_from_onnx(&model, 2, false), 1e-9);
    // I.i.d. uniform W: about (2n − 1)/n² ≈ 0.08 for n = 24; far from 1.
    let level = json["spatial"][0]["random_level"].as_f64().unwrap();
    assert!((level - 47.0 / 576.0).abs() < 1e-12, "{level}");
    assert!(s.iter().all(|&v| v < 0.3), "{s:?}");
}

#[test]
fn int8_f16_and_windowed_files_read_back_the_w_they_store() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = fixture("lucid_heads2");
    let f32_model = dir.path().join("f32.onnx");
    build(&f32_model, &["--weights", s(&checkpoint)]);
    let f32_scores = scores(&inspect_json(&f32_model, None));
    for dtype in ["int8", "f16"] {
        let model = dir.path().join(format!("{dtype}.onnx"));
        build(&model, &["--weights", s(&checkpoint), "--dtype", dtype]);
        let pictures = dir.path().join(dtype);
        let json = inspect_json(&model, Some(&pictures));
        check_plots(
            &json,
            &pictures,
            &["block_0.png", "block_1.png", "overview.png"],
        );
        let s = scores(&json);
        assert_close(&s, &reference_from_onnx(&model, 2, false), 1e-9);
        // Quantization and rounding move the score a little.
        assert_close(&s, &f32_scores, 1e-2);
        let stored = json["spatial"][0]["stored"].as_str().unwrap();
        assert_eq!(stored, if dtype == "int8" { "int8" } else { "dense" });
    }
    // g-mlp-gpt's local window: W [w, 2w] with the cells above j = i + w never read.
    let model = dir.path().join("window.onnx");
    build(
        &model,
        &["--weights", s(&fixture("gpt_window")), "--seq-len", "32"],
    );
    let pictures = dir.path().join("window");
    let json = inspect_json(&model, Some(&pictures));
    check_plots(
        &json,
        &pictures,
        &["block_0.png", "block_1.png", "overview.png"],
    );
    let b = &json["spatial"][0];
    assert_eq!(b["shape"], serde_json::json!([1, 8, 16]));
    assert_eq!(b["stored"], "window");
    // Rows i < 8, columns j ≤ i + 8: 8·9 + 8·8 cells on 16 diagonals.
    assert!((b["random_level"].as_f64().unwrap() - 16.0 / 100.0).abs() < 1e-12);
    // NumPy on the stored [8 · 16] weights, over j ≤ i + 8 (diagonals j − i = k).
    let reference = py(
        &format!(
            "{TOEPLITZ_PY}
import json, sys, onnx
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
init = {{t.name: numpy_helper.to_array(t) for t in m.graph.initializer}}
out = []
for i in range(2):
    w = init[f'blocks.{{i}}.sgu.spatial.weight'].astype(np.float64).reshape(8, 16)
    read = np.fromfunction(lambda r, c: c <= r + 8, (8, 16))
    num = 0.0
    for k in range(-7, 16):
        cells = np.diagonal(w, k)[np.diagonal(read, k)]
        if cells.size:
            num += cells.sum() ** 2 / cells.size
    out.append(num / (w[read] ** 2).sum())
print(json.dumps(out))
"
        ),
        &[&model],
    );
    let reference: Vec<f64> = serde_json::from_str(&reference).unwrap();
    assert_close(&scores(&json), &reference, 1e-9);
}

#[test]
fn validate_plot_writes_one_histogram_per_output_and_pair() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("past.onnx");
    Build::preset("amlp-base")
        .args(&[
            "--layers",
            "2",
            "--d-model",
            "32",
            "--d-ffn",
            "64",
            "--attn-dim",
            "16",
            "--seq-len",
            "16",
            "--vocab-size",
            "40",
            "--causal",
            "--with-past",
        ])
        .write(&model);
    let outputs: Vec<String> = inspect_json(&model, None)["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_string())
        .collect();
    assert!(outputs.len() > 2, "{outputs:?}");
    let saved = dir.path().join("out.npz");
    let o = gmlp(&["validate", s(&model), "--save-outputs", s(&saved)]);
    assert!(o.status.success(), "{}", text(&o));
    let pictures = dir.path().join("errors");
    let o = gmlp(&[
        "validate",
        s(&model),
        "--expected",
        s(&saved),
        "--plot",
        s(&pictures),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let pairs = [
        ("tract", "ort-cpu"),
        ("expected", "tract"),
        ("expected", "ort-cpu"),
    ];
    let mut expected = BTreeSet::new();
    for (a, b) in pairs {
        for output in &outputs {
            let name = format!("{a}_vs_{b}_{}.png", output.replace(['_', '/'], "-"));
            let path = pictures.join(&name);
            assert_eq!(png_size(&path), (860, 540), "{name}");
            assert!(
                out.contains(&format!("picture {} (860 x 540)", path.display())),
                "{out}"
            );
            expected.insert(name);
        }
    }
    assert_eq!(files_in(&pictures), expected);
}

#[test]
fn plot_requests_that_cannot_be_met_fail_cleanly_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pictures = dir.path().join("pictures");
    // A checkpoint instead of an ONNX file: the command that makes one.
    let checkpoint = fixture("timm_gmlp_vision");
    let o = gmlp(&["inspect", s(&checkpoint), "--plot", s(&pictures)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains("is a checkpoint") && err.contains("gmlp-onnx build --weights"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!pictures.exists());
    // A file without the recorded configuration: plain inspect still works.
    let model = dir.path().join("m.onnx");
    Build::preset("gmlp-ti16")
        .args(&["--layers", "1", "--image-size", "32"])
        .write(&model);
    let bare = dir.path().join("bare.onnx");
    py(
        "import sys, onnx\n\
         m = onnx.load(sys.argv[1])\n\
         del m.metadata_props[:]\n\
         onnx.save(m, sys.argv[2])\n",
        &[&model, &bare],
    );
    let o = gmlp(&["inspect", s(&bare), "--plot", s(&pictures)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no gmlp_onnx.config metadata"),
        "{}",
        text(&o)
    );
    assert!(!pictures.exists());
    let json = inspect_json(&bare, None);
    assert_eq!(json["spatial"], serde_json::json!([]));
    assert!(json["spatial_unavailable"]
        .as_str()
        .unwrap()
        .contains("no gmlp_onnx.config"));
    // A picture directory that is a file.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let o = gmlp(&["inspect", s(&model), "--plot", s(&file)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("is not a directory"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
}

#[test]
fn hostile_sizes_are_refused_before_anything_large_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.onnx");
    Build::preset("gmlp-base")
        .args(&[
            "--layers",
            "1",
            "--d-model",
            "16",
            "--d-ffn",
            "32",
            "--seq-len",
            "8",
            "--vocab-size",
            "20",
            "--spatial",
            "toeplitz-gather",
        ])
        .write(&model);
    // The recorded n raised to 40000: W's 79999-value vector (320 KB) would expand to
    // 1.6e9 values for a picture. And a dense W that declares [65536, 65536] but holds 4 bytes.
    let (vector, dense) = (
        dir.path().join("vector.onnx"),
        dir.path().join("dense.onnx"),
    );
    py(
        "import sys, json, onnx, numpy as np\n\
         from onnx import numpy_helper\n\
         m = onnx.load(sys.argv[1])\n\
         p = [p for p in m.metadata_props if p.key == 'gmlp_onnx.config'][0]\n\
         cfg = json.loads(p.value)\n\
         cfg['task']['seq_len'] = 40000\n\
         p.value = json.dumps(cfg)\n\
         w = [t for t in m.graph.initializer if t.name == 'blocks.0.sgu.spatial.weight'][0]\n\
         w.CopyFrom(numpy_helper.from_array(np.full(79999, 0.5, np.float32), w.name))\n\
         onnx.save(m, sys.argv[2])\n\
         cfg['task']['seq_len'] = 65536\n\
         cfg['spatial'] = 'dense'\n\
         p.value = json.dumps(cfg)\n\
         w.CopyFrom(numpy_helper.from_array(np.zeros(1, np.float32), w.name))\n\
         w.dims[:] = [65536, 65536]\n\
         onnx.save(m, sys.argv[3])\n",
        &[&model, &vector, &dense],
    );
    let json = inspect_json(&vector, None);
    assert_eq!(scores(&json), vec![1.0]);
    let pictures = dir.path().join("p");
    let o = gmlp(&["inspect", s(&vector), "--plot", s(&pictures)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("expands to 1600000000 values"),
        "{}",
        text(&o)
    );
    assert!(!pictures.exists());
    let json = inspect_json(&dense, None);
    let why = json["spatial_unavailable"].as_str().unwrap();
    assert!(
        why.contains("4 bytes of data for dims [65536, 65536]"),
        "{why}"
    );
    let o = gmlp(&["inspect", s(&dense), "--plot", s(&pictures)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!pictures.exists());
}
