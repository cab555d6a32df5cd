//! Triton Inference Server model repositories: a `config.pbtxt` derived from an ONNX
//! model's declared inputs and outputs, and the standard layout
//! `REPO/NAME/config.pbtxt` + `REPO/NAME/VERSION/model.onnx` (+ `model.onnx.data`),
//! written atomically like every other output.
//!
//! The configuration targets Triton's ONNX Runtime backend (`platform:
//! "onnxruntime_onnx"`). A stateless model gets `dynamic_batching`; a with-past model
//! (inputs `past_*` each answered by an output `present_*`) gets `sequence_batching`
//! with one implicit `state` per pair, so that Triton keeps the state between the
//! requests of a sequence and a client sends only the new token.
//!
//! Two limits of Triton r24.10 shape the with-past form (evidence in README, "Serving
//! with Triton"): the first state of a sequence always has size 1 in each variable
//! dimension, whatever `initial_state` says (a zero-length initial state fails with "not
//! enough space: expected 16, got 0"), and a batch of sequences whose states differ in
//! length is concatenated wrongly by the ONNX Runtime backend. So the repository holds
//! the model behind a small adapter ([`adapt_with_past`]): Triton's state carries one
//! leading zero slot that the adapter slices off before the model and puts back in
//! front of its `present_*` output; and `max_batch_size` is 1 with the `oldest`
//! strategy, so that sequences interleave request by request without being batched.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::error::{Error, Result};
use crate::fs::PendingFile;
use crate::onnx::graph::Dim;
use crate::onnx::proto as onnx;
use crate::onnx::reader::{
    check_external_data, declared_inputs, declared_outputs, external_reference, read_model,
    DeclaredTensor,
};

/// Default `max_batch_size` of a generated configuration for a stateless model.
pub const DEFAULT_MAX_BATCH_SIZE: u32 = 8;
/// The only `max_batch_size` a with-past model can be served with (see the module doc).
pub const WITH_PAST_MAX_BATCH_SIZE: u32 = 1;
/// How many sequences Triton's `oldest` sequence batcher tracks at once per model.
pub const MAX_CANDIDATE_SEQUENCES: u32 = 64;
/// Default `max_queue_delay_microseconds` of the dynamic batcher.
pub const DEFAULT_MAX_QUEUE_DELAY_US: u64 = 100;
/// How long a sequence of a with-past model may stay idle before Triton frees its state.
pub const SEQUENCE_IDLE_US: u64 = 60_000_000;
/// File name of the model inside a version directory (what the ONNX Runtime backend loads).
pub const MODEL_FILE: &str = "model.onnx";
/// File name of the external data beside [`MODEL_FILE`].
pub const DATA_FILE: &str = "model.onnx.data";
/// Prefix of a with-past model's state inputs.
pub const PAST_PREFIX: &str = "past_";
/// Prefix of the outputs that carry the next state.
pub const PRESENT_PREFIX: &str = "present_";

/// Where Triton runs the model instances (`instance_group.kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceKind {
    /// `KIND_CPU`.
    Cpu,
    /// `KIND_GPU` (the backend uses ONNX Runtime's CUDA execution provider).
    Gpu,
}

/// Precision of the optional TensorRT accelerator on GPU instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRtPrecision {
    /// `precision_mode: "FP16"`.
    Fp16,
    /// `precision_mode: "FP32"`.
    Fp32,
}

/// What the generated repository looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TritonOptions {
    /// Model name: the directory under the repository and the name clients use.
    pub name: String,
    /// Version directory (a positive integer).
    pub version: u64,
    /// `max_batch_size`; 0 turns batching off and keeps the batch dimension in `dims`.
    /// `None`: [`DEFAULT_MAX_BATCH_SIZE`], or [`WITH_PAST_MAX_BATCH_SIZE`] for a
    /// with-past model.
    pub max_batch_size: Option<u32>,
    /// `instance_group.kind`.
    pub kind: InstanceKind,
    /// `instance_group.count`: model instances (each an ONNX Runtime session).
    pub instance_count: u32,
    /// TensorRT execution accelerator (GPU instances only).
    pub tensorrt: Option<TensorRtPrecision>,
    /// `max_queue_delay_microseconds`: how long the batcher waits to fill a batch.
    pub max_queue_delay_us: u64,
}

impl TritonOptions {
    /// Defaults for a model called `name`: version 1, default batch size, one CPU instance.
    pub fn new(name: &str) -> Self {
        TritonOptions {
            name: name.to_string(),
            version: 1,
            max_batch_size: None,
            kind: InstanceKind::Cpu,
            instance_count: 1,
            tensorrt: None,
            max_queue_delay_us: DEFAULT_MAX_QUEUE_DELAY_US,
        }
    }

