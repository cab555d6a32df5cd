//! `gmlp-onnx doctor`: which ONNX Runtime library each runtime would load and why, its
//! version, whether the CUDA execution provider registers (and the error when not), tract's
//! version, and a run of a one-block check model on every runtime. Exit 0 when the CPU
//! runtimes (tract, ort-cpu) work, 3 otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gmlp_onnx::gmlp::export::{export, DEFAULT_OPSET};
use gmlp_onnx::gmlp::{GmlpConfig, InitScheme, Precision, SeededInit, SpatialForm, Task};
use gmlp_onnx::onnx::writer::{write_model_with, ExternalData};
use gmlp_onnx::runtime::discovery::{discover, SearchContext};
use gmlp_onnx::runtime::onnxruntime::{build_info, HOW_TO_GET};
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::validate::{validate, ValidateOptions};
use gmlp_onnx::{Error, Remedy};

use crate::cli::flags::OrtFlags;

/// The tract-onnx version this binary is built with (checked against Cargo.lock by a test).
pub const TRACT_VERSION: &str = "0.23.9";

/// A one-block vision model (8×8 images, 4×4 patches, 5 classes): enough to load and run
/// every operator family the real models use, in milliseconds.
fn check_config() -> GmlpConfig {
    GmlpConfig {
        task: Task::Vision {
            image_size: 8,
            patch_size: 4,
            in_chans: 3,
            num_classes: 5,
        },
        layers: 1,
        d_model: 8,
        d_ffn: 16,
        attn_dim: Some(4),
        causal: false,
        heads: 1,
        shift_tokens: 0,
        spatial: SpatialForm::Dense,
        norm_eps: 1e-6,
        sgu_norm_eps: 1e-5,
        dtype: Precision::F32,
        block: Default::default(),
    }
}

/// Writes the check model to a fresh temporary folder; the folder goes when dropped.
struct CheckModel {
    dir: PathBuf,
    path: PathBuf,
}

impl CheckModel {
    fn write() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("gmlp-onnx-doctor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let check = CheckModel {
            path: dir.join("check.onnx"),
            dir,
        };
        let weights = Arc::new(SeededInit {
            seed: 0,
            scheme: InitScheme::Spread,
        });
        let model = export(
            &check_config(),
            weights,
            "doctor check model",
            None,
            DEFAULT_OPSET,
        )?;
        write_model_with(
            &model.graph,
            &model.info,
            &check.path,
            ExternalData::Auto,
            |_, _| {},
        )?;
        Ok(check)
    }
}

impl Drop for CheckModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How a runtime fared on the check model.
enum Verdict {
    /// It ran the model (and agreed with tract); how, on one line.
    Works(String),
    /// It could not run the model; why, on one line.
    Unavailable(String),
    /// It ran the model but its outputs differ from tract's by this relative error.
    Disagrees(f64),
}

impl Verdict {
    /// The doctor's line for runtime `name`.
    fn line(&self, name: &str) -> String {
        match self {
            Verdict::Works(how) => format!("{name:<9} ok: {how}"),
            Verdict::Unavailable(why) => format!("{name:<9} unavailable: {why}"),
            Verdict::Disagrees(max_rel) => format!(
                "{name:<9} unavailable: ran the check model but differs from tract (max_rel {max_rel:.1e})"
            ),
        }
    }
}

/// Runs the check model on tract and `kind` (or on tract alone) and says how it went.
fn try_runtime(model: &Path, kind: RuntimeKind, ort: &OrtFlags) -> Verdict {
    let mut runtimes = vec![RuntimeKind::Tract];
    if kind != RuntimeKind::Tract {
        runtimes.push(kind);
    }
    let mut options = ValidateOptions::new(runtimes);
    options.batch = 1;
    options.runtime = ort.runtime_options();
    let report = match validate(model, &options) {
        Ok(report) => report,
        Err(e) => {
            return Verdict::Unavailable(match e {
                Error::RuntimeUnavailable {
                    reason,
                    remedy: Some(remedy),
                    ..
                } => format!("{reason}; {}", super::remedy_flags(remedy)),
                Error::RuntimeUnavailable { reason, .. } => reason,
                other => other.to_string(),
            })
        }
    };
    let placed = report
        .runtimes
        .iter()
        .find(|r| r.name == kind.name())
        .and_then(|r| r.providers.as_ref())
        .map(|p| {
            let list: Vec<String> = p.iter().map(|(k, v)| format!("{k} {v}")).collect();
            format!(", nodes per provider: {}", list.join(", "))
        })
        .unwrap_or_default();
    match report.pairs.first() {
        None => Verdict::Works("ran the check model".into()),
        Some(pair) => {
            let max_rel = pair.outputs.iter().map(|o| o.max_rel).fold(0f64, f64::max);
            if pair.pass {
                Verdict::Works(format!(
                    "ran the check model, agrees with tract (max_rel {max_rel:.1e}){placed}"
                ))
            } else {
                Verdict::Disagrees(max_rel)
            }
        }
    }
}

