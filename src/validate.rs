//! Validation: inputs of a model's declared shapes (seeded, or read from an `.npz`),
//! run on each runtime, every pair of runtimes compared output by output, and each
//! runtime compared with stored reference outputs when given.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ndarray::{ArrayD, IxDyn};
use serde::Serialize;

use crate::compare::{compare_all, OutputDiff, Tolerance};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Task};
use crate::gmlp::weights::SplitMix64;
use crate::graph::Dim;
use crate::model_io::{
    check_external_data, declared_inputs, declared_outputs, metadata_value, read_model,
    DeclaredTensor,
};
use crate::npz;
use crate::onnx::ModelProto;
use crate::runtime::{
    self, onnx_type_name, NamedTensor, Placement, RuntimeKind, RuntimeOptions, TensorValue,
};

/// Metadata key holding the model's [`GmlpConfig`] as JSON.
pub const CONFIG_KEY: &str = "gmlp_onnx.config";
/// Largest number of elements generated for a model's inputs, all inputs together (1 GiB of f32).
pub const MAX_INPUT_ELEMENTS: usize = 1 << 28;
/// Most `--bench` runs per runtime (a typo of a few zeros should not run for days).
pub const MAX_BENCH_RUNS: usize = 10_000;
/// The `schema` field of the JSON report; bumped when a field changes meaning.
pub const REPORT_SCHEMA: &str = "gmlp-onnx.validate/1";
/// Name of the reference in pairs that compare a runtime with `--expected` outputs.
pub const EXPECTED: &str = "expected";
/// Execution provider that must run at least one node for `ort-cuda` to count as run.
pub const CUDA_PROVIDER: &str = "CUDAExecutionProvider";

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
    /// Agreement criterion.
    pub tolerance: Tolerance,
    /// Runtime settings.
    pub runtime: RuntimeOptions,
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
            tolerance: Tolerance::default(),
            runtime: RuntimeOptions::default(),
        }
    }
}

/// Comparison of one pair: two runtimes, or [`EXPECTED`] and a runtime.
#[derive(Clone, Debug, Serialize)]
pub struct PairReport {
    /// Runtime (or [`EXPECTED`]) taken as reference.
    pub reference: String,
    /// Runtime compared with it.
    pub other: String,
    /// Per-output differences.
    pub outputs: Vec<OutputDiff>,
    /// True when every output agrees.
    pub pass: bool,
}

/// One model input as used.
#[derive(Clone, Debug, Serialize)]
pub struct InputReport {
    /// Input name.
    pub name: String,
    /// Concrete shape used.
    pub shape: Vec<usize>,
    /// Element type (NumPy name).
    pub dtype: &'static str,
}

/// Latency of repeated runs.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Number of timed runs (after one warm-up run).
    pub runs: usize,
    /// Median latency in milliseconds.
    pub median_ms: f64,
    /// Fastest run in milliseconds.
    pub min_ms: f64,
}

/// What one runtime did.
#[derive(Clone, Debug, Serialize)]
pub struct RuntimeReport {
    /// Runtime name (`tract`, `ort-cpu`, `ort-cuda`).
    pub name: String,
    /// Wall time of loading and preparing the model (tract: parse and optimize; ONNX
    /// Runtime: session creation with its graph optimizations) in milliseconds.
    pub load_ms: f64,
    /// Wall time of the first run in milliseconds (includes warm-up work and, for
    /// ONNX Runtime, profiling).
    pub first_run_ms: f64,
    /// ONNX Runtime only: distinct graph nodes per execution provider in the first
    /// run, from ONNX Runtime's profiler.
    pub providers: Option<Placement>,
    /// Latency of the `--bench` runs.
    pub bench: Option<BenchReport>,
}

