//! Trained checkpoints: reading tensors from safetensors files (memory-mapped; F32, F16,
//! BF16, F64), NumPy `.npz` archives and PyTorch `torch.save` files ([`pytorch`]), recognizing the layout (timm, g-mlp-pytorch, native), inferring the
//! architecture from names and shapes, and serving the values as a [`WeightSource`].
//!
//! Every tensor the model needs is checked by name and shape before anything is written;
//! values (NaN/Inf, Toeplitz structure) are checked as each tensor is produced.

mod formats;
mod pickle;
pub mod pytorch;
mod spatial;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

pub use formats::{plan, Format, ImportHints};

use crate::error::{one_line, Error, Result};
use crate::gmlp::config::GmlpConfig;
use crate::gmlp::weights::{param_specs, ParamSpec, WeightSource};

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
    fn size(self) -> usize {
        match self {
            StoredType::F16 | StoredType::BF16 => 2,
            StoredType::F32 => 4,
            StoredType::F64 => 8,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    dtype: Result<StoredType, String>,
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

/// Where a checkpoint's tensors live.
enum Storage {
    /// A safetensors file (memory-mapped when read from disk).
    Mapped {
        map: Bytes,
        data_start: usize,
        entries: BTreeMap<String, Entry>,
    },
    /// Arrays read from a NumPy `.npz` archive (zip members cannot be mapped).
    Loaded(BTreeMap<String, crate::runtime::TensorValue>),
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
            return Err(Error::InvalidArgument(format!(
                "{} is a directory, not a checkpoint file",
                path.display()
            )));
        }
        if len < 8 {
            return Err(too_short(path, len));
        }
        // SAFETY: the map is read-only; a file truncated by another process while mapped
        // would fault, as with any reader of a file that changes underneath it.
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

    fn from_arrays(path: &Path, arrays: Vec<crate::runtime::NamedTensor>) -> Self {
        Checkpoint {
            path: path.to_path_buf(),
            storage: Storage::Loaded(arrays.into_iter().map(|t| (t.name, t.value)).collect()),
            metadata: BTreeMap::new(),
        }
    }

    fn from_safetensors(path: &Path, map: Bytes) -> Result<Self> {
        let bad = |reason: String| Error::BadTensor(format!("{}: {reason}", path.display()));
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
            bad(format!(
                "not a valid safetensors file ({})",
                one_line(format!("{e:?}"))
            ))
        })?;
        let mut entries = BTreeMap::new();
        for (name, info) in meta.tensors() {
            use safetensors::Dtype;
            let dtype = match info.dtype {
                Dtype::F32 => Ok(StoredType::F32),
                Dtype::F16 => Ok(StoredType::F16),
                Dtype::BF16 => Ok(StoredType::BF16),
                Dtype::F64 => Ok(StoredType::F64),
                other => Err(format!("{other:?}")),
            };
            entries.insert(
                name.clone(),
                Entry {
                    dtype,
                    shape: info.shape.clone(),
                    start: info.data_offsets.0,
                    end: info.data_offsets.1,
                },
            );
        }
        if entries.is_empty() {
            return Err(bad("the file holds no tensor".into()));
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
        }
    }

    /// A string of the file's `__metadata__` (safetensors only).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    /// The tensor's values as f32, row-major; refuses unsupported types and non-finite
    /// values, naming the tensor.
    pub fn f32(&self, key: &str) -> Result<Vec<f32>> {
        let missing = || Error::BadTensor(format!("{}: no tensor {key}", self.path.display()));
        let values: Vec<f32> = match &self.storage {
            Storage::Loaded(arrays) => {
                use crate::runtime::TensorValue;
                match arrays.get(key).ok_or_else(missing)? {
                    TensorValue::F32(a) => a.iter().copied().collect(),
                    TensorValue::F64(a) => a.iter().map(|&v| v as f32).collect(),
                    other => {
                        return Err(Error::BadTensor(format!(
                        "{key}: element type {} is not supported for weights (float32, float64)",
                        other.dtype()
                    )))
                    }
                }
            }
            Storage::Mapped {
                map,
                data_start,
                entries,
            } => {
                let entry = entries.get(key).ok_or_else(missing)?;
                let dtype = entry.dtype.clone().map_err(|t| {
                    Error::BadTensor(format!(
                        "{key}: element type {t} is not supported (F32, F16, BF16, F64)"
                    ))
                })?;
                let bytes = &map[data_start + entry.start..data_start + entry.end];
                let count: usize = entry.shape.iter().product();
                if bytes.len() != count * dtype.size() {
                    return Err(Error::BadTensor(format!(
                        "{key}: {} bytes for shape {:?} of {dtype:?}",
                        bytes.len(),
                        entry.shape
                    )));
                }
                match dtype {
                    StoredType::F32 => bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                    StoredType::F16 => bytes
                        .chunks_exact(2)
                        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                        .collect(),
                    StoredType::BF16 => bytes
                        .chunks_exact(2)
                        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                        .collect(),
                    StoredType::F64 => bytes
                        .chunks_exact(8)
                        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                        .collect(),
                }
            }
        };
        if let Some(k) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::BadTensor(format!(
                "{key}: value {} at flat index {k} is not finite",
                values[k]
            )));
        }
        Ok(values)
    }
}

