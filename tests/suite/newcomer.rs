//! A newcomer's first hour (README.md, "Install"; docs/runtimes.md): ONNX Runtime found where
//! the user has it, with every place looked at listed when it is not; f16 models that validate
//! with the defaults; a closed pipe that ends the program quietly; one-line messages that say
//! things once.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::{inspect_json, output_text, path_str as s, small_vision_model, Build};

/// The binary under test with an empty environment but for PATH and HOME (nothing
/// exported: no ORT_DYLIB_PATH, no VIRTUAL_ENV, no GMLP_ONNX_PYTHON) plus `env`, run in `cwd`.
fn gmlp_bare(cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"));
    c.env_clear().current_dir(cwd).args(args);
    for key in ["PATH", "HOME"] {
        if let Some(v) = std::env::var_os(key) {
            c.env(key, v);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gmlp-onnx")
}

fn gmlp(args: &[&str]) -> Output {
    crate::common::gmlp(args)
}

#[test]
fn without_onnxruntime_anywhere_the_error_lists_every_place_looked() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_vision_model(dir.path());
    let no_python = dir.path().join("no-python");
    let o = gmlp_bare(
        dir.path(),
        &[("GMLP_ONNX_PYTHON", s(&no_python))],
        &["validate", s(&model)],
    );
    assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    for place in [
        "the explicit path: not given",
        "ORT_DYLIB_PATH: not set",
        "$VIRTUAL_ENV: not set",
        "the environment gmlp-onnx is installed in",
        &format!(
            "./.venv ({}): no such folder",
            dir.path().join(".venv").display()
        ),
        &format!("python ({}): cannot run it", no_python.display()),
        "pip install onnxruntime==1.31.1",
        "or pass its path with --ort-lib PATH",
    ] {
        assert!(err.contains(place), "{place} not in {err}");
    }
    // doctor says the same and exits 3: the CPU runtimes do not all work.
    let o = gmlp_bare(
        dir.path(),
        &[("GMLP_ONNX_PYTHON", s(&no_python))],
        &["doctor"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));
    let text = output_text(&o);
    assert!(text.contains("tract     ok"), "{text}");
    assert!(text.contains("ort-cpu   unavailable"), "{text}");
}

#[test]
fn build_tolerances_need_validate_and_bad_ones_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.onnx");
    let base = Build::preset("gmlp-ti16").args(&["--layers", "1", "-q"]);
    let o = base.clone().args(&["--rtol", "1e-3"]).run(&out);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--validate"));
    let o = base.args(&["--validate", "--atol=-1"]).run(&out);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--atol must be a finite number >= 0"));
    assert!(!out.exists());
}

/// Runs the binary with its standard output on a pipe whose reading end is already
/// closed, as after `| head -1` has read its line: the first write meets EPIPE.
fn with_closed_stdout(args: &[&str]) -> std::process::ExitStatus {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty(), "{args:?} printed: {err}");
    o.status
}

#[test]
fn a_closed_pipe_ends_the_program_quietly_on_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let model = small_vision_model(dir.path());
    for args in [
        vec!["presets"],
        vec!["presets", "--json"],
        vec!["inspect", s(&model), "--json"],
        vec!["inspect", s(&model)],
    ] {
        let status = with_closed_stdout(&args);
        assert_eq!(
            status.signal(),
            Some(libc_sigpipe()),
            "{args:?}: {status:?}"
        );
    }
    // And through a real shell pipeline: `head` takes one line, the shell sees 141.
    let line = format!(
        "'{}' presets | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
        env!("CARGO_BIN_EXE_gmlp-onnx")
    );
    let o = Command::new("bash").args(["-c", &line]).output().unwrap();
    let text = output_text(&o);
    assert!(text.starts_with("preset "), "{text}");
    assert!(!text.contains("internal error"), "{text}");
    let status = text.lines().last().unwrap();
    assert!(status == "status 141" || status == "status 0", "{text}");
}

/// SIGPIPE's number (13 on Linux and macOS).
fn libc_sigpipe() -> i32 {
    13
}

