//! Trained checkpoints from timm and g-mlp-pytorch (fixtures/, made by
//! scripts/make_fixtures.py with those libraries): every fixture converts with the
//! checkpoint alone (plus the flags the weights cannot show), runs in tract and ONNX
//! Runtime, and reproduces the library's own outputs. Plus one test per error case.
//!
//! Longer than ~500 lines: one case per trained fixture and per import error, sharing the
//! fixture loader and comparison helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use gmlp_onnx::checkpoint::{Import, ImportHints};
use gmlp_onnx::gmlp::export::export;
use gmlp_onnx::message::Setting;
use gmlp_onnx::onnx::writer::write_model;
use gmlp_onnx::{CheckpointError, Error};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

/// Copies a safetensors file: each tensor renamed by `rename` (None drops it), and the
/// f32 contents of the tensors named in `replace` swapped for the given shape and bytes.
fn rewrite(
    src: &Path,
    dir: &Path,
    name: &str,
    rename: impl Fn(&str) -> Option<String>,
    replace: &[(&str, Vec<usize>, &[u8])],
) -> PathBuf {
    let bytes = std::fs::read(src).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, TensorView<'_>)> = Vec::new();
    for (n, v) in st.tensors() {
        let Some(new_name) = rename(&n) else { continue };
        let view = match replace.iter().find(|(r, _, _)| *r == n) {
            Some((_, shape, data)) => TensorView::new(Dtype::F32, shape.clone(), data).unwrap(),
            None => v,
        };
        kept.push((new_name, view));
    }
    let out = dir.join(name);
    safetensors::serialize_to_file(kept, None, &out).unwrap();
    out
}

fn import_error(path: &Path, hints: &ImportHints) -> Error {
    Import::open(path, hints).map(|_| ()).unwrap_err()
}

/// Whether `e` is a message naming exactly the settings `settings`.
fn names_settings(e: &Error, settings: &[Setting]) -> bool {
    matches!(e, Error::Setting(p) if p.settings().eq(settings.iter().copied()))
}

