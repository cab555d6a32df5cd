//! Validation: seeded inputs of a model's declared shapes, run on each runtime, every
//! pair of runtimes compared output by output.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ndarray::{ArrayD, IxDyn};
use serde::Serialize;

use crate::compare::{compare_all, OutputDiff, Tolerance};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Task};
use crate::gmlp::weights::SplitMix64;
use crate::graph::Dim;
use crate::model_io::{declared_inputs, metadata_value, read_model};
use crate::onnx::ModelProto;
use crate::runtime::{self, NamedTensor, RuntimeKind, RuntimeOptions, TensorValue};

/// Metadata key holding the model's [`GmlpConfig`] as JSON.
pub const CONFIG_KEY: &str = "gmlp_onnx.config";
/// Largest number of elements of one generated input.
pub const MAX_INPUT_ELEMENTS: usize = 1 << 28;

/// What to validate and how.
#[derive(Clone, Debug)]
pub struct ValidateOptions {
    /// Runtimes to run (at least one; two or more to compare).
    pub runtimes: Vec<RuntimeKind>,
    /// Value of the symbolic `batch` dimension.
    pub batch: usize,
    /// Values of other symbolic dimensions.
    pub dims: Vec<(String, usize)>,
    /// Seed of the generated inputs.
    pub seed: u64,
    /// Agreement criterion.
    pub tolerance: Tolerance,
    /// Runtime settings.
    pub runtime: RuntimeOptions,
}

/// Comparison of one pair of runtimes.
#[derive(Clone, Debug, Serialize)]
pub struct PairReport {
    /// Runtime taken as reference.
    pub reference: String,
    /// Runtime compared with it.
    pub other: String,
    /// Per-output differences.
    pub outputs: Vec<OutputDiff>,
    /// True when every output agrees.
    pub pass: bool,
}

/// One generated input.
#[derive(Clone, Debug, Serialize)]
pub struct InputReport {
    /// Input name.
    pub name: String,
    /// Concrete shape used.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: &'static str,
}

/// Result of [`validate`].
#[derive(Clone, Debug, Serialize)]
pub struct ValidationReport {
    /// The model file.
    pub model: PathBuf,
    /// Inputs used.
    pub inputs: Vec<InputReport>,
    /// Runtimes run, in order, with the time of their first run in milliseconds.
    pub runtimes: Vec<(String, f64)>,
    /// Every pair of runtimes.
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

/// Seeded inputs for every declared input of `model`: f32 uniform in [−1, 1); integer
/// inputs are token ids uniform in [0, vocab) when the metadata gives a vocabulary,
/// else in [0, 2).
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
    for input in declared_inputs(model) {
        let shape: Vec<usize> = input
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
            .collect::<Result<_>>()?;
        let count = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&c| c <= MAX_INPUT_ELEMENTS)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "input {} of shape {shape:?} is too large to generate (limit {MAX_INPUT_ELEMENTS} elements)",
                    input.name
                ))
            })?;
        let mut rng = SplitMix64::keyed(seed, &input.name);
        let value = match input.elem_type {
            1 => TensorValue::F32(
                ArrayD::from_shape_vec(
                    IxDyn(&shape),
                    (0..count).map(|_| rng.uniform(-1.0, 1.0) as f32).collect(),
                )
                .map_err(|e| Error::BadTensor(e.to_string()))?,
            ),
            7 => TensorValue::I64(
                ArrayD::from_shape_vec(
                    IxDyn(&shape),
                    (0..count).map(|_| rng.below(vocab) as i64).collect(),
                )
                .map_err(|e| Error::BadTensor(e.to_string()))?,
            ),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "input {} has element type {other}; only float (1) and int64 (7) inputs are supported",
                    input.name
                )))
            }
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

/// Runs `model` on every requested runtime with the same seeded inputs and compares
/// every pair of runtimes.
pub fn validate(path: &Path, options: &ValidateOptions) -> Result<ValidationReport> {
    if options.batch == 0 {
        return Err(Error::InvalidArgument("--batch must be at least 1".into()));
    }
    let model = read_model(path)?;
    let inputs = make_inputs(&model, options.batch, &options.dims, options.seed)?;
    drop(model);
    // Load every runtime before running any, so an unavailable one fails fast.
    let loaded = options
        .runtimes
        .iter()
        .map(|&kind| runtime::open(kind, path, &options.runtime))
        .collect::<Result<Vec<_>>>()?;
    let mut results: Vec<(String, Vec<NamedTensor>)> = Vec::new();
    let mut timings = Vec::new();
    for mut rt in loaded {
        let start = Instant::now();
        let outputs = rt.run(&inputs)?;
        timings.push((rt.name().to_string(), start.elapsed().as_secs_f64() * 1e3));
        results.push((rt.name().to_string(), outputs));
    }
    let mut pairs = Vec::new();
    for i in 0..results.len() {
        for j in i + 1..results.len() {
            let outputs = compare_all(&results[i].1, &results[j].1, options.tolerance)?;
            let pass = outputs.iter().all(|o| o.pass);
            pairs.push(PairReport {
                reference: results[i].0.clone(),
                other: results[j].0.clone(),
                outputs,
                pass,
            });
        }
    }
    let pass = pairs.iter().all(|p| p.pass);
    Ok(ValidationReport {
        model: path.to_path_buf(),
        inputs: inputs
            .iter()
            .map(|t| InputReport {
                name: t.name.clone(),
                shape: t.value.shape().to_vec(),
                dtype: match t.value {
                    TensorValue::F32(_) => "float32",
                    TensorValue::I64(_) => "int64",
                },
            })
            .collect(),
        runtimes: timings,
        pairs,
        tolerance: options.tolerance,
        pass,
    })
}

impl ValidationReport {
    /// Human-readable summary, one line per runtime pair and output.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for i in &self.inputs {
            s += &format!("input  {} {} {:?}\n", i.name, i.dtype, i.shape);
        }
        for (name, ms) in &self.runtimes {
            s += &format!("ran    {name:<9} {ms:>10.1} ms (first run, includes warm-up)\n");
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
