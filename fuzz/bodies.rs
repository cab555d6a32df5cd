//! What each fuzz target does with its input. Shared by the libFuzzer targets in
//! fuzz/fuzz_targets/ and by the regression tests in tests/suite/hostile/, which replay the
//! committed corpora and crashers through the same functions.
//!
//! A body may refuse its input (every reader returns `Err` with a message); it must never
//! panic, hang, or allocate far beyond what the input itself justifies. Where a reader
//! accepts its input, the body also checks the reader's promises (value counts, shapes).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use gmlp_onnx::checkpoint::{Checkpoint, Format, Import, ImportHints};
use gmlp_onnx::gmlp::config::SpatialForm;
use gmlp_onnx::gmlp::weights::{param_specs, WeightSource};

/// Largest model (stored f32 values) a body goes on to emit and encode in memory.
const MAX_EMITTED_VALUES: u128 = 1 << 20;

/// A path that exists nowhere, so that external data lookups fail cleanly.
fn nowhere(name: &str) -> std::path::PathBuf {
    Path::new("/nonexistent-gmlp-onnx-fuzz").join(name)
}

/// Safetensors bytes (or anything else given as a checkpoint): open, then read every
/// tensor's shape and values.
pub fn safetensors_reader(data: &[u8]) {
    let Ok(checkpoint) = Checkpoint::from_bytes(&nowhere("in.safetensors"), data.to_vec()) else {
        return;
    };
    let keys: Vec<String> = checkpoint.keys().map(str::to_string).collect();
    for key in keys {
        let shape = checkpoint
            .shape(&key)
            .expect("listed key has a shape")
            .to_vec();
        if let Ok(values) = checkpoint.f32(&key) {
            assert_eq!(values.len(), shape.iter().product::<usize>(), "{key}");
            assert!(values.iter().all(|v| v.is_finite()), "{key}");
        }
    }
}

/// `.npz` archive bytes, and the same bytes as a bare `.npy` array.
pub fn npz_reader(data: &[u8]) {
    let cursor = std::io::Cursor::new(data);
    if let Ok(arrays) = gmlp_onnx::npz::read_npz_from(cursor, data.len() as u64, "fuzz.npz") {
        for a in arrays {
            let count: usize = a.value.shape().iter().product();
            assert_eq!(count, a.value.to_f64().len());
        }
    }
    if let Ok(value) = gmlp_onnx::npz::parse_npy(data, "fuzz.npy") {
        let again = gmlp_onnx::npz::parse_npy(&gmlp_onnx::npz::encode_npy(&value), "again")
            .expect("an array we encoded reads back");
        assert_eq!(again.shape(), value.shape());
    }
}

/// A checkpoint described by a text manifest, built into a valid safetensors file so that
/// the format detector, the architecture inference and the weight rules are reached
/// (random bytes rarely get past a JSON header). One entry per line:
///
/// * `NAME DIMS [F32|F16|BF16|F64|I64] [ramp|const|toeplitz|nan]` — a tensor; DIMS is
///   `-` for a scalar or sizes joined by `x` (`64x128`);
/// * `@KEY VALUE` — a `__metadata__` string (the native format keeps its config there);
/// * `!causal`, `!allow_unused`, `!shift N`, `!in_chans N`, `!patch N`, `!image N`,
///   `!format timm|lucidrains|native`, `!spatial dense|toeplitz-expand|toeplitz-gather`,
///   `!tol X` — import hints, as the CLI flags give them.
///
/// An accepted checkpoint must serve every parameter with the right number of finite
/// values, and (when small) emit and encode as an ONNX model.
pub fn checkpoint_format(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((bytes, hints)) = manifest_to_safetensors(text) else {
        return;
    };
    let Ok(checkpoint) = Checkpoint::from_bytes(&nowhere("manifest.safetensors"), bytes) else {
        return;
    };
    let Ok(import) = Import::from_checkpoint(checkpoint, &hints) else {
        return;
    };
    let config = import.config.clone();
    if config.stored_f32_estimate() > MAX_EMITTED_VALUES {
        return;
    }
    let weights = import.weights(&config);
    let mut all_served = true;
    for spec in param_specs(&config) {
        match weights.values(&spec) {
            Ok(values) => {
                assert_eq!(
                    values.len(),
                    spec.shape.iter().product::<usize>(),
                    "{}",
                    spec.name
                );
                assert!(values.iter().all(|v| v.is_finite()), "{}", spec.name);
            }
            Err(_) => all_served = false,
        }
    }
    if all_served {
        let source: Arc<dyn WeightSource> = Arc::new(weights);
        if let Ok(export) = gmlp_onnx::gmlp::export::export(&config, source, "fuzz", None, 17) {
            let _ = gmlp_onnx::onnx::writer::encode_model_to_vec(&export.graph, &export.info);
        }
    }
}

/// ONNX bytes given to `inspect` / `validate`: decode, summarize and render, resolve the
/// input shapes (without allocating them) and check external data references.
pub fn onnx_reader(data: &[u8]) {
    let path = nowhere("model.onnx");
    let Ok(model) = gmlp_onnx::onnx::reader::decode_model(data, &path) else {
        return;
    };
    let summary = gmlp_onnx::inspect::summarize(&model, &path);
    let _ = summary.render();
    let _ = serde_json::to_string(&summary);
    let _ = gmlp_onnx::onnx::reader::declared_outputs(&model);
    let _ = gmlp_onnx::onnx::reader::stored_f32_count(&model);
    let _ = gmlp_onnx::validate::stored_config(&model);
    let _ = gmlp_onnx::validate::input_shapes(&model, 2, &[("n".into(), 3)]);
    let _ = gmlp_onnx::onnx::reader::check_external_data(&model, &path);
}

