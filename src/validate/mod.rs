//! Validation: inputs of a model's declared shapes (seeded, or read from an `.npz`,
//! [`inputs`]), run on each runtime, every pair of runtimes compared output by output
//! ([`compare`]), each runtime compared with stored reference outputs when given, ONNX
//! Runtime's placement checked ([`placement`]); the result is a [`ValidationReport`]
//! ([`report`]), with error histograms on request ([`histograms`]).

pub mod compare;
pub mod decoding;
pub mod histograms;
pub mod inputs;
pub mod placement;
pub mod report;
pub mod tolerance;

use std::path::{Path, PathBuf};
use std::time::Instant;

pub use compare::{compare, compare_all, OutputDiff, PairReport, Tolerance};
pub use inputs::{
    check_inputs, check_static_positions, input_shapes, make_inputs, start_static_state,
    stored_config, MAX_INPUT_ELEMENTS,
};
pub use placement::{check_placement, CUDA_PROVIDER};
pub use report::{
    BenchReport, InputReport, RuntimeReport, ValidationReport, EXPECTED, REPORT_SCHEMA,
};
pub use tolerance::{default_tolerance, ResolvedTolerance, ToleranceRequest};

use crate::error::{Error, Result};
use crate::gmlp::decoding::{SequenceMode, PAST_SEQUENCE, SEQUENCE};
use crate::npz;
use crate::onnx::reader::{check_external_data, declared_outputs, read_model};
use crate::runtime::decoder::DecodingModel;
use crate::runtime::{self, RuntimeKind, RuntimeOptions};
use crate::tensor::NamedTensor;
use compare::pair;
use decoding::{check_decoding, DecodingPlan};

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
        }
    }
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Runs `model` on every requested runtime with the same inputs, compares every pair of
/// runtimes, and compares each runtime with the expected outputs when given.
pub fn validate(path: &Path, options: &ValidateOptions) -> Result<ValidationReport> {
    validate_with_progress(path, options, &mut |_| {})
}