#[test]
fn strict_errors_name_the_tensor() {
    let src = fixture("lucid_tokens").join("model.safetensors");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hints = ImportHints::default();

    let missing = rewrite(
        &src,
        d,
        "missing.safetensors",
        |n| (n != "layers.1.fn.fn.fn.sgu.bias").then(|| n.to_string()),
        &[],
    );
    let e = import_error(&missing, &hints);
    assert!(
        matches!(e, Error::Checkpoint(CheckpointError::Missing(_))),
        "{e:?}"
    );
    // The rendering of the import errors: each names the file and the tensor.
    assert_eq!(
        e.to_string(),
        format!(
            "{}: 1 missing tensor(s): layers.1.fn.fn.fn.sgu.bias [1, 32]",
            missing.display()
        )
    );

    let extra_data = vec![0u8; 16];
    let extra = {
        let bytes = std::fs::read(&src).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut all = st.tensors();
        all.push((
            "layers.0.fn.fn.fn.extra.weight".into(),
            TensorView::new(Dtype::F32, vec![4], &extra_data).unwrap(),
        ));
        let out = d.join("extra.safetensors");
        safetensors::serialize_to_file(all, None, &out).unwrap();
        out
    };
    let e = import_error(&extra, &hints);
    assert!(names_settings(&e, &[Setting::AllowUnused]), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: 1 unexpected tensor(s) for a lucidrains (g-mlp-pytorch) checkpoint: layers.0.fn.fn.fn.extra.weight (pass allow_unused to skip them knowingly)",
            extra.display()
        )
    );
    // The command line names the flag that sets it.
    let out = d.join("extra.onnx");
    let o = gmlp(&["build", "--weights", path_str(&extra), "-o", path_str(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("(pass --allow-unused to skip them knowingly)"),
        "{err}"
    );
    assert!(!out.exists());
    let allowed = Import::open(
        &extra,
        &ImportHints {
            allow_unused: true,
            ..ImportHints::default()
        },
    )
    .unwrap();
    assert_eq!(
        allowed.unused,
        vec!["layers.0.fn.fn.fn.extra.weight".to_string()]
    );

    let wrong = vec![0u8; 4 * 24 * 95];
    let reshaped = rewrite(
        &src,
        d,
        "shape.safetensors",
        |n| Some(n.to_string()),
        &[("layers.1.fn.fn.fn.proj_out.weight", vec![24, 95], &wrong)],
    );
    let e = import_error(&reshaped, &hints);
    assert!(
        matches!(e, Error::Checkpoint(CheckpointError::WrongShape(_))),
        "{e:?}"
    );

    let gap = rewrite(
        &src,
        d,
        "gap.safetensors",
        |n| (!n.starts_with("layers.0.")).then(|| n.to_string()),
        &[],
    );
    let e = import_error(&gap, &hints);
    assert_eq!(
        e.to_string(),
        format!(
            "{}: inconsistent depth: layers.0.* is missing but layers.1.* exists",
            gap.display()
        )
    );
    let gap = rewrite(
        &src,
        d,
        "gap2.safetensors",
        |n| Some(n.replace("layers.1.", "layers.2.")),
        &[],
    );
    let e = import_error(&gap, &hints);
    assert!(
        matches!(e, Error::Checkpoint(CheckpointError::Depth(_))),
        "{e:?}"
    );

    let nan: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), 48)
        .flatten()
        .collect();
    let poisoned = rewrite(
        &src,
        d,
        "nan.safetensors",
        |n| Some(n.to_string()),
        &[("layers.0.fn.fn.fn.sgu.norm.weight", vec![48], &nan)],
    );
    let import = Import::open(&poisoned, &hints).unwrap();
    let cfg = import.config.clone();
    let m = export(&cfg, Arc::new(import.weights(&cfg)), "t", None, 17).unwrap();
    let out = d.join("nan.onnx");
    let e = write_model(&m.graph, &m.info, &out, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::NotFinite(_)), "{e:?}");
    assert!(!out.exists());

    let unknown = rewrite(
        &src,
        d,
        "unknown.safetensors",
        |n| Some(format!("model.{n}")),
        &[],
    );
    let e = import_error(&unknown, &hints);
    assert!(
        matches!(&e, Error::UnknownLayout(p) if p.settings().eq([Setting::WeightsFormat])),
        "{e:?}"
    );

    let bytes = std::fs::read(&src).unwrap();
    let truncated = d.join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let e = import_error(&truncated, &hints);
    assert!(
        matches!(e, Error::Checkpoint(CheckpointError::Damaged(_))),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{}: a damaged safetensors file: the tensors' data does not end where the {}-byte file does: it was cut short or has bytes added (safetensors crate: MetadataIncompleteBuffer)",
            truncated.display(),
            bytes.len() - 100
        )
    );
    let empty = d.join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    let e = import_error(&empty, &hints);
    assert!(
        matches!(e, Error::Checkpoint(CheckpointError::NotACheckpoint(_))),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{}: 0 bytes is too short for a safetensors file, PyTorch file or .npz archive",
            empty.display()
        )
    );
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use gmlp_onnx::checkpoint::{save_native, Format};
    use gmlp_onnx::gmlp::reference::{forward_tokens, forward_vision};
    use gmlp_onnx::gmlp::{GmlpConfig, SpatialForm, Task};
    use gmlp_onnx::tensor::{NamedTensor, TensorValue};
    use ndarray::ArrayD;

    /// Imports `checkpoint`, writes it to `dir`, runs it in both runtimes.
    fn import_and_run(
        checkpoint: &Path,
        hints: &ImportHints,
        inputs: &[NamedTensor],
        dir: &Path,
    ) -> (GmlpConfig, Vec<ArrayD<f32>>) {
        let import = Import::open(checkpoint, hints)
            .unwrap_or_else(|e| panic!("import {}: {e}", checkpoint.display()));
        let cfg = import.config.clone();
        let model = export(&cfg, Arc::new(import.weights(&cfg)), "test", None, 17).unwrap();
        let path = dir.join("imported.onnx");
        write_model(&model.graph, &model.info, &path, |_, _| {}).unwrap();
        let outs = CPU_RUNTIMES
            .iter()
            .map(|&k| f32_output(&run(k, &path, inputs)))
            .collect();
        (cfg, outs)
    }

    fn check_fixture(name: &str) {
        let fx = Fixture::open(name);
        let dir = tempfile::tempdir().unwrap();
        let hints = fx.hints();
        let checkpoint = fx.checkpoint();
        let (cfg, outs) = import_and_run(&checkpoint, &hints, &fx.inputs(), dir.path());
        for (kind, out) in CPU_RUNTIMES.iter().zip(&outs) {
            let d = rel_diff(out, &fx.logits());
            eprintln!(
                "{name}: {} vs PyTorch: max|diff|/max|ref| = {d:.2e}",
                kind.name()
            );
            assert!(
                d <= PYTORCH_RTOL,
                "{name}: {} vs PyTorch: {d:e}",
                kind.name()
            );
        }
        // The independent f64 reference on the same imported weights agrees as well.
        let import = Import::open(&checkpoint, &hints).unwrap();
        let weights = import.weights(&cfg);
        let reference = match (&fx.inputs()[0].value, &cfg.task) {
            (TensorValue::I64(ids), Task::Tokens { .. }) => {
                forward_tokens(&cfg, &weights, ids.view().into_dimensionality().unwrap())
                    .unwrap()
                    .into_dyn()
            }
            (TensorValue::F32(px), Task::Vision { .. }) => {
                forward_vision(&cfg, &weights, px.view().into_dimensionality().unwrap())
                    .unwrap()
                    .into_dyn()
            }
            _ => panic!("{name}: input does not fit the task"),
        };
        let d = rel_diff(&reference, &fx.logits());
        assert!(d <= PYTORCH_RTOL, "{name}: reference vs PyTorch: {d:e}");
        if let Some(labels) = &fx.labels() {
            for (kind, out) in CPU_RUNTIMES.iter().zip(&outs) {
                let ours = argmax_rows(out);
                let theirs = argmax_rows(&fx.logits());
                assert_eq!(
                    ours,
                    theirs,
                    "{name}: {} argmax differs from PyTorch",
                    kind.name()
                );
                let correct = ours
                    .iter()
                    .zip(labels)
                    .filter(|(a, b)| **a as i64 == **b)
                    .count();
                let accuracy = correct as f64 / labels.len() as f64;
                let expected = fx.meta["test_accuracy"].as_f64().unwrap();
                assert!(
                    (accuracy - expected).abs() < 1e-9,
                    "{name}: accuracy {accuracy} vs PyTorch {expected}"
                );
            }
        }
    }

    #[test]
    fn timm_gmlp_vision_matches_pytorch_and_keeps_its_accuracy() {
        check_fixture("timm_gmlp_vision");
    }

    #[test]
    fn lucidrains_vision_matches_pytorch_and_keeps_its_accuracy() {
        check_fixture("lucid_vision");
    }

    #[test]
    fn lucidrains_token_models_match_pytorch() {
        for name in [
            "lucid_tokens",
            "lucid_tokens_causal",
            "lucid_amlp",
            "lucid_amlp_causal",
            "lucid_heads2",
            "lucid_circulant",
            "lucid_shift",
            "lucid_shift_causal",
        ] {
            check_fixture(name);
        }
    }

    #[test]
    fn forgetting_the_causal_flag_changes_the_outputs() {
        // Causality is not visible in the weights: without --causal the outputs must differ,
        // which also shows the comparison above can fail.
        let fx = Fixture::open("lucid_amlp_causal");
        let dir = tempfile::tempdir().unwrap();
        let (_, outs) = import_and_run(
            &fx.checkpoint(),
            &ImportHints::default(),
            &fx.inputs(),
            dir.path(),
        );
        assert!(rel_diff(&outs[1], &fx.logits()) > 1e-2);
    }

    #[test]
    fn layout_of_g_mlp_pytorch_0_1_4_is_recognized() {
        // ≤ 0.1.4 token models have one `.fn` fewer (no PreShiftTokens wrapper).
        let fx = Fixture::open("lucid_tokens");
        let dir = tempfile::tempdir().unwrap();
        let path = rewrite(
            &fx.checkpoint(),
            dir.path(),
            "old.safetensors",
            |name| Some(name.replace(".fn.fn.fn.", ".fn.fn.")),
            &[],
        );
        let (_, outs) = import_and_run(&path, &ImportHints::default(), &fx.inputs(), dir.path());
        assert!(rel_diff(&outs[1], &fx.logits()) <= PYTORCH_RTOL);
    }

    #[test]
    fn half_precision_checkpoints_are_read() {
        for (name, file, bound) in [
            ("lucid_tokens", "model.bf16.safetensors", 5e-2),
            ("timm_gmlp_vision", "model.f16.safetensors", 5e-3),
        ] {
            let fx = Fixture::open(name);
            let dir = tempfile::tempdir().unwrap();
            let (_, outs) =
                import_and_run(&fx.dir.join(file), &fx.hints(), &fx.inputs(), dir.path());
            let d = rel_diff(&outs[1], &fx.logits());
            // Rounded weights: close to the f32 model, but not equal to it.
            assert!(d <= bound && d > 0.0, "{name} {file}: {d:e}");
        }
    }

    #[test]
    fn native_round_trip_and_spatial_conversions() {
        let fx = Fixture::open("lucid_tokens_causal");
        let dir = tempfile::tempdir().unwrap();
        let hints = fx.hints();
        let import = Import::open(&fx.checkpoint(), &hints).unwrap();
        let native = dir.path().join("native.safetensors");
        save_native(&native, &import.config, &import.weights(&import.config)).unwrap();
        let back = Import::open(&native, &ImportHints::default()).unwrap();
        assert_eq!(back.format, Format::Native);
        assert_eq!(back.config, import.config);
        let (_, outs) = import_and_run(&native, &ImportHints::default(), &fx.inputs(), dir.path());
        assert!(rel_diff(&outs[1], &fx.logits()) <= PYTORCH_RTOL);

        // A trained W is not Toeplitz: refused for the gather form, naming the layer.
        let gather = ImportHints {
            spatial: Some(SpatialForm::ToeplitzGather),
            ..hints.clone()
        };
        let err = Import::open(&fx.checkpoint(), &gather)
            .and_then(|i| {
                let cfg = i.config.clone();
                let m = export(&cfg, Arc::new(i.weights(&cfg)), "t", None, 17)?;
                write_model(&m.graph, &m.info, &dir.path().join("g.onnx"), |_, _| {})
            })
            .unwrap_err();
        assert!(names_settings(&err, &[Setting::Spatial]), "{err:?}");
        assert!(
            err.to_string().starts_with("blocks.0.sgu.spatial.weight ("),
            "{err}"
        );
        assert!(!dir.path().join("g.onnx").exists());

        // A Toeplitz model (preset init) goes native → gather and → dense with equal outputs.
        let mut cfg = tiny_tokens(SpatialForm::ToeplitzGather, Some(8), true);
        cfg.heads = 2;
        let toeplitz = dir.path().join("toeplitz.safetensors");
        save_native(&toeplitz, &cfg, &spread(5)).unwrap();
        let ids = ndarray::Array2::from_shape_fn((2, 12), |(b, t)| ((b * 7 + t * 3) % 50) as i64)
            .into_dyn();
        let feed = [NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(ids),
        }];
        let mut results = Vec::new();
        for form in [
            SpatialForm::ToeplitzGather,
            SpatialForm::Dense,
            SpatialForm::ToeplitzExpand,
        ] {
            let h = ImportHints {
                spatial: Some(form),
                ..ImportHints::default()
            };
            let sub = dir.path().join(form.name());
            std::fs::create_dir(&sub).unwrap();
            results.push(import_and_run(&toeplitz, &h, &feed, &sub).1[1].clone());
        }
        assert!(rel_diff(&results[1], &results[0]) <= 1e-6);
        assert!(rel_diff(&results[2], &results[0]) <= 1e-6);
        // And a dense W that is Toeplitz passes the check on the way back.
        let dense = ImportHints {
            spatial: Some(SpatialForm::Dense),
            ..ImportHints::default()
        };
        let d_import = Import::open(&toeplitz, &dense).unwrap();
        let dense_file = dir.path().join("dense.safetensors");
        save_native(
            &dense_file,
            &d_import.config,
            &d_import.weights(&d_import.config),
        )
        .unwrap();
        let regather = ImportHints {
            spatial: Some(SpatialForm::ToeplitzGather),
            ..ImportHints::default()
        };
        let sub = dir.path().join("regather");
        std::fs::create_dir(&sub).unwrap();
        let out = import_and_run(&dense_file, &regather, &feed, &sub).1[1].clone();
        assert!(rel_diff(&out, &results[0]) <= 1e-6);
    }

    #[test]
    fn cli_builds_from_weights_and_refuses_architecture_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.onnx");
        let exe = env!("CARGO_BIN_EXE_gmlp-onnx");
        let ck = fixture("lucid_amlp_causal").join("model.safetensors");
        let o = std::process::Command::new(exe)
            .args([
                "build",
                "--weights",
                ck.to_str().unwrap(),
                "--causal",
                "-o",
                out.to_str().unwrap(),
                "--validate",
                "-q",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("PASS"));
        let o = std::process::Command::new(exe)
            .args([
                "build",
                "--weights",
                ck.to_str().unwrap(),
                "--layers",
                "3",
                "-o",
                dir.path().join("x.onnx").to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr)
            .contains("--layers cannot be combined with --weights"));
        assert!(!dir.path().join("x.onnx").exists());
    }

    #[test]
    fn numpy_npz_weights_are_read() {
        // A native checkpoint converted to .npz by NumPy (np.savez_compressed, float64 for one
        // tensor as JAX exports often are) imports to the same outputs.
        let fx = Fixture::open("lucid_heads2");
        let dir = tempfile::tempdir().unwrap();
        let import = Import::open(&fx.checkpoint(), &ImportHints::default()).unwrap();
        let native = dir.path().join("native.safetensors");
        save_native(&native, &import.config, &import.weights(&import.config)).unwrap();
        let npz = dir.path().join("native.npz");
        let script = r#"
import json, struct, sys, numpy as np
src, dst = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
arrays = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    a, b = info["data_offsets"]
    arrays[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(info["shape"])
arrays["norm.weight"] = arrays["norm.weight"].astype(np.float64)
np.savez_compressed(dst, **arrays)
"#;
        let out = std::process::Command::new(python())
            .args([
                "-c",
                script,
                native.to_str().unwrap(),
                npz.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let from_npz = Import::open(&npz, &ImportHints::default()).unwrap();
        assert_eq!(from_npz.format, Format::Native);
        assert_eq!(from_npz.config, import.config);
        let (_, outs) = import_and_run(&npz, &ImportHints::default(), &fx.inputs(), dir.path());
        assert!(rel_diff(&outs[1], &fx.logits()) <= PYTORCH_RTOL);
    }
}