/// Result of [`validate`]; serialized as the JSON report (schema [`REPORT_SCHEMA`]).
#[derive(Clone, Debug, Serialize)]
pub struct ValidationReport {
    /// Always [`REPORT_SCHEMA`].
    pub schema: &'static str,
    /// The model file.
    pub model: PathBuf,
    /// Where the inputs came from: `generated` or the `.npz` path.
    pub inputs_source: String,
    /// Seed of generated inputs (`null` with an inputs file).
    pub seed: Option<u64>,
    /// Inputs used.
    pub inputs: Vec<InputReport>,
    /// Reference outputs file, if any.
    pub expected: Option<PathBuf>,
    /// Runtimes run, in order.
    pub runtimes: Vec<RuntimeReport>,
    /// Every pair of runtimes, then every runtime against the expected outputs.
    pub pairs: Vec<PairReport>,
    /// Tolerances applied.
    pub tolerance: Tolerance,
    /// True when every pair agrees.
    pub pass: bool,
}

/// The [`GmlpConfig`] stored in a model's metadata, if it is one of ours.
pub fn stored_config(model: &ModelProto) -> Option<GmlpConfig> {
    metadata_value(model, CONFIG_KEY).and_then(|s| serde_json::from_str(s).ok())
}

/// Concrete shape of a declared input: `batch` and the symbols of `dims` bound.
fn concrete_shape(
    input: &DeclaredTensor,
    batch: usize,
    dims: &[(String, usize)],
) -> Result<Vec<usize>> {
    input
        .shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => Ok(*n),
            Dim::Symbol(s) if s == crate::gmlp::emit::BATCH => Ok(batch),
            Dim::Symbol(s) => dims
                .iter()
                .find(|(k, _)| k == s)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "input {}: symbolic dimension '{s}' needs a value (--dim {s}=N)",
                        input.name
                    ))
                }),
        })
        .collect()
}

/// The concrete shape of every declared input of `model` (`batch` and `dims` bound), refused
/// before any allocation when the inputs together exceed [`MAX_INPUT_ELEMENTS`] elements.
pub fn input_shapes(
    model: &ModelProto,
    batch: usize,
    dims: &[(String, usize)],
) -> Result<Vec<(DeclaredTensor, Vec<usize>)>> {
    let mut total = 0usize;
    let mut out = Vec::new();
    for input in declared_inputs(model) {
        let shape = concrete_shape(&input, batch, dims)?;
        let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        total = match count.and_then(|c| total.checked_add(c)) {
            Some(t) if t <= MAX_INPUT_ELEMENTS => t,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "input {} of shape {shape:?} is too large to generate (limit {MAX_INPUT_ELEMENTS} elements for all inputs together)",
                    input.name
                )))
            }
        };
        out.push((input, shape));
    }
    Ok(out)
}

/// Seeded inputs for every declared input of `model`: floats uniform in [−1, 1);
/// integer inputs are token ids uniform in [0, vocab) when the metadata gives a
/// vocabulary, else in [0, 2).
pub fn make_inputs(
    model: &ModelProto,
    batch: usize,
    dims: &[(String, usize)],
    seed: u64,
) -> Result<Vec<NamedTensor>> {
    let vocab = match stored_config(model).map(|c| c.task) {
        Some(Task::Tokens { vocab_size, .. }) => vocab_size as u64,
        _ => 2,
    };
    let mut out = Vec::new();
    for (input, shape) in input_shapes(model, batch, dims)? {
        let count = shape.iter().product();
        let mut rng = SplitMix64::keyed(seed, &input.name);
        let shaped = |e: ndarray::ShapeError| Error::BadTensor(e.to_string());
        let dims = IxDyn(&shape);
        let value = match input.elem_type {
            1 => TensorValue::F32(
                ArrayD::from_shape_vec(
                    dims,
                    (0..count).map(|_| rng.uniform(-1.0, 1.0) as f32).collect(),
                )
                .map_err(shaped)?,
            ),
            11 => TensorValue::F64(
                ArrayD::from_shape_vec(dims, (0..count).map(|_| rng.uniform(-1.0, 1.0)).collect())
                    .map_err(shaped)?,
            ),
            6 => TensorValue::I32(
                ArrayD::from_shape_vec(
                    dims,
                    (0..count)
                        .map(|_| rng.below(vocab.min(i32::MAX as u64)) as i32)
                        .collect(),
                )
                .map_err(shaped)?,
            ),
            7 => TensorValue::I64(
                ArrayD::from_shape_vec(dims, (0..count).map(|_| rng.below(vocab) as i64).collect())
                    .map_err(shaped)?,
            ),
            other => return Err(unsupported_input(&input.name, other)),
        };
        out.push(NamedTensor {
            name: input.name,
            value,
        });
    }
    if out.is_empty() {
        return Err(Error::InvalidArgument("the model declares no input".into()));
    }
    Ok(out)
}

