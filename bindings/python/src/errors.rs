//! Library errors as Python exceptions: the one table from [`gmlp_onnx::Error`]'s kinds to
//! the classes of `gmlp_onnx._errors` ([`class_of`]), and the message on one line with its
//! settings and remedies said as Python keywords ([`KEYWORDS`]) instead of flags.

use std::sync::OnceLock;

use gmlp_onnx::message::Setting;
use gmlp_onnx::{Error, Remedy};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::cli;

/// The exception class (in `gmlp_onnx._errors`) of a library error's kind.
fn class_of(error: &Error) -> &'static str {
    match error {
        Error::InvalidConfig(_) => "ConfigError",
        Error::InvalidArgument(_) | Error::Setting(_) => "InvalidArgumentError",
        Error::Conflict(_) => "OptionConflictError",
        Error::OutOfRange(_) => "OutOfRangeError",
        Error::OutputPath(_) => "OutputPathError",
        Error::ContradictsWeights(_) => "ModuleMismatchError",
        Error::BatchShape(_) => "BatchShapeError",
        Error::PastPositions(_) => "PastPositionsError",
        Error::OutsideVocabulary { .. } => "OutsideVocabularyError",
        Error::UnknownName(_) => "UnknownNameError",
        Error::Unservable(_) => "UnservableModelError",
        Error::ForeignModel(_) => "ForeignModelError",
        Error::Unsupported(_) => "UnsupportedError",
        Error::UnknownLayout(_) => "UnsupportedModuleError",
        Error::TooLarge(_) => "TooLargeError",
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            "GmlpOnnxFileNotFoundError"
        }
        Error::Io { .. } => "GmlpOnnxOSError",
        Error::BadModel { .. } => "ModelFileError",
        Error::BadTensor(_) | Error::ArrayFile(_) | Error::Checkpoint(_) => "CheckpointError",
        Error::NotFinite(_) => "NotFiniteError",
        Error::RuntimeUnavailable { .. } => "RuntimeUnavailableError",
        Error::RuntimeFailed { .. } => "RuntimeFailedError",
        Error::NeedsRebuild { .. } => "NeedsRebuildError",
        Error::Internal(_) => "InternalError",
    }
}

/// A setting as the Python API names it: the flag's keyword (`--with-past static` →
/// `with_past="static"`), made once per setting from the command line's one table.
fn setting_keyword(setting: Setting) -> &'static str {
    static WORDS: OnceLock<Vec<(Setting, &'static str)>> = OnceLock::new();
    let words = WORDS.get_or_init(|| {
        Setting::ALL
            .iter()
            .map(|&s| {
                let keyword = keywords_of(cli::setting_flag(s));
                (s, &*Box::leak(keyword.into_boxed_str()))
            })
            .collect()
    });
    words
        .iter()
        .find(|(s, _)| *s == setting)
        .map_or("an option", |(_, w)| w)
}

/// Flags in `text` said as keywords: `--seq-len` → `seq_len`, `--with-past static` →
/// `with_past="static"` (a flag followed by a lower-case word of its values).
pub fn keywords_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let tail = &rest[at + 2..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let starts_word = rest[..at]
            .chars()
            .last()
            .is_none_or(|c| !c.is_ascii_alphanumeric());
        if name.is_empty() || !starts_word || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push_str(&rest[..at + 2]);
            rest = tail;
            continue;
        }
        out.push_str(&rest[..at]);
        out.push_str(&name.replace('-', "_"));
        rest = &tail[name.len()..];
        // `--with-past static`: a state form value after the flag.
        for value in [" static", " growing"] {
            if let Some(after) = rest.strip_prefix(value) {
                if after.is_empty() || after.starts_with(|c: char| !c.is_ascii_alphanumeric()) {
                    out.push_str(&format!("=\"{}\"", value.trim()));
                    rest = after;
                }
            }
        }
    }
    out.push_str(rest);
    out
}

/// A remedy in the Python API's words.
fn remedy_keywords(remedy: Remedy) -> &'static str {
    match remedy {
        Remedy::OrtLibrary => "or pass its path with ort_lib=PATH",
        Remedy::BuildCausalWithPast => "export it again with causal=True, with_past=True",
        Remedy::BuildStaticState => {
            "export it again with causal=True, with_past=\"static\" (the static state)"
        }
        Remedy::OrtRuntimeOrOrtTarget => {
            "run it with runtime=\"ort-cpu\" or \"ort-cuda\", or export it with target=\"ort\" for tract"
        }
        Remedy::BuildFromCheckpoint => {
            "export one first (gmlp_onnx.export(checkpoint, \"model.onnx\")), then inspect model.onnx"
        }
        Remedy::RebuildWithThisVersion => {
            "export it again from its module or checkpoint with this gmlp_onnx"
        }
    }
}

/// The Python API's wording of settings and remedies.
pub const KEYWORDS: cli::Wording = cli::Wording {
    setting: setting_keyword,
    remedy: remedy_keywords,
};

/// `e` as a Python exception of its kind's class, its message on one line in keywords.
pub fn to_py(py: Python<'_>, e: anyhow::Error) -> PyErr {
    let class = e
        .chain()
        .find_map(|cause| cause.downcast_ref::<Error>())
        .map_or("InvalidArgumentError", class_of);
    let message = keywords_of(&cli::error_line_in(&e, &KEYWORDS));
    raise(py, class, message)
}

/// An exception of `class` (a name in `gmlp_onnx._errors`) with `message`.
pub fn raise(py: Python<'_>, class: &str, message: String) -> PyErr {
    let made = py
        .import("gmlp_onnx._errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((message.clone(),)));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// Runs `f` with the GIL released, its error raised as its kind's exception and a panic
/// inside it as `InternalError` (never a `PanicException`).
pub fn detached<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> PyResult<T> {
    let outcome = py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(to_py(py, e)),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(raise(
                py,
                "InternalError",
                format!(
                    "internal error: {}; this is a bug, please report it with the call that caused it",
                    what.replace('\n', " ")
                ),
            ))
        }
    }
}
