//! A checkpoint file's tensors: safetensors (memory-mapped; F32, F16, BF16, F64, every
//! offset and size checked against the file before a tensor is read) or a NumPy `.npz`
//! archive (float32/float64 arrays, read into memory), served as f32 one tensor at a time;
//! or tensors in memory the caller holds (a live PyTorch module's parameters, read where
//! they are, strided: [`MemoryTensor`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::checkpoint::pytorch;
use crate::error::{one_line, CheckpointError, Error, Result};
use crate::tensor::{
    first_not_finite, transpose_in_strips, F32Sink, NamedTensor, TensorValue, RUN,
};

/// Element types read from checkpoints (all converted to f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE f64 (narrowed to f32).
    F64,
}

impl StoredType {
    /// The stored type of a safetensors dtype, if it is one read here.
    fn of_safetensors(dtype: safetensors::Dtype) -> Option<Self> {
        use safetensors::Dtype;
        match dtype {
            Dtype::F32 => Some(StoredType::F32),
            Dtype::F16 => Some(StoredType::F16),
            Dtype::BF16 => Some(StoredType::BF16),
            Dtype::F64 => Some(StoredType::F64),
            _ => None,
        }
    }

    fn size(self) -> usize {
        match self {
            StoredType::F16 | StoredType::BF16 => 2,
            StoredType::F32 => 4,
            StoredType::F64 => 8,
        }
    }

    /// Little-endian elements of this type, one after the other, as f32 (one loop per type).
    fn decode_all(self, bytes: &[u8]) -> Vec<f32> {
        let mut values = crate::tensor::recycled::zeroed(bytes.len() / self.size());
        self.decode_into(bytes, &mut values);
        values
    }