/// Reads a zip checkpoint: a torch archive (`NAME/data.pkl`) or else an `.npz`.
fn read_zip<R: std::io::Read + std::io::Seek>(
    reader: R,
    len: u64,
    path: &Path,
) -> Result<Vec<crate::runtime::NamedTensor>> {
    let what = path.display().to_string();
    let mut archive = match zip::ZipArchive::new(reader) {
        Ok(a) => a,
        Err(e) => {
            return Err(Error::BadTensor(format!(
                "{what}: not a readable zip archive (torch or .npz) ({})",
                one_line(e)
            )))
        }
    };
    if pytorch::torch_record(&archive).is_some() {
        return pytorch::read_torch_zip(&mut archive, len, &what);
    }
    crate::npz::read_npz_from(archive.into_inner(), len, &what)
}

fn too_short(path: &Path, len: u64) -> Error {
    Error::BadTensor(format!(
        "{}: {len} bytes is too short for a safetensors file",
        path.display()
    ))
}

/// How one native parameter is made from checkpoint tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// The tensor's values unchanged (the shapes may differ only by reshaping).
    Same(String),
    /// A 2-D PyTorch `Linear.weight [out, in]` transposed to `[in, out]`.
    Transposed(String),
    /// A spatial weight, in the stored form, converted to the configured one.
    Spatial(spatial::StoredSpatial),
}

/// A checkpoint with its architecture and the rule for each native parameter.
#[derive(Debug)]
pub struct Import {
    /// The recognized layout.
    pub format: Format,
    /// The architecture read from the checkpoint (and the hints).
    pub config: GmlpConfig,
    /// The checkpoint.
    pub checkpoint: Arc<Checkpoint>,
    /// Native parameter name → rule.
    pub rules: BTreeMap<String, Rule>,
    /// Checkpoint tensors no rule uses (allowed only with `allow_unused`).
    pub unused: Vec<String>,
    /// Relative tolerance for accepting a dense W as Toeplitz.
    pub toeplitz_tolerance: f32,
}

/// Default relative tolerance (of max|W|) for accepting a dense W as Toeplitz.
pub const TOEPLITZ_TOLERANCE: f32 = 1e-5;

impl Import {
    /// Reads `path`, recognizes its layout (or uses `format`), infers the architecture,
    /// and checks every tensor name and shape.
    pub fn open(path: &Path, hints: &ImportHints) -> Result<Import> {
        Self::from_checkpoint(Checkpoint::open(path)?, hints)
    }