#[test]
fn small_things_say_things_once_and_in_one_unit() {
    let dir = tempfile::tempdir().unwrap();
    // A missing file's OS error, once.
    let missing = dir.path().join("missing.onnx");
    for args in [vec!["inspect", s(&missing)], vec!["validate", s(&missing)]] {
        let o = gmlp(&args);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    }
    // No source: the message names both ways to give one.
    let o = gmlp(&["build", "-o", s(&dir.path().join("x.onnx"))]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--preset") && err.contains("--weights"),
        "{err}"
    );
    // Small models show their FLOPs; external data gets one pair of parentheses per file.
    let out = dir.path().join("x.onnx");
    let o = Build::preset("gmlp-ti16")
        .args(&[
            "-q",
            "--layers",
            "1",
            "--image-size",
            "32",
            "--external-data",
        ])
        .run(&out);
    let text = output_text(&o);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("1.98 MFLOPs per example"), "{text}");
    assert!(
        text.contains(&format!(
            "wrote {} (0.0 MB) + {}.data (1.5 MB of external data): 377084 stored parameters",
            out.display(),
            out.display()
        )),
        "{text}"
    );
    // inspect reads every metadata property and the FLOPs the build line gave (its text
    // shows each of them: inspect_text_shows_every_section_of_the_summary).
    let json = inspect_json(&out);
    let metadata = json["metadata"].as_object().unwrap();
    for key in [
        "gmlp_onnx.version",
        "gmlp_onnx.weights",
        "gmlp_onnx.stored_params",
        "gmlp_onnx.flops_per_example",
        "gmlp_onnx.preset",
    ] {
        assert!(metadata.contains_key(key), "{key}: {json}");
    }
    assert_eq!(metadata["gmlp_onnx.preset"], "gmlp-ti16");
    // 1.98 MFLOPs, as the build line said.
    assert_eq!(json["flops_per_example"], 1_978_368);
}

/// The tests that run ONNX Runtime or the onnx checker (the test Python environment),
/// built with the `test-onnxruntime` feature that scripts/test turns on.
#[cfg(feature = "test-onnxruntime")]
mod with_onnxruntime {
    use super::*;
    use crate::common::{python, read_json, small_token_model, validate_report, Amlp};
    use std::path::PathBuf;

    /// The virtual environment that holds the tests' onnxruntime (GMLP_ONNX_PYTHON is its
    /// `bin/python`, as scripts/test sets it).
    fn test_venv() -> PathBuf {
        let python = PathBuf::from(python());
        let venv = python
            .parent()
            .and_then(Path::parent)
            .expect("GMLP_ONNX_PYTHON is <venv>/bin/python (run scripts/test)")
            .to_path_buf();
        assert!(
            venv.join("pyvenv.cfg").is_file(),
            "{} is not a virtual environment (run scripts/test)",
            venv.display()
        );
        venv
    }

    #[test]
    fn validate_finds_onnxruntime_in_the_active_virtual_environment() {
        let dir = tempfile::tempdir().unwrap();
        let model = small_vision_model(dir.path());
        let venv = test_venv();
        let report = dir.path().join("r.json");
        let o = gmlp_bare(
            dir.path(),
            &[("VIRTUAL_ENV", s(&venv))],
            &[
                "validate",
                s(&model),
                "--batch",
                "1",
                "--report",
                s(&report),
            ],
        );
        assert!(o.status.success(), "{}", output_text(&o));
        let json = read_json(&report);
        assert_eq!(json["pass"], true);
        assert_eq!(json["pairs"][0]["other"], "ort-cpu", "{json}");
        let o = gmlp_bare(dir.path(), &[("VIRTUAL_ENV", s(&venv))], &["doctor"]);
        assert!(o.status.success(), "{}", output_text(&o));
        let text = output_text(&o);
        assert!(
            text.contains(&format!("$VIRTUAL_ENV ({}): ", venv.display()))
                && text.contains("(from $VIRTUAL_ENV)"),
            "{text}"
        );
        assert!(
            text.contains("ort-cpu   ok: ran the check model, agrees with tract"),
            "{text}"
        );
    }

