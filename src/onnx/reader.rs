//! Reading ONNX files back: decoding with the checks every reader here relies on, external
//! data references, declared inputs and outputs, metadata.

use std::path::Path;

use prost::Message;

use crate::error::{one_line, Error, Result};
use crate::onnx::dtype::DataType;
use crate::onnx::graph::Dim;
use crate::onnx::proto as onnx;

thread_local! {
    /// Files decoded by [`read_model`] on this thread.
    static FILES_DECODED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many files [`read_model`] has decoded on this thread (tests check that a command
/// decodes each file once).
pub fn files_decoded() -> usize {
    FILES_DECODED.with(std::cell::Cell::get)
}

/// Reads and decodes an ONNX file (see [`decode_model`]); external data files are not read.
pub fn read_model(path: &Path) -> Result<onnx::ModelProto> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    FILES_DECODED.with(|n| n.set(n.get() + 1));
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
        let reference = external_reference(t).map_err(|e| bad(e.to_string()))?;
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

/// What is wrong with an initializer's external data reference (its `external_data`
/// entries).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExternalReferenceError {
    /// No `location` entry.
    #[error("initializer {initializer} has external data but no location")]
    NoLocation {
        /// The initializer's name.
        initializer: String,
    },
    /// An `offset` or `length` entry that is not a byte count.
    #[error("initializer {initializer}: external data {key} {value:?} is not a byte count")]
    NotAByteCount {
        /// The initializer's name.
        initializer: String,
        /// `offset` or `length`.
        key: String,
        /// The entry's value as written.
        value: String,
    },
}

/// The `external_data` entries of an initializer stored outside the file.
pub fn external_reference(
    t: &onnx::TensorProto,
) -> std::result::Result<ExternalReference, ExternalReferenceError> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key() == key)
            .map(|e| e.value())
    };
    let number = |key: &str| -> std::result::Result<Option<u64>, ExternalReferenceError> {
        entry(key)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| ExternalReferenceError::NotAByteCount {
                        initializer: t.name().to_string(),
                        key: key.to_string(),
                        value: v.to_string(),
                    })
            })
            .transpose()
    };
    Ok(ExternalReference {
        location: entry("location")
            .ok_or_else(|| ExternalReferenceError::NoLocation {
                initializer: t.name().to_string(),
            })?
            .to_string(),
        offset: number("offset")?.unwrap_or(0),
        length: number("length")?,
    })
}

/// The external data files of a decoded model (`path` names it in messages), in order of
/// first use by its initializers.
pub fn external_locations(model: &onnx::ModelProto, path: &Path) -> Result<Vec<String>> {
    let mut locations: Vec<String> = Vec::new();
    if let Some(graph) = &model.graph {
        for t in external_tensors(graph) {
            let r = external_reference(t).map_err(|e| Error::BadModel {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            if !locations.contains(&r.location) {
                locations.push(r.location);
            }
        }
    }
    Ok(locations)
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
        let r = external_reference(t).map_err(|e| bad(e.to_string()))?;
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
            let bits = crate::onnx::dtype::bits(t.data_type());
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
    /// `TensorProto.DataType` code (see [`crate::onnx::dtype`]).
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

/// Whether the main graph updates `input` into `output` by a scatter that can run in place:
/// exactly one node reads `input`, it is a `ScatterND` or `TensorScatter` taking `input`
/// as its data (first) input, and its first output is the graph output `output`. Only
/// then may a runtime write `output` into `input`'s own buffer (ONNX Runtime's kernels of
/// both skip their copy when the two are the same): no other node can see the input
/// change under it.
pub fn updates_in_place(model: &onnx::ModelProto, input: &str, output: &str) -> bool {
    let Some(graph) = model.graph.as_ref() else {
        return false;
    };
    if !graph.output.iter().any(|o| o.name() == output) {
        return false;
    }
    let mut readers = graph
        .node
        .iter()
        .filter(|n| n.input.iter().any(|i| i == input));
    match (readers.next(), readers.next()) {
        (Some(node), None) => {
            matches!(node.op_type(), "ScatterND" | "TensorScatter")
                && node.domain().is_empty()
                && node.input.first().map(String::as_str) == Some(input)
                && node.input.iter().filter(|i| *i == input).count() == 1
                && node.output.first().map(String::as_str) == Some(output)
        }
        _ => false,
    }
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
                    [DataType::Float, DataType::Float16]
                        .map(|d| d as i32)
                        .contains(&t.data_type())
                })
                .map(|t| element_count(t).unwrap_or(0))
                .fold(0u64, u64::saturating_add)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_entries(entries: &[(&str, &str)]) -> onnx::TensorProto {
        onnx::TensorProto {
            name: Some("w".into()),
            external_data: entries
                .iter()
                .map(|(k, v)| onnx::StringStringEntryProto {
                    key: Some(k.to_string()),
                    value: Some(v.to_string()),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_external_reference_without_location_or_with_a_bad_count_says_which() {
        let ok = external_reference(&with_entries(&[("location", "w.bin"), ("length", "8")]));
        assert_eq!(
            ok.unwrap(),
            ExternalReference {
                location: "w.bin".into(),
                offset: 0,
                length: Some(8),
            }
        );
        let missing = external_reference(&with_entries(&[("offset", "0")])).unwrap_err();
        assert_eq!(
            missing,
            ExternalReferenceError::NoLocation {
                initializer: "w".into()
            }
        );
        assert_eq!(
            missing.to_string(),
            "initializer w has external data but no location"
        );
        let bad = external_reference(&with_entries(&[("location", "w.bin"), ("offset", "x")]))
            .unwrap_err();
        assert_eq!(
            bad.to_string(),
            "initializer w: external data offset \"x\" is not a byte count"
        );
    }
}
