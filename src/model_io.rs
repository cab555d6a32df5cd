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
                ConstData::F16(v) => (
                    ElemType::F16,
                    v.iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                        .collect(),
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
        data_type: Some(init.elem.onnx_code()),
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

/// Where initializer data goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataLayout {
    /// In the ONNX file (`raw_data`); the whole file must stay under 2 GiB.
    Inline,
    /// In a side file named `location` beside the model (`TensorProto.external_data`),
    /// each tensor at an offset that is a multiple of [`EXTERNAL_ALIGNMENT`].
    External {
        /// File name of the data file, relative to the model's folder.
        location: String,
    },
}

/// Alignment of tensors in an external data file (the ONNX spec recommends 4096).
pub const EXTERNAL_ALIGNMENT: u64 = 4096;

/// Everything but the initializers' data, encoded, plus the lengths needed to stream them.
struct Layout {
    model_head: Vec<u8>,
    graph_head: Vec<u8>,
    tensor_heads: Vec<Vec<u8>>,
    /// Offsets in the external data file (empty when inline).
    offsets: Vec<u64>,
    graph_len: u64,
    total_len: u64,
}

impl Layout {
    fn tensor_len(head: &[u8], data_len: u64, inline: bool) -> u64 {
        if inline {
            head.len() as u64 + 1 + varint_len(data_len) + data_len
        } else {
            head.len() as u64
        }
    }

    fn new(graph: &Graph, info: &ModelInfo, data: &DataLayout) -> Layout {
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
        let mut offsets = Vec::new();
        let tensor_heads: Vec<Vec<u8>> = match data {
            DataLayout::Inline => graph
                .initializers
                .iter()
                .map(|i| tensor_header(i).encode_to_vec())
                .collect(),
            DataLayout::External { location } => {
                let mut offset = 0u64;
                graph
                    .initializers
                    .iter()
                    .map(|i| {
                        offset = offset.div_ceil(EXTERNAL_ALIGNMENT) * EXTERNAL_ALIGNMENT;
                        offsets.push(offset);
                        let entry = |k: &str, v: String| onnx::StringStringEntryProto {
                            key: Some(k.into()),
                            value: Some(v),
                        };
                        let mut t = tensor_header(i);
                        t.data_location = Some(onnx::tensor_proto::DataLocation::External as i32);
                        t.external_data = vec![
                            entry("location", location.clone()),
                            entry("offset", offset.to_string()),
                            entry("length", i.byte_len().to_string()),
                        ];
                        offset += i.byte_len() as u64;
                        t.encode_to_vec()
                    })
                    .collect()
            }
        };
        let inline = *data == DataLayout::Inline;
        let mut graph_len = graph_head.len() as u64;
        for (head, init) in tensor_heads.iter().zip(&graph.initializers) {
            let t = Self::tensor_len(head, init.byte_len() as u64, inline);
            graph_len += 1 + varint_len(t) + t;
        }
        let total_len = model_head.len() as u64 + 1 + varint_len(graph_len) + graph_len;
        Layout {
            model_head,
            graph_head,
            tensor_heads,
            offsets,
            graph_len,
            total_len,
        }
    }
}

/// The exact size in bytes of the ONNX file [`encode_model`] writes for `data`.
pub fn encoded_size(graph: &Graph, info: &ModelInfo, data: &DataLayout) -> u64 {
    Layout::new(graph, info, data).total_len
}

/// Produces an initializer's values and checks their count.
fn tensor_values(init: &Initializer) -> Result<std::borrow::Cow<'_, [f32]>> {
    let values = match &init.data {
        TensorData::F32(v) => std::borrow::Cow::Borrowed(v.as_slice()),
        TensorData::LazyF32(produce) => std::borrow::Cow::Owned(produce()?),
    };
    if values.len() != init.len() {
        return Err(Error::BadTensor(format!(
            "{}: produced {} values for shape {:?}",
            init.name,
            values.len(),
            init.dims
        )));
    }
    Ok(values)
}

