//! The phases of [`validate_with_progress`](super::validate_with_progress), one function
//! each: option checks, the sizes of the symbolic dimensions, the inputs and expected
//! outputs, loading and running the runtimes, and the pairwise comparison.

use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::generation::DecodingModel;
use crate::gmlp::interface::{SequenceMode, PAST_SEQUENCE, SEQUENCE};
use crate::message::{Phrase, Setting};
use crate::npz;
use crate::onnx::proto::ModelProto;
use crate::runtime::{self, ModelFile, Runtime, RuntimeKind};
use crate::tensor::NamedTensor;
use crate::validate::compare::{compare_all, pair, PairReport, Tolerance};
use crate::validate::histograms::{self, ErrorHistogram};
use crate::validate::inputs::{
    check_inputs, check_static_positions, make_inputs, start_static_state,
};
use crate::validate::report::{BenchReport, Latency, RuntimeReport, EXPECTED};
use crate::validate::stepwise::DecodingPlan;
use crate::validate::{ValidateOptions, MAX_BENCH_RUNS};

/// Values of symbolic dimensions by name (`sequence`, `past_sequence`, ...).
pub(super) type Dims = Vec<(String, usize)>;

/// A loaded runtime with its kind and its load time in ms.
pub(super) type Loaded = (RuntimeKind, Box<dyn Runtime>, f64);

