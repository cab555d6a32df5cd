//! `validate` (the validate command's library call, with a module's outputs as its
//! reference), the inputs it runs a file on, and `inspect`.

use std::path::PathBuf;

use clap::Parser;
use gmlp_onnx::onnx::reader::{declared_outputs, read_model};
use gmlp_onnx::runtime::ModelFile;
use gmlp_onnx::validate::{inputs_for, validate_file, Reference, ValidationReport};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::cli::validate::{options as validate_options, ValidateArgs};
use crate::errors::{detached, raise};
use crate::tensors::{named_tensors, to_python, TensorRef};

/// The validate command's flags.
#[derive(Parser)]
struct Validate {
    #[command(flatten)]
    args: ValidateArgs,
}

/// The keywords Python's `validate` takes as arguments of its own, or that write files.
const TAKEN: [&str; 2] = ["model", "reference"];

fn parse(
    py: Python<'_>,
    path: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<ValidateArgs> {
    let v: Validate = crate::options::parse("validate", &[path.to_string()], options, &TAKEN)
        .map_err(|e| e.into_py(py))?;
    Ok(v.args)
}

/// An input or output array for Python: `(name, dtype, shape, bytes)`.
type PyArray = (String, &'static str, Vec<usize>, Vec<u8>);

/// The inputs `validate(path, **options)` runs the file on, and the file's output names:
/// what a reference module is run on, and what its outputs are named.
#[pyfunction]
#[pyo3(signature = (path, options=None))]
pub fn validation_inputs(
    py: Python<'_>,
    path: String,
    options: Option<Bound<'_, PyDict>>,
) -> PyResult<(Vec<PyArray>, Vec<String>)> {
    let args = parse(py, &path, options.as_ref())?;
    detached(py, move || {
        let options = validate_options(&args)?;
        let model = read_model(args.model.as_path())?;
        let file = ModelFile::decoded(&args.model, &model);
        let inputs = inputs_for(file, &options)?;
        let outputs = declared_outputs(&model)
            .into_iter()
            .map(|o| o.name)
            .collect();
        Ok((inputs.iter().map(to_python).collect(), outputs))
    })
}

/// Runs the validate command's comparison of `path` with the keywords of `options` as its
/// flags; with `inputs` and `expected` (a reference's inputs and its outputs on them,
/// named `label`), every runtime is compared with the reference too. Returns the report as
/// a dict (`text`: what the command prints); raises `ValidationError` on a miss.
#[pyfunction]
#[pyo3(signature = (path, options, inputs, expected, label))]
pub fn validate<'py>(
    py: Python<'py>,
    path: String,
    options: Option<Bound<'py, PyDict>>,
    inputs: Option<Vec<TensorRef>>,
    expected: Option<Vec<TensorRef>>,
    label: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let args = parse(py, &path, options.as_ref())?;
    let reference = match (inputs, expected, label) {
        (Some(inputs), Some(expected), Some(label)) => Some(
            named_tensors(inputs)
                .and_then(|inputs| Ok((inputs, named_tensors(expected)?)))
                .map(|(inputs, outputs)| Reference {
                    label,
                    inputs,
                    outputs,
                })
                .map_err(|e| crate::errors::to_py(py, e))?,
        ),
        _ => None,
    };
    let report = detached(py, move || {
        let mut options = validate_options(&args)?;
        options.reference = reference;
        let report = validate_file(ModelFile::from(&args.model), &options, &mut |_| {})?;
        if let Some(path) = &args.report {
            let text = serde_json::to_string_pretty(&report)?;
            gmlp_onnx::fs::write_atomically(path, |w| {
                use std::io::Write;
                w.write_all(text.as_bytes())
                    .map_err(|e| gmlp_onnx::Error::io(path, e))
            })?;
        }
        Ok(report)
    })?;
    raise_on_miss(py, &report)?;
    report_dict(py, &report)
}

/// The report as a dict: its JSON (what `--report` writes) and `text`, what the command
/// prints.
pub fn report_dict<'py>(
    py: Python<'py>,
    report: &ValidationReport,
) -> PyResult<Bound<'py, PyDict>> {
    let json = serde_json::to_string(report).map_err(|e| {
        raise(
            py,
            "InternalError",
            format!("internal error: the report as JSON: {e}"),
        )
    })?;
    let value = py.import("json")?.call_method1("loads", (json,))?;
    let dict = value.cast_into::<PyDict>()?;
    dict.set_item("text", report.render())?;
    Ok(dict)
}

/// `ValidationError` for a report that misses: its message the worst figures of each pair
/// that missed, on one line, and `.report` the report.
pub fn raise_on_miss(py: Python<'_>, report: &ValidationReport) -> PyResult<()> {
    if report.pass {
        return Ok(());
    }
    let mut misses: Vec<String> = Vec::new();
    for pair in report.pairs.iter().filter(|p| !p.pass) {
        if let Some(worst) = pair
            .outputs
            .iter()
            .filter(|o| !o.pass)
            .max_by(|a, b| a.max_rel.total_cmp(&b.max_rel))
        {
            misses.push(format!(
                "{} vs {}: {} max|diff| {:.3e} > bound {:.3e} (max rel {:.3e})",
                pair.reference, pair.other, worst.output, worst.max_abs, worst.bound, worst.max_rel
            ));
        }
    }
    if report.decoding.as_ref().is_some_and(|d| !d.pass) {
        misses.push("the stepwise decoding check disagrees with the whole-sequence run".into());
    }
    let message = format!(
        "{}: the outputs disagree beyond the tolerance: {}",
        report.model.display(),
        misses.join("; ")
    );
    let report = report_dict(py, report)?;
    let class = py.import("gmlp_onnx._errors")?.getattr("ValidationError")?;
    let data = report.clone();
    let py_report = py
        .import("gmlp_onnx")?
        .getattr("_report")?
        .call1((data,))
        .unwrap_or_else(|_| report.into_any());
    Err(PyErr::from_value(class.call1((message, py_report))?))
}

/// What `gmlp-onnx inspect --json PATH` prints.
#[pyfunction]
pub fn inspect(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    detached(py, move || {
        let summary = gmlp_onnx::inspect::inspect(&path)?;
        Ok(serde_json::to_string_pretty(&summary)?)
    })
}