    /// Decodes the little-endian elements of `bytes` into `out` (as many as it holds):
    /// f32 on a little-endian machine is one copy.
    fn decode_into(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            StoredType::F32 if cfg!(target_endian = "little") => {
                let n = out.len() * 4;
                bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(&bytes[..n])
            }
            StoredType::F32 => {
                for (v, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            StoredType::F16 => {
                for (v, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            StoredType::BF16 => {
                for (v, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            StoredType::F64 => {
                for (v, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                    *v = f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32;
                }
            }
        }
    }

    /// The little-endian `rows × cols` matrix in `bytes`, transposed, as f32: aligned f32
    /// read where it lies, other types decoded a block of rows at a time
    /// ([`crate::tensor::transpose_with`]).
    fn decode_transposed(self, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
        if self == StoredType::F32 && cfg!(target_endian = "little") {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                return crate::tensor::transpose(values, rows, cols);
            }
        }
        let row = cols * self.size();
        crate::tensor::transpose_with(rows, cols, |at, block| {
            self.decode_into(&bytes[at.start * row..at.end * row], block)
        })
    }

    /// One little-endian element of this type (`bytes` holds exactly its size) as f32.
    fn decode(self, bytes: &[u8]) -> f32 {
        match self {
            StoredType::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            StoredType::F16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            StoredType::BF16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            StoredType::F64 => f64::from_le_bytes(bytes.try_into().expect("8 bytes")) as f32,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    /// As the header says; only [`StoredType`]'s are read (the others are refused when
    /// the tensor is asked for, naming it).
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// The bytes of a safetensors file: memory-mapped, or owned (from [`Checkpoint::from_bytes`]).
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Bytes another owner keeps alive for as long as this value lives (a PyTorch tensor's
/// storage, a NumPy array's buffer): the front end that holds them implements it.
pub trait TensorBytes: Send + Sync {
    /// The bytes, from the tensor's first element to its last.
    fn bytes(&self) -> &[u8];
}

impl TensorBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// The element type of a [`MemoryTensor`]: one read as weights, or another (an integer
/// buffer a module registers), refused by name if the model needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// A float type weights are read from.
    Float(StoredType),
    /// Another type, by the front end's name for it (`int64`, `bool`, …).
    Other(String),
}

/// A tensor in memory: element type, shape and strides (in elements, row-major meaning,
/// any non-negative values: a transposed or sliced view is read as it is), over bytes that
/// start at element `[0, …, 0]`.
pub struct MemoryTensor {
    /// Element type.
    pub dtype: MemoryType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Stride of each dimension, in elements.
    pub strides: Vec<usize>,
    /// The bytes the elements are read from.
    pub data: Box<dyn TensorBytes>,
}

impl MemoryTensor {
    /// The element count, or `None` when the shape and strides do not describe a view of
    /// `data` with elements of `size` bytes (a rank mismatch, an element past its end).
    fn count_within(&self, size: usize) -> Option<usize> {
        if self.shape.len() != self.strides.len() {
            return None;
        }
        let count: usize = self
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))?;
        if count == 0 {
            return Some(0);
        }
        let last = self
            .shape
            .iter()
            .zip(&self.strides)
            .try_fold(0usize, |acc, (&d, &s)| {
                acc.checked_add((d - 1).checked_mul(s)?)
            })?;
        (last.checked_add(1)?.checked_mul(size)? <= self.data.bytes().len()).then_some(count)
    }

    /// Whether the strides are the row-major ones of the shape (the elements in order).
    fn row_major(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d > 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// The `count` elements as f32 in row-major order (checked by
    /// [`MemoryTensor::count_within`]): a row-major tensor in one pass over its bytes, a
    /// strided view element by element where it lies.
    fn read(&self, dtype: StoredType, count: usize) -> Vec<f32> {
        let size = dtype.size();
        let bytes = self.data.bytes();
        if self.row_major() {
            return dtype.decode_all(&bytes[..count * size]);
        }
        let mut values = Vec::with_capacity(count);
        let mut index = vec![0usize; self.shape.len()];
        let mut offset = 0usize;
        for _ in 0..count {
            values.push(dtype.decode(&bytes[offset * size..(offset + 1) * size]));
            for axis in (0..index.len()).rev() {
                index[axis] += 1;
                offset += self.strides[axis];
                if index[axis] < self.shape[axis] {
                    break;
                }
                offset -= self.strides[axis] * self.shape[axis];
                index[axis] = 0;
            }
        }
        values
    }
}

/// Where a checkpoint's tensors live.
enum Storage {
    /// A safetensors file (memory-mapped when read from disk).
    Mapped {
        map: Bytes,
        data_start: usize,
        entries: BTreeMap<String, Entry>,
    },
    /// Arrays read from a NumPy `.npz` archive (zip members cannot be mapped).
    Loaded(BTreeMap<String, TensorValue>),
    /// Tensors in memory the caller holds, read where they are.
    Memory(BTreeMap<String, MemoryTensor>),
}

/// A checkpoint: a safetensors file, memory-mapped (tensors are converted one at a time
/// when asked for, never copied whole), or a NumPy `.npz` archive (float32/float64
/// arrays, read into memory).
pub struct Checkpoint {
    path: PathBuf,
    storage: Storage,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Checkpoint({}, {} tensors)",
            self.path.display(),
            self.keys().count()
        )
    }
}

impl Checkpoint {
    /// Opens a checkpoint, recognized by its first bytes: a zip archive is read as `.npz`,
    /// anything else as safetensors (header, offsets and sizes are checked against the
    /// file length before any tensor is read).
    pub fn open(path: &Path) -> Result<Self> {
        let mut magic = [0u8; pytorch::LEGACY_MAGIC.len()];
        let got = File::open(path)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
            .unwrap_or(0);
        if magic[..got].starts_with(b"PK\x03\x04") {
            let file = File::open(path).map_err(|e| Error::io(path, e))?;
            let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
            let arrays = read_zip(std::io::BufReader::new(file), len, path)?;
            return Ok(Self::from_arrays(path, arrays));
        }
        if pytorch::is_legacy(&magic[..got]) {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            let what = path.display().to_string();
            return Ok(Self::from_arrays(
                path,
                pytorch::read_legacy(&bytes, &what)?,
            ));
        }
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_meta = file.metadata().map_err(|e| Error::io(path, e))?;
        let len = file_meta.len();
        if file_meta.is_dir() {
            return Err(Error::Checkpoint(CheckpointError::NotACheckpoint(format!(
                "{} is a directory, not a checkpoint file",
                path.display()
            ))));
        }
        if len < 8 {
            return Err(too_short(path, len));
        }
        // SAFETY: the map is read-only; a file truncated by another process while mapped
        // would fault, as with any reader of a file that changes underneath it.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::from_safetensors(path, Bytes::Mapped(map))
    }

    /// Reads a checkpoint held in memory (same recognition and checks as [`Checkpoint::open`]);
    /// `label` names it in messages.
    pub fn from_bytes(label: &Path, bytes: Vec<u8>) -> Result<Self> {
        if bytes.starts_with(b"PK\x03\x04") {
            let len = bytes.len() as u64;
            let arrays = read_zip(std::io::Cursor::new(bytes), len, label)?;
            return Ok(Self::from_arrays(label, arrays));
        }
        if pytorch::is_legacy(&bytes) {
            let what = label.display().to_string();
            return Ok(Self::from_arrays(
                label,
                pytorch::read_legacy(&bytes, &what)?,
            ));
        }
        if bytes.len() < 8 {
            return Err(too_short(label, bytes.len() as u64));
        }
        Self::from_safetensors(label, Bytes::Owned(bytes))
    }

    /// A checkpoint of tensors in memory (a live module's state dict), read where they are
    /// when a tensor is asked for; `label` names it in messages and in the file's
    /// provenance (`module g_mlp_pytorch.g_mlp_pytorch.gMLP`).
    pub fn from_memory(label: &str, tensors: Vec<(String, MemoryTensor)>) -> Result<Self> {
        if tensors.is_empty() {
            return Err(CheckpointError::Missing(format!("{label}: it holds no tensor")).into());
        }
        let mut map = BTreeMap::new();
        for (name, tensor) in tensors {
            if map.contains_key(&name) {
                return Err(
                    CheckpointError::Damaged(format!("{label}: two tensors named {name}")).into(),
                );
            }
            map.insert(name, tensor);
        }
        Ok(Checkpoint {
            path: PathBuf::from(label),
            storage: Storage::Memory(map),
            metadata: BTreeMap::new(),
        })
    }

    fn from_arrays(path: &Path, arrays: Vec<NamedTensor>) -> Self {
        Checkpoint {
            path: path.to_path_buf(),
            storage: Storage::Loaded(arrays.into_iter().map(|t| (t.name, t.value)).collect()),
            metadata: BTreeMap::new(),
        }
    }

    fn from_safetensors(path: &Path, map: Bytes) -> Result<Self> {
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| safetensors_refusal(path, &e, &map))?;
        let mut entries = BTreeMap::new();
        for (name, info) in meta.tensors() {
            entries.insert(
                name.clone(),
                Entry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: info.data_offsets.0,
                    end: info.data_offsets.1,
                },
            );
        }
        if entries.is_empty() {
            return Err(CheckpointError::Missing(format!(
                "{}: the file holds no tensor",
                path.display()
            ))
            .into());
        }
        let metadata = meta
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        Ok(Checkpoint {
            path: path.to_path_buf(),
            storage: Storage::Mapped {
                map,
                data_start: 8 + header_len,
                entries,
            },
            metadata,
        })
    }

    /// The file this checkpoint was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names, sorted.
    pub fn keys(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match &self.storage {
            Storage::Mapped { entries, .. } => Box::new(entries.keys().map(String::as_str)),
            Storage::Loaded(arrays) => Box::new(arrays.keys().map(String::as_str)),
            Storage::Memory(tensors) => Box::new(tensors.keys().map(String::as_str)),
        }
    }

    /// True if a tensor of that name exists.
    pub fn contains(&self, key: &str) -> bool {
        self.shape(key).is_some()
    }

    /// The stored shape of a tensor.
    pub fn shape(&self, key: &str) -> Option<&[usize]> {
        match &self.storage {
            Storage::Mapped { entries, .. } => entries.get(key).map(|e| e.shape.as_slice()),
            Storage::Loaded(arrays) => arrays.get(key).map(|v| v.shape()),
            Storage::Memory(tensors) => tensors.get(key).map(|t| t.shape.as_slice()),
        }
    }

    /// A string of the file's `__metadata__` (safetensors only).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    /// The tensor's values as f32, row-major; refuses unsupported types and non-finite
    /// values, naming the tensor.
    pub fn f32(&self, key: &str) -> Result<Vec<f32>> {
        let missing =
            || CheckpointError::Missing(format!("{}: no tensor {key}", self.path.display()));
        let values: Vec<f32> = match &self.storage {
            Storage::Loaded(arrays) => match arrays.get(key).ok_or_else(missing)? {
                TensorValue::F32(a) => a.iter().copied().collect(),
                TensorValue::F64(a) => a.iter().map(|&v| v as f32).collect(),
                other => {
                    return Err(CheckpointError::ElementType(format!(
                        "{key}: element type {} is not supported for weights (float32, float64)",
                        other.dtype()
                    ))
                    .into())
                }
            },
            Storage::Memory(tensors) => {
                let tensor = tensors.get(key).ok_or_else(missing)?;
                let dtype = match &tensor.dtype {
                    MemoryType::Float(t) => *t,
                    MemoryType::Other(name) => {
                        return Err(CheckpointError::ElementType(format!(
                            "{key}: element type {name} is not supported for weights (float32, float16, bfloat16, float64)"
                        ))
                        .into())
                    }
                };
                let count = tensor.count_within(dtype.size()).ok_or_else(|| {
                    CheckpointError::Damaged(format!(
                        "{key}: shape {:?} with strides {:?} does not fit its {} bytes",
                        tensor.shape,
                        tensor.strides,
                        tensor.data.bytes().len()
                    ))
                })?;
                tensor.read(dtype, count)
            }
            Storage::Mapped {
                map,
                data_start,
                entries,
            } => {
                let entry = entries.get(key).ok_or_else(missing)?;
                let dtype = StoredType::of_safetensors(entry.dtype).ok_or_else(|| {
                    CheckpointError::ElementType(format!(
                        "{key}: element type {:?} is not supported (F32, F16, BF16, F64)",
                        entry.dtype
                    ))
                })?;
                let bytes = &map[data_start + entry.start..data_start + entry.end];
                let count: usize = entry.shape.iter().product();
                if bytes.len() != count * dtype.size() {
                    return Err(CheckpointError::Damaged(format!(
                        "{key}: {} bytes for shape {:?} of {dtype:?}",
                        bytes.len(),
                        entry.shape
                    ))
                    .into());
                }
                dtype.decode_all(bytes)
            }
        };
        if let Some(k) = crate::tensor::first_not_finite(&values) {
            return Err(Error::NotFinite(format!(
                "{key}: value {} at flat index {k} is not finite",
                values[k]
            )));
        }
        Ok(values)
    }
}

impl Checkpoint {
    /// A 2-D tensor `[rows, cols]` as f32, transposed to `[cols, rows]` (a PyTorch
    /// `Linear.weight` as the graph's `[in, out]`): read from its stored bytes in one tiled
    /// pass where they are row-major (safetensors, a contiguous tensor in memory), else
    /// read as [`Checkpoint::f32`] does and transposed; refuses what `f32` refuses.
    pub fn f32_transposed(&self, key: &str) -> Result<Vec<f32>> {
        let rows = match self.shape(key).unwrap_or(&[]) {
            &[rows, _] => rows,
            _ => 0,
        };
        self.f32_transposed_rows(key, 0, rows)
    }

    /// Rows `[start, end)` of the 2-D tensor `key` `[rows, cols]`, transposed to
    /// `[cols, end - start]` (columns of the graph's `[in, out]`): only those rows are
    /// read; refuses what [`Checkpoint::f32_transposed`] refuses, and rows outside the tensor.
    pub fn f32_transposed_rows(&self, key: &str, start: usize, end: usize) -> Result<Vec<f32>> {
        let shape = self.shape(key).unwrap_or(&[]);
        let &[rows, cols] = shape else {
            return Err(Error::BadTensor(format!(
                "{key}: expected a 2-D weight, got {shape:?}"
            )));
        };
        if start > end || end > rows {
            return Err(Error::BadTensor(format!(
                "{key}: rows {start}..{end} of a [{rows}, {cols}] weight"
            )));
        }
        let direct = self.in_place(key);
        let Some((dtype, bytes)) = direct else {
            let all = self.f32(key)?;
            let part = &all[start * cols..end * cols];
            return Ok(crate::tensor::transpose(part, end - start, cols));
        };
        let row = cols * dtype.size();
        let values = dtype.decode_transposed(&bytes[start * row..end * row], end - start, cols);
        if crate::tensor::first_not_finite(&values).is_some() {
            // `f32` names the first value that is not finite in the stored order.
            self.f32(key)?;
        }
        Ok(values)
    }
}

impl Checkpoint {
    /// The stored type and bytes of `key` where its elements lie in place in row-major
    /// order (a safetensors tensor of a read type, a row-major float tensor in memory),
    /// exactly as many bytes as its shape needs; `None` for the others.
    fn in_place(&self, key: &str) -> Option<(StoredType, &[u8])> {
        match &self.storage {
            Storage::Mapped {
                map,
                data_start,
                entries,
            } => entries.get(key).and_then(|entry| {
                let dtype = StoredType::of_safetensors(entry.dtype)?;
                let bytes = &map[data_start + entry.start..data_start + entry.end];
                let count: usize = entry.shape.iter().product();
                (bytes.len() == count * dtype.size()).then_some((dtype, bytes))
            }),
            Storage::Memory(tensors) => tensors.get(key).and_then(|tensor| {
                let MemoryType::Float(dtype) = tensor.dtype else {
                    return None;
                };
                let count = tensor.count_within(dtype.size())?;
                let bytes = tensor.data.bytes();
                tensor
                    .row_major()
                    .then(|| (dtype, &bytes[..count * dtype.size()]))
            }),
            Storage::Loaded(_) => None,
        }
    }

    /// The refusal of `key` once a value of it was found not finite: [`Checkpoint::f32`]'s,
    /// which names the first such value in the stored order.
    fn not_finite(&self, key: &str) -> Error {
        match self.f32(key) {
            Err(e) => e,
            Ok(_) => Error::Internal(format!(
                "{key}: a value was read as not finite, then as finite"
            )),
        }
    }

    /// `key`'s values as f32, row-major, handed to `sink` a run at a time
    /// ([`crate::tensor::RUN`]): read in place where they lie (aligned f32 lent as it is,
    /// other types decoded a run at a time), else as [`Checkpoint::f32`] reads them; refuses
    /// what `f32` refuses.
    pub fn stream_f32(&self, key: &str, sink: &mut F32Sink<'_>) -> Result<()> {
        let Some((dtype, bytes)) = self.in_place(key) else {
            return sink(Cow::Owned(self.f32(key)?));
        };
        let checked = |run: &[f32]| match first_not_finite(run) {
            Some(_) => Err(self.not_finite(key)),
            None => Ok(()),
        };
        if dtype == StoredType::F32 && cfg!(target_endian = "little") {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                for run in values.chunks(RUN) {
                    checked(run)?;
                    sink(Cow::Borrowed(run))?;
                }
                return Ok(());
            }
        }
        let size = dtype.size();
        let mut buf = vec![0f32; RUN.min(bytes.len() / size)];
        for part in bytes.chunks(RUN * size) {
            let run = &mut buf[..part.len() / size];
            dtype.decode_into(part, run);
            checked(run)?;
            sink(Cow::Borrowed(run))?;
        }
        Ok(())
    }

    /// [`Checkpoint::f32_transposed_rows`] handed to `sink` a strip at a time
    /// ([`crate::tensor::transpose_in_strips`]): read in place where the tensor lies in
    /// row-major order, never through a buffer of the whole; refuses what
    /// `f32_transposed_rows` refuses.
    pub fn stream_transposed_rows(
        &self,
        key: &str,
        (start, end): (usize, usize),
        sink: &mut F32Sink<'_>,
    ) -> Result<()> {
        let (dtype, bytes, cols) = match (self.shape(key), self.in_place(key)) {
            (Some(&[rows, cols]), Some((dtype, bytes))) if start <= end && end <= rows => {
                (dtype, bytes, cols)
            }
            // Refusals and tensors read otherwise are `f32_transposed_rows`' own.
            _ => return sink(Cow::Owned(self.f32_transposed_rows(key, start, end)?)),
        };
        let size = dtype.size();
        let row = cols * size;
        let bytes = &bytes[start * row..end * row];
        let mut checked = |run: Cow<'_, [f32]>| match first_not_finite(&run) {
            Some(_) => Err(self.not_finite(key)),
            None => sink(run),
        };
        let rows = end - start;
        if dtype == StoredType::F32 && cfg!(target_endian = "little") {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                let read = |r: usize, at: std::ops::Range<usize>, part: &mut [f32]| {
                    part.copy_from_slice(&values[r * cols + at.start..r * cols + at.end])
                };
                return transpose_in_strips(rows, cols, read, &mut checked);
            }
        }
        let read = |r: usize, at: std::ops::Range<usize>, part: &mut [f32]| {
            dtype.decode_into(&bytes[r * row + at.start * size..], part)
        };
        transpose_in_strips(rows, cols, read, &mut checked)
    }
}

