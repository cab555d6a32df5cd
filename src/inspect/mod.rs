//! `inspect`: what an ONNX file declares and holds, without running it: IR version and
//! opsets, inputs and outputs, parameter count and bytes, operator histogram, external
//! data files, and our own metadata (configuration, FLOPs) when present; for files
//! `gmlp-onnx build` wrote, each block's spatial weight W and its Toeplitz-ness
//! ([`spatial_weights`](mod@spatial_weights)), and on request pictures of them ([`pictures`]). It sits above
//! [`crate::gmlp`] because it reads the keys [`crate::gmlp::metadata`] defines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub mod params;
pub mod pictures;
mod render;
pub mod spatial_weights;

pub use pictures::inspect_and_plot;

use crate::error::{Error, Remedy, Result};
use crate::gmlp::interface::DecodingInfo;
use crate::gmlp::metadata::{
    parse_config, CONFIG_KEY, DECODING_KEY, FLOPS_KEY, QUANTIZATION_KEY, TARGET_KEY,
};
use crate::gmlp::weights::param_specs;
use crate::onnx::dtype::{self, type_name};
use crate::onnx::graph::Dim;
use crate::onnx::proto::tensor_proto::DataType;
use crate::onnx::proto::{tensor_proto::DataLocation, GraphProto, ModelProto, TensorProto};
use crate::onnx::reader::{
    declared_inputs, declared_outputs, element_count, external_reference, metadata_value,
    read_model, DeclaredTensor,
};
use crate::plot::PlotFile;
pub use render::human_flops;
use spatial_weights::{spatial_weights, SpatialSummary, SpatialWeights};

/// A graph input or output.
#[derive(Clone, Debug, Serialize)]
pub struct TensorInfo {
    /// Value name.
    pub name: String,
    /// Element type (NumPy name, or `ONNX type N`).
    pub dtype: String,
    /// Dimensions: sizes as numbers, symbolic dimensions as their names (`?` if unnamed).
    pub shape: Vec<serde_json::Value>,
}

/// An operator set the model imports.
#[derive(Clone, Debug, Serialize)]
pub struct Opset {
    /// Domain (`""` is the default ONNX domain).
    pub domain: String,
    /// Version.
    pub version: i64,
}

/// An external data file referenced by initializers.
#[derive(Clone, Debug, Serialize)]
pub struct ExternalFile {
    /// The `location` entry, relative to the model's directory.
    pub location: String,
    /// Initializers stored in it.
    pub tensors: usize,
    /// Whether the file exists beside the model.
    pub exists: bool,
}

/// Everything `inspect` reports.
#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    /// The model file.
    pub model: PathBuf,
    /// `ir_version`.
    pub ir_version: i64,
    /// Imported operator sets.
    pub opsets: Vec<Opset>,
    /// `producer_name` and `producer_version`, joined by a space.
    pub producer: String,
    /// Graph inputs that are not initializers.
    pub inputs: Vec<TensorInfo>,
    /// Graph outputs.
    pub outputs: Vec<TensorInfo>,
    /// Number of initializers of the main graph.
    pub initializers: usize,
    /// Model parameters, each counted once in its logical shape: float initializers, and
    /// integer weights as the parameters they quantize (an int8 file has its f32 file's
    /// count; see [`params`]).
    pub parameters: u64,
    /// Bytes of the initializers that hold parameters (float and integer weights).
    pub parameter_bytes: u64,
    /// Elements of integer weights (parameters stored quantized), as stored.
    pub quantized_values: u64,
    /// Elements of integer copies of parameters also stored as float (a tied int8 head).
    pub quantized_copy_values: u64,
    /// The parameters that have such an integer copy.
    pub quantized_copies_of: Vec<String>,
    /// Elements of the scales and zero points of integer weights.
    pub quantization_scale_values: u64,
    /// Elements of all initializers (parameters, copies, scales, index tables).
    pub stored_values: u64,
    /// Bytes of all initializers (any type).
    pub initializer_bytes: u64,
    /// Nodes per operator (`domain::Op` outside the default domain), subgraphs included.
    pub ops: BTreeMap<String, usize>,
    /// Total number of nodes, subgraphs included.
    pub nodes: usize,
    /// FLOPs per example recorded by `build` (metadata `gmlp_onnx.flops_per_example`).
    pub flops_per_example: Option<u64>,
    /// The configuration recorded by `build` (metadata `gmlp_onnx.config`).
    pub config: Option<serde_json::Value>,
    /// The `--target` profile recorded by `build` (metadata `gmlp_onnx.target`).
    pub target: Option<String>,
    /// Variable-length and with-past models: the sequence mode, n, the state tensors and
    /// the state bytes per token per block (metadata `gmlp_onnx.decoding`).
    pub decoding: Option<DecodingInfo>,
    /// How the weights are quantized (`--dtype int4`; metadata `gmlp_onnx.quantization`).
    pub quantization: Option<serde_json::Value>,
    /// All metadata properties.
    pub metadata: BTreeMap<String, String>,
    /// External data files referenced by initializers (empty when all data is inline).
    pub external_data: Vec<ExternalFile>,
    /// Each block's spatial weight W: stored form, the cells it reads, its Toeplitz-ness
    /// (files `gmlp-onnx build` wrote; see [`spatial_weights`](mod@spatial_weights)).
    pub spatial: Vec<SpatialSummary>,
    /// Why `spatial` is empty, when it is.
    pub spatial_unavailable: Option<String>,
    /// The pictures `inspect --plot` wrote (absent from the JSON when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plots: Vec<PlotFile>,
}