/// Writes values little-endian as `elem` (f32, or f16 rounded to nearest) without a
/// second full-size copy: f32 on a little-endian machine goes out as it is in memory.
fn write_floats(
    w: &mut (impl Write + ?Sized),
    values: &[f32],
    elem: ElemType,
) -> std::io::Result<()> {
    if elem != ElemType::F16 && cfg!(target_endian = "little") {
        // SAFETY: f32 has no padding and every byte pattern is a valid u8; the slice
        // covers exactly the values' memory and lives as long as `values`.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        return w.write_all(bytes);
    }
    const CHUNK: usize = 1 << 14;
    let mut buf = vec![0u8; CHUNK * 4];
    for chunk in values.chunks(CHUNK) {
        let n = match elem {
            ElemType::F16 => {
                for (dst, x) in buf.chunks_exact_mut(2).zip(chunk) {
                    dst.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
                }
                chunk.len() * 2
            }
            _ => {
                for (dst, x) in buf.chunks_exact_mut(4).zip(chunk) {
                    dst.copy_from_slice(&x.to_le_bytes());
                }
                chunk.len() * 4
            }
        };
        w.write_all(&buf[..n])?;
    }
    Ok(())
}

/// Streams the model to `w` (and, for [`DataLayout::External`], the tensor data to
/// `data_file`); returns the number of bytes of the model written. `on_tensor` is called
/// after each initializer with (index, count) for progress reporting.
pub fn encode_model(
    graph: &Graph,
    info: &ModelInfo,
    data: &DataLayout,
    w: &mut impl Write,
    mut data_file: Option<&mut dyn Write>,
    mut on_tensor: impl FnMut(usize, usize),
) -> Result<u64> {
    let layout = Layout::new(graph, info, data);
    if layout.total_len > PROTOBUF_LIMIT {
        return Err(too_large(layout.total_len));
    }
    let inline = *data == DataLayout::Inline;
    if !inline && data_file.is_none() {
        return Err(Error::InvalidArgument(
            "external data needs a data file".into(),
        ));
    }
    let io = |e: std::io::Error| Error::io("<onnx stream>", e);
    w.write_all(&layout.model_head).map_err(io)?;
    w.write_all(&[MODEL_GRAPH_KEY]).map_err(io)?;
    write_varint(w, layout.graph_len).map_err(io)?;
    w.write_all(&layout.graph_head).map_err(io)?;
    let count = graph.initializers.len();
    let mut data_pos = 0u64;
    for (k, (head, init)) in layout
        .tensor_heads
        .iter()
        .zip(&graph.initializers)
        .enumerate()
    {
        let values = tensor_values(init)?;
        let byte_len = init.byte_len() as u64;
        let t = Layout::tensor_len(head, byte_len, inline);
        w.write_all(&[GRAPH_INITIALIZER_KEY]).map_err(io)?;
        write_varint(w, t).map_err(io)?;
        w.write_all(head).map_err(io)?;
        if inline {
            w.write_all(&[TENSOR_RAW_DATA_KEY]).map_err(io)?;
            write_varint(w, byte_len).map_err(io)?;
            write_floats(w, &values, init.elem).map_err(io)?;
        } else if let Some(d) = data_file.as_deref_mut() {
            let pad = layout.offsets[k] - data_pos;
            d.write_all(&vec![0u8; pad as usize]).map_err(io)?;
            write_floats(d, &values, init.elem).map_err(io)?;
            data_pos = layout.offsets[k] + byte_len;
        }
        on_tensor(k + 1, count);
    }
    Ok(layout.total_len)
}

fn too_large(bytes: u64) -> Error {
    Error::TooLarge(format!(
        "the ONNX graph would be {:.2} GiB even without its weights, over the 2 GiB protobuf limit",
        bytes as f64 / (1u64 << 30) as f64
    ))
}

/// Encodes the model with inline data into memory (small models, tests).
pub fn encode_model_to_vec(graph: &Graph, info: &ModelInfo) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    encode_model(graph, info, &DataLayout::Inline, &mut buf, None, |_, _| {})?;
    Ok(buf)
}

