//! The values of stored tensors (initializers) as numbers: inline (`raw_data` or the typed
//! fields) or external data beside the model, every size checked against the dims first.

use std::path::Path;

use crate::error::{Error, Result};
use crate::onnx::dtype::DataType;
use crate::onnx::proto as onnx;
use crate::onnx::reader::{element_count, external_reference, ExternalReferenceError};

/// Element types [`tensor_f32`] converts, with their bytes per element.
const F32_READABLE: &[(DataType, usize)] = &[
    (DataType::Float, 4),
    (DataType::Float16, 2),
    (DataType::Bfloat16, 2),
    (DataType::Double, 8),
    (DataType::Int8, 1),
    (DataType::Uint8, 1),
];

/// The values of a stored tensor (an initializer) as f32, row-major: float, float16,
/// bfloat16 and double tensors converted, int8 and uint8 tensors as the integers they hold.
/// The data may be `raw_data` (little-endian, as the ONNX spec requires), the typed field
/// the spec assigns to the type (`float_data`, `double_data`, `int32_data`), or external
/// data beside `model_path`. The byte count is checked against the dims before anything
/// is allocated or read, so a file that declares more than it holds is refused.
pub fn tensor_f32(t: &onnx::TensorProto, model_path: &Path) -> Result<Vec<f32>> {
    let bad = |reason: String| Error::BadModel {
        path: model_path.to_path_buf(),
        reason: format!("initializer {}: {reason}", t.name()),
    };
    let code = t.data_type();
    let &(dtype, width) = F32_READABLE
        .iter()
        .find(|(d, _)| *d as i32 == code)
        .ok_or_else(|| {
            bad(format!(
                "element type {} cannot be read as numbers here",
                crate::onnx::dtype::type_name(code)
            ))
        })?;
    let n = element_count(t)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad(format!("dims {:?} have no valid element count", t.dims)))?;
    let bytes = n
        .checked_mul(width)
        .ok_or_else(|| bad(format!("dims {:?} are too large", t.dims)))?;
    let external = t.data_location == Some(onnx::tensor_proto::DataLocation::External as i32);
    let raw: Option<std::borrow::Cow<'_, [u8]>> = if external {
        Some(
            read_external(t, model_path, bytes)
                .map_err(|e| bad(e.to_string()))?
                .into(),
        )
    } else {
        t.raw_data.as_deref().map(Into::into)
    };
    if let Some(raw) = raw {
        if raw.len() != bytes {
            return Err(bad(format!(
                "{} bytes of data for dims {:?} ({bytes} expected)",
                raw.len(),
                t.dims
            )));
        }
        return Ok(raw_f32(dtype, width, &raw));
    }
    let typed_len = match dtype {
        DataType::Float => t.float_data.len(),
        DataType::Double => t.double_data.len(),
        _ => t.int32_data.len(),
    };
    if typed_len != n {
        return Err(bad(format!(
            "{typed_len} values for dims {:?} ({n} expected)",
            t.dims
        )));
    }
    Ok(typed_f32(t, dtype))
}

/// The little-endian `raw` bytes of elements of `dtype`, `width` bytes each, as f32.
fn raw_f32(dtype: DataType, width: usize, raw: &[u8]) -> Vec<f32> {
    let chunks = raw.chunks_exact(width);
    match dtype {
        DataType::Float => chunks
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DataType::Float16 => chunks
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DataType::Bfloat16 => chunks
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DataType::Double => chunks
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        DataType::Int8 => raw.iter().map(|&b| f32::from(b as i8)).collect(),
        _ => raw.iter().map(|&b| f32::from(b)).collect(),
    }
}

/// The values of `t`, of `dtype`, held in the typed field the spec assigns to the type,
/// as f32.
fn typed_f32(t: &onnx::TensorProto, dtype: DataType) -> Vec<f32> {
    // int32_data holds float16 / bfloat16 as their 16 bits, int8 / uint8 as the integer.
    let bits16 = |v: i32| v as u16;
    match dtype {
        DataType::Float => t.float_data.clone(),
        DataType::Double => t.double_data.iter().map(|&v| v as f32).collect(),
        DataType::Float16 => t
            .int32_data
            .iter()
            .map(|&v| half::f16::from_bits(bits16(v)).to_f32())
            .collect(),
        DataType::Bfloat16 => t
            .int32_data
            .iter()
            .map(|&v| half::bf16::from_bits(bits16(v)).to_f32())
            .collect(),
        _ => t.int32_data.iter().map(|&v| v as f32).collect(),
    }
}

