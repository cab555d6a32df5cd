//! Validation: inputs of a model's declared shapes (seeded, or read from an `.npz`,
//! [`inputs`]), run on each runtime, every pair of runtimes compared output by output
//! ([`compare`](mod@compare)), each runtime compared with stored reference outputs when given, ONNX
//! Runtime's placement checked ([`placement`]); the result is a [`ValidationReport`]
//! ([`report`]), with error histograms on request ([`histograms`]).

pub mod compare;
pub mod histograms;
pub mod inputs;
mod phases;
pub mod placement;
pub mod report;
pub mod stepwise;
pub mod tolerance;

use std::path::{Path, PathBuf};

pub use compare::{compare, compare_all, OutputDiff, PairReport, Tolerance};
pub use inputs::{
    check_inputs, check_static_positions, input_shapes, make_inputs, start_static_state,
    stored_config, MAX_INPUT_ELEMENTS,
};
pub use placement::{check_placement, CUDA_PROVIDER};
pub use report::{
    BenchReport, InputReport, Latency, RuntimeReport, ValidationReport, EXPECTED, REPORT_SCHEMA,
};
pub use tolerance::{default_tolerance, ResolvedTolerance, ToleranceError, ToleranceRequest};

use crate::error::Result;
use crate::generation::DecodingModel;
use crate::npz;
use crate::onnx::reader::{check_external_data, declared_outputs};
use crate::runtime::{ModelFile, RuntimeKind, RuntimeOptions};
use crate::tensor::NamedTensor;
use phases::{
    check_options, compare_results, load_runtimes, model_inputs, read_expected, run_one,
    sequence_dims,
};
use stepwise::check_decoding;

/// Most `--bench` runs per runtime (a typo of a few zeros should not run for days).
pub const MAX_BENCH_RUNS: usize = 10_000;

/// What to validate and how.
#[derive(Clone, Debug)]
pub struct ValidateOptions {
    /// Runtimes to run (at least one; two or more to compare).
    pub runtimes: Vec<RuntimeKind>,
    /// Value of the symbolic `batch` dimension (generated inputs).
    pub batch: usize,
    /// Values of other symbolic dimensions (generated inputs).
    pub dims: Vec<(String, usize)>,
    /// Seed of the generated inputs.
    pub seed: u64,
    /// Read the inputs from this `.npz` instead of generating them.
    pub inputs: Option<PathBuf>,
    /// Compare every runtime with the outputs stored in this `.npz`.
    pub expected: Option<PathBuf>,
    /// Write the first runtime's outputs to this `.npz`.
    pub save_outputs: Option<PathBuf>,
    /// Timed runs per runtime after the first (warm-up) run; 0 = no benchmark.
    pub bench: usize,
    /// Agreement criterion: bounds given, the rest from the model's precision.
    pub tolerance: ToleranceRequest,
    /// Runtime settings.
    pub runtime: RuntimeOptions,
    /// With-past models: tokens of the prefill of the decoding check (default n/2).
    pub decode_prefill: Option<usize>,
    /// With-past models: single steps after the prefill (default 8).
    pub decode_steps: Option<usize>,
    /// With-past models: length of the final multi-token chunk (default 4).
    pub decode_chunk: Option<usize>,
    /// Keep the elementwise error histogram of every compared pair and output in the
    /// report ([`ValidationReport::histograms`], for `validate --plot`).
    pub histograms: bool,
    /// Outputs of the model's source on inputs it was given (a live module's, from Python):
    /// the runs take its inputs, and every runtime is compared with its outputs under its
    /// label (instead of `inputs` and `expected`).
    pub reference: Option<Reference>,
}

/// What the model's source gives on known inputs: its label in the report (`module
/// g_mlp_pytorch.g_mlp_pytorch.gMLP`), the inputs (the model's, by name, as
/// [`inputs_for`] makes them) and its outputs on them (by the model's output names; a
/// subset is fine).
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    /// Its name in the report.
    pub label: String,
    /// The inputs it was run on.
    pub inputs: Vec<NamedTensor>,
    /// Its outputs.
    pub outputs: Vec<NamedTensor>,
}

impl ValidateOptions {
    /// Defaults: tract and ort-cpu, batch 2, seed 0, generated inputs, no benchmark.
    pub fn new(runtimes: Vec<RuntimeKind>) -> Self {
        ValidateOptions {
            runtimes,
            batch: 2,
            dims: Vec::new(),
            seed: 0,
            inputs: None,
            expected: None,
            save_outputs: None,
            bench: 0,
            tolerance: ToleranceRequest::default(),
            runtime: RuntimeOptions::default(),
            decode_prefill: None,
            decode_steps: None,
            decode_chunk: None,
            histograms: false,
            reference: None,
        }
    }
}

/// The inputs [`validate_file`] runs `file` on with `options` (generated from the seed and
/// sizes, or read from `options.inputs`), for a caller that runs the model's source on
/// them too ([`Reference`]).
pub fn inputs_for(file: ModelFile, options: &ValidateOptions) -> Result<Vec<NamedTensor>> {
    check_options(options)?;
    let model = file.model()?;
    let model = model.as_ref();
    let decoding = DecodingModel::of(model);
    let (dims, _) = sequence_dims(file.path, decoding.as_ref(), options)?;
    model_inputs(model, decoding.as_ref(), &dims, options)
}