    #[test]
    fn validate_finds_onnxruntime_in_dot_venv_of_the_current_directory() {
        let dir = tempfile::tempdir().unwrap();
        let model = small_vision_model(dir.path());
        std::os::unix::fs::symlink(test_venv(), dir.path().join(".venv")).unwrap();
        let o = gmlp_bare(dir.path(), &[], &["validate", s(&model), "--batch", "1"]);
        assert!(o.status.success(), "{}", output_text(&o));
        let o = gmlp_bare(dir.path(), &[], &["doctor"]);
        let text = output_text(&o);
        assert!(o.status.success(), "{text}");
        let order = [
            "--ort-lib: not given",
            "ORT_DYLIB_PATH: not set",
            "$VIRTUAL_ENV: not set",
            "the environment gmlp-onnx is installed in",
            "./.venv (",
            "(from ./.venv)",
        ];
        let positions: Vec<usize> = order
            .iter()
            .map(|p| text.find(p).unwrap_or_else(|| panic!("{p} not in {text}")))
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn a_wrong_explicit_library_is_an_error_not_a_silent_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let model = small_vision_model(dir.path());
        std::os::unix::fs::symlink(test_venv(), dir.path().join(".venv")).unwrap();
        // What `export ORT_DYLIB_PATH=$PWD/.venv/lib/python3.*/...` leaves in bash.
        let unexpanded = format!(
            "{}/.venv/lib/python3.*/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1",
            dir.path().display()
        );
        let o = gmlp_bare(
            dir.path(),
            &[("ORT_DYLIB_PATH", &unexpanded)],
            &["validate", s(&model)],
        );
        assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!(
                "ORT_DYLIB_PATH ({unexpanded}): the path set is not a file"
            )),
            "{err}"
        );
    }

    /// The largest `max_rel` of every compared output in a JSON report.
    fn max_rel(json: &serde_json::Value) -> f64 {
        json["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["outputs"].as_array().unwrap().clone())
            .map(|o| o["max_rel"].as_f64().unwrap())
            .fold(0.0, f64::max)
    }

    #[test]
    fn f16_models_validate_with_the_defaults_in_build_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        for (name, model) in [
            ("t16.onnx", Build::amlp(2, Amlp::Short)),
            (
                "v16.onnx",
                Build::preset("gmlp-ti16").args(&["--layers", "2", "--image-size", "32"]),
            ),
        ] {
            let model = model.args(&["--dtype", "f16", "--init", "spread", "-q"]);
            let path = dir.path().join(name);
            let o = model.clone().args(&["--validate"]).run(&path);
            let text = output_text(&o);
            assert!(o.status.success(), "{text}");
            assert!(
                text.contains("atol 1e-4 + rtol 1e-2 * max|reference| (model precision f16)"),
                "{text}"
            );

            // validate: the JSON report names the precision and the bounds it chose.
            let json = validate_report(&path, &[]);
            assert_eq!(json["precision"], "f16");
            assert_eq!(
                json["tolerance"],
                serde_json::json!({"rtol": 0.01, "atol": 0.0001})
            );
            let rel = max_rel(&json);
            if name != "v16.onnx" {
                continue;
            }
            // The vision model's runtimes differ by more than the f32 bound: the default is
            // what makes it pass, and the f32 bound given explicitly still fails it, in
            // validate and in build.
            assert!(rel > 1e-4, "{name}: max_rel {rel}");
            let o = gmlp(&["validate", s(&path), "--rtol", "1e-4", "--atol", "1e-6"]);
            assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
            let strict = dir.path().join(format!("strict-{name}"));
            let o = model.args(&["--validate", "--rtol", "1e-4"]).run(&strict);
            assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
        }
    }

    #[test]
    fn f32_models_keep_the_f32_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let json = validate_report(&small_token_model(dir.path()), &[]);
        assert_eq!(json["precision"], "f32");
        assert_eq!(
            json["tolerance"],
            serde_json::json!({"rtol": 0.0001, "atol": 1e-6})
        );
    }
}
