//! Writing a [`Graph`] as an ONNX `ModelProto`.
//!
//! Writing streams: the model and graph headers are encoded with prost, then each
//! initializer is produced and written in order, in runs (a producer thread makes the next
//! runs while this one writes the last: a checkpoint's tensor comes a strip at a time,
//! transposed in cache; a whole-tensor transform, such as a quantization, one tensor at a
//! time), so peak memory is a few runs or tensors, not the model. Protobuf allows fields in
//! any order, so the `graph` field (and inside it the `initializer` fields) come last;
//! lengths are known in advance from the tensor shapes. Files go to a temporary file beside
//! the target and are renamed into place only when complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::error::{Error, Result};
use crate::fs::{write_atomically, PendingFile};
use crate::onnx::graph::{ElemType, Graph, Initializer, TensorData};
use crate::onnx::proto as onnx;
use crate::tensor::RUN;

mod protos;
mod stored;
pub(crate) use protos::node_proto;
use protos::{tensor_header, value_info};
pub use stored::{encode_with_stored, stored_mismatch};

/// Protobuf messages cannot exceed 2 GiB; larger models need external data.
pub const PROTOBUF_LIMIT: u64 = (1 << 31) - 1;

pub use crate::onnx::versions::ir_version_for;

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
        let model_head = model_header(graph, info).encode_to_vec();
        let graph_head = graph_header(graph).encode_to_vec();
        let (tensor_heads, offsets) = tensor_headers(graph, data);
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

/// The model's fields but its graph: opsets, producer, doc string, metadata.
fn model_header(graph: &Graph, info: &ModelInfo) -> onnx::ModelProto {
    onnx::ModelProto {
        ir_version: Some(ir_version_for(graph.opset)),
        opset_import: std::iter::once((String::new(), graph.opset))
            .chain(
                graph
                    .extra_domains()
                    .into_iter()
                    .map(|(d, v)| (d.to_string(), v)),
            )
            .map(|(domain, version)| onnx::OperatorSetIdProto {
                domain: Some(domain),
                version: Some(version),
            })
            .collect(),
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
    }
}

/// The graph's fields but its initializers: name, nodes, inputs, outputs, value infos.
fn graph_header(graph: &Graph) -> onnx::GraphProto {
    onnx::GraphProto {
        name: Some(graph.name.clone()),
        node: graph
            .nodes
            .iter()
            .map(|n| {
                let node = node_proto(n);
                onnx::NodeProto {
                    domain: Some(node.domain.clone().unwrap_or_default()),
                    ..node
                }
            })
            .collect(),
        input: graph.inputs.iter().map(value_info).collect(),
        output: graph.outputs.iter().map(value_info).collect(),
        value_info: graph.value_info.iter().map(value_info).collect(),
        ..Default::default()
    }
}

