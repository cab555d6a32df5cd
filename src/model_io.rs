//! Writing a [`Graph`] as an ONNX `ModelProto`, and reading ONNX files back.
//!
//! Writing streams: the model and graph headers are encoded with prost, then each
//! initializer is produced, encoded and written one at a time, so peak memory is one
//! tensor, not the model. Protobuf allows fields in any order, so the `graph` field (and
//! inside it the `initializer` fields) come last; lengths are known in advance from the
//! tensor shapes. Files go to a temporary file beside the target and are renamed into
//! place only when complete.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use crate::error::{one_line, Error, Result};
use crate::graph::{Attr, ConstData, Dim, ElemType, Graph, Initializer, TensorData, Value};
use crate::onnx;

/// Protobuf messages cannot exceed 2 GiB; larger models need external data.
pub const PROTOBUF_LIMIT: u64 = (1 << 31) - 1;

/// IR version written: at least 9 (project convention), 10 for opset 21.
pub fn ir_version_for(opset: i64) -> i64 {
    if opset >= 21 {
        10
    } else {
        9
    }
}

/// Model-level fields of the file.
#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    /// `producer_name`.
    pub producer_name: String,
    /// `producer_version`.
    pub producer_version: String,
    /// `doc_string`.
    pub doc_string: String,
    /// `metadata_props`, in order.
    pub metadata: Vec<(String, String)>,
}

fn tensor_shape(shape: &[Dim]) -> onnx::TensorShapeProto {
    use onnx::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
    onnx::TensorShapeProto {
        dim: shape
            .iter()
            .map(|d| Dimension {
                value: Some(match d {
                    Dim::Fixed(n) => DimValue::DimValue(*n as i64),
                    Dim::Symbol(s) => DimValue::DimParam(s.clone()),
                }),
                denotation: None,
            })
            .collect(),
    }
}