    /// Recognizes and checks an already opened checkpoint, as [`Import::open`] does.
    pub fn from_checkpoint(checkpoint: Checkpoint, hints: &ImportHints) -> Result<Import> {
        let checkpoint = Arc::new(checkpoint);
        let path = checkpoint.path().to_path_buf();
        let (format, config, rules) = plan(&checkpoint, hints)?;
        let mut used = std::collections::BTreeSet::new();
        for rule in rules.values() {
            match rule {
                Rule::Same(k) | Rule::Transposed(k) => {
                    used.insert(k.clone());
                }
                Rule::Spatial(s) => used.extend(s.keys()),
            }
        }
        let unused: Vec<String> = checkpoint
            .keys()
            .filter(|k| !used.contains(*k))
            .map(str::to_string)
            .collect();
        if !unused.is_empty() && !hints.allow_unused {
            let shown: Vec<&str> = unused.iter().take(5).map(String::as_str).collect();
            return Err(Error::BadTensor(format!(
                "{}: {} unexpected tensor(s) for a {} checkpoint: {}{} (pass --allow-unused to skip them knowingly)",
                path.display(),
                unused.len(),
                format.name(),
                shown.join(", "),
                if unused.len() > 5 { ", ..." } else { "" }
            )));
        }
        Ok(Import {
            format,
            config,
            checkpoint,
            rules,
            unused,
            toeplitz_tolerance: hints.toeplitz_tolerance,
        })
    }

    /// A [`WeightSource`] serving this checkpoint's values for `config` (the imported
    /// architecture, possibly with another spatial form).
    pub fn weights(&self, config: &GmlpConfig) -> ImportedWeights {
        ImportedWeights {
            checkpoint: self.checkpoint.clone(),
            rules: self.rules.clone(),
            config: config.clone(),
            toeplitz_tolerance: self.toeplitz_tolerance,
        }
    }
}

/// Parameter values taken from a checkpoint by the rules of an [`Import`].
pub struct ImportedWeights {
    checkpoint: Arc<Checkpoint>,
    rules: BTreeMap<String, Rule>,
    config: GmlpConfig,
    toeplitz_tolerance: f32,
}

fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

impl WeightSource for ImportedWeights {
    fn values(&self, spec: &ParamSpec) -> Result<Vec<f32>> {
        let rule = self.rules.get(&spec.name).ok_or_else(|| {
            Error::BadTensor(format!("no checkpoint tensor is mapped to {}", spec.name))
        })?;
        let ck = &self.checkpoint;
        let values = match rule {
            Rule::Same(key) => ck.f32(key)?,
            Rule::Transposed(key) => {
                let shape = ck.shape(key).unwrap_or(&[]);
                let [rows, cols] = shape else {
                    return Err(Error::BadTensor(format!(
                        "{key}: expected a 2-D weight, got {shape:?}"
                    )));
                };
                transpose(&ck.f32(key)?, *rows, *cols)
            }
            Rule::Spatial(stored) => {
                stored.values(ck, &self.config, &spec.name, self.toeplitz_tolerance)?
            }
        };
        if values.len() != spec.len() {
            return Err(Error::BadTensor(format!(
                "{}: the checkpoint gives {} values, the model needs {:?}",
                spec.name,
                values.len(),
                spec.shape
            )));
        }
        Ok(values)
    }
}

/// Metadata key of the configuration in native safetensors files.
pub const NATIVE_CONFIG_KEY: &str = "gmlp_onnx.config";

/// Writes every parameter of `config` from `source` as a native-layout safetensors file
/// (f32, the configuration as JSON in `__metadata__`), streaming one tensor at a time,
/// atomically.
pub fn save_native(path: &Path, config: &GmlpConfig, source: &dyn WeightSource) -> Result<()> {
    let specs = param_specs(config);
    let mut header = serde_json::Map::new();
    let config_json = serde_json::to_string(config)
        .map_err(|e| Error::InvalidConfig(format!("config to JSON: {e}")))?;
    header.insert(
        "__metadata__".into(),
        serde_json::json!({ NATIVE_CONFIG_KEY: config_json, "format": "gmlp-onnx native" }),
    );
    let mut offset = 0usize;
    for spec in &specs {
        let bytes = spec.len() * 4;
        header.insert(
            spec.name.clone(),
            serde_json::json!({"dtype": "F32", "shape": spec.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_string(&header)
        .map_err(|e| Error::InvalidConfig(format!("safetensors header: {e}")))?;
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    crate::model_io::write_atomically(path, |w: &mut BufWriter<File>| {
        let io = |e: std::io::Error| Error::io(path, e);
        w.write_all(&(text.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.write_all(text.as_bytes()).map_err(io)?;
        for spec in &specs {
            let v = source.values(spec)?;
            crate::gmlp::weights::check_values(spec, &v)?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            w.write_all(&bytes).map_err(io)?;
        }
        Ok(())
    })
}