    /// Checks the options on their own (name, version, counts, accelerator).
    pub fn check(&self) -> Result<()> {
        check_model_name(&self.name)?;
        if self.version == 0 {
            return Err(invalid(
                "--triton-version must be >= 1 (Triton ignores a version directory named 0)",
            ));
        }
        if self.instance_count == 0 {
            return Err(invalid("--triton-instances must be >= 1"));
        }
        if self.tensorrt.is_some() && self.kind != InstanceKind::Gpu {
            return Err(invalid(
                "--triton-tensorrt needs --triton-kind gpu (TensorRT runs on GPU instances only)",
            ));
        }
        Ok(())
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Checks a Triton model name. The name is a directory of the repository, a path segment
/// of every HTTP URL (`/v2/models/NAME/infer`) and the `name` field of `config.pbtxt`, so
/// it is limited to letters, digits, `_`, `-` and `.`, at most 128 characters, and may not
/// start with `.` (Triton skips hidden directories of a repository) or `-`.
pub fn check_model_name(name: &str) -> Result<()> {
    let bad = |why: &str| invalid(format!("Triton model name {name:?} {why}"));
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
/// backend exchanges (`None`: bfloat16, complex, float8, 4-bit and undefined types,
/// which the backend refuses).
pub fn triton_data_type(onnx_elem_type: i32) -> Option<&'static str> {
    Some(match onnx_elem_type {
        1 => "TYPE_FP32",
        2 => "TYPE_UINT8",
        3 => "TYPE_INT8",
        4 => "TYPE_UINT16",
        5 => "TYPE_INT16",
        6 => "TYPE_INT32",
        7 => "TYPE_INT64",
        8 => "TYPE_STRING",
        9 => "TYPE_BOOL",
        10 => "TYPE_FP16",
        11 => "TYPE_FP64",
        12 => "TYPE_UINT32",
        13 => "TYPE_UINT64",
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
}

/// An implicit state of a with-past model: Triton feeds `input` from the `output` of the
/// previous request of the same sequence, starting from one zero slot (see
/// [`adapt_with_past`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImplicitState {
    /// The `past_*` input (name, type, dims as in [`TritonTensor`]).
    pub input: TritonTensor,
    /// The matching `present_*` output.
    pub output_name: String,
    /// The axis of the full ONNX shape (batch included) along which the state grows.
    pub sequence_axis: usize,
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

fn triton_tensor(t: &DeclaredTensor, batched: bool, role: &str) -> Result<TritonTensor> {
    let data_type = triton_data_type(t.elem_type).ok_or_else(|| {
        invalid(format!(
            "{role} {} has ONNX element type {} ({}), which Triton's ONNX Runtime backend cannot carry",
            t.name,
            t.elem_type,
            elem_type_name(t.elem_type)
        ))
    })?;
    let mut shape = t.shape.as_slice();
    if batched {
        match shape.first() {
            Some(Dim::Symbol(_)) => shape = &shape[1..],
            Some(Dim::Fixed(n)) => {
                return Err(invalid(format!(
                    "{role} {} has a fixed first dimension {n}; Triton batching needs a variable batch dimension there (use --triton-max-batch-size 0)",
                    t.name
                )))
            }
            None => {
                return Err(invalid(format!(
                    "{role} {} is a scalar or has no declared shape; Triton batching needs a batch dimension (use --triton-max-batch-size 0)",
                    t.name
                )))
            }
        }
    }
    let dims = shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => i64::try_from(*n).unwrap_or(i64::MAX),
            Dim::Symbol(_) => -1,
        })
        .collect();
    Ok(TritonTensor {
        name: t.name.clone(),
        data_type,
        dims,
    })
}

fn elem_type_name(code: i32) -> &'static str {
    match code {
        0 => "undefined",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17..=20 | 24 => "float8",
        21 | 22 | 25 => "4-bit integer",
        23 => "float4",
        _ => "unknown",
    }
}

/// Derives the configuration of a decoded model: each graph input and output with
/// Triton's type and dims, and for a with-past model the implicit states pairing each
/// `past_*` input with its `present_*` output.
pub fn plan(model: &onnx::ModelProto, options: &TritonOptions) -> Result<TritonConfig> {
    options.check()?;
    let declared_in = declared_inputs(model);
    let declared_out = declared_outputs(model);
    for t in declared_in.iter().chain(&declared_out) {
        if t.name.is_empty() || t.name.chars().any(|c| c.is_control()) {
            return Err(invalid(format!(
                "tensor name {:?} cannot be written in config.pbtxt",
                t.name
            )));
        }
    }
    let outputs_by_name: BTreeMap<&str, &DeclaredTensor> =
        declared_out.iter().map(|t| (t.name.as_str(), t)).collect();
    let with_past = declared_in.iter().any(|t| t.name.starts_with(PAST_PREFIX));
    let max_batch_size = match (options.max_batch_size, with_past) {
        (None, false) => DEFAULT_MAX_BATCH_SIZE,
        (None, true) | (Some(WITH_PAST_MAX_BATCH_SIZE), true) => WITH_PAST_MAX_BATCH_SIZE,
        (Some(n), true) => {
            return Err(invalid(format!(
                "a with-past model is served with max_batch_size {WITH_PAST_MAX_BATCH_SIZE}, not {n}: Triton's ONNX Runtime backend cannot batch sequences whose states differ in length (see README, Serving with Triton)"
            )))
        }
        (Some(n), false) => n,
    };
    let batched = max_batch_size > 0;
    let mut inputs = Vec::new();
    let mut states = Vec::new();
    let mut state_outputs = Vec::new();
    for t in &declared_in {
        let Some(suffix) = t.name.strip_prefix(PAST_PREFIX) else {
            inputs.push(triton_tensor(t, batched, "input")?);
            continue;
        };
        let present = format!("{PRESENT_PREFIX}{suffix}");
        let Some(out) = outputs_by_name.get(present.as_str()) else {
            return Err(invalid(format!(
                "input {} looks like a with-past state but the model has no output {present} to carry it to the next request",
                t.name
            )));
        };
        let input = triton_tensor(t, batched, "state input")?;
        let output = triton_tensor(out, batched, "state output")?;
        if input.data_type != output.data_type || input.dims.len() != output.dims.len() {
            return Err(invalid(format!(
                "state input {} ({} {:?}) and output {present} ({} {:?}) differ in type or rank",
                t.name, input.data_type, input.dims, output.data_type, output.dims
            )));
        }
        let variable: Vec<usize> = (0..input.dims.len())
            .filter(|&i| input.dims[i] == -1)
            .collect();
        if variable.len() != 1 || output.dims[variable[0]] != -1 {
            return Err(invalid(format!(
                "state input {} needs exactly one variable dimension besides the batch (the past positions), shared with {present}; it has dims {:?}",
                t.name, input.dims
            )));
        }
        state_outputs.push(present.clone());
        states.push(ImplicitState {
            input,
            output_name: present,
            sequence_axis: variable[0] + 1,
        });
    }
    if inputs.is_empty() {
        return Err(invalid("the model has no input besides its states"));
    }
    let outputs = declared_out
        .iter()
        .filter(|t| !state_outputs.contains(&t.name))
        .map(|t| triton_tensor(t, batched, "output"))
        .collect::<Result<Vec<_>>>()?;
    if outputs.is_empty() {
        return Err(invalid("the model has no output besides its states"));
    }
    Ok(TritonConfig {
        options: options.clone(),
        max_batch_size,
        inputs,
        outputs,
        states,
    })
}

/// A string literal of the protobuf text format.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn dims_text(dims: &[i64]) -> String {
    let list: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[ {} ]", list.join(", "))
}

