//! NumPy `.npy` / `.npz` reading and writing (format versions 1.0–3.0, little-endian,
//! C order), for `validate --inputs/--expected/--save-outputs`.
//!
//! Arrays keep their element type: float32, float64, int32 and int64 are read (the
//! types [`TensorValue`] holds); anything else is refused with the dtype named. Every
//! size read from a file is checked against the bytes actually present before the
//! array is allocated, so a hostile header cannot make the reader allocate more than
//! the archive holds: in an `.npz`, each member's header is inflated first and its
//! declared size must be exactly what the header's shape and type need before the rest
//! is inflated (the archive itself is read by [`crate::archive`]).

use std::io::{Read, Seek, Write};
use std::path::Path;

use ndarray::{ArrayD, IxDyn};

use crate::archive::ZipArchive;
use crate::error::{one_line, ArrayFileError, Error, Result};
use crate::tensor::{NamedTensor, TensorValue};

const MAGIC: &[u8] = b"\x93NUMPY";
/// Largest `.npy` header accepted.
const MAX_HEADER: usize = 1 << 16;
/// Largest rank accepted (NumPy's own limit is 64).
const MAX_RANK: usize = 64;

fn bad(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::BadTensor(format!("{what}: {reason}"))
}

/// An array whose bytes are not a `.npy` array or contradict themselves.
fn malformed(what: &str, reason: impl std::fmt::Display) -> Error {
    ArrayFileError::Malformed(format!("{what}: {reason}")).into()
}

/// An array in a form this reader does not read.
fn unsupported(what: &str, reason: impl std::fmt::Display) -> Error {
    ArrayFileError::Unsupported(format!("{what}: {reason}")).into()
}

/// An array past this reader's bounds.
fn too_large(what: &str, reason: impl std::fmt::Display) -> Error {
    ArrayFileError::TooLarge(format!("{what}: {reason}")).into()
}

/// Finds `'key': value` in a NumPy header dict and returns the raw value text.
fn header_field<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let start = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[start + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else if let Some(q) = rest.strip_prefix('\'') {
        q.find('\'')? + 2
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    Some(rest[..end].trim())
}

fn le_array<T, const N: usize>(
    data: &[u8],
    shape: &[usize],
    what: &str,
    from: impl Fn([u8; N]) -> T,
) -> Result<ArrayD<T>> {
    let values = data
        .chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; N];
            b.copy_from_slice(c);
            from(b)
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| malformed(what, e))
}

/// The preamble of a `.npy` file: (header length, offset of the header), from at least
/// its first 12 bytes (or all of a shorter file).
fn preamble(bytes: &[u8], what: &str) -> Result<(usize, usize)> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(malformed(what, "not a .npy array (bad magic)"));
    }
    let (header_len, offset) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(malformed(what, "truncated .npy header"));
            }
            let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (usize::try_from(n).unwrap_or(usize::MAX), 12)
        }
        v => {
            return Err(unsupported(
                what,
                format!("unsupported .npy format version {v}"),
            ))
        }
    };
    if header_len > MAX_HEADER {
        return Err(malformed(
            what,
            "the .npy header runs past the end of the data",
        ));
    }
    Ok((header_len, offset))
}

/// What a `.npy` header declares.
struct Header {
    descr: &'static str,
    shape: Vec<usize>,
    /// Bytes of data the shape and type need.
    data_len: usize,
}

/// Parses the header text of a `.npy` file.
fn parse_header(text: &[u8], what: &str) -> Result<Header> {
    let header =
        std::str::from_utf8(text).map_err(|_| malformed(what, "the .npy header is not text"))?;
    let descr = header_field(header, "descr")
        .ok_or_else(|| malformed(what, "the .npy header has no 'descr'"))?
        .trim_matches('\'');
    let fortran = header_field(header, "fortran_order")
        .ok_or_else(|| malformed(what, "the .npy header has no 'fortran_order'"))?;
    if fortran != "False" {
        return Err(unsupported(
            what,
            "Fortran-order arrays are not supported (save np.ascontiguousarray(a))",
        ));
    }
    let shape_text = header_field(header, "shape")
        .ok_or_else(|| malformed(what, "the .npy header has no 'shape'"))?;
    if !(shape_text.starts_with('(') && shape_text.ends_with(')')) {
        return Err(malformed(what, format!("bad shape {shape_text}")));
    }
    let shape: Vec<usize> = shape_text[1..shape_text.len() - 1]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| malformed(what, format!("bad shape {shape_text}")))?;
    if shape.len() > MAX_RANK {
        return Err(too_large(
            what,
            format!("rank {} is too large", shape.len()),
        ));
    }
    let (descr, elem_size) = match descr {
        "<f4" => ("<f4", 4),
        "<i4" => ("<i4", 4),
        "<f8" => ("<f8", 8),
        "<i8" => ("<i8", 8),
        other => {
            return Err(unsupported(
                what,
                format!(
                "dtype '{other}' is not supported (little-endian float32, float64, int32 or int64)"
            ),
            ))
        }
    };
    let data_len = shape
        .iter()
        .try_fold(elem_size, |a: usize, &d| a.checked_mul(d))
        .ok_or_else(|| too_large(what, format!("shape {shape:?} overflows")))?;
    Ok(Header {
        descr,
        shape,
        data_len,
    })
}

