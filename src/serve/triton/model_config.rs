//! The configuration of a repository entry: Triton's model name rules, the plan derived
//! from an ONNX model's declared inputs and outputs ([`plan`]), and its rendering as
//! `config.pbtxt` ([`TritonConfig::to_pbtxt`]).

use std::collections::BTreeMap;

use super::{unservable, TritonOptions, DEFAULT_MAX_BATCH_SIZE, WITH_PAST_MAX_BATCH_SIZE};
use crate::error::{Error, Result};
use crate::gmlp::emit::INPUT_IDS;
use crate::gmlp::interface::POSITION;
use crate::message::{Phrase, Setting};
use crate::onnx::dtype::DataType;
use crate::onnx::graph::Dim;
use crate::onnx::proto as onnx;
use crate::onnx::reader::{declared_inputs, declared_outputs, DeclaredTensor};

/// How many sequences Triton's `oldest` sequence batcher tracks at once per model.
pub const MAX_CANDIDATE_SEQUENCES: u32 = 64;
/// Prefix of a with-past model's state inputs.
pub const PAST_PREFIX: &str = "past_";
/// Prefix of the outputs that carry the next state.
pub const PRESENT_PREFIX: &str = "present_";
/// The output the position counter adds to a static-state model: `position` plus the
/// request's token count, which Triton feeds back as the next request's `position`.
pub const NEXT_POSITION: &str = crate::gmlp::interface::TRITON_NEXT_POSITION;

/// Checks a Triton model name. The name is a directory of the repository, a path segment
/// of every HTTP URL (`/v2/models/NAME/infer`) and the `name` field of `config.pbtxt`, so
/// it is limited to letters, digits, `_`, `-` and `.`, at most 128 characters, and may not
/// start with `.` (Triton skips hidden directories of a repository) or `-`.
pub fn check_model_name(name: &str) -> Result<()> {
    let bad = |why: &str| Error::InvalidArgument(format!("Triton model name {name:?} {why}"));
    if name.is_empty() {
        return Err(bad("is empty"));
    }
    if name.len() > 128 {
        return Err(bad("is longer than 128 characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(bad(&format!(
            "contains {c:?}; use letters, digits, '_', '-' and '.' (the name is a directory and a URL path segment)"
        )));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(bad(
            "starts with '.' or '-' (Triton skips hidden directories; '-' reads as an option)",
        ));
    }
    Ok(())
}

/// Triton's data type for an ONNX element type code, for the types the ONNX Runtime
/// backend exchanges (`None`: bfloat16, complex, float8, float6, float4, 4- and 2-bit
/// integer and undefined types, which the backend refuses).
pub fn triton_data_type(onnx_elem_type: i32) -> Option<&'static str> {
    Some(match DataType::try_from(onnx_elem_type).ok()? {
        DataType::Float => "TYPE_FP32",
        DataType::Uint8 => "TYPE_UINT8",
        DataType::Int8 => "TYPE_INT8",
        DataType::Uint16 => "TYPE_UINT16",
        DataType::Int16 => "TYPE_INT16",
        DataType::Int32 => "TYPE_INT32",
        DataType::Int64 => "TYPE_INT64",
        DataType::String => "TYPE_STRING",
        DataType::Bool => "TYPE_BOOL",
        DataType::Float16 => "TYPE_FP16",
        DataType::Double => "TYPE_FP64",
        DataType::Uint32 => "TYPE_UINT32",
        DataType::Uint64 => "TYPE_UINT64",
        _ => return None,
    })
}

/// One input or output of the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TritonTensor {
    /// Tensor name in the ONNX graph.
    pub name: String,
    /// Triton data type (`TYPE_FP32`, ...).
    pub data_type: &'static str,
    /// Dimensions without the batch dimension when batching; −1 for a variable size.
    pub dims: Vec<i64>,
    /// The shape the model sees when it differs from `dims`: a batched tensor of shape
    /// `[batch]` (the static form's `position`) is `dims: [ 1 ]` to clients, since Triton
    /// needs at least one dimension, and `reshape: { shape: [ ] }` to the model.
    pub reshape: Option<Vec<i64>>,
}

/// What an implicit state carries from one request of a sequence to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// A state that grows with every token, along `sequence_axis` of the full ONNX shape
    /// (batch included); it starts as one zero slot, which the served graph slices off
    /// ([`Interface::Triton`](crate::gmlp::Interface::Triton)).
    Growing {
        /// The axis along which the state grows.
        sequence_axis: usize,
    },
    /// A fixed-size (static) state, starting as zeros: served as the model has it.
    Fixed,
    /// The static form's `position`: the tokens the sequence has sent before, starting at
    /// 0 and advanced by each request's token count (the served graph's [`NEXT_POSITION`]
    /// output, [`Interface::Triton`](crate::gmlp::Interface::Triton)).
    Position,
}