/// Each initializer's encoded fields but its data and, with external data, where its data
/// starts in the data file (aligned to [`EXTERNAL_ALIGNMENT`]).
fn tensor_headers(graph: &Graph, data: &DataLayout) -> (Vec<Vec<u8>>, Vec<u64>) {
    let mut offsets = Vec::new();
    let heads = match data {
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
    (heads, offsets)
}

/// The exact size in bytes of the ONNX file [`encode_model`] writes for `data`.
pub fn encoded_size(graph: &Graph, info: &ModelInfo, data: &DataLayout) -> u64 {
    Layout::new(graph, info, data).total_len
}

/// What the producing thread hands the writing one for an initializer: its values in
/// runs (a whole tensor borrowed from the graph, or runs produced at write time), then the
/// end of the tensor.
enum Produced<'g> {
    /// A run of the tensor's values.
    Run(std::borrow::Cow<'g, [f32]>),
    /// The tensor is complete.
    End,
}

/// The floats produced and not yet written, bounded: the producer waits before it hands on
/// more than [`AHEAD`] floats (or one run larger than that, alone), so that a fast producer
/// in front of a slow disk holds a few runs or one whole tensor, never the model.
struct InFlight {
    /// Floats handed on and not yet written; `None` once the writer has stopped.
    floats: std::sync::Mutex<Option<usize>>,
    written: std::sync::Condvar,
}

/// Floats the producer may be ahead of the writer: 16 runs (8 MB). Deep enough that a slow
/// tensor on one side does not stall the other (mid-28m to tmpfs: 80 ms a write 2 runs
/// ahead, 60 ms 8 or 16 ahead).
const AHEAD: usize = 16 * RUN;

// A run must be larger than the file's write buffer, or every run is copied into the
// buffer before it is written.
const _: () = assert!(crate::fs::WRITE_BUFFER < RUN * std::mem::size_of::<f32>());

impl InFlight {
    fn new() -> Self {
        InFlight {
            floats: std::sync::Mutex::new(Some(0)),
            written: std::sync::Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<usize>> {
        self.floats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `n` more floats fit (or nothing is in flight); false once the writer
    /// has stopped.
    fn reserve(&self, n: usize) -> bool {
        let mut floats = self.lock();
        loop {
            match *floats {
                None => return false,
                Some(f) if f == 0 || f + n <= AHEAD => {
                    *floats = Some(f + n);
                    return true;
                }
                Some(_) => floats = self.written.wait(floats).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// `n` floats are written.
    fn release(&self, n: usize) {
        if let Some(f) = self.lock().as_mut() {
            *f -= n;
        }
        self.written.notify_all();
    }

    /// The writer has stopped: a waiting producer gives up.
    fn close(&self) {
        *self.lock() = None;
        self.written.notify_all();
    }
}

/// Produces every initializer's values in order into `send`, in runs, at most [`AHEAD`]
/// floats ahead of the writer (`in_flight`); a lent slice is copied into runs of [`RUN`]
/// floats, whose buffers come back through `returned` once written. Stops at the first
/// error, which it sends, or when the writer has stopped.
fn produce_all<'g>(
    graph: &'g Graph,
    send: &std::sync::mpsc::Sender<Result<Produced<'g>>>,
    returned: &std::sync::mpsc::Receiver<Vec<f32>>,
    in_flight: &InFlight,
) {
    use std::borrow::Cow;
    let hung_up = || Error::Internal("the model writer stopped".into());
    let run = |values: Cow<'g, [f32]>| {
        if !in_flight.reserve(values.len()) {
            return Err(hung_up());
        }
        send.send(Ok(Produced::Run(values))).map_err(|_| hung_up())
    };
    for init in &graph.initializers {
        let done = match &init.data {
            TensorData::F32(v) => run(Cow::Borrowed(v)),
            TensorData::LazyF32(stream) => stream(&mut |values| match values {
                Cow::Owned(v) => run(Cow::Owned(v)),
                Cow::Borrowed(values) => values.chunks(RUN).try_for_each(|part| {
                    let mut buffer = returned
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(RUN));
                    buffer.clear();
                    buffer.extend_from_slice(part);
                    run(Cow::Owned(buffer))
                }),
            }),
        };
        let done = done.and_then(|()| send.send(Ok(Produced::End)).map_err(|_| hung_up()));
        if let Err(e) = done {
            let _ = send.send(Err(e));
            return;
        }
    }
}

/// Writes values little-endian as `elem` (f32, f16 rounded to nearest, i8 for quantized
/// weights, whose values are already integers in [−127, 127], or u8 for packed weights,
/// integers in [0, 255]) without a second full-size copy: f32 on a little-endian machine
/// goes out as it is in memory.
fn write_floats(
    w: &mut (impl Write + ?Sized),
    values: &[f32],
    elem: ElemType,
) -> std::io::Result<()> {
    if elem == ElemType::F32 && cfg!(target_endian = "little") {
        // The values' own bytes (bytemuck checks that f32 has no padding).
        return w.write_all(bytemuck::cast_slice(values));
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
            ElemType::I8 => {
                for (dst, x) in buf.iter_mut().zip(chunk) {
                    // `as` saturates; the producer already rounded and clamped.
                    *dst = (*x as i8) as u8;
                }
                chunk.len()
            }
            ElemType::U8 => {
                for (dst, x) in buf.iter_mut().zip(chunk) {
                    *dst = *x as u8;
                }
                chunk.len()
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
        return Err(Error::Internal("external data needs a data file".into()));
    }
    let io = |e: std::io::Error| Error::io("<onnx stream>", e);
    w.write_all(&layout.model_head).map_err(io)?;
    w.write_all(&[MODEL_GRAPH_KEY]).map_err(io)?;
    write_varint(w, layout.graph_len).map_err(io)?;
    w.write_all(&layout.graph_head).map_err(io)?;
    let count = graph.initializers.len();
    let mut data_pos = 0u64;
    // The tensors' values are produced (read, transposed, checked) on a second thread
    // while this one writes the runs before them: a build costs the larger of the two, not
    // their sum.
    let in_flight = InFlight::new();
    let streamed = std::thread::scope(|scope| -> Result<()> {
        let (send, produced) = std::sync::mpsc::channel();
        let (give_back, returned) = std::sync::mpsc::channel();
        let in_flight = &in_flight;
        // However the writing ends, a producer waiting for room gives up.
        struct Closes<'a>(&'a InFlight);
        impl Drop for Closes<'_> {
            fn drop(&mut self) {
                self.0.close();
            }
        }
        let _closes = Closes(in_flight);
        std::thread::Builder::new()
            .name("gmlp-onnx-weights".into())
            .spawn_scoped(scope, move || {
                produce_all(graph, &send, &returned, in_flight)
            })
            .map_err(|e| Error::Internal(format!("cannot start the weights' thread: {e}")))?;
        for (k, (head, init)) in layout
            .tensor_heads
            .iter()
            .zip(&graph.initializers)
            .enumerate()
        {
            let byte_len = init.byte_len() as u64;
            let t = Layout::tensor_len(head, byte_len, inline);
            w.write_all(&[GRAPH_INITIALIZER_KEY]).map_err(io)?;
            write_varint(w, t).map_err(io)?;
            w.write_all(head).map_err(io)?;
            if inline {
                w.write_all(&[TENSOR_RAW_DATA_KEY]).map_err(io)?;
                write_varint(w, byte_len).map_err(io)?;
            } else if let Some(d) = data_file.as_deref_mut() {
                let pad = layout.offsets[k] - data_pos;
                d.write_all(&vec![0u8; pad as usize]).map_err(io)?;
                data_pos = layout.offsets[k] + byte_len;
            }
            let mut seen = 0usize;
            loop {
                let next = produced.recv().map_err(|_| {
                    Error::Internal(format!("{}: its values were not produced", init.name))
                })??;
                let Produced::Run(values) = next else { break };
                seen += values.len();
                if seen > init.len() {
                    return Err(wrong_count(init, seen));
                }
                let out: &mut dyn Write = match data_file.as_deref_mut() {
                    Some(d) if !inline => d,
                    _ => &mut *w,
                };
                write_floats(out, &values, init.elem).map_err(io)?;
                in_flight.release(values.len());
                if let std::borrow::Cow::Owned(values) = values {
                    // A run's buffer goes back to the producer; a whole tensor's is kept
                    // for the next one of its size.
                    match values.capacity() == RUN {
                        true => drop(give_back.send(values)),
                        false => crate::tensor::recycled::give(values),
                    }
                }
            }
            if seen != init.len() {
                return Err(wrong_count(init, seen));
            }
            on_tensor(k + 1, count);
        }
        Ok(())
    });
    crate::tensor::recycled::release_all();
    streamed?;
    Ok(layout.total_len)
}

/// The refusal of an initializer whose producer gave `count` values (so far) for its shape.
fn wrong_count(init: &Initializer, count: usize) -> Error {
    Error::BadTensor(format!(
        "{}: produced {count} values for shape {:?}",
        init.name, init.dims
    ))
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
            Error::OutputPath(format!(
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

#[cfg(test)]
mod tests;