/// Temporary files this process is writing. [`abandon_pending_files`] removes them when
/// the process is interrupted; creating, committing and removing a temporary file all
/// happen under this lock, so an interrupt sees either the temporary file or the finished
/// target, never a half-committed pair.
static PENDING: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn pending_files() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes every temporary file this process is still writing and returns how many, for
/// an interrupt (SIGINT, SIGTERM) handler that exits right after. From then on this
/// process commits no file: any thread that tries blocks until the exit.
pub fn abandon_pending_files() -> usize {
    let mut files = pending_files();
    let removed = files
        .drain(..)
        .filter(|f| std::fs::remove_file(f).is_ok())
        .count();
    // Keep the registry locked for good: no rename may complete after the cleanup.
    std::mem::forget(files);
    removed
}

/// A file being written under a temporary name beside its target: renamed into place by
/// [`PendingFile::persist`], removed if dropped before that or if the process is
/// interrupted (no partial output survives an error or a Ctrl-C).
pub struct PendingFile {
    target: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl PendingFile {
    /// Creates the temporary file for `target` (which must not be a directory, in an
    /// existing directory).
    pub fn create(target: &Path) -> Result<Self> {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if target.is_dir() {
            return Err(Error::InvalidArgument(format!(
                "output path {} is a directory",
                target.display()
            )));
        }
        let file_name = target.file_name().ok_or_else(|| {
            Error::InvalidArgument(format!("output path {} has no file name", target.display()))
        })?;
        let dir = match target.parent() {
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
            ".{}.tmp-{}-{}",
            file_name.to_string_lossy(),
            std::process::id(),
            SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut files = pending_files();
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        files.push(tmp.clone());
        Ok(PendingFile {
            target: target.to_path_buf(),
            tmp,
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// The buffered writer of the temporary file.
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer
            .as_mut()
            .expect("writer present until persisted")
    }

    /// Flushes and syncs the temporary file.
    pub fn sync(&mut self) -> Result<()> {
        let w = self.writer.take().expect("writer present until persisted");
        let file = w
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        Ok(())
    }

    /// Syncs (if not done yet) and renames the temporary file to its target.
    pub fn persist(self) -> Result<()> {
        Self::persist_all(vec![self])
    }

    /// Syncs every file, then renames them into place in order as one step with respect
    /// to interrupts; if a rename fails, the targets already renamed are removed again.
    pub fn persist_all(mut files: Vec<PendingFile>) -> Result<()> {
        for f in &mut files {
            if f.writer.is_some() {
                f.sync()?;
            }
        }
        let mut registry = pending_files();
        let mut done: Vec<PathBuf> = Vec::new();
        for f in &mut files {
            if let Err(e) = std::fs::rename(&f.tmp, &f.target) {
                for target in &done {
                    let _ = std::fs::remove_file(target);
                }
                return Err(Error::io(&f.target, e));
            }
            done.push(f.target.clone());
            registry.retain(|p| p != &f.tmp);
            f.tmp = PathBuf::new();
        }
        Ok(())
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let mut registry = pending_files();
            let _ = std::fs::remove_file(&self.tmp);
            registry.retain(|p| p != &self.tmp);
        }
    }
}

/// Writes `path` atomically: the bytes go to a temporary file in the same directory,
/// which is renamed over `path` only after everything was written and synced.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let mut pending = PendingFile::create(path)?;
    write(pending.writer())?;
    pending.persist()
}

/// How [`write_model_with`] lays out the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExternalData {
    /// External data only when the single file would exceed 2 GiB.
    #[default]
    Auto,
    /// Always write `NAME.data` beside the model.
    Always,
}

/// What [`write_model_with`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// Size of the ONNX file.
    pub model_bytes: u64,
    /// The external data file and its size, if the weights went there.
    pub data_file: Option<(PathBuf, u64)>,
}