fn unsupported_input(name: &str, elem_type: i32) -> Error {
    Error::InvalidArgument(format!(
        "input {name} has element type {}; only float32, float64, int32 and int64 inputs are supported",
        onnx_type_name(elem_type)
    ))
}

/// Checks `given` (e.g. read from an `.npz`) against the model's declared inputs: every
/// declared input present, no unknown name, the declared element type, the declared
/// rank and fixed sizes, and each symbolic dimension bound to one size across inputs.
/// Returns the inputs in declaration order.
pub fn check_inputs(
    model: &ModelProto,
    given: Vec<NamedTensor>,
    what: &str,
) -> Result<Vec<NamedTensor>> {
    let declared = declared_inputs(model);
    if declared.is_empty() {
        return Err(Error::InvalidArgument("the model declares no input".into()));
    }
    let bad = |msg: String| Error::BadTensor(format!("{what}: {msg}"));
    let declared_names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
    if let Some(extra) = given
        .iter()
        .find(|t| !declared_names.contains(&t.name.as_str()))
    {
        return Err(bad(format!(
            "array '{}' is not an input of the model (inputs: {})",
            extra.name,
            declared_names.join(", ")
        )));
    }
    let mut given = given;
    let mut out = Vec::new();
    let mut symbols: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for d in &declared {
        let pos = given.iter().position(|t| t.name == d.name).ok_or_else(|| {
            bad(format!(
                "no array for model input {} (the file holds: {})",
                d.name,
                given
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let t = given.remove(pos);
        if !matches!(d.elem_type, 1 | 6 | 7 | 11) {
            return Err(unsupported_input(&d.name, d.elem_type));
        }
        if t.value.onnx_elem_type() != d.elem_type {
            return Err(bad(format!(
                "input {}: the model declares {}, the file holds {}",
                d.name,
                onnx_type_name(d.elem_type),
                t.value.dtype()
            )));
        }
        let shape = t.value.shape();
        let declared_shape = || {
            let dims: Vec<String> = d
                .shape
                .iter()
                .map(|x| match x {
                    Dim::Fixed(n) => n.to_string(),
                    Dim::Symbol(s) => s.clone(),
                })
                .collect();
            format!("[{}]", dims.join(", "))
        };
        if shape.len() != d.shape.len() {
            return Err(bad(format!(
                "input {}: the model declares shape {}, the file holds shape {shape:?}",
                d.name,
                declared_shape()
            )));
        }
        for (axis, (dim, &size)) in d.shape.iter().zip(shape).enumerate() {
            match dim {
                Dim::Fixed(n) if *n != size => {
                    return Err(bad(format!(
                        "input {}: the model declares shape {}, the file holds shape {shape:?} (axis {axis})",
                        d.name,
                        declared_shape()
                    )))
                }
                Dim::Symbol(s) if s != "?" => match symbols.get(s) {
                    Some((v, first)) if *v != size => {
                        return Err(bad(format!(
                            "input {}: dimension '{s}' is {size} here but {v} in input {first}",
                            d.name
                        )))
                    }
                    Some(_) => {}
                    None => {
                        symbols.insert(s.clone(), (size, d.name.clone()));
                    }
                },
                _ => {}
            }
        }
        out.push(t);
    }
    Ok(out)
}

/// Fails when `ort-cuda` ran no node on the CUDA execution provider (the run did not
/// really use the GPU). Other runtimes always pass.
pub fn check_placement(kind: RuntimeKind, placement: Option<&Placement>) -> Result<()> {
    if kind != RuntimeKind::OrtCuda {
        return Ok(());
    }
    let on_cuda = placement
        .and_then(|p| p.get(CUDA_PROVIDER))
        .copied()
        .unwrap_or(0);
    if on_cuda > 0 {
        return Ok(());
    }
    let seen = match placement {
        Some(p) if !p.is_empty() => p
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        Some(_) => "no node at all".into(),
        None => "no profile".into(),
    };
    Err(Error::RuntimeUnavailable {
        runtime: "ort-cuda".into(),
        reason: format!(
            "no node ran on {CUDA_PROVIDER} according to ONNX Runtime's profile ({seen}), so CUDA did not really run"
        ),
    })
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn pair(reference: &str, other: &str, outputs: Vec<OutputDiff>) -> PairReport {
    PairReport {
        reference: reference.into(),
        other: other.into(),
        pass: outputs.iter().all(|o| o.pass),
        outputs,
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
    let inputs = match &options.inputs {
        Some(file) => check_inputs(&model, npz::read_npz(file)?, &file.display().to_string())?,
        None => make_inputs(&model, options.batch, &options.dims, options.seed)?,
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
    }
    if let (Some(file), Some((_, outputs))) = (&options.save_outputs, results.first()) {
        npz::save_npz(file, outputs)?;
    }
    let mut pairs = Vec::new();
    for i in 0..results.len() {
        for j in i + 1..results.len() {
            let outputs = compare_all(&results[i].1, &results[j].1, options.tolerance)?;
            pairs.push(pair(&results[i].0, &results[j].0, outputs));
        }
    }
    if let Some(expected) = &expected {
        let what = options
            .expected
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        for (name, outputs) in &results {
            let diffs = compare_all(expected, outputs, options.tolerance)
                .map_err(|e| Error::BadTensor(format!("{what}: {e}")))?;
            pairs.push(pair(EXPECTED, name, diffs));
        }
    }
    let pass = pairs.iter().all(|p| p.pass);
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
        tolerance: options.tolerance,
        pass,
    })
}

impl ValidationReport {
    /// Human-readable summary: inputs, runtimes (placement, latency), then one line per
    /// pair and output.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for i in &self.inputs {
            s += &format!("input  {} {} {:?}\n", i.name, i.dtype, i.shape);
        }
        for r in &self.runtimes {
            s += &format!(
                "ran    {:<9} load {:>9.1} ms, first run {:>9.1} ms (includes warm-up)\n",
                r.name, r.load_ms, r.first_run_ms
            );
            if let Some(p) = &r.providers {
                let list: Vec<String> = p.iter().map(|(k, v)| format!("{k} {v}")).collect();
                s += &format!(
                    "placed {:<9} nodes per provider: {}\n",
                    r.name,
                    list.join(", ")
                );
            }
            if let Some(b) = &r.bench {
                s += &format!(
                    "bench  {:<9} median {:.3} ms, min {:.3} ms over {} runs\n",
                    r.name, b.median_ms, b.min_ms, b.runs
                );
            }
        }
        for p in &self.pairs {
            for o in &p.outputs {
                s += &format!(
                    "{}  {} vs {}: {} max_abs {:.3e} max_rel {:.3e} cosine {:.9} mismatched {}/{} (bound {:.3e})\n",
                    if o.pass { "agree " } else { "DIFFER" },
                    p.reference,
                    p.other,
                    o.output,
                    o.max_abs,
                    o.max_rel,
                    o.cosine,
                    o.mismatched,
                    o.elements,
                    o.bound
                );
            }
        }
        s
    }
}