/// Median of sorted values.
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Times `runs` calls of `run`, each on the wall clock, after `before` (given the run's
/// number, from 1; not timed).
fn time_runs(
    runs: usize,
    mut before: impl FnMut(usize),
    mut run: impl FnMut() -> Result<()>,
) -> Result<Latency> {
    let mut times = Vec::with_capacity(runs);
    for k in 1..=runs {
        before(k);
        let start = Instant::now();
        run()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(Latency {
        runs: times.len(),
        median_ms: median(&times),
        min_ms: times[0],
    })
}

/// Refuses options no run can honour: batch 0, more than [`MAX_BENCH_RUNS`] timed runs.
pub(super) fn check_options(options: &ValidateOptions) -> Result<()> {
    if options.batch == 0 {
        return Err(Error::OutOfRange("the batch must be at least 1".into()));
    }
    if options.bench > MAX_BENCH_RUNS {
        return Err(Error::OutOfRange(format!(
            "{} timed runs are more than {MAX_BENCH_RUNS}",
            options.bench
        )));
    }
    if options.reference.is_some() && (options.inputs.is_some() || options.expected.is_some()) {
        return Err(Error::Conflict(
            "a reference brings its own inputs and outputs: it cannot be combined with input or expected files".into(),
        ));
    }
    Ok(())
}

/// The sizes of the symbolic dimensions of generated inputs, and the decoding check's
/// plan. Variable-length and with-past models run the whole sequence (n tokens, empty
/// past) unless `--dim` says otherwise; a window state (token shift, local window, fold)
/// holds min(past_sequence, K) rows; with-past models also get the decoding check, and
/// its options are refused for other models.
pub(super) fn sequence_dims(
    path: &Path,
    decoding: Option<&DecodingModel>,
    options: &ValidateOptions,
) -> Result<(Dims, Option<DecodingPlan>)> {
    let mut dims = options.dims.clone();
    let mut plan = None;
    if let Some(d) = decoding {
        for (symbol, size) in [(SEQUENCE, d.info.max_sequence), (PAST_SEQUENCE, 0)] {
            if !dims.iter().any(|(k, _)| k == symbol) {
                dims.push((symbol.to_string(), size));
            }
        }
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
        return Err(Error::Setting(
            Phrase::setting(Setting::DecodePhases)
                .then(" apply to models built with ")
                .and(Setting::WithPast)
                .then(format!(", and {} is not one", path.display())),
        ));
    }
    Ok((dims, plan))
}

/// The inputs: read from `--inputs` (checked against the model; a static-state model's
/// positions and state sizes too), or generated from the seed at `dims` (a static-state
/// model's state starting empty).
pub(super) fn model_inputs(
    model: &ModelProto,
    decoding: Option<&DecodingModel>,
    dims: &[(String, usize)],
    options: &ValidateOptions,
) -> Result<Vec<NamedTensor>> {
    let static_state = decoding.filter(|d| d.info.mode == SequenceMode::Static);
    if let Some(reference) = &options.reference {
        let given = check_inputs(model, reference.inputs.clone(), &reference.label)?;
        if let Some(d) = static_state {
            check_static_positions(&given, &d.info)
                .map_err(|e| Error::BadTensor(format!("{}: {e}", reference.label)))?;
        }
        return Ok(given);
    }
    match &options.inputs {
        Some(file) => {
            let what = file.display().to_string();
            let given = check_inputs(model, npz::read_npz(file)?, &what)?;
            if let Some(d) = static_state {
                check_static_positions(&given, &d.info)
                    .map_err(|e| Error::BadTensor(format!("{what}: {e}")))?;
            }
            Ok(given)
        }
        None => {
            let mut generated = make_inputs(model, options.batch, dims, options.seed)?;
            if let Some(d) = static_state {
                start_static_state(&mut generated, &d.info);
            }
            Ok(generated)
        }
    }
}

/// The `--expected` outputs, each of which must name an output of the model.
pub(super) fn read_expected(
    options: &ValidateOptions,
    output_names: &[String],
) -> Result<Option<Vec<NamedTensor>>> {
    let (what, arrays) = match (&options.reference, &options.expected) {
        (Some(reference), _) => (reference.label.clone(), reference.outputs.clone()),
        (None, Some(file)) => (file.display().to_string(), npz::read_npz(file)?),
        (None, None) => return Ok(None),
    };
    if let Some(extra) = arrays.iter().find(|t| !output_names.contains(&t.name)) {
        return Err(Error::BadTensor(format!(
            "{what}: array '{}' is not an output of the model (outputs: {})",
            extra.name,
            output_names.join(", ")
        )));
    }
    Ok(Some(arrays))
}

/// Every runtime loaded (with its load time in ms) before any runs, so that an
/// unavailable one fails fast; ONNX Runtime profiles into the temporary folder, for the
/// placement check; with `tract_dequantize`, tract runs the MatMulNBits nodes it cannot
/// read on dequantized weights (and says so in its report's note).
pub(super) fn load_runtimes(
    file: ModelFile,
    options: &ValidateOptions,
    tract_dequantize: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Loaded>> {
    let profile_dir = std::env::temp_dir();
    options
        .runtimes
        .iter()
        .map(|&kind| {
            progress(&format!("loading {}", kind.name()));
            let mut rt_options = options.runtime.clone();
            rt_options.tract.dequantize_nbits |= tract_dequantize;
            if kind != RuntimeKind::Tract {
                rt_options.ort.profile_prefix = Some(profile_dir.join(format!(
                    "gmlp-onnx-profile-{}-{}",
                    std::process::id(),
                    kind.name()
                )));
            }
            let start = Instant::now();
            runtime::open(kind, file, &rt_options)
                .map(|rt| (kind, rt, start.elapsed().as_secs_f64() * 1e3))
        })
        .collect()
}

/// One runtime's first run (its outputs, timing and placement, checked) and its
/// benchmark (`--bench` timed runs after it).
pub(super) fn run_one(
    kind: RuntimeKind,
    rt: &mut dyn Runtime,
    load_ms: f64,
    inputs: &[NamedTensor],
    options: &ValidateOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<(RuntimeReport, Vec<NamedTensor>)> {
    progress(&format!("running {}", kind.name()));
    let start = Instant::now();
    let outputs = rt.run(inputs)?;
    let first_run_ms = start.elapsed().as_secs_f64() * 1e3;
    let providers = rt.placement()?;
    crate::validate::check_placement(kind, providers.as_ref())?;
    let bench = if options.bench > 0 {
        let runs = options.bench;
        let what = kind.name();
        // Timed runs into arrays of the first run's shapes (a copy of its outputs, which
        // stay as they are for the comparison), so that they allocate nothing.
        let mut scratch = outputs.clone();
        let host = time_runs(
            runs,
            |k| progress(&format!("benchmarking {what} {k}/{runs}")),
            || rt.run_into(inputs, &mut scratch),
        )?;
        drop(scratch);
        let device_resident = match rt.on_device(inputs)? {
            Some(mut on_device) => {
                // One untimed run: the first places the outputs in device memory.
                on_device.run()?;
                Some(time_runs(
                    runs,
                    |k| {
                        progress(&format!(
                            "benchmarking {what} with outputs on the device {k}/{runs}"
                        ))
                    },
                    || on_device.run(),
                )?)
            }
            None => None,
        };
        Some(BenchReport {
            host,
            device_resident,
        })
    } else {
        None
    };
    let report = RuntimeReport {
        name: rt.name().to_string(),
        note: rt.note(),
        load_ms,
        first_run_ms,
        providers,
        bench,
    };
    Ok((report, outputs))
}

/// Every pair of runtimes compared output by output, then each runtime with the expected
/// outputs when given; with `histograms`, the elementwise error histogram of each.
pub(super) fn compare_results(
    results: &[(String, Vec<NamedTensor>)],
    expected: Option<&[NamedTensor]>,
    options: &ValidateOptions,
    tolerance: Tolerance,
) -> Result<(Vec<PairReport>, Vec<ErrorHistogram>)> {
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
    if let Some(expected) = expected {
        let (label, what) = match (&options.reference, &options.expected) {
            (Some(reference), _) => (reference.label.as_str(), reference.label.clone()),
            (None, file) => (
                EXPECTED,
                file.as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
        };
        for (name, outputs) in results {
            let diffs = compare_all(expected, outputs, tolerance)
                .map_err(|e| Error::BadTensor(format!("{what}: {e}")))?;
            pairs.push(pair(label, name, diffs));
            if options.histograms {
                error_histograms.extend(histograms::error_histograms(
                    label, name, expected, outputs, tolerance,
                )?);
            }
        }
    }
    Ok((pairs, error_histograms))
}