/// Reads a zip checkpoint: a torch archive (`NAME/data.pkl`) or else an `.npz`.
fn read_zip<R: std::io::Read + std::io::Seek>(
    reader: R,
    len: u64,
    path: &Path,
) -> Result<Vec<NamedTensor>> {
    let what = path.display().to_string();
    let mut archive = crate::archive::ZipArchive::new(reader, len).map_err(|e| {
        Error::BadTensor(format!(
            "{what}: not a readable zip archive (PyTorch or .npz) ({})",
            one_line(e)
        ))
    })?;
    if pytorch::torch_record(&archive).is_some() {
        return pytorch::read_torch_zip(&mut archive, &what);
    }
    crate::npz::read_npz_archive(&mut archive, &what)
}

/// Why `bytes` (at least 8 of them) could not be read as safetensors, in words, with the
/// safetensors crate's name for the problem after them. A header that is not one (its
/// length past the file, text that is not a safetensors header's JSON) means no checkpoint
/// this tool reads; a header that does not fit the data after it means a damaged file.
fn safetensors_refusal(path: &Path, e: &safetensors::SafeTensorError, bytes: &[u8]) -> Error {
    use safetensors::SafeTensorError as E;
    let mut length = [0u8; 8];
    length.copy_from_slice(&bytes[..8]);
    let (n, len) = (u64::from_le_bytes(length), bytes.len());
    let (damaged, reason) = match e {
        E::HeaderTooLarge => (
            false,
            format!("its first 8 bytes give a header of {n} bytes, over the 100 MB safetensors allows"),
        ),
        E::HeaderTooSmall | E::InvalidHeaderLength => (
            false,
            format!("its first 8 bytes give a header of {n} bytes, past the end of the {len}-byte file"),
        ),
        E::InvalidHeader(_) => (false, "its header is not UTF-8 text".to_string()),
        E::InvalidHeaderStart => (false, "its header does not start with '{'".to_string()),
        E::InvalidHeaderDeserialization(json) => (
            false,
            format!("its header is not a safetensors header's JSON: {json}"),
        ),
        E::MetadataIncompleteBuffer => (
            true,
            format!(
                "the tensors' data does not end where the {len}-byte file does: it was cut short or has bytes added"
            ),
        ),
        E::InvalidOffset(name) => (
            true,
            format!(
                "the data offsets of tensor {name} are out of order: each tensor's data must start where the one before it ends, the first at 0"
            ),
        ),
        E::TensorInvalidInfo => (
            true,
            "a tensor's data offsets do not span its shape times its element size".to_string(),
        ),
        E::ValidationOverflow => (
            true,
            "a tensor's shape has more elements than can be counted".to_string(),
        ),
        E::MisalignedSlice => (
            true,
            "a tensor of sub-byte elements does not end on a byte boundary".to_string(),
        ),
        other => (true, other.to_string()),
    };
    // The variant's name alone: its fields (a JSON or UTF-8 error) are said above.
    let debug = format!("{e:?}");
    let name = debug.split('(').next().unwrap_or_default();
    let reason = one_line(reason);
    let path = path.display();
    if damaged {
        CheckpointError::Damaged(format!(
            "{path}: a damaged safetensors file: {reason} (safetensors crate: {name})"
        ))
    } else {
        CheckpointError::NotACheckpoint(format!(
            "{path}: not a safetensors file, PyTorch zip archive, legacy PyTorch file or .npz archive (read as safetensors, {reason}; safetensors crate: {name})"
        ))
    }
    .into()
}