fn value_info(v: &Value) -> onnx::ValueInfoProto {
    use onnx::type_proto::{Tensor, Value as TypeValue};
    onnx::ValueInfoProto {
        name: Some(v.name.clone()),
        r#type: Some(onnx::TypeProto {
            value: Some(TypeValue::TensorType(Tensor {
                elem_type: Some(v.elem.onnx_code()),
                shape: Some(tensor_shape(&v.shape)),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn attribute(name: &str, attr: &Attr) -> onnx::AttributeProto {
    use onnx::attribute_proto::AttributeType;
    let mut a = onnx::AttributeProto {
        name: Some(name.to_string()),
        ..Default::default()
    };
    match attr {
        Attr::Int(i) => {
            a.i = Some(*i);
            a.r#type = Some(AttributeType::Int as i32);
        }
        Attr::Float(f) => {
            a.f = Some(*f);
            a.r#type = Some(AttributeType::Float as i32);
        }
        Attr::Ints(v) => {
            a.ints = v.clone();
            a.r#type = Some(AttributeType::Ints as i32);
        }
        Attr::Tensor { dims, data } => {
            let (elem, raw_data): (ElemType, Vec<u8>) = match data {
                ConstData::F32(v) => (
                    ElemType::F32,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                ConstData::I64(v) => (
                    ElemType::I64,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            };
            a.t = Some(onnx::TensorProto {
                dims: dims.iter().map(|&d| d as i64).collect(),
                data_type: Some(elem.onnx_code()),
                raw_data: Some(raw_data),
                ..Default::default()
            });
            a.r#type = Some(AttributeType::Tensor as i32);
        }
    }
    a
}

fn tensor_header(init: &Initializer) -> onnx::TensorProto {
    onnx::TensorProto {
        dims: init.dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(ElemType::F32.onnx_code()),
        name: Some(init.name.clone()),
        ..Default::default()
    }
}

/// Field tags (field number << 3 | wire type 2) of the length-delimited fields we stream.
const TENSOR_RAW_DATA_KEY: u8 = (9 << 3) | 2;
const GRAPH_INITIALIZER_KEY: u8 = (5 << 3) | 2;
const MODEL_GRAPH_KEY: u8 = (7 << 3) | 2;

fn varint_len(v: u64) -> u64 {
    prost::encoding::encoded_len_varint(v) as u64
}

fn write_varint(w: &mut impl Write, v: u64) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(10);
    prost::encoding::encode_varint(v, &mut buf);
    w.write_all(&buf)
}

/// Everything but the initializers' data, encoded, plus the lengths needed to stream them.
struct Layout {
    model_head: Vec<u8>,
    graph_head: Vec<u8>,
    tensor_heads: Vec<Vec<u8>>,
    graph_len: u64,
    total_len: u64,
}

impl Layout {
    fn tensor_len(head: &[u8], data_len: u64) -> u64 {
        head.len() as u64 + 1 + varint_len(data_len) + data_len
    }

    fn new(graph: &Graph, info: &ModelInfo) -> Layout {
        let model = onnx::ModelProto {
            ir_version: Some(ir_version_for(graph.opset)),
            opset_import: vec![onnx::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(graph.opset),
            }],
            producer_name: Some(info.producer_name.clone()),
            producer_version: Some(info.producer_version.clone()),
            doc_string: (!info.doc_string.is_empty()).then(|| info.doc_string.clone()),
            metadata_props: info
                .metadata
                .iter()
                .map(|(k, v)| onnx::StringStringEntryProto {
                    key: Some(k.clone()),
                    value: Some(v.clone()),
                })
                .collect(),
            ..Default::default()
        };
        let graph_proto = onnx::GraphProto {
            name: Some(graph.name.clone()),
            node: graph
                .nodes
                .iter()
                .map(|n| onnx::NodeProto {
                    name: Some(n.name.clone()),
                    op_type: Some(n.op_type.clone()),
                    domain: Some(String::new()),
                    input: n.inputs.clone(),
                    output: n.outputs.clone(),
                    attribute: n.attributes.iter().map(|(k, a)| attribute(k, a)).collect(),
                    ..Default::default()
                })
                .collect(),
            input: graph.inputs.iter().map(value_info).collect(),
            output: graph.outputs.iter().map(value_info).collect(),
            value_info: graph.value_info.iter().map(value_info).collect(),
            ..Default::default()
        };
        let model_head = model.encode_to_vec();
        let graph_head = graph_proto.encode_to_vec();
        let tensor_heads: Vec<Vec<u8>> = graph
            .initializers
            .iter()
            .map(|i| tensor_header(i).encode_to_vec())
            .collect();
        let mut graph_len = graph_head.len() as u64;
        for (head, init) in tensor_heads.iter().zip(&graph.initializers) {
            let t = Self::tensor_len(head, init.byte_len() as u64);
            graph_len += 1 + varint_len(t) + t;
        }
        let total_len = model_head.len() as u64 + 1 + varint_len(graph_len) + graph_len;
        Layout {
            model_head,
            graph_head,
            tensor_heads,
            graph_len,
            total_len,
        }
    }
}

/// The exact size in bytes of the ONNX file [`write_model`] would write.
pub fn encoded_size(graph: &Graph, info: &ModelInfo) -> u64 {
    Layout::new(graph, info).total_len
}

fn tensor_bytes(init: &Initializer) -> Result<Vec<u8>> {
    let bytes: Vec<u8> = match &init.data {
        TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::LazyF32(produce) => {
            let v = produce()?;
            if v.len() != init.len() {
                return Err(Error::BadTensor(format!(
                    "{}: produced {} values for shape {:?}",
                    init.name,
                    v.len(),
                    init.dims
                )));
            }
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
    };
    Ok(bytes)
}

/// Streams the model to `w`; returns the number of bytes written. `on_tensor` is called
/// after each initializer with (index, count) for progress reporting.
pub fn encode_model(
    graph: &Graph,
    info: &ModelInfo,
    w: &mut impl Write,
    mut on_tensor: impl FnMut(usize, usize),
) -> Result<u64> {
    let layout = Layout::new(graph, info);
    if layout.total_len > PROTOBUF_LIMIT {
        return Err(too_large(layout.total_len));
    }
    let io = |e: std::io::Error| Error::io("<onnx stream>", e);
    w.write_all(&layout.model_head).map_err(io)?;
    w.write_all(&[MODEL_GRAPH_KEY]).map_err(io)?;
    write_varint(w, layout.graph_len).map_err(io)?;
    w.write_all(&layout.graph_head).map_err(io)?;
    let count = graph.initializers.len();
    for (k, (head, init)) in layout
        .tensor_heads
        .iter()
        .zip(&graph.initializers)
        .enumerate()
    {
        let data = tensor_bytes(init)?;
        let t = Layout::tensor_len(head, data.len() as u64);
        w.write_all(&[GRAPH_INITIALIZER_KEY]).map_err(io)?;
        write_varint(w, t).map_err(io)?;
        w.write_all(head).map_err(io)?;
        w.write_all(&[TENSOR_RAW_DATA_KEY]).map_err(io)?;
        write_varint(w, data.len() as u64).map_err(io)?;
        w.write_all(&data).map_err(io)?;
        on_tensor(k + 1, count);
    }
    Ok(layout.total_len)
}

fn too_large(bytes: u64) -> Error {
    Error::TooLarge(format!(
        "the model would be {:.2} GiB, over the 2 GiB protobuf limit of a single ONNX file; \
         external data (model.onnx + model.onnx.data) is not supported yet",
        bytes as f64 / (1u64 << 30) as f64
    ))
}

/// Encodes the model into memory (small models, tests).
pub fn encode_model_to_vec(graph: &Graph, info: &ModelInfo) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    encode_model(graph, info, &mut buf, |_, _| {})?;
    Ok(buf)
}

/// Removes the temporary file unless disarmed: no partial output survives an error.
struct TempFileGuard {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempFileGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes `path` atomically: the bytes go to a temporary file in the same directory,
/// which is renamed over `path` only after everything was written and synced.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    if path.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "output path {} is a directory",
            path.display()
        )));
    }
    let file_name = path.file_name().ok_or_else(|| {
        Error::InvalidArgument(format!("output path {} has no file name", path.display()))
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "output directory {} does not exist",
            dir.display()
        )));
    }
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let mut guard = TempFileGuard {
        path: tmp.clone(),
        armed: true,
    };
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w)?;
    let file = w
        .into_inner()
        .map_err(|e| Error::io(&tmp, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    guard.armed = false;
    Ok(())
}

/// Writes the model to `path` atomically; returns the file size.
pub fn write_model(
    graph: &Graph,
    info: &ModelInfo,
    path: &Path,
    on_tensor: impl FnMut(usize, usize),
) -> Result<u64> {
    let size = encoded_size(graph, info);
    if size > PROTOBUF_LIMIT {
        return Err(too_large(size));
    }
    let mut written = 0;
    write_atomically(path, |w| {
        written = encode_model(graph, info, w, on_tensor).map_err(|e| match e {
            Error::Io { source, .. } => Error::io(path, source),
            other => other,
        })?;
        Ok(())
    })?;
    Ok(written)
}

/// Reads and decodes an ONNX file (models with external data are not read yet).
pub fn read_model(path: &Path) -> Result<onnx::ModelProto> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |reason: String| Error::BadModel {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.is_empty() {
        return Err(bad("the file is empty".into()));
    }
    let model = onnx::ModelProto::decode(bytes.as_slice())
        .map_err(|e| bad(format!("protobuf decoding failed ({})", one_line(e))))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| bad("it has no graph".into()))?;
    if graph.output.is_empty() {
        return Err(bad("its graph has no output".into()));
    }
    Ok(model)
}