fn tensor_list(out: &mut String, field: &str, tensors: &[TritonTensor]) {
    let _ = writeln!(out, "{field} [");
    for (i, t) in tensors.iter().enumerate() {
        let _ = writeln!(out, "  {{");
        let _ = writeln!(out, "    name: {}", quoted(&t.name));
        let _ = writeln!(out, "    data_type: {}", t.data_type);
        let _ = writeln!(out, "    dims: {}", dims_text(&t.dims));
        let comma = if i + 1 < tensors.len() { "," } else { "" };
        let _ = writeln!(out, "  }}{comma}");
    }
    let _ = writeln!(out, "]");
}

impl TritonConfig {
    /// The configuration as `config.pbtxt` text (protobuf text format of Triton's
    /// `ModelConfig`).
    pub fn to_pbtxt(&self) -> String {
        let o = &self.options;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Written by gmlp-onnx for Triton's ONNX Runtime backend."
        );
        let _ = writeln!(out, "name: {}", quoted(&o.name));
        let _ = writeln!(out, "platform: \"onnxruntime_onnx\"");
        let _ = writeln!(out, "max_batch_size: {}", self.max_batch_size);
        tensor_list(&mut out, "input", &self.inputs);
        tensor_list(&mut out, "output", &self.outputs);
        if self.states.is_empty() {
            if self.max_batch_size > 0 {
                let _ = writeln!(out, "dynamic_batching {{");
                let _ = writeln!(
                    out,
                    "  max_queue_delay_microseconds: {}",
                    o.max_queue_delay_us
                );
                let _ = writeln!(out, "}}");
            }
        } else {
            let _ = writeln!(out, "sequence_batching {{");
            let _ = writeln!(out, "  max_sequence_idle_microseconds: {SEQUENCE_IDLE_US}");
            let _ = writeln!(out, "  oldest {{");
            let _ = writeln!(
                out,
                "    max_candidate_sequences: {MAX_CANDIDATE_SEQUENCES}"
            );
            let _ = writeln!(out, "    max_queue_delay_microseconds: 0");
            let _ = writeln!(out, "  }}");
            let _ = writeln!(out, "  state [");
            for (i, s) in self.states.iter().enumerate() {
                // The one zero slot the adapter slices off (see adapt_with_past).
                let initial: Vec<i64> = s
                    .input
                    .dims
                    .iter()
                    .map(|&d| if d == -1 { 1 } else { d })
                    .collect();
                let _ = writeln!(out, "    {{");
                let _ = writeln!(out, "      input_name: {}", quoted(&s.input.name));
                let _ = writeln!(out, "      output_name: {}", quoted(&s.output_name));
                let _ = writeln!(out, "      data_type: {}", s.input.data_type);
                let _ = writeln!(out, "      dims: {}", dims_text(&s.input.dims));
                let _ = writeln!(out, "      initial_state: {{");
                let _ = writeln!(out, "        name: \"slot\"");
                let _ = writeln!(out, "        data_type: {}", s.input.data_type);
                let _ = writeln!(out, "        dims: {}", dims_text(&initial));
                let _ = writeln!(out, "        zero_data: true");
                let _ = writeln!(out, "      }}");
                let comma = if i + 1 < self.states.len() { "," } else { "" };
                let _ = writeln!(out, "    }}{comma}");
            }
            let _ = writeln!(out, "  ]");
            let _ = writeln!(out, "}}");
        }
        let kind = match o.kind {
            InstanceKind::Cpu => "KIND_CPU",
            InstanceKind::Gpu => "KIND_GPU",
        };
        let _ = writeln!(out, "instance_group [");
        let _ = writeln!(out, "  {{");
        let _ = writeln!(out, "    count: {}", o.instance_count);
        let _ = writeln!(out, "    kind: {kind}");
        let _ = writeln!(out, "  }}");
        let _ = writeln!(out, "]");
        if let Some(precision) = o.tensorrt {
            let mode = match precision {
                TensorRtPrecision::Fp16 => "FP16",
                TensorRtPrecision::Fp32 => "FP32",
            };
            let _ = writeln!(out, "optimization {{");
            let _ = writeln!(out, "  execution_accelerators {{");
            let _ = writeln!(out, "    gpu_execution_accelerator [");
            let _ = writeln!(out, "      {{");
            let _ = writeln!(out, "        name: \"tensorrt\"");
            let _ = writeln!(
                out,
                "        parameters {{ key: \"precision_mode\" value: \"{mode}\" }}"
            );
            let _ = writeln!(out, "      }}");
            let _ = writeln!(out, "    ]");
            let _ = writeln!(out, "  }}");
            let _ = writeln!(out, "}}");
        }
        out
    }
}