/// Writes the model to `path` atomically, with external data when it would not fit in
/// one file; returns the model file's size.
pub fn write_model(
    graph: &Graph,
    info: &ModelInfo,
    path: &Path,
    on_tensor: impl FnMut(usize, usize),
) -> Result<u64> {
    write_model_with(graph, info, path, ExternalData::Auto, on_tensor).map(|w| w.model_bytes)
}

/// The external data file name for a model file name (`model.onnx` → `model.onnx.data`).
pub fn data_file_name(model_path: &Path) -> Result<String> {
    let name = model_path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "output path {} has no file name",
                model_path.display()
            ))
        })?;
    Ok(format!("{name}.data"))
}

/// Writes the model to `path`; with external data, the tensors go to `path` + `.data`
/// beside it. Both files are written to temporary names and renamed into place (data
/// first, model last) only when complete; on error neither is left behind.
pub fn write_model_with(
    graph: &Graph,
    info: &ModelInfo,
    path: &Path,
    external: ExternalData,
    on_tensor: impl FnMut(usize, usize),
) -> Result<Written> {
    let inline_size = encoded_size(graph, info, &DataLayout::Inline);
    let layout = if external == ExternalData::Always || inline_size > PROTOBUF_LIMIT {
        DataLayout::External {
            location: data_file_name(path)?,
        }
    } else {
        DataLayout::Inline
    };
    let size = encoded_size(graph, info, &layout);
    if size > PROTOBUF_LIMIT {
        return Err(too_large(size));
    }
    let rename_io = |e: Error| match e {
        Error::Io { source, .. } => Error::io(path, source),
        other => other,
    };
    let mut written = 0;
    let mut data_file_written = None;
    match &layout {
        DataLayout::Inline => write_atomically(path, |w| {
            written = encode_model(graph, info, &layout, w, None, on_tensor).map_err(rename_io)?;
            Ok(())
        })?,
        DataLayout::External { location } => {
            let data_path = path.with_file_name(location);
            let mut model_file = PendingFile::create(path)?;
            let mut data_file = PendingFile::create(&data_path)?;
            written = encode_model(
                graph,
                info,
                &layout,
                model_file.writer(),
                Some(data_file.writer() as &mut dyn Write),
                on_tensor,
            )
            .map_err(rename_io)?;
            // Data first, model last, as one step: an interrupt leaves both or neither.
            PendingFile::persist_all(vec![data_file, model_file])?;
            let data_len = std::fs::metadata(&data_path)
                .map_err(|e| Error::io(&data_path, e))?
                .len();
            data_file_written = Some((data_path, data_len));
        }
    }
    Ok(Written {
        model_bytes: written,
        data_file: data_file_written,
    })
}

/// Reads and decodes an ONNX file (see [`decode_model`]); external data files are not read.
pub fn read_model(path: &Path) -> Result<onnx::ModelProto> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    decode_model(&bytes, path)
}

/// Decodes ONNX bytes (`path` names the file in messages) and checks what every reader
/// here relies on: a graph with at least one output, and external data locations that
/// stay inside the model's directory (relative, no `..`), as the ONNX spec requires.
pub fn decode_model(bytes: &[u8], path: &Path) -> Result<onnx::ModelProto> {
    let bad = |reason: String| Error::BadModel {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.is_empty() {
        return Err(bad("the file is empty".into()));
    }
    let model = onnx::ModelProto::decode(bytes)
        .map_err(|e| bad(format!("protobuf decoding failed ({})", one_line(e))))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| bad("it has no graph".into()))?;
    if graph.output.is_empty() {
        return Err(bad("its graph has no output".into()));
    }
    for t in external_tensors(graph) {
        let reference = external_reference(t).map_err(bad)?;
        let location = Path::new(&reference.location);
        let escapes = location.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
        if reference.location.is_empty() || escapes {
            return Err(bad(format!(
                "initializer {} has external data location {:?} outside the model's directory",
                t.name(),
                reference.location
            )));
        }
    }
    Ok(model)
}