/// Appends one line, `format!`-style, to the report `$out`.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        $out += &format!($($arg)*);
        $out.push('\n');
    }};
}

/// Runs `doctor`.
pub fn run(ort: &OrtFlags) -> anyhow::Result<()> {
    // Everything is printed at the end, after the check model's folder is gone: printing
    // can end the process (SIGPIPE when the reader has gone away).
    let mut out = String::new();
    say!(
        out,
        "gmlp-onnx {} at {}",
        super::VERSION,
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "?".into())
    );
    let library = library_lines(&mut out, ort.ort_lib.as_deref());
    say!(out, "tract: tract-onnx {TRACT_VERSION} (built in)");
    let cpu_ok = runtime_lines(&mut out, ort, library.as_ref())?;
    if cpu_ok {
        say!(out, "the CPU runtimes work (ort-cuda is optional)");
    }
    print!("{out}");
    if cpu_ok {
        Ok(())
    } else {
        Err(Error::RuntimeUnavailable {
            runtime: "ort-cpu".into(),
            reason: "a CPU runtime does not work (see above)".into(),
            remedy: None,
        }
        .into())
    }
}

/// The lines of the ONNX Runtime library search (`ort_lib` given, or none): where it
/// looked, what it found, and whether that loads. Returns the library found.
fn library_lines(out: &mut String, ort_lib: Option<&Path>) -> Option<PathBuf> {
    let found = discover(&SearchContext::from_process(ort_lib));
    say!(*out, "ONNX Runtime library, looked at in order:");
    for look in &found.looked {
        say!(
            *out,
            "  {}",
            look.render_as(super::library_source_name(look.source))
        );
    }
    let library = found.found().map(|(source, path)| {
        say!(
            *out,
            "  -> ort-cpu and ort-cuda load {} (from {})",
            path.display(),
            super::library_source_name(source)
        );
        path.to_path_buf()
    });
    if library.is_none() {
        say!(
            *out,
            "  -> not found; {HOW_TO_GET}; {}",
            super::remedy_flags(Remedy::OrtLibrary)
        );
    }
    if let Some(library) = &library {
        let version = library
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("libonnxruntime.so."))
            .map_or_else(String::new, |v| format!("version {v} (file name), "));
        match build_info(library) {
            Ok(info) => say!(*out, "ONNX Runtime: loads, {version}{info}"),
            Err(Error::RuntimeUnavailable { reason, .. }) => {
                say!(*out, "ONNX Runtime: cannot load it: {reason}")
            }
            Err(e) => say!(*out, "ONNX Runtime: cannot load it: {e}"),
        }
    }
    library
}

/// A line per runtime's run of the check model (ONNX Runtime's from `library`, if one was
/// found). True when the CPU runtimes (tract, ort-cpu) work.
fn runtime_lines(
    out: &mut String,
    ort: &OrtFlags,
    library: Option<&PathBuf>,
) -> anyhow::Result<bool> {
    let mut cpu_ok = true;
    let check = CheckModel::write()?;
    for kind in [
        RuntimeKind::Tract,
        RuntimeKind::OrtCpu,
        RuntimeKind::OrtCuda,
    ] {
        let verdict = if kind != RuntimeKind::Tract && library.is_none() {
            Verdict::Unavailable("no ONNX Runtime library (above)".into())
        } else {
            let found = OrtFlags {
                ort_lib: library.cloned(),
                ..ort.clone()
            };
            try_runtime(&check.path, kind, &found)
        };
        say!(*out, "{}", verdict.line(&kind.name()));
        if kind != RuntimeKind::OrtCuda {
            cpu_ok &= matches!(verdict, Verdict::Works(_));
        }
    }
    drop(check);
    Ok(cpu_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reported_tract_version_is_the_one_in_cargo_lock() {
        let lock = include_str!("../../Cargo.lock");
        let entry = format!("name = \"tract-onnx\"\nversion = \"{TRACT_VERSION}\"");
        assert!(lock.contains(&entry), "Cargo.lock has no {entry}");
    }

    #[test]
    fn the_check_model_is_a_valid_configuration() {
        check_config().validate().unwrap();
    }
}