/// Decodes the data of a parsed header (whose length has been checked).
fn decode(header: &Header, data: &[u8], what: &str) -> Result<TensorValue> {
    let shape = &header.shape;
    Ok(match header.descr {
        "<f4" => TensorValue::F32(le_array(data, shape, what, f32::from_le_bytes)?),
        "<f8" => TensorValue::F64(le_array(data, shape, what, f64::from_le_bytes)?),
        "<i4" => TensorValue::I32(le_array(data, shape, what, i32::from_le_bytes)?),
        _ => TensorValue::I64(le_array(data, shape, what, i64::from_le_bytes)?),
    })
}

/// Parses one `.npy` file held in `bytes`; `what` names it in errors.
pub fn parse_npy(bytes: &[u8], what: &str) -> Result<TensorValue> {
    let (header_len, offset) = preamble(bytes, what)?;
    let text = bytes
        .get(offset..)
        .and_then(|rest| rest.get(..header_len))
        .ok_or_else(|| malformed(what, "the .npy header runs past the end of the data"))?;
    let header = parse_header(text, what)?;
    let data = &bytes[offset + header_len..];
    if data.len() != header.data_len {
        return Err(malformed(
            what,
            format!(
                "shape {:?} of dtype {} needs {} bytes of data, the array has {}",
                header.shape,
                header.descr,
                header.data_len,
                data.len()
            ),
        ));
    }
    decode(&header, data, what)
}

/// Reads an `.npy` member of an archive: its header first, then its data only once the
/// member's declared size is what the header's shape and type need.
fn read_member<R: Read + Seek>(
    archive: &mut ZipArchive<R>,
    index: usize,
    what: &str,
) -> Result<TensorValue> {
    let declared = archive.entries()[index].size;
    let mut member = archive.open(index).map_err(|e| bad(what, e))?;
    let io_err = |e: std::io::Error| bad(what, one_line(e));
    let mut start = vec![0u8; declared.min(12) as usize];
    member.read_exact(&mut start).map_err(io_err)?;
    let (header_len, offset) = preamble(&start, what)?;
    let header_end = (offset + header_len) as u64;
    if header_end > declared {
        return Err(malformed(
            what,
            "the .npy header runs past the end of the data",
        ));
    }
    let got = start.len();
    if header_end > got as u64 {
        start.resize(header_end as usize, 0);
        member.read_exact(&mut start[got..]).map_err(io_err)?;
    }
    let header = parse_header(&start[offset..header_end as usize], what)?;
    if declared - header_end != header.data_len as u64 {
        return Err(malformed(
            what,
            format!(
                "the member declares {} bytes of data, shape {:?} of dtype {} needs {}",
                declared - header_end,
                header.shape,
                header.descr,
                header.data_len
            ),
        ));
    }
    // A version-1 preamble is 10 bytes: up to two bytes after it were read with it.
    let mut data = start.split_off(header_end as usize);
    data.reserve_exact(header.data_len - data.len());
    member.read_to_end(&mut data).map_err(io_err)?;
    decode(&header, &data, what)
}

/// Reads every array of an `.npz` archive (stored or deflated, as `np.savez` and
/// `np.savez_compressed` write), in archive order, named by entry without `.npy`.
pub fn read_npz(path: &Path) -> Result<Vec<NamedTensor>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    read_npz_from(
        std::io::BufReader::new(file),
        len,
        &path.display().to_string(),
    )
}

/// Reads an `.npz` archive from any seekable reader of `len` bytes; `what` names it in
/// errors.
pub fn read_npz_from<R: Read + Seek>(reader: R, len: u64, what: &str) -> Result<Vec<NamedTensor>> {
    let mut archive = ZipArchive::new(reader, len).map_err(|e| {
        bad(
            what,
            format!("not a readable .npz (zip) archive ({})", one_line(e)),
        )
    })?;
    read_npz_archive(&mut archive, what)
}

/// Reads every array of an opened `.npz` archive; `what` names it in errors.
pub fn read_npz_archive<R: Read + Seek>(
    archive: &mut ZipArchive<R>,
    what: &str,
) -> Result<Vec<NamedTensor>> {
    let mut out: Vec<NamedTensor> = Vec::new();
    for i in 0..archive.entries().len() {
        let entry_name = archive.entries()[i].name.clone();
        let Some(name) = entry_name.strip_suffix(".npy") else {
            return Err(bad(
                what,
                format!("entry '{entry_name}' is not a .npy array"),
            ));
        };
        let value = read_member(archive, i, &format!("{what}: array '{name}'"))?;
        out.push(NamedTensor {
            name: name.to_string(),
            value,
        });
    }
    if out.is_empty() {
        return Err(bad(what, "the archive holds no array"));
    }
    Ok(out)
}