fn elements(t: &TensorProto) -> u64 {
    element_count(t).unwrap_or(0)
}

fn tensor_info(t: DeclaredTensor) -> TensorInfo {
    TensorInfo {
        name: t.name,
        dtype: type_name(t.elem_type),
        shape: t
            .shape
            .into_iter()
            .map(|d| match d {
                Dim::Fixed(n) => serde_json::Value::from(n),
                Dim::Symbol(s) => serde_json::Value::from(s),
            })
            .collect(),
    }
}

fn count_ops(graph: &GraphProto, ops: &mut BTreeMap<String, usize>, nodes: &mut usize) {
    for node in &graph.node {
        let key = match node.domain() {
            "" | "ai.onnx" => node.op_type().to_string(),
            domain => format!("{domain}::{}", node.op_type()),
        };
        *ops.entry(key).or_insert(0) += 1;
        *nodes += 1;
        for a in &node.attribute {
            for g in a.g.iter().chain(&a.graphs) {
                count_ops(g, ops, nodes);
            }
        }
    }
}

/// Summarizes the model at `path`.
pub fn inspect(path: &Path) -> Result<ModelSummary> {
    let model = read_model(checked_onnx_path(path)?)?;
    Ok(summarize(&model, path))
}

/// Refuses a checkpoint given where an ONNX file is read, with the command that makes one.
pub(crate) fn checked_onnx_path(path: &Path) -> Result<&Path> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if ["safetensors", "pt", "pth", "ckpt", "bin"].contains(&ext.as_str()) {
        return Err(Error::NeedsRebuild {
            reason: format!(
                "{} is a checkpoint; inspect reads ONNX files",
                path.display()
            ),
            remedy: Remedy::BuildFromCheckpoint,
        });
    }
    Ok(path)
}

