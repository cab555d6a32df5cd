//! The inputs a validation runs on: generated from a seed with the model's declared shapes
//! (symbolic dimensions bound by the caller, token ids within the vocabulary our metadata
//! records), or read from an `.npz` and checked against the declarations.

use std::collections::BTreeMap;

use ndarray::{ArrayD, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::emit::BATCH;
use crate::gmlp::interface::{DecodingInfo, POSITION};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY};
use crate::gmlp::{GmlpConfig, Task};
use crate::message::{Phrase, Setting};
use crate::onnx::dtype::{self, type_name, DataType};
use crate::onnx::graph::Dim;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::{declared_inputs, metadata_value, DeclaredTensor};
use crate::rng::SplitMix64;
use crate::tensor::{NamedTensor, TensorValue};

/// Largest number of elements generated for a model's inputs, all inputs together (1 GiB of f32).
pub const MAX_INPUT_ELEMENTS: usize = 1 << 28;
/// Input element types a validation can feed.
const SUPPORTED_INPUTS: [DataType; 4] = [
    DataType::Float,
    DataType::Double,
    DataType::Int32,
    DataType::Int64,
];

/// The [`GmlpConfig`] stored in a model's metadata, if it is one of ours.
pub fn stored_config(model: &ModelProto) -> Option<GmlpConfig> {
    metadata_value(model, CONFIG_KEY).and_then(parse_config)
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
            Dim::Symbol(s) if s == BATCH => Ok(batch),
            Dim::Symbol(s) => dims
                .iter()
                .find(|(k, _)| k == s)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    Error::Setting(
                        Phrase::text(format!(
                            "input {}: symbolic dimension '{s}' needs a value (",
                            input.name
                        ))
                        .and(Setting::Dim)
                        .then(format!(" {s}=N)")),
                    )
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
                return Err(Error::TooLarge(format!(
                    "input {} of shape {shape:?} is too large to generate (limit {MAX_INPUT_ELEMENTS} elements for all inputs together)",
                    input.name
                )))
            }
        };
        out.push((input, shape));
    }
    Ok(out)
}

/// Makes generated inputs of a static-state model (docs/static-state.md) a first run: every
/// sequence at `position` 0 and every `past_*` state zero (the whole sequence then fills
/// the state from its first row, as a prompt does).
pub fn start_static_state(inputs: &mut [NamedTensor], info: &DecodingInfo) {
    for t in inputs.iter_mut() {
        let is_state = info.state.iter().any(|s| s.past == t.name);
        match &mut t.value {
            TensorValue::I64(a) if t.name == POSITION => a.fill(0),
            TensorValue::F32(a) if is_state => a.fill(0.0),
            _ => {}
        }
    }
}

/// Checks the `position` of given inputs of a static-state model before any run: every
/// sequence's position P and its T new tokens must stay within the model's n positions
/// (0 ≤ P and P + T ≤ n); the graph would fail at its checking `Gather` otherwise.
pub fn check_static_positions(inputs: &[NamedTensor], info: &DecodingInfo) -> Result<()> {
    let n = info.max_sequence;
    let tokens = inputs
        .iter()
        .find(|t| t.name == crate::gmlp::emit::INPUT_IDS)
        .and_then(|t| t.value.shape().get(1).copied())
        .unwrap_or(0);
    let Some(TensorValue::I64(position)) =
        inputs.iter().find(|t| t.name == POSITION).map(|t| &t.value)
    else {
        return Ok(());
    };
    for (b, &p) in position.iter().enumerate() {
        if p < 0 || p as u128 + tokens as u128 > n as u128 {
            return Err(Error::BadTensor(format!(
                "position[{b}] = {p} with {tokens} tokens leaves the model's {n} positions (0 <= position, position + sequence <= {n})"
            )));
        }
    }
    Ok(())
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
        let value = match DataType::try_from(input.elem_type) {
            Ok(DataType::Float) => TensorValue::F32(
                ArrayD::from_shape_vec(
                    dims,
                    (0..count).map(|_| rng.uniform(-1.0, 1.0) as f32).collect(),
                )
                .map_err(shaped)?,
            ),
            Ok(DataType::Double) => TensorValue::F64(
                ArrayD::from_shape_vec(dims, (0..count).map(|_| rng.uniform(-1.0, 1.0)).collect())
                    .map_err(shaped)?,
            ),
            Ok(DataType::Int32) => TensorValue::I32(
                ArrayD::from_shape_vec(
                    dims,
                    (0..count)
                        .map(|_| rng.below(vocab.min(i32::MAX as u64)) as i32)
                        .collect(),
                )
                .map_err(shaped)?,
            ),
            Ok(DataType::Int64) => TensorValue::I64(
                ArrayD::from_shape_vec(dims, (0..count).map(|_| rng.below(vocab) as i64).collect())
                    .map_err(shaped)?,
            ),
            _ => return Err(unsupported_input(&input.name, input.elem_type)),
        };
        out.push(NamedTensor {
            name: input.name,
            value,
        });
    }
    if out.is_empty() {
        return Err(Error::Unsupported("the model declares no input".into()));
    }
    Ok(out)
}

fn unsupported_input(name: &str, elem_type: i32) -> Error {
    Error::Unsupported(format!(
        "input {name} has element type {}; only float32, float64, int32 and int64 inputs are supported",
        type_name(elem_type)
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
        return Err(Error::Unsupported("the model declares no input".into()));
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
    let mut symbols = Symbols::new();
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
        check_input(d, &t, &mut symbols, what)?;
        out.push(t);
    }
    Ok(out)
}

/// The size each symbolic dimension has, and the input it was first seen in.
type Symbols = BTreeMap<String, (usize, String)>;

/// Checks the array `t` given for the declared input `d`: its element type, rank and
/// fixed sizes, and its symbolic dimensions against the sizes `symbols` holds (recording
/// those seen first here).
fn check_input(
    d: &DeclaredTensor,
    t: &NamedTensor,
    symbols: &mut Symbols,
    what: &str,
) -> Result<()> {
    let bad = |msg: String| Error::BadTensor(format!("{what}: {msg}"));
    if !SUPPORTED_INPUTS.iter().any(|&s| s as i32 == d.elem_type) {
        return Err(unsupported_input(&d.name, d.elem_type));
    }
    if dtype::of_value(&t.value) as i32 != d.elem_type {
        return Err(bad(format!(
            "input {}: the model declares {}, the file holds {}",
            d.name,
            type_name(d.elem_type),
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(shape: Vec<Dim>) -> DeclaredTensor {
        DeclaredTensor {
            name: "x".into(),
            elem_type: DataType::Float as i32,
            shape,
        }
    }

    #[test]
    fn symbolic_dimensions_bind_to_batch_and_named_sizes() {
        let x = declared(vec![
            Dim::Symbol(BATCH.into()),
            Dim::Symbol("sequence".into()),
            Dim::Fixed(4),
        ]);
        let dims = vec![("sequence".to_string(), 7)];
        assert_eq!(concrete_shape(&x, 3, &dims).unwrap(), vec![3, 7, 4]);
        let err = concrete_shape(&x, 3, &[]).unwrap_err();
        assert!(
            matches!(&err, Error::Setting(p) if p.settings().eq([Setting::Dim])),
            "{err:?}"
        );
    }
}
