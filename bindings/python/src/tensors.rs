//! Tensors that cross from Python without a copy: a `TensorRef` tuple (`gmlp_onnx._sources`:
//! name, address of element `[0, …, 0]`, dtype, shape, strides in elements, owner) read
//! where it lies, as safetensors' bindings read a tensor through its data pointer; and
//! arrays that go back to Python as bytes.

use gmlp_onnx::checkpoint::{MemoryTensor, MemoryType, StoredType, TensorBytes};
use gmlp_onnx::tensor::{NamedTensor, TensorValue};
use pyo3::prelude::*;

/// `(name, data_ptr, dtype, shape, strides, owner)`, as `gmlp_onnx._sources.TensorRef`.
pub type TensorRef = (String, usize, String, Vec<usize>, Vec<usize>, Py<PyAny>);

/// Bytes of a Python tensor or array, kept alive by holding its owner.
struct Borrowed {
    /// The tensor or array whose memory this is (never dropped before the bytes).
    _owner: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the memory belongs to `_owner`, a Python object this value keeps alive; it is
// only read, and Python objects may be held from any thread (`Py<T>` is Send + Sync). A
// Python thread writing the tensor while it is read is the caller's race, as with any
// reader of shared memory (a state dict being exported is not being trained).
#[allow(unsafe_code)]
unsafe impl Send for Borrowed {}
#[allow(unsafe_code)]
unsafe impl Sync for Borrowed {}

impl TensorBytes for Borrowed {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `_sources` gives the address of element [0, …, 0] of a live CPU tensor
        // (or array) and its shape and strides; `len` reaches exactly its last element
        // (`extent`), so the slice lies inside the tensor's memory, which `_owner` keeps
        // alive for as long as `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr, self.len)
        }
    }
}

/// The element size of a float type read as weights.
fn float_type(dtype: &str) -> Option<(StoredType, usize)> {
    Some(match dtype {
        "float32" => (StoredType::F32, 4),
        "float16" => (StoredType::F16, 2),
        "bfloat16" => (StoredType::BF16, 2),
        "float64" => (StoredType::F64, 8),
        _ => return None,
    })
}

/// Bytes from element `[0, …, 0]` to the last one of a view (0 for an empty one), or
/// `None` if it cannot be counted.
fn extent(shape: &[usize], strides: &[usize], size: usize) -> Option<usize> {
    if shape.len() != strides.len() {
        return None;
    }
    if shape.contains(&0) {
        return Some(0);
    }
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(0usize, |acc, (&d, &s)| {
            acc.checked_add((d - 1).checked_mul(s)?)
        })?;
    last.checked_add(1)?.checked_mul(size)
}

/// The tensors of `refs` as the library reads them (without a copy).
pub fn memory_tensors(refs: Vec<TensorRef>) -> anyhow::Result<Vec<(String, MemoryTensor)>> {
    refs.into_iter()
        .map(|(name, ptr, dtype, shape, strides, owner)| {
            let (element, len) = match float_type(&dtype) {
                Some((stored, size)) => {
                    let len = extent(&shape, &strides, size).ok_or_else(|| {
                        gmlp_onnx::Error::BadTensor(format!(
                            "{name}: shape {shape:?} with strides {strides:?} cannot be read"
                        ))
                    })?;
                    if len > 0 && ptr == 0 {
                        return Err(gmlp_onnx::Error::BadTensor(format!(
                            "{name}: a tensor of {len} bytes at address 0"
                        ))
                        .into());
                    }
                    (MemoryType::Float(stored), len)
                }
                None => (MemoryType::Other(dtype), 0),
            };
            let data = Borrowed {
                _owner: owner,
                ptr: ptr as *const u8,
                len,
            };
            Ok((
                name,
                MemoryTensor {
                    dtype: element,
                    shape,
                    strides,
                    data: Box::new(data),
                },
            ))
        })
        .collect()
}

/// Arrays from Python (model inputs or reference outputs: f32, f64, i32, i64) as named
/// tensors (copied: they are small and the runtimes take owned arrays).
pub fn named_tensors(refs: Vec<TensorRef>) -> anyhow::Result<Vec<NamedTensor>> {
    refs.into_iter()
        .map(|(name, ptr, dtype, shape, strides, owner)| {
            let size = match dtype.as_str() {
                "float32" | "int32" => 4,
                "float64" | "int64" => 8,
                other => anyhow::bail!(gmlp_onnx::Error::BadTensor(format!(
                    "{name}: element type {other} (float32, float64, int32, int64)"
                ))),
            };
            let len = extent(&shape, &strides, size).ok_or_else(|| {
                gmlp_onnx::Error::BadTensor(format!("{name}: shape {shape:?} cannot be read"))
            })?;
            let data = Borrowed {
                _owner: owner,
                ptr: ptr as *const u8,
                len,
            };
            let bytes = data.bytes();
            let count: usize = shape.iter().product();
            let offsets = offsets(&shape, &strides, count);
            let dims = ndarray::IxDyn(&shape);
            let read = |k: usize| &bytes[k * size..(k + 1) * size];
            let value = match dtype.as_str() {
                "float32" => TensorValue::F32(ndarray::ArrayD::from_shape_vec(
                    dims,
                    offsets
                        .map(|k| f32::from_ne_bytes(read(k).try_into().expect("4")))
                        .collect(),
                )?),
                "float64" => TensorValue::F64(ndarray::ArrayD::from_shape_vec(
                    dims,
                    offsets
                        .map(|k| f64::from_ne_bytes(read(k).try_into().expect("8")))
                        .collect(),
                )?),
                "int32" => TensorValue::I32(ndarray::ArrayD::from_shape_vec(
                    dims,
                    offsets
                        .map(|k| i32::from_ne_bytes(read(k).try_into().expect("4")))
                        .collect(),
                )?),
                _ => TensorValue::I64(ndarray::ArrayD::from_shape_vec(
                    dims,
                    offsets
                        .map(|k| i64::from_ne_bytes(read(k).try_into().expect("8")))
                        .collect(),
                )?),
            };
            Ok(NamedTensor { name, value })
        })
        .collect()
}

/// The element offsets of a strided view in row-major order.
fn offsets<'a>(
    shape: &'a [usize],
    strides: &'a [usize],
    count: usize,
) -> impl Iterator<Item = usize> + 'a {
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0usize;
    (0..count).map(move |_| {
        let here = offset;
        for axis in (0..index.len()).rev() {
            index[axis] += 1;
            offset += strides[axis];
            if index[axis] < shape[axis] {
                break;
            }
            offset -= strides[axis] * shape[axis];
            index[axis] = 0;
        }
        here
    })
}

/// A named tensor as `(name, dtype, shape, bytes)` for `numpy.frombuffer`.
pub fn to_python(t: &NamedTensor) -> (String, &'static str, Vec<usize>, Vec<u8>) {
    let bytes: Vec<u8> = match &t.value {
        TensorValue::F32(a) => a.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        TensorValue::F64(a) => a.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        TensorValue::I32(a) => a.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        TensorValue::I64(a) => a.iter().flat_map(|v| v.to_ne_bytes()).collect(),
    };
    (
        t.name.clone(),
        t.value.dtype(),
        t.value.shape().to_vec(),
        bytes,
    )
}