/// An implicit state of a with-past model: Triton feeds `input` from the `output` of the
/// previous request of the same sequence, starting from zeros when a request carries the
/// sequence's start flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImplicitState {
    /// The state input (`past_*`, or `position`; name, type, dims as in [`TritonTensor`]).
    pub input: TritonTensor,
    /// The matching output (`present_*`, or [`NEXT_POSITION`]).
    pub output_name: String,
    /// What it carries.
    pub kind: StateKind,
}

impl ImplicitState {
    /// The axis a growing state grows along (`None` for the fixed-size kinds).
    pub fn sequence_axis(&self) -> Option<usize> {
        match self.kind {
            StateKind::Growing { sequence_axis } => Some(sequence_axis),
            StateKind::Fixed | StateKind::Position => None,
        }
    }
}

/// A configuration ready to render as `config.pbtxt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TritonConfig {
    /// The options it was made with.
    pub options: TritonOptions,
    /// The `max_batch_size` written (the option, or its default for this model).
    pub max_batch_size: u32,
    /// Inputs the client sends (state inputs excluded).
    pub inputs: Vec<TritonTensor>,
    /// Outputs the client can request (state outputs excluded).
    pub outputs: Vec<TritonTensor>,
    /// Implicit states (empty for a stateless model).
    pub states: Vec<ImplicitState>,
}

impl TritonConfig {
    /// True when the model's state grows (served behind the one-slot adapter, one
    /// sequence per execution).
    pub fn growing(&self) -> bool {
        self.states.iter().any(|s| s.sequence_axis().is_some())
    }

    /// True when the server keeps each sequence's position (a static-state model served
    /// behind the position counter).
    pub fn counts_positions(&self) -> bool {
        self.states.iter().any(|s| s.kind == StateKind::Position)
    }
}

fn triton_tensor(t: &DeclaredTensor, batched: bool, role: &str) -> Result<TritonTensor> {
    let data_type = triton_data_type(t.elem_type).ok_or_else(|| {
        unservable(format!(
            "{role} {} has ONNX element type {} ({}), which Triton's ONNX Runtime backend cannot carry",
            t.name,
            t.elem_type,
            refused_type_name(t.elem_type)
        ))
    })?;
    let mut shape = t.shape.as_slice();
    if batched {
        let unbatchable = |why: String| {
            Error::Setting(
                Phrase::text(format!("{role} {} {why} (use ", t.name))
                    .and(Setting::TritonMaxBatchSize)
                    .then(" 0)"),
            )
        };
        match shape.first() {
            Some(Dim::Symbol(_)) => shape = &shape[1..],
            Some(Dim::Fixed(n)) => {
                return Err(unbatchable(format!(
                    "has a fixed first dimension {n}; Triton batching needs a variable batch dimension there"
                )))
            }
            None => {
                return Err(unbatchable(
                    "is a scalar or has no declared shape; Triton batching needs a batch dimension"
                        .into(),
                ))
            }
        }
    }
    let dims: Vec<i64> = shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => i64::try_from(*n).unwrap_or(i64::MAX),
            Dim::Symbol(_) => -1,
        })
        .collect();
    if batched && dims.is_empty() {
        return Ok(TritonTensor {
            name: t.name.clone(),
            data_type,
            dims: vec![1],
            reshape: Some(Vec::new()),
        });
    }
    Ok(TritonTensor {
        name: t.name.clone(),
        data_type,
        dims,
        reshape: None,
    })
}

/// The kind of an element type Triton's ONNX Runtime backend refuses, for messages.
fn refused_type_name(code: i32) -> &'static str {
    match DataType::try_from(code) {
        Ok(DataType::Undefined) => "undefined",
        Ok(DataType::Complex64) => "complex64",
        Ok(DataType::Complex128) => "complex128",
        Ok(DataType::Bfloat16) => "bfloat16",
        Ok(
            DataType::Float8e4m3fn
            | DataType::Float8e4m3fnuz
            | DataType::Float8e5m2
            | DataType::Float8e5m2fnuz
            | DataType::Float8e8m0,
        ) => "float8",
        Ok(DataType::Uint4 | DataType::Int4) => "4-bit integer",
        Ok(DataType::Uint2 | DataType::Int2) => "2-bit integer",
        Ok(DataType::Float4e2m1) => "float4",
        Ok(DataType::Float6e2m3 | DataType::Float6e3m2) => "float6",
        _ => "unknown",
    }
}