/// Runs `model` on every requested runtime with the same inputs, compares every pair of
/// runtimes, and compares each runtime with the expected outputs when given.
pub fn validate(path: &Path, options: &ValidateOptions) -> Result<ValidationReport> {
    validate_with_progress(path, options, &mut |_| {})
}

/// [`validate`], telling `progress` what it is doing (`loading tract`, `running ort-cpu`,
/// `benchmarking tract 3/20`, ...) for a progress display. The phases, in order: check the
/// options, read the model, size its symbolic dimensions, make or read the inputs (and the
/// expected outputs), load every runtime, run each (and benchmark it), the stepwise
/// decoding check of a with-past model, then compare every pair.
pub fn validate_with_progress(
    path: &Path,
    options: &ValidateOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ValidationReport> {
    validate_file(ModelFile::from(path), options, progress)
}

/// [`validate_with_progress`] of a file the caller may have decoded already (`build
/// --validate` hands over the model it decoded once for every check it runs): the file is
/// decoded here only if it has not been.
pub fn validate_file(
    file: ModelFile,
    options: &ValidateOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ValidationReport> {
    check_options(options)?;
    let path = file.path;
    let model = file.model()?;
    let model = model.as_ref();
    check_external_data(model, path)?;
    // tract reads 4-bit MatMulNBits, not 8-bit: those nodes run in tract on the file's
    // weights dequantized by us, and the report says so.
    let tract_dequantize = crate::runtime::tract::needs_dequantizing(model);
    let resolved = options.tolerance.check()?.resolve(
        stored_config(model).map(|c| c.dtype),
        options.runtime.cuda.tf32,
    );
    let tolerance = resolved.tolerance;
    let decoding = DecodingModel::of(model);
    let (dims, plan) = sequence_dims(path, decoding.as_ref(), options)?;
    let inputs = model_inputs(model, decoding.as_ref(), &dims, options)?;
    let output_names: Vec<String> = declared_outputs(model)
        .into_iter()
        .map(|o| o.name)
        .collect();
    let expected = read_expected(options, &output_names)?;
    // The decoded model goes to every runtime that needs it (tract's dequantized nodes, a
    // static-state session's step outputs), so that the file is decoded once.
    let file = ModelFile::decoded(path, model);
    let loaded = load_runtimes(file, options, tract_dequantize, progress)?;
    let mut results: Vec<(String, Vec<NamedTensor>)> = Vec::new();
    let mut runtimes = Vec::new();
    let mut opened = Vec::new();
    for (kind, mut rt, load_ms) in loaded {
        let (report, outputs) = run_one(kind, rt.as_mut(), load_ms, &inputs, options, progress)?;
        runtimes.push(report);
        results.push((rt.name().to_string(), outputs));
        opened.push((kind, rt));
    }
    let decoding = match (plan, &decoding) {
        (Some(plan), Some(decoding)) => Some(check_decoding(
            opened,
            file,
            &options.runtime,
            decoding,
            plan,
            options.batch,
            options.seed,
            tolerance,
            progress,
        )?),
        _ => None,
    };
    if let (Some(file), Some((_, outputs))) = (&options.save_outputs, results.first()) {
        npz::save_npz(file, outputs)?;
    }
    let (pairs, histograms) = compare_results(&results, expected.as_deref(), options, tolerance)?;
    let pass = pairs.iter().all(|p| p.pass) && decoding.as_ref().is_none_or(|d| d.pass);
    Ok(ValidationReport {
        schema: REPORT_SCHEMA,
        model: path.to_path_buf(),
        inputs_source: match (&options.reference, &options.inputs) {
            (Some(reference), _) => reference.label.clone(),
            (None, Some(path)) => path.display().to_string(),
            (None, None) => "generated".into(),
        },
        seed: (options.inputs.is_none() && options.reference.is_none()).then_some(options.seed),
        inputs: inputs
            .iter()
            .map(|t| InputReport {
                name: t.name.clone(),
                shape: t.value.shape().to_vec(),
                dtype: t.value.dtype(),
            })
            .collect(),
        expected: options.expected.clone(),
        runtimes,
        pairs,
        tolerance,
        precision: resolved.precision,
        decoding,
        pass,
        histograms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gmlp::SequenceMode;
    use crate::onnx::reader::files_decoded;
    use crate::runtime::testing::write_tiny;

    /// `validate` of a static-state model (its runs, then the stepwise decoding check,
    /// where ONNX Runtime opens its static-state session) decodes the file once.
    #[test]
    fn validate_decodes_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tiny(dir.path(), SequenceMode::Static);
        let mut runtimes = vec![RuntimeKind::Tract];
        if cfg!(feature = "test-onnxruntime") {
            runtimes.push(RuntimeKind::OrtCpu);
        }
        let before = files_decoded();
        let report = validate(&path, &ValidateOptions::new(runtimes)).unwrap();
        assert!(report.pass);
        assert!(report.decoding.is_some());
        assert_eq!(files_decoded() - before, 1);
    }
}