/// Summarizes a decoded model; `path` locates external data files.
pub fn summarize(model: &ModelProto, path: &Path) -> ModelSummary {
    let empty = GraphProto::default();
    let graph = model.graph.as_ref().unwrap_or(&empty);
    let (stored, initializer_bytes, external) = stored_initializers(graph);
    let logical = logical_sizes(model);
    let counts = params::count(&stored, |p| logical.get(p).copied());
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut ops = BTreeMap::new();
    let mut nodes = 0;
    count_ops(graph, &mut ops, &mut nodes);
    let (spatial, spatial_unavailable) = match spatial_weights(model, path) {
        Ok(w) => (w.iter().map(SpatialWeights::summary).collect(), None),
        Err(Error::ForeignModel(m)) => (Vec::new(), Some(m)),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    ModelSummary {
        model: path.to_path_buf(),
        ir_version: model.ir_version(),
        opsets: opsets(model),
        producer: format!("{} {}", model.producer_name(), model.producer_version())
            .trim()
            .to_string(),
        inputs: declared_inputs(model)
            .into_iter()
            .map(tensor_info)
            .collect(),
        outputs: declared_outputs(model)
            .into_iter()
            .map(tensor_info)
            .collect(),
        initializers: graph.initializer.len(),
        parameters: counts.parameters,
        parameter_bytes: counts.parameter_bytes,
        quantized_values: counts.quantized_values,
        quantized_copy_values: counts.quantized_copy_values,
        quantized_copies_of: counts.quantized_copies_of,
        quantization_scale_values: counts.quantization_scale_values,
        stored_values: counts.stored_values,
        initializer_bytes,
        ops,
        nodes,
        flops_per_example: metadata_value(model, FLOPS_KEY).and_then(|v| v.trim().parse().ok()),
        config: metadata_value(model, CONFIG_KEY).and_then(|v| serde_json::from_str(v).ok()),
        quantization: metadata_value(model, QUANTIZATION_KEY)
            .and_then(|v| serde_json::from_str(v).ok()),
        target: metadata_value(model, TARGET_KEY).map(str::to_string),
        decoding: metadata_value(model, DECODING_KEY).and_then(DecodingInfo::parse),
        metadata: model
            .metadata_props
            .iter()
            .map(|p| (p.key().to_string(), p.value().to_string()))
            .collect(),
        external_data: external_files(external, dir),
        spatial,
        spatial_unavailable,
        plots: Vec::new(),
    }
}

/// The graph's initializers as the parameter counter sees them, their bytes in all, and
/// how many tensors each external data location holds.
fn stored_initializers(
    graph: &GraphProto,
) -> (Vec<params::Stored<'_>>, u64, BTreeMap<String, usize>) {
    let mut initializer_bytes = 0u64;
    let mut external: BTreeMap<String, usize> = BTreeMap::new();
    let mut stored = Vec::with_capacity(graph.initializer.len());
    for t in &graph.initializer {
        let n = elements(t);
        let bytes = n.saturating_mul(dtype::bits(t.data_type())).div_ceil(8);
        initializer_bytes = initializer_bytes.saturating_add(bytes);
        stored.push(params::Stored {
            name: t.name(),
            is_float: dtype::is_float(t.data_type()),
            is_int8: [DataType::Int8, DataType::Uint8]
                .map(|d| d as i32)
                .contains(&t.data_type()),
            elements: n,
            bytes,
        });
        if t.data_location == Some(DataLocation::External as i32) {
            let location =
                external_reference(t).map_or_else(|_| "(no location)".to_string(), |r| r.location);
            *external.entry(location).or_insert(0) += 1;
        }
    }
    (stored, initializer_bytes, external)
}

/// Logical parameter sizes from the recorded configuration, when there is one (empty
/// otherwise).
fn logical_sizes(model: &ModelProto) -> BTreeMap<String, u64> {
    metadata_value(model, CONFIG_KEY)
        .and_then(parse_config)
        .map(|cfg| {
            param_specs(&cfg)
                .into_iter()
                .map(|p| (p.name.clone(), p.len() as u64))
                .collect()
        })
        .unwrap_or_default()
}

/// The model's opset imports.
fn opsets(model: &ModelProto) -> Vec<Opset> {
    model
        .opset_import
        .iter()
        .map(|o| Opset {
            domain: o.domain().to_string(),
            version: o.version(),
        })
        .collect()
}

/// The external data files (`location` → tensor count) and whether each is in `dir`.
fn external_files(external: BTreeMap<String, usize>, dir: &Path) -> Vec<ExternalFile> {
    external
        .into_iter()
        .map(|(location, tensors)| ExternalFile {
            exists: dir.join(&location).is_file(),
            location,
            tensors,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flop_counts_keep_their_digits_at_every_size() {
        assert_eq!(human_flops(0), "0 FLOPs");
        assert_eq!(human_flops(950), "950 FLOPs");
        assert_eq!(human_flops(1_978_368), "1.98 MFLOPs");
        assert_eq!(human_flops(15_030_000_000), "15.03 GFLOPs");
        assert_eq!(human_flops(1_082_300_000_000), "1.08 TFLOPs");
    }
}