fn too_short(path: &Path, len: u64) -> Error {
    CheckpointError::NotACheckpoint(format!(
        "{}: {len} bytes is too short for a safetensors file, PyTorch file or .npz archive",
        path.display()
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_of_each_read_type_convert_and_others_are_refused_by_name() {
        use safetensors::tensor::TensorView;
        use safetensors::Dtype;
        let halves: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let ints: Vec<u8> = [3i32, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = [
            ("h", TensorView::new(Dtype::F16, vec![2], &halves).unwrap()),
            ("i", TensorView::new(Dtype::I32, vec![2], &ints).unwrap()),
        ];
        let bytes = safetensors::serialize(views, None).unwrap();
        let checkpoint = Checkpoint::from_bytes(Path::new("t.safetensors"), bytes).unwrap();
        assert_eq!(checkpoint.f32("h").unwrap(), [1.5, -2.0]);
        let e = checkpoint.f32("i").unwrap_err();
        assert!(
            matches!(e, Error::Checkpoint(CheckpointError::ElementType(_))),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "i: element type I32 is not supported (F32, F16, BF16, F64)"
        );
    }
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    fn tensor(
        dtype: MemoryType,
        shape: &[usize],
        strides: &[usize],
        bytes: Vec<u8>,
    ) -> MemoryTensor {
        MemoryTensor {
            dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            data: Box::new(bytes),
        }
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A transposed view (strides [1, 3] over a 3×2 row-major buffer read as 2×3) is read
    /// in its own row-major order, as `t.contiguous()` would give; bf16 and a zero-size
    /// tensor too; an integer buffer is kept by name and refused when read.
    #[test]
    fn memory_tensors_are_read_where_they_are_in_their_own_order() {
        let buffer = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0]; // [[0,1],[2,3],[4,5]]
        let halves: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let checkpoint = Checkpoint::from_memory(
            "module m.M",
            vec![
                (
                    "t".into(),
                    tensor(
                        MemoryType::Float(StoredType::F32),
                        &[2, 3],
                        &[1, 2],
                        f32_bytes(&buffer),
                    ),
                ),
                (
                    "b".into(),
                    tensor(MemoryType::Float(StoredType::BF16), &[2], &[1], halves),
                ),
                (
                    "e".into(),
                    tensor(
                        MemoryType::Float(StoredType::F32),
                        &[0, 4],
                        &[4, 1],
                        Vec::new(),
                    ),
                ),
                (
                    "i".into(),
                    tensor(MemoryType::Other("int64".into()), &[1], &[1], vec![0; 8]),
                ),
            ],
        )
        .unwrap();
        assert_eq!(checkpoint.keys().collect::<Vec<_>>(), ["b", "e", "i", "t"]);
        assert_eq!(checkpoint.shape("t"), Some(&[2, 3][..]));
        assert_eq!(checkpoint.f32("t").unwrap(), [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
        assert_eq!(checkpoint.f32("b").unwrap(), [1.5, -2.0]);
        assert!(checkpoint.f32("e").unwrap().is_empty());
        let e = checkpoint.f32("i").unwrap_err();
        assert!(
            matches!(e, Error::Checkpoint(CheckpointError::ElementType(_))),
            "{e:?}"
        );
    }

    /// Streamed, every memory tensor gives the values `f32` gives (and a 2-D one those of
    /// `f32_transposed_rows`): row-major ones read in place, a broadcast one (stride 0 over
    /// one element) and a transposed view read as they are.
    #[test]
    fn streamed_memory_tensors_give_what_they_give_whole() {
        let buffer: Vec<f32> = (0..6).map(|k| k as f32 - 2.5).collect();
        let halves: Vec<u8> = buffer
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let f32_tensor = |shape: &[usize], strides: &[usize], values: &[f32]| {
            tensor(
                MemoryType::Float(StoredType::F32),
                shape,
                strides,
                f32_bytes(values),
            )
        };
        let checkpoint = Checkpoint::from_memory(
            "module m.M",
            vec![
                ("rows".into(), f32_tensor(&[3, 2], &[2, 1], &buffer)),
                ("view".into(), f32_tensor(&[2, 3], &[1, 2], &buffer)),
                ("broadcast".into(), f32_tensor(&[4], &[0], &[0.75])),
                (
                    "halves".into(),
                    tensor(
                        MemoryType::Float(StoredType::BF16),
                        &[2, 3],
                        &[3, 1],
                        halves,
                    ),
                ),
            ],
        )
        .unwrap();
        let collect = |stream: &dyn Fn(&mut F32Sink<'_>) -> Result<()>| {
            let mut all = Vec::new();
            stream(&mut |run| {
                all.extend_from_slice(&run);
                Ok(())
            })
            .unwrap();
            all
        };
        for key in ["rows", "view", "broadcast", "halves"] {
            let streamed = collect(&|sink| checkpoint.stream_f32(key, sink));
            assert_eq!(streamed, checkpoint.f32(key).unwrap(), "{key}");
        }
        for key in ["rows", "view", "halves"] {
            let rows = checkpoint.shape(key).unwrap()[0];
            for (start, end) in [(0, rows), (1, rows)] {
                let streamed =
                    collect(&|sink| checkpoint.stream_transposed_rows(key, (start, end), sink));
                let whole = checkpoint.f32_transposed_rows(key, start, end).unwrap();
                assert_eq!(streamed, whole, "{key} rows {start}..{end}");
            }
        }
    }

    /// Shapes and strides that reach past the bytes, or of another rank, are refused as a
    /// damaged tensor, never read out of bounds.
    #[test]
    fn a_view_past_its_bytes_is_refused() {
        let checkpoint = Checkpoint::from_memory(
            "state dict",
            vec![
                (
                    "long".into(),
                    tensor(
                        MemoryType::Float(StoredType::F32),
                        &[2, 3],
                        &[3, 1],
                        f32_bytes(&[0.0; 5]),
                    ),
                ),
                (
                    "rank".into(),
                    tensor(
                        MemoryType::Float(StoredType::F32),
                        &[2],
                        &[1, 1],
                        f32_bytes(&[0.0; 2]),
                    ),
                ),
                (
                    "huge".into(),
                    tensor(
                        MemoryType::Float(StoredType::F32),
                        &[2],
                        &[usize::MAX],
                        f32_bytes(&[0.0; 2]),
                    ),
                ),
            ],
        )
        .unwrap();
        for key in ["long", "rank", "huge"] {
            let e = checkpoint.f32(key).unwrap_err();
            assert!(
                matches!(e, Error::Checkpoint(CheckpointError::Damaged(_))),
                "{key}: {e:?}"
            );
        }
        let empty = Checkpoint::from_memory("state dict", Vec::new()).unwrap_err();
        assert!(matches!(
            empty,
            Error::Checkpoint(CheckpointError::Missing(_))
        ));
    }
}

#[cfg(test)]
mod transposed_tests {
    use super::*;

    /// A 2-D weight read transposed from safetensors bytes (f32 and bf16) and from a
    /// strided tensor in memory equals the transpose of what `f32` reads, and a NaN is
    /// refused as `f32` refuses it.
    #[test]
    fn a_weight_read_transposed_is_the_transpose_of_its_values() {
        use safetensors::tensor::TensorView;
        use safetensors::Dtype;
        let (rows, cols) = (33, 70);
        let values: Vec<f32> = (0..rows * cols).map(|k| (k as f32 * 0.37).sin()).collect();
        let f32s: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf16s: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let mut nan = values.clone();
        nan[5] = f32::NAN;
        let nans: Vec<u8> = nan.iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = [
            (
                "w",
                TensorView::new(Dtype::F32, vec![rows, cols], &f32s).unwrap(),
            ),
            (
                "b",
                TensorView::new(Dtype::BF16, vec![rows, cols], &bf16s).unwrap(),
            ),
            (
                "n",
                TensorView::new(Dtype::F32, vec![rows, cols], &nans).unwrap(),
            ),
        ];
        let bytes = safetensors::serialize(views, None).unwrap();
        let file = Checkpoint::from_bytes(Path::new("t.safetensors"), bytes).unwrap();
        for key in ["w", "b"] {
            let plain = crate::tensor::transpose(&file.f32(key).unwrap(), rows, cols);
            assert_eq!(file.f32_transposed(key).unwrap(), plain, "{key}");
        }
        let e = file.f32_transposed("n").unwrap_err();
        assert_eq!(e.to_string(), file.f32("n").unwrap_err().to_string());
        // In memory: the same values as a transposed view of their transpose.
        let t = crate::tensor::transpose(&values, rows, cols);
        let memory = Checkpoint::from_memory(
            "state dict",
            vec![(
                "v".into(),
                MemoryTensor {
                    dtype: MemoryType::Float(StoredType::F32),
                    shape: vec![rows, cols],
                    strides: vec![1, rows],
                    data: Box::new(t.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()),
                },
            )],
        )
        .unwrap();
        assert_eq!(
            memory.f32_transposed("v").unwrap(),
            crate::tensor::transpose(&values, rows, cols)
        );
    }
}