fn manifest_to_safetensors(text: &str) -> Option<(Vec<u8>, ImportHints)> {
    let mut hints = ImportHints::default();
    let mut metadata = serde_json::Map::new();
    let mut tensors: Vec<(String, &'static str, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut total = 0usize;
    let number = |w: Option<&str>| w.and_then(|s| s.parse::<usize>().ok());
    for (line_no, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some(key) = first.strip_prefix('@') {
            let value: Vec<&str> = words.collect();
            metadata.insert(key.to_string(), value.join(" ").into());
            continue;
        }
        if let Some(hint) = first.strip_prefix('!') {
            match hint {
                "causal" => hints.causal = true,
                "allow_unused" => hints.allow_unused = true,
                "shift" => hints.shift_tokens = number(words.next())?,
                "in_chans" => hints.in_chans = Some(number(words.next())?),
                "patch" => hints.patch_size = Some(number(words.next())?),
                "image" => hints.image_size = Some(number(words.next())?),
                "tol" => hints.toeplitz_tolerance = words.next()?.parse().ok()?,
                "format" => {
                    hints.format = Some(match words.next()? {
                        "timm" => Format::Timm,
                        "lucidrains" => Format::Lucidrains,
                        _ => Format::Native,
                    })
                }
                "spatial" => {
                    hints.spatial = Some(match words.next()? {
                        "dense" => SpatialForm::Dense,
                        "toeplitz-expand" => SpatialForm::ToeplitzExpand,
                        _ => SpatialForm::ToeplitzGather,
                    })
                }
                _ => return None,
            }
            continue;
        }
        let dims = words.next()?;
        let shape: Vec<usize> = if dims == "-" {
            Vec::new()
        } else {
            dims.split('x')
                .map(|d| d.parse().ok())
                .collect::<Option<_>>()?
        };
        let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        total = total.checked_add(count)?;
        if total > 1 << 22 {
            return None;
        }
        let (dtype, size) = match words.next().unwrap_or("F32") {
            "F16" => ("F16", 2),
            "BF16" => ("BF16", 2),
            "F64" => ("F64", 8),
            "I64" => ("I64", 8),
            _ => ("F32", 4),
        };
        let fill = words.next().unwrap_or("ramp");
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let mut bytes = Vec::with_capacity(count * size);
        for k in 0..count {
            let v: f64 = match fill {
                "const" => 0.5,
                "nan" if k == 0 => f64::NAN,
                // W[i, j] = f(j − i): a Toeplitz matrix, whatever the shape.
                "toeplitz" => ((k % cols) as f64 - (k / cols) as f64) * 0.01,
                _ => ((k * 7919 + line_no * 31) % 97) as f64 / 97.0 - 0.5,
            };
            match dtype {
                "F16" => bytes.extend(half::f16::from_f64(v).to_le_bytes()),
                "BF16" => bytes.extend(half::bf16::from_f64(v).to_le_bytes()),
                "F64" => bytes.extend(v.to_le_bytes()),
                "I64" => bytes.extend((v * 100.0).round().to_bits().to_le_bytes()),
                _ => bytes.extend((v as f32).to_le_bytes()),
            }
        }
        tensors.push((first.to_string(), dtype, shape, bytes));
    }
    // The safetensors layout: u64 header length, JSON header, then the data in order.
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), metadata.into());
    }
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in &tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes.len()]}),
        );
        offset += bytes.len();
    }
    let header = serde_json::to_vec(&header).ok()?;
    let mut out = Vec::with_capacity(8 + header.len() + offset);
    out.extend((header.len() as u64).to_le_bytes());
    out.extend(header);
    for (_, _, _, bytes) in tensors {
        out.extend(bytes);
    }
    Some((out, hints))
}

/// PyTorch checkpoint bytes: read as a whole torch file (zip or legacy), and the same bytes
/// as the `data.pkl` of a torch zip archive whose storages `0` to `3` hold 64 bytes each,
/// so that the restricted unpickler and the view checks see arbitrary pickles.
pub fn pytorch_reader(data: &[u8]) {
    use gmlp_onnx::checkpoint::pytorch::read_bytes;
    let check = |tensors: Vec<gmlp_onnx::tensor::NamedTensor>| {
        for t in tensors {
            let count: usize = t.value.shape().iter().product();
            assert_eq!(count, t.value.to_f64().len(), "{}", t.name);
        }
    };
    if let Ok(tensors) = read_bytes(data.to_vec(), "fuzz.pt") {
        check(tensors);
    }
    if let Ok(tensors) = read_bytes(torch_zip_around(data), "fuzz-wrapped.pt") {
        check(tensors);
    }
}

/// A torch-style zip archive with `pickle` as `archive/data.pkl` and four 64-byte storages.
fn torch_zip_around(pickle: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let ramp: Vec<u8> = (0..64u8).collect();
    let mut members: Vec<(String, &[u8])> = vec![("archive/data.pkl".into(), pickle)];
    for key in 0..4 {
        members.push((format!("archive/data/{key}"), &ramp));
    }
    for (name, bytes) in members {
        zip.start_file(name, options).expect("in-memory zip");
        zip.write_all(bytes).expect("in-memory zip");
    }
    zip.finish().expect("in-memory zip").into_inner()
}