/// Name of the metadata property that marks a model adapted by [`adapt_with_past`].
pub const ADAPTER_METADATA_KEY: &str = "gmlp_onnx.triton_state_slot";

fn int64_initializer(name: &str, value: i64) -> onnx::TensorProto {
    onnx::TensorProto {
        name: Some(name.to_string()),
        data_type: Some(7),
        dims: vec![1],
        int64_data: vec![value],
        ..Default::default()
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> onnx::NodeProto {
    onnx::NodeProto {
        op_type: Some(op.to_string()),
        name: Some(name.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn set_dim_param(v: &mut onnx::ValueInfoProto, axis: usize, param: &str) {
    use onnx::tensor_shape_proto::dimension::Value as DimValue;
    if let Some(onnx::type_proto::Value::TensorType(t)) =
        v.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        if let Some(d) = t.shape.as_mut().and_then(|s| s.dim.get_mut(axis)) {
            d.value = Some(DimValue::DimParam(param.to_string()));
        }
    }
}

/// Puts a with-past model behind the state adapter Triton r24.10 needs (see the module
/// doc): each state input `past_X` now carries one leading slot along its sequence axis,
/// which a `Slice` removes before the original graph sees `past_X`; the original
/// `present_X` gets the same slot back in front by a `Concat`. Starting from Triton's
/// one-slot zero `initial_state`, the model therefore sees an empty past on the first
/// request and exactly its own `present_X` afterwards.
pub fn adapt_with_past(model: &mut onnx::ModelProto, states: &[ImplicitState]) -> Result<()> {
    let graph = model
        .graph
        .as_mut()
        .ok_or_else(|| invalid("the model has no graph"))?;
    let taken: std::collections::HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.input.iter().chain(&n.output).cloned())
        .chain(graph.initializer.iter().map(|t| t.name().to_string()))
        .chain(graph.input.iter().map(|v| v.name().to_string()))
        .collect();
    let fresh = |base: String| -> Result<String> {
        if taken.contains(&base) {
            Err(invalid(format!(
                "the model already uses the name {base}, which the Triton state adapter needs"
            )))
        } else {
            Ok(base)
        }
    };
    if graph.node.iter().any(|n| {
        n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
    }) {
        return Err(invalid(
            "the Triton state adapter does not handle models with subgraphs (If, Loop, Scan)",
        ));
    }
    let mut front = Vec::new();
    let mut back = Vec::new();
    let mut constants = std::collections::BTreeMap::new();
    for s in states {
        let past = s.input.name.as_str();
        let present = s.output_name.as_str();
        let axis = i64::try_from(s.sequence_axis).unwrap_or(i64::MAX);
        let inner_past = fresh(format!("{past}/triton_without_slot"))?;
        let slot = fresh(format!("{past}/triton_slot"))?;
        let inner_present = fresh(format!("{present}/triton_without_slot"))?;
        let produced = graph
            .node
            .iter()
            .any(|n| n.output.iter().any(|o| o == present));
        if !produced {
            return Err(invalid(format!(
                "output {present} is not computed by a node, so the Triton state adapter cannot wrap it"
            )));
        }
        for n in &mut graph.node {
            for i in &mut n.input {
                if i == past {
                    *i = inner_past.clone();
                } else if i == present {
                    *i = inner_present.clone();
                }
            }
            for o in &mut n.output {
                if o == present {
                    *o = inner_present.clone();
                }
            }
        }
        for v in &mut graph.value_info {
            if v.name() == present {
                v.name = Some(inner_present.clone());
            }
        }
        let zero = "triton_state/zero".to_string();
        let one = "triton_state/one".to_string();
        let end = "triton_state/end".to_string();
        let axis_name = format!("triton_state/axis{axis}");
        constants.insert(zero.clone(), 0);
        constants.insert(one.clone(), 1);
        constants.insert(end.clone(), i64::MAX);
        constants.insert(axis_name.clone(), axis);
        front.push(node(
            "Slice",
            &format!("{past}/triton_drop_slot"),
            &[past, &one, &end, &axis_name],
            &[&inner_past],
        ));
        front.push(node(
            "Slice",
            &format!("{past}/triton_keep_slot"),
            &[past, &zero, &one, &axis_name],
            &[&slot],
        ));
        let mut concat = node(
            "Concat",
            &format!("{present}/triton_put_slot_back"),
            &[&slot, &inner_present],
            &[present],
        );
        concat.attribute.push(onnx::AttributeProto {
            name: Some("axis".into()),
            r#type: Some(onnx::attribute_proto::AttributeType::Int as i32),
            i: Some(axis),
            ..Default::default()
        });
        back.push(concat);
        for v in &mut graph.input {
            if v.name() == past {
                set_dim_param(v, s.sequence_axis, "triton_state_sequence");
            }
        }
        for v in &mut graph.output {
            if v.name() == present {
                set_dim_param(v, s.sequence_axis, "triton_state_total_sequence");
            }
        }
    }
    for (name, value) in constants {
        fresh(name.clone())?;
        graph.initializer.push(int64_initializer(&name, value));
    }
    let original = std::mem::take(&mut graph.node);
    graph.node = front.into_iter().chain(original).chain(back).collect();
    model.metadata_props.push(onnx::StringStringEntryProto {
        key: Some(ADAPTER_METADATA_KEY.into()),
        value: Some(
            "past_* inputs and present_* outputs carry one leading zero slot for Triton's implicit state"
                .into(),
        ),
    });
    Ok(())
}

/// The paths of a repository entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryPaths {
    /// `REPO/NAME`.
    pub model_dir: PathBuf,
    /// `REPO/NAME/config.pbtxt`.
    pub config: PathBuf,
    /// `REPO/NAME/VERSION`.
    pub version_dir: PathBuf,
    /// `REPO/NAME/VERSION/model.onnx`.
    pub model: PathBuf,
}

impl RepositoryPaths {
    /// The layout for `options` under `repo`.
    pub fn new(repo: &Path, options: &TritonOptions) -> Self {
        let model_dir = repo.join(&options.name);
        let version_dir = model_dir.join(options.version.to_string());
        RepositoryPaths {
            config: model_dir.join("config.pbtxt"),
            model: version_dir.join(MODEL_FILE),
            model_dir,
            version_dir,
        }
    }
}

/// Checks, before anything is written, that the entry can be created: valid options, the
/// repository is a directory (or can be created), the version directory is absent or
/// empty. Cheap; run it before a long build.
pub fn check_target(repo: &Path, options: &TritonOptions) -> Result<RepositoryPaths> {
    options.check()?;
    if repo.exists() && !repo.is_dir() {
        return Err(invalid(format!(
            "model repository {} is not a directory",
            repo.display()
        )));
    }
    let paths = RepositoryPaths::new(repo, options);
    for dir in [&paths.model_dir, &paths.version_dir] {
        if dir.exists() && !dir.is_dir() {
            return Err(invalid(format!("{} is not a directory", dir.display())));
        }
    }
    if paths.version_dir.is_dir() {
        let mut entries =
            std::fs::read_dir(&paths.version_dir).map_err(|e| Error::io(&paths.version_dir, e))?;
        if entries.next().is_some() {
            return Err(invalid(format!(
                "{} already exists and is not empty; pick another --triton-version or remove it",
                paths.version_dir.display()
            )));
        }
    }
    Ok(paths)
}

/// What [`write_repository`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryWritten {
    /// The paths of the entry.
    pub paths: RepositoryPaths,
    /// The external data file, when the model has one.
    pub data_file: Option<PathBuf>,
    /// The configuration written.
    pub config: TritonConfig,
}

/// Directories created for an entry, removed again (when still empty) unless committed.
struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    fn create(&mut self, dir: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut d = Some(dir);
        while let Some(p) = d {
            if p.as_os_str().is_empty() || p.is_dir() {
                break;
            }
            missing.push(p.to_path_buf());
            d = p.parent();
        }
        for p in missing.into_iter().rev() {
            std::fs::create_dir(&p).map_err(|e| Error::io(&p, e))?;
            self.0.push(p);
        }
        Ok(())
    }

    fn commit(mut self) {
        self.0.clear();
    }
}

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

