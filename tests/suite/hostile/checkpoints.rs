//! Broken and hostile checkpoints given to `build --weights`: safetensors headers that lie,
//! truncated files, unsupported types, non-finite values, wrong shapes, hostile .npz.

use std::path::{Path, PathBuf};

use super::{assert_refused, file, run_limited, s, HANG_LIMIT};
use crate::common::{Amlp, Build};

/// A safetensors file: little-endian u64 header length, the header text, the data.
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

/// Refuses `build --weights PATH -o dir/out.onnx`.
fn refuse_weights(dir: &Path, weights: &Path, needle: &str) {
    let out = dir.join("out.onnx");
    assert_refused(
        dir,
        &["build", "--weights", s(weights), "-o", s(&out)],
        2,
        needle,
    );
}

/// A tiny native checkpoint written by gmlp-onnx itself, and its parsed header.
fn native_checkpoint(dir: &Path) -> (PathBuf, serde_json::Map<String, serde_json::Value>) {
    let path = dir.join("native.safetensors");
    let build = Build::amlp(1, Amlp::Tiny).args(&["-q", "--save-weights", s(&path)]);
    let o = run_limited(&build.argv(&dir.join("native.onnx")), HANG_LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_file(dir.join("native.onnx")).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (path, header)
}

/// The native checkpoint with its header edited by `edit` (data bytes unchanged).
fn edited(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> PathBuf {
    let (path, mut header) = native_checkpoint(dir);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    edit(&mut header);
    let text = serde_json::to_string(&header).unwrap();
    file(dir, name, &safetensors(&text, &bytes[8 + n..]))
}

#[test]
fn files_that_are_not_safetensors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    refuse_weights(d, &d.join("missing.safetensors"), "No such file");
    refuse_weights(d, d, "is a directory");
    let empty = file(d, "empty.safetensors", b"");
    refuse_weights(d, &empty, "0 bytes is too short for a safetensors file");
    let short = file(d, "short.safetensors", b"\x10\x00\x00");
    refuse_weights(d, &short, "3 bytes is too short");
    let huge_header = file(d, "huge.safetensors", &[0xff; 64]);
    refuse_weights(
        d,
        &huge_header,
        "not a safetensors file, PyTorch zip archive, legacy PyTorch file or .npz archive (read as safetensors, its first 8 bytes give a header of 18446744073709551615 bytes, over the 100 MB safetensors allows",
    );
    let mut past_end = 1000u64.to_le_bytes().to_vec();
    past_end.extend(b"{}");
    let past_end = file(d, "past_end.safetensors", &past_end);
    refuse_weights(
        d,
        &past_end,
        "a header of 1000 bytes, past the end of the 10-byte file",
    );
    let not_json = file(d, "not_json.safetensors", &safetensors("{{{{", b""));
    refuse_weights(
        d,
        &not_json,
        "its header is not a safetensors header's JSON",
    );
    let mut not_utf8 = 4u64.to_le_bytes().to_vec();
    not_utf8.extend([b'{', 0xff, 0xfe, b'}']);
    let not_utf8 = file(d, "not_utf8.safetensors", &not_utf8);
    refuse_weights(d, &not_utf8, "its header is not UTF-8 text");
    let no_tensor = file(d, "none.safetensors", &safetensors("{}", b""));
    refuse_weights(d, &no_tensor, "the file holds no tensor");
}

#[test]
fn headers_that_lie_about_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, header, data, needle) in [
        (
            "offsets_past_end",
            r#"{"w":{"dtype":"F32","shape":[250],"data_offsets":[0,1000]}}"#,
            &[0u8; 16][..],
            "a damaged safetensors file: the tensors' data does not end where the 83-byte file does",
        ),
        (
            "shape_bytes_mismatch",
            r#"{"w":{"dtype":"F32","shape":[3,3],"data_offsets":[0,16]}}"#,
            &[0u8; 16],
            "a damaged safetensors file: a tensor's data offsets do not span its shape times its element size",
        ),
        (
            "shape_overflow",
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}}"#,
            &[0u8; 16],
            "a damaged safetensors file: a tensor's shape has more elements than can be counted",
        ),
        (
            "overlapping_offsets",
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#,
            &[0u8; 24],
            "a damaged safetensors file: the data offsets of tensor b are out of order",
        ),
        (
            "offsets_reversed",
            r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}}"#,
            &[0u8; 16],
            "the data offsets of tensor a are out of order",
        ),
        (
            "unknown_dtype",
            r#"{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}"#,
            &[0u8; 16],
            "its header is not a safetensors header's JSON: unknown variant `F128`",
        ),
    ] {
        let path = file(
            d,
            &format!("{name}.safetensors"),
            &safetensors(header, data),
        );
        refuse_weights(d, &path, needle);
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn truncated_checkpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (path, _) = native_checkpoint(d);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    for (keep, needle) in [
        (bytes.len() - 1, "the tensors' data does not end where the"),
        (bytes.len() / 2, "the tensors' data does not end where the"),
        (100, "past the end of the 100-byte file"),
        (9, "past the end of the 9-byte file"),
    ] {
        let cut = file(d, "cut.safetensors", &bytes[..keep]);
        refuse_weights(d, &cut, needle);
        std::fs::remove_file(cut).unwrap();
    }
}