/// [`validate`], telling `progress` what it is doing (`loading tract`, `running ort-cpu`,
/// `benchmarking tract 3/20`, ...) for a progress display.
pub fn validate_with_progress(
    path: &Path,
    options: &ValidateOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ValidationReport> {
    if options.batch == 0 {
        return Err(Error::InvalidArgument("--batch must be at least 1".into()));
    }
    if options.bench > MAX_BENCH_RUNS {
        return Err(Error::InvalidArgument(format!(
            "--bench {} is more than {MAX_BENCH_RUNS} runs",
            options.bench
        )));
    }
    let model = read_model(path)?;
    check_external_data(&model, path)?;
    let resolved = options.tolerance.check()?.resolve(
        stored_config(&model).map(|c| c.dtype),
        options.runtime.cuda_tf32,
    );
    let tolerance = resolved.tolerance;
    // Variable-length and with-past models: the whole sequence (n tokens, empty past)
    // unless --dim says otherwise; with-past models also get the decoding check.
    let decoding = DecodingModel::of(&model);
    let mut dims = options.dims.clone();
    let mut plan = None;
    if let Some(d) = &decoding {
        for (symbol, size) in [(SEQUENCE, d.info.max_sequence), (PAST_SEQUENCE, 0)] {
            if !dims.iter().any(|(k, _)| k == symbol) {
                dims.push((symbol.to_string(), size));
            }
        }
        // A window state (token shift, local window, fold) holds min(past_sequence, K) rows.
        let past = dims
            .iter()
            .find(|(k, _)| k == PAST_SEQUENCE)
            .map(|(_, v)| *v);
        if let Some(past) = past {
            for state in &d.info.state {
                let (Some(window), symbol) = (state.window, state.past_rows_symbol()) else {
                    continue;
                };
                if !dims.iter().any(|(k, _)| *k == symbol) {
                    dims.push((symbol, past.min(window)));
                }
            }
        }
        if d.info.mode.has_state() {
            plan = Some(DecodingPlan::new(
                d.info.max_sequence,
                options.decode_prefill,
                options.decode_steps,
                options.decode_chunk,
            )?);
        }
    }
    if plan.is_none()
        && (options.decode_prefill.is_some()
            || options.decode_steps.is_some()
            || options.decode_chunk.is_some())
    {
        return Err(Error::InvalidArgument(format!(
            "--decode-prefill/--decode-steps/--decode-chunk apply to models built with --with-past, and {} is not one",
            path.display()
        )));
    }
    let inputs = match &options.inputs {
        Some(file) => {
            let what = file.display().to_string();
            let given = check_inputs(&model, npz::read_npz(file)?, &what)?;
            if let Some(d) = decoding
                .as_ref()
                .filter(|d| d.info.mode == SequenceMode::Static)
            {
                check_static_positions(&given, &d.info)
                    .map_err(|e| Error::BadTensor(format!("{what}: {e}")))?;
            }
            given
        }
        None => {
            let mut generated = make_inputs(&model, options.batch, &dims, options.seed)?;
            if let Some(d) = decoding
                .as_ref()
                .filter(|d| d.info.mode == SequenceMode::Static)
            {
                start_static_state(&mut generated, &d.info);
            }
            generated
        }
    };
    let output_names: Vec<String> = declared_outputs(&model)
        .into_iter()
        .map(|o| o.name)
        .collect();
    drop(model);
    let expected = match &options.expected {
        Some(file) => {
            let what = file.display().to_string();
            let arrays = npz::read_npz(file)?;
            if let Some(extra) = arrays.iter().find(|t| !output_names.contains(&t.name)) {
                return Err(Error::BadTensor(format!(
                    "{what}: array '{}' is not an output of the model (outputs: {})",
                    extra.name,
                    output_names.join(", ")
                )));
            }
            Some(arrays)
        }
        None => None,
    };
    // Load every runtime before running any, so an unavailable one fails fast.
    let profile_dir = std::env::temp_dir();
    let loaded = options
        .runtimes
        .iter()
        .map(|&kind| {
            progress(&format!("loading {}", kind.name()));
            let mut rt_options = options.runtime.clone();
            if kind != RuntimeKind::Tract {
                rt_options.ort_profile_prefix = Some(profile_dir.join(format!(
                    "gmlp-onnx-profile-{}-{}",
                    std::process::id(),
                    kind.name()
                )));
            }
            let start = Instant::now();
            runtime::open(kind, path, &rt_options)
                .map(|rt| (kind, rt, start.elapsed().as_secs_f64() * 1e3))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut results: Vec<(String, Vec<NamedTensor>)> = Vec::new();
    let mut runtimes = Vec::new();
    let mut opened = Vec::new();
    for (kind, mut rt, load_ms) in loaded {
        progress(&format!("running {}", kind.name()));
        let start = Instant::now();
        let outputs = rt.run(&inputs)?;
        let first_run_ms = start.elapsed().as_secs_f64() * 1e3;
        let providers = rt.placement()?;
        check_placement(kind, providers.as_ref())?;
        let bench = if options.bench > 0 {
            let mut times = Vec::with_capacity(options.bench);
            for k in 0..options.bench {
                progress(&format!(
                    "benchmarking {} {}/{}",
                    kind.name(),
                    k + 1,
                    options.bench
                ));
                let start = Instant::now();
                rt.run(&inputs)?;
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            Some(BenchReport {
                runs: times.len(),
                median_ms: median(&times),
                min_ms: times[0],
            })
        } else {
            None
        };
        runtimes.push(RuntimeReport {
            name: rt.name().to_string(),
            load_ms,
            first_run_ms,
            providers,
            bench,
        });
        results.push((rt.name().to_string(), outputs));
        opened.push(rt);
    }
    let decoding = match (plan, &decoding) {
        (Some(plan), Some(model)) => Some(check_decoding(
            opened,
            model,
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
    let mut pairs = Vec::new();
    let mut error_histograms = Vec::new();
    for i in 0..results.len() {
        for j in i + 1..results.len() {
            let (reference, other) = (&results[i], &results[j]);
            let outputs = compare_all(&reference.1, &other.1, tolerance)?;
            pairs.push(pair(&reference.0, &other.0, outputs));
            if options.histograms {
                error_histograms.extend(histograms::error_histograms(
                    &reference.0,
                    &other.0,
                    &reference.1,
                    &other.1,
                    tolerance,
                )?);
            }
        }
    }
    if let Some(expected) = &expected {
        let what = options
            .expected
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        for (name, outputs) in &results {
            let diffs = compare_all(expected, outputs, tolerance)
                .map_err(|e| Error::BadTensor(format!("{what}: {e}")))?;
            pairs.push(pair(EXPECTED, name, diffs));
            if options.histograms {
                error_histograms.extend(histograms::error_histograms(
                    EXPECTED, name, expected, outputs, tolerance,
                )?);
            }
        }
    }
    let pass = pairs.iter().all(|p| p.pass) && decoding.as_ref().is_none_or(|d| d.pass);
    Ok(ValidationReport {
        schema: REPORT_SCHEMA,
        model: path.to_path_buf(),
        inputs_source: options
            .inputs
            .as_deref()
            .map_or("generated".into(), |p| p.display().to_string()),
        seed: options.inputs.is_none().then_some(options.seed),
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
        histograms: error_histograms,
    })
}
