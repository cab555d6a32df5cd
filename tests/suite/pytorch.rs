//! PyTorch `torch.save` checkpoints (fixtures made by scripts/make_pt_fixtures.py with torch
//! 2.15 itself): the timm and g-mlp-pytorch fixture models saved as `.pt` (flat, nested
//! under "model" with an optimizer state, Lightning-style under "state_dict", and in the
//! legacy non-zip format) convert with the real binary and reproduce PyTorch's outputs in
//! tract and ONNX Runtime; synthetic files of every dtype and of strided / shared views
//! read back exactly the values NumPy wrote next to them. Hostile files: tests/suite/hostile/.

use crate::common::*;
use gmlp_onnx::checkpoint::{pytorch, Checkpoint};
use gmlp_onnx::tensor::NamedTensor;
use safetensors::SafeTensors;

/// The arrays NumPy saved next to a synthetic file (float64, contiguous).
fn expected(stem: &str) -> Vec<NamedTensor> {
    gmlp_onnx::npz::read_npz(&fixture("pytorch").join(format!("{stem}.expected.npz"))).unwrap()
}

fn check_synthetic(file: &str, stem: &str) {
    let path = fixture("pytorch").join(file);
    let got = pytorch::read_file(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let want = expected(stem);
    let mut got_names: Vec<&str> = got.iter().map(|t| t.name.as_str()).collect();
    let mut want_names: Vec<&str> = want.iter().map(|t| t.name.as_str()).collect();
    got_names.sort();
    want_names.sort();
    assert_eq!(got_names, want_names, "{file}");
    for w in &want {
        let g = got.iter().find(|t| t.name == w.name).unwrap();
        assert_eq!(g.value.shape(), w.value.shape(), "{file}: {}", w.name);
        // Exact: f16/bf16/f32 widen to f32 exactly, integers are small.
        assert_eq!(g.value.to_f64(), w.value.to_f64(), "{file}: {}", w.name);
        let dtype = match w.name.as_str() {
            "f64" => "float64",
            "i64" => "int64",
            "i32" | "i16" | "i8" | "u8" | "bool" => "int32",
            _ => "float32",
        };
        assert_eq!(g.value.dtype(), dtype, "{file}: {}", w.name);
    }
}

#[test]
fn every_dtype_reads_back_exactly_in_both_formats() {
    check_synthetic("dtypes.pt", "dtypes");
    check_synthetic("dtypes.legacy.pt", "dtypes");
    // Integer tensors are kept, but refused as weights by name.
    let ck = Checkpoint::open(&fixture("pytorch").join("dtypes.pt")).unwrap();
    let e = ck.f32("i64").unwrap_err();
    assert!(
        matches!(
            e,
            gmlp_onnx::Error::Checkpoint(gmlp_onnx::CheckpointError::ElementType(_))
        ),
        "{e:?}"
    );
    assert_eq!(ck.f32("bf16").unwrap().len(), 24);
}

#[test]
fn strided_and_shared_views_read_back_exactly() {
    check_synthetic("views.pt", "views");
    check_synthetic("views.legacy.pt", "views");
    // The same tensors nested under "state_dict" (with an epoch) and under "model" (with
    // an optimizer state of dicts, lists and floats).
    check_synthetic("views.state_dict.pt", "views");
    check_synthetic("views.model.pt", "views");
}

/// A safetensors tensor as this reader converts it: (dtype name, values widened to f64).
fn safetensors_values(t: &safetensors::tensor::TensorView<'_>) -> (&'static str, Vec<f64>) {
    use safetensors::tensor::Dtype;
    let data = t.data();
    match t.dtype() {
        Dtype::F32 => (
            "float32",
            data.chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .collect(),
        ),
        Dtype::F16 => (
            "float32",
            data.chunks_exact(2)
                .map(|c| f64::from(half::f16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        Dtype::BF16 => (
            "float32",
            data.chunks_exact(2)
                .map(|c| f64::from(half::bf16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        Dtype::F64 => (
            "float64",
            data.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        Dtype::I64 => (
            "int64",
            data.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
        ),
        other => panic!("unexpected {other:?}"),
    }
}

/// torch.save names the zip archive's top folder after the file, so the archive's layout
/// depends on the name's length (zip 9.x refused every stem of 21 characters). Every file
/// of fixtures/pytorch/names/ (scripts/make_pt_name_fixtures.py, torch 2.15: stems of 1 to
/// 64 characters; a flat state_dict as a zip archive, the same nested under "state_dict",
/// and in the legacy format) must read exactly equal to its safetensors copy, written by
/// safetensors.torch from the same tensors; and open as a checkpoint as `build` does.
#[test]
fn files_saved_under_names_of_every_length_equal_their_safetensors_copies() {
    let root = fixture("pytorch").join("names");
    let mut lengths = std::collections::BTreeSet::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("safetensors")).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut want_names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        want_names.sort();
        for kind in ["zip", "nested", "legacy"] {
            let file = root.join(kind).join(format!("{stem}.pt"));
            let what = format!("{kind}/{stem}.pt");
            let got = pytorch::read_file(&file).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut got_names: Vec<String> = got.iter().map(|t| t.name.clone()).collect();
            got_names.sort();
            assert_eq!(got_names, want_names, "{what}");
            for t in &got {
                let view = st.tensor(&t.name).unwrap();
                let (dtype, values) = safetensors_values(&view);
                assert_eq!(t.value.shape(), view.shape(), "{what}: {}", t.name);
                assert_eq!(t.value.dtype(), dtype, "{what}: {}", t.name);
                assert_eq!(t.value.to_f64(), values, "{what}: {}", t.name);
            }
            let opened = Checkpoint::open(&file).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut keys: Vec<String> = opened.keys().map(str::to_string).collect();
            keys.sort();
            assert_eq!(keys, want_names, "{what}");
            checked += 1;
        }
        lengths.insert(stem.chars().count());
    }
    assert_eq!(lengths, (1..=64).collect(), "a stem of every length 1..=64");
    assert_eq!(checked, 3 * 64);
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;

    /// Converts `fixtures/NAME/FILE` with `gmlp-onnx build --weights` and compares both CPU
    /// runtimes with PyTorch's logits; also checks that every tensor read from the `.pt`
    /// equals the one in the fixture's model.safetensors bit for bit.
    fn check_conversion(name: &str, file: &str, flags: &[&str]) {
        let dir = tempfile::tempdir().unwrap();
        let weights = fixture(name).join(file);
        let out = dir.path().join("model.onnx");
        let mut args = vec![
            "build",
            "-q",
            "--weights",
            path_str(&weights),
            "-o",
            path_str(&out),
        ];
        args.extend(flags);
        let o = gmlp(&args);
        assert!(o.status.success(), "{name}/{file}: {}", output_text(&o));

        let fx = Fixture::open(name);
        let (inputs, logits) = (fx.inputs(), fx.logits());
        for kind in CPU_RUNTIMES {
            let d = rel_diff(&f32_output(&run(kind, &out, &inputs)), &logits);
            eprintln!(
                "{name}/{file}: {} vs PyTorch: max|diff|/max|ref| = {d:.2e}",
                kind.name()
            );
            assert!(d <= PYTORCH_RTOL, "{name}/{file}: {} {d:e}", kind.name());
        }

        let pt = Checkpoint::open(&weights).unwrap();
        let st = Checkpoint::open(&fx.checkpoint()).unwrap();
        let pt_keys: Vec<&str> = pt.keys().collect();
        let st_keys: Vec<&str> = st.keys().collect();
        assert_eq!(pt_keys, st_keys, "{name}/{file}: tensor names");
        for key in st_keys {
            assert_eq!(pt.shape(key), st.shape(key), "{name}/{file}: {key}");
            assert_eq!(
                pt.f32(key).unwrap(),
                st.f32(key).unwrap(),
                "{name}/{file}: {key}"
            );
        }
    }

    #[test]
    fn timm_state_dict_from_torch_save_matches_pytorch() {
        check_conversion("timm_gmlp_vision", "model.pt", &[]);
    }

    #[test]
    fn g_mlp_pytorch_checkpoints_nested_lightning_and_legacy_match_pytorch() {
        // {"model": state_dict, "optimizer": Adam state, "epoch": 3}
        check_conversion("lucid_vision", "model.ckpt.pt", &["--in-chans", "1"]);
        // Lightning: {"state_dict": ..., "epoch", "global_step", "hyper_parameters", ...}
        check_conversion("lucid_amlp_causal", "model.lightning.pt", &["--causal"]);
        // torch.save(..., _use_new_zipfile_serialization=False)
        check_conversion("lucid_tokens", "model.legacy.pt", &[]);
    }
}