/// A tensor's declared element type and shape, as read from an ONNX file.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredTensor {
    /// Value name.
    pub name: String,
    /// `TensorProto.DataType` code (1 = float, 7 = int64, ...).
    pub elem_type: i32,
    /// Dimensions: fixed sizes or symbols (an unnamed unknown dimension reads as `?`).
    pub shape: Vec<Dim>,
}

/// The graph inputs (not initializers) of a decoded model, with declared types and shapes.
pub fn declared_inputs(model: &onnx::ModelProto) -> Vec<DeclaredTensor> {
    let Some(graph) = &model.graph else {
        return Vec::new();
    };
    let init_names: std::collections::HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    graph
        .input
        .iter()
        .filter(|v| !init_names.contains(v.name()))
        .map(declared)
        .collect()
}

/// The graph outputs of a decoded model.
pub fn declared_outputs(model: &onnx::ModelProto) -> Vec<DeclaredTensor> {
    model
        .graph
        .as_ref()
        .map(|g| g.output.iter().map(declared).collect())
        .unwrap_or_default()
}

fn declared(v: &onnx::ValueInfoProto) -> DeclaredTensor {
    use onnx::tensor_shape_proto::dimension::Value as DimValue;
    use onnx::type_proto::Value as TypeValue;
    let (elem_type, shape) = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(TypeValue::TensorType(t)) => (
            t.elem_type.unwrap_or(0),
            t.shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(DimValue::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as usize),
                            Some(DimValue::DimParam(p)) => Dim::Symbol(p.clone()),
                            _ => Dim::Symbol("?".into()),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        ),
        _ => (0, Vec::new()),
    };
    DeclaredTensor {
        name: v.name().to_string(),
        elem_type,
        shape,
    }
}

/// A metadata property of a decoded model.
pub fn metadata_value<'m>(model: &'m onnx::ModelProto, key: &str) -> Option<&'m str> {
    model
        .metadata_props
        .iter()
        .find(|p| p.key() == key)
        .map(|p| p.value())
}

/// Number of f32 values stored in the initializers of a decoded model.
pub fn stored_f32_count(model: &onnx::ModelProto) -> u64 {
    model
        .graph
        .as_ref()
        .map(|g| {
            g.initializer
                .iter()
                .filter(|t| t.data_type() == ElemType::F32.onnx_code())
                .map(|t| t.dims.iter().product::<i64>().max(0) as u64)
                .sum()
        })
        .unwrap_or(0)
}
