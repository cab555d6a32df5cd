//! Installing like the tools ML engineers already use (README.md, "Install"): the wheel
//! scripts/test builds with maturin (the `gmlp_onnx` package and the `gmlp-onnx` command)
//! goes into a fresh virtual environment together with onnxruntime (the `ort` extra); the
//! `gmlp-onnx` it puts in `<venv>/bin` builds and validates a model with nothing exported
//! (ONNX Runtime is found in the environment it is installed in), and `import gmlp_onnx`
//! in that environment's Python exports a checkpoint and validates it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run(c: &mut Command) -> Output {
    let o = c.output().expect("run");
    assert!(o.status.success(), "{c:?} failed: {}", text(&o));
    o
}

/// `gmlp-onnx ARGS` from the fresh environment, in `cwd`, with no environment variables
/// but a PATH that does not lead to it and HOME.
fn installed(venv: &Path, cwd: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(venv.join("bin").join("gmlp-onnx"));
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(cwd)
        .args(args);
    if let Some(home) = std::env::var_os("HOME") {
        c.env("HOME", home);
    }
    run(&mut c)
}

#[test]
fn the_pip_wheel_installs_a_gmlp_onnx_that_finds_its_environments_onnxruntime() {
    let wheel = PathBuf::from(
        std::env::var_os("GMLP_ONNX_WHEEL").expect("GMLP_ONNX_WHEEL (run scripts/test)"),
    );
    assert!(wheel.is_file(), "{}", wheel.display());
    let python = std::env::var("GMLP_ONNX_PYTHON").expect("GMLP_ONNX_PYTHON (run scripts/test)");
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("fresh-venv");
    run(Command::new(&python).args(["-m", "venv"]).arg(&venv));
    let venv_python = venv.join("bin").join("python");
    run(Command::new(&venv_python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("{}[ort]", wheel.display())));

    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // The wheel packages the build of this checkout: the same version and commit.
    let o = installed(&venv, &work, &["--version"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&crate::common::gmlp(&["--version"]).stdout)
    );

    // Where ONNX Runtime comes from, and that it is the one pip put beside the binary.
    let o = installed(&venv, &work, &["doctor"]);
    let doctor = text(&o);
    let own = "(from the environment gmlp-onnx is installed in)";
    assert!(doctor.contains(own), "{doctor}");
    assert!(
        doctor.contains(&format!("{}/lib/python3", venv.display()))
            && doctor.contains("site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1"),
        "{doctor}"
    );
    assert!(doctor.contains("ort-cpu   ok"), "{doctor}");

    // A build that validates in tract and ONNX Runtime, then validate on its own.
    let o = installed(
        &venv,
        &work,
        &[
            "build",
            "--preset",
            "gmlp-ti16",
            "--layers",
            "1",
            "--image-size",
            "32",
            "-q",
            "-o",
            "m.onnx",
            "--validate",
        ],
    );
    let out = text(&o);
    assert!(
        out.contains("agree   tract vs ort-cpu") && out.ends_with("PASS\n"),
        "{out}"
    );
    let o = installed(&venv, &work, &["validate", "m.onnx"]);
    assert!(text(&o).contains("PASS"), "{}", text(&o));

    // The Python package of the same wheel, in the same environment (no torch there: a
    // checkpoint file is the source), with nothing exported either.
    let checkpoint = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/lucid_tokens_causal/model.safetensors");
    let script = format!(
        "import gmlp_onnx\n\
         r = gmlp_onnx.export({checkpoint:?}, 'p.onnx', causal=True, with_past='static')\n\
         assert r.mode == 'static', r\n\
         assert gmlp_onnx.validate('p.onnx').passed\n\
         g = gmlp_onnx.Generator('p.onnx')\n\
         print(gmlp_onnx.__version__, r.parameters, g.generate([1, 2, 3], max_new_tokens=4))\n",
        checkpoint = checkpoint.display().to_string()
    );
    let mut c = Command::new(&venv_python);
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(&work)
        .args(["-c", &script]);
    let o = run(&mut c);
    let printed = String::from_utf8_lossy(&o.stdout);
    assert!(printed.starts_with(env!("CARGO_PKG_VERSION")), "{printed}");
    // The command's tokens for the same file and prompt.
    let o = installed(
        &venv,
        &work,
        &[
            "generate",
            "p.onnx",
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "4",
            "--json",
            "-q",
        ],
    );
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tokens: Vec<String> = json[0]["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.to_string())
        .collect();
    let said = format!("[{}]", tokens.join(", "));
    assert!(printed.trim_end().ends_with(&said), "{printed} vs {said}");
}