/// Encodes one array as `.npy` (format 1.0, little-endian, C order).
pub fn encode_npy(value: &TensorValue) -> Vec<u8> {
    fn bytes<T: Copy, const N: usize>(a: &ArrayD<T>, to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        a.iter().flat_map(|&v| to(v)).collect()
    }
    let (descr, data) = match value {
        TensorValue::F32(a) => ("<f4", bytes(a, f32::to_le_bytes)),
        TensorValue::F64(a) => ("<f8", bytes(a, f64::to_le_bytes)),
        TensorValue::I32(a) => ("<i4", bytes(a, i32::to_le_bytes)),
        TensorValue::I64(a) => ("<i8", bytes(a, i64::to_le_bytes)),
    };
    let dims: Vec<String> = value.shape().iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Pad so that the data starts at a multiple of 64 bytes; the header ends with '\n'.
    let unpadded = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    // The rank is at most a few dozen, so the header fits the 1.0 format's u16 length.
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

/// Writes tensors as an uncompressed `.npz` archive (what `np.savez` writes).
pub fn write_npz(writer: impl Write + Seek, tensors: &[NamedTensor]) -> Result<()> {
    let mut zip = zip::ZipWriter::new(writer);
    let zip_err = |e: zip::result::ZipError| Error::BadTensor(format!("npz: {}", one_line(e)));
    for t in tensors {
        let npy = encode_npy(&t.value);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(npy.len() as u64 >= u64::from(u32::MAX));
        zip.start_file(format!("{}.npy", t.name), options)
            .map_err(zip_err)?;
        zip.write_all(&npy)
            .map_err(|e| Error::io(format!("{}.npy", t.name), e))?;
    }
    zip.finish().map_err(zip_err)?;
    Ok(())
}

/// Writes tensors to `path` as an `.npz` archive, atomically.
pub fn save_npz(path: &Path, tensors: &[NamedTensor]) -> Result<()> {
    crate::fs::write_atomically(path, |w| {
        write_npz(&mut *w, tensors).map_err(|e| match e {
            Error::Io { source, .. } => Error::io(path, source),
            other => other,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-1.0 `.npy` with `header` padded as NumPy pads it, then `data`.
    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut text = header.to_string();
        while !(10 + text.len() + 1).is_multiple_of(64) {
            text.push(' ');
        }
        text.push('\n');
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn header_fields_are_found_in_either_quote_style() {
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        assert_eq!(header_field(h, "descr"), Some("'<f4'"));
        assert_eq!(header_field(h, "fortran_order"), Some("False"));
        assert_eq!(header_field(h, "shape"), Some("(2, 3)"));
        assert_eq!(header_field(h, "missing"), None);
        let h = r#"{"descr": "<i8", "shape": (4,), "fortran_order": False}"#;
        assert_eq!(header_field(h, "shape"), Some("(4,)"));
        assert_eq!(header_field(h, "fortran_order"), Some("False"));
    }

    #[test]
    fn arrays_parse_with_their_shapes_and_round_trip() {
        let data: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let v = parse_npy(
            &npy(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                &data,
            ),
            "a",
        )
        .unwrap();
        assert_eq!(v.shape(), &[3]);
        assert_eq!(parse_npy(&encode_npy(&v), "again").unwrap(), v);
        let scalar = parse_npy(
            &npy(
                "{'descr': '<i8', 'fortran_order': False, 'shape': (), }",
                &7i64.to_le_bytes(),
            ),
            "s",
        )
        .unwrap();
        assert_eq!(scalar.shape(), &[] as &[usize]);
        let empty = parse_npy(
            &npy(
                "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }",
                &[],
            ),
            "e",
        )
        .unwrap();
        assert_eq!(empty.shape(), &[0, 5]);
    }

    #[test]
    fn malformed_headers_are_refused_by_kind() {
        use ArrayFileError::{Malformed, TooLarge, Unsupported};
        let err = |bytes: &[u8]| match parse_npy(bytes, "x.npy").unwrap_err() {
            Error::ArrayFile(e) => e,
            other => panic!("not an array file's refusal: {other:?}"),
        };
        let e = err(b"not numpy at all");
        // The rendering of the family: the array named, then the reason.
        assert_eq!(e.to_string(), "x.npy: not a .npy array (bad magic)");
        assert!(matches!(e, Malformed(_)), "{e:?}");
        let h = |header: &str, data: &[u8]| err(&npy(header, data));
        let e = h(
            "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
            &[0; 4],
        );
        assert!(matches!(e, Unsupported(_)), "{e:?}");
        let e = h(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
            &[0; 4],
        );
        assert!(matches!(e, Unsupported(_)), "{e:?}");
        let e = h(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
            &[0; 4],
        );
        assert!(matches!(e, Malformed(_)), "{e:?}");
        let e = h(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
            &[],
        );
        assert!(matches!(e, Malformed(_)), "{e:?}");
        let e = h(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
            &[],
        );
        assert!(matches!(e, TooLarge(_)), "{e:?}");
        let e = h("{'descr': '<f4', 'shape': (1,), }", &[0; 4]);
        assert!(matches!(e, Malformed(_)), "{e:?}");
        let mut truncated = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
            &[],
        );
        truncated.truncate(20);
        let e = err(&truncated);
        assert!(matches!(e, Malformed(_)), "{e:?}");
    }
}