#[test]
fn unsupported_types_nonfinite_values_and_wrong_shapes_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = "blocks.0.proj_in.weight";
    let (probe, header) = native_checkpoint(d);
    std::fs::remove_file(probe).unwrap();
    let shape: Vec<u64> = serde_json::from_value(header[key]["shape"].clone()).unwrap();
    assert_eq!(shape.len(), 2, "{key} is a matrix");

    // The same bytes read as I32 (same size): refused by type, naming the tensor.
    let path = edited(d, "i32.safetensors", |h| h[key]["dtype"] = "I32".into());
    refuse_weights(d, &path, &format!("{key}: element type"));
    std::fs::remove_file(path).unwrap();

    // The matrix transposed in the header: refused by shape, naming the tensor.
    let path = edited(d, "transposed.safetensors", |h| {
        h[key]["shape"] = serde_json::json!([shape[1], shape[0]]);
    });
    refuse_weights(d, &path, key);
    std::fs::remove_file(path).unwrap();

    // A tensor the model does not know.
    let path = edited(d, "extra.safetensors", |h| {
        let mut extra = h[key].clone();
        extra["data_offsets"] = serde_json::json!([0, 0]);
        extra["shape"] = serde_json::json!([0]);
        h.insert("blocks.7.surprise".into(), extra);
    });
    refuse_weights(
        d,
        &path,
        "unexpected tensor(s) for a native checkpoint: blocks.7.surprise",
    );
    std::fs::remove_file(path).unwrap();

    // A missing tensor.
    let path = edited(d, "missing.safetensors", move |h| {
        let mut gone = h.remove(key).unwrap();
        let bytes = 4 * shape[0] * shape[1];
        gone["dtype"] = "U8".into();
        gone["shape"] = serde_json::json!([bytes]);
        h.insert("padding".into(), gone);
    });
    refuse_weights(d, &path, key);
    std::fs::remove_file(path).unwrap();

    // NaN and Inf in the data: refused with the tensor and the flat index.
    let (path, header) = native_checkpoint(d);
    let mut bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let start = 8 + n + header[key]["data_offsets"][0].as_u64().unwrap() as usize;
    for (value, name) in [(f32::NAN, "nan"), (f32::INFINITY, "inf")] {
        bytes[start + 12..start + 16].copy_from_slice(&value.to_le_bytes());
        let path = file(d, &format!("{name}.safetensors"), &bytes);
        refuse_weights(
            d,
            &path,
            &format!("{key}: value {value} at flat index 3 is not finite"),
        );
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn a_hostile_config_in_the_metadata_is_refused_before_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = edited(d, "config.safetensors", |h| {
        let meta = h["__metadata__"].as_object_mut().unwrap();
        let mut config: serde_json::Value =
            serde_json::from_str(meta["gmlp_onnx.config"].as_str().unwrap()).unwrap();
        config["task"]["seq_len"] = 100_000_000.into();
        meta.insert("gmlp_onnx.config".into(), config.to_string().into());
    });
    refuse_weights(
        d,
        &path,
        "blocks.0.sgu.spatial.weight has shape [15], expected [199999999]",
    );
    std::fs::remove_file(path).unwrap();
    let path = edited(d, "garbled.safetensors", |h| {
        let meta = h["__metadata__"].as_object_mut().unwrap();
        meta.insert("gmlp_onnx.config".into(), "{\"layers\": -1".into());
    });
    refuse_weights(d, &path, "gmlp_onnx.config");
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;

    #[test]
    fn hostile_npz_checkpoints_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // A real archive written by NumPy, then broken in several ways.
        let good = d.join("good.npz");
        crate::common::run_python(
            "import numpy as np, sys\n\
         np.savez(sys.argv[1], w=np.ones((4, 4), np.float32))\n",
            &[&good],
        );
        let bytes = std::fs::read(&good).unwrap();
        std::fs::remove_file(&good).unwrap();
        let cut = file(d, "cut.npz", &bytes[..bytes.len() / 2]);
        refuse_weights(d, &cut, "cut.npz");
        std::fs::remove_file(cut).unwrap();

        let object = d.join("object.npz");
        crate::common::run_python(
            "import numpy as np, sys\n\
         np.savez(sys.argv[1], w=np.array([{'a': 1}], dtype=object))\n",
            &[&object],
        );
        refuse_weights(d, &object, "object");
        std::fs::remove_file(object).unwrap();

        // A member whose .npy header claims 10^12 elements with 16 bytes of data.
        let huge = d.join("huge.npz");
        crate::common::run_python(
            "import sys, zipfile\n\
         h = \"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }\"\n\
         h = h + ' ' * (118 - len(h)) + '\\n'\n\
         npy = b'\\x93NUMPY\\x01\\x00' + len(h).to_bytes(2, 'little') + h.encode() + bytes(16)\n\
         zipfile.ZipFile(sys.argv[1], 'w').writestr('w.npy', npy)\n",
            &[&huge],
        );
        refuse_weights(d, &huge, "w");
    }
}