/// The two state forms of a with-past model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PastKind {
    /// `past_*` [batch, past_sequence, width]: one variable dimension, the positions.
    Growing,
    /// `past_*` [batch, n, width]: fixed size, written in place; sequences at different
    /// positions batch together.
    Static,
}

/// The position counter of a static-state model: its `position` input (int64 `[batch]`,
/// one per sequence) becomes an implicit state of dims `[ 1 ]` that starts at 0, fed from
/// [`NEXT_POSITION`] (the counter declares both `[batch, 1]`); the model must also take
/// `input_ids` `[batch, sequence]`, whose sequence length advances the count.
fn position_state(position: &DeclaredTensor, inputs: &[DeclaredTensor]) -> Result<ImplicitState> {
    let int64 = DataType::Int64 as i32;
    if position.elem_type != int64 || !matches!(position.shape.as_slice(), [Dim::Symbol(_)]) {
        let shape: Vec<String> = position.shape.iter().map(Dim::to_string).collect();
        return Err(unservable(format!(
            "a static-state model's {POSITION} input must be int64 [batch] (one position per sequence) for Triton to count it; it is {} [{}]",
            refused_or_named(position.elem_type),
            shape.join(", ")
        )));
    }
    let tokens_ok = inputs
        .iter()
        .any(|t| t.name == INPUT_IDS && t.elem_type == int64 && t.shape.len() == 2);
    if !tokens_ok {
        return Err(unservable(format!(
            "a static-state model served with its position kept by Triton needs an int64 input {INPUT_IDS} [batch, sequence], whose length advances the position"
        )));
    }
    Ok(ImplicitState {
        input: TritonTensor {
            name: position.name.clone(),
            data_type: "TYPE_INT64",
            dims: vec![1],
            reshape: None,
        },
        output_name: NEXT_POSITION.to_string(),
        kind: StateKind::Position,
    })
}

/// An element type for messages: Triton's name where it has one, else the refused kind.
fn refused_or_named(code: i32) -> &'static str {
    triton_data_type(code).unwrap_or_else(|| refused_type_name(code))
}

/// Derives the configuration of a decoded model: each graph input and output with
/// Triton's type and dims, and for a with-past model the implicit states pairing each
/// `past_*` input with its `present_*` output; a static-state model's `position` input is
/// one more implicit state, the count of tokens its sequence has sent.
pub fn plan(model: &onnx::ModelProto, options: &TritonOptions) -> Result<TritonConfig> {
    options.check()?;
    let declared_in = declared_inputs(model);
    let declared_out = declared_outputs(model);
    check_tensor_names(declared_in.iter().chain(&declared_out))?;
    let outputs_by_name: BTreeMap<&str, &DeclaredTensor> =
        declared_out.iter().map(|t| (t.name.as_str(), t)).collect();
    let past_kind = past_kind(&declared_in);
    if past_kind.is_none() && options.max_sequence_idle_us.is_some() {
        return Err(Error::Setting(
            Phrase::setting(Setting::TritonMaxSequenceIdleUs).then(
                " applies to with-past models (Triton's sequence batcher); this model has no past_* state",
            ),
        ));
    }
    let max_batch_size = max_batch_size(options.max_batch_size, past_kind)?;
    let batched = max_batch_size > 0;
    let mut inputs = Vec::new();
    let mut states = Vec::new();
    let mut state_outputs = Vec::new();
    for t in &declared_in {
        if past_kind == Some(PastKind::Static) && t.name == POSITION {
            states.push(position_state(t, &declared_in)?);
            continue;
        }
        let Some(suffix) = t.name.strip_prefix(PAST_PREFIX) else {
            inputs.push(triton_tensor(t, batched, "input")?);
            continue;
        };
        let state = past_state(t, suffix, &outputs_by_name, batched, past_kind)?;
        state_outputs.push(state.output_name.clone());
        states.push(state);
    }
    if inputs.is_empty() {
        return Err(unservable("the model has no input besides its states"));
    }
    let outputs = declared_out
        .iter()
        .filter(|t| !state_outputs.contains(&t.name))
        .map(|t| triton_tensor(t, batched, "output"))
        .collect::<Result<Vec<_>>>()?;
    if outputs.is_empty() {
        return Err(unservable("the model has no output besides its states"));
    }
    super::pairing::check_state_pairing(
        states
            .iter()
            .map(|s| (s.input.name.as_str(), s.output_name.as_str())),
    )?;
    Ok(TritonConfig {
        options: options.clone(),
        max_batch_size,
        inputs,
        outputs,
        states,
    })
}