/// Why an initializer's external bytes cannot be read.
#[derive(Debug, thiserror::Error)]
enum ExternalDataError {
    /// The `external_data` entries themselves are wrong.
    #[error(transparent)]
    Reference(#[from] ExternalReferenceError),
    /// The data file cannot be opened or read.
    #[error("external data file {}: {source}", file.display())]
    Io {
        /// The data file, beside the model.
        file: std::path::PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The reference's length is not what the dims need.
    #[error("{length} external bytes for dims {dims:?} ({expected} expected)")]
    WrongLength {
        /// Bytes the reference covers.
        length: u64,
        /// The initializer's dims.
        dims: Vec<i64>,
        /// Bytes the dims need.
        expected: usize,
    },
    /// The reference reaches past the end of the data file.
    #[error("external bytes {offset}..{end} lie past the end of {location} ({file_len} bytes)")]
    PastEnd {
        /// First byte.
        offset: u64,
        /// One past the last byte (saturated).
        end: u64,
        /// The data file as the reference names it.
        location: String,
        /// The data file's size.
        file_len: u64,
    },
}

/// The `bytes` external bytes of `t`, after checking the reference against the file's
/// size (the file beside `model_path`; its location was checked at decoding).
fn read_external(
    t: &onnx::TensorProto,
    model_path: &Path,
    bytes: usize,
) -> Result<Vec<u8>, ExternalDataError> {
    use std::io::{Read, Seek, SeekFrom};
    let r = external_reference(t)?;
    let dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_path = dir.join(&r.location);
    let io = |source| ExternalDataError::Io {
        file: file_path.clone(),
        source,
    };
    let mut file = std::fs::File::open(&file_path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let length = r.length.unwrap_or(file_len.saturating_sub(r.offset));
    if length != bytes as u64 {
        return Err(ExternalDataError::WrongLength {
            length,
            dims: t.dims.clone(),
            expected: bytes,
        });
    }
    if r.offset
        .checked_add(length)
        .is_none_or(|end| end > file_len)
    {
        return Err(ExternalDataError::PastEnd {
            offset: r.offset,
            end: r.offset.saturating_add(length),
            location: r.location,
            file_len,
        });
    }
    let mut data = vec![0u8; bytes];
    file.seek(SeekFrom::Start(r.offset))
        .and_then(|_| file.read_exact(&mut data))
        .map_err(io)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onnx::tensor_proto::DataLocation;

    fn tensor(data_type: DataType, dims: &[i64]) -> onnx::TensorProto {
        onnx::TensorProto {
            name: Some("w".into()),
            data_type: Some(data_type as i32),
            dims: dims.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn values_come_from_raw_data_or_the_typed_field_of_each_type() {
        let path = Path::new("m.onnx");
        let mut t = tensor(DataType::Float, &[2]);
        t.raw_data = Some(
            [1.5f32, -2.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        );
        assert_eq!(tensor_f32(&t, path).unwrap(), vec![1.5, -2.0]);
        let mut t = tensor(DataType::Float, &[3]);
        t.float_data = vec![1.0, 2.0, 3.0];
        assert_eq!(tensor_f32(&t, path).unwrap(), vec![1.0, 2.0, 3.0]);
        // float16 in int32_data holds the 16 bits; int8 the integer.
        let mut t = tensor(DataType::Float16, &[2]);
        t.int32_data = vec![
            i32::from(half::f16::from_f32(0.5).to_bits()),
            i32::from(half::f16::from_f32(-3.0).to_bits()),
        ];
        assert_eq!(tensor_f32(&t, path).unwrap(), vec![0.5, -3.0]);
        let mut t = tensor(DataType::Int8, &[3]);
        t.raw_data = Some(vec![0x7f, 0x81, 0]);
        assert_eq!(tensor_f32(&t, path).unwrap(), vec![127.0, -127.0, 0.0]);
        let mut t = tensor(DataType::Bfloat16, &[1]);
        t.raw_data = Some(half::bf16::from_f32(0.25).to_le_bytes().to_vec());
        assert_eq!(tensor_f32(&t, path).unwrap(), vec![0.25]);
    }

    #[test]
    fn sizes_that_disagree_with_the_dims_and_other_types_are_refused() {
        let path = Path::new("m.onnx");
        let mut t = tensor(DataType::Float, &[1 << 40, 1 << 20]);
        t.raw_data = Some(vec![0; 8]);
        let err = tensor_f32(&t, path).unwrap_err();
        assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
        // The rendering of the family: the file and the initializer named.
        assert_eq!(
            err.to_string(),
            "m.onnx: not a usable ONNX model: initializer w: 8 bytes of data for dims [1099511627776, 1048576] (4611686018427387904 expected)"
        );
        let mut t = tensor(DataType::Float, &[3]);
        t.float_data = vec![1.0];
        let err = tensor_f32(&t, path).unwrap_err();
        assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
        let t = tensor(DataType::String, &[1]);
        let err = tensor_f32(&t, path).unwrap_err();
        assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
    }

    #[test]
    fn external_data_is_read_from_its_range_after_checking_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx");
        let bytes: Vec<u8> = [9f32, 7.0, 5.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(dir.path().join("m.data"), &bytes).unwrap();
        let external = |offset: &str, length: &str| {
            let mut t = tensor(DataType::Float, &[2]);
            t.data_location = Some(DataLocation::External as i32);
            t.external_data = [
                ("location", "m.data"),
                ("offset", offset),
                ("length", length),
            ]
            .iter()
            .map(|(k, v)| onnx::StringStringEntryProto {
                key: Some(k.to_string()),
                value: Some(v.to_string()),
            })
            .collect();
            t
        };
        assert_eq!(
            tensor_f32(&external("4", "8"), &path).unwrap(),
            vec![7.0, 5.0]
        );
        let err = tensor_f32(&external("8", "8"), &path).unwrap_err();
        assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
        // The reasons by kind, from the reader itself.
        let kind = |offset: &str, length: &str| read_external(&external(offset, length), &path, 8);
        assert!(matches!(
            kind("8", "8"),
            Err(ExternalDataError::PastEnd {
                offset: 8,
                end: 16,
                file_len: 12,
                ..
            })
        ));
        assert!(matches!(
            kind("0", "12"),
            Err(ExternalDataError::WrongLength {
                length: 12,
                expected: 8,
                ..
            })
        ));
        assert!(matches!(
            kind("x", "8"),
            Err(ExternalDataError::Reference(
                ExternalReferenceError::NotAByteCount { .. }
            ))
        ));
        let elsewhere = dir.path().join("sub").join("m.onnx");
        assert!(matches!(
            read_external(&external("0", "8"), &elsewhere, 8),
            Err(ExternalDataError::Io { .. })
        ));
    }
}
