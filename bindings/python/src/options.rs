//! Keywords as the command's flags: `causal=True` → `--causal`, `with_past="static"` →
//! `--with-past=static`, `runtimes=["tract", "ort-cpu"]` → `--runtimes=tract,ort-cpu`,
//! parsed by the command's own clap definitions, so that a keyword means what its flag
//! means, with the same values, defaults and checks.

use clap::ArgAction;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

/// Why keywords could not become flags.
pub enum OptionsError {
    /// A keyword that is no flag of the command (or one the call takes as an argument).
    Unknown(String),
    /// A value the flag refuses (clap's message, on one line).
    Invalid(String),
    /// Reading a value from Python failed.
    Python(PyErr),
}

impl From<PyErr> for OptionsError {
    fn from(e: PyErr) -> Self {
        OptionsError::Python(e)
    }
}

impl OptionsError {
    /// As the exception the caller sees.
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            OptionsError::Unknown(message) => {
                crate::errors::raise(py, "UnknownOptionError", message)
            }
            OptionsError::Invalid(message) => crate::errors::raise(
                py,
                "InvalidArgumentError",
                crate::errors::keywords_of(&message),
            ),
            OptionsError::Python(e) => e,
        }
    }
}

/// `T` (a clap `Args` of a command, flattened into a parser) from `leading` arguments
/// (positionals, fixed flags) and the keywords of `options`; `call` names the Python
/// function in messages, and `taken` the keywords it takes as arguments of its own.
pub fn parse<T: clap::Parser>(
    call: &str,
    leading: &[String],
    options: Option<&Bound<'_, PyDict>>,
    taken: &[&str],
) -> Result<T, OptionsError> {
    let command = T::command();
    let mut argv = vec![call.to_string()];
    argv.extend(leading.iter().cloned());
    if let Some(options) = options {
        for (key, value) in options.iter() {
            let key: String = key.extract()?;
            argv.extend(flag_words(&command, call, &key, &value, taken)?);
        }
    }
    let matches = command
        .try_get_matches_from(&argv)
        .map_err(|e| OptionsError::Invalid(format!("{call}: {}", crate::cli::usage_line(&e))))?;
    T::from_arg_matches(&matches)
        .map_err(|e| OptionsError::Invalid(format!("{call}: {}", crate::cli::usage_line(&e))))
}

/// The flag words of one keyword.
fn flag_words(
    command: &clap::Command,
    call: &str,
    key: &str,
    value: &Bound<'_, PyAny>,
    taken: &[&str],
) -> Result<Vec<String>, OptionsError> {
    if taken.contains(&key) {
        return Err(OptionsError::Unknown(format!(
            "{call}() takes {key} as an argument of its own, not as an option"
        )));
    }
    let long = key.replace('_', "-");
    let arg = command
        .get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()));
    let Some(arg) = arg else {
        let mut known: Vec<String> = command
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(|l| l.replace('-', "_"))
            .filter(|k| !taken.contains(&k.as_str()) && k != "help")
            .collect();
        known.sort();
        return Err(OptionsError::Unknown(format!(
            "{call}() got an unknown option {key:?} (its options are the command's flags as keywords: {})",
            known.join(", ")
        )));
    };
    let flag = format!("--{long}");
    if value.is_none() {
        return Ok(Vec::new());
    }
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        let on: bool = value
            .cast::<PyBool>()
            .map_err(|_| OptionsError::Invalid(format!("{call}: {key} takes True or False")))?
            .is_true();
        return Ok(if on { vec![flag] } else { Vec::new() });
    }
    if let Ok(b) = value.cast::<PyBool>() {
        // A flag whose value may be left out (`with_past=True` → `--with-past`).
        let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
        return match (b.is_true(), optional) {
            (true, true) => Ok(vec![flag]),
            (false, true) => Ok(Vec::new()),
            _ => Err(OptionsError::Invalid(format!(
                "{call}: {key} takes a value, not {}",
                if b.is_true() { "True" } else { "False" }
            ))),
        };
    }
    let items: Vec<String> = if value.cast::<PyList>().is_ok() || value.cast::<PyTuple>().is_ok() {
        value
            .try_iter()?
            .map(|item| item.and_then(|i| text_of(&i)))
            .collect::<PyResult<_>>()?
    } else {
        vec![text_of(value)?]
    };
    Ok(match arg.get_action() {
        ArgAction::Append => items.into_iter().map(|v| format!("{flag}={v}")).collect(),
        _ => vec![format!("{flag}={}", items.join(","))],
    })
}

/// A value as the command line writes it (`os.fspath` for paths, `str` otherwise).
fn text_of(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let os = value.py().import("os")?;
    if value.hasattr("__fspath__")? {
        return os.call_method1("fspath", (value,))?.extract();
    }
    value.str()?.extract()
}