/// Refuses a tensor name that `config.pbtxt` cannot hold (empty, or with a control
/// character).
fn check_tensor_names<'t>(tensors: impl Iterator<Item = &'t DeclaredTensor>) -> Result<()> {
    for t in tensors {
        if t.name.is_empty() || t.name.chars().any(|c| c.is_control()) {
            return Err(unservable(format!(
                "tensor name {:?} cannot be written in config.pbtxt",
                t.name
            )));
        }
    }
    Ok(())
}

/// The state form of a model with these inputs: none without `past_*` inputs, static when
/// every one has a fixed size besides the batch (docs/static-state.md), else growing.
fn past_kind(declared_in: &[DeclaredTensor]) -> Option<PastKind> {
    let pasts: Vec<&DeclaredTensor> = declared_in
        .iter()
        .filter(|t| t.name.starts_with(PAST_PREFIX))
        .collect();
    // A static state (docs/static-state.md) has a fixed size besides the batch.
    let fixed = |t: &DeclaredTensor| t.shape.iter().skip(1).all(|d| matches!(d, Dim::Fixed(_)));
    match (pasts.is_empty(), pasts.iter().all(|t| fixed(t))) {
        (true, _) => None,
        (false, true) => Some(PastKind::Static),
        (false, false) => Some(PastKind::Growing),
    }
}

/// The `max_batch_size` to write: the `option` given, or the default for the state form;
/// refuses a size the state form cannot be served with.
fn max_batch_size(option: Option<u32>, past_kind: Option<PastKind>) -> Result<u32> {
    Ok(match (option, past_kind) {
        (None, None) | (None, Some(PastKind::Static)) => DEFAULT_MAX_BATCH_SIZE,
        (None, Some(PastKind::Growing))
        | (Some(WITH_PAST_MAX_BATCH_SIZE), Some(PastKind::Growing)) => WITH_PAST_MAX_BATCH_SIZE,
        (Some(n), Some(PastKind::Growing)) => {
            return Err(Error::Setting(
                Phrase::text(format!(
                    "a growing-state with-past model is served with max_batch_size {WITH_PAST_MAX_BATCH_SIZE}, not {n}: Triton's ONNX Runtime backend cannot batch sequences whose states differ in length (build it with "
                ))
                .and(Setting::StaticState)
                .then(" to batch sequences; docs/static-state.md)"),
            ))
        }
        (Some(0), Some(PastKind::Static)) => {
            return Err(Error::OutOfRange(
                "a static-state model is served by Triton's sequence batcher with its state per sequence, which needs max_batch_size >= 1 (0 would make the batch part of the state)".into(),
            ))
        }
        (Some(n), _) => n,
    })
}

/// The implicit state of the state input `t` (`past_` + `suffix`), paired with its
/// `present_` output among `outputs_by_name`; refuses a pair that differs in type, rank
/// or (for the state form `past_kind`) size.
fn past_state(
    t: &DeclaredTensor,
    suffix: &str,
    outputs_by_name: &BTreeMap<&str, &DeclaredTensor>,
    batched: bool,
    past_kind: Option<PastKind>,
) -> Result<ImplicitState> {
    let present = format!("{PRESENT_PREFIX}{suffix}");
    let Some(out) = outputs_by_name.get(present.as_str()) else {
        return Err(unservable(format!(
            "input {} looks like a with-past state but the model has no output {present} to carry it to the next request",
            t.name
        )));
    };
    let input = triton_tensor(t, batched, "state input")?;
    let output = triton_tensor(out, batched, "state output")?;
    if input.data_type != output.data_type || input.dims.len() != output.dims.len() {
        return Err(unservable(format!(
            "state input {} ({} {:?}) and output {present} ({} {:?}) differ in type or rank",
            t.name, input.data_type, input.dims, output.data_type, output.dims
        )));
    }
    let variable: Vec<usize> = (0..input.dims.len())
        .filter(|&i| input.dims[i] == -1)
        .collect();
    let kind = match past_kind {
        Some(PastKind::Static) => {
            if output.dims != input.dims {
                return Err(unservable(format!(
                    "static state input {} {:?} and output {present} {:?} differ in size",
                    t.name, input.dims, output.dims
                )));
            }
            StateKind::Fixed
        }
        _ => {
            if variable.len() != 1 || output.dims[variable[0]] != -1 {
                return Err(unservable(format!(
                    "state input {} needs exactly one variable dimension besides the batch (the past positions), shared with {present}; it has dims {:?}",
                    t.name, input.dims
                )));
            }
            StateKind::Growing {
                sequence_axis: variable[0] + 1,
            }
        }
    };
    Ok(ImplicitState {
        input,
        output_name: present,
        kind,
    })
}

#[cfg(test)]
mod tests;
