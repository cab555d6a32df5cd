//! `export`: the build command's pipeline from a live module's tensors (or a checkpoint
//! path), with the command's flags as keywords.

use clap::Parser;
use gmlp_onnx::checkpoint::Checkpoint;
use gmlp_onnx::gmlp::metadata::config_json;
use gmlp_onnx::runtime::ModelFile;
use gmlp_onnx::validate::{validate_file, ValidateOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::cli::build::{build_with_progress, plan, BuildArgs};
use crate::cli::distinct;
use crate::errors::{detached, KEYWORDS};
use crate::tensors::{memory_tensors, TensorRef};
use crate::validate::{raise_on_miss, report_dict};

/// The build command's flags.
#[derive(Parser)]
struct Build {
    #[command(flatten)]
    args: BuildArgs,
}

/// What `export` wrote (the fields of `gmlp_onnx.ExportResult`).
struct Exported {
    path: String,
    config: String,
    parameters: u64,
    target: String,
    summary: String,
    opset: i64,
    mode: String,
    notes: Vec<String>,
    report: Option<gmlp_onnx::validate::ValidationReport>,
}

/// Writes the ONNX file of `tensors` (a live module's state, read where it is, named
/// `label` in the file's provenance) or of the checkpoint file `checkpoint`, to `output`,
/// as `gmlp-onnx build --weights` does with the keywords of `options` as its flags.
#[pyfunction]
#[pyo3(signature = (tensors, checkpoint, label, output, options))]
pub fn export<'py>(
    py: Python<'py>,
    tensors: Option<Vec<TensorRef>>,
    checkpoint: Option<String>,
    label: String,
    output: String,
    options: Option<Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let source = checkpoint.clone().unwrap_or_else(|| label.clone());
    let leading = ["--weights".to_string(), source, "-o".into(), output.clone()];
    let taken = ["weights", "preset", "output"];
    let build: Build = crate::options::parse("export", &leading, options.as_ref(), &taken)
        .map_err(|e| e.into_py(py))?;
    let args = build.args;
    let memory = match tensors {
        Some(refs) => Some(memory_tensors(refs).map_err(|e| crate::errors::to_py(py, e))?),
        None => None,
    };
    let exported = detached(py, move || {
        let memory = memory
            .map(|tensors| Checkpoint::from_memory(&label, tensors))
            .transpose()?;
        let plan = plan(&args, memory)?;
        let tolerance = plan.tolerance;
        let target = plan.request.target.target.name().to_string();
        let opset = plan.request.target.opset;
        let mut notes = Vec::new();
        let built = build_with_progress(plan, args.quiet, &mut |note| {
            notes.push(note.render(KEYWORDS.setting))
        })?;
        let report = if args.validate {
            let mut options = ValidateOptions::new(distinct(&args.runtimes.runtimes));
            options.batch = 1;
            options.runtime = args.ort.runtime_options();
            options.tolerance = tolerance;
            let file = ModelFile {
                path: &args.output,
                decoded: built.decoded.as_ref(),
            };
            Some(validate_file(file, &options, &mut |_| {})?)
        } else {
            None
        };
        Ok(Exported {
            path: output,
            config: config_json(&built.config)?,
            parameters: built.parameters,
            target,
            summary: built.summary,
            opset,
            mode: built.mode.as_str().to_string(),
            notes,
            report,
        })
    })?;
    if let Some(report) = &exported.report {
        raise_on_miss(py, report)?;
    }
    let out = PyDict::new(py);
    out.set_item("path", &exported.path)?;
    let json = py.import("json")?;
    out.set_item("config", json.call_method1("loads", (&exported.config,))?)?;
    out.set_item("parameters", exported.parameters)?;
    out.set_item("target", &exported.target)?;
    out.set_item("summary", &exported.summary)?;
    out.set_item("opset", exported.opset)?;
    out.set_item("mode", &exported.mode)?;
    out.set_item("notes", &exported.notes)?;
    match &exported.report {
        Some(report) => out.set_item("validation", report_dict(py, report)?)?,
        None => out.set_item("validation", py.None())?,
    }
    Ok(out)
}