fn copy_into(pending: &mut PendingFile, source: &Path) -> Result<()> {
    let mut file = File::open(source).map_err(|e| Error::io(source, e))?;
    std::io::copy(&mut file, pending.writer()).map_err(|e| Error::io(source, e))?;
    Ok(())
}

/// Writes `REPO/NAME/config.pbtxt` and `REPO/NAME/VERSION/model.onnx` for the ONNX file
/// `model_path`. External data is copied too: one data file becomes `model.onnx.data`
/// (the locations inside the model are rewritten to match), several keep their names.
/// All files are written under temporary names and renamed into place together at the
/// end; on any error nothing is left behind (directories created here are removed).
/// An existing `config.pbtxt` (another version of the same model) is only replaced
/// by identical text; a different one is refused.
pub fn write_repository(
    model_path: &Path,
    repo: &Path,
    options: &TritonOptions,
) -> Result<RepositoryWritten> {
    let paths = check_target(repo, options)?;
    let mut model = read_model(model_path)?;
    check_external_data(&model, model_path)?;
    let config = plan(&model, options)?;
    let text = config.to_pbtxt();
    let existing_config = match std::fs::read_to_string(&paths.config) {
        Ok(old) => Some(old),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&paths.config, e)),
    };
    if existing_config.as_ref().is_some_and(|old| *old != text) {
        return Err(invalid(format!(
            "{} exists and describes the model differently; remove it or pick another --triton-name",
            paths.config.display()
        )));
    }

    // External data files, in order of first use.
    let mut locations: Vec<String> = Vec::new();
    if let Some(graph) = &model.graph {
        for t in &graph.initializer {
            if t.data_location == Some(onnx::tensor_proto::DataLocation::External as i32) {
                let r = external_reference(t).map_err(|reason| Error::BadModel {
                    path: model_path.to_path_buf(),
                    reason,
                })?;
                if !locations.contains(&r.location) {
                    locations.push(r.location);
                }
            }
        }
    }
    let source_dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let renamed = locations.len() == 1 && locations[0] != DATA_FILE;
    let reencode = renamed || !config.states.is_empty();
    if !config.states.is_empty() {
        if crate::onnx::reader::metadata_value(&model, ADAPTER_METADATA_KEY).is_some() {
            return Err(invalid(format!(
                "{} already carries the Triton state adapter; give the original with-past model",
                model_path.display()
            )));
        }
        adapt_with_past(&mut model, &config.states)?;
    }
    if renamed {
        if let Some(graph) = &mut model.graph {
            for t in &mut graph.initializer {
                for entry in &mut t.external_data {
                    if entry.key() == "location" {
                        entry.value = Some(DATA_FILE.to_string());
                    }
                }
            }
        }
    }

    let mut dirs = CreatedDirs(Vec::new());
    dirs.create(&paths.version_dir)?;
    let mut pending = Vec::new();
    let mut data_file = None;
    for location in &locations {
        let target_name = if renamed {
            DATA_FILE
        } else {
            location.as_str()
        };
        let target = paths.version_dir.join(target_name);
        let mut file = PendingFile::create(&target)?;
        copy_into(&mut file, &source_dir.join(location))?;
        pending.push(file);
        data_file.get_or_insert(target);
    }
    let mut model_file = PendingFile::create(&paths.model)?;
    if reencode {
        let bytes = model.encode_to_vec();
        model_file
            .writer()
            .write_all(&bytes)
            .map_err(|e| Error::io(&paths.model, e))?;
    } else {
        copy_into(&mut model_file, model_path)?;
    }
    pending.push(model_file);
    if existing_config.is_none() {
        let mut config_file = PendingFile::create(&paths.config)?;
        config_file
            .writer()
            .write_all(text.as_bytes())
            .map_err(|e| Error::io(&paths.config, e))?;
        pending.push(config_file);
    }
    // Data, model, then config: Triton polling the repository sees a complete version.
    PendingFile::persist_all(pending)?;
    dirs.commit();
    Ok(RepositoryWritten {
        paths,
        data_file,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, elem_type: i32, shape: &[&str]) -> DeclaredTensor {
        DeclaredTensor {
            name: name.into(),
            elem_type,
            shape: shape
                .iter()
                .map(|d| match d.parse::<usize>() {
                    Ok(n) => Dim::Fixed(n),
                    Err(_) => Dim::Symbol(d.to_string()),
                })
                .collect(),
        }
    }

    fn value_info(t: &DeclaredTensor) -> onnx::ValueInfoProto {
        use onnx::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
        onnx::ValueInfoProto {
            name: Some(t.name.clone()),
            r#type: Some(onnx::TypeProto {
                value: Some(onnx::type_proto::Value::TensorType(
                    onnx::type_proto::Tensor {
                        elem_type: Some(t.elem_type),
                        shape: Some(onnx::TensorShapeProto {
                            dim: t
                                .shape
                                .iter()
                                .map(|d| Dimension {
                                    value: Some(match d {
                                        Dim::Fixed(n) => DimValue::DimValue(*n as i64),
                                        Dim::Symbol(s) => DimValue::DimParam(s.clone()),
                                    }),
                                    ..Default::default()
                                })
                                .collect(),
                        }),
                    },
                )),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn model(inputs: &[DeclaredTensor], outputs: &[DeclaredTensor]) -> onnx::ModelProto {
        onnx::ModelProto {
            graph: Some(onnx::GraphProto {
                input: inputs.iter().map(value_info).collect(),
                output: outputs.iter().map(value_info).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn token_model() -> onnx::ModelProto {
        model(
            &[tensor("input_ids", 7, &["batch", "12"])],
            &[tensor("logits", 1, &["batch", "12", "50"])],
        )
    }

    #[test]
    fn a_token_model_gets_a_batched_config_without_the_batch_dimension() {
        let config = plan(&token_model(), &TritonOptions::new("tiny")).unwrap();
        let expected = r#"# Written by gmlp-onnx for Triton's ONNX Runtime backend.
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ 12 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 12, 50 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 100
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"#;
        assert_eq!(config.to_pbtxt(), expected);
    }

    #[test]
    fn without_batching_the_batch_dimension_stays_and_no_dynamic_batcher_is_written() {
        let mut options = TritonOptions::new("tiny");
        options.max_batch_size = Some(0);
        let text = plan(&token_model(), &options).unwrap().to_pbtxt();
        assert!(text.contains("dims: [ -1, 12 ]"), "{text}");
        assert!(text.contains("dims: [ -1, 12, 50 ]"), "{text}");
        assert!(!text.contains("dynamic_batching"), "{text}");
    }

    #[test]
    fn gpu_instances_with_tensorrt_fp16() {
        let mut options = TritonOptions::new("tiny");
        options.kind = InstanceKind::Gpu;
        options.instance_count = 2;
        options.tensorrt = Some(TensorRtPrecision::Fp16);
        let text = plan(&token_model(), &options).unwrap().to_pbtxt();
        assert!(text.contains("count: 2\n    kind: KIND_GPU"), "{text}");
        assert!(text.contains("name: \"tensorrt\""), "{text}");
        assert!(
            text.contains("key: \"precision_mode\" value: \"FP16\""),
            "{text}"
        );
        options.kind = InstanceKind::Cpu;
        assert!(plan(&token_model(), &options)
            .unwrap_err()
            .to_string()
            .contains("--triton-kind gpu"));
    }

    #[test]
    fn variable_dimensions_become_minus_one() {
        let m = model(
            &[tensor("x", 1, &["batch", "sequence", "16"])],
            &[tensor("y", 1, &["batch", "sequence", "?"])],
        );
        let config = plan(&m, &TritonOptions::new("m")).unwrap();
        assert_eq!(config.inputs[0].dims, vec![-1, 16]);
        assert_eq!(config.outputs[0].dims, vec![-1, -1]);
    }

    #[test]
    fn with_past_models_get_implicit_states_starting_empty() {
        let m = model(
            &[
                tensor("input_ids", 7, &["batch", "sequence"]),
                tensor("past_sgu.0", 1, &["batch", "past_sequence", "16"]),
                tensor("past_key.0", 1, &["batch", "past_sequence", "8"]),
            ],
            &[
                tensor("logits", 1, &["batch", "sequence", "50"]),
                tensor("present_sgu.0", 1, &["batch", "total_sequence", "16"]),
                tensor("present_key.0", 1, &["batch", "total_sequence", "8"]),
            ],
        );
        let config = plan(&m, &TritonOptions::new("lm")).unwrap();
        assert_eq!(config.inputs.len(), 1);
        assert_eq!(config.outputs.len(), 1);
        assert_eq!(config.states.len(), 2);
        assert_eq!(config.states[0].input.dims, vec![-1, 16]);
        assert_eq!(config.states[1].output_name, "present_key.0");
        let text = config.to_pbtxt();
        assert!(text.contains("sequence_batching {"), "{text}");
        assert!(!text.contains("dynamic_batching"), "{text}");
        assert!(
            text.contains(
                "input_name: \"past_sgu.0\"\n      output_name: \"present_sgu.0\"\n      data_type: TYPE_FP32\n      dims: [ -1, 16 ]"
            ),
            "{text}"
        );
        assert!(
            text.contains("dims: [ 1, 16 ]\n        zero_data: true"),
            "{text}"
        );
        assert!(text.contains("max_batch_size: 1\n"), "{text}");
        assert!(text.contains("oldest {"), "{text}");
        let mut options = TritonOptions::new("lm");
        options.max_batch_size = Some(8);
        let e = plan(&m, &options).unwrap_err().to_string();
        assert!(e.contains("max_batch_size 1, not 8"), "{e}");
    }

    #[test]
    fn the_state_adapter_slices_the_slot_off_and_puts_it_back() {
        let mut m = model(
            &[
                tensor("input_ids", 7, &["batch", "sequence"]),
                tensor("past_sgu.0", 1, &["batch", "past_sequence", "4"]),
            ],
            &[
                tensor("logits", 1, &["batch", "sequence", "11"]),
                tensor("present_sgu.0", 1, &["batch", "total_sequence", "4"]),
            ],
        );
        let graph = m.graph.as_mut().unwrap();
        graph.node.push(node(
            "Concat",
            "cat",
            &["past_sgu.0", "x"],
            &["present_sgu.0"],
        ));
        graph
            .node
            .push(node("ReduceSum", "use", &["present_sgu.0"], &["logits"]));
        let config = plan(&m, &TritonOptions::new("lm")).unwrap();
        adapt_with_past(&mut m, &config.states).unwrap();
        let g = m.graph.as_ref().unwrap();
        let ops: Vec<(&str, Vec<&str>, Vec<&str>)> = g
            .node
            .iter()
            .map(|n| {
                (
                    n.op_type(),
                    n.input.iter().map(String::as_str).collect(),
                    n.output.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        let axis = "triton_state/axis1";
        assert_eq!(
            ops,
            vec![
                (
                    "Slice",
                    vec!["past_sgu.0", "triton_state/one", "triton_state/end", axis],
                    vec!["past_sgu.0/triton_without_slot"]
                ),
                (
                    "Slice",
                    vec!["past_sgu.0", "triton_state/zero", "triton_state/one", axis],
                    vec!["past_sgu.0/triton_slot"]
                ),
                (
                    "Concat",
                    vec!["past_sgu.0/triton_without_slot", "x"],
                    vec!["present_sgu.0/triton_without_slot"]
                ),
                (
                    "ReduceSum",
                    vec!["present_sgu.0/triton_without_slot"],
                    vec!["logits"]
                ),
                (
                    "Concat",
                    vec![
                        "past_sgu.0/triton_slot",
                        "present_sgu.0/triton_without_slot"
                    ],
                    vec!["present_sgu.0"]
                ),
            ]
        );
        let constants: Vec<(&str, i64)> = g
            .initializer
            .iter()
            .map(|t| (t.name(), t.int64_data[0]))
            .collect();
        assert!(constants.contains(&("triton_state/axis1", 1)));
        assert!(constants.contains(&("triton_state/end", i64::MAX)));
        assert_eq!(g.node[4].attribute[0].i, Some(1));
        // The graph's interface keeps its names; the state dimension gets a new symbol.
        let inputs = declared_inputs(&m);
        assert_eq!(
            inputs[1].shape[1],
            Dim::Symbol("triton_state_sequence".into())
        );
        assert!(crate::onnx::reader::metadata_value(&m, ADAPTER_METADATA_KEY).is_some());
    }

    #[test]
    fn a_past_input_without_its_present_output_is_refused() {
        let m = model(
            &[
                tensor("input_ids", 7, &["batch", "sequence"]),
                tensor("past_sgu.0", 1, &["batch", "past_sequence", "16"]),
            ],
            &[tensor("logits", 1, &["batch", "sequence", "50"])],
        );
        let e = plan(&m, &TritonOptions::new("lm")).unwrap_err().to_string();
        assert!(e.contains("no output present_sgu.0"), "{e}");
    }

    #[test]
    fn types_triton_cannot_carry_are_refused() {
        for code in [0, 14, 16, 17] {
            let m = model(
                &[tensor("x", code, &["batch", "4"])],
                &[tensor("y", 1, &["batch", "4"])],
            );
            let e = plan(&m, &TritonOptions::new("m")).unwrap_err().to_string();
            assert!(e.contains("cannot carry"), "{e}");
            assert!(!e.contains('\n'));
        }
        assert_eq!(triton_data_type(10), Some("TYPE_FP16"));
        assert_eq!(triton_data_type(9), Some("TYPE_BOOL"));
    }

    #[test]
    fn a_fixed_batch_dimension_needs_batching_off() {
        let m = model(
            &[tensor("x", 1, &["1", "4"])],
            &[tensor("y", 1, &["1", "4"])],
        );
        let e = plan(&m, &TritonOptions::new("m")).unwrap_err().to_string();
        assert!(e.contains("--triton-max-batch-size 0"), "{e}");
        let mut options = TritonOptions::new("m");
        options.max_batch_size = Some(0);
        assert_eq!(plan(&m, &options).unwrap().inputs[0].dims, vec![1, 4]);
    }

    #[test]
    fn model_names() {
        for ok in ["gmlp", "gmlp-ti16", "a.b_c-1", "_x"] {
            check_model_name(ok).unwrap();
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            "ü",
            "a?b",
            "..",
            &"x".repeat(129),
        ] {
            assert!(check_model_name(bad).is_err(), "{bad:?} accepted");
        }
        let mut options = TritonOptions::new("m");
        options.version = 0;
        assert!(options.check().is_err());
    }

    #[test]
    fn names_are_quoted_for_the_text_format() {
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