/// Number of elements of a stored tensor, `None` when a dimension is negative or the
/// product overflows (hostile files declare such dims).
pub fn element_count(t: &onnx::TensorProto) -> Option<u64> {
    t.dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

/// Where an initializer's bytes live when stored outside the ONNX file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalReference {
    /// File name relative to the model's directory.
    pub location: String,
    /// Byte offset in that file.
    pub offset: u64,
    /// Byte count (`None`: to the end of the file).
    pub length: Option<u64>,
}

fn external_tensors(graph: &onnx::GraphProto) -> impl Iterator<Item = &onnx::TensorProto> {
    graph
        .initializer
        .iter()
        .filter(|t| t.data_location == Some(onnx::tensor_proto::DataLocation::External as i32))
}

/// The `external_data` entries of an initializer stored outside the file.
pub fn external_reference(t: &onnx::TensorProto) -> Result<ExternalReference, String> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key() == key)
            .map(|e| e.value())
    };
    let number = |key: &str| -> Result<Option<u64>, String> {
        entry(key)
            .map(|v| {
                v.trim().parse::<u64>().map_err(|_| {
                    format!(
                        "initializer {}: external data {key} {v:?} is not a byte count",
                        t.name()
                    )
                })
            })
            .transpose()
    };
    Ok(ExternalReference {
        location: entry("location")
            .ok_or_else(|| format!("initializer {} has external data but no location", t.name()))?
            .to_string(),
        offset: number("offset")?.unwrap_or(0),
        length: number("length")?,
    })
}

/// Checks every external data reference of a decoded model against the files beside
/// `path`: each file exists and each byte range lies inside it and holds exactly the
/// tensor's declared size. Runs before a model is handed to a runtime.
pub fn check_external_data(model: &onnx::ModelProto, path: &Path) -> Result<()> {
    let Some(graph) = &model.graph else {
        return Ok(());
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let bad = |reason: String| Error::BadModel {
        path: path.to_path_buf(),
        reason,
    };
    let mut sizes = std::collections::HashMap::new();
    for t in external_tensors(graph) {
        let r = external_reference(t).map_err(bad)?;
        let file = dir.join(&r.location);
        let file_len = match sizes.get(&file) {
            Some(&n) => n,
            None => {
                let n = std::fs::metadata(&file)
                    .map_err(|e| {
                        bad(format!(
                            "external data file {} of initializer {}: {e}",
                            file.display(),
                            t.name()
                        ))
                    })?
                    .len();
                sizes.insert(file.clone(), n);
                n
            }
        };
        let expected = element_count(t).and_then(|n| {
            let bits = crate::inspect::elem_bits(t.data_type());
            (bits > 0)
                .then(|| n.checked_mul(bits).map(|b| b.div_ceil(8)))
                .flatten()
        });
        let length = r.length.unwrap_or(file_len.saturating_sub(r.offset));
        let end = r.offset.checked_add(length);
        if end.is_none_or(|e| e > file_len) {
            return Err(bad(format!(
                "initializer {}: external bytes {}..{} lie past the end of {} ({file_len} bytes)",
                t.name(),
                r.offset,
                r.offset.saturating_add(length),
                r.location
            )));
        }
        if let Some(expected) = expected {
            if expected != length {
                return Err(bad(format!(
                    "initializer {}: {length} external bytes for dims {:?} ({expected} expected)",
                    t.name(),
                    t.dims
                )));
            }
        } else {
            return Err(bad(format!(
                "initializer {}: dims {:?} of type {} have no valid byte size",
                t.name(),
                t.dims,
                t.data_type()
            )));
        }
    }
    Ok(())
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

/// Number of f32 and f16 values stored in the initializers of a decoded model.
pub fn stored_f32_count(model: &onnx::ModelProto) -> u64 {
    model
        .graph
        .as_ref()
        .map(|g| {
            g.initializer
                .iter()
                .filter(|t| {
                    [ElemType::F32, ElemType::F16]
                        .map(ElemType::onnx_code)
                        .contains(&t.data_type())
                })
                .map(|t| element_count(t).unwrap_or(0))
                .fold(0u64, u64::saturating_add)
        })
        .unwrap_or(0)
}
